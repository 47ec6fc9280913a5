"""Load benchmark for transcription sessions: N concurrent `?intent=transcription` WebSocket
sessions against a running `voxline serve`, each speaking questions in real time (`voxline
bench`'s spoken questions: espeak-ng here, or the WAVs of `--audio-dir`); prints delta and
completed-transcript latency percentiles per N and the largest N whose first-delta p95
stays within the budget.

    .venv/bin/python benchmarks/load/bench_transcription.py --url http://127.0.0.1:8000 \\
        --sessions 1,2,4,8,16 [--turns 3] [--budget-ms 500] [--json out.json]
    .venv/bin/python benchmarks/load/bench_transcription.py --serve --sessions 1 --turns 1

Hundreds of sessions need hundreds of client sockets and base64 frames every 40 ms: with
`--procs P` the sessions of a level are split over P client processes (each its own event
loop), so the client is not what saturates. `--stop-over-budget` ends the ramp at the first
level over the budget. `--logprobs` asks every session for its tokens' log-probabilities.

What is measured (audio positions are the server's own, from `speech_started` /
`speech_stopped`; audio is sent paced at real time, so an audio position maps to the wall
time it was sent):

- **first delta**: the first `...transcription.delta` of a turn, after the moment the audio
  it needs had been sent. A delta carries only words two successive ASR hypotheses agree on,
  and the engine makes one every `partial_interval_ms` of the turn's audio (which starts
  `prefix_padding_ms` before the speech), so that moment is speech start - prefix padding +
  two intervals. On an idle server this is the ASR's own time; it can be a little below
  zero when a hypothesis made in a pause of the speech came sooner.
- **completed**: `...transcription.completed` after the end of speech (`audio_end_ms`);
  it includes the turn detector's silence window (500 ms for `server_vad`).

`--serve` starts a server in this process with the shipped models (a smoke run; for numbers
run `voxline serve` apart from the load generator, on an otherwise idle machine).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

RATE = 24000
CHUNK_MS = 40


@dataclass
class Turn:
    first_delta_ms: float | None = None
    completed_ms: float | None = None
    transcript: str = ""


@dataclass
class SessionResult:
    turns: list[Turn] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def questions(audio_dir: str | None) -> list[bytes]:
    """`voxline bench`'s spoken questions (24 kHz), each with 0.3 s of silence before and
    1.2 s after (the turn detector's silence window ends the turn), as PCM16."""
    import tempfile

    from voxline.bench import load_questions
    from voxline.codecs.pcm import float_to_pcm16

    with tempfile.TemporaryDirectory() as tmp:
        spoken = load_questions(audio_dir, Path(tmp))
    return [float_to_pcm16(np.concatenate([np.zeros(int(0.3 * RATE), np.float32), a,
                                           np.zeros(int(1.2 * RATE), np.float32)]))
            for a in spoken]


async def run_session(url: str, turns: list[bytes], interval_ms: int, padding_ms: int,
                      timeout: float, delay_s: float = 0.0,
                      logprobs: bool = False) -> SessionResult:
    from websockets.asyncio.client import connect

    await asyncio.sleep(delay_s)
    result = SessionResult()
    ws_url = url.replace("http://", "ws://").replace("https://", "wss://")
    async with connect(ws_url + "/v1/realtime?intent=transcription", max_size=2**24) as ws:
        t0 = 0.0  # wall time of audio position 0
        current: dict[str, Turn] = {}
        starts: dict[str, float] = {}
        done = asyncio.Event()
        want = len(turns)

        async def receive() -> None:
            async for raw in ws:
                e = json.loads(raw)
                now = time.perf_counter()
                kind = e["type"]
                if kind == "error":
                    result.errors.append(e["error"]["message"])
                elif kind == "input_audio_buffer.speech_started":
                    starts[e["item_id"]] = e["audio_start_ms"]
                    current[e["item_id"]] = Turn()
                elif kind.endswith("input_audio_transcription.delta"):
                    turn = current.setdefault(e["item_id"], Turn())
                    if turn.first_delta_ms is None and e["item_id"] in starts:
                        due = t0 + (starts[e["item_id"]] - padding_ms + 2 * interval_ms) / 1000
                        turn.first_delta_ms = (now - due) * 1000
                elif kind == "input_audio_buffer.speech_stopped":
                    current.setdefault(e["item_id"], Turn()).completed_ms = e["audio_end_ms"]
                elif kind.endswith("input_audio_transcription.completed"):
                    turn = current.pop(e["item_id"], Turn())
                    if turn.completed_ms is not None:  # holds audio_end_ms until now
                        turn.completed_ms = (now - (t0 + turn.completed_ms / 1000)) * 1000
                    turn.transcript = e["transcript"]
                    result.turns.append(turn)
                    if len(result.turns) >= want:
                        done.set()
                        return

        await ws.recv()  # session.created
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "transcription",
            "include": ["item.input_audio_transcription.logprobs"] if logprobs else [],
            "audio": {"input": {
                "transcription": {"language": "en"},
                "turn_detection": {"type": "server_vad"}}}}}))
        receiver = asyncio.create_task(receive())
        step = RATE * 2 * CHUNK_MS // 1000
        t0 = time.perf_counter()
        sent = 0
        for pcm in turns:
            for i in range(0, len(pcm), step):
                await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(pcm[i:i + step]).decode()}))
                sent += min(step, len(pcm) - i)
                wait = t0 + sent / (2 * RATE) - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
        try:
            await asyncio.wait_for(done.wait(), timeout)
        except TimeoutError:
            result.errors.append(f"timed out with {len(result.turns)} of {want} turns")
        receiver.cancel()
    return result


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:7.0f}"


