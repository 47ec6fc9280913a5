"""The VAD stage: every stream's input cut into 32 ms frames, scored in one batched call.

The stage's queue is each stream's backlog of input not yet framed. It is bounded
(`max_backlog_ms`): an append that would pass the bound is refused whole, with an
error, so a client that sends audio faster than the engine frames it learns so instead
of the engine's memory growing. Only streams with server VAD are enabled; a manual-turn
stream's audio goes straight to its utterance buffer (`InputAudio`).

Noise reduction (a stream's `NoiseReducer`, when its config asks for one) runs here,
as each frame leaves the backlog, so VAD scores and ASR hears the denoised frame, and it
costs no more per step than the framing does. A manual-turn stream's audio goes through
the same reducer on its way to the buffer (`denoise`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from voxline.engines.noise_reduction import NoiseReducer
from voxline.engines.protocol import INPUT_RATE
from voxline.engines.stage import RequestRefused, StreamId

VAD_FRAME = 512
FRAME_MS = VAD_FRAME * 1000 / INPUT_RATE  # 32 ms
MAX_BACKLOG_MS = 360_000  # above one 15 MiB realtime append (~327 s of 24 kHz PCM16)
ROUNDS_PER_STEP = 256  # frames per stream per engine step; a longer backlog takes several


class VADModel(Protocol):
    def new_state(self) -> Any: ...

    def process(self, frames: np.ndarray, states: list[Any]) -> np.ndarray: ...


class _Backlog:
    def __init__(self, state: Any, enabled: bool) -> None:
        self.state = state  # the model's recurrent state for this stream
        self.pending = np.zeros(0, np.float32)
        self.enabled = enabled  # server VAD on: frame this stream
        self.denoiser: NoiseReducer | None = None  # input noise reduction, when on


@dataclass
class VADPlan:
    stream_ids: list[StreamId]
    frames: np.ndarray  # [streams, VAD_FRAME]
    states: list[Any]


@dataclass
class VADFrame:
    stream_id: StreamId
    frame: np.ndarray
    prob: float


class VADStage:
    """Stage interface (see `voxline.engines.stage`) over a batched VAD model."""

    def __init__(self, model: VADModel, max_backlog_ms: float = MAX_BACKLOG_MS) -> None:
        self.model = model
        self.max_backlog_samples = int(max_backlog_ms * INPUT_RATE / 1000)
        self._streams: dict[StreamId, _Backlog] = {}

    def add_stream(self, stream_id: StreamId, enabled: bool) -> None:
        self._streams[stream_id] = _Backlog(self.model.new_state(), enabled)

    def remove_stream(self, stream_id: StreamId) -> None:
        self._streams.pop(stream_id, None)

    def enable(self, stream_id: StreamId, enabled: bool) -> None:
        self._streams[stream_id].enabled = enabled

    def set_noise_reduction(self, stream_id: StreamId, kind: str | None) -> None:
        """Turn the stream's noise reduction on (`near_field` / `far_field`) or off (None);
        the same kind again keeps the reducer and what it has learnt of the noise."""
        backlog = self._streams[stream_id]
        have = backlog.denoiser
        if kind is None:
            backlog.denoiser = None
        elif have is None or have.kind != kind:
            backlog.denoiser = NoiseReducer(kind)  # type: ignore[arg-type]

    def denoise(self, stream_id: StreamId, audio: np.ndarray) -> np.ndarray:
        """`audio` through the stream's reducer (as many samples back), or as it is."""
        denoiser = self._streams[stream_id].denoiser
        return audio if denoiser is None else denoiser.process(audio)

    def append(self, stream_id: StreamId, audio: np.ndarray) -> None:
        """Queue input for framing; raises `RequestRefused` (nothing queued) past the bound."""
        backlog = self._streams[stream_id]
        if len(backlog.pending) + len(audio) > self.max_backlog_samples:
            have_ms = len(backlog.pending) * 1000 / INPUT_RATE
            limit_ms = self.max_backlog_samples * 1000 / INPUT_RATE
            raise RequestRefused(
                f"append: {len(audio) * 1000 / INPUT_RATE:.0f} ms of audio refused: the engine "
                f"has {have_ms:.0f} ms not yet processed and holds at most {limit_ms:.0f} ms; "
                "send audio no faster than real time", "input_audio_buffer_full")
        backlog.pending = (np.concatenate([backlog.pending, audio]) if len(backlog.pending)
                           else audio.copy())

    def clear(self, stream_id: StreamId) -> None:
        self._streams[stream_id].pending = np.zeros(0, np.float32)

    def backlog_samples(self, stream_id: StreamId) -> int:
        return len(self._streams[stream_id].pending)

    def has_work(self) -> bool:
        return any(b.enabled and len(b.pending) >= VAD_FRAME for b in self._streams.values())

    def schedule(self) -> VADPlan | None:
        ready = [(sid, b) for sid, b in self._streams.items()
                 if b.enabled and len(b.pending) >= VAD_FRAME]
        if not ready:
            return None
        frames = [b.pending[:VAD_FRAME] if b.denoiser is None
                  else b.denoiser.process(b.pending[:VAD_FRAME]) for _, b in ready]
        return VADPlan([sid for sid, _ in ready], np.stack(frames), [b.state for _, b in ready])

    def execute(self, plan: VADPlan) -> np.ndarray:
        return self.model.process(plan.frames, plan.states)

    def update(self, plan: VADPlan, probs: np.ndarray) -> list[VADFrame]:
        out: list[VADFrame] = []
        for sid, frame, prob in zip(plan.stream_ids, plan.frames, probs, strict=True):
            backlog = self._streams.get(sid)
            if backlog is None:
                continue
            backlog.pending = backlog.pending[VAD_FRAME:]
            out.append(VADFrame(sid, frame, float(prob)))
        return out

    def drop(self, plan: VADPlan) -> None:
        """A failed call: discard the backlog of the streams in it (their caller is told)."""
        for sid in plan.stream_ids:
            if sid in self._streams:
                self.clear(sid)
