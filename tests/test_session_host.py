"""The one session host every transport admits through: a slot is held before any await,
so more concurrent WebSocket connects or WebRTC offers than `max_sessions` admit exactly
`max_sessions` and refuse the rest with the documented reason; every exit gives the slot
back. Also the two inboxes/outboxes the host's transports feed: a WebRTC call reads its
data-channel events ahead of mic frames, and the SDK's outbox is bounded with
back-pressure (a reader that stops is ended clearly, one that reads never is)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time

import httpx
import pytest
from conftest import TIME_FACTOR
from fake_server import fake_server
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from voxline.engines.client import InProcessEngineClient
from voxline.realtime.ops.metrics import Metrics
from voxline.realtime.session_host import (
    Refusal,
    SessionEnd,
    SessionHost,
    SessionLimits,
    SessionRefused,
    refusal_close,
    stream_id_for,
)
from voxline.sdk.engine import OUTBOX_LIMIT, LocalTransport
from voxline.sdk.session import SessionError
from voxline.sessions import commands as cmd
from voxline.sessions import events as ev
from voxline.sessions.runner import SessionEnded

ECHO = "echo_core:make_echo_core"


class ReadyEngine:
    ready = True


# ---------------------------------------------------------------------------- the host


def test_admission_holds_a_slot_at_once_and_refuses_past_the_limit():
    host = SessionHost(ReadyEngine(), SessionLimits(max_sessions=2))  # type: ignore[arg-type]
    first, second = host.admit(), host.admit(prefix="rtc")
    assert host.active == 2
    assert first.session_id.startswith("sess_") and second.session_id.startswith("rtc_")
    assert first.stream_id.startswith(first.session_id + "-")
    with pytest.raises(SessionRefused) as refused:
        host.admit()
    assert refused.value.refusal is Refusal.AT_LIMIT
    assert refused.value.reason == "server is at its limit of 2 sessions"
    first.release()
    first.release()  # idempotent
    assert host.active == 1
    third = host.admit()
    assert host.active == 2 and third.session_id != first.session_id


def test_a_slot_is_released_on_every_way_out_of_its_block_unless_detached():
    host = SessionHost(ReadyEngine())  # type: ignore[arg-type]
    with pytest.raises(RuntimeError), host.admit():
        assert host.active == 1
        raise RuntimeError("the session failed")
    assert host.active == 0
    with host.admit() as admission:
        admission.detach()  # e.g. a WebRTC call outliving its HTTP request
    assert host.active == 1
    admission.release()
    assert host.active == 0


def test_an_engine_that_is_not_ready_refuses_with_its_reason():
    class Starting:
        ready = False

    host = SessionHost(Starting())  # type: ignore[arg-type]
    with pytest.raises(SessionRefused) as refused:
        host.admit()
    assert refused.value.refusal is Refusal.ENGINE_NOT_READY
    assert refused.value.reason == "engine is not ready, try again shortly"
    assert host.active == 0


def test_stream_ids_name_their_session_and_differ():
    ids = {stream_id_for("sess_x") for _ in range(50)}
    assert len(ids) == 50 and all(i.startswith("sess_x-") and len(i) == 13 for i in ids)


# ---------------------------------------------------------------------------- serve


class FakeRunner:
    """A runner as `SessionHost.serve` sees it: `run` reads the client's events until they
    end (then raises `fails`, if set); a reply is in flight until `reply_done` is set."""

    def __init__(self, fails: BaseException | None = None, replying: bool = False) -> None:
        self.fails = fails
        self.reply_done = asyncio.Event()
        if not replying:
            self.reply_done.set()
        self.read: list[object] = []

    async def run(self, incoming) -> None:
        async for item in incoming:
            self.read.append(item)
        if self.fails is not None:
            raise self.fails

    async def wait_no_response(self) -> None:
        await self.reply_done.wait()


class Client:
    """The client's events: `leave()` ends them; until then the session reads on."""

    def __init__(self, *items: object) -> None:
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        for item in items:
            self.queue.put_nowait(item)

    def leave(self) -> None:
        self.queue.put_nowait(None)

    async def events(self):
        while (item := await self.queue.get()) is not None:
            yield item


