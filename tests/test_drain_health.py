"""SIGTERM to `voxline serve` (the CLI's serve path, model-free slow-reply core): while
the reply in flight finishes, the server still listens and says it is draining, so a
load balancer takes it out of rotation and retries new sessions elsewhere."""

from __future__ import annotations

import asyncio
import json
import signal

import httpx
import pytest
from conftest import TIME_FACTOR
from test_shutdown_signals import serve_subprocess
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus


async def _recv(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), 10 * TIME_FACTOR))


async def test_health_says_draining_and_new_sessions_get_503_while_the_reply_finishes():
    with serve_subprocess() as (proc, base):
        ws_url = base.replace("http", "ws") + "/v1/realtime"
        async with connect(ws_url) as ws, httpx.AsyncClient(base_url=base) as http:
            assert (await _recv(ws))["type"] == "session.created"
            await ws.send(json.dumps({"type": "response.create"}))
            while (await _recv(ws))["type"] != "response.created":
                pass
            proc.send_signal(signal.SIGTERM)  # a one-second reply is in flight
            for _ in range(1500):  # another process: its /health is all there is to wait on
                if (health := await http.get("/health")).status_code != 200:
                    break
                await asyncio.sleep(0.02)  # the signal is handled on the server's loop
            assert health.status_code == 503
            assert health.json()["status"] == "draining"
            assert health.json()["reason"] == "server is shutting down"
            with pytest.raises(InvalidStatus) as refused:
                async with connect(ws_url):
                    pass
            assert refused.value.response.status_code == 503
            assert json.loads(refused.value.response.body)["error"]["code"] == \
                "server_shutting_down"
            seen = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    seen.append(await _recv(ws))
        assert seen[-1]["type"] == "response.done"
        assert seen[-1]["response"]["status"] == "completed"
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (
            1001, "server is shutting down")
        assert proc.wait(30 * TIME_FACTOR) == 0