@dataclass
class Load:
    """What every session of a level does."""

    url: str
    audio: list[bytes]  # the questions, PCM16 at 24 kHz
    turns: int
    timeout: float
    ramp_s: float = 0.0  # session starts spread over this many seconds
    logprobs: bool = False


async def _sessions(load: Load, first: int, count: int, total: int) -> list[SessionResult | str]:
    """Sessions `first` .. `first + count - 1` of `total`, in this event loop; each speaks
    `turns` questions, starting at its own question (so a level says them all)."""
    from voxline.engines.protocol import StreamConfig
    from voxline.sessions.settings import TurnDetection

    interval_ms = StreamConfig().partial_interval_ms
    padding_ms = TurnDetection().prefix_padding_ms  # the session uses server_vad's defaults

    def turns_of(i: int) -> list[bytes]:
        return [load.audio[(i + k) % len(load.audio)] for k in range(load.turns)]

    results = await asyncio.gather(*(
        run_session(load.url, turns_of(i), interval_ms, padding_ms, load.timeout,
                    load.ramp_s * i / max(1, total), load.logprobs)
        for i in range(first, first + count)), return_exceptions=True)
    return [f"{type(r).__name__}: {r}" if isinstance(r, BaseException) else r for r in results]


def _process(load: Load, first: int, count: int, total: int) -> list[SessionResult | str]:
    return asyncio.run(_sessions(load, first, count, total))


