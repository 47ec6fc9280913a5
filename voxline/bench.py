"""`voxline bench`: load a running voxline server over its real protocols and measure it.

A client tool on top of the stack (nothing imports it). Modes:

- ``realtime``: spoken questions streamed at real time over ``/v1/realtime`` (server VAD,
  or ``manual`` commit), the reply's ``response.output_audio.delta`` timed;
- ``speech``: ``POST /v1/audio/speech`` with ``response_format=pcm``, the body streamed.

Load shapes: a closed-loop concurrency sweep, or an open-loop Poisson arrival rate (the
arrivals do not wait for replies, so a slow server shows as queueing, not as fewer
requests). Everything is bounded: ``--requests`` per level, ``--timeout`` per request,
``--max-seconds`` per level. Only loopback URLs unless ``--allow-remote``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from voxline.bench_turns import (
    BARGE_IN_AFTER_S,
    WIRE_RATE,
    RequestResult,
    headers,
    realtime_conversation,
)
from voxline.codecs.resample import resample
from voxline.codecs.wav import read_wav
from voxline.logs import LoopLag

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
FIRST_SECOND_S = 1.0  # underruns this early in a reply point at its start, not its flow
STATS = ("mean", "p50", "p90", "p95", "p99")
METRICS = ("ttfa_s", "eos_to_first_audio_s", "speech_end_to_first_audio_s", "rtf", "audio_s",
           "output_tokens", "underruns", "underrun_s", "barge_in_to_stop_s")
QUESTIONS = (
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Tell me a short fact about the moon.",
    "What colour is the sky on a clear day?",
)
ESPEAK_VOICES = (("en-us", 160), ("en-gb", 140), ("en-us+f3", 180))


class BenchError(Exception):
    """A usage problem (bad URL, gates file, missing audio): exit 2 with the message."""


def check_url(url: str, allow_remote: bool) -> str:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise BenchError(f"--url must be http(s)://host:port, got {url!r}")
    if parsed.hostname not in LOOPBACK and not allow_remote:
        raise BenchError(f"refusing non-loopback host {parsed.hostname!r}: benchmarks target "
                         "127.0.0.1 only (pass --allow-remote to override)")
    return url.rstrip("/")


# ---------------------------------------------------------------------------- questions


def load_questions(audio_dir: str | None, workdir: Path) -> list[np.ndarray]:
    """Question audio at the wire rate: --audio-dir WAVs, else espeak-ng, else Piper."""
    if audio_dir:
        files = sorted(Path(audio_dir).glob("*.wav"))
        if not files:
            raise BenchError(f"no .wav files in {audio_dir}")
        return [_to_wire(*read_wav(f)) for f in files]
    if shutil.which("espeak-ng"):
        out = []
        for i, text in enumerate(QUESTIONS):
            voice, wpm = ESPEAK_VOICES[i % len(ESPEAK_VOICES)]
            path = workdir / f"q{i}.wav"
            subprocess.run(["espeak-ng", "-v", voice, "-s", str(wpm), "-w", str(path), text],
                           check=True, capture_output=True)
            out.append(_to_wire(*read_wav(path)))
        return out
    from voxline.engines.models.piper_tts import PiperTTS  # slow import: only as a fallback

    tts = PiperTTS.load()
    return [_to_wire(tts.synthesize_all(t), tts.sample_rate) for t in QUESTIONS]


def _to_wire(audio: np.ndarray, rate: int) -> np.ndarray:
    return resample(audio, rate, WIRE_RATE) if rate != WIRE_RATE else audio.astype(np.float32)


# ---------------------------------------------------------------------------- requests


async def speech_request(base: str, text: str, opts: argparse.Namespace) -> RequestResult:
    import httpx

    res = RequestResult()
    start = time.perf_counter()
    body = {"model": "voxline", "input": text, "voice": opts.voice, "response_format": "pcm"}
    try:
        async with asyncio.timeout(opts.timeout), httpx.AsyncClient(timeout=opts.timeout) as http:
            async with http.stream("POST", base + "/v1/audio/speech", json=body,
                                   headers=headers(opts.api_key)) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    res.error = f"http_{resp.status_code}"
                    return res
                odd = b""  # a PCM16 sample may straddle two body chunks
                async for chunk in resp.aiter_bytes():
                    now = time.perf_counter()
                    data, odd = odd + chunk, b""
                    if len(data) % 2:
                        data, odd = data[:-1], data[-1:]
                    if not data:
                        continue
                    if res.ttfa_s is None:
                        res.ttfa_s = now - start
                    res.arrivals.append((now, len(data) / 2 / WIRE_RATE))
        res.ok = bool(res.arrivals)
        res.error = None if res.ok else "no_audio"
    except TimeoutError:
        res.error = "timeout"
    except httpx.HTTPError as exc:
        res.error = f"http_{type(exc).__name__}"
    finally:
        res.wall_s = time.perf_counter() - start
        res.finish_audio(start)
    return res


# ---------------------------------------------------------------------------- load shapes


class Progress:
    def __init__(self, label: str, total: int, quiet: bool) -> None:
        self.label, self.total, self.quiet = label, total, quiet
        self.done = self.errors = 0
        self.start = time.perf_counter()

    def update(self, res: RequestResult) -> None:
        self.done += 1
        self.errors += not res.ok
        if not self.quiet:
            print(f"\r[{self.label}] {self.done}/{self.total} done, {self.errors} errors, "
                  f"{time.perf_counter() - self.start:.1f} s", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if not self.quiet:
            print(file=sys.stderr, flush=True)


async def run_level(base: str, opts: argparse.Namespace, questions: list[np.ndarray],
                    concurrency: int | None, rate: float | None) -> dict[str, Any]:
    label = f"c={concurrency}" if concurrency is not None else f"rate={rate:g}"
    progress = Progress(label, opts.requests, opts.quiet)
    deadline = time.perf_counter() + opts.max_seconds
    results: list[RequestResult] = []

    async def one(indices: list[int]) -> None:
        """A request (speech mode), or a conversation of len(indices) turns."""
        if opts.mode == "speech":
            got = [await speech_request(base, QUESTIONS[indices[0] % len(QUESTIONS)], opts)]
        elif getattr(opts, "input", "audio") == "text":
            got = await realtime_conversation(
                base, [(None, QUESTIONS[i % len(QUESTIONS)]) for i in indices], opts)
        else:
            got = await realtime_conversation(
                base, [(questions[i % len(questions)], None) for i in indices], opts,
                barge=[barges[i] for i in indices],
                spare=questions[(indices[-1] + 1) % len(questions)])
        for res in got:
            results.append(res)
            progress.update(res)

    # the turns talked over: drawn per turn from the seed, so a run repeats
    fraction = getattr(opts, "barge_in_fraction", 0.0)
    pick = random.Random(f"barge{getattr(opts, 'seed', 0)}")
    barges = [pick.random() < fraction for _ in range(opts.requests)]
    turns = getattr(opts, "turns", 1)
    batches = [list(range(i, min(i + turns, opts.requests)))
               for i in range(0, opts.requests, turns)]

    lag = LoopLag()  # the client's own stalls read as late audio: report them beside it
    lag.start()
    start = time.perf_counter()
    if concurrency is not None:
        counter = iter(batches)

        workers = min(concurrency, len(batches))
        ramp = getattr(opts, "ramp", 0.0)

        async def worker(k: int) -> None:
            await asyncio.sleep(ramp * k / workers)  # --ramp: starts spread, turns out of step
            for batch in counter:  # shared iterator: each conversation is taken once
                if time.perf_counter() > deadline:
                    return
                await one(batch)

        await asyncio.gather(*(worker(k) for k in range(workers)))
    else:
        assert rate is not None
        rng, tasks = random.Random(opts.seed), []
        for batch in batches:
            if time.perf_counter() > deadline:
                break
            tasks.append(asyncio.create_task(one(batch)))
            await asyncio.sleep(rng.expovariate(rate))  # Poisson arrivals: exponential gaps
        await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    await lag.stop()
    progress.close()
    return summarize(label, concurrency, rate, results, wall) | {"client_loop_lag": lag.take()}


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {s: None for s in STATS} | {"n": 0}
    arr = np.asarray(values, dtype=np.float64)
    out: dict[str, float | None] = {"mean": float(arr.mean())}
    for q in (50, 90, 95, 99):
        out[f"p{q}"] = float(np.percentile(arr, q))
    return out | {"n": len(values)}


def summarize(label: str, concurrency: int | None, rate: float | None,
              results: list[RequestResult], wall: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    metrics = {m: percentiles([v for r in ok if (v := getattr(r, m)) is not None])
               for m in METRICS}
    audio = sum(r.audio_s for r in ok)
    whole = [r.audio_s for r in ok if not r.barge_in]  # replies heard to their end
    return {
        "label": label, "concurrency": concurrency, "rate": rate,
        "requests": len(results), "ok": len(ok),
        "errors": dict(Counter(r.error or "unknown" for r in results if not r.ok)),
        "error_rate": (len(results) - len(ok)) / len(results) if results else 1.0,
        "wall_s": wall,
        "throughput": audio / wall if wall > 0 else 0.0,  # audio-seconds per wall-second
        "metrics": metrics,
        "reply_audio_s": percentiles(whole),  # the reply length: seconds of speech
        "barge_ins": {"planned": sum(r.barge_in_planned for r in results),
                      "made": sum(r.barge_in for r in results)},
        "results": [{k: v for k, v in asdict(r).items() if k != "arrivals"} for r in results],
    }


# ---------------------------------------------------------------------------- output


def _fmt(v: float | None, scale: float = 1.0) -> str:
    return "-" if v is None else f"{v * scale:.0f}" if scale != 1.0 else f"{v:.2f}"


def table(report: dict[str, Any]) -> str:
    # the second column counts from speech_stopped, after the VAD's silence window
    head = (f"{'level':>10} {'ok/n':>7} {'TTFA p50/p95/p99 ms':>21} {'stopped->audio p50/p95':>22}"
            f" {'RTF p50':>8} {'audio s/s':>9} {'underruns':>9} errors")
    lines = [f"voxline bench: {report['mode']} @ {report['url']}", head]
    notes = []
    for lv in report["levels"]:
        m = lv["metrics"]
        if (note := underrun_note(lv)) is not None:
            notes.append(f"{lv['label']:>10}: {note}")
        notes.append(f"{lv['label']:>10}: {reply_note(lv)}")
        ttfa = "/".join(_fmt(m["ttfa_s"][s], 1000) for s in ("p50", "p95", "p99"))
        eos = "/".join(_fmt(m["eos_to_first_audio_s"][s], 1000) for s in ("p50", "p95"))
        under = sum(r["underruns"] for r in lv["results"])
        errors = ", ".join(f"{k}: {v}" for k, v in lv["errors"].items()) or "-"
        lines.append(f"{lv['label']:>10} {lv['ok']:>3}/{lv['requests']:<3} {ttfa:>21} {eos:>22}"
                     f" {_fmt(m['rtf']['p50']):>8} {lv['throughput']:>9.2f} {under:>9} {errors}")
    return "\n".join(lines + notes)


def reply_note(level: dict[str, Any]) -> str:
    """A level's reply length (seconds of audio of the replies heard to their end, and
    tokens where the server counts them) and its barge-ins."""
    audio, m = level.get("reply_audio_s") or {}, level["metrics"]
    tokens = m.get("output_tokens") or {}
    count = "/".join("-" if tokens.get(k) is None else f"{tokens[k]:.0f}" for k in ("p50", "p95"))
    note = (f"replies p50/p95 {_fmt(audio.get('p50'))}/{_fmt(audio.get('p95'))} s of audio, "
            f"{count} tokens")
    barges = level.get("barge_ins") or {}
    if barges.get("planned"):
        stop = m.get("barge_in_to_stop_s") or {}
        note += (f"; barge-ins {barges['made']}/{barges['planned']}, barge-in -> reply audio "
                 f"stopped p50/p95 {_fmt(stop.get('p50'), 1000)}/{_fmt(stop.get('p95'), 1000)} ms")
    return note


def underrun_note(level: dict[str, Any]) -> str | None:
    """Where a level's underruns fell in their replies, and the client's own loop lag (a
    stalled client reads audio late): None when there were no underruns."""
    at = sorted(a for r in level["results"] for a in r.get("underrun_at_s", ()))
    if not at:
        return None
    early = sum(a < FIRST_SECOND_S for a in at)
    lag = level.get("client_loop_lag") or {}
    return (f"{len(at)} underruns, {early} in a reply's first {FIRST_SECOND_S:g} s, "
            f"positions p50 {at[len(at) // 2]:.2f} s, max {at[-1]:.2f} s; client loop lag "
            f"p99 {lag.get('p99_ms', '-')} ms, max {lag.get('max_ms', '-')} ms")


def level_value(level: dict[str, Any], metric: str, stat: str) -> float | None:
    if metric in ("throughput", "error_rate", "ok", "requests", "wall_s"):
        return float(level[metric])
    if metric not in level["metrics"]:
        raise BenchError(f"unknown metric {metric!r}")
    return level["metrics"][metric].get(stat)


def load_gates(path: str) -> list[dict[str, Any]]:
    text = Path(path).read_text()
    if path.endswith(".toml"):
        import tomllib

        data: Any = tomllib.loads(text)
    else:
        data = json.loads(text)
    gates = data.get("gate", data.get("gates")) if isinstance(data, dict) else data
    if not isinstance(gates, list) or not gates:
        raise BenchError(f"{path}: expected a list of gates ([[gate]] in TOML, "
                         "{\"gates\": [...]} or a list in JSON)")
    for g in gates:
        if "level" not in g or "metric" not in g or ("max" not in g and "min" not in g):
            raise BenchError(f"{path}: each gate needs level, metric and max or min: {g}")
    return gates


def check_gates(report: dict[str, Any], gates: list[dict[str, Any]]) -> tuple[list[str], bool]:
    """One PASS/FAIL line per gate; a gate on an unmeasured level or value fails."""
    levels = {lv["label"]: lv for lv in report["levels"]}
    lines, ok = [], True
    for g in gates:
        stat = g.get("stat", "p50")
        name = g.get("name") or f"{g['metric']} {stat} at {g['level']}"
        level = levels.get(g["level"])
        value = level_value(level, g["metric"], stat) if level else None
        passed = value is not None and not math.isnan(value)
        if passed and "max" in g:
            passed = value <= g["max"]  # type: ignore[operator]
        if passed and "min" in g:
            passed = value >= g["min"]  # type: ignore[operator]
        bound = " ".join(f"{k} {g[k]}" for k in ("min", "max") if k in g)
        shown = "not measured" if value is None else f"{value:.3f}"
        lines.append(f"{'PASS' if passed else 'FAIL'}  {name}: {shown} ({bound})")
        ok &= passed
    return lines, ok


def compare(a_path: str, b_path: str) -> str:
    a, b = (json.loads(Path(p).read_text()) for p in (a_path, b_path))
    b_levels = {lv["label"]: lv for lv in b["levels"]}
    lines = [f"{'level':>10} {'value':<28} {'A':>10} {'B':>10} {'B/A':>7}"]
    for la in a["levels"]:
        lb = b_levels.get(la["label"])
        if lb is None:
            continue
        rows = [("throughput", "", "throughput"), ("error_rate", "", "error_rate")]
        rows += [(m, s, f"{m} {s}") for m in ("ttfa_s", "eos_to_first_audio_s", "rtf")
                 for s in ("p50", "p95")]
        for metric, stat, name in rows:
            va, vb = level_value(la, metric, stat), level_value(lb, metric, stat)
            if va is None and vb is None:
                continue
            ratio = f"{vb / va:.2f}" if va and vb is not None else "-"
            lines.append(f"{la['label']:>10} {name:<28} {_fmt(va):>10} {_fmt(vb):>10} {ratio:>7}")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: str) -> bool:
    """Latency percentiles and underruns against concurrency; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    levels = [lv for lv in report["levels"] if lv["concurrency"] is not None]
    if not levels:
        return False
    xs = [lv["concurrency"] for lv in levels]
    metric = "eos_to_first_audio_s" if report["mode"] == "realtime" else "ttfa_s"
    fig, ax = plt.subplots(figsize=(7, 4))
    for stat in ("p50", "p95", "p99"):
        ys = [lv["metrics"][metric][stat] for lv in levels]
        ax.plot(xs, [math.nan if y is None else y * 1000 for y in ys], marker="o", label=stat)
    ax.set_xlabel("concurrency")
    ax.set_ylabel(f"{metric} (ms)")
    ax2 = ax.twinx()
    ax2.bar(xs, [sum(r["underruns"] for r in lv["results"]) for lv in levels], alpha=0.2,
            color="red", label="underruns")
    ax2.set_ylabel("underruns")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------- entry point