class Peer:
    """What a transport's hooks saw: the ends it was told and the host's state then."""

    def __init__(self, host: SessionHost) -> None:
        self.host = host
        self.ends: list[SessionEnd] = []
        self.at_close: list[tuple[int, bool]] = []  # (active, idle) when `close` ran
        self.cleanups = 0

    async def close(self, end: SessionEnd) -> None:
        self.ends.append(end)
        self.at_close.append((self.host.active, self.host.idle))

    async def cleanup(self) -> None:
        self.cleanups += 1


def _host(**limits: object) -> tuple[SessionHost, Metrics]:
    metrics = Metrics()
    return SessionHost(ReadyEngine(), SessionLimits(**limits), metrics=metrics), metrics  # type: ignore[arg-type]


async def test_serve_runs_a_session_to_its_end_and_releases_the_slot_before_the_close():
    host, metrics = _host(max_sessions=1)
    peer, client, runner = None, Client("a", "b"), FakeRunner()
    with host.admit() as admission:
        peer = Peer(host)
        client.leave()
        end = await host.serve(admission, runner, client.events(),  # type: ignore[arg-type]
                               close=peer.close, cleanup=peer.cleanup)
    assert end == SessionEnd(1000, "") and peer.ends == [end] and runner.read == ["a", "b"]
    assert peer.at_close == [(0, False)]  # slot free at the close; still registered for a drain
    assert peer.cleanups == 1 and host.active == 0 and host.idle
    assert metrics.value("voxline_sessions_total") == 1.0
    host.admit()  # the one slot is free again


async def test_serve_ends_a_session_with_the_code_it_ended_with():
    host, metrics = _host()
    cases = [
        (FakeRunner(SessionEnded(1008, "client is not reading")), None,
         SessionEnd(1008, "client is not reading")),
        (FakeRunner(RuntimeError("bug")), None, SessionEnd(1011, "internal server error")),
        (FakeRunner(ConnectionResetError()), lambda exc: isinstance(exc, ConnectionResetError),
         SessionEnd(1000, "")),  # the peer left mid-send: not a server error
    ]
    for runner, peer_gone, expected in cases:
        peer, client = Peer(host), Client()
        client.leave()
        with host.admit() as admission:
            end = await host.serve(admission, runner, client.events(),  # type: ignore[arg-type]
                                   close=peer.close, peer_gone=peer_gone)
        assert end == expected and peer.ends == [expected]
    assert metrics.value("voxline_session_errors_total") == 1.0
    assert metrics.value("voxline_sessions_total") == 3.0 and host.idle


async def test_one_registry_counts_slots_and_waits_for_closes():
    host, _ = _host(max_sessions=2)
    closing = asyncio.Event()
    client = Client()

    async def slow_close(end: SessionEnd) -> None:
        await closing.wait()  # e.g. a close frame still being flushed

    admission = host.admit()
    serving = asyncio.ensure_future(host.serve(admission, FakeRunner(), client.events(),  # type: ignore[arg-type]
                                               close=slow_close))
    await asyncio.sleep(0)
    assert host.active == 1 and not host.idle
    admission.release()  # the client left: its slot is free before the session wound down
    assert host.active == 0 and not host.idle
    client.leave()
    for _ in range(20):
        await asyncio.sleep(0)
    assert not serving.done() and not host.idle  # closing: a drain still waits for it
    closing.set()
    assert await serving == SessionEnd()
    assert host.idle


async def test_cancelled_serve_cleans_up_without_a_close_and_unregisters():
    host, _ = _host()
    peer, client = Peer(host), Client()
    with host.admit() as admission:
        serving = asyncio.ensure_future(host.serve(admission, FakeRunner(), client.events(),  # type: ignore[arg-type]
                                                   close=peer.close, cleanup=peer.cleanup))
        await asyncio.sleep(0)
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    assert peer.cleanups == 1 and peer.ends == [] and host.active == 0 and host.idle


