"""`voxline bench` against live loopback servers without models: the echo core (its
replies are text only, and it ignores speech requests) and bench_core (echo core + an
energy VAD and tone replies), so behaviour is asserted, not timings."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from live_server import free_port, serve_app

from voxline.bench import held_line, underrun_note
from voxline.bench_turns import RequestResult, playout_gaps
from voxline.cli import main
from voxline.codecs.wav import write_wav
from voxline.config import load_settings
from voxline.engines.client import InProcessEngineClient
from voxline.logs import LoopLag
from voxline.realtime.app import create_app


@contextmanager
def serve(core: str) -> Iterator[str]:
    app = create_app(load_settings(), InProcessEngineClient(core))
    # a speech request the echo core never answers must not hold up teardown
    with serve_app(app, free_port(), name="bench-server", timeout_graceful_shutdown=1) as base:
        yield base


@pytest.fixture(scope="module")
def bench_url() -> Iterator[str]:
    with serve("bench_core:make_bench_core") as url:
        yield url


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    with serve("echo_core:make_echo_core") as url:
        yield url


@pytest.fixture(scope="module")
def questions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("questions")
    t = np.arange(9600) / 24000  # 0.4 s: short turns keep the test fast
    write_wav(d / "q.wav", (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 24000)
    return d


def run_bench(*args: str) -> int:
    return main(["bench", "--quiet", *args])


def check_levels(report: dict, labels: list[str]) -> None:
    assert [lv["label"] for lv in report["levels"]] == labels
    for lv in report["levels"]:
        assert lv["ok"] == lv["requests"] and lv["errors"] == {}
        assert lv["throughput"] > 0
        for metric in ("ttfa_s", "rtf", "audio_s", "underruns", "underrun_s"):
            m = lv["metrics"][metric]
            assert set(m) >= {"mean", "p50", "p90", "p95", "p99", "n"}
            assert m["p50"] <= m["p90"] <= m["p95"] <= m["p99"]
        for r in lv["results"]:
            assert r["ok"] and r["ttfa_s"] > 0 and r["audio_s"] > 0
            # each underrun is a gap of over 100 ms: none, or some and their seconds
            assert (r["underruns"] == 0) == (r["underrun_s"] == 0) and isinstance(r["underruns"], int)


def test_speech_sweep_json_gates_and_compare(bench_url: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "speech.json"
    passing = tmp_path / "ok.toml"
    passing.write_text('[[gate]]\nname = "median TTFP at c=1"\nlevel = "c=1"\nmetric = "ttfa_s"\n'
                       'stat = "p50"\nmax = 30.0\n\n[[gate]]\nlevel = "c=2"\n'
                       'metric = "throughput"\nmin = 0.01\n')
    assert run_bench("--url", bench_url, "--mode", "speech", "--concurrency", "1,2",
                     "--requests", "3", "--json", str(out), "--gates", str(passing)) == 0
    printed = capsys.readouterr().out
    assert "c=2" in printed and printed.count("PASS") == 2 and "FAIL" not in printed
    report = json.loads(out.read_text())
    assert report["mode"] == "speech"
    check_levels(report, ["c=1", "c=2"])
    for r in report["levels"][0]["results"]:
        assert abs(r["audio_s"] - 0.5) < 0.01  # bench_core speaks 0.5 s, pcm16 at 24 kHz

    failing = tmp_path / "fail.json"
    failing.write_text(json.dumps({"gates": [
        {"level": "c=1", "metric": "rtf", "stat": "p50", "max": 0.0},
        {"level": "c=8", "metric": "throughput", "min": 1.0}]}))  # c=8 was not measured
    assert run_bench("--url", bench_url, "--mode", "speech", "--requests", "2",
                     "--gates", str(failing)) == 1
    printed = capsys.readouterr().out
    assert printed.count("FAIL") == 2 and "not measured" in printed

    assert run_bench("--compare", str(out), str(out)) == 0
    printed = capsys.readouterr().out
    assert "B/A" in printed and "throughput" in printed and "1.00" in printed


def test_realtime_turns_over_server_vad_and_poisson(bench_url: str, questions: Path,
                                                    tmp_path: Path) -> None:
    out = tmp_path / "rt.json"
    assert run_bench("--url", bench_url, "--mode", "realtime", "--audio-dir", str(questions),
                     "--concurrency", "1,2", "--requests", "2", "--timeout", "15",
                     "--json", str(out)) == 0
    report = json.loads(out.read_text())
    check_levels(report, ["c=1", "c=2"])
    eos = report["levels"][0]["metrics"]["eos_to_first_audio_s"]
    assert eos["n"] == 2 and eos["p50"] <= eos["p95"] <= eos["p99"]

    assert run_bench("--url", bench_url, "--mode", "realtime", "--audio-dir", str(questions),
                     "--rate", "4", "--requests", "2", "--timeout", "15",
                     "--turn-detection", "manual", "--json", str(out)) == 0
    check_levels(json.loads(out.read_text()), ["rate=4"])


def test_echo_core_failures_are_counted_by_type(echo_url: str, questions: Path,
                                                tmp_path: Path) -> None:
    out = tmp_path / "echo.json"
    # the echo core ignores speech requests: every request times out
    assert run_bench("--url", echo_url, "--mode", "speech", "--requests", "2", "--timeout", "0.5",
                     "--json", str(out)) == 0
    lv = json.loads(out.read_text())["levels"][0]
    assert lv["ok"] == 0 and lv["errors"] == {"timeout": 2} and lv["error_rate"] == 1.0
    assert lv["metrics"]["ttfa_s"]["p50"] is None
    # its realtime replies are text only
    assert run_bench("--url", echo_url, "--mode", "realtime", "--audio-dir", str(questions),
                     "--turn-detection", "manual", "--requests", "1", "--timeout", "5",
                     "--json", str(out)) == 0
    assert json.loads(out.read_text())["levels"][0]["errors"] == {"no_audio": 1}


@pytest.mark.parametrize("url", ["http://10.1.2.3:8000", "http://example.com",
                                 "http://0.0.0.0:8000"])
def test_non_loopback_url_is_refused(url: str, capsys) -> None:
    assert run_bench("--url", url, "--mode", "speech") == 2
    assert "--allow-remote" in capsys.readouterr().err


def test_playout_simulation_counts_gaps_over_100_ms() -> None:
    assert playout_gaps([]) == []
    steady = [(0.1 * i, 0.1) for i in range(10)]
    assert playout_gaps(steady) == []
    gaps = playout_gaps([(0.0, 0.2), (0.25, 0.1), (0.6, 0.1)])  # 50 ms, 250 ms late
    assert len(gaps) == 1 and sum(g for _, g in gaps) == pytest.approx(0.25)
    # where each gap fell: after 0.2 + 0.1 s of the reply had played
    (at, gap), = gaps
    assert at == pytest.approx(0.3) and gap == pytest.approx(0.25)
    level = {"results": [{"underrun_at_s": [0.3]}, {"underrun_at_s": [2.5]}, {}],
             "client_loop_lag": {"p99_ms": 4.0, "max_ms": 12.0}}
    assert underrun_note(level) == ("2 underruns, 1 in a reply's first 1 s, positions p50 "
                                    "2.50 s, max 2.50 s; client loop lag p99 4.0 ms, max 12.0 ms")
    assert underrun_note({"results": [{"underrun_at_s": []}]}) is None


async def test_loop_lag_sees_a_callback_that_holds_the_loop() -> None:
    lag = LoopLag(tick_s=0.01)
    assert lag.take() is None
    lag.start()
    await asyncio.sleep(0.05)
    time.sleep(0.2)  # noqa: ASYNC251 -- blocks the loop, as a slow callback would
    await asyncio.sleep(0.05)
    await lag.stop()
    took = lag.take()
    assert took is not None and took["max_ms"] >= 150 and took["ticks"] >= 2
    assert lag.take() is None


def test_ramp_spreads_the_closed_loop_starts_and_is_validated(monkeypatch, capsys) -> None:
    import argparse
    import asyncio
    import time

    from voxline import bench

    starts: list[float] = []

    async def fake_speech(base: str, text: str, opts: argparse.Namespace) -> bench.RequestResult:
        starts.append(time.perf_counter())
        await asyncio.sleep(0.5)  # busy until every worker has taken its request
        return bench.RequestResult(ok=True)

    monkeypatch.setattr(bench, "speech_request", fake_speech)
    opts = argparse.Namespace(mode="speech", requests=4, max_seconds=60.0, quiet=True,
                              ramp=0.4)
    t0 = time.perf_counter()
    level = asyncio.run(bench.run_level("http://127.0.0.1:1", opts, [], 4, None))
    assert level["ok"] == 4
    # worker k sleeps k * ramp / c first (asyncio may wake a timer up to its clock
    # resolution early: hence 0.095)
    offsets = [s - t0 for s in sorted(starts)]
    assert [o >= 0.095 * k for k, o in enumerate(offsets)] == [True] * 4, offsets
    assert run_bench("--url", "http://127.0.0.1:1", "--mode", "speech", "--ramp", "-1") == 2
    assert "--ramp must be >= 0" in capsys.readouterr().err


def _sessions_opened(url: str) -> float:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("voxline_sessions_total "):
                return float(line.split()[1])
    return 0.0


def test_turns_are_asked_in_one_session_each(bench_url: str, questions: Path,
                                             tmp_path: Path, capsys) -> None:
    out = tmp_path / "turns.json"
    before = _sessions_opened(bench_url)
    # 5 turns of 2 per conversation: three sessions (2 + 2 + 1 turns), text and spoken
    assert run_bench("--url", bench_url, "--mode", "realtime", "--input", "text",
                     "--concurrency", "2", "--requests", "5", "--turns", "2",
                     "--timeout", "15", "--json", str(out)) == 0
    report = json.loads(out.read_text())
    check_levels(report, ["c=2"])
    assert report["turns_per_session"] == 2 and report["levels"][0]["requests"] == 5
    assert _sessions_opened(bench_url) - before == 3
    assert run_bench("--url", bench_url, "--mode", "realtime", "--audio-dir", str(questions),
                     "--requests", "2", "--turns", "2", "--timeout", "15",
                     "--json", str(out)) == 0
    lv = json.loads(out.read_text())["levels"][0]
    check_levels({"levels": [lv]}, ["c=1"])
    assert lv["metrics"]["eos_to_first_audio_s"]["n"] == 2  # each turn has its own stop
    assert _sessions_opened(bench_url) - before == 4

    capsys.readouterr()
    assert run_bench("--url", bench_url, "--turns", "0") == 2
    assert "--turns must be >= 1" in capsys.readouterr().err
    assert run_bench("--url", bench_url, "--mode", "speech", "--turns", "2") == 2
    assert "--turns applies to --mode realtime" in capsys.readouterr().err


def test_a_broken_conversation_fails_its_remaining_turns() -> None:
    from voxline.bench_turns import _fail_from

    results = [RequestResult(ok=True), RequestResult(), RequestResult()]
    _fail_from(results, 1, "closed_1011", 0.0)
    assert [(r.ok, r.error) for r in results] == [(True, None), (False, "closed_1011"),
                                                  (False, "after_closed_1011")]
    assert results[1].wall_s > 0


@pytest.fixture(scope="module")
def long_url() -> Iterator[str]:
    with serve("bench_core:make_long_bench_core") as url:
        yield url


def test_report_carries_the_reply_length_and_the_held_line_names_both_measures(
        bench_url: str, questions: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "len.json"
    assert run_bench("--url", bench_url, "--mode", "realtime", "--audio-dir", str(questions),
                     "--requests", "2", "--max-output-tokens", "50", "--timeout", "15",
                     "--json", str(out)) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["max_output_tokens"] == 50 and report["barge_in_fraction"] == 0.0
    lv = report["levels"][0]
    check_levels(report, ["c=1"])
    assert lv["reply_audio_s"]["n"] == 2 and lv["reply_audio_s"]["p50"] == pytest.approx(0.5, abs=0.01)
    assert lv["barge_ins"] == {"planned": 0, "made": 0}
    assert "output_tokens" in lv["metrics"] and "replies p50/p95 0.50/0.50 s of audio" in printed
    # end of speech (the question's last sound sent) comes before the VAD's speech_stopped
    for r in lv["results"]:
        assert r["speech_end_to_first_audio_s"] > r["eos_to_first_audio_s"] > 0
    held = [ln for ln in printed.splitlines() if ln.startswith("sessions held")]
    assert held == [held_line(report)] and report["sessions_held"] == 1
    assert "sessions held: 1 (p95 speech_stopped -> first audio " in held[0]
    assert "<= 250 ms, 0 underruns" in held[0] and "; p95 end of speech -> first audio " in held[0]
    assert held_line({"sessions_held": None, "levels": []}).startswith(
        "sessions held: none (no level had p95 speech_stopped -> first audio <= 250 ms")


def test_every_turn_barges_in_at_fraction_one(long_url: str, questions: Path,
                                              tmp_path: Path, capsys) -> None:
    out = tmp_path / "barge.json"
    # two conversations of two turns: the second question talks over the first reply, a
    # spare question over the second
    assert run_bench("--url", long_url, "--mode", "realtime", "--audio-dir", str(questions),
                     "--requests", "4", "--turns", "2", "--barge-in-fraction", "1.0",
                     "--timeout", "20", "--json", str(out)) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    lv = report["levels"][0]
    assert report["barge_in_fraction"] == 1.0 and lv["ok"] == lv["requests"] == 4
    assert lv["barge_ins"] == {"planned": 4, "made": 4} and "barge-ins 4/4" in printed
    for r in lv["results"]:
        assert r["barge_in"] and r["barge_in_to_stop_s"] is not None
        assert r["audio_s"] < 3.0  # cut: the 3 s reply stopped at the barge-in
        assert r["underruns"] == 0
    assert lv["metrics"]["barge_in_to_stop_s"]["n"] == 4
    assert lv["reply_audio_s"]["n"] == 0  # no reply was heard to its end


def test_gaps_after_a_barge_in_are_not_underruns() -> None:
    late = [(0.0, 0.1), (0.1, 0.1), (1.0, 0.1)]  # a piece 0.8 s late, after the barge-in
    heard = RequestResult(arrivals=list(late))
    heard.finish_audio(0.0)
    assert heard.underruns == 1
    barged = RequestResult(arrivals=list(late))
    barged.finish_audio(0.0, until=0.5)
    assert barged.underruns == 0 and barged.underrun_s == 0 and barged.rtf is None
    assert barged.audio_s == pytest.approx(0.3)


def test_barge_in_needs_spoken_turns(capsys) -> None:
    assert run_bench("--url", "http://127.0.0.1:1", "--input", "text",
                     "--barge-in-fraction", "0.5") == 2
    assert "--barge-in-fraction needs spoken turns" in capsys.readouterr().err
    assert run_bench("--url", "http://127.0.0.1:1", "--barge-in-fraction", "1.5") == 2
    assert "must be in [0, 1]" in capsys.readouterr().err
