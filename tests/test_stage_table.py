"""The stage table: every slot's plans take the one collect -> fail | update -> route path,
in table order, with each row's hooks at their documented points."""

from __future__ import annotations

import logging
import threading

import pytest
from conftest import TIME_FACTOR
from test_stage_worker import ListStage

from voxline.engines import protocol as p
from voxline.engines.stage import StageWorker
from voxline.engines.stage_table import StageLoad, StageSlot, StageTable


class LoggedStage(ListStage):
    """`ListStage` (execute doubles a plan, raising on 13) that logs each plan it
    schedules; update adds one, so a routed outcome shows it went through `update`."""

    def __init__(self, name: str, log: list[str], gate: threading.Event | None = None) -> None:
        super().__init__(gate)
        self.name = name
        self.log = log

    def schedule(self) -> int | None:
        plan = super().schedule()
        if plan is not None:
            self.log.append(f"{self.name}.schedule")
        return plan

    def update(self, plan: int, result: int) -> int:
        return result + 1


def slot(name: str, log: list[str], wake=lambda: None, thread: str | None = None,
         **hooks) -> StageSlot:
    stage = LoggedStage(name, log, hooks.pop("gate", None))

    def route(plan: int, out: int, seconds: float) -> None:
        log.append(f"{name}.route {plan}->{out}")

    def fail(plan: int, error: Exception) -> None:
        log.append(f"{name}.fail {plan}: {error}")

    return StageSlot(name, stage, StageWorker(stage, wake, thread), route=route, fail=fail,
                     landed=lambda: log.append(f"{name}.landed"), **hooks)


def test_inline_rows_route_or_fail_each_plan_then_land_it_bounded_by_rounds():
    log: list[str] = []
    vad = slot("vad", log, rounds=2)
    vad.stage.queue = [1, 2, 3]
    table = StageTable([vad])
    assert table.has_work()
    table.step()
    assert log == ["vad.schedule", "vad.route 1->3", "vad.landed",
                   "vad.schedule", "vad.route 2->5", "vad.landed"]  # two rounds a step
    log.clear()
    vad.stage.queue = [13, 4]
    table.step()  # the first failed plan ends the step's rounds
    assert log == ["vad.schedule", "vad.fail 13: unlucky", "vad.landed"]
    assert vad.stage.queue == [4] and table.has_work()


def test_a_failed_execute_is_logged_and_fails_its_owners_without_an_update(caplog):
    log: list[str] = []
    woke = threading.Event()
    asr = slot("asr", log, woke.set, "test-asr")
    asr.stage.queue = [13]
    table = StageTable([asr])
    table.step()
    assert woke.wait(5 * TIME_FACTOR)
    with caplog.at_level(logging.ERROR, logger="voxline.engines.stage_table"):
        table.step()
    assert log == ["asr.schedule", "asr.fail 13: unlucky", "asr.landed"]
    assert "asr step failed" in caplog.text and "unlucky" in caplog.text
    table.close()


def test_plans_land_in_table_order_before_any_stage_starts():
    log: list[str] = []
    woke = threading.Event()
    rows = [slot(name, log, woke.set, f"test-{name}") for name in ("a", "b")]
    table = StageTable(rows)
    rows[0].stage.queue, rows[1].stage.queue = [1, 10], [2, 20]
    table.step()
    assert log == ["a.schedule", "b.schedule"]
    while not all(row.worker.done() for row in rows):
        assert woke.wait(5 * TIME_FACTOR)
        woke.clear()
    log.clear()
    table.step()
    assert log == ["a.route 1->3", "a.landed", "b.route 2->5", "b.landed",
                   "a.schedule", "b.schedule"]
    table.close()