async def test_a_drain_lets_the_reply_in_flight_finish_then_closes_1001():
    host, metrics = _host()
    peer, client, runner = Peer(host), Client(), FakeRunner(replying=True)
    admission = host.admit()
    serving = asyncio.ensure_future(host.serve(admission, runner, client.events(),  # type: ignore[arg-type]
                                               close=peer.close))
    await asyncio.sleep(0)
    drain = asyncio.ensure_future(host.drain(grace=3600))
    for _ in range(20):
        await asyncio.sleep(0)
    assert host.draining and not serving.done() and not drain.done()  # the reply goes on
    with pytest.raises(SessionRefused) as refused:
        host.admit()
    assert (refused.value.refusal, refused.value.reason) == (Refusal.SHUTTING_DOWN,
                                                             "server is shutting down")
    assert refusal_close(refused.value) == SessionEnd(1001, "server is shutting down")
    assert metrics.value("voxline_sessions_refused_total") == 1.0
    runner.reply_done.set()  # response.done is out: now the session ends
    assert await serving == SessionEnd(1001, "server is shutting down")
    await drain  # returns once the session closed
    assert peer.ends == [SessionEnd(1001, "server is shutting down")] and host.idle


async def test_a_drain_past_its_grace_closes_a_session_still_replying():
    host, _ = _host()
    peer, client, runner = Peer(host), Client(), FakeRunner(replying=True)
    admission = host.admit()
    serving = asyncio.ensure_future(host.serve(admission, runner, client.events(),  # type: ignore[arg-type]
                                               close=peer.close))
    await asyncio.sleep(0)
    await host.drain(grace=0)
    assert serving.done() and serving.result() == SessionEnd(1001, "server is shutting down")


def test_refusals_at_the_limit_close_with_try_again():
    host, _ = _host(max_sessions=0)
    with pytest.raises(SessionRefused) as refused:
        host.admit()
    assert refusal_close(refused.value) == SessionEnd(1013, "server is at its limit of 0 sessions")


# ---------------------------------------------------------------------------- the race


async def _health_sessions(base: str) -> int:
    async with httpx.AsyncClient(base_url=base) as http:
        return (await http.get("/health")).json()["sessions"]


async def _until_no_sessions(base: str) -> None:
    deadline = time.monotonic() + 10 * TIME_FACTOR
    while await _health_sessions(base):  # a WebSocket's slot goes when the server sees the close
        assert time.monotonic() < deadline, "sessions never returned to 0"
        await asyncio.sleep(0.02)


async def _ws_connect(url: str, stack: contextlib.AsyncExitStack) -> str | tuple[int, str]:
    """'admitted' (kept open on `stack`) or the (code, reason) the server closed with."""
    ws = await stack.enter_async_context(connect(url))
    try:
        first = json.loads(await asyncio.wait_for(ws.recv(), 30 * TIME_FACTOR))
    except ConnectionClosed as closed:
        assert closed.rcvd is not None
        return closed.rcvd.code, closed.rcvd.reason
    assert first["type"] == "session.created"
    return "admitted"


async def test_concurrent_websocket_connects_admit_exactly_max_sessions():
    with fake_server(max_sessions=3) as (base, _):
        url = base.replace("http", "ws") + "/v1/realtime"
        async with contextlib.AsyncExitStack() as stack:
            results = await asyncio.gather(*(_ws_connect(url, stack) for _ in range(9)))
            assert results.count("admitted") == 3
            refused = [r for r in results if r != "admitted"]
            assert refused == [(1013, "server is at its limit of 3 sessions")] * 6
            assert await _health_sessions(base) == 3
        await _until_no_sessions(base)
        async with httpx.AsyncClient(base_url=base) as http:
            metrics = (await http.get("/metrics")).text
        assert "voxline_sessions_total 3.0" in metrics and \
            "voxline_sessions_refused_total 6.0" in metrics


async def test_concurrent_webrtc_offers_admit_exactly_max_sessions():
    from webrtc_client import CallClient

    with fake_server(max_sessions=2, ice_hosts="127.0.0.1") as (base, _):
        placed = await asyncio.gather(*(CallClient.place(base) for _ in range(6)),
                                      return_exceptions=True)
        calls = [c for c in placed if isinstance(c, CallClient)]
        refusals = [str(e) for e in placed if not isinstance(e, CallClient)]
        try:
            assert len(calls) == 2, refusals
            assert len(refusals) == 4
            for refusal in refusals:  # CallClient: "call refused: <status> <body>"
                status, body = refusal.removeprefix("call refused: ").split(" ", 1)
                assert status == "503"
                assert json.loads(body)["error"] == {
                    "message": "server is at its limit of 2 sessions", "type": "server_error",
                    "param": None, "code": "server_busy"}
            for call in calls:  # the admitted calls are live sessions
                await call.open()
            assert await _health_sessions(base) == 2
        finally:
            for call in calls:
                assert (await call.hangup()).status_code == 200  # returns once it closed
                await call.close()
        assert await _health_sessions(base) == 0


