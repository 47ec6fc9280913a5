"""Multi-GPU placement as shipped: one `voxline serve` per GPU behind deploy/haproxy-gpus.cfg
(the file itself, with local ports, and weights = each server's max_sessions). Two
stand-in servers (the CLI's serve path, an in-process stand-in core) of capacity 2 and 4
play the GPUs: every new session goes to a server with the most headroom relative to its
capacity, never to a full one while the other has room; with both full the session is
refused as a lone server refuses it (close 1013 and the reason); a freed slot is where the
next session goes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
from conftest import TIME_FACTOR
from live_server import free_port
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    shutil.which("haproxy") is None,
    reason="haproxy is not installed (scripts/test_deps.sh installs it: apt-get install haproxy)")]

TESTS = Path(__file__).parent
CONFIG = TESTS.parent / "deploy" / "haproxy-gpus.cfg"
API_KEY = "placement-key"
CAPACITY = {"gpu0": 2, "gpu1": 4}
SERVE = """
import sys
sys.path.insert(0, {tests!r})
import voxline.realtime.server as server
from voxline.engines.client import InProcessEngineClient
server.make_engine = lambda settings: InProcessEngineClient(
    "slow_reply_core:make_slow_reply_core", {{"reply_seconds": 1.0}})
from voxline.cli import main
sys.exit(main(["serve", "--port", sys.argv[1], "--server-id", sys.argv[2],
               "--max-sessions", sys.argv[3], "--api-key", {key!r}]))
"""


@contextmanager
def gpu_server(server_id: str, capacity: int) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVE.format(tests=str(TESTS), key=API_KEY),
                             str(port), server_id, str(capacity)], env=dict(os.environ))
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)


def local_config(port: int, servers: dict[str, str]) -> str:
    """deploy/haproxy-gpus.cfg with local addresses, weights = capacity, fast checks."""
    text = CONFIG.read_text()
    text = text.replace("bind :8000", f"bind 127.0.0.1:{port}")
    text = text.replace("inter 1s fall 1 rise 2", "inter 100ms fall 1 rise 1")
    text = text.replace("    log stdout format raw local0\n", "")
    for sid, address in servers.items():
        text, n = re.subn(rf"server {sid} 127\.0\.0\.1:\d+ weight \d+ check",
                          f"server {sid} {address} weight {CAPACITY[sid]} check", text)
        assert n == 1, f"{CONFIG} has no weighted `server {sid}` line"
        text, n = re.subn(rf"(backend call_{sid}\n    server {sid}) 127\.0\.0\.1:\d+",
                          rf"\1 {address}", text)
        assert n == 1, f"{CONFIG} has no backend call_{sid}"
    return text


@contextmanager
def haproxy(tmp: Path, servers: dict[str, str]) -> Iterator[str]:
    port = free_port()
    cfg = tmp / "haproxy.cfg"
    cfg.write_text(local_config(port, servers))
    proc = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


async def _health(http: httpx.AsyncClient, address: str) -> httpx.Response | None:
    try:
        return await http.get(f"http://{address}/health")
    except httpx.HTTPError:
        return None


async def _until_healthy(addresses: list[str]) -> None:
    deadline = time.monotonic() + 120 * TIME_FACTOR
    async with httpx.AsyncClient(timeout=2) as http:
        for address in addresses:
            while (r := await _health(http, address)) is None or r.status_code != 200:
                assert time.monotonic() < deadline, f"{address} did not become healthy"
                await asyncio.sleep(0.1)


async def _sessions(servers: dict[str, str]) -> dict[str, int]:
    async with httpx.AsyncClient(timeout=2) as http:
        return {sid: (await http.get(f"http://{a}/health")).json()["sessions"]
                for sid, a in servers.items()}


async def _recv(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), 15 * TIME_FACTOR))


async def _open(url: str):
    ws = await connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{API_KEY}"])
    assert (await _recv(ws))["type"] == "session.created"
    return ws


async def test_sessions_go_to_the_most_headroom_and_a_full_box_refuses_with_1013(tmp_path):
    with ExitStack() as stack:
        servers = {sid: stack.enter_context(gpu_server(sid, cap)) for sid, cap in CAPACITY.items()}
        await _until_healthy(list(servers.values()))
        balancer = stack.enter_context(haproxy(tmp_path, servers))
        await _until_healthy([balancer])
        url = f"ws://{balancer}/v1/realtime"
        open_ws: dict[str, list] = {sid: [] for sid in servers}
        for _ in range(sum(CAPACITY.values())):
            before = await _sessions(servers)
            ws = await _open(url)
            after = await _sessions(servers)
            [chosen] = [sid for sid in servers if after[sid] == before[sid] + 1]
            headroom = {sid: 1 - before[sid] / CAPACITY[sid] for sid in servers}
            assert headroom[chosen] == max(headroom.values()), (chosen, before)
            open_ws[chosen].append(ws)
        assert await _sessions(servers) == CAPACITY

        # full: refused as one server refuses (the upgrade, then 1013 and the reason)
        ws = await connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{API_KEY}"])
        with pytest.raises(ConnectionClosed) as closed:
            await _recv(ws)
        assert closed.value.rcvd.code == 1013
        assert re.fullmatch(r"server is at its limit of [24] sessions", closed.value.rcvd.reason)

        # a slot freed on gpu0 is where the next session goes
        await open_ws["gpu0"].pop().close()
        deadline = time.monotonic() + 10 * TIME_FACTOR
        while (await _sessions(servers))["gpu0"] != CAPACITY["gpu0"] - 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        open_ws["gpu0"].append(await _open(url))
        assert await _sessions(servers) == CAPACITY
        for sockets in open_ws.values():
            for ws in sockets:
                await ws.close()
