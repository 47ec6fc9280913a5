"""Engine clients (in-process and multiprocess) driven end to end with the echo core."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import threading
from collections.abc import AsyncIterator

import numpy as np
import pytest
from conftest import TIME_FACTOR
from echo_core import ECHO_REPLY, EchoCore

from voxline.engines.client import EngineClient, InProcessEngineClient, StreamHandle
from voxline.engines.process import MultiprocessEngineClient
from voxline.engines.protocol import (
    AppendAudio,
    AudioChunk,
    CreateResponse,
    EngineOutput,
    OpenStream,
    ReplyTextDelta,
    ResponseFinished,
    ResponseStatus,
    StreamClosed,
    StreamError,
)
from voxline.errors import EngineDeadError, EngineError

ECHO = "echo_core:make_echo_core"
KINDS = ["inprocess", "multiprocess"]
T = TIME_FACTOR
START_TIMEOUT = 15 * T  # spawning a fresh interpreter on a busy 2-core machine
STEP_TIMEOUT = 5 * T


def make_client(kind: str, **core_kwargs: object) -> EngineClient:
    if kind == "inprocess":
        return InProcessEngineClient(ECHO, core_kwargs)
    return MultiprocessEngineClient(ECHO, core_kwargs)


def exists(path: str) -> bool:
    return os.path.exists(path)


def frame(tag: int, n_samples: int = 320) -> bytes:
    """20 ms of float32 audio at 16 kHz whose first sample is `tag`."""
    samples = np.random.default_rng(tag).standard_normal(n_samples).astype(np.float32)
    samples[0] = tag
    return samples.tobytes()


async def take(handle: StreamHandle, n: int, within: float = STEP_TIMEOUT) -> list[EngineOutput]:
    async def collect() -> list[EngineOutput]:
        return [await handle.next() for _ in range(n)]

    return await asyncio.wait_for(collect(), within)


async def drain(handle: StreamHandle, within: float = STEP_TIMEOUT) -> list[EngineOutput]:
    async def collect() -> list[EngineOutput]:
        return [out async for out in handle]

    return await asyncio.wait_for(collect(), within)


@pytest.fixture(params=KINDS)
async def client(request: pytest.FixtureRequest) -> AsyncIterator[EngineClient]:
    c = make_client(request.param)
    await asyncio.wait_for(c.start(), START_TIMEOUT)
    yield c
    await c.close()


# ------------------------------------------------------------------------------ echo core


def test_echo_core_unknown_stream_is_a_non_fatal_error() -> None:
    core = EchoCore(wake=lambda: None)
    core.add_input(AppendAudio("ghost", frame(1)))
    core.add_input(OpenStream("s"))
    core.add_input(AppendAudio("s", frame(2)))
    out = core.step()
    assert [type(o) for o in out] == [StreamError, AudioChunk]
    err = out[0]
    assert err.stream_id == "ghost" and "ghost" in err.message
    assert err.code == "unknown_stream" and not err.fatal
    assert not core.has_work()


# ---------------------------------------------------------------------------- both kinds


async def test_round_trip_preserves_bytes_and_ids(client: EngineClient) -> None:
    assert client.ready and client.status()["ready"]
    h = await client.open_stream("call-1")
    audio = frame(7)
    h.send(AppendAudio("call-1", audio))
    h.send(CreateResponse("call-1", response_id="resp-9", item_id="item-3"))
    await h.aclose()
    history = await drain(h)
    chunk = history[0]
    assert isinstance(chunk, AudioChunk)
    assert chunk.audio == audio
    assert chunk.sample_rate == 16000 and chunk.duration_ms == pytest.approx(20.0)
    assert history[1:] == [
        ReplyTextDelta("call-1", "resp-9", ECHO_REPLY[0]),
        ReplyTextDelta("call-1", "resp-9", ECHO_REPLY[1]),
        ResponseFinished("call-1", "resp-9", ResponseStatus.COMPLETED, "".join(ECHO_REPLY)),
        StreamClosed("call-1"),
    ]
    assert all(o.stream_id == "call-1" for o in history)
    with pytest.raises(EngineError, match="closed"):
        await h.next()
    with pytest.raises(EngineError, match="closed"):
        h.send(AppendAudio("call-1", audio))
    # The id is free again once closed.
    h2 = await client.open_stream("call-1")
    h2.send(AppendAudio("call-1", audio))
    assert [o.audio for o in await take(h2, 1)] == [audio]  # type: ignore[union-attr]


async def test_concurrent_streams_do_not_see_each_other(client: EngineClient) -> None:
    a = await client.open_stream("a")
    b = await client.open_stream("b")
    sent: dict[str, list[bytes]] = {"a": [], "b": []}
    for i in range(40):
        for h in (a, b):
            data = frame(i + (1000 if h is b else 0))
            sent[h.stream_id].append(data)
            h.send(AppendAudio(h.stream_id, data))
    got_a, got_b = await asyncio.gather(take(a, 40), take(b, 40))
    assert [o.stream_id for o in got_a] == ["a"] * 40
    assert [o.stream_id for o in got_b] == ["b"] * 40
    assert [o.audio for o in got_a] == sent["a"]  # type: ignore[union-attr]
    assert [o.audio for o in got_b] == sent["b"]  # type: ignore[union-attr]


async def test_input_for_unopened_stream_is_rejected_at_send(client: EngineClient) -> None:
    h = await client.open_stream("real")
    with pytest.raises(EngineError, match="'ghost' is not open") as exc_info:
        client.send(AppendAudio("ghost", frame(1)))
    assert exc_info.value.stream_id == "ghost"
    with pytest.raises(EngineError, match="open_stream"):
        client.send(OpenStream("sneaky"))
    with pytest.raises(EngineError, match="already open"):
        await client.open_stream("real")
    with pytest.raises(ValueError, match="ghost"):
        h.send(AppendAudio("ghost", frame(1)))
    # The rejected inputs never reached the engine; the open stream is unaffected.
    h.send(AppendAudio("real", frame(2)))
    assert [o.audio for o in await take(h, 1)] == [frame(2)]  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", KINDS)
async def test_not_ready_until_core_loaded(kind: str) -> None:
    load_delay = 0.4
    c = make_client(kind, load_delay=load_delay)
    task = asyncio.create_task(c.start())
    try:
        await asyncio.sleep(0)  # start() is now waiting on the loading core
        assert not c.ready
        assert c.status()["ready"] is False
        with pytest.raises(EngineDeadError, match="not running"):
            await c.open_stream("early")
        await asyncio.wait_for(task, START_TIMEOUT)
        assert c.ready
        status = c.status()
        assert status["ready"] is True and status["load_seconds"] >= load_delay
        if kind == "inprocess":
            assert status["pid"] == os.getpid()
        else:
            assert status["pid"] not in (None, os.getpid())
    finally:
        await c.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_close_leaves_no_threads_processes_or_streams(kind: str) -> None:
    threads_before = set(threading.enumerate())
    c = make_client(kind)
    await asyncio.wait_for(c.start(), START_TIMEOUT)
    tmpdir = getattr(c, "_tmpdir", None)
    h = await c.open_stream("s")
    h.send(AppendAudio("s", frame(3)))
    await take(h, 1)
    await asyncio.wait_for(c.close(), STEP_TIMEOUT)
    assert await drain(h) == [StreamError("s", "engine client closed", "engine_closed", True)]
    assert not c.ready
    assert multiprocessing.active_children() == []
    assert set(threading.enumerate()) == threads_before
    if tmpdir is not None:
        assert not exists(tmpdir)
    await c.close()  # idempotent


async def test_a_stopped_engine_process_is_not_logged_as_failed(caplog) -> None:
    c = make_client("multiprocess")
    await asyncio.wait_for(c.start(), START_TIMEOUT)
    with caplog.at_level(logging.INFO, logger="voxline.engines.process"):
        await asyncio.wait_for(c.close(), STEP_TIMEOUT)
    said = [r.getMessage() for r in caplog.records if r.name == "voxline.engines.process"]
    assert "engine client closed (0 restarts)" in said
    assert not [m for m in said if "failed" in m], said  # we stopped it: no failure


@pytest.mark.parametrize("kind", KINDS)
async def test_core_load_failure_fails_start(kind: str) -> None:
    c = make_client(kind, no_such_option=1)
    with pytest.raises(EngineError, match="no_such_option"):
        await asyncio.wait_for(c.start(), START_TIMEOUT)
    assert not c.ready
    assert multiprocessing.active_children() == []
    await c.close()


# ----------------------------------------------------------------------- overflow policy


async def test_slow_consumer_fails_stream_instead_of_dropping() -> None:
    c = InProcessEngineClient(ECHO, max_queued_outputs=4)
    await asyncio.wait_for(c.start(), START_TIMEOUT)
    try:
        slow = await c.open_stream("slow")
        for i in range(10):
            slow.send(AppendAudio("slow", frame(i)))
        # Outputs come back in input order: once `probe` has its echo, `slow` has all of its.
        probe = await c.open_stream("probe")
        probe.send(AppendAudio("probe", frame(99)))
        await take(probe, 1)
        history = await drain(slow)
        assert [o.audio for o in history[:4]] == [frame(i) for i in range(4)]  # type: ignore[union-attr]
        assert len(history) == 5
        err = history[4]
        assert isinstance(err, StreamError) and err.fatal and err.code == "output_overflow"
        with pytest.raises(EngineError, match="fell 4 outputs behind"):
            slow.send(AppendAudio("slow", frame(1)))
        # The engine closes it; the id is then free again, and neighbours are unaffected.
        await slow.aclose()
        again = await c.open_stream("slow")
        again.send(AppendAudio("slow", frame(5)))
        assert [o.audio for o in await take(again, 1)] == [frame(5)]  # type: ignore[union-attr]
    finally:
        await c.close()


# -------------------------------------------------------------------- crash supervision


class BrokenCore(EchoCore):
    """Echo core whose step raises (a core bug) once any audio arrives."""

    def step(self) -> list[EngineOutput]:
        out = super().step()
        if any(isinstance(o, AudioChunk) for o in out):
            raise RuntimeError("kaboom")
        return out


def make_broken_core(wake: object) -> BrokenCore:
    return BrokenCore(wake=wake)  # type: ignore[arg-type]


async def test_in_process_loop_crash_fails_streams() -> None:
    c = InProcessEngineClient(f"{__name__}:make_broken_core")
    await asyncio.wait_for(c.start(), START_TIMEOUT)
    try:
        a = await c.open_stream("a")
        b = await c.open_stream("b")
        a.send(AppendAudio("a", frame(1)))
        for h in (a, b):
            (err,) = await drain(h, 1.0 * T)
            assert isinstance(err, StreamError) and err.code == "engine_dead" and err.fatal
            assert "kaboom" in err.message
        assert not c.ready and "kaboom" in c.status()["last_error"]
        with pytest.raises(EngineDeadError, match="kaboom"):
            await c.open_stream("c")
    finally:
        await c.close()


async def test_engine_crash_fails_open_streams_then_restarts() -> None:
    c = MultiprocessEngineClient(ECHO, {"crash_on": "boom"})
    await asyncio.wait_for(c.start(), START_TIMEOUT)
    try:
        first_pid = c.status()["pid"]
        a = await c.open_stream("a")
        b = await c.open_stream("b")
        a.send(AppendAudio("a", frame(1)))
        await take(a, 1)

        await c.open_stream("boom")  # the engine process exits with code 3
        err_a, err_b = await asyncio.gather(take(a, 1, 1.0 * T), take(b, 1, 1.0 * T))
        for err, sid in ((err_a[0], "a"), (err_b[0], "b")):
            assert isinstance(err, StreamError)
            assert err.stream_id == sid and err.fatal and err.code == "engine_dead"
            assert "exited with code 3" in err.message
        assert not c.ready
        assert "exited with code 3" in c.status()["last_error"]
        assert await drain(a) == []  # iteration ends after the fatal error
        with pytest.raises(EngineDeadError):
            await a.next()
        with pytest.raises(EngineDeadError):
            a.send(AppendAudio("a", frame(2)))

        await asyncio.wait_for(c.wait_ready(), START_TIMEOUT)
        status = c.status()
        assert status["ready"] and status["restarts"] == 1
        assert status["pid"] not in (None, first_pid)
        for sid in ("c", "a"):  # new ids and ids of failed streams both work
            h = await c.open_stream(sid)
            h.send(AppendAudio(sid, frame(4)))
            (out,) = await take(h, 1)
            assert isinstance(out, AudioChunk) and out.audio == frame(4)
    finally:
        await c.close()
    assert multiprocessing.active_children() == []
