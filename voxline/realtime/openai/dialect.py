"""Which OpenAI Realtime dialect a connection speaks: GA or beta."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Protocol


class Dialect(StrEnum):
    """Which OpenAI Realtime wire shape a connection speaks."""

    GA = "ga"
    BETA = "beta"


BETA_SUBPROTOCOL = "openai-beta.realtime-v1"

Headers = Mapping[str, str] | Iterable[tuple[str | bytes, str | bytes]]


class _Hinting(Protocol):
    def dialect_hint(self) -> Dialect | None: ...


def _header_items(headers: Headers | None) -> Iterable[tuple[str, str]]:
    if headers is None:
        return ()
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for key, value in pairs:
        k = key.decode("latin-1") if isinstance(key, bytes) else key
        v = value.decode("latin-1") if isinstance(value, bytes) else value
        out.append((k.lower(), v))
    return out


def detect_dialect(headers: Headers | None, first_event: _Hinting | None = None) -> Dialect:
    """The dialect a client speaks; GA unless something says beta.

    Beta when the ``OpenAI-Beta`` header holds ``realtime=v1`` or the WebSocket
    subprotocols include ``openai-beta.realtime-v1`` (browser clients); otherwise the
    first event's field names decide (beta ``modalities``, flat ``turn_detection``,
    ``input_audio_format``, assistant ``text`` parts...; GA ``audio``,
    ``output_modalities``...). ``headers`` may be a mapping or ASGI-style byte pairs.
    """
    for key, value in _header_items(headers):
        if key == "openai-beta" and "realtime=v1" in value.replace(" ", "").lower():
            return Dialect.BETA
        if key == "sec-websocket-protocol" and BETA_SUBPROTOCOL in (
            p.strip() for p in value.split(",")
        ):
            return Dialect.BETA
    hint = first_event.dialect_hint() if first_event is not None else None
    return hint or Dialect.GA
