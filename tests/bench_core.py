"""The echo core plus just enough of a voice pipeline for `voxline bench` tests: an energy
VAD (speech_started / speech_stopped), a spoken reply (a tone) for each response and each
`Speak`, in a few chunks so playout pacing is exercised."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from echo_core import ECHO_REPLY, EchoCore

from voxline.engines.protocol import (
    INPUT_RATE,
    AppendAudio,
    AudioChunk,
    CreateResponse,
    EngineInput,
    ReplyTextDelta,
    ResponseFinished,
    ResponseStatus,
    Speak,
    VoiceStarted,
    VoiceStopped,
)

RATE = 24000
SILENCE_MS = 300  # end of turn after this much quiet
THRESHOLD = 0.01  # RMS


class BenchCore(EchoCore):
    def __init__(self, wake: Callable[[], None], reply_seconds: float = 0.5) -> None:
        super().__init__(wake)
        self._reply_seconds = reply_seconds
        self._heard_ms: dict[str, float] = {}
        self._speech: dict[str, tuple[str, float]] = {}  # sid -> (item id, quiet ms so far)
        self._turns = 0

    def add_input(self, msg: EngineInput) -> None:
        sid = msg.stream_id
        if sid not in self._streams:
            super().add_input(msg)
        elif isinstance(msg, AppendAudio):
            self._vad(sid, np.frombuffer(msg.audio, dtype="<f4"))
        elif isinstance(msg, CreateResponse | Speak):
            self._reply(sid, msg.response_id)
        else:
            super().add_input(msg)

    def _vad(self, sid: str, audio: np.ndarray) -> None:
        ms = 1000.0 * len(audio) / INPUT_RATE
        start = self._heard_ms.get(sid, 0.0)
        self._heard_ms[sid] = start + ms
        loud = len(audio) > 0 and float(np.sqrt(np.mean(audio ** 2))) > THRESHOLD
        item, quiet = self._speech.get(sid, ("", 0.0))
        if loud and not item:
            self._turns += 1
            item = f"item_bench_{self._turns}"
            self._pending.append(VoiceStarted(sid, int(start), item))
            self._speech[sid] = (item, 0.0)
        elif item:
            quiet = 0.0 if loud else quiet + ms
            self._speech[sid] = (item, quiet)
            if quiet >= SILENCE_MS:
                del self._speech[sid]
                self._pending.append(VoiceStopped(sid, int(start + ms), item))

    def _reply(self, sid: str, rid: str) -> None:
        text = "".join(ECHO_REPLY)
        n = int(RATE * self._reply_seconds)
        tone = (0.1 * np.sin(np.arange(n) / 10)).astype("<f4")
        self._pending.append(ReplyTextDelta(sid, rid, text))
        for piece in np.array_split(tone, 5):
            self._pending.append(AudioChunk(sid, rid, piece.tobytes(), RATE,
                                            1000.0 * len(piece) / RATE, ""))
        self._pending.append(ResponseFinished(sid, rid, ResponseStatus.COMPLETED, text))


def make_bench_core(wake: Callable[[], None], reply_seconds: float = 0.5) -> BenchCore:
    return BenchCore(wake, reply_seconds)


def make_long_bench_core(wake: Callable[[], None]) -> BenchCore:
    """Replies of 3 s: still playing when a barge-in comes 1 s after their first audio."""
    return BenchCore(wake, 3.0)
