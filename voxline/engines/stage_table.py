"""The stage table: one `StageSlot` per stage, and the one path every plan takes.

A slot holds a stage (`voxline.engines.stage`), the `StageWorker` that runs its model,
and the callbacks that say where its work goes: `route` takes what `update` returned for
a plan that ran, `fail` fails the owners of a plan whose `execute` raised (and drops its
work from the stage). The path is written once, here:

    collect -> (error: log -> fail) | (update -> route) -> landed

`StageTable.step` runs that for every slot in table order, then starts each idle slot in
table order: `prepare`, `worker.start()`, `settle`, and a unit of the worker's deferred
graph captures when no plan started. An inline slot (a worker with no
thread, VAD) does the whole path within its start, up to `rounds` plans a step, and stops
at the first failed one. Callbacks run on the loop thread only, so they may touch any
engine state; a slot never sees another slot's plan.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from voxline.engines.stage import Stage, StageWorker

logger = logging.getLogger(__name__)

PlanT = TypeVar("PlanT")
ResultT = TypeVar("ResultT")
OutT = TypeVar("OutT")


def _nothing() -> None:
    return None


def _no_note() -> str | None:
    return None


def _no_work() -> bool:
    return False


def _no_kind(plan: object) -> str | None:
    return None


@dataclass
class StageLoad:
    """One stage's work since the last report: plans run, time in `execute`, and time a
    finished plan waited for the loop to collect it (a busy loop thread, or the GIL)."""

    plans: int = 0
    failed: int = 0
    busy_s: float = 0.0
    waited_s: float = 0.0
    waited_max_s: float = 0.0
    max_s: float = 0.0
    kinds: dict[str, list[float]] = field(default_factory=dict)  # kind -> [plans, seconds]

    def add(self, seconds: float, waited: float, failed: bool, kind: str | None = None) -> None:
        self.plans += 1
        self.failed += failed
        self.busy_s += seconds
        self.max_s = max(self.max_s, seconds)
        self.waited_s += waited
        self.waited_max_s = max(self.waited_max_s, waited)
        if kind is not None:
            n_s = self.kinds.setdefault(kind, [0, 0.0])
            n_s[0] += 1
            n_s[1] += seconds

    def describe(self, wall_s: float) -> str:
        each = self.busy_s / self.plans * 1000
        wait = self.waited_s / self.plans * 1000
        failed = f", {self.failed} failed" if self.failed else ""
        kinds = "".join(f"; {kind}: {n:.0f}, {1000 * s / n:.1f} ms each"
                        for kind, (n, s) in self.kinds.items())
        return (f"{100 * self.busy_s / wall_s:.0f}% busy ({self.plans} plans, {each:.1f} ms "
                f"each, max {self.max_s * 1000:.0f}, collected {wait:.1f} ms after / max {self.waited_max_s * 1000:.0f}"
                f"{failed}{kinds})")


@dataclass(eq=False)
class StageSlot(Generic[PlanT, ResultT, OutT]):
    """One row of the table; only `name`, `stage`, `worker`, `route` and `fail` are needed.

    - `route(plan, outcomes, seconds)`: what `update` returned; `seconds` is execute's time.
    - `fail(plan, error)`: `execute` raised; the plan's owners get their errors.
    - `waiting()`: work held outside the stage that `prepare` hands it (TTS: segments).
    - `prepare()`: before each start, with the worker idle (TTS: hand over segments).
    - `settle()`: after each start (LLM: end requests the scheduler refused).
    - `landed()`: after each collected plan, routed or failed (LLM: free KV slots that
      only that plan still wrote).
    - `on_close()`: after the worker stopped (a remote LLM: cancel its HTTP requests).
    - `note()`: the stage's own words for the load report since the last one (LLM: plan
      shapes; TTS: gaps in the audio it sent), or None.
    - `kind(plan)`: a label the load report times plans by, or None (LLM: with prompts
      or without).
    """

    name: str
    stage: Stage[PlanT, ResultT, OutT]
    worker: StageWorker[PlanT, ResultT]
    route: Callable[[PlanT, OutT, float], None]
    fail: Callable[[PlanT, Exception], None]
    waiting: Callable[[], bool] = _no_work
    prepare: Callable[[], None] = _nothing
    settle: Callable[[], None] = _nothing
    landed: Callable[[], None] = _nothing
    on_close: Callable[[], None] = _nothing
    note: Callable[[], str | None] = _no_note
    kind: Callable[[PlanT], str | None] = _no_kind
    rounds: int = 1  # plans per step; more than one only for an inline worker
    load: StageLoad = field(default_factory=StageLoad)

    def __post_init__(self) -> None:
        if self.rounds > 1 and not self.worker.inline:
            raise ValueError(f"stage {self.name!r}: rounds={self.rounds} needs an inline "
                             "worker (thread_name=None); a threaded one runs one plan at a time")

    def has_work(self) -> bool:
        """A plan waits to be collected, or the idle worker has something to start."""
        if self.worker.done():
            return True
        return self.worker.idle and (self.stage.has_work() or self.waiting()
                                     or self.worker.backfill_due())

    def collect(self) -> bool:
        """Take the finished plan (if any) down the path; False if none or it failed."""
        done = self.worker.collect()
        if done is None:
            return False
        self.load.add(done.seconds, done.waited, done.error is not None, self.kind(done.plan))
        if done.error is not None:
            logger.error("%s step failed", self.name, exc_info=done.error)
            self.fail(done.plan, done.error)
        else:
            outcomes = self.stage.update(done.plan, cast(ResultT, done.result))
            self.route(done.plan, outcomes, done.seconds)
        self.landed()
        return done.error is None

    def start(self) -> None:
        """If the worker is idle: prepare, start the next plan(s), settle."""
        if not self.worker.idle:
            return
        self.prepare()
        for _ in range(self.rounds):
            if self.worker.start() is None:
                break
            if self.worker.inline and not self.collect():  # finished within start()
                break
        self.settle()
        if self.worker.idle:  # no plan: a deferred graph capture may run now
            self.worker.start_background()

    def close(self) -> None:
        self.worker.close()
        self.on_close()


class StageTable:
    """The engine's stages in table order; see the module docstring for that order's use."""

    def __init__(self, slots: Sequence[StageSlot[Any, Any, Any]]) -> None:
        names = [slot.name for slot in slots]
        if len(set(names)) != len(names):
            raise ValueError(f"stage table: duplicate stage names in {names}")
        self._slots = {slot.name: slot for slot in slots}
        self.steps = 0  # loop steps since the last load report
        self._since = time.perf_counter()

    def __getitem__(self, name: str) -> StageSlot[Any, Any, Any]:
        return self._slots[name]

    def __iter__(self) -> Iterator[StageSlot[Any, Any, Any]]:
        return iter(self._slots.values())

    def has_work(self) -> bool:
        return any(slot.has_work() for slot in self)

    def step(self) -> None:
        """Route every finished plan, then start every idle stage (both in table order)."""
        self.steps += 1
        for slot in self:
            slot.collect()
        for slot in self:
            slot.start()

    def load_report(self, min_interval_s: float) -> str | None:
        """Every stage's share of the wall clock since the last report, and reset; None
        before `min_interval_s` has passed or when no plan ran (an idle engine is quiet)."""
        now = time.perf_counter()
        wall = now - self._since
        if wall < min_interval_s:
            return None
        parts = [f"{slot.name} {slot.load.describe(wall)}" + (f" [{note}]" if (note := slot.note())
                                                              else "")
                 for slot in self if slot.load.plans]
        report = (f"stage load over {wall:.1f} s ({self.steps} loop steps): " + "; ".join(parts)
                  if parts else None)
        for slot in self:
            slot.load = StageLoad()
        self.steps, self._since = 0, now
        return report

    def close(self) -> None:
        """Stop every worker (a plan executing finishes; its outcome is not routed)."""
        for slot in self:
            slot.close()
