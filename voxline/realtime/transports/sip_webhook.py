"""The ``realtime.call.incoming`` webhook of an incoming SIP call, as OpenAI sends it.

The body is ``{"object": "event", "id": "evt_...", "type": "realtime.call.incoming",
"created_at": <unix s>, "data": {"call_id": "rtc_...", "sip_headers": [{"name", "value"},
...]}}``, signed the Standard Webhooks way: headers ``webhook-id``, ``webhook-timestamp``
and ``webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``, keyed
with the secret's bytes (a ``whsec_<base64>`` secret is base64-decoded, another is used as
UTF-8 text). Delivery retries connection errors, timeouts and 5xx/429 answers.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import logging
import time
from typing import Any

import httpx

from voxline.sessions.ids import new_id

logger = logging.getLogger(__name__)

# SIP headers named in the webhook first, in this order; the rest follow as they came
LEADING_HEADERS = ("From", "To", "Call-ID")


def secret_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret."""
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
        except binascii.Error:
            pass
    return secret.encode()


def sign(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value."""
    mac = hmac.new(secret_key(secret), f"{webhook_id}.{timestamp}.".encode() + body,
                   hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


def verify(secret: str, headers: Any, body: bytes) -> bool:
    """Whether `headers` carry a valid signature of `body` (for receivers and tests)."""
    try:
        expected = sign(secret, headers["webhook-id"], int(headers["webhook-timestamp"]), body)
    except (KeyError, ValueError):
        return False
    return any(hmac.compare_digest(expected, sig)
               for sig in headers.get("webhook-signature", "").split())


def incoming_call_event(call_id: str, sip_headers: list[tuple[str, str]]) -> dict[str, Any]:
    ordered = sorted(sip_headers, key=lambda h: (
        LEADING_HEADERS.index(h[0]) if h[0] in LEADING_HEADERS else len(LEADING_HEADERS)))
    return {"object": "event", "id": new_id("evt"), "type": "realtime.call.incoming",
            "created_at": int(time.time()),
            "data": {"call_id": call_id,
                     "sip_headers": [{"name": n, "value": v} for n, v in ordered]}}


async def deliver(url: str, secret: str | None, event: dict[str, Any], *, timeout: float,
                  retries: int) -> bool:
    """POST `event` to `url`; True once the receiver answered 2xx."""
    body = json.dumps(event, separators=(",", ":")).encode()
    webhook_id = event["id"]
    async with httpx.AsyncClient(timeout=timeout) as client:
        for attempt in range(retries + 1):
            timestamp = int(time.time())
            headers = {"content-type": "application/json", "webhook-id": webhook_id,
                       "webhook-timestamp": str(timestamp)}
            if secret:
                headers["webhook-signature"] = sign(secret, webhook_id, timestamp, body)
            try:
                answer = await client.post(url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                why = f"{type(exc).__name__}: {exc}"
            else:
                if answer.is_success:
                    return True
                why = f"HTTP {answer.status_code}"
                if answer.status_code < 500 and answer.status_code != 429:
                    logger.warning("webhook %s to %s refused: %s", webhook_id, url, why)
                    return False
            logger.warning("webhook %s to %s failed (attempt %d of %d): %s", webhook_id, url,
                           attempt + 1, retries + 1, why)
            if attempt < retries:
                await asyncio.sleep(0.5 * 2 ** attempt)
    return False
