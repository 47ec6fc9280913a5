"""The device serve benchmark's reports (``benchmarks/gpu_serving/bench_gpu_serve.py``):
its per-level ``voxline bench`` JSONs merged into one report per input, and ``run --arms``
(one server per arm) read back as a side-by-side table. Files only: no server, no GPU."""

from __future__ import annotations

import json
from pathlib import Path

from voxline.bench import sessions_held


def merge(out: Path, sweeps: str) -> None:
    """One report per input (the per-level bench JSONs' levels in order, sessions_held
    recomputed over them), written to ``out/serve.json``."""
    merged: dict[str, dict] = {}
    for sweep in sweeps.split(";"):
        inp, _, levels = sweep.partition("=")
        names: list[str] = []  # as bench_gpu_serve.py's `serve_and_bench` names them: a level again is _runN
        for c in levels.split(","):
            base = f"{inp}_c{c}"
            n = sum(1 for name in names if name == base or name.startswith(f"{base}_run")) + 1
            names.append(base if n == 1 else f"{base}_run{n}")
        reports = [json.loads(f.read_text()) for name in names
                   if (f := out / f"{name}.json").exists()]
        if reports:
            lv = [level for rep in reports for level in rep["levels"]]
            merged[inp] = {**reports[0], "levels": lv, "sessions_held": sessions_held(lv)}
    (out / "serve.json").write_text(json.dumps(merged, indent=1))
    print("== sessions held:", {k: v["sessions_held"] for k, v in merged.items()}, flush=True)


def parse_arms(spec: str) -> list[tuple[str, str]]:
    """``--arms``: ';'-separated NAME=FLAGS, each a server of its own in OUT/NAME."""
    arms: list[tuple[str, str]] = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, sep, flags = part.partition("=")
        if not sep or not name.strip().isidentifier():
            raise SystemExit(f"--arms: {part!r} is not NAME=FLAGS (NAME a plain word)")
        if name.strip() in {n for n, _ in arms}:
            raise SystemExit(f"--arms: {name.strip()!r} given twice (name each run apart: a1, a2)")
        arms.append((name.strip(), flags.strip()))
    return arms


def level_summary(report: dict) -> dict[str, dict[str, float | int | None]]:
    """Per level of one input's merged report: p50/p95 speech_stopped -> first audio (ms),
    the turns that underran and the errors."""
    rows = {}
    for i, level in enumerate(report["levels"]):
        eos = level["metrics"].get("eos_to_first_audio_s") or {}
        label = level["label"] if level["label"] not in rows else f"{level['label']} #{i + 1}"
        rows[label] = {
            "p50_ms": round(eos["p50"] * 1000) if eos.get("p50") is not None else None,
            "p95_ms": round(eos["p95"] * 1000) if eos.get("p95") is not None else None,
            "underran": sum(1 for r in level["results"] if r.get("underruns")),
            "turns": len(level["results"]), "errors": sum(level["errors"].values())}
    return rows


def compare_arms(out: Path, arms: list[tuple[str, str]]) -> dict:
    """Each arm's levels side by side (OUT/arms.json), printed as a table."""
    table: dict = {}
    for name, flags in arms:
        merged = out / name / "serve.json"
        reports = json.loads(merged.read_text()) if merged.exists() else {}
        table[name] = {"flags": flags, **{inp: {"sessions_held": rep["sessions_held"],
                                                "levels": level_summary(rep)}
                                          for inp, rep in reports.items()}}
    (out / "arms.json").write_text(json.dumps(table, indent=1))
    print("== arms: speech_stopped -> first audio p50 / p95 ms, turns underran / turns")
    for name, row in table.items():
        for inp, rep in row.items():
            if inp == "flags":
                continue
            cells = [f"{label} {v['p50_ms']} / {v['p95_ms']}, {v['underran']}/{v['turns']}"
                     + (f", {v['errors']} errors" if v["errors"] else "")
                     for label, v in rep["levels"].items()]
            print(f"  {name} [{row['flags'] or 'as given'}] {inp}: " + "; ".join(cells)
                  + f"; held {rep['sessions_held']}", flush=True)
    return table
