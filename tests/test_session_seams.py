"""The session over a real engine, fast: SessionRunner + SessionActor driving a real
EngineCore (in-process client) whose models are the small stand-ins of tests/fakes.py.
Barge-in, manual commit, truncate, item create/delete, output_audio_buffer.clear and the
idle timeout, each end to end through the same code the WebSocket uses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest
from conftest import TIME_FACTOR
from fakes import tone

from voxline.codecs.pcm import float_to_pcm16
from voxline.engines.client import InProcessEngineClient
from voxline.sessions import commands as cmd
from voxline.sessions import events as ev
from voxline.sessions.actor import SessionActor
from voxline.sessions.runner import SessionRunner

RATE = 24000  # the session's default input: PCM16 at 24 kHz


def speech(seconds: float = 0.6, silence: float = 0.8) -> bytes:
    audio = np.concatenate([np.zeros(int(0.2 * RATE), np.float32), tone(seconds, RATE),
                            np.zeros(int(silence * RATE), np.float32)])
    return float_to_pcm16(audio)


class Client:
    """The transport's side of a runner: commands in, events out, kept for asserts."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[cmd.ClientCommand | None] = asyncio.Queue()
        self.events: list[ev.ServerEvent] = []
        self._new = asyncio.Event()

    async def commands(self) -> AsyncIterator[cmd.ClientCommand]:
        while (command := await self.inbox.get()) is not None:
            yield command

    async def send(self, event: ev.ServerEvent) -> None:
        self.events.append(event)
        self._new.set()

    def do(self, *commands: cmd.ClientCommand) -> None:
        for command in commands:
            self.inbox.put_nowait(command)

    async def until(self, pred: Callable[[ev.ServerEvent], bool], timeout: float = 15.0,
                    start: int = 0) -> ev.ServerEvent:
        async def wait() -> ev.ServerEvent:
            seen = start
            while True:
                for event in self.events[seen:]:
                    if pred(event):
                        return event
                seen = len(self.events)
                self._new.clear()
                await self._new.wait()
        return await asyncio.wait_for(wait(), timeout * TIME_FACTOR)

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]


@pytest.fixture
async def session():
    engine = InProcessEngineClient("fakes:make_fake_core", {"stop_after": 60})
    await engine.start()
    client = Client()
    actor = SessionActor("sess_seam", "seam-1")
    runner = asyncio.create_task(SessionRunner(actor, engine, client.send).run(client.commands()))
    await client.until(lambda e: isinstance(e, ev.SessionCreated))
    yield client, actor
    client.inbox.put_nowait(None)
    await asyncio.wait_for(runner, 10)
    await engine.close()
    assert not client.of(ev.ErrorEvent), client.of(ev.ErrorEvent)  # none of these errs


async def test_barge_in_cancels_truncates_and_answers_the_new_turn(session):
    client, actor = session
    client.do(cmd.InputAudioAppend(audio=speech()))
    first = await client.until(lambda e: isinstance(e, ev.AudioDelta))
    client.do(cmd.InputAudioAppend(audio=speech(0.5)))  # talk over the reply
    done = await client.until(lambda e: isinstance(e, ev.ResponseDone)
                              and e.response.id == first.response_id)
    assert done.response.status == "cancelled"
    assert done.response.status_details.reason == "turn_detected"
    cut = await client.until(lambda e: isinstance(e, ev.ItemTruncated))
    assert cut.item_id == first.item_id
    assert 0 <= cut.audio_end_ms <= actor.items[first.item_id].sent_ms + 1
    cleared = client.of(ev.OutputAudioBufferCleared)
    assert [c.response_id for c in cleared] == [first.response_id]
    second = await client.until(lambda e: isinstance(e, ev.ResponseDone)
                                and e.response.id != first.response_id, timeout=30)
    assert second.response.status == "completed"
    assert len(client.of(ev.InputAudioCommitted)) == 2  # the interrupting turn is one item
    # nothing of the cancelled reply after its response.done
    after = client.events[client.events.index(done):]
    assert not [e for e in after if isinstance(e, ev.AudioDelta)
                and e.response_id == first.response_id]


async def test_manual_turns_truncate_items_and_buffer_clear(session):
    client, actor = session
    client.do(cmd.SessionUpdate(changes={"audio": {"input": {
        "turn_detection": None, "transcription": {"model": "any"}}}}))
    await client.until(lambda e: isinstance(e, ev.SessionUpdated))
    client.do(cmd.InputAudioAppend(audio=speech(0.5, 0.1)), cmd.InputAudioCommit(event_id="c1"))
    final = await client.until(lambda e: isinstance(e, ev.InputTranscriptionCompleted))
    assert final.transcript == "hello there friend"
    client.do(cmd.ResponseCreate())
    first = await client.until(lambda e: isinstance(e, ev.AudioDelta))
    await client.until(lambda e: isinstance(e, ev.AudioDelta) and e is not first)
    client.do(cmd.ResponseCancel(event_id="cancel"))
    done = await client.until(lambda e: isinstance(e, ev.ResponseDone))
    assert done.response.status == "cancelled"
    assert not client.of(ev.ItemTruncated)  # after a client cancel the client truncates
    client.do(cmd.ItemTruncate(item_id=first.item_id, audio_end_ms=40, event_id="t"))
    cut = await client.until(lambda e: isinstance(e, ev.ItemTruncated))
    assert cut.audio_end_ms == 40
    client.do(cmd.ItemCreate(item=_user_text("u2", "and then?")),
              cmd.ItemDelete(item_id="u2"), cmd.OutputAudioClear())
    await client.until(lambda e: isinstance(e, ev.ItemDeleted))
    await client.until(lambda e: isinstance(e, ev.OutputAudioBufferCleared)
                       and client.events.index(e) > client.events.index(done))
    assert "u2" not in actor.items and len(client.of(ev.ItemTruncated)) == 1


async def test_idle_timeout_commits_an_empty_turn_and_answers(session):
    client, actor = session
    client.do(cmd.SessionUpdate(changes={"audio": {"input": {"turn_detection": {
        "type": "server_vad", "idle_timeout_ms": 300}}}}))
    timeout = await client.until(lambda e: isinstance(e, ev.InputAudioTimeoutTriggered))
    committed = await client.until(lambda e: isinstance(e, ev.InputAudioCommitted))
    assert committed.item_id == timeout.item_id and timeout.item_id in actor.items
    done = await client.until(lambda e: isinstance(e, ev.ResponseDone), timeout=30)
    assert done.response.status == "completed"


def _user_text(item_id: str, text: str):
    from voxline.sessions.items import ContentPart, MessageItem

    return MessageItem(id=item_id, role="user",
                       content=[ContentPart(type="input_text", text=text)])


async def test_a_session_task_cancelled_by_someone_else_ends_it_as_an_error_not_a_cancel():
    """A CancelledError out of the runner would read as its caller's own cancellation (and
    escape Starlette's cancel scope); a stray cancel of one of its tasks is a server error."""
    engine = InProcessEngineClient("fakes:make_fake_core", {"stop_after": 60})
    await engine.start()
    try:
        client = Client()
        runner = asyncio.create_task(SessionRunner(SessionActor("sess_stray", "stray-1"), engine,
                                                   client.send).run(client.commands()))
        await client.until(lambda e: isinstance(e, ev.SessionCreated))
        reader = next(t for t in asyncio.all_tasks() if t.get_name() == "session-client")
        reader.cancel()
        with pytest.raises(RuntimeError, match="session-client task was cancelled"):
            await asyncio.wait_for(runner, 10 * TIME_FACTOR)
        assert not runner.cancelled()
    finally:
        await engine.close()
