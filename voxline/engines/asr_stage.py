"""The ASR stage: one utterance transcribed at a time, final transcripts ahead of partials.

A final transcript gates the reply (a response waits for it), and so does a pause
transcript (a speculative reply starts from it), so both jump ahead of every queued
partial; a partial is only a progress report.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from voxline.engines.input_audio import Utterance
from voxline.engines.stage import StreamId


class ASRModel(Protocol):
    def transcribe(self, audio: np.ndarray) -> str: ...


@dataclass
class ASRJob:
    """`final`: the turn's transcript. `pause`: the turn so far, transcribed at a pause
    (made in the utterance's `generation`); it becomes the final one if no speech follows."""

    stream_id: StreamId
    item_id: str
    audio: np.ndarray
    final: bool
    pause: Utterance | None = None
    generation: int = 0


class ASRStage:
    """Stage interface (see `voxline.engines.stage`) over a one-utterance-at-a-time ASR model."""

    def __init__(self, model: ASRModel) -> None:
        self.model = model
        self._jobs: deque[ASRJob] = deque()

    def add(self, job: ASRJob) -> None:
        if job.final or job.pause is not None:
            self._jobs.appendleft(job)
        else:
            self._jobs.append(job)

    def drop(self, stream_id: StreamId) -> None:
        """Forget a closed stream's queued jobs (a running one is ignored when it returns)."""
        self._jobs = deque(j for j in self._jobs if j.stream_id != stream_id)

    def has_work(self) -> bool:
        return bool(self._jobs)

    def schedule(self) -> ASRJob | None:
        return self._jobs.popleft() if self._jobs else None

    def execute(self, job: ASRJob) -> str:
        return self.model.transcribe(job.audio)

    def update(self, job: ASRJob, text: str) -> str:
        return text.strip()
