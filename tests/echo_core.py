"""A model-free core that echoes its inputs: the engine transport's test double.

`EchoCore` obeys the same contract as the real core (outputs carry the caller's
stream id, inputs for unknown streams become non-fatal `StreamError`s), so clients,
the engine process and its supervision can be tested without loading a model.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from voxline.engines.protocol import (
    INPUT_RATE,
    AppendAudio,
    AudioChunk,
    CloseStream,
    CreateResponse,
    EngineInput,
    EngineOutput,
    OpenStream,
    ReplyTextDelta,
    ResponseFinished,
    ResponseStatus,
    StreamClosed,
    StreamError,
)

logger = logging.getLogger(__name__)

ECHO_REPLY = ("Hello", " from echo.")
"""The text deltas every `CreateResponse` produces, in order."""

CRASH_EXIT_CODE = 3


class EchoCore:
    """Echo audio back as `AudioChunk`s and answer every response with fixed text.

    - `OpenStream`: registers the stream (no output). Opening `crash_on` kills the
      whole process with exit code 3, to exercise crash supervision.
    - `AppendAudio`: one `AudioChunk` with the same bytes, at 16 kHz, `response_id=""`.
    - `CreateResponse`: `ReplyTextDelta`s of `ECHO_REPLY`, then `ResponseFinished(COMPLETED)`.
    - `CloseStream`: `StreamClosed`.
    - Any input for a stream that is not open: `StreamError(code="unknown_stream")`.
    - Other inputs for open streams are accepted and ignored.
    """

    def __init__(self, wake: Callable[[], None], crash_on: str | None = None) -> None:
        self._wake = wake
        self._crash_on = crash_on
        self._streams: set[str] = set()
        self._pending: list[EngineOutput] = []

    def add_input(self, msg: EngineInput) -> None:
        sid = msg.stream_id
        if isinstance(msg, OpenStream):
            if sid == self._crash_on:
                logger.warning("echo core: crashing on purpose for stream %r", sid)
                os._exit(CRASH_EXIT_CODE)
            if sid in self._streams:
                self._error(sid, f"stream {sid!r} is already open", "stream_exists")
            self._streams.add(sid)
            return
        if sid not in self._streams:
            self._error(sid, f"{type(msg).__name__}: stream {sid!r} is not open", "unknown_stream")
            return
        if isinstance(msg, AppendAudio):
            n_samples = len(msg.audio) // 4
            self._pending.append(
                AudioChunk(
                    stream_id=sid,
                    response_id="",
                    audio=msg.audio,
                    sample_rate=INPUT_RATE,
                    duration_ms=1000.0 * n_samples / INPUT_RATE,
                    text="",
                )
            )
        elif isinstance(msg, CreateResponse):
            for delta in ECHO_REPLY:
                self._pending.append(ReplyTextDelta(sid, msg.response_id, delta))
            self._pending.append(
                ResponseFinished(sid, msg.response_id, ResponseStatus.COMPLETED, "".join(ECHO_REPLY))
            )
        elif isinstance(msg, CloseStream):
            self._streams.discard(sid)
            self._pending.append(StreamClosed(sid))

    def _error(self, sid: str, message: str, code: str) -> None:
        self._pending.append(StreamError(sid, message, code=code, fatal=False))

    def step(self) -> list[EngineOutput]:
        out, self._pending = self._pending, []
        return out

    def has_work(self) -> bool:
        return bool(self._pending)

    def close(self) -> None:
        self._streams.clear()
        self._pending.clear()


def make_echo_core(
    wake: Callable[[], None], load_delay: float = 0.0, crash_on: str | None = None
) -> EchoCore:
    """Core factory (spec `"echo_core:make_echo_core"`, with tests/ on the path).

    `load_delay` seconds of sleep stand in for model loading. Never pass `crash_on`
    to an in-process client: the crash exits the hosting process.
    """
    if load_delay > 0:
        time.sleep(load_delay)
    return EchoCore(wake, crash_on=crash_on)
