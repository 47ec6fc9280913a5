"""Back-pressure end to end: every queue between a producer and a slower consumer is
bounded, and past its bound the producer waits or is refused with the documented error;
nothing is dropped silently, and a normal reader is never taken for a slow one.

- the engine inbox (`engines.loop.Inbox`), in-process and behind the engine process's
  socket (whose high-water mark pushes back once the child's pump waits for room);
- a session whose engine refuses an input: an `error` (server_busy) naming the event,
  and the session lives on;
- the engine client's ready notifications (what the voice store listens to);
- the Outbox: one large echo is not a backlog;
- very long `session.instructions` over a real server: echoed, then refused naming the
  field and the limit when a response would need them, and the session lives on.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import multiprocessing
import threading
from collections.abc import Callable
from typing import Any

import pytest
import websockets
from conftest import TIME_FACTOR
from echo_core import EchoCore
from fake_server import fake_server
from live_server import free_port, serve_app

from voxline.config import load_settings
from voxline.engines import protocol as p
from voxline.engines.client import InProcessEngineClient
from voxline.engines.loop import Inbox
from voxline.engines.process import MultiprocessEngineClient
from voxline.errors import EngineBusyError, EngineDeadError
from voxline.realtime.app import create_app
from voxline.realtime.transports.outbox import Outbox, SlowClient

STALL = b"stall"  # an InputAudioAppend with these bytes holds the engine loop until the gate opens
SAMPLE = b"\0\0\0\0"


class StallingCore(EchoCore):
    """EchoCore that can hold its loop (as a slow model step would) and counts the audio
    it was given: a `CreateResponse` answers with that count as its text.

    The loop stalls on an `InputAudioAppend` of `STALL` bytes, and (with `stall_on_open`) on
    every `OpenStream`, until `gate` is set; `entered` (if given) is set as it stalls."""

    def __init__(self, wake: Callable[[], None], gate: Any, entered: Any = None,
                 stall_on_open: bool = False) -> None:
        super().__init__(wake)
        self.gate = gate
        self.entered = entered
        self.stall_on_open = stall_on_open
        self.appended = 0

    def _stall(self) -> None:
        if self.entered is not None:
            self.entered.set()
        self.gate.wait(120 * TIME_FACTOR)

    def add_input(self, msg: p.EngineInput) -> None:
        if isinstance(msg, p.AppendAudio):
            if msg.audio == STALL:
                self._stall()
            else:
                self.appended += 1
            return
        if isinstance(msg, p.CreateResponse):
            self._pending += [p.ReplyTextDelta(msg.stream_id, msg.response_id, str(self.appended)),
                              p.ResponseFinished(msg.stream_id, msg.response_id,
                                             p.ResponseStatus.COMPLETED, str(self.appended))]
            return
        super().add_input(msg)
        if isinstance(msg, p.OpenStream) and self.stall_on_open:
            self._stall()


def make_stalling_core(wake: Callable[[], None], **kwargs: Any) -> StallingCore:
    """Core spec ``"test_back_pressure:make_stalling_core"``."""
    return StallingCore(wake, **kwargs)


async def _send_when_room(handle: Any, msg: p.EngineInput) -> None:
    """Send `msg`, waiting while the engine refuses it as busy (it is catching up)."""
    deadline = asyncio.get_running_loop().time() + 60 * TIME_FACTOR
    while True:
        try:
            handle.send(msg)
            return
        except EngineBusyError:
            assert asyncio.get_running_loop().time() < deadline, "the engine never caught up"
            await asyncio.sleep(0.01)


async def _counted(handle: Any) -> int:
    """The audio count the stalling core answers a response with."""
    await _send_when_room(handle, p.CreateResponse(handle.stream_id, "resp_count", "item"))
    while True:
        out = await asyncio.wait_for(handle.next(), 60 * TIME_FACTOR)
        if isinstance(out, p.ReplyTextDelta):
            return int(out.text)
        assert not isinstance(out, p.StreamError), out


# ------------------------------------------------------------------------------ the inbox


def test_the_inbox_refuses_or_waits_past_its_bound_and_a_wake_takes_no_room():
    inbox = Inbox(limit=2)
    inbox.put(p.CloseStream("a"))
    inbox.put(p.CloseStream("b"))
    inbox.wake()  # never refused, never counted
    with pytest.raises(EngineBusyError, match=r"queue is full \(2 messages\)") as refused:
        inbox.put(p.CloseStream("c"))
    assert refused.value.stream_id == "c"
    waited = threading.Thread(target=inbox.put, args=(p.CloseStream("d"), True))
    waited.start()  # blocks: no room until the loop drains
    assert [m.stream_id for m in inbox.drain(block=False)] == ["a", "b"]
    waited.join(30 * TIME_FACTOR)
    assert not waited.is_alive()
    assert [m.stream_id for m in inbox.drain(block=True)] == ["d"]
    assert inbox.drain(block=True, timeout=0) == []  # nothing left (the wake was consumed)


def test_closing_the_inbox_releases_a_waiting_producer_with_engine_dead():
    inbox = Inbox(limit=1)
    inbox.put(p.CloseStream("a"))
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            inbox.put(p.CloseStream("b"), block=True)
        except EngineDeadError as exc:
            errors.append(exc)

    producer = threading.Thread(target=produce)
    producer.start()
    inbox.close()
    producer.join(30 * TIME_FACTOR)
    assert not producer.is_alive() and len(errors) == 1
    with pytest.raises(EngineDeadError):
        inbox.put(p.CloseStream("c"))


async def test_an_in_process_engine_refuses_inputs_past_its_inbox_and_loses_none():
    gate, entered = threading.Event(), threading.Event()
    client = InProcessEngineClient("test_back_pressure:make_stalling_core",
                                   {"gate": gate, "entered": entered}, max_queued_inputs=8)
    await client.start()
    try:
        handle = await client.open_stream("s")
        handle.send(p.AppendAudio("s", STALL))
        assert await asyncio.to_thread(entered.wait, 30 * TIME_FACTOR)  # the loop is held
        for _ in range(8):
            handle.send(p.AppendAudio("s", SAMPLE))
        with pytest.raises(EngineBusyError, match="queue is full") as refused:
            handle.send(p.AppendAudio("s", SAMPLE))
        assert refused.value.stream_id == "s" and not handle.ended
        gate.set()
        assert await _counted(handle) == 8  # every accepted input arrived; the refused one not
    finally:
        gate.set()
        await client.close()


async def test_a_stalled_engine_process_pushes_back_through_its_socket_and_loses_none():
    ctx = multiprocessing.get_context("spawn")
    gate = ctx.Event()
    client = MultiprocessEngineClient("test_back_pressure:make_stalling_core", {"gate": gate},
                                      restart=False, start_timeout=120 * TIME_FACTOR)
    await client.start()
    try:
        handle = await client.open_stream("s")
        handle.send(p.AppendAudio("s", STALL))
        accepted = 0
        with pytest.raises(EngineBusyError, match="queue is full"):
            for _ in range(1_000_000):  # inbox + both high-water marks + the pipe: ~30k
                handle.send(p.AppendAudio("s", SAMPLE))
                accepted += 1
        assert accepted >= 4096 and not handle.ended and client.ready
        gate.set()
        assert await _counted(handle) == accepted
    finally:
        gate.set()
        await client.close()


# ----------------------------------------------------------------------- ready notifications


async def test_ready_listeners_hear_the_start_and_every_restart():
    client = MultiprocessEngineClient("echo_core:make_echo_core", {"crash_on": "boom"},
                                      restart=True, start_timeout=120 * TIME_FACTOR)
    became_ready = asyncio.Event()
    heard: list[int] = []

    def listener() -> None:
        heard.append(client.status()["restarts"])
        became_ready.set()

    remove = client.add_ready_listener(listener)
    await client.start()
    try:
        assert heard == [0]
        became_ready.clear()
        await client.open_stream("boom")  # the child exits; the supervisor starts another
        await asyncio.wait_for(became_ready.wait(), 120 * TIME_FACTOR)
        assert heard == [0, 1] and client.ready
        remove()
    finally:
        await client.close()


# -------------------------------------------------------------------------------- the outbox


async def test_one_echo_larger_than_the_outbox_bound_is_not_a_backlog_but_two_are():
    sent: list[str] = []
    gate = asyncio.Event()

    async def write(text: str) -> None:
        await gate.wait()
        sent.append(text)

    box = Outbox(write, limit_bytes=10)
    box.start()
    box.put("x" * 100)  # a client's own large input echoed: a normal reader takes it
    box.put("abcd")
    assert not box.overflowed and box.backlog_bytes == 4
    with pytest.raises(SlowClient, match="client is not reading"):
        box.put("y" * 100)  # a second one waiting behind it: the client is not reading
    gate.set()
    assert await box.flush(30 * TIME_FACTOR)
    assert sent == ["x" * 100, "abcd", "y" * 100] and box.pending_bytes == 0
    await box.stop()


# -------------------------------------------------------------- sessions over a real server


async def _recv(ws: Any) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), 60 * TIME_FACTOR))


async def _until(ws: Any, kind: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    while (event := await _recv(ws))["type"] != kind:
        seen.append(event)
    return event, seen


async def _text_turn(ws: Any, text: str = "hello") -> None:
    await ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}))
    await ws.send(json.dumps({"type": "response.create",
                              "response": {"output_modalities": ["text"]}}))


@contextlib.contextmanager
def _opened(gate: threading.Event) -> Any:
    """Open `gate` when the block ends however it ends, so a held engine can stop."""
    try:
        yield
    finally:
        gate.set()


def _ws(base: str) -> str:
    return base.replace("http://", "ws://") + "/v1/realtime"


async def test_a_busy_engine_refusing_input_is_an_error_naming_the_event_and_the_session_lives():
    gate, entered = threading.Event(), threading.Event()
    engine = InProcessEngineClient(
        "test_back_pressure:make_stalling_core",
        {"gate": gate, "entered": entered, "stall_on_open": True}, max_queued_inputs=4)
    conf = load_settings(host="127.0.0.1", port=free_port(), engine="inprocess")
    chunk = base64.b64encode(bytes(4800)).decode()  # 100 ms of 24 kHz PCM16
    append = json.dumps({"type": "input_audio_buffer.append", "audio": chunk})
    with serve_app(create_app(conf, engine), conf.port, name="busy-server") as base, \
            _opened(gate):
        async with websockets.connect(_ws(base)) as ws:
            assert (await _recv(ws))["type"] == "session.created"
            assert await asyncio.to_thread(entered.wait, 30 * TIME_FACTOR)  # engine held
            for _ in range(12):
                await ws.send(append)
            error, _ = await _until(ws, "error")
            assert error["error"]["code"] == "server_busy"
            assert error["error"]["type"] == "server_error"
            assert error["error"]["message"].startswith("input_audio_buffer.append: the engine "
                                                        "is busy and refused it")
            gate.set()
            await _text_turn(ws)
            done, seen = await _until(ws, "response.done")
            for _ in range(100):
                if done["response"]["status"] == "completed":
                    break
                # The engine thread had not yet drained the held queue, so the reply was
                # refused as busy too (the error says to try again shortly): try again.
                assert [e["error"]["code"] for e in seen if e["type"] == "error"][-1:] == \
                    ["server_busy"], seen
                await asyncio.sleep(0.05)
                await ws.send(json.dumps({"type": "response.create",
                                          "response": {"output_modalities": ["text"]}}))
                done, seen = await _until(ws, "response.done")
            assert done["response"]["status"] == "completed", seen
            assert ws.close_code is None


async def test_megabytes_of_instructions_are_echoed_then_refused_naming_the_field_and_limit():
    """Reported: a session.update with a couple of megabytes of instructions (well under
    max_event_bytes) ended the WebSocket with 1006: the echo alone passed the outbox's
    send_buffer_kb and a normal reader was dropped as slow."""
    instructions = "word " * 420_000  # 2.1 MB; the fake LM's context is 256 tokens
    with fake_server() as (base, _):
        async with websockets.connect(_ws(base), max_size=None) as ws:
            assert (await _recv(ws))["type"] == "session.created"
            await ws.send(json.dumps({"type": "session.update", "session": {
                "type": "realtime", "instructions": instructions}}))
            updated, _ = await _until(ws, "session.updated")
            assert updated["session"]["instructions"] == instructions
            await _text_turn(ws)
            error, _ = await _until(ws, "error")
            assert error["error"]["code"] == "context_length_exceeded"
            assert error["error"]["param"] == "session.instructions"
            message = error["error"]["message"]
            assert message.startswith("session.instructions is ") and "256 tokens" in message
            done, _ = await _until(ws, "response.done")
            assert done["response"]["status"] == "failed"
            # the session lives on: shorter instructions, and the next reply completes
            await ws.send(json.dumps({"type": "session.update", "session": {
                "type": "realtime", "instructions": "Be brief."}}))
            await _until(ws, "session.updated")
            await _text_turn(ws)
            done, seen = await _until(ws, "response.done")
            assert done["response"]["status"] == "completed", seen
            assert ws.close_code is None


# ------------------------------------------------------------------ the remote LLM's deltas


def test_remote_llm_deltas_wait_in_the_http_stream_past_their_bound(monkeypatch):
    from fake_openai import Reply, fake_openai

    from voxline.engines import remote_llm
    from voxline.engines.llm_stage import GenerationRequest, Slot

    monkeypatch.setattr(remote_llm, "MAX_QUEUED_DELTAS", 3)
    pieces = [f"piece{i} " for i in range(40)]
    with fake_openai() as (fake, url):
        fake.plan.append(Reply(text=pieces))
        chat = remote_llm.RemoteChat(remote_llm.RemoteLLMConfig(url, "fake-model"))
        woke = threading.Event()
        stage = remote_llm.RemoteLLMStage(chat, woke.set)
        try:
            prompt = chat.render_message("user", "hi") + chat.generation_header()
            request = GenerationRequest("r1", Slot(1), lambda: prompt, max_tokens=100)
            stage.add(request)
            deadline = threading.Event()
            timer = threading.Timer(60 * TIME_FACTOR, deadline.set)
            timer.start()
            while not stage._want_room:  # nobody drains: the HTTP reader must stop and wait
                assert not deadline.is_set(), "the HTTP reader never waited for room"
                woke.wait(0.05)
            assert len(stage._deltas) == 3 and request.finish is None
            most = 0
            while request.finish is None:  # the engine loop's part, as run_engine_loop does
                assert not deadline.is_set(), "the reply never finished"
                woke.wait(1.0)
                woke.clear()
                most = max(most, len(stage._deltas))
                plan = stage.schedule()
                if plan is not None:
                    stage.update(plan, stage.execute(plan))
            timer.cancel()
            assert most <= 3
            assert chat.decode(request.generated) == "".join(pieces)  # every piece, in order
            assert request.finish == remote_llm.FinishReason.STOP and fake.completed == 1
        finally:
            stage.close()


# --------------------------------------------------------------- instructions past the context


def test_instructions_past_the_context_are_refused_naming_the_field_untokenized_when_huge():
    from test_engine_core import Harness

    h = Harness()
    rendered: list[int] = []
    render = h.lm.render_message
    h.lm.render_message = lambda role, text, *rest: rendered.append(len(text)) or render(
        role, text, *rest)
    h.lm.max_token_chars = 4  # no token of this model covers more than 4 characters
    huge = "w " * 1_000_000  # far past 256 tokens x 4 characters: refused before tokenizing
    h.send(p.OpenStream("s1", p.StreamConfig(instructions=huge)),
           p.AddItem("s1", "u1", "user", "hello"),
           p.CreateResponse("s1", "r1", "a1"))
    outs = h.run_until(lambda o: any(isinstance(x, p.ResponseFinished) for x in o))
    error = next(o for o in outs if isinstance(o, p.StreamError))
    assert error.code == p.ErrorCode.CONTEXT_LENGTH_EXCEEDED and not error.fatal
    assert error.param == "session.instructions"
    assert error.message.startswith(f"session.instructions is {len(huge)} characters")
    assert "256 tokens" in error.message and len(huge) not in rendered
    done = next(o for o in outs if isinstance(o, p.ResponseFinished))
    assert done.status == p.ResponseStatus.FAILED
    # a per-response override that fits in characters but not in tokens: tokenized, refused
    h.outputs.clear()
    h.send(p.CreateResponse("s1", "r2", "a2", p.ResponseConfig(instructions="w " * 300)))
    outs = h.run_until(lambda o: any(isinstance(x, p.ResponseFinished) for x in o))
    error = next(o for o in outs if isinstance(o, p.StreamError))
    assert error.param == "response.instructions"
    assert error.message.startswith("response.instructions is 305 tokens")
    # the stream lives on: without the override the next response generates
    h.send(p.UpdateStream("s1", p.StreamConfig(instructions="Be brief.")))
    h.outputs.clear()
    h.send(p.CreateResponse("s1", "r3", "a3"))
    outs = h.run_until(lambda o: any(isinstance(x, p.ResponseFinished) for x in o))
    assert next(o for o in outs if isinstance(o, p.ResponseFinished)).status == \
        p.ResponseStatus.COMPLETED
    h.close()


async def test_an_input_sent_as_the_engine_goes_down_ends_the_session_with_engine_dead():
    """The death is seen (not ready) before the streams are failed: an input the session
    sends in between must not end it with an internal error."""
    from voxline.engines.client import ENGINE_DEAD
    from voxline.sessions.actor import SessionActor
    from voxline.sessions.commands import InputAudioAppend
    from voxline.sessions.events import ErrorEvent
    from voxline.sessions.runner import SessionEnded, SessionRunner

    engine = InProcessEngineClient("echo_core:make_echo_core")
    await engine.start()
    events: list[Any] = []
    sent = asyncio.Event()

    async def send(event: Any) -> None:
        events.append(event)
        sent.set()

    commands: asyncio.Queue[Any] = asyncio.Queue()

    async def incoming() -> Any:  # a command is done once the runner asks for the next
        while (command := await commands.get()) is not None:
            yield command
            commands.task_done()

    runner = SessionRunner(SessionActor("sess_1", "s1"), engine, send)
    run = asyncio.create_task(runner.run(incoming()))
    try:
        await asyncio.wait_for(sent.wait(), 30 * TIME_FACTOR)  # session.created: running
        engine._set_down("engine process 1 was killed by SIGKILL")  # seen, streams not failed
        await commands.put(InputAudioAppend(audio=bytes(4800)))  # 100 ms: an engine InputAudioAppend
        handled = asyncio.ensure_future(commands.join())
        await asyncio.wait({handled, run}, timeout=30 * TIME_FACTOR,
                           return_when=asyncio.FIRST_COMPLETED)
        assert handled.done() and not run.done(), run.exception() if run.done() else None
        engine._fail_all_streams("engine process 1 was killed by SIGKILL", ENGINE_DEAD)
        with pytest.raises(SessionEnded) as ended:
            await asyncio.wait_for(run, 30 * TIME_FACTOR)
        assert ended.value.code == 1011 and "SIGKILL" in ended.value.reason
        assert [e.error.code for e in events if isinstance(e, ErrorEvent)] == ["engine_dead"]
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await engine.close()
