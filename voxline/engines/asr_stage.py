"""The ASR stage: utterance jobs, final transcripts ahead of partials, batched when the
model takes batches.

A final transcript gates the reply (a response waits for it), and so does a pause
transcript (a speculative reply starts from it), so both jump ahead of every queued
partial; a partial is only a progress report.

A plan is a list of jobs of one kind (urgent: finals and pauses; or partials), taken in
queue order: one job for a one-clip model (`ASRModel`, Moonshine), up to the model's
`max_batch` for a batched one (`BatchASRModel`, Whisper), which gets every job's
stream options (language, prompt) beside its clip. Kinds are never mixed, so a final
never waits for partials in the same call. `route_each` / `fail_each` hand a plan's
outcomes to per-job callbacks (the stage table's route and fail rows).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from voxline.engines.input_audio import Utterance
from voxline.engines.models.asr_tokens import ScoredTranscript, TokenLogprob
from voxline.engines.models.whisper_asr import TranscriptionOptions
from voxline.engines.stage import StreamId
from voxline.engines.trace import trace

__all__ = ["ASRJob", "ASRModel", "ASRStage", "BatchASRModel", "TranscriptionOptions"]


class ASRModel(Protocol):
    def transcribe(self, audio: np.ndarray) -> str: ...


@runtime_checkable
class BatchASRModel(Protocol):
    """An ASR that transcribes several clips in one call, each with its stream's options."""

    max_batch: int

    def transcribe(self, audio: np.ndarray) -> str: ...

    def transcribe_many(self, clips: Sequence[np.ndarray],
                        options: Sequence[TranscriptionOptions]) -> list[str]: ...


@dataclass
class ASRJob:
    """`final`: the turn's transcript. `pause`: the turn so far, transcribed at a pause
    (made in the utterance's `generation`); it becomes the final one if no speech follows.
    `options`: the stream's transcription language and prompt (a batched model's)."""

    stream_id: StreamId
    item_id: str
    audio: np.ndarray
    final: bool
    pause: Utterance | None = None
    generation: int = 0
    options: TranscriptionOptions = field(default_factory=TranscriptionOptions)
    # An early take of the turn's pause transcript (see `turns`): asked when the job's
    # turn comes whether it is still wanted (False: dropped unrun). None: any other job.
    early: Callable[[], bool] | None = None
    # Set: a running partial a newer take superseded; a model that `stops_early` ends it
    # between decoding steps with the text so far.
    stopped: threading.Event = field(default_factory=threading.Event)
    # The stream asked for its tokens' log-probabilities: `tokens` holds them once landed
    # (None: not asked, or a model that cannot give them).
    logprobs: bool = False
    tokens: tuple[TokenLogprob, ...] | None = None

    @property
    def urgent(self) -> bool:
        return self.final or self.pause is not None

    @property
    def kind(self) -> str:
        """"pause", "final", "take" (an early take) or "partial" (for traces)."""
        if self.pause is not None:
            return "pause"
        return "final" if self.final else "take" if self.early is not None else "partial"


ASRPlan = list[ASRJob]


