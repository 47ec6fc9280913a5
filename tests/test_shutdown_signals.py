"""SIGTERM to the engine process and to `voxline serve`, over a real server subprocess
(the CLI's serve path with a model-free core): what a client sees, in what order."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from conftest import TIME_FACTOR
from live_server import free_port
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

TESTS = Path(__file__).parent
# `voxline serve` through its CLI, with the engine's core swapped for the slow-reply echo
SERVE = """
import sys
sys.path.insert(0, {tests!r})
import voxline.realtime.server as server
from voxline.engines.process import MultiprocessEngineClient
server.make_engine = lambda settings: MultiprocessEngineClient(
    "slow_reply_core:make_slow_reply_core", {{"reply_seconds": 1.0}}, start_timeout=60)
from voxline.cli import main
sys.exit(main(["serve", "--port", sys.argv[1], "--shutdown-grace", "10"]))
"""


def _alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@contextmanager
def serve_subprocess(env: dict[str, str] | None = None
                     ) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVE.format(tests=str(TESTS)), str(port)],
                            env={**os.environ, **(env or {})})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60 * TIME_FACTOR
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)
        yield proc, base
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


async def _recv(ws, timeout: float = 5.0) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout * TIME_FACTOR))


async def test_sigterm_to_the_engine_reaches_the_session_as_an_error_then_a_close():
    with serve_subprocess() as (proc, base):
        async with httpx.AsyncClient(base_url=base) as http:
            pid = (await http.get("/health")).json()["engine"]["pid"]
            async with connect(base.replace("http", "ws") + "/v1/realtime") as ws:
                assert (await _recv(ws))["type"] == "session.created"
                t0 = time.perf_counter()
                os.kill(pid, signal.SIGTERM)
                err = await _recv(ws)
                t_err = time.perf_counter() - t0
                assert err["type"] == "error" and err["error"]["code"] == "engine_dead"
                assert "SIGTERM" in err["error"]["message"]
                with pytest.raises(ConnectionClosed) as closed:
                    await _recv(ws)
                assert closed.value.rcvd.code == 1011
                print(f"engine SIGTERM -> session error {1000 * t_err:.1f} ms, close "
                      f"{1000 * (time.perf_counter() - t0):.1f} ms")
            deadline = time.monotonic() + 30 * TIME_FACTOR  # the supervisor restarts it
            while (health := await http.get("/health")).status_code != 200:
                assert time.monotonic() < deadline, "engine did not come back"
                await asyncio.sleep(0.1)
            assert health.json()["engine"]["pid"] != pid and not _alive(pid)
        proc.send_signal(signal.SIGTERM)  # no session open: a plain clean exit
        assert proc.wait(30 * TIME_FACTOR) == 0


async def test_sigterm_to_the_server_drains_the_reply_then_closes_1001_and_exits_0():
    with serve_subprocess() as (proc, base):
        async with httpx.AsyncClient(base_url=base) as http:
            engine_pid = (await http.get("/health")).json()["engine"]["pid"]
        async with connect(base.replace("http", "ws") + "/v1/realtime") as ws:
            assert (await _recv(ws))["type"] == "session.created"
            await ws.send(json.dumps({"type": "response.create"}))
            while (await _recv(ws))["type"] != "response.created":
                pass
            t0 = time.perf_counter()
            proc.send_signal(signal.SIGTERM)  # a one-second reply is in flight
            seen: list[str] = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    event = await _recv(ws)
                    seen.append(event["type"])
                    if event["type"] == "response.done":
                        assert event["response"]["status"] == "completed"
                        t_done = time.perf_counter() - t0
            t_close = time.perf_counter() - t0
        assert "response.output_audio.delta" in seen and seen[-1] == "response.done"
        assert closed.value.rcvd.code == 1001 and closed.value.rcvd.reason == "server is shutting down"
        assert proc.wait(30 * TIME_FACTOR) == 0
        print(f"server SIGTERM -> response.done {1000 * t_done:.0f} ms, close 1001 "
              f"{1000 * t_close:.0f} ms, exit {1000 * (time.perf_counter() - t0):.0f} ms")
        deadline = time.monotonic() + 5 * TIME_FACTOR
        while _alive(engine_pid):  # the engine child goes with it (a zombie at most)
            assert time.monotonic() < deadline, "engine process outlived the server"
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("setting, deflate", [(None, False), ("true", True)])
async def test_websocket_compression_is_negotiated_only_when_enabled(setting, deflate):
    # the websockets client offers permessage-deflate; the server takes it only when asked
    env = {"VOXLINE_WS_COMPRESSION": setting} if setting else {}
    with serve_subprocess(env) as (_, base):
        async with connect(base.replace("http", "ws") + "/v1/realtime") as ws:
            assert (await _recv(ws))["type"] == "session.created"
            names = [type(ext).__name__ for ext in ws.protocol.extensions]
            assert ("PerMessageDeflate" in names) is deflate, names