async def level(load: Load, n: int, procs: int = 1) -> dict:
    """One level: `n` sessions at once, over `procs` client processes (1: this loop)."""
    if procs <= 1 or n <= 1:
        results = await _sessions(load, 0, n, n)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        procs = min(procs, n)
        bounds = [n * k // procs for k in range(procs + 1)]
        loop = asyncio.get_running_loop()
        with ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn")) as pool:
            parts = await asyncio.gather(*(
                loop.run_in_executor(pool, _process, load, lo, hi - lo, n)
                for lo, hi in zip(bounds, bounds[1:], strict=False)))
        results = [r for part in parts for r in part]
    deltas, completed, errors = [], [], []
    for r in results:
        if isinstance(r, str):
            errors.append(r)
            continue
        errors += r.errors
        deltas += [t.first_delta_ms for t in r.turns if t.first_delta_ms is not None]
        completed += [t.completed_ms for t in r.turns if t.completed_ms is not None]
    return {"sessions": n, "turns": len(completed), "first_delta_p50_ms": pct(deltas, 50),
            "first_delta_p95_ms": pct(deltas, 95), "completed_p50_ms": pct(completed, 50),
            "completed_p95_ms": pct(completed, 95), "errors": errors}


def machine() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",) * 3
    return (f"{platform.machine()} {os.cpu_count()} cores, {platform.python_version()}, "
            f"load {' '.join(f'{x:.2f}' for x in load)}")


def within_budget(row: dict, budget: float) -> bool:
    p95 = row["first_delta_p95_ms"]
    return not row["errors"] and p95 is not None and p95 <= budget


async def bench(load: Load, levels: list[int], budget: float, procs: int = 1,
                stop_over_budget: bool = False) -> dict:
    rows = []
    print(f"{'N':>4} {'turns':>6} {'delta p50':>10} {'delta p95':>10} {'done p50':>9} "
          f"{'done p95':>9}  errors")
    for n in levels:
        row = await level(load, n, procs)
        rows.append(row)
        print(f"{n:>4} {row['turns']:>6} {fmt(row['first_delta_p50_ms']):>10} "
              f"{fmt(row['first_delta_p95_ms']):>10} {fmt(row['completed_p50_ms']):>9} "
              f"{fmt(row['completed_p95_ms']):>9}  {len(row['errors'])}", flush=True)
        for err in sorted(set(row["errors"]))[:3]:
            print(f"       error: {err[:200]}", flush=True)
        if stop_over_budget and not within_budget(row, budget):
            print(f"stopping: {n} sessions are over the {budget:.0f} ms budget", flush=True)
            break
    within = [r["sessions"] for r in rows if within_budget(r, budget)]
    best = max(within) if within else None
    print(f"largest N with first-delta p95 <= {budget:.0f} ms: {best if best else 'none'}")
    return {"url": load.url, "machine": machine(), "budget_ms": budget, "procs": procs,
            "turns_per_session": load.turns, "logprobs": load.logprobs, "ramp_s": load.ramp_s,
            "levels": rows, "largest_within_budget": best}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="a running server")
    parser.add_argument("--serve", action="store_true",
                        help="start a server in this process (a smoke run)")
    parser.add_argument("--sessions", default="1,2,4,8", help="concurrency levels")
    parser.add_argument("--turns", type=int, default=3, help="spoken turns per session")
    parser.add_argument("--budget-ms", type=float, default=500.0)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per session")
    parser.add_argument("--procs", type=int, default=1,
                        help="client processes a level's sessions are split over")
    parser.add_argument("--ramp-s", type=float, default=0.0,
                        help="spread each level's session starts over this many seconds")
    parser.add_argument("--audio-dir", default=None,
                        help="question WAVs (default: voxline bench's questions, espeak-ng)")
    parser.add_argument("--stop-over-budget", action="store_true",
                        help="end the ramp at the first level over the budget")
    parser.add_argument("--logprobs", action="store_true",
                        help="sessions include item.input_audio_transcription.logprobs")
    parser.add_argument("--json", default=None, help="also write the report here")
    args = parser.parse_args()
    levels = [int(x) for x in args.sessions.split(",") if x.strip()]
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]))
    print("machine:", machine())
    audio = questions(args.audio_dir)

    def go(url: str) -> dict:
        load = Load(url, audio, args.turns, args.timeout, args.ramp_s, args.logprobs)
        return asyncio.run(bench(load, levels, args.budget_ms, args.procs,
                                 args.stop_over_budget))

    if args.serve:
        from live_server import live_server

        with live_server() as url:
            report = go(url)
    else:
        report = go(args.url)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
