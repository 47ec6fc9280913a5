"""Every server event a session emits validates strictly against the `openai` package's own
pydantic types, in both dialects (GA `openai.types.realtime`, beta
`openai.types.beta.realtime`). The session is scripted at the actor (engine outputs fed by
hand), so every event kind appears: spoken turn, text turn, cancel, barge-in, two
truncates, item edits, buffer clears, an idle timeout and errors. The live-server twin is
in tests/test_realtime_e2e.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from openai_types import strict_problems

from voxline.engines import protocol as ep
from voxline.realtime.openai.client_events import parse_command
from voxline.realtime.openai.dialect import Dialect
from voxline.realtime.openai.server_events import render, wire_type
from voxline.sessions import events as ev
from voxline.sessions.actor import SessionActor
from voxline.sessions.settings import SessionSettings

# Wire events the session never emits: the engine reports no per-item ASR failure yet, and
# there are no rate limits to report (no fabricated figures are sent).
NEVER_EMITTED = {ev.ConversationCreated, ev.InputTranscriptionFailed, ev.RateLimitsUpdated}
# MCP tools need a remote reply model and an MCP server: tests/test_mcp_tools.py drives
# them over /v1/realtime and validates each of these strictly
NEVER_EMITTED |= {ev.McpListToolsInProgress, ev.McpListToolsCompleted, ev.McpListToolsFailed,
                  ev.McpCallArgumentsDelta, ev.McpCallArgumentsDone, ev.McpCallInProgress,
                  ev.McpCallCompleted, ev.McpCallFailed}
# voxline's video extension events are not OpenAI's (the SDK passes them through as
# unknown types): tests/test_realtime_video.py drives them through the SDK
NEVER_EMITTED |= set(ev.VOXLINE_EXTENSION_EVENTS)
# the SIP transport, not the session, tells of keypresses: tests/test_sip_calls.py validates it
NEVER_EMITTED |= {ev.DtmfEventReceived}


class Script:
    """A session driven through the actor with a hand-played engine and clock."""

    def __init__(self) -> None:
        self.actor = SessionActor("sess_1", "s1", settings=SessionSettings(model="gpt-realtime"),
                                  tools_supported=True)
        self.t = 0.0
        self.events: list[ev.ServerEvent] = []
        self.actor.start(self.t)
        self.actor.take_commands()

    def send(self, **event: object) -> list[ep.EngineInput]:
        self.actor.receive(parse_command(json.dumps(event)), self.t)
        return self.actor.take_commands()

    def engine(self, *outs: ep.EngineOutput) -> list[ep.EngineInput]:
        for out in outs:
            self.actor.on_engine(out, self.t)
        return self.actor.take_commands()

    def run(self, seconds: float) -> None:
        end = self.t + seconds
        while self.t < end:
            self.t = round(self.t + 0.02, 6)
            self.actor.tick(self.t)

    def reply(self, cmd: ep.CreateResponse, text: str = "Paris is the capital.",
              seconds: float = 1.0, done: bool = True) -> None:
        audio = (0.1 * np.sin(np.arange(int(22050 * seconds)) / 10)).astype("<f4")
        self.engine(ep.ReplyTextDelta("s1", cmd.response_id, text),
                    ep.AudioChunk("s1", cmd.response_id, audio.tobytes(), 22050,
                                  seconds * 1000, text))
        if done:
            self.engine(ep.ResponseFinished("s1", cmd.response_id, ep.ResponseStatus.COMPLETED,
                                        text, 20, 5))

    def take(self) -> list[ev.ServerEvent]:
        out = self.actor.take_events()
        self.events += out
        return out


def response_of(cmds: list[ep.EngineInput]) -> ep.CreateResponse:
    return next(c for c in cmds if isinstance(c, ep.CreateResponse))


def scripted_session() -> list[ev.ServerEvent]:
    s = Script()
    s.send(type="session.update", session={
        "type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}})
    s.send(type="session.update", session={"type": "realtime", "truncation": {
        "type": "retention_ratio", "retention_ratio": 0.8,
        "token_limits": {"post_instructions": 2000}}})
    # a spoken turn, answered with audio that plays out
    s.engine(ep.VoiceStarted("s1", 300, "item_u1"),
             ep.TranscriptPartial("s1", "item_u1", "What is"),
             ep.TranscriptPartial("s1", "item_u1", "What is the capital"))
    s.t += 1.0
    first = response_of(s.engine(ep.VoiceStopped("s1", 2100, "item_u1")))
    s.engine(ep.TranscriptFinal("s1", "item_u1", "What is the capital of France?"))
    s.reply(first)
    s.run(1.5)
    # a function call forced by tool_choice, its output, and the spoken follow-up
    s.send(type="session.update", session={"type": "realtime", "tools": [{
        "type": "function", "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]})
    call = response_of(s.send(type="response.create", response={
        "tool_choice": {"type": "function", "name": "get_weather"}}))
    item = f"{call.item_id}_call0"
    s.engine(ep.FunctionCallDelta("s1", call.response_id, item, 0, "call_1", "get_weather",
                                  '{"city": '),
             ep.FunctionCallDelta("s1", call.response_id, item, 0, "call_1", "get_weather",
                                  '"Paris"}'),
             ep.FunctionCallDone("s1", call.response_id, item, 0, "call_1", "get_weather",
                                 '{"city": "Paris"}', True),
             ep.ResponseFinished("s1", call.response_id, ep.ResponseStatus.COMPLETED, "", 30, 8))
    s.run(0.1)
    s.send(type="conversation.item.create", item={
        "type": "function_call_output", "call_id": "call_1", "output": '{"sky": "clear"}'})
    s.reply(response_of(s.send(type="response.create", response={"tool_choice": "none"})),
            "It is clear in Paris.", seconds=0.2)
    s.run(1.0)
    # a text turn with a text-only response
    s.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]})
    text = response_of(s.send(type="response.create", response={"output_modalities": ["text"]}))
    s.engine(ep.ReplyTextDelta("s1", text.response_id, "Hello!"),
             ep.ResponseFinished("s1", text.response_id, ep.ResponseStatus.COMPLETED, "Hello!", 5, 2))
    s.run(0.1)
    # a client cancel, then a client truncate of what it played
    cancelled = response_of(s.send(type="response.create"))
    s.reply(cancelled, done=False)
    s.run(0.3)
    s.send(type="response.cancel")
    s.engine(ep.ResponseFinished("s1", cancelled.response_id, ep.ResponseStatus.CANCELLED,
                             "Paris", 20, 2))
    s.send(type="conversation.item.truncate", item_id=cancelled.item_id, content_index=0,
           audio_end_ms=200)
    s.engine(ep.TruncationApplied("s1", cancelled.item_id, 200, "Paris"))
    # a barge-in: the server cuts at its playout clock, the client truncates after it
    interrupted = response_of(s.send(type="response.create"))
    s.reply(interrupted, done=False)
    s.run(0.5)
    s.engine(ep.VoiceStarted("s1", 6000, "item_u2"))
    cut = s.engine(ep.ResponseFinished("s1", interrupted.response_id,
                                   ep.ResponseStatus.CANCELLED, "Paris", 20, 2))
    truncate = next(c for c in cut if isinstance(c, ep.TruncateItem))
    s.engine(ep.TruncationApplied("s1", interrupted.item_id, truncate.audio_end_ms, "Paris"))
    s.send(type="conversation.item.truncate", item_id=interrupted.item_id, content_index=0,
           audio_end_ms=460)  # past the server's cut, within what was sent
    s.engine(ep.TruncationApplied("s1", interrupted.item_id, truncate.audio_end_ms, "Paris"))
    s.t += 0.8
    after = s.engine(ep.VoiceStopped("s1", 7000, "item_u2"))
    s.engine(ep.TranscriptFinal("s1", "item_u2", "Stop."))
    s.reply(response_of(after), seconds=0.3)
    s.run(0.3)
    s.send(type="output_audio_buffer.clear")
    # item edits, buffer clears, a bad event and an idle timeout
    s.send(type="conversation.item.retrieve", item_id="item_u1")
    s.send(type="conversation.item.delete", item_id="item_u1")
    s.send(type="input_audio_buffer.clear")
    s.send(type="conversation.item.retrieve", item_id="nope", event_id="evt_bad")
    s.send(type="session.update", session={"type": "realtime", "audio": {"input": {
        "turn_detection": {"type": "server_vad", "idle_timeout_ms": 5000}}}})
    s.run(5.2)
    s.take()
    return s.events


@pytest.fixture(scope="module")
def events() -> list[ev.ServerEvent]:
    return scripted_session()


@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
def test_every_emitted_event_validates_strictly(events, dialect):
    wire = [w for w in (render(e, dialect) for e in events) if w is not None]
    problems = [p for w in wire for p in strict_problems(w, dialect.value)]
    assert problems == []
    expected = {wire_type(cls, dialect) for cls in ev.SERVER_EVENT_CLASSES
                if cls not in NEVER_EMITTED} - {None}
    assert {w["type"] for w in wire} == expected  # the script reached every kind


def test_the_script_is_the_behaviour_it_claims(events):
    kinds = [type(e) for e in events]
    assert kinds.count(ev.ItemTruncated) == 3 and ev.ErrorEvent in kinds
    errors = [e for e in events if isinstance(e, ev.ErrorEvent)]
    assert [e.error.event_id for e in errors] == ["evt_bad"]  # only the bad retrieve fails
    started = [e.response_id for e in events if isinstance(e, ev.OutputAudioBufferStarted)]
    ended = [e.response_id for e in events
             if isinstance(e, ev.OutputAudioBufferStopped | ev.OutputAudioBufferCleared)]
    assert started and ended[:len(started)] == started  # each start has its end, in order
    assert events[0].session.model == "gpt-realtime"


def test_the_strict_check_catches_what_the_sdk_lets_through():
    assert strict_problems({"type": "output_audio_buffer.started", "event_id": "e",
                            "response_id": "r", "extra": 1}, "ga")
    assert strict_problems({"type": "response.output_audio.delta", "event_id": "e",
                            "response_id": "r", "item_id": "i", "output_index": "0",
                            "content_index": 0, "delta": ""}, "ga")
    assert strict_problems({"type": "no.such.event", "event_id": "e"}, "beta")