def _levels(opts: argparse.Namespace) -> list[tuple[int | None, float | None]]:
    if getattr(opts, "ramp", 0.0) < 0:
        raise BenchError("--ramp must be >= 0 seconds")
    turns = getattr(opts, "turns", 1)
    if turns < 1:
        raise BenchError(f"--turns must be >= 1, got {turns}")
    if turns > 1 and opts.mode != "realtime":
        raise BenchError("--turns applies to --mode realtime (a speech request has one turn)")
    fraction = getattr(opts, "barge_in_fraction", 0.0)
    if getattr(opts, "barge_in_after", 0.0) < 0:
        raise BenchError("--barge-in-after must be >= 0 seconds")
    if not 0.0 <= fraction <= 1.0:
        raise BenchError(f"--barge-in-fraction must be in [0, 1], got {fraction}")
    if fraction and (opts.mode != "realtime" or getattr(opts, "input", "audio") != "audio"
                     or opts.turn_detection != "server_vad"):
        raise BenchError("--barge-in-fraction needs spoken turns (--mode realtime --input "
                         "audio --turn-detection server_vad): a barge-in is the user talking")
    if opts.rate is not None:
        if opts.rate <= 0:
            raise BenchError("--rate must be > 0")
        return [(None, opts.rate)]
    try:
        cs = [int(c) for c in opts.concurrency.split(",") if c.strip()]
    except ValueError as exc:
        raise BenchError(f"--concurrency: expected e.g. 1,2,4, got {opts.concurrency!r}") from exc
    if not cs or min(cs) < 1:
        raise BenchError("--concurrency needs positive integers")
    return [(c, None) for c in cs]


