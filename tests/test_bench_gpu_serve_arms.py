"""`bench_gpu_serve.py run --arms`: one server per arm, then the arms side by side (the
device run's A/B). The servers need a GPU; the arm parsing and the table
(``voxline/bench_arms.py``) do not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from voxline.bench_arms import compare_arms, level_summary, merge, parse_arms

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"  # data, not scripts


def test_arms_parse_in_order_and_bad_specs_are_refused():
    assert parse_arms("") == []
    assert parse_arms("on1=; off1=--gpu-stream-priority off ;on2=") == [
        ("on1", ""), ("off1", "--gpu-stream-priority off"), ("on2", "")]
    with pytest.raises(SystemExit, match="given twice"):
        parse_arms("a=;a=--x")
    with pytest.raises(SystemExit, match="not NAME=FLAGS"):
        parse_arms("--gpu-stream-priority off")


def test_the_arms_table_reads_each_arms_merged_report(tmp_path, capsys):
    # a real H200 serve report (64 sessions, 192 turns) as arm "a"; arm "b" with one
    # turn underrun and one error; arm "c" never got as far as a report
    level = json.loads((RESULTS / "serve_h200_c64_report.json").read_text())["levels"][0]
    worse = json.loads(json.dumps(level))
    worse["results"][5]["underruns"] = 2
    worse["errors"] = {"timeout": 1}
    for arm, lv in (("a", level), ("b", worse)):
        (tmp_path / arm).mkdir()
        (tmp_path / arm / "serve.json").write_text(json.dumps(
            {"audio": {"levels": [lv], "sessions_held": 64 if arm == "a" else 0}}))
    table = compare_arms(tmp_path, [("a", ""), ("b", "--gpu-stream-priority off"), ("c", "--x")])
    a, b = table["a"]["audio"], table["b"]["audio"]
    eos = level["metrics"]["eos_to_first_audio_s"]
    assert a["levels"]["c=64"] == {"p50_ms": round(eos["p50"] * 1000), "p95_ms": round(eos["p95"] * 1000),
                                   "underran": 0, "turns": 192, "errors": 0}
    assert (b["levels"]["c=64"]["underran"], b["levels"]["c=64"]["errors"]) == (1, 1)
    assert (a["sessions_held"], b["sessions_held"]) == (64, 0)
    assert table["c"] == {"flags": "--x"}  # no report: listed with its flags only
    assert json.loads((tmp_path / "arms.json").read_text()) == table
    printed = capsys.readouterr().out
    assert "a [as given] audio: c=64 84 / 239, 0/192; held 64" in printed
    assert "b [--gpu-stream-priority off] audio: c=64 84 / 239, 1/192, 1 errors; held 0" in printed


def test_a_level_given_twice_is_merged_from_both_runs_and_shown_twice(tmp_path):
    report = json.loads((RESULTS / "serve_h200_c64_report.json").read_text())
    second = json.loads(json.dumps(report))
    second["levels"][0]["results"][0]["underruns"] = 1
    (tmp_path / "audio_c64.json").write_text(json.dumps(report))
    (tmp_path / "audio_c64_run2.json").write_text(json.dumps(second))  # as run() names it
    merge(tmp_path, "audio=64,64")
    levels = json.loads((tmp_path / "serve.json").read_text())["audio"]["levels"]
    assert [sum(bool(r.get("underruns")) for r in lv["results"]) for lv in levels] == [0, 1]
    rows = level_summary({"levels": levels})
    assert list(rows) == ["c=64", "c=64 #2"] and rows["c=64 #2"]["underran"] == 1
