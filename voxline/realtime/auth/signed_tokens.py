"""Signed tokens: a JSON payload any holder of the key can verify, with no shared store.

A token is ``base64url(JSON payload) "." base64url(HMAC-SHA256(key, payload part))``,
no padding. `SigningKeys` holds the current key (which signs) and previous keys (which
still verify), so a key is rotated without refusing tokens already issued: deploy the
new key first in front of the old one, retire the old one once its tokens have expired.

Pure: no clock, no I/O; expiry and what the payload means are the caller's.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Any

MIN_KEY_BYTES = 16  # shorter keys are guessable; the generated default is 32


@dataclass(frozen=True)
class SigningKeys:
    """The key that signs new tokens and the previous keys that still verify old ones."""

    current: bytes
    previous: tuple[bytes, ...] = ()

    @classmethod
    def generate(cls) -> SigningKeys:
        """A random key, valid for this process only: the single-server default."""
        return cls(secrets.token_bytes(32))

    @classmethod
    def parse(cls, text: str, *, field: str = "client_secret_keys") -> SigningKeys:
        """Comma-separated keys, the current one first; ValueError naming `field`."""
        keys = [k.strip().encode() for k in text.split(",") if k.strip()]
        if not keys:
            raise ValueError(f"{field} holds no key")
        short = [i for i, k in enumerate(keys) if len(k) < MIN_KEY_BYTES]
        if short:
            raise ValueError(f"{field}: key {short[0] + 1} is shorter than {MIN_KEY_BYTES} "
                             f"bytes")
        return cls(keys[0], tuple(keys[1:]))

    @property
    def all(self) -> tuple[bytes, ...]:
        return (self.current, *self.previous)


def _b64encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, body: str) -> bytes:
    return hmac.new(key, body.encode(), hashlib.sha256).digest()


def sign(payload: dict[str, Any], keys: SigningKeys) -> str:
    """`payload` (JSON-able) as a token signed with the current key."""
    body = _b64encode(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
    return f"{body}.{_b64encode(_mac(keys.current, body))}"


def verify(token: str, keys: SigningKeys) -> dict[str, Any] | None:
    """The payload, if some key of `keys` signed `token`; else None (malformed, forged,
    or signed with a key no longer held)."""
    body, dot, sig = token.partition(".")
    if not dot:
        return None
    try:
        presented = _b64decode(sig)
    except (binascii.Error, ValueError):
        return None
    # constant time, and every key is tried, so timing tells nothing about a near miss
    matches = [hmac.compare_digest(_mac(key, body), presented) for key in keys.all]
    if not any(matches):
        return None
    try:
        payload = json.loads(_b64decode(body))
    except (binascii.Error, ValueError):
        return None
    return payload if isinstance(payload, dict) else None
