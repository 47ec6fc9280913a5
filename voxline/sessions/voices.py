"""Voice registration: telling the engine's speech stage about a named voice reference.

The voices API (and a session naming a voice another server registered) changes the
engine's voices only through here, as sessions do their engine work: one short-lived
engine stream that sends `RegisterVoice` and waits for `VoiceRegistered`. Empty audio
unregisters the name. The edge maps the errors onto its own wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

from voxline.engines import protocol as p
from voxline.engines.client import EngineClient
from voxline.errors import EngineError

logger = logging.getLogger(__name__)


class VoiceNotRegistered(EngineError):
    """The engine answered the registration with an error (`error`), or closed the stream
    first (`error` is None)."""

    def __init__(self, message: str, stream_id: str, error: p.StreamError | None = None) -> None:
        super().__init__(message, stream_id)
        self.error = error


async def register_voice(engine: EngineClient, reference: p.VoiceReference) -> None:
    """Register (or, with empty audio, unregister) `reference` under its name in the
    speech stage; returns once the engine confirmed it. Raises `VoiceNotRegistered`, or an
    `EngineError` when the engine is not there to ask."""
    config = p.StreamConfig(turn_detection=None, transcribe_partials=False)
    handle = await engine.open_stream(f"voice-{uuid.uuid4().hex}", config)
    try:
        handle.send(p.RegisterVoice(handle.stream_id, reference))
        while True:
            out = await handle.next()
            if isinstance(out, p.VoiceRegistered):
                return
            if isinstance(out, p.StreamError):
                raise VoiceNotRegistered(out.message, handle.stream_id, out)
            if isinstance(out, p.StreamClosed):
                raise VoiceNotRegistered("the engine closed the stream before the voice was "
                                         "registered", handle.stream_id)
    finally:
        closing = asyncio.ensure_future(handle.aclose())
        closing.add_done_callback(_log_failed_close)
        # a cancelled caller leaves the close to finish by itself
        with contextlib.suppress(Exception):  # logged by the callback; never masks the outcome
            await asyncio.shield(closing)


def _log_failed_close(closing: asyncio.Future[None]) -> None:
    if not closing.cancelled() and closing.exception() is not None:
        logger.error("closing a voice registration stream failed", exc_info=closing.exception())
