"""The engine's stage interface, and the one worker that runs a stage's model off the loop.

A stage is one model with its own queue of work. The engine loop (`EngineCore`) holds
each stage in one row of its stage table (`stage_table`: the stage, its worker, where its
outcomes go) and drives every stage through the same three calls:

- `schedule() -> plan | None` (loop thread): take the next batch of work off the
  stage's queue. Bookkeeping only, no model call; None when there is nothing to do.
- `execute(plan) -> result` (a `StageWorker` thread; inline for VAD): run the model on
  the plan. It reads only the plan, so the loop keeps taking inputs meanwhile.
- `update(plan, result) -> outcomes` (loop thread): fold the result back into the
  queue (confirm, discard work made stale by new input, retire finished requests)
  and return what the loop routes onward. Every outcome names its stream by the
  engine-internal `StreamId`, never by the caller's id.

What the three calls mean for each stage:

| stage | its queue | schedule | execute | update |
|---|---|---|---|---|
| VAD (`vad_stage`) | each stream's unframed input | one 32 ms frame from every stream that has one | one batched VAD call: speech probabilities | consume the frames: `VADFrame`s |
| ASR (`asr_stage`) | utterance jobs, finals ahead of partials | the next job (a batched model: up to `max_batch` of its kind) | transcribe the audio (with each stream's language, prompt) | the transcripts, stripped |
| LLM (`llm_stage`) | running `GenerationRequest`s | a `StepPlan` under the token budget | one batched forward and its sampling: logits, tokens | confirm tokens, discard a step whose inputs changed |
| TTS (`tts_stage`) | speech jobs and pending cancels | apply cancels, start new jobs; a plan when the model has work | one `SpeechModel.step()` | route outputs to their owners, dropping cancelled jobs |
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from voxline.engines.protocol import ErrorCode
from voxline.errors import VoxlineError

logger = logging.getLogger(__name__)

StreamId = int  # engine-internal, unique per opened stream; callers' ids live in StreamState

PlanT = TypeVar("PlanT")
ResultT = TypeVar("ResultT")
OutT_co = TypeVar("OutT_co", covariant=True)


class Stage(Protocol[PlanT, ResultT, OutT_co]):
    """One model and its queue; see the module docstring for what each call means."""

    def has_work(self) -> bool: ...

    def schedule(self) -> PlanT | None: ...

    def execute(self, plan: PlanT) -> ResultT: ...

    def update(self, plan: PlanT, result: ResultT) -> OutT_co: ...


class RequestRefused(VoxlineError):
    """An input was not accepted (nothing of it was kept); becomes a `StreamError` with
    `code`, fatal (the stream is not usable) when `fatal`. A code given by its value is
    converted here, so a code `ErrorCode` lacks fails where it is made."""

    def __init__(self, message: str, code: ErrorCode | str, fatal: bool = False) -> None:
        self.code = ErrorCode(code)
        self.fatal = fatal
        super().__init__(message)


@dataclass
class Finished(Generic[PlanT, ResultT]):
    """A plan back from its worker: `result`, or the `error` that `execute` raised."""

    plan: PlanT
    result: ResultT | None
    error: Exception | None
    seconds: float  # time `execute` took
    waited: float = 0.0  # from `execute` returning to the loop collecting it


def _timed(execute: Callable[[PlanT], ResultT], plan: PlanT) -> tuple[ResultT, float, float]:
    """execute(plan), its seconds, and the clock when it returned."""
    t0 = time.perf_counter()
    result = execute(plan)
    t1 = time.perf_counter()
    return result, t1 - t0, t1


class Backfill(Protocol):
    """Deferred start-up work of a stage's model (`voxline.kernels.cuda_graphs.GraphBackfill`:
    CUDA graphs captured after the engine is ready), done one unit per `step()`."""

    def __len__(self) -> int: ...

    def step(self) -> bool: ...


class StageWorker(Generic[PlanT, ResultT]):
    """Runs one stage's `execute`, one plan at a time, and wakes the loop when it is done.

    Loop thread only: `start()` asks the stage for a plan and submits it, `collect()`
    hands the finished plan back. The plan is handed back exactly once, so the stage
    sees an `update` (or the caller's error handling) for every plan it scheduled. With
    `thread_name=None` the plan runs inline inside `start()`, for models cheaper than a
    thread hop (VAD).

    `backfill`: the model's deferred graph captures, one unit at a time on the worker's
    own thread (`start_background`, while no plan runs): a plan submitted meanwhile
    waits for that unit in the thread's queue, so a capture never overlaps a plan's
    replays of the same graphs, stream and memory pool.
    """

    def __init__(self, stage: Stage[PlanT, ResultT, object], wake: Callable[[], None],
                 thread_name: str | None, backfill: Backfill | None = None) -> None:
        self.stage = stage
        self._wake = wake
        self._pool = (ThreadPoolExecutor(1, thread_name_prefix=thread_name)
                      if thread_name is not None else None)
        self._running: tuple[PlanT, Future[tuple[ResultT, float, float]]] | None = None
        if backfill is not None and self._pool is None and len(backfill):
            raise ValueError("a backfill needs a worker thread (thread_name)")
        self._backfill = backfill if backfill is not None and len(backfill) else None
        self._background: Future[bool] | None = None

    def backfill_due(self) -> bool:
        """Deferred work waits, and nothing (plan or unit) runs: `start_background` would
        start the next unit."""
        self._reap_background()
        return self._backfill is not None and self._background is None and self._running is None

    def start_background(self) -> bool:
        """Submit the next unit of deferred work if `backfill_due`; True if submitted."""
        if not self.backfill_due():
            return False
        assert self._pool is not None and self._backfill is not None
        fut = self._pool.submit(self._backfill.step)
        fut.add_done_callback(lambda _f: self._wake())
        self._background = fut
        return True

    def _reap_background(self) -> None:
        fut = self._background
        if fut is None or not fut.done():
            return
        self._background = None
        try:
            more = fut.result()
        except Exception as exc:
            logger.warning("deferred graph capture failed, so requests keep running in the "
                           "buckets already captured: %s: %s", type(exc).__name__, exc)
            more = False
        if not more:
            self._backfill = None

    @property
    def running(self) -> PlanT | None:
        """The plan submitted and not yet collected (possibly still executing)."""
        return self._running[0] if self._running is not None else None

    @property
    def idle(self) -> bool:
        return self._running is None

    @property
    def inline(self) -> bool:
        """Plans run inside `start()` (no thread): one is always ready to collect after it."""
        return self._pool is None

    def done(self) -> bool:
        """A finished plan waits to be collected."""
        return self._running is not None and self._running[1].done()

    def start(self) -> PlanT | None:
        """If idle, schedule the stage's next plan and submit it; returns that plan."""
        if self._running is not None:
            return None
        plan = self.stage.schedule()
        if plan is None:
            return None
        if self._pool is None:
            fut: Future[tuple[ResultT, float, float]] = Future()
            try:
                fut.set_result(_timed(self.stage.execute, plan))
            except Exception as exc:
                fut.set_exception(exc)
        else:
            fut = self._pool.submit(_timed, self.stage.execute, plan)
            fut.add_done_callback(lambda _f: self._wake())
        self._running = (plan, fut)
        return plan

    def collect(self) -> Finished[PlanT, ResultT] | None:
        """The finished plan with its result or error; None while it runs or when idle."""
        if self._running is None or not self._running[1].done():
            return None
        plan, fut = self._running
        self._running = None
        try:
            result, seconds, ended = fut.result()
        except Exception as exc:
            return Finished(plan, None, exc, 0.0)
        return Finished(plan, result, None, seconds, time.perf_counter() - ended)

    def close(self) -> None:
        """Stop the thread: a plan already executing finishes, one not yet started is
        cancelled (`collect` then returns it with a `CancelledError`)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
