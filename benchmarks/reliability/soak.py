"""Soak: N concurrent sessions against a real `voxline serve` on 127.0.0.1 for a while, then
all closed: do the server's and the engine's RSS, fds and threads return to baseline?

Each worker opens a /v1/realtime session, holds `--turns` turns (audio appended at real
time, then a reply: `response.create`, read to `response.done`), closes, and opens the next,
until the time is up. The default core is the model-free slow-reply echo (a reply carries
`--reply-seconds` of audio, paced at real time), which lets N go to hundreds; `--real`
serves the shipped models instead (text turns through LLM + TTS), for as many sessions
as the machine sustains.

    .venv/bin/python benchmarks/reliability/soak.py --sessions 200 --minutes 10 [--json soak.json]
    .venv/bin/python benchmarks/reliability/soak.py --real --sessions 4 --minutes 10

The time is split into `--rounds` rounds (default 2), every session closed after each.
Fails unless fds and threads return to their baseline (after one warm-up session) after
every round, and RSS after the last round is within `--max-rss-growth-mib` of what it was
before that round: the first round raises the allocator's high-water marks (reported as
`growth_first_round`), a leak grows every round. Prints resource samples over time.
Every connection goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "reliability")]

from faults import ServeTree, fds, rss_mib, session_members, threads  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402

CHUNK_MS = 100
RATE = 24000  # the default input format: audio/pcm 24 kHz


@dataclass
class Tally:
    sessions: int = 0
    turns: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    first_audio_s: list[float] = field(default_factory=list)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


def _chunk(seconds: float = CHUNK_MS / 1000) -> str:
    n = int(RATE * seconds)
    tone = (3000 * np.sin(2 * np.pi * 220 * np.arange(n) / RATE)).astype("<i2")
    return base64.b64encode(tone.tobytes()).decode()


async def _turn(ws, real: bool, tally: Tally) -> None:
    if real:
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Say one short sentence about the sea."}]}}))
    else:
        chunk = _chunk()
        for _ in range(5):  # half a second of audio at real time
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
            await asyncio.sleep(CHUNK_MS / 1000)
        await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
    t0 = time.perf_counter()
    await ws.send(json.dumps({"type": "response.create"}))
    first = None
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 120))
        kind = event["type"]
        if kind == "response.output_audio.delta" and first is None:
            first = time.perf_counter() - t0
        elif kind == "error":
            tally.error(event["error"]["code"])
        elif kind == "response.done":
            if event["response"]["status"] != "completed":
                tally.error(f"response {event['response']['status']}")
            break
    if first is not None:
        tally.first_audio_s.append(first)
    tally.turns += 1


async def _worker(url: str, deadline: float, turns: int, real: bool, tally: Tally) -> None:
    while time.monotonic() < deadline:
        try:
            async with connect(url, open_timeout=30, max_size=None) as ws:
                created = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if created["type"] != "session.created":
                    tally.error(f"first event {created['type']}")
                    continue
                tally.sessions += 1
                for _ in range(turns):
                    if time.monotonic() >= deadline:
                        break
                    await _turn(ws, real, tally)
        except ConnectionClosed as closed:
            tally.error(f"close {closed.rcvd.code if closed.rcvd else 1006}")
            await asyncio.sleep(1.0)
        except (OSError, TimeoutError) as exc:
            tally.error(type(exc).__name__)
            await asyncio.sleep(1.0)


def _sample(pids: dict[str, int]) -> dict[str, dict[str, float]]:
    return {name: {"rss_mib": round(rss_mib(pid), 1), "fds": fds(pid), "threads": threads(pid)}
            for name, pid in pids.items()}


async def _idle(base: str) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=5) as http:
        for _ in range(600):
            if not (await http.get("/health")).json().get("sessions"):
                break
            await asyncio.sleep(0.1)
    await asyncio.sleep(2.0)  # closes land; buffers are released


async def soak(opts: argparse.Namespace) -> dict:
    # headroom: a session counts until its close lands, and workers reconnect at once
    tree = ServeTree(max_sessions=2 * opts.sessions, reply_seconds=opts.reply_seconds,
                     real_models=opts.real)
    try:
        health = await tree.wait_healthy(timeout=600)
        pids = {"server": tree.pid, "engine": int(health["engine"]["pid"])}
        warm = Tally()
        await _worker(tree.ws_url, time.monotonic() + 0.1, 1, opts.real, warm)  # one session
        await _idle(tree.base)
        baseline = _sample(pids)
        rounds = []
        for index in range(opts.rounds):
            rounds.append(await _round(tree, pids, opts, opts.minutes * 60 / opts.rounds,
                                       baseline if index == 0 else rounds[-1]["after_close"]))
        first, last = rounds[0], rounds[-1]
        return {
            "sessions_concurrent": opts.sessions, "minutes": opts.minutes,
            "core": "shipped models" if opts.real else "model-free echo",
            "baseline": baseline, "rounds": rounds,
            # the first round raises allocator high-water marks; a leak grows every round
            "growth_first_round": first["growth"],
            "growth": last["growth"] if opts.rounds > 1 else first["growth"],
            "tree_processes": len(session_members(tree.pid)),
        }
    finally:
        tree.kill_all()


async def _round(tree: ServeTree, pids: dict[str, int], opts: argparse.Namespace,
                 seconds: float, before: dict[str, dict[str, float]]) -> dict:
    """`opts.sessions` workers for `seconds`, then all closed; growth against `before`."""
    tally = Tally()
    deadline = time.monotonic() + seconds
    workers = []
    for _ in range(opts.sessions):  # ramp up: a session every 50 ms
        workers.append(asyncio.create_task(_worker(tree.ws_url, deadline, opts.turns,
                                                   opts.real, tally)))
        await asyncio.sleep(0.05)
    samples = []
    t0 = time.monotonic()
    while not all(w.done() for w in workers):
        await asyncio.wait(workers, timeout=opts.sample_every)
        samples.append({"t_s": round(time.monotonic() - t0), **_sample(pids)})
        print(json.dumps(samples[-1]), f"sessions {tally.sessions} turns {tally.turns} "
              f"errors {tally.errors}", file=sys.stderr, flush=True)
    await _idle(tree.base)
    after = _sample(pids)
    fa = sorted(tally.first_audio_s)
    return {
        "seconds": round(seconds), "sessions_opened": tally.sessions, "turns": tally.turns,
        "errors": tally.errors,
        "first_audio_ms_p50": round(1000 * fa[len(fa) // 2]) if fa else None,
        "first_audio_ms_p95": round(1000 * fa[int(len(fa) * 0.95)]) if fa else None,
        "before": before, "samples": samples, "after_close": after,
        "growth": {name: {k: round(after[name][k] - before[name][k], 1) for k in before[name]}
                   for name in pids},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=200, help="concurrent sessions")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long (default: 10)")
    parser.add_argument("--turns", type=int, default=5, help="turns per session before it "
                        "closes and a new one opens (default: 5)")
    parser.add_argument("--reply-seconds", type=float, default=0.5,
                        help="echo core: audio per reply (default: 0.5)")
    parser.add_argument("--real", action="store_true", help="serve the shipped models")
    parser.add_argument("--rounds", type=int, default=2,
                        help="the time is split into this many rounds, all sessions closed "
                             "after each; leaks are judged on the last round's growth (the "
                             "first raises allocator high-water marks; default: 2)")
    parser.add_argument("--sample-every", type=float, default=15.0, help="seconds")
    parser.add_argument("--max-rss-growth-mib", type=float, default=32.0,
                        help="fail if a process's RSS after the last round's close exceeds "
                             "what it was before that round by more (default: 32)")
    parser.add_argument("--json", default=None, help="write the report here")
    opts = parser.parse_args()
    report = asyncio.run(soak(opts))
    print(json.dumps(report, indent=2))
    if opts.json:
        Path(opts.json).write_text(json.dumps(report, indent=2))
    failures = leaks(report, opts.max_rss_growth_mib)
    for line in failures:
        print("FAIL", line)
    print("PASS: RSS, fds and threads back to their level after close" if not failures else "")
    return 1 if failures else 0


def leaks(report: dict, max_rss_growth_mib: float) -> list[str]:
    """What did not return after every session closed."""
    out = []
    for index, rnd in enumerate(report["rounds"], 1):
        for name, growth in rnd["growth"].items():
            for kind in ("fds", "threads"):
                if growth[kind] > 0:
                    out.append(f"round {index}: {name}: {growth[kind]:+} {kind}")
        if rnd["sessions_opened"] == 0:
            out.append(f"round {index} served no session")
    for name, growth in report["growth"].items():
        if growth["rss_mib"] > max_rss_growth_mib:
            out.append(f"{name}: RSS {growth['rss_mib']:+.1f} MiB in the last round")
    return out


if __name__ == "__main__":
    sys.exit(main())
