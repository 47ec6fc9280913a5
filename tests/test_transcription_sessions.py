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


def _tok(text: str, logprob: float) -> ep.TokenLogprob:
    return ep.TokenLogprob(text, logprob, text.encode())


QUESTION_TOKENS = [_tok(" What", -0.1), _tok(" is", -0.05), _tok(" the", -0.2),
                   _tok(" capit", -0.7), _tok("al", -0.01), _tok(" of", -0.1),
                   _tok(" France", -0.3), _tok("?", -0.02)]


def scored_turn(s: Script, item: str = "item_u1") -> None:
    """A turn whose engine outputs carry token log-probabilities (the stream asked)."""
    s.engine(ep.VoiceStarted("s1", 300, item),
             ep.TranscriptPartial("s1", item, "What is", QUESTION_TOKENS[:2]),
             ep.TranscriptPartial("s1", item, "What is the capital", QUESTION_TOKENS[:5]))
    s.t += 2.0
    s.engine(ep.VoiceStopped("s1", 2100, item))
    s.engine(ep.TranscriptFinal("s1", item, "What is the capital of France?", 80.0,
                                QUESTION_TOKENS))


@pytest.mark.parametrize("dialect", ["ga", "beta"])
def test_include_logprobs_puts_each_deltas_tokens_on_it(dialect: str):
    s = Script(SessionSettings.transcription_session())
    if dialect == "ga":
        cmds = s.send(type="session.update", session={
            "type": "transcription", "include": ["item.input_audio_transcription.logprobs"]})
    else:
        cmds = s.send(type="transcription_session.update", session={
            "include": ["item.input_audio_transcription.logprobs"]})
    config, = [c for c in cmds if isinstance(c, ep.UpdateStream)]
    assert config.config.transcription_logprobs
    scored_turn(s)
    wire = [w for w in (render(e, Dialect(dialect)) for e in s.actor.take_events()) if w]
    assert [p for w in wire for p in strict_problems(w, dialect)] == []
    deltas = [w for w in wire if w["type"].endswith("transcription.delta")]
    completed, = [w for w in wire if w["type"].endswith("transcription.completed")]
    # each delta carries the tokens of its own words, once; the transcript carries all
    assert [d["delta"] for d in deltas] == ["What is", " the capital of France?"]
    assert [[lp["token"] for lp in d["logprobs"]] for d in deltas] == [
        [" What", " is"], [" the", " capit", "al", " of", " France", "?"]]
    assert [lp["logprob"] for lp in completed["logprobs"]] == [t.logprob for t in QUESTION_TOKENS]
    assert completed["logprobs"][3] == {"token": " capit", "logprob": -0.7,
                                        "bytes": list(b" capit")}


def test_without_include_no_event_carries_logprobs():
    s = Script(SessionSettings.transcription_session())
    cmd, = [c for c in s.commands if isinstance(c, ep.OpenStream)]
    assert not cmd.config.transcription_logprobs
    s.wire()
    spoken_turn(s)
    assert not [w for w in s.wire() if "logprobs" in w]


def test_beta_transcription_session_events_validate_against_the_beta_types():
    """A beta client (openai-beta.realtime-v1) of a transcription session: its
    `transcription_session.update` and OpenAI's `transcription_session.created/updated`."""
    s = Script(session_for_intent("transcription", SessionSettings(model="voxline")))
    s.send(type="transcription_session.update", event_id="evt_t", session={
        "input_audio_format": "g711_ulaw",
        "input_audio_transcription": {"model": "whisper-1", "language": "en"},
        "input_audio_noise_reduction": {"type": "far_field"},
        "turn_detection": {"type": "server_vad", "silence_duration_ms": 350},
        "include": ["item.input_audio_transcription.logprobs"]})
    spoken_turn(s)
    wire = [w for w in (render(e, Dialect.BETA) for e in s.actor.take_events()) if w]
    assert [p for w in wire for p in strict_problems(w, "beta")] == []
    created, updated = wire[0], wire[1]
    assert created["type"] == "transcription_session.created"
    assert updated["type"] == "transcription_session.updated"
    session = updated["session"]
    assert session["object"] == "realtime.transcription_session"
    assert session["input_audio_format"] == "g711_ulaw"
    assert session["input_audio_transcription"] == {"model": "whisper-1", "language": "en"}
    assert session["input_audio_noise_reduction"] == {"type": "far_field"}
    assert session["turn_detection"]["silence_duration_ms"] == 350
    assert session["include"] == ["item.input_audio_transcription.logprobs"]
    assert "client_secret" not in session
    assert "conversation.item.input_audio_transcription.completed" in [w["type"] for w in wire]
    # a realtime session's beta events keep their names
    r = Script(SessionSettings(model="voxline"))
    assert render(r.actor.take_events()[0], Dialect.BETA)["type"] == "session.created"


def test_beta_transcription_session_update_errors_name_the_field():
    s = Script(SessionSettings.transcription_session())
    s.wire()
    with pytest.raises(ProtocolError) as bad:
        parse_command({"type": "transcription_session.update", "event_id": "evt_x",
                       "session": {"input_audio_format": "mp3"}})
    assert bad.value.param == "session.input_audio_format" and bad.value.event_id == "evt_x"
    with pytest.raises(ProtocolError) as bad:
        parse_command({"type": "transcription_session.update",
                       "session": {"include": ["item.logprobs"]}})
    assert bad.value.param == "session.include[0]"
