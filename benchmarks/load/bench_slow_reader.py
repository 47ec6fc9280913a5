"""Does a client that stops reading slow the others? One healthy session's time from
`response.create` to its first audio, measured alone and then next to stalled clients
the server owes megabytes (interleaved rounds, one run), over the real app on 127.0.0.1
with the stand-in models; prints p50/p95 of both and their ratio, and how many stalled
clients the server dropped (none with the default --send-buffer-kb, which keeps them
stalled while measured; a lower bound drops them). Measuring starts 2 s after the
stalled clients asked: rendering their megabytes of events is event-loop work the server
does whether or not they read (it shows as a p95 spike if measured during it).

    .venv/bin/python benchmarks/load/bench_slow_reader.py [--turns 20] [--stalled 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import httpx  # noqa: E402
from fake_server import fake_server  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402


async def _recv(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), 30))


async def first_audio(ws) -> float:
    """One text turn; the time to its first audio. Both items are deleted afterwards, so
    the conversation (and the stand-in model's small context) stays the same size."""
    user = f"item_u{time.monotonic_ns()}"
    await ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "id": user, "type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "hi"}]}}))
    t0 = time.perf_counter()
    await ws.send(json.dumps({"type": "response.create"}))
    first = None
    while (event := await _recv(ws))["type"] != "response.done":
        if event["type"] == "response.output_audio.delta" and first is None:
            first = time.perf_counter() - t0
    for item in (user, event["response"]["output"][0]["id"]):
        await ws.send(json.dumps({"type": "conversation.item.delete", "item_id": item}))
    return first if first is not None else float("nan")


async def stall(url: str, host: str, port: int, megabytes: int) -> None:
    """A client that reads nothing and is owed `megabytes`: its session's instructions are
    1 MB, and each tiny session.update is answered with the whole session."""
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    big = json.dumps({"type": "session.update", "session": {
        "type": "realtime", "instructions": "x" * 1_000_000}})
    tiny = json.dumps({"type": "session.update", "session": {"type": "realtime"}})
    with contextlib.suppress(ConnectionClosed, OSError):
        async with connect(url, sock=sock, max_queue=1) as ws:
            await ws.send(big)
            for _ in range(megabytes - 1):
                await ws.send(tiny)
            await asyncio.sleep(3600)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def run(opts: argparse.Namespace) -> None:
    with fake_server(send_buffer_kb=opts.send_buffer_kb) as (base, _):
        host, port = base.removeprefix("http://").split(":")
        url = base.replace("http", "ws") + "/v1/realtime"
        alone: list[float] = []
        stalled: list[float] = []
        async with connect(url) as ws, httpx.AsyncClient(base_url=base) as http:
            await _recv(ws)
            await first_audio(ws)  # warm-up
            for _ in range(opts.rounds):
                for _ in range(opts.turns // opts.rounds):
                    alone.append(await first_audio(ws))
                tasks = [asyncio.create_task(stall(url, host, int(port), opts.megabytes))
                         for _ in range(opts.stalled)]
                await asyncio.sleep(2.0)  # their events are rendered: now they are owed them
                for _ in range(opts.turns // opts.rounds):
                    stalled.append(await first_audio(ws))
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            dropped = [line for line in (await http.get("/metrics")).text.splitlines()
                       if line.startswith("voxline_slow_clients_dropped_total")]
    print(f"command: {' '.join(sys.argv)}; load average {os.getloadavg()[0]:.2f} "
          "(shared machine: read the ratio)")
    print(f"{'healthy session, create -> first audio':42s} {'p50 ms':>8s} {'p95 ms':>8s}")
    for label, values in (("alone", alone), (f"next to {opts.stalled} stalled clients", stalled)):
        print(f"{label:42s} {1000 * pct(values, 0.5):8.1f} {1000 * pct(values, 0.95):8.1f}")
    print(f"ratio stalled/alone: p50 {pct(stalled, 0.5) / pct(alone, 0.5):.2f}, "
          f"p95 {pct(stalled, 0.95) / pct(alone, 0.95):.2f}")
    print(f"stalled clients the server dropped: {dropped[0].split()[-1] if dropped else 0} of "
          f"{opts.stalled * opts.rounds}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20, help="healthy turns per condition")
    parser.add_argument("--rounds", type=int, default=4, help="alternations of the conditions")
    parser.add_argument("--stalled", type=int, default=4, help="stalled clients per round")
    parser.add_argument("--megabytes", type=int, default=8, help="owed to each stalled client")
    parser.add_argument("--send-buffer-kb", type=int, default=65536,
                        help="the server's bound (default: above what they are owed, so they "
                             "stay stalled while measured; lower it to see them dropped)")
    asyncio.run(run(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
