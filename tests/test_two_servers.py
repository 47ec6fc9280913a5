"""Two `voxline serve` processes (the CLI's serve path, an in-process slow-reply echo
core) behind a real HAProxy (Debian's package) on 127.0.0.1, configured as
deploy/haproxy.cfg is: a client secret minted through the balancer opens a session on
either server, sessions spread over both, and SIGTERM to one server during live
sessions drains it: its replies finish and its sessions close with 1001 and a reason,
new sessions go to the other server, and none is refused. The drain's timeline (sessions
per server over time) is printed."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
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
API_KEY = "two-servers-key"
SIGNING_KEYS = "k" * 32
SERVE = """
import sys
sys.path.insert(0, {tests!r})
import voxline.realtime.server as server
from voxline.engines.client import InProcessEngineClient
server.make_engine = lambda settings: InProcessEngineClient(
    "slow_reply_core:make_slow_reply_core", {{"reply_seconds": 2.0}})
from voxline.cli import main
sys.exit(main(["serve", "--port", sys.argv[1], "--server-id", sys.argv[2],
               "--voice-dir", sys.argv[3], "--api-key", {key!r}, "--shutdown-grace", "20"]))
"""
HAPROXY = """
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout tunnel 60s
    option http-buffer-request
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response 503
frontend voxline
    bind 127.0.0.1:{port}
    acl call_request path_reg ^/v1/realtime/calls/rtc_[A-Za-z0-9-]+_
    use_backend call_%[path,field(5,/),field(2,_)] if call_request
    acl video_request path_reg ^/v1/videos/video_[A-Za-z0-9-]+_
    use_backend call_%[path,field(4,/),field(2,_)] if video_request
    default_backend voxline
