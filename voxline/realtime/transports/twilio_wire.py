"""Twilio Media Streams on the wire: its JSON messages, request signatures and TwiML.

Twilio sends ``connected``, ``start``, ``media`` (base64 μ-law 8 kHz), ``dtmf``, ``mark``
and ``stop``; a bidirectional stream (``<Connect><Stream>``) accepts ``media``, ``mark``
and ``clear`` back. :func:`parse_message` returns a typed message or raises
:class:`TwilioMessageError` saying what is wrong; the builders make the outgoing ones.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit
from xml.sax.saxutils import quoteattr

from voxline.errors import VoxlineError

MULAW_ENCODING = "audio/x-mulaw"
MULAW_RATE = 8000


class TwilioMessageError(VoxlineError):
    """A message from Twilio that does not fit Media Streams' shapes."""


@dataclass(frozen=True)
class Connected:
    protocol: str
    version: str


@dataclass(frozen=True)
class Start:
    stream_sid: str
    call_sid: str
    account_sid: str
    encoding: str
    sample_rate: int
    channels: int
    tracks: tuple[str, ...] = ()
    custom_parameters: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Media:
    stream_sid: str
    payload: bytes  # μ-law bytes, decoded from base64
    track: str = "inbound"
    chunk: int | None = None
    timestamp: int | None = None  # ms since the stream started


@dataclass(frozen=True)
class Dtmf:
    stream_sid: str
    digit: str
    track: str = "inbound_track"


@dataclass(frozen=True)
class Mark:
    stream_sid: str
    name: str


@dataclass(frozen=True)
class Stop:
    stream_sid: str
    call_sid: str | None = None


TwilioMessage = Connected | Start | Media | Dtmf | Mark | Stop


def _get(d: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(d, Mapping):
        raise TwilioMessageError(f"{where} must be an object, got {type(d).__name__}")
    if key not in d:
        raise TwilioMessageError(f"{where}.{key} is missing")
    value = d[key]
    if kind is int and isinstance(value, str) and value.isdigit():
        value = int(value)  # Twilio sends sequence numbers and timestamps as strings
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TwilioMessageError(f"{where}.{key} must be a {kind.__name__}, got {value!r:.40}")
    return value


def _opt_int(d: Mapping[str, Any], key: str) -> int | None:
    value = d.get(key)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def parse_message(text: str | bytes) -> TwilioMessage | None:
    """One Media Streams message; None for an event this adapter does not know."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise TwilioMessageError(f"not JSON: {exc}") from None
    except RecursionError:  # nested thousands deep: a bad message, not a dead call
        raise TwilioMessageError("not JSON: nested too deeply") from None
    event = _get(data, "event", str, "message")
    if event == "connected":
        return Connected(str(data.get("protocol", "")), str(data.get("version", "")))
    if event not in ("start", "media", "dtmf", "mark", "stop"):
        return None
    sid = _get(data, "streamSid", str, event)
    body = _get(data, event, Mapping, event)
    where = f"{event}.{event}"
    if event == "start":
        fmt = _get(body, "mediaFormat", Mapping, where)
        params = body.get("customParameters") or {}
        if not isinstance(params, Mapping):
            raise TwilioMessageError(f"{where}.customParameters must be an object")
        return Start(sid, _get(body, "callSid", str, where), str(body.get("accountSid", "")),
                     _get(fmt, "encoding", str, f"{where}.mediaFormat"),
                     _get(fmt, "sampleRate", int, f"{where}.mediaFormat"),
                     int(fmt.get("channels", 1)), tuple(body.get("tracks") or ()),
                     {str(k): str(v) for k, v in params.items()})
    if event == "media":
        payload = _get(body, "payload", str, where)
        try:
            audio = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise TwilioMessageError(f"{where}.payload is not base64") from None
        return Media(sid, audio, str(body.get("track", "inbound")), _opt_int(body, "chunk"),
                     _opt_int(body, "timestamp"))
    if event == "dtmf":
        return Dtmf(sid, _get(body, "digit", str, where), str(body.get("track", "inbound_track")))
    if event == "mark":
        return Mark(sid, _get(body, "name", str, where))
    return Stop(sid, body.get("callSid") if isinstance(body.get("callSid"), str) else None)


def media_message(stream_sid: str, payload: bytes) -> dict[str, Any]:
    return {"event": "media", "streamSid": stream_sid,
            "media": {"payload": base64.b64encode(payload).decode("ascii")}}


def mark_message(stream_sid: str, name: str) -> dict[str, Any]:
    return {"event": "mark", "streamSid": stream_sid, "mark": {"name": name}}


def clear_message(stream_sid: str) -> dict[str, Any]:
    return {"event": "clear", "streamSid": stream_sid}


# ---------------------------------------------------------------------------------------
# X-Twilio-Signature: base64 HMAC-SHA1, keyed by the account's auth token, of the full URL
# followed by the POST parameters sorted by name, each as name + value.
# ---------------------------------------------------------------------------------------


def twilio_signature(auth_token: str, url: str, params: Iterable[tuple[str, str]] = ()) -> str:
    data = url + "".join(k + v for k, v in sorted(params))
    digest = hmac.new(auth_token.encode(), data.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def _url_variants(url: str, schemes: tuple[str, ...]) -> list[str]:
    """The URL as Twilio may have signed it: behind a TLS proxy the scheme differs, and
    Twilio signs with the port as written in the configured URL (present or not)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netlocs = {parts.netloc, host}
    if parts.port is None:
        netlocs |= {f"{host}:443", f"{host}:80"}
    return [urlunsplit((s, n, parts.path, parts.query, "")) for s in schemes for n in netlocs]


def signature_valid(auth_token: str, url: str, params: Iterable[tuple[str, str]],
                    signature: str | None, *, schemes: tuple[str, ...]) -> bool:
    """Whether ``signature`` signs ``url`` (in any of ``schemes``) and ``params``."""
    if not signature:
        return False
    items = list(params)
    return any(hmac.compare_digest(twilio_signature(auth_token, u, items), signature)
               for u in _url_variants(url, schemes))


def connect_stream_twiml(stream_url: str, parameters: Mapping[str, str] | None = None) -> str:
    """TwiML that connects a call to a bidirectional stream, passing ``parameters`` to
    its ``start`` message as ``customParameters``."""
    inner = "".join(f"<Parameter name={quoteattr(k)} value={quoteattr(v)}/>"
                    for k, v in (parameters or {}).items())
    return ('<?xml version="1.0" encoding="UTF-8"?>'
            f"<Response><Connect><Stream url={quoteattr(stream_url)}>{inner}</Stream>"
            "</Connect></Response>")