async def test_an_offer_refused_after_admission_gives_its_slot_back():
    from webrtc_client import CallClient

    with fake_server(max_sessions=1, ice_hosts="127.0.0.1") as (base, _):
        async with httpx.AsyncClient(base_url=base) as http:
            sdp = {"Content-Type": "application/sdp"}
            bad = await http.post("/v1/realtime/calls", content="hello", headers=sdp)
            assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_sdp"
            unanswerable = await http.post(
                "/v1/realtime/calls", headers=sdp,
                content="v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"
                        "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\n")
            assert unanswerable.status_code == 400
            assert "cannot answer" in unanswerable.json()["error"]["message"]
            assert (await http.get("/health")).json()["sessions"] == 0
        call = await CallClient.place(base)  # the one slot is free
        try:
            await call.open()
        finally:
            await call.hangup()
            await call.close()
        assert await _health_sessions(base) == 0


# ---------------------------------------------------------------------------- WebRTC inbox


async def test_call_inbox_reads_client_events_ahead_of_queued_mic_frames():
    from voxline.realtime.transports.webrtc import CallInbox

    inbox = CallInbox(events_limit=2, audio_limit=3)
    frames = [cmd.InputAudioAppend(audio=bytes([i])) for i in range(3)]
    for frame in frames:
        await inbox.put_audio(frame)  # the mic's bound is full...
    cancel, update = cmd.ResponseCancel(), cmd.SessionUpdate(changes={"instructions": "x"})
    assert inbox.offer(cancel) and inbox.offer(update)  # ...yet a control event still fits
    assert not inbox.offer(cmd.InputAudioCommit())  # past the events' own bound: refused
    items = inbox.items()
    assert [await anext(items) for _ in range(5)] == [cancel, update, *frames]
    waiting = asyncio.ensure_future(anext(items))  # nothing queued: the reader waits...
    inbox.offer(cancel)  # ...until an event comes
    assert await waiting == cancel
    await inbox.put_audio(frames[0])
    inbox.offer(update)
    inbox.end()  # events already offered are read; queued audio is not
    assert [item async for item in items] == [update]


# ---------------------------------------------------------------------------- SDK outbox


@contextlib.asynccontextmanager
async def echo_engine():
    engine = InProcessEngineClient(ECHO)
    await engine.start()
    await engine.wait_ready()
    try:
        yield engine
    finally:
        await engine.close()


async def test_sdk_session_whose_reader_stops_ends_with_a_clear_reason():
    async with echo_engine() as engine:
        host = SessionHost(engine)
        transport = LocalTransport(engine, host=host)
        await transport.open()
        assert host.active == 1
        reason = f"client is not reading: {OUTBOX_LIMIT} events unread (limit {OUTBOX_LIMIT})"
        with pytest.raises(SessionError, match=re.escape(reason)):
            for _ in range(100_000):  # each one is answered by an error event nobody reads
                await transport.send(cmd.ItemRetrieve(item_id="nope"))
        assert transport.end_reason == reason
        events = [e async for e in transport.events()]  # what was queued is still there
        assert len(events) == OUTBOX_LIMIT
        assert isinstance(events[0], ev.SessionCreated)
        await transport.close()
        assert host.active == 0


async def test_sdk_session_whose_reader_keeps_reading_is_never_ended():
    count = 30_000  # far past every bound on the way (outbox, runner, inbox)
    async with echo_engine() as engine:
        transport = LocalTransport(engine)
        await transport.open()
        errors = 0

        async def read() -> None:
            nonlocal errors
            async for event in transport.events():
                if isinstance(event, ev.ErrorEvent):
                    errors += 1
                    if errors == count:
                        return

        reader = asyncio.create_task(read())
        for _ in range(count):
            await transport.send(cmd.ItemRetrieve(item_id="nope"))
        await asyncio.wait_for(reader, 60 * TIME_FACTOR)
        assert errors == count and transport.end_reason is None
        await transport.close()
