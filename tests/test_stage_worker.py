"""StageWorker: the one submit-and-wake helper every engine stage runs its model through."""

from __future__ import annotations

import threading

import pytest
from conftest import TIME_FACTOR

from voxline.engines.stage import StageWorker


class ListStage:
    """A stage whose queue is a list of numbers; execute doubles a plan, optionally
    waiting for `gate` (so a test can hold a plan in flight) or raising on 13."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.queue: list[int] = []
        self.gate = gate
        self.threads: list[str] = []

    def has_work(self) -> bool:
        return bool(self.queue)

    def schedule(self) -> int | None:
        return self.queue.pop(0) if self.queue else None

    def execute(self, plan: int) -> int:
        self.threads.append(threading.current_thread().name)
        if self.gate is not None:
            assert self.gate.wait(5 * TIME_FACTOR)
        if plan == 13:
            raise ValueError("unlucky")
        return plan * 2

    def update(self, plan: int, result: int) -> int:
        return result


def test_one_plan_at_a_time_off_the_loop_and_the_loop_is_woken():
    gate, woke = threading.Event(), threading.Event()
    stage = ListStage(gate)
    stage.queue = [1, 2]
    worker = StageWorker(stage, woke.set, "test-stage")
    assert worker.idle and worker.start() == 1
    assert worker.running == 1 and not worker.idle
    assert worker.start() is None and stage.queue == [2]  # busy: nothing else is scheduled
    assert worker.collect() is None and not worker.done()  # still executing
    gate.set()
    assert woke.wait(5 * TIME_FACTOR)  # the finished future wakes the loop
    assert worker.done()
    done = worker.collect()
    assert (done.plan, done.result, done.error) == (1, 2, None)
    assert stage.threads[0].startswith("test-stage")
    assert worker.idle and worker.collect() is None  # handed back exactly once
    assert worker.start() == 2
    worker.close()  # the plan in flight ends (done, or cancelled if it had not started)
    assert worker.done()


def test_an_execute_error_comes_back_with_its_plan_and_the_worker_carries_on():
    woke = threading.Event()
    stage = ListStage()
    stage.queue = [13, 5]
    worker = StageWorker(stage, woke.set, "test-stage")
    worker.start()
    assert woke.wait(5 * TIME_FACTOR)
    done = worker.collect()
    assert done.plan == 13 and done.result is None and isinstance(done.error, ValueError)
    woke.clear()
    worker.start()
    assert woke.wait(5 * TIME_FACTOR)
    assert worker.collect().result == 10
    worker.close()


def test_inline_worker_runs_the_plan_inside_start_without_waking():
    def wake() -> None:
        pytest.fail("an inline plan must not wake the loop")

    stage = ListStage()
    stage.queue = [3, 13]
    worker = StageWorker(stage, wake, thread_name=None)
    assert worker.start() == 3 and worker.done()
    assert stage.threads == [threading.current_thread().name]
    assert worker.collect().result == 6
    worker.start()
    assert isinstance(worker.collect().error, ValueError)
    assert worker.start() is None and worker.idle  # nothing scheduled: stays idle
    worker.close()