def test_prepare_runs_only_when_idle_and_settle_after_every_start():
    log: list[str] = []
    gate, woke = threading.Event(), threading.Event()
    held: list[int] = [7]  # work waiting outside the stage until `prepare` hands it over

    def prepare() -> None:
        log.append("prepare")
        tts.stage.queue.extend(held)
        held.clear()

    tts = slot("tts", log, woke.set, "test-tts", gate=gate, prepare=prepare,
               settle=lambda: log.append("settle"), waiting=lambda: bool(held))
    table = StageTable([tts])
    assert table.has_work()  # only the held work: `waiting` counts
    table.step()
    assert log == ["prepare", "tts.schedule", "settle"]
    held.append(8)
    assert not table.has_work()  # busy and not done: nothing to do until it lands
    table.step()
    assert log == ["prepare", "tts.schedule", "settle"]  # busy: no prepare, no settle
    gate.set()
    assert woke.wait(5 * TIME_FACTOR)
    assert table.has_work()
    table.step()
    assert log[3:] == ["tts.route 7->15", "tts.landed", "prepare", "tts.schedule", "settle"]
    table.close()
    log.clear()

    idle = slot("idle", log, settle=lambda: log.append("settle"))
    StageTable([idle]).step()  # nothing scheduled: settle still runs (it may have refused work)
    assert log == ["settle"]


def test_close_stops_every_worker_then_calls_on_close():
    log: list[str] = []
    rows = [slot(n, log, thread=f"test-{n}", on_close=lambda n=n: log.append(f"{n}.closed"))
            for n in ("a", "b")]
    StageTable(rows).close()
    assert log == ["a.closed", "b.closed"]
    assert all(row.worker.idle for row in rows)


def test_a_table_is_refused_with_duplicate_names_or_rounds_on_a_threaded_worker():
    log: list[str] = []
    with pytest.raises(ValueError, match="duplicate stage names"):
        StageTable([slot("a", log), slot("a", log)])
    with pytest.raises(ValueError, match="rounds=4 needs an inline worker"):
        slot("asr", log, thread="test-asr", rounds=4)


def test_error_codes_keep_their_wire_values_and_say_which_are_the_servers():
    err = p.StreamError("s", "boom", p.ErrorCode.ASR_ERROR)
    back = p.decode_output(p.encode(err))
    assert back == err and back.code == "asr_error" and back.code is p.ErrorCode.ASR_ERROR
    # the rule the session used to apply to the code's name, for every non-fatal code
    fatal_only = {p.ErrorCode.ENGINE_DEAD, p.ErrorCode.ENGINE_CLOSED, p.ErrorCode.OUTPUT_OVERFLOW}
    for code in set(p.ErrorCode) - fatal_only:
        by_name = code.endswith("_error") or code in ("server_busy", "capacity")
        assert code.server_side == by_name, code


def test_the_load_report_counts_each_stages_plans_and_failures_then_resets():
    log: list[str] = []
    vad, asr = slot("vad", log, rounds=3), slot("asr", log)
    vad.stage.queue = [1, 13, 2]
    table = StageTable([vad, asr])
    assert table.load_report(0.0) is None  # no plan ran: an idle engine logs nothing
    table.step()  # 1 routes, 13 fails and ends the step's rounds
    table.step()  # 2 routes
    assert table.load_report(3600.0) is None  # too soon: nothing reported, nothing reset
    report = table.load_report(0.0)
    assert report is not None and report.startswith("stage load over ")
    assert "(2 loop steps)" in report and "vad " in report and "asr " not in report
    assert "(3 plans, " in report and ", 1 failed)" in report
    assert table.load_report(0.0) is None  # counters start again from zero
    vad.note = lambda: "3 gaps"
    vad.stage.queue = [4]
    table.step()
    assert "[3 gaps]" in (table.load_report(0.0) or "")  # a stage's own note, in its part


def test_the_load_report_times_plans_by_the_stages_kind():
    load = StageLoad()
    for seconds, kind in ((0.080, "with prompts"), (0.004, "decode only"), (0.100, "with prompts"),
                          (0.006, "decode only"), (0.002, None)):
        load.add(seconds, 0.0, False, kind)
    line = load.describe(1.0)
    assert "(5 plans, 38.4 ms each," in line
    assert line.endswith("; with prompts: 2, 90.0 ms each; decode only: 2, 5.0 ms each)")
