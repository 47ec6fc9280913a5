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
from voxline.realtime.session_host import (
    Refusal,
    SessionHost,
    SessionLimits,
    SessionRefused,
    stream_id_for,
)
from voxline.sdk.engine import OUTBOX_LIMIT, LocalTransport
from voxline.sdk.session import SessionError
from voxline.sessions import commands as cmd
from voxline.sessions import events as ev

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
    with pytest.raises(SessionRefused) as refused:
        host.admit(draining=True)
    assert (refused.value.refusal, refused.value.reason) == (Refusal.SHUTTING_DOWN,
                                                             "server is shutting down")
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
    from voxline.realtime.webrtc import CallInbox

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
