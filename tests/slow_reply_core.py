"""The echo core, but each reply carries `reply_seconds` of audio: at real-time pacing it
stays in flight that long (shutdown-drain tests need a reply in flight)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from echo_core import ECHO_REPLY, EchoCore

from voxline.engines.protocol import (
    AudioChunk,
    CreateResponse,
    EngineInput,
    ReplyTextDelta,
    ResponseFinished,
    ResponseStatus,
)

RATE = 24000


class SlowReplyCore(EchoCore):
    def __init__(self, wake: Callable[[], None], reply_seconds: float = 1.0) -> None:
        super().__init__(wake)
        self._reply_seconds = reply_seconds

    def add_input(self, msg: EngineInput) -> None:
        if not isinstance(msg, CreateResponse) or msg.stream_id not in self._streams:
            super().add_input(msg)
            return
        sid, rid, text = msg.stream_id, msg.response_id, "".join(ECHO_REPLY)
        n = int(RATE * self._reply_seconds)
        audio = (0.1 * np.sin(np.arange(n) / 10)).astype("<f4").tobytes()
        self._pending += [ReplyTextDelta(sid, rid, text),
                          AudioChunk(sid, rid, audio, RATE, 1000.0 * n / RATE, text),
                          ResponseFinished(sid, rid, ResponseStatus.COMPLETED, text)]


def make_slow_reply_core(wake: Callable[[], None], reply_seconds: float = 1.0) -> SlowReplyCore:
    return SlowReplyCore(wake, reply_seconds)