async def bench(opts: argparse.Namespace) -> dict[str, Any]:
    base = check_url(opts.url, opts.allow_remote)
    spoken = opts.mode == "realtime" and getattr(opts, "input", "audio") == "audio"
    with tempfile.TemporaryDirectory(prefix="voxline-bench-") as tmp:
        questions = load_questions(opts.audio_dir, Path(tmp)) if spoken else []
    levels = [await run_level(base, opts, questions, c, r) for c, r in _levels(opts)]
    return {"version": 1, "mode": opts.mode, "url": base, "turn_detection": opts.turn_detection,
            "input": getattr(opts, "input", "audio"),
            "requests_per_level": opts.requests, "timeout_s": opts.timeout,
            "ramp_s": getattr(opts, "ramp", 0.0), "turns_per_session": getattr(opts, "turns", 1),
            "max_output_tokens": getattr(opts, "max_output_tokens", None),
            "barge_in_fraction": getattr(opts, "barge_in_fraction", 0.0),
            "barge_in_after_s": getattr(opts, "barge_in_after", BARGE_IN_AFTER_S),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "levels": levels,
            "sessions_held": sessions_held(levels)}


HELD_EOS_P95_S = 0.25  # the bar: p95 speech_stopped -> first audio


def sessions_held(levels: list[dict[str, Any]], bar_s: float = HELD_EOS_P95_S) -> int | None:
    """The largest concurrency level with no errors, zero underruns and p95 end of speech
    -> first audio within `bar_s` (None: no concurrency level met it)."""
    held = [lv["concurrency"] for lv in levels
            if lv["concurrency"] is not None and lv["requests"] and lv["ok"] == lv["requests"]
            and not any(r["underruns"] for r in lv["results"])
            and (p95 := lv["metrics"]["eos_to_first_audio_s"]["p95"]) is not None
            and p95 <= bar_s]
    return max(held, default=None)


