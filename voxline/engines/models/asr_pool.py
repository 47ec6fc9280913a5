"""Several one-clip CPU transcriptions at once: a one-clip ASR seen as a batched one.

Moonshine transcribes one clip per call (its encoder has no attention mask, so clips are
not padded into one batch). On a many-core server, 64 sessions' final transcripts then
queue behind each other on the ASR stage's one thread: ~30 ms each is ~2 s for the last
session. `ConcurrentASR` hands the ASR stage up to `workers` same-kind jobs per plan
(`BatchASRModel.max_batch`) and runs them side by side on as many threads;
onnxruntime releases the GIL inside `run` and an `InferenceSession` may run concurrently.
Each clip's transcript is exactly what a lone `transcribe` of it gives.

The threads live only for one plan (a `with` pool): nothing outlives the call, and a
pool of a few threads costs far less to start than one clip costs to transcribe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

import numpy as np

from voxline.engines.models.asr_tokens import ScoredTranscript
from voxline.engines.models.whisper_asr import TranscriptionOptions

_DEFAULT = TranscriptionOptions()
T = TypeVar("T")


class OneClipASR(Protocol):
    def transcribe(self, audio: np.ndarray) -> str: ...

    def transcribe_scored(self, audio: np.ndarray) -> ScoredTranscript: ...


class ConcurrentASR:
    """`model`'s `transcribe` for up to `workers` clips at once (a `BatchASRModel`)."""

    def __init__(self, model: OneClipASR, workers: int) -> None:
        if workers < 2:
            raise ValueError(f"ConcurrentASR needs at least 2 workers, got {workers}")
        self.model = model
        self.workers = workers
        self.max_batch = workers

    def transcribe(self, audio: np.ndarray) -> str:
        return self.model.transcribe(audio)

    def transcribe_many(self, clips: Sequence[np.ndarray],
                        options: Sequence[TranscriptionOptions]) -> list[str]:
        """Each clip's transcript, in order; the model takes no per-stream options (the
        sessions refuse them for this ASR), so any given are an error, not ignored."""
        return self._side_by_side(self.model.transcribe, clips, options)

    def transcribe_many_scored(self, clips: Sequence[np.ndarray],
                               options: Sequence[TranscriptionOptions]
                               ) -> list[ScoredTranscript]:
        """`transcribe_many` with each transcript's tokens and their log-probabilities."""
        return self._side_by_side(self.model.transcribe_scored, clips, options)

    def _side_by_side(self, fn: Callable[[np.ndarray], T], clips: Sequence[np.ndarray],
                      options: Sequence[TranscriptionOptions]) -> list[T]:
        if any(opt != _DEFAULT for opt in options):
            raise ValueError("this ASR takes no transcription language or prompt")
        if len(clips) <= 1:
            return [fn(clip) for clip in clips]
        with ThreadPoolExecutor(min(self.workers, len(clips)) - 1,
                                thread_name_prefix="voxline-asr-pool") as pool:
            rest = [pool.submit(fn, clip) for clip in clips[1:]]
            first = fn(clips[0])  # this thread takes a clip too
            return [first, *(f.result() for f in rest)]

    def __getattr__(self, name: str):
        # The wrapped model's other attributes (e.g. what the tests and warm-up read).
        return getattr(self.model, name)
