"""The speech-model interface: what the TTS stage (`tts_stage.TTSStage`) drives step by step.

A `SpeechModel` holds any number of jobs (one text segment each) and advances all of
them a bounded amount per `step()`, which the core runs on its TTS worker thread;
`start`/`cancel` are only called between steps. A step returns audio as it becomes
ready: a sentence-at-a-time model (Piper) returns whole sentences, an autoregressive
codec model returns a chunk every few frames for every stream at once. `text` on an
output names the span a new sentence starts with ("" continues the previous span).

A model that can take streaming text (`TextStreamingModel`, e.g. Qwen3-TTS) speaks a
whole reply as one job: it starts with the first segment and `more_text=True`, later
segments are appended as the LLM writes them, and `end_text` closes it. Such a job's
outputs may carry several segments' text at once (joined with a space), and its last
output may carry text with no audio (text whose audio ended up in earlier chunks).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from voxline.engines.protocol import VoiceReference


@dataclass(frozen=True)
class SpeechJob:
    job_id: int
    text: str
    speed: float = 1.0
    seed: int | None = None
    voice: str | None = None  # a preset voice name; single-voice models ignore it
    reference: VoiceReference | None = None  # a voice to clone; models that cannot ignore it
    more_text: bool = False  # streaming text: append_text/end_text follow (TextStreamingModel)


@dataclass(frozen=True)
class SpeechOut:
    job_id: int
    audio: np.ndarray  # float32 mono
    sample_rate: int
    text: str
    finished: bool  # the job's last output


class SpeechModel(Protocol):
    sample_rate: int

    def start(self, job: SpeechJob) -> None: ...

    def cancel(self, job_id: int) -> None: ...

    def has_work(self) -> bool: ...

    def step(self) -> list[SpeechOut]: ...


class TextStreamingModel(SpeechModel, Protocol):
    """A speech model that speaks a job's text as it is written (one stream per reply)."""

    def append_text(self, job_id: int, text: str) -> None:
        """More text for a `more_text` job (a segment; joined to the last with a space)."""
        ...

    def end_text(self, job_id: int) -> None:
        """The job's text is complete; it finishes once all of it is spoken."""
        ...


def streams_text(model: SpeechModel) -> bool:
    """The model takes streaming text (`TextStreamingModel`)."""
    return callable(getattr(model, "append_text", None)) and callable(getattr(model, "end_text", None))


class SentenceChunk(Protocol):
    audio: np.ndarray
    sample_rate: int
    text: str


class SentenceTTS(Protocol):
    sample_rate: int

    def synthesize(self, text: str, *, speed: float = 1.0,
                   seed: int | None = None) -> Iterator[SentenceChunk]: ...


class SentenceSpeechModel:
    """Adapts a sentence-at-a-time TTS (Piper): each step speaks one sentence of one job,
    rotating over jobs so one long reply never starves another stream."""

    def __init__(self, tts: SentenceTTS) -> None:
        self.tts = tts
        self.sample_rate = tts.sample_rate
        self._jobs: deque[tuple[SpeechJob, Iterator[SentenceChunk]]] = deque()

    def start(self, job: SpeechJob) -> None:
        self._jobs.append((job, iter(self.tts.synthesize(job.text, speed=job.speed, seed=job.seed))))

    def cancel(self, job_id: int) -> None:
        self._jobs = deque(j for j in self._jobs if j[0].job_id != job_id)

    def has_work(self) -> bool:
        return bool(self._jobs)

    def step(self) -> list[SpeechOut]:
        job, chunks = self._jobs.popleft()
        chunk = next(chunks, None)
        if chunk is None:
            return [SpeechOut(job.job_id, np.zeros(0, np.float32), self.sample_rate, "", True)]
        nxt = next(chunks, None)
        finished = nxt is None
        if not finished:
            self._jobs.append((job, _prepend(nxt, chunks)))
        return [SpeechOut(job.job_id, np.asarray(chunk.audio, np.float32), chunk.sample_rate,
                          chunk.text, finished)]


def _prepend(first: SentenceChunk, rest: Iterator[SentenceChunk]) -> Iterator[SentenceChunk]:
    yield first
    yield from rest