def held_line(report: dict[str, Any]) -> str:
    """The "sessions held" line, naming what it measures: speech_stopped (the server VAD's
    end of turn) -> first audio, the bar, and end of speech (the question's last sound
    sent) -> first audio beside it, which adds the VAD's silence window."""
    bar = f"{HELD_EOS_P95_S * 1000:.0f} ms"
    held = report["sessions_held"]
    level = next((lv for lv in report["levels"] if lv["concurrency"] == held), None)
    if held is None or level is None:
        return (f"sessions held: none (no level had p95 speech_stopped -> first audio <= {bar}"
                " with 0 underruns and no errors)")
    m = level["metrics"]
    under = sum(r["underruns"] for r in level["results"])
    return (f"sessions held: {held} (p95 speech_stopped -> first audio "
            f"{_fmt(m['eos_to_first_audio_s']['p95'], 1000)} ms <= {bar}, {under} underruns, "
            f"no errors; p95 end of speech -> first audio "
            f"{_fmt(m['speech_end_to_first_audio_s']['p95'], 1000)} ms)")


def main(opts: argparse.Namespace) -> int:
    """Run (or compare); 0 on success, 1 when a gate fails, 2 on a usage error."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request drowns the table
    try:
        if opts.compare:
            print(compare(*opts.compare))
            return 0
        gates = load_gates(opts.gates) if opts.gates else []
        report = asyncio.run(bench(opts))
        print(table(report))
        print(held_line(report))
        if opts.json:
            Path(opts.json).write_text(json.dumps(report, indent=2))
            print(f"wrote {opts.json}")
        if opts.plot:
            print(f"wrote {opts.plot}" if plot(report, opts.plot)
                  else "no plot: matplotlib is not installed (or no concurrency levels)")
        if gates:
            lines, passed = check_gates(report, gates)
            print("\n".join(lines))
            return 0 if passed else 1
        return 0
    except (BenchError, OSError, ValueError) as exc:
        print(f"voxline bench: error: {exc}", file=sys.stderr)
        return 2