backend voxline
    balance leastconn
    option httpchk GET /health
    http-check expect status 200
    default-server inter 100ms fall 1 rise 1
{servers}
{call_backends}
"""


@contextmanager
def voxline_server(server_id: str, voice_dir: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    port = free_port()
    env = {**os.environ, "VOXLINE_CLIENT_SECRET_KEYS": SIGNING_KEYS}
    proc = subprocess.Popen([sys.executable, "-c", SERVE.format(tests=str(TESTS), key=API_KEY),
                             str(port), server_id, str(voice_dir)], env=env)
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@contextmanager
def haproxy(tmp: Path, servers: dict[str, str]) -> Iterator[str]:
    port = free_port()
    lines = [f"    server {sid} {base.removeprefix('http://')} check"
             for sid, base in servers.items()]
    calls = [f"backend call_{sid}\n    server {sid} {base.removeprefix('http://')}"
             for sid, base in servers.items()]
    cfg = tmp / "haproxy.cfg"
    cfg.write_text(HAPROXY.format(port=port, servers="\n".join(lines),
                                  call_backends="\n".join(calls)))
    proc = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)])
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


async def _healthy(base: str, deadline: float) -> None:
    async with httpx.AsyncClient(base_url=base) as http:
        while True:
            try:
                if (await http.get("/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"{base} did not become healthy"
            await asyncio.sleep(0.1)


async def _recv(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), 15 * TIME_FACTOR))


async def _counts(servers: dict[str, str]) -> dict[str, int | None]:
    """Sessions per server, read from each server directly (None: not answering)."""
    out: dict[str, int | None] = {}
    async with httpx.AsyncClient(timeout=2) as http:
        for sid, base in servers.items():
            try:
                out[sid] = (await http.get(base + "/health")).json()["sessions"]
            except (httpx.HTTPError, ValueError):
                out[sid] = None
    return out


async def _open(url: str, token: str, refusals: list[str]):
    """A session through the balancer with the token; a refusal is recorded, not raised."""
    try:
        ws = await connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{token}"])
    except Exception as exc:  # noqa: BLE001 - the count of refusals is the assertion
        refusals.append(repr(exc))
        return None
    created = await _recv(ws)
    assert created["type"] == "session.created"
    assert created["session"]["instructions"] == "From the token."
    return ws


async def test_two_servers_behind_haproxy_share_tokens_spread_sessions_and_drain(tmp_path):
    voices = tmp_path / "voices"
    voices.mkdir()
    with ExitStack() as stack:
        procs, servers = {}, {}
        for sid in ("a", "b"):
            procs[sid], servers[sid] = stack.enter_context(voxline_server(sid, voices))
        deadline = time.monotonic() + 120 * TIME_FACTOR
        for base in servers.values():
            await _healthy(base, deadline)
        lb = stack.enter_context(haproxy(tmp_path, servers))
        await _healthy(lb, deadline)
        ws_url = lb.replace("http", "ws") + "/v1/realtime"
        async with httpx.AsyncClient(base_url=lb) as http:
            r = await http.post("/v1/realtime/client_secrets",
                                headers={"Authorization": f"Bearer {API_KEY}"},
                                json={"session": {"type": "realtime",
                                                  "instructions": "From the token."}})
            assert r.status_code == 200
            token = r.json()["value"]
            # a call id names its server: a hangup for b's call reaches b through the balancer
            r = await http.post("/v1/realtime/calls/rtc_b_0123/hangup",
                                headers={"Authorization": f"Bearer {API_KEY}"})
            assert r.status_code == 404 and "(it may have ended)" in r.json()["error"]["message"]
            # so does a video id: b answers for its own id (no "belongs to server" hint,
            # which a server gives for another server's id)
            for _ in range(4):
                r = await http.get("/v1/videos/video_b_0123",
                                   headers={"Authorization": f"Bearer {API_KEY}"})
                assert r.status_code == 404
                assert "belongs to server" not in r.json()["error"]["message"]

        refusals: list[str] = []
        owner: list[str] = []  # which server took each session
        sessions = []
        for _ in range(4):
            before = await _counts(servers)
            ws = await _open(ws_url, token, refusals)
            after = await _counts(servers)
            owner += [sid for sid in servers if after[sid] > before[sid]]
            sessions.append(ws)
        assert refusals == [] and sorted(owner) == ["a", "a", "b", "b"], owner

        timeline: list[tuple[float, dict[str, int | None]]] = []
        t0 = time.monotonic()

        async def watch() -> None:
            while True:
                timeline.append((time.monotonic() - t0, await _counts(servers)))
                await asyncio.sleep(0.1)

        watcher = asyncio.create_task(watch())
        for ws in sessions:  # a two-second reply in flight on every session
            await ws.send(json.dumps({"type": "response.create"}))
            while (await _recv(ws))["type"] != "response.created":
                pass
        procs["a"].send_signal(signal.SIGTERM)
        t_term = time.monotonic() - t0

        async def finish(ws) -> tuple[str | None, tuple[int, str] | None]:
            status = None
            try:
                while True:
                    event = await _recv(ws)
                    if event["type"] == "response.done":
                        status = event["response"]["status"]
                        if ws is not None and ws not in drained:
                            return status, None  # b's sessions: the reply done, still open
            except ConnectionClosed as closed:
                return status, (closed.rcvd.code, closed.rcvd.reason)

        drained = [ws for ws, sid in zip(sessions, owner, strict=True) if sid == "a"]
        async with httpx.AsyncClient(base_url=servers["a"]) as http:
            for _ in range(3000):  # another process: its /health is all there is to wait on
                if (health := await http.get("/health")).status_code != 200:
                    break
                await asyncio.sleep(0.01)  # the signal is handled on a's loop
        assert health.json()["status"] == "draining"
        # new sessions while a drains (before and after HAProxy's check sees it): all go
        # to b, none is refused
        new = [await _open(ws_url, token, refusals) for _ in range(4)]
        ends = await asyncio.gather(*(finish(ws) for ws in sessions))
        assert procs["a"].wait(30 * TIME_FACTOR) == 0
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        final = await _counts(servers)
        for ws in sessions + new:
            if ws is not None:
                await ws.close()

    print(f"\nSIGTERM to a at {t_term:.2f} s; sessions per server over time:")
    for t, counts in timeline[::3]:
        print(f"  {t:5.2f} s  a={counts['a']}  b={counts['b']}")
    print(f"refusals: {len(refusals)}")
    assert refusals == []
    for (status, close), sid in zip(ends, owner, strict=True):
        assert status == "completed"  # every reply in flight finished
        if sid == "a":
            assert close == (1001, "server is shutting down")
        else:
            assert close is None  # b's sessions live on
    assert final["a"] is None and final["b"] == 2 + 4  # the new sessions are all on b
