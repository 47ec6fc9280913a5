"""Capacity, not collapse: sessions and responses are admitted up to the server's real
capacity and refused past it with a reason (close 1013, HTTP 503 + Retry-After, a failed
response with `server_busy`); a client that stops reading is dropped without slowing the
others. Over the real app on loopback with the stand-in models."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time

import httpx
import pytest
from conftest import TIME_FACTOR
from fake_server import fake_server
from test_engine_core import Harness, has
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from voxline.engines import protocol as p
from voxline.realtime.transports.outbox import Outbox, SlowClient


def _ws(base: str, path: str = "/v1/realtime") -> str:
    return base.replace("http", "ws") + path


async def _recv(ws, timeout: float = 10.0) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout * TIME_FACTOR))


async def _until(ws, kind: str) -> tuple[dict, list[dict]]:
    seen = []
    while (event := await _recv(ws))["type"] != kind:
        seen.append(event)
    return event, seen


# ---------------------------------------------------------------------------- the engine


def test_engine_refuses_responses_past_its_limit_and_admits_again_once_one_ends():
    h = Harness(stop_after=6, max_responses=2)
    h.send(*(p.OpenStream(s) for s in ("a", "b", "c")))
    h.send(*(p.AddItem(s, f"{s}1", "user", "hi") for s in ("a", "b", "c")))
    h.send(p.CreateResponse("a", "ra", "ia"), p.CreateResponse("b", "rb", "ib"),
           p.CreateResponse("c", "rc", "ic"))
    refused = [o for o in h.outputs + h.core.step() if o.stream_id == "c"]
    h.outputs.extend(o for o in refused if o not in h.outputs)
    assert [type(o) for o in refused] == [p.StreamError, p.ResponseFinished]
    assert refused[0].code == "server_busy" and not refused[0].fatal
    assert "limit of 2 responses" in refused[0].message
    assert refused[1].response_id == "rc" and refused[1].status == p.ResponseStatus.FAILED
    h.run_until(has(p.ResponseFinished, response_id="ra", status=p.ResponseStatus.COMPLETED))
    h.run_until(has(p.ResponseFinished, response_id="rb", status=p.ResponseStatus.COMPLETED))
    h.send(p.CreateResponse("c", "rc2", "ic2"))  # capacity is back
    h.run_until(has(p.ResponseFinished, response_id="rc2", status=p.ResponseStatus.COMPLETED))
    h.close()


def test_speech_counts_as_a_response():
    h = Harness(stop_after=200, step_seconds=0.01, max_responses=1)
    h.send(p.OpenStream("a"), p.OpenStream("s"), p.AddItem("a", "a1", "user", "hi"),
           p.CreateResponse("a", "ra", "ia"), p.Speak("s", "rs", "Hello there."))
    h.run_until(has(p.ResponseFinished, response_id="rs"))
    assert h.of(p.ResponseFinished)[0].status == p.ResponseStatus.FAILED
    assert [e.code for e in h.of(p.StreamError)] == ["server_busy"]
    h.close()


# ---------------------------------------------------------------------------- sessions


async def test_sessions_past_the_limit_are_refused_on_every_transport_with_a_reason():
    with fake_server(max_sessions=1) as (base, _):
        async with connect(_ws(base)) as first:
            assert (await _recv(first))["type"] == "session.created"
            async with connect(_ws(base)) as second:
                with pytest.raises(ConnectionClosed) as closed:
                    await _recv(second)
            assert closed.value.rcvd.code == 1013
            assert closed.value.rcvd.reason == "server is at its limit of 1 sessions"
            async with connect(_ws(base, "/v1/telephony/twilio")) as phone:
                with pytest.raises(ConnectionClosed) as closed:
                    await _recv(phone)
            assert closed.value.rcvd.code == 1013 and "limit of 1 sessions" in closed.value.rcvd.reason
            async with httpx.AsyncClient(base_url=base) as http:
                offer = await http.post("/v1/realtime/calls", content="v=0\r\n",
                                        headers={"content-type": "application/sdp"})
                assert offer.status_code == 503 and offer.headers["retry-after"] == "1"
                assert offer.json()["error"]["code"] == "server_busy"
                metrics = (await http.get("/metrics")).text
                assert "voxline_sessions_refused_total 3" in metrics
        async with httpx.AsyncClient(base_url=base) as http:  # the first one's close lands
            deadline = time.monotonic() + 10 * TIME_FACTOR
            while (await http.get("/health")).json()["sessions"]:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
        async with connect(_ws(base)) as again:  # the slot is free once the first left
            assert (await _recv(again))["type"] == "session.created"


# ---------------------------------------------------------------------------- responses


async def _text_turn(ws, text: str = "hi") -> None:
    await ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}))
    await ws.send(json.dumps({"type": "response.create"}))


async def test_a_reply_past_the_engine_limit_fails_with_server_busy_and_the_session_lives():
    slow = {"stop_after": 60, "step_seconds": 0.07}  # a reply of about four seconds
    with fake_server(core_options={**slow, "max_responses": 1}) as (base, _):
        async with connect(_ws(base)) as a, connect(_ws(base)) as b:
            for ws in (a, b):
                assert (await _recv(ws))["type"] == "session.created"
            await _text_turn(a)
            await _until(a, "response.created")
            await _text_turn(b)
            done, seen = await _until(b, "response.done")
            errors = [e["error"] for e in seen if e["type"] == "error"]
            assert [e["code"] for e in errors] == ["server_busy"]
            assert errors[0]["type"] == "server_error"
            assert done["response"]["status"] == "failed"
            async with httpx.AsyncClient(base_url=base) as http:  # speech is refused too
                r = await http.post("/v1/audio/speech", json={
                    "model": "tts-1", "input": "Hello.", "voice": "alloy",
                    "response_format": "pcm"})
                assert r.status_code == 503 and r.headers["retry-after"] == "1"
                assert r.json()["error"]["code"] == "server_busy"
            await a.send(json.dumps({"type": "response.cancel"}))
            await _until(a, "response.done")
            await _text_turn(b, "again")  # the session lived on and now gets its reply
            done, seen = await _until(b, "response.done")
            assert done["response"]["status"] == "completed", [e["error"]["message"] for e in seen if e["type"] == "error"]


# ---------------------------------------------------------------------------- slow readers


async def test_outbox_raises_past_its_bound_and_sends_in_order():
    sent: list[str] = []
    gate = asyncio.Event()

    async def write(text: str) -> None:
        await gate.wait()
        sent.append(text)

    box = Outbox(write, limit_bytes=10)
    box.start()
    box.put("abcd")
    box.put("efgh")
    with pytest.raises(SlowClient, match="client is not reading"):
        box.put("ijkl")
    assert box.overflowed and not await box.flush(0.05)
    gate.set()
    assert await box.flush(5)
    assert sent == ["abcd", "efgh", "ijkl"] and box.pending_bytes == 0
    await box.stop()


async def test_a_client_that_stops_reading_is_dropped_and_the_others_keep_talking():
    with fake_server(send_buffer_kb=64) as (base, _):
        host, port = base.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        async with connect(_ws(base), sock=sock, max_queue=1) as stalled, \
                connect(_ws(base)) as healthy:
            assert (await _recv(stalled))["type"] == "session.created"
            assert (await _recv(healthy))["type"] == "session.created"
            # session.updated echoes the instructions: megabytes owed to a client not reading
            update = json.dumps({"type": "session.update", "session": {
                "type": "realtime", "instructions": "x" * 1_000_000}})
            with contextlib.suppress(ConnectionClosed):  # it may be dropped mid-way
                for _ in range(24):
                    await stalled.send(update)
            async with httpx.AsyncClient(base_url=base) as http:
                turns = []
                deadline = time.monotonic() + 60 * TIME_FACTOR
                while "voxline_slow_clients_dropped_total 1" not in (await http.get("/metrics")).text:
                    assert time.monotonic() < deadline, "the stalled client was never dropped"
                    t0 = time.perf_counter()
                    await _text_turn(healthy)
                    done, _ = await _until(healthy, "response.done")
                    assert done["response"]["status"] == "completed"
                    turns.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await _text_turn(healthy)  # still served after the drop
                assert (await _until(healthy, "response.done"))[0]["response"]["status"] == "completed"
                turns.append(time.perf_counter() - t0)
                assert (await http.get("/health")).json()["sessions"] == 1
            with pytest.raises(ConnectionClosed):  # the stalled one's connection is gone
                while True:
                    await asyncio.wait_for(stalled.recv(), 30 * TIME_FACTOR)
            assert stalled.close_code not in (1000, 1001)
        print(f"healthy session's turns while a neighbour stalled: "
              f"{', '.join(f'{1000 * t:.0f}' for t in turns)} ms")


def test_engine_streams_follow_max_sessions(monkeypatch):
    # they were fixed at 64: with --max-sessions 100 the 65th session's stream was refused
    from voxline.engines import factory

    seen: dict = {}
    monkeypatch.setattr(factory, "load_models", lambda *a, **k: None)
    monkeypatch.setattr(factory.EngineCore, "from_settings",
                        lambda models, wake, settings, **kw: seen.update(kw))
    for sessions in (8, 100):
        factory.make_engine_core(lambda: None, {"max_sessions": sessions})
        assert seen["max_streams"] == sessions + factory.REQUEST_STREAMS
    factory.make_engine_core(lambda: None, {"max_sessions": 8}, max_streams=3)
    assert seen["max_streams"] == 3


def test_model_threads_hand_the_gil_over_within_half_a_millisecond(monkeypatch):
    import sys

    from voxline.config import Settings
    from voxline.engines import factory, sizing

    current = [0.005]  # CPython's default
    monkeypatch.setattr(sys, "getswitchinterval", lambda: current[0])
    monkeypatch.setattr(sys, "setswitchinterval", lambda s: current.__setitem__(0, s))
    factory.share_the_gil()
    assert current == [factory.GIL_SWITCH_INTERVAL_S] and factory.GIL_SWITCH_INTERVAL_S <= 0.0005
    assert Settings().gil_switch_us == factory.GIL_SWITCH_INTERVAL_S * 1e6  # the setting's default
    factory.share_the_gil(0.0001)  # gil_switch_us=100
    assert current == [0.0001]
    # set on the CPU engine, where the interval is left alone, it is refused, naming it
    with pytest.raises(ValueError, match="gil_switch_us=100 applies with a model on a GPU"):
        factory.load_models(Settings(gil_switch_us=100))
    # as an engine process gets them (every field in a dump): the default is no error
    from voxline.config import settings_from_dump

    dumped = settings_from_dump(Settings().model_dump(mode="json"))
    assert "gil_switch_us" in dumped.model_fields_set
    monkeypatch.setattr(factory, "set_stream_priority", lambda s: (_ for _ in ()).throw(RuntimeError("past")))
    with pytest.raises(RuntimeError, match="past"):  # got past the check to the loading
        factory.load_models(dumped)
    with pytest.raises(ValueError, match="gil_switch_us"):
        Settings(gil_switch_us=5)
    # set explicitly, even to the default, the API process refuses it on the CPU, where it
    # still knows which fields were set; unset, or with a model on a GPU, it passes
    from voxline.errors import VoxlineError

    with pytest.raises(VoxlineError, match="gil_switch_us=500 applies with a model on a GPU"):
        sizing.sized_for_device(Settings(gil_switch_us=500))
    assert sizing.sized_for_device(Settings()) == Settings()
    monkeypatch.setattr(sizing, "gpu_footprints", lambda s: ({}, {}))
    gpu = Settings(gil_switch_us=100, llm_device="cuda")
    assert sizing.sized_for_device(gpu) is gpu


def test_attention_stays_off_cudnn_on_a_gpu_and_is_left_alone_without_one(monkeypatch):
    import torch

    from voxline.engines import factory

    calls: list[bool] = []
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", calls.append)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    factory.shape_free_attention()
    assert calls == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    factory.shape_free_attention()
    assert calls == [False]


def test_the_gpu_process_settings_apply_only_when_a_model_is_on_a_gpu():
    from voxline.config import load_settings
    from voxline.engines.sizing import runs_on_gpu

    assert not runs_on_gpu(load_settings())
    assert runs_on_gpu(load_settings(tts_device="cuda:1"))
    assert runs_on_gpu(load_settings(asr_device="cuda"))
