"""The engine process with the real models: crash handling and restart (slow)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from conftest import TIME_FACTOR

from voxline.engines import protocol as p
from voxline.engines.launch import DEFAULT_CORE
from voxline.engines.process import MultiprocessEngineClient

pytestmark = pytest.mark.slow


async def reply_text(stream, question: str) -> str:
    sid = stream.stream_id
    stream.send(p.AddItem(sid, "u", "user", question))
    stream.send(p.CreateResponse(sid, "r", "a", p.ResponseConfig(audio=False, max_output_tokens=12)))
    async for out in stream:
        if isinstance(out, p.ResponseFinished):
            return out.text
        assert not isinstance(out, p.StreamError), out
    raise AssertionError("stream ended without a response")


async def test_killed_engine_fails_open_streams_and_comes_back():
    client = MultiprocessEngineClient(DEFAULT_CORE, start_timeout=300)
    await client.start()
    try:
        busy = await client.open_stream("busy")
        idle = await client.open_stream("idle")
        busy.send(p.AddItem("busy", "u", "user", "Write a long poem about the sea."))
        busy.send(p.CreateResponse("busy", "r", "a", p.ResponseConfig(max_output_tokens=200)))
        first = await asyncio.wait_for(busy.next(), 60 * TIME_FACTOR)
        assert isinstance(first, p.ReplyTextDelta)  # mid-response
        pid = client.status()["pid"]
        os.kill(pid, signal.SIGKILL)

        async def terminal(stream):
            async for out in stream:
                if isinstance(out, p.StreamError) and out.fatal:
                    return out
            raise AssertionError("no terminal error")

        # how soon the error comes (under a second): benchmarks/reliability/bench_engine_death.py
        for stream in (busy, idle):
            err = await asyncio.wait_for(terminal(stream), 30 * TIME_FACTOR)
            assert err.code == "engine_dead" and str(pid) in err.message
        assert not client.ready
        await asyncio.wait_for(client.wait_ready(), 300)
        assert client.status()["pid"] != pid and client.status()["restarts"] == 1
        fresh = await client.open_stream("fresh")
        assert "Paris" in await reply_text(fresh, "What is the capital of France?")
        await fresh.aclose()
    finally:
        await client.close()
