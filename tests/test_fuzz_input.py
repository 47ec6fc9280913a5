"""Fuzzed client input (hypothesis): random JSON shapes, deep nesting, huge strings, wrong
types, invalid base64, NaN/inf, unicode edge cases, bursts; binary frames; Twilio messages.

Properties: parsing never raises anything but the protocol's own error; the session never
crashes and answers each bad event with an `error` naming the event (and the field, where
one is at fault); audio appended before a burst of bad events is still committed after it.
The pure layers run many examples; one bounded test goes over a real WebSocket server.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from voxline.config import load_settings
from voxline.engines import protocol as ep
from voxline.engines.client import InProcessEngineClient
from voxline.errors import ProtocolError
from voxline.realtime.app import create_app
from voxline.realtime.openai.client_events import CLIENT_EVENT_TYPES, parse_command
from voxline.realtime.openai.dialect import Dialect
from voxline.realtime.openai.server_events import render_json
from voxline.realtime.transports.twilio_wire import (
    Connected,
    Dtmf,
    Mark,
    Media,
    Start,
    Stop,
    TwilioMessageError,
    parse_message,
)
from voxline.sessions import events as ev
from voxline.sessions.actor import SessionActor

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
FEW = settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))

EVENT_TYPES = sorted(CLIENT_EVENT_TYPES)
FIELDS = ["type", "event_id", "audio", "session", "item", "response", "item_id", "content_index",
          "audio_end_ms", "previous_item_id", "response_id", "instructions", "turn_detection",
          "audio", "input", "output", "format", "rate", "voice", "tools", "content", "role",
          "text", "output_modalities", "modalities", "temperature", "max_output_tokens",
          "threshold", "silence_duration_ms", "conversation", "metadata", "name", "call_id"]

# unicode edge cases: surrogates, NUL, BOM, RTL, combining marks, astral planes
EDGY = st.sampled_from(["", "\x00", "\ud800", "\udfff", "\ufeff", "\u202e", "e\u0301" * 50,
                        "\U0001f600" * 10, "\uffff", "\\", '"', "null", "NaN", "-0", "1e309"])
HUGE = st.sampled_from(["\u00e9" * 1000, "a" * 70_000, "b" * 1_000_000])
STRINGS = st.one_of(st.text(max_size=40), EDGY, HUGE)
NUMBERS = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e308]))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, STRINGS)
JSON = st.recursive(
    SCALARS,
    lambda kids: st.one_of(st.lists(kids, max_size=5),
                           st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=8)),
                                           kids, max_size=6)),
    max_leaves=30,
)
BAD_B64 = st.one_of(st.text(max_size=60), st.sampled_from(["=", "A", "AAA", "AA=A", "****", "\ud800"]),
                    st.binary(max_size=30).map(lambda b: base64.b64encode(b).decode() + "!"))


@st.composite
def client_events(draw: st.DrawFn) -> Any:
    """A client event of a real type with fields of random shapes (mostly invalid)."""
    event: dict[str, Any] = {"type": draw(st.sampled_from(EVENT_TYPES))}
    for key in draw(st.lists(st.sampled_from(FIELDS), max_size=5)):
        event[key] = draw(JSON)
    if draw(st.booleans()):
        event["event_id"] = draw(st.one_of(st.text(max_size=10), JSON))
    if event["type"] == "input_audio_buffer.append" and draw(st.booleans()):
        event["audio"] = draw(BAD_B64)
    return event


def _nested(depth: int, kind: str) -> str:
    if kind == "list":
        return "[" * depth + "]" * depth
    if kind == "object":
        return '{"a":' * depth + "1" + "}" * depth
    inner = '{"x":' * depth + "1" + "}" * depth  # deep inside a real event's field
    return '{"type": "session.update", "session": ' + inner + "}"


RAW = st.one_of(
    client_events().map(lambda e: json.dumps(e, allow_nan=True)),
    JSON.map(lambda v: json.dumps(v, allow_nan=True)),
    st.text(max_size=200),
    st.binary(max_size=200),
    st.tuples(st.sampled_from([30, 300, 3000, 100_000]),
              st.sampled_from(["list", "object", "event"])).map(
        lambda a: _nested(*a)),
    st.just('{"type": "input_audio_buffer.append", "audio": NaN}'),
    st.just('{"type": "conversation.item.truncate", "item_id": "x", "content_index": Infinity, '
            '"audio_end_ms": -Infinity}'),
)


def make_actor() -> SessionActor:
    actor = SessionActor("sess_1", "s1")
    actor.start(0.0)
    actor.take_events()
    actor.take_commands()
    return actor


def feed(actor: SessionActor, raw: str | bytes, now: float = 1.0) -> ProtocolError | None:
    """One message through parsing and the actor, as a transport does it."""
    try:
        command = parse_command(raw)
    except ProtocolError as exc:
        actor.protocol_error(exc)
        return exc
    actor.receive(command, now)
    return None


def _known_type(raw: str | bytes) -> str | None:
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    t = obj.get("type") if isinstance(obj, dict) else None
    return t if isinstance(t, str) and t in CLIENT_EVENT_TYPES else None


@FUZZ
@given(RAW)
def test_any_message_is_a_command_or_an_error_that_names_the_event_and_field(raw):
    actor = make_actor()
    exc = feed(actor, raw)
    events = actor.take_events()
    assert_renders_on_the_wire(events)
    errors = [e for e in events if isinstance(e, ev.ErrorEvent)]
    if exc is None:  # a valid event (or one the actor refused with its own error)
        assert all(e.error.message and e.error.code for e in errors), errors
        return
    assert len(errors) == 1 and errors[0].error.message
    event_type = _known_type(raw)
    if event_type is not None:
        assert event_type in errors[0].error.message
        if exc.code in ("invalid_type", "missing_required_parameter"):
            assert errors[0].error.param  # the field at fault


NEVER_CREATED = "item_never_created_by_a_burst_of_fuzzed_events"  # longer than any drawn text


def assert_renders_on_the_wire(events: list[ev.ServerEvent]) -> None:
    """Every event has its own id and goes out as a UTF-8 text frame in the GA dialect."""
    assert len({e.event_id for e in events}) == len(events)
    for e in events:
        frame = render_json(e, Dialect.GA)
        assert frame is not None, type(e).__name__
        assert json.loads(frame.encode("utf-8"))["event_id"] == e.event_id


@FEW
@given(st.lists(client_events(), min_size=1, max_size=30))
def test_a_burst_of_events_never_crashes_the_actor(burst):
    actor = make_actor()
    seen: list[ev.ServerEvent] = []
    for i, event in enumerate(burst):
        raw = json.dumps(event, allow_nan=True)
        exc = feed(actor, raw, now=1.0 + i / 1000)
        got = actor.take_events()
        errors = [e for e in got if isinstance(e, ev.ErrorEvent)]
        assert all(e.error.message and e.error.code for e in errors), errors
        if exc is not None:  # refused in parsing: exactly one error, naming the event
            assert len(errors) == 1 and len(got) == 1, got
            event_type = _known_type(raw)
            assert event_type is None or event_type in errors[0].error.message
        actor.tick(1.0 + i / 1000)
        seen += got + actor.take_events()
    assert_renders_on_the_wire(seen)
    # the session lives on: a valid probe after the burst is answered, and only it
    feed(actor, json.dumps({"type": "conversation.item.retrieve", "item_id": NEVER_CREATED,
                            "event_id": "probe"}), now=2.0)
    answer, = actor.take_events()
    assert isinstance(answer, ev.ErrorEvent)
    assert answer.error.event_id == "probe" and NEVER_CREATED in answer.error.message


PCM = (2000 * np.sin(np.arange(4800) / 7)).astype("<i2").tobytes()  # 200 ms at 24 kHz


def _bad_only(raws: list[str | bytes]) -> list[str | bytes]:
    """Keep only messages that parse to an error (valid ones may legally clear the buffer)."""
    bad = []
    for raw in raws:
        try:
            parse_command(raw)
        except ProtocolError:
            bad.append(raw)
    return bad


@FEW
@given(st.lists(RAW, min_size=1, max_size=20))
def test_audio_appended_before_bad_events_is_still_committed(raws):
    actor = make_actor()
    actor.receive(parse_command(json.dumps({"type": "session.update", "session": {
        "type": "realtime", "audio": {"input": {"turn_detection": None}}}})), 0.5)
    actor.take_events()
    actor.take_commands()
    feed(actor, json.dumps({"type": "input_audio_buffer.append",
                            "audio": base64.b64encode(PCM).decode()}))
    sent = b"".join(c.audio for c in actor.take_commands() if isinstance(c, ep.AppendAudio))
    bad = _bad_only(raws)
    for raw in bad:
        assert feed(actor, raw) is not None
    errors = [e for e in actor.take_events() if isinstance(e, ev.ErrorEvent)]
    assert len(errors) == len(bad)  # one error per bad event
    assert not actor.take_commands()  # nothing reached the engine's buffer
    feed(actor, '{"type": "input_audio_buffer.commit"}')
    commands = actor.take_commands()
    assert [type(c) for c in commands] == [ep.CommitAudio]
    assert any(isinstance(e, ev.InputAudioCommitted) for e in actor.take_events())
    # everything that went to the engine (200 ms less the resampler's tail) is in the turn
    assert actor.turn_ms[commands[0].item_id] == len(sent) / 4 / 16 > 150


TWILIO_EVENTS = ["connected", "start", "media", "dtmf", "mark", "stop", "other"]
TWILIO_TYPES = {"connected": Connected, "start": Start, "media": Media, "dtmf": Dtmf,
                "mark": Mark, "stop": Stop}


@st.composite
def twilio_messages(draw: st.DrawFn) -> Any:
    event = draw(st.sampled_from(TWILIO_EVENTS))
    msg: dict[str, Any] = {"event": event}
    if draw(st.booleans()):
        msg["streamSid"] = draw(st.one_of(st.text(max_size=10), JSON))
    body: Any = draw(st.one_of(JSON, st.dictionaries(
        st.sampled_from(["payload", "callSid", "mediaFormat", "customParameters", "tracks",
                         "digit", "name", "track", "chunk", "timestamp", "encoding",
                         "sampleRate", "channels"]),
        st.one_of(JSON, BAD_B64, st.dictionaries(st.sampled_from(
            ["encoding", "sampleRate", "channels"]), JSON)), max_size=6)))
    msg[event] = body
    return msg


@FUZZ
@given(st.one_of(twilio_messages().map(lambda m: json.dumps(m, allow_nan=True)),
                 JSON.map(lambda v: json.dumps(v, allow_nan=True)),
                 st.text(max_size=100), st.binary(max_size=100),
                 st.sampled_from([30, 3000, 100_000]).map(lambda d: "[" * d + "]" * d)))
def test_twilio_messages_parse_or_raise_the_adapters_error(raw):
    try:
        msg = parse_message(raw)
    except TwilioMessageError as exc:
        assert str(exc)
        return
    data = json.loads(raw)  # parsed: a JSON object naming its event
    assert type(msg) is TWILIO_TYPES.get(data["event"], type(None)), (msg, data)
    if msg is not None and not isinstance(msg, Connected):
        assert msg.stream_sid == data["streamSid"]


def test_the_server_answers_a_burst_of_malformed_events_and_keeps_the_session():
    app = create_app(load_settings(), InProcessEngineClient("echo_core:make_echo_core"))
    junk = [("session", 1), ("item", "x"), ("audio", "!!*"), ("item_id", 5), ("response", []),
            ("audio_end_ms", math.nan), ("content_index", math.inf), ("session", {"type": "\ud800"})]
    burst: list[str | bytes] = [json.dumps({"type": t, "event_id": f"e-{t}", k: v})
                                for t in EVENT_TYPES for k, v in junk]
    burst += [_nested(d, k) for d in (300, 100_000) for k in ("list", "object", "event")]
    burst += ["", "{", "null", '{"type": 1}', '{"type": "nope"}', "\ud800", "a" * 1_000_000]
    with TestClient(app) as client, client.websocket_connect("/v1/realtime") as ws:
        assert ws.receive_json()["type"] == "session.created"
        ws.send_json({"type": "session.update", "session": {
            "type": "realtime", "audio": {"input": {"turn_detection": None}}}})
        assert ws.receive_json()["type"] == "session.updated"
        ws.send_json({"type": "input_audio_buffer.append", "audio": base64.b64encode(PCM).decode()})
        bad = _bad_only(burst) + [b"\x00\xff binary", b""]
        for i, raw in enumerate(bad):
            (ws.send_bytes if isinstance(raw, bytes) else ws.send_text)(raw)
            if i % 50 == 0:  # and a valid probe now and then, answered in order
                ws.send_json({"type": "conversation.item.retrieve", "item_id": "nope",
                              "event_id": f"probe{i}"})
        errors = [ws.receive_json() for _ in range(len(bad) + len(range(0, len(bad), 50)))]
        assert all(e["type"] == "error" and e["error"]["message"] for e in errors)
        named = [e["error"] for e in errors if (e["error"]["event_id"] or "").startswith("e-")]
        assert named and all(e["event_id"][2:] in e["message"] for e in named)
        probes = [e["error"]["event_id"] for e in errors
                  if e["error"]["code"] == "item_retrieve_invalid_item_id"]
        assert probes == [f"probe{i}" for i in range(0, len(bad), 50)]
        ws.send_json({"type": "input_audio_buffer.commit"})
        committed = ws.receive_json()  # the audio sent before the burst is all there
        assert committed["type"] == "input_audio_buffer.committed"
        print(f"server: {len(bad)} malformed events, {len(errors)} errors, session alive")
