"""Transcription sessions (`session.type: "transcription"`), scripted at the session actor
with a hand-played engine: turns are transcribed and never answered, `response.create` is
refused by name, every event validates strictly against the openai SDK's GA types. The
live-server twin (the SDK over the WebSocket and WebRTC) is
tests/test_transcription_sessions_live.py."""

from __future__ import annotations

import base64
import json

import pytest
from openai_types import strict_problems

from voxline.engines import protocol as ep
from voxline.errors import ProtocolError
from voxline.realtime.auth.access import settings_from_session
from voxline.realtime.openai.client_events import parse_command
from voxline.realtime.openai.dialect import Dialect
from voxline.realtime.openai.server_events import render
from voxline.realtime.openai.session_object import session_for_intent
from voxline.sessions.actor import SessionActor
from voxline.sessions.settings import SessionSettings


class Script:
    def __init__(self, settings: SessionSettings) -> None:
        self.actor = SessionActor("sess_1", "s1", settings=settings)
        self.t = 0.0
        self.actor.start(self.t)
        self.commands = self.actor.take_commands()

    def send(self, **event: object) -> list[ep.EngineInput]:
        self.actor.receive(parse_command(json.dumps(event)), self.t)
        return self.actor.take_commands()

    def engine(self, *outs: ep.EngineOutput) -> list[ep.EngineInput]:
        for out in outs:
            self.actor.on_engine(out, self.t)
        return self.actor.take_commands()

    def wire(self) -> list[dict]:
        return [w for w in (render(e, Dialect.GA) for e in self.actor.take_events()) if w]


def spoken_turn(s: Script, item: str = "item_u1") -> list[ep.EngineInput]:
    cmds = s.engine(ep.VoiceStarted("s1", 300, item),
                    ep.TranscriptPartial("s1", item, "What is"),
                    ep.TranscriptPartial("s1", item, "What is the capital"))
    s.t += 2.0
    cmds += s.engine(ep.VoiceStopped("s1", 2100, item))
    cmds += s.engine(ep.TranscriptFinal("s1", item, "What is the capital of France?"))
    return cmds


def test_intent_transcription_starts_a_transcription_session_that_validates_strictly():
    settings = session_for_intent("transcription", SessionSettings(model="voxline"))
    s = Script(settings)
    opened = s.commands[0]
    assert isinstance(opened, ep.OpenStream)
    assert opened.config.auto_response is None  # no reply, speculative or warm, ever
    assert opened.config.transcribe_partials
    s.send(type="session.update", session={
        "type": "transcription", "include": ["item.input_audio_transcription.logprobs"],
        "audio": {"input": {"transcription": {"model": "moonshine-base-en", "language": "en"},
                            "noise_reduction": {"type": "near_field"},
                            "turn_detection": {"type": "server_vad",
                                               "silence_duration_ms": 400}}}})
    cmds = spoken_turn(s)
    assert not [c for c in cmds if isinstance(c, ep.CreateResponse)]
    wire = s.wire()
    assert [p for w in wire for p in strict_problems(w, "ga")] == []
    types = [w["type"] for w in wire]
    assert types == [
        "session.created", "session.updated",
        "input_audio_buffer.speech_started",
        "conversation.item.input_audio_transcription.delta",
        "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.completed", "conversation.item.done"]
    created, updated = wire[0]["session"], wire[1]["session"]
    assert created["type"] == "transcription" and created["object"] == (
        "realtime.transcription_session")
    assert set(created) == {"id", "object", "type", "audio", "include"}
    assert updated["include"] == ["item.input_audio_transcription.logprobs"]
    assert updated["audio"]["input"]["transcription"] == {"model": "moonshine-base-en",
                                                         "language": "en"}
    assert updated["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 400
    deltas = "".join(w["delta"] for w in wire if w["type"].endswith("transcription.delta"))
    assert deltas == wire[-2]["transcript"] == "What is the capital of France?"


def test_response_create_is_refused_by_name_and_the_session_goes_on():
    s = Script(SessionSettings.transcription_session())
    s.wire()
    cmds = s.send(type="response.create", event_id="evt_r")
    assert not [c for c in cmds if isinstance(c, ep.CreateResponse)]
    err, = s.wire()
    assert err["type"] == "error" and err["error"]["event_id"] == "evt_r"
    assert err["error"]["message"].startswith("response.create: a transcription session")
    assert err["error"]["param"] == "type"
    assert not strict_problems(err, "ga")
    spoken_turn(s)
    assert "conversation.item.input_audio_transcription.completed" in [
        w["type"] for w in s.wire()]


def test_manual_commits_are_transcribed():
    s = Script(SessionSettings.transcription_session())
    s.send(type="session.update", session={"type": "transcription",
                                           "audio": {"input": {"turn_detection": None}}})
    s.wire()
    pcm = b"\x00\x01" * 24000  # one second of 24 kHz PCM16
    s.send(type="input_audio_buffer.append", audio=base64.b64encode(pcm).decode())
    cmds = s.send(type="input_audio_buffer.commit")
    commit, = [c for c in cmds if isinstance(c, ep.CommitAudio)]
    s.engine(ep.TranscriptFinal("s1", commit.item_id, "Hello there."))
    wire = s.wire()
    assert [w["type"] for w in wire] == [
        "input_audio_buffer.committed", "conversation.item.added",
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.completed", "conversation.item.done"]
    assert wire[3]["usage"]["type"] == "duration"
    assert wire[3]["usage"]["seconds"] == pytest.approx(1.0, abs=0.05)  # the resampler's lag
    assert [p for w in wire for p in strict_problems(w, "ga")] == []


def test_a_realtime_session_may_become_a_transcription_session_until_it_has_begun():
    s = Script(SessionSettings())
    s.send(type="session.update", session={"type": "transcription"})
    updated = s.wire()[-1]["session"]
    assert updated["type"] == "transcription"
    assert updated["audio"]["input"]["transcription"] == {"model": None}  # on by default
    cmds = s.send(type="session.update", session={
        "type": "transcription", "audio": {"input": {"transcription": None}}})
    err = s.wire()[-1]["error"]
    assert err["param"] == "session.audio.input.transcription" and not cmds
    spoken_turn(s)
    s.wire()
    s.send(type="session.update", session={"type": "realtime"})
    err = s.wire()[-1]["error"]
    assert err["param"] == "session.type" and "once the conversation has begun" in err["message"]


def test_a_client_secret_and_a_call_can_carry_a_transcription_session():
    settings = settings_from_session({"type": "transcription", "audio": {"input": {
        "turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}})
    assert settings.kind == "transcription" and settings.transcription is not None
    assert not settings.responds
    # the intent keeps a secret's transcription session as it is
    assert session_for_intent("transcription", settings) is settings
    with pytest.raises(ProtocolError) as bad:
        session_for_intent("translate-everything", SessionSettings())
    assert bad.value.param == "intent"


def test_idle_timeout_answers_nothing_in_a_transcription_session():
    s = Script(SessionSettings.transcription_session())
    s.send(type="session.update", session={"type": "transcription", "audio": {"input": {
        "turn_detection": {"type": "server_vad", "idle_timeout_ms": 5000}}}})
    s.wire()
    for _ in range(400):
        s.t += 0.02
        s.actor.tick(s.t)
    assert s.actor.response is None and s.wire() == []
    assert not [c for c in s.actor.take_commands() if isinstance(c, ep.CreateResponse)]
