"""The server when its engine process dies: sessions get an error and a close, /health
turns 503, the supervisor restarts the engine, new sessions work (slow). How soon the
error and the close come (under a second): benchmarks/reliability/bench_engine_death.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import pytest
from conftest import TIME_FACTOR
from live_server import live_server
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

pytestmark = pytest.mark.slow


async def test_engine_death_is_reported_and_survived():
    with live_server(engine="process") as base:
        http = httpx.AsyncClient(base_url=base)
        url = base.replace("http://", "ws://") + "/v1/realtime"
        pid = (await http.get("/health")).json()["engine"]["pid"]
        async with connect(url) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            os.kill(pid, signal.SIGKILL)
            err = json.loads(await asyncio.wait_for(ws.recv(), 30 * TIME_FACTOR))
            assert err["type"] == "error" and err["error"]["code"] == "engine_dead"
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 30 * TIME_FACTOR)
            assert closed.value.rcvd.code == 1011
        health = await http.get("/health")
        assert health.status_code == 503 and str(pid) in health.json()["reason"]
        deadline = time.monotonic() + 300
        while (await http.get("/health")).status_code != 200:
            assert time.monotonic() < deadline, "engine did not come back"
            await asyncio.sleep(0.5)
        assert (await http.get("/health")).json()["engine"]["restarts"] == 1
        async with connect(url) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "What is the capital of France?"}]}}))
            await ws.send(json.dumps({"type": "response.create",
                                      "response": {"output_modalities": ["text"]}}))
            while (event := json.loads(await asyncio.wait_for(ws.recv(), 120)))["type"] != "response.done":
                pass
            assert event["response"]["status"] == "completed"
            assert "Paris" in event["response"]["output"][0]["content"][0]["text"]
        await http.aclose()