class ASRStage:
    """Stage interface (see `voxline.engines.stage`) over an ASR model."""

    def __init__(self, model: ASRModel) -> None:
        self.model = model
        self._jobs: deque[ASRJob] = deque()
        self._running: ASRPlan = []  # the last plan scheduled (it may have landed since)

    def add(self, job: ASRJob) -> None:
        """Urgent jobs (finals, pauses) go ahead of the partials, in arrival order: when many
        sessions end their turns at once, the first to finish speaking is answered first."""
        if job.urgent:
            at = next((i for i, q in enumerate(self._jobs) if not q.urgent), len(self._jobs))
            self._jobs.insert(at, job)
        else:
            self._jobs.append(job)

    def promote(self, job: ASRJob) -> None:
        """`job` (now urgent: it became a pause transcript) moves ahead of the partials,
        after the urgent jobs before it, if it is still queued."""
        for i, queued in enumerate(self._jobs):
            if queued is job:
                del self._jobs[i]
                self.add(job)
                return

    def drop_partials(self, stream_id: StreamId) -> bool:
        """Forget the stream's queued partials and stop its running one early (a longer
        take of its turn is queued); True if any was queued."""
        def partial(job: ASRJob) -> bool:
            return job.stream_id == stream_id and not job.urgent and job.early is None

        for job in self._running:
            if partial(job):
                job.stopped.set()
        kept = deque(j for j in self._jobs if not partial(j))
        dropped = len(kept) < len(self._jobs)
        self._jobs = kept
        return dropped

    def drop(self, stream_id: StreamId) -> None:
        """Forget a closed stream's queued jobs (a running one is ignored when it returns)."""
        self._jobs = deque(j for j in self._jobs if j.stream_id != stream_id)

    def has_work(self) -> bool:
        return bool(self._jobs)

    def max_batch(self) -> int:
        return max(1, self.model.max_batch) if isinstance(self.model, BatchASRModel) else 1

    def schedule(self) -> ASRPlan | None:
        """The first queued job and, for a batched model, the next ones of its kind."""
        self._jobs = deque(j for j in self._jobs if j.early is None or j.early())
        if not self._jobs:
            return None
        first = self._jobs.popleft()
        plan, rest, limit = [first], deque[ASRJob](), self.max_batch()
        while self._jobs and len(plan) < limit:
            job = self._jobs.popleft()
            (plan if job.urgent == first.urgent else rest).append(job)
        rest.extend(self._jobs)
        self._jobs = rest
        self._running = plan
        for job in plan:
            trace(job.stream_id, "asr_start", kind=job.kind, audio_ms=round(len(job.audio) / 16))
        return plan

    def execute(self, plan: ASRPlan) -> list[str] | list[ScoredTranscript]:
        """The plan's transcripts; scored ones (with tokens) when a job asked for them."""
        scored = any(j.logprobs for j in plan) and gives_logprobs(self.model)
        model = self.model
        if isinstance(model, BatchASRModel):
            clips, options = [j.audio for j in plan], [j.options for j in plan]
            if scored:
                return model.transcribe_many_scored(clips, options)  # type: ignore[attr-defined]
            return model.transcribe_many(clips, options)
        one = model.transcribe_scored if scored else model.transcribe  # type: ignore[attr-defined]
        if getattr(model, "stops_early", False):
            return [one(job.audio, stop=job.stopped.is_set) for job in plan]
        return [one(job.audio) for job in plan]

    def update(self, plan: ASRPlan, texts: list[str] | list[ScoredTranscript]) -> list[str]:
        """The plain texts; a scored transcript's tokens stay on the job that asked."""
        out = []
        for job, text in zip(plan, texts, strict=True):
            if isinstance(text, ScoredTranscript):
                if job.logprobs:
                    job.tokens = text.tokens
                text = text.text
            out.append(text.strip())
        return out


def gives_logprobs(model: object) -> bool:
    """Whether `model` can give its transcripts' token log-probabilities."""
    name = "transcribe_many_scored" if isinstance(model, BatchASRModel) else "transcribe_scored"
    return callable(getattr(model, name, None))


def route_each(route: Callable[[ASRJob, str, float], None]
               ) -> Callable[[ASRPlan, list[str], float], None]:
    """A per-job transcript callback as the stage table's route of a whole plan."""
    def each(plan: ASRPlan, texts: list[str], seconds: float) -> None:
        for job, text in zip(plan, texts, strict=True):
            route(job, text, seconds)
    return each


def fail_each(fail: Callable[[ASRJob, Exception], None]
              ) -> Callable[[ASRPlan, Exception], None]:
    """A per-job failure callback as the stage table's fail of a whole plan."""
    def each(plan: ASRPlan, error: Exception) -> None:
        for job in plan:
            fail(job, error)
    return each
