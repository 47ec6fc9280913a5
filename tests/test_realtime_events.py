"""The OpenAI Realtime wire of /v1/realtime: parsing, errors, session settings, rendering.

Over 600 lines on purpose: it is a table of wire cases (every client event, every error
path, both dialects), read by scanning, and splitting it would scatter the table."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

import pytest

from voxline.errors import ProtocolError
from voxline.realtime.openai.client_events import (
    ConversationItemCreate,
    ConversationItemDelete,
    ConversationItemRetrieve,
    ConversationItemTruncate,
    InputAudioBufferAppend,
    InputAudioBufferClear,
    InputAudioBufferCommit,
    MessageItemWire,
    OutputAudioBufferClear,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
    parse_client_event,
)
from voxline.realtime.openai.dialect import Dialect, detect_dialect
from voxline.realtime.openai.server_events import render, render_json, wire_type
from voxline.realtime.openai.session_object import render_session, settings_from_wire
from voxline.sessions import events as mcp_ev
from voxline.sessions.events import (
    SERVER_EVENT_CLASSES,
    AudioDelta,
    AudioDone,
    AudioTranscriptDelta,
    AudioTranscriptDone,
    ContentPartAdded,
    ContentPartDone,
    ConversationCreated,
    DtmfEventReceived,
    ErrorEvent,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    InputAudioCleared,
    InputAudioCommitted,
    InputAudioTimeoutTriggered,
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    InputTranscriptionFailed,
    ItemAdded,
    ItemDeleted,
    ItemDone,
    ItemRetrieved,
    ItemTruncated,
    OutputAudioBufferCleared,
    OutputAudioBufferStarted,
    OutputAudioBufferStopped,
    OutputItemAdded,
    OutputItemDone,
    RateLimitsUpdated,
    ResponseCreated,
    ResponseDone,
    ServerEvent,
    SessionCreated,
    SessionUpdated,
    SpeechStarted,
    SpeechStopped,
    TextDelta,
    TextDone,
)
from voxline.sessions.items import (
    ContentPart,
    ErrorDetail,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    RateLimit,
    RealtimeResponse,
    ResponseUsage,
)
from voxline.sessions.settings import (
    AUDIO_MODALITIES,
    DEFAULT_TEMPERATURE,
    TEXT_MODALITIES,
    AudioFormat,
    SessionSettings,
    Transcription,
    TurnDetection,
    merge_session,
)


def changes(obj: dict[str, Any]) -> dict[str, Any]:
    """The settings-document patch of a session.update event."""
    return parse(obj).session.changes()


def parse(obj: dict[str, Any]):
    return parse_client_event(json.dumps(obj))


def error_of(raw: str | bytes | dict[str, Any]) -> ProtocolError:
    if isinstance(raw, dict):
        raw = json.dumps(raw)
    with pytest.raises(ProtocolError) as info:
        parse_client_event(raw)
    return info.value


# ---------------------------------------------------------------------------------------
# Client events: both dialects
# ---------------------------------------------------------------------------------------

GA_SESSION_UPDATE = {
    "type": "session.update",
    "event_id": "evt_1",
    "session": {
        "type": "realtime",
        "model": "gpt-realtime",
        "instructions": "be brief",
        "output_modalities": ["audio"],
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "transcription": {"model": "whisper-1", "language": "en"},
                "turn_detection": {
                    "type": "server_vad",
                    "threshold": 0.6,
                    "prefix_padding_ms": 200,
                    "silence_duration_ms": 400,
                    "create_response": True,
                    "interrupt_response": False,
                    "idle_timeout_ms": 6000,
                },
                "noise_reduction": {"type": "near_field"},
            },
            "output": {"format": {"type": "audio/pcmu"}, "voice": "marin", "speed": 1.2},
        },
        "max_output_tokens": 512,
        "tool_choice": "auto",
        "tools": [],
        "tracing": None,
        "truncation": "auto",
    },
}

BETA_SESSION_UPDATE = {
    "type": "session.update",
    "event_id": "evt_2",
    "session": {
        "modalities": ["text", "audio"],
        "instructions": "be brief",
        "voice": "alloy",
        "input_audio_format": "g711_alaw",
        "output_audio_format": "pcm16",
        "input_audio_transcription": {"model": "whisper-1"},
        "turn_detection": {"type": "server_vad", "threshold": 0.4, "silence_duration_ms": 700},
        "temperature": 0.7,
        "max_response_output_tokens": "inf",
    },
}


def test_session_update_ga() -> None:
    ev = parse(GA_SESSION_UPDATE)
    assert isinstance(ev, SessionUpdate)
    assert ev.event_id == "evt_1"
    s = SessionSettings().apply(ev.session.changes())
    assert s.model == "gpt-realtime"
    assert s.output_format == AudioFormat("ulaw", 8000)
    assert s.turn_detection == TurnDetection(
        threshold=0.6, prefix_padding_ms=200, silence_duration_ms=400,
        interrupt_response=False, idle_timeout_ms=6000,
    )
    assert s.transcription == Transcription("whisper-1", "en")
    assert s.transcription_enabled and s.transcription_model == "whisper-1"
    assert s.noise_reduction == "near_field"
    assert (s.voice, s.speed, s.max_output_tokens) == ("marin", 1.2, 512)
    assert ev.dialect_hint() is Dialect.GA


def test_session_update_beta() -> None:
    ev = parse(BETA_SESSION_UPDATE)
    assert isinstance(ev, SessionUpdate)
    s = SessionSettings().apply(ev.session.changes())
    assert s.input_format == AudioFormat("alaw", 8000)
    assert s.output_format == AudioFormat("pcm16", 24000)
    assert s.output_modalities == AUDIO_MODALITIES and s.audio_output
    assert s.turn_detection == TurnDetection(threshold=0.4, silence_duration_ms=700)
    assert (s.temperature, s.max_output_tokens) == (0.7, None)
    assert ev.dialect_hint() is Dialect.BETA


@pytest.mark.parametrize(
    ("obj", "cls"),
    [
        ({"type": "input_audio_buffer.append", "audio": "AAAA"}, InputAudioBufferAppend),
        ({"type": "input_audio_buffer.commit"}, InputAudioBufferCommit),
        ({"type": "input_audio_buffer.clear"}, InputAudioBufferClear),
        ({"type": "conversation.item.retrieve", "item_id": "item_1"}, ConversationItemRetrieve),
        ({"type": "conversation.item.delete", "item_id": "item_1"}, ConversationItemDelete),
        (
            {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0,
             "audio_end_ms": 1500},
            ConversationItemTruncate,
        ),
        ({"type": "response.cancel"}, ResponseCancel),
        ({"type": "response.cancel", "response_id": "resp_1"}, ResponseCancel),
        ({"type": "response.create"}, ResponseCreate),
        ({"type": "output_audio_buffer.clear"}, OutputAudioBufferClear),
    ],
)
def test_simple_client_events(obj: dict[str, Any], cls: type) -> None:
    ev = parse({**obj, "event_id": "client_7"})
    assert type(ev) is cls
    assert ev.event_id == "client_7"
    assert type(parse(obj)).__name__ == cls.__name__  # event_id optional
    assert parse(obj).event_id is None


def test_append_keeps_base64_text() -> None:
    ev = parse({"type": "input_audio_buffer.append", "audio": "not decoded here!"})
    assert ev.audio == "not decoded here!"


def test_bytes_input_and_extra_fields_ignored() -> None:
    raw = json.dumps({"type": "input_audio_buffer.commit", "zzz": 1, "event_id": "e"}).encode()
    assert isinstance(parse_client_event(raw), InputAudioBufferCommit)
    ev = parse({"type": "session.update", "session": {"unknown_knob": {"x": 1}, "voice": "ash"}})
    assert ev.session.voice == "ash"


@pytest.mark.parametrize(
    ("item", "role", "types", "hint"),
    [
        # GA user/system/assistant
        ({"type": "message", "role": "user",
          "content": [{"type": "input_text", "text": "hi"}, {"type": "input_audio", "audio": "AA=="}]},
         "user", ["input_text", "input_audio"], None),
        ({"type": "message", "role": "system", "content": [{"type": "input_text", "text": "sys"}]},
         "system", ["input_text"], None),
        ({"type": "message", "role": "assistant",
          "content": [{"type": "output_text", "text": "ok"}]},
         "assistant", ["output_text"], Dialect.GA),
        # beta aliases resolve by role
        ({"type": "message", "role": "assistant", "content": [{"type": "text", "text": "ok"}]},
         "assistant", ["output_text"], Dialect.BETA),
        ({"type": "message", "role": "assistant",
          "content": [{"type": "audio", "transcript": "ok"}]},
         "assistant", ["output_audio"], Dialect.BETA),
        ({"type": "message", "role": "user", "content": [{"type": "text", "text": "hi"}]},
         "user", ["input_text"], None),
    ],
)
def test_conversation_item_create(item: dict, role: str, types: list[str], hint) -> None:
    ev = parse({"type": "conversation.item.create", "previous_item_id": "root", "item": item})
    assert isinstance(ev, ConversationItemCreate)
    assert isinstance(ev.item, MessageItemWire)
    assert ev.dialect_hint() is hint
    command = ev.to_command()  # what the session gets: the canonical item
    assert isinstance(command.item, MessageItem)
    assert command.item.role == role
    assert [p.type for p in command.item.content] == types
    assert command.previous_item_id == "root"
    assert command.item.id is None and command.item.with_id().id.startswith("item_")


def test_function_items() -> None:
    ev = parse({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": "c1", "output": "{}"}})
    assert isinstance(ev.item, FunctionCallOutputItem)
    ev = parse({"type": "conversation.item.create", "item": {
        "type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": "x"}})
    assert isinstance(ev.item, FunctionCallItem) and ev.item.with_id().id == "x"


def test_response_create_ga_and_beta_overrides() -> None:
    base = SessionSettings()
    ga = parse({"type": "response.create", "response": {
        "instructions": "shout", "output_modalities": ["text"], "max_output_tokens": 100,
        "conversation": "none", "metadata": {"k": "v"},
        "audio": {"output": {"voice": "cedar", "format": {"type": "audio/pcma"}}},
    }})
    beta = parse({"type": "response.create", "response": {
        "instructions": "shout", "modalities": ["text"], "max_response_output_tokens": 100,
        "conversation": "none", "metadata": {"k": "v"}, "voice": "cedar",
        "output_audio_format": "g711_alaw", "temperature": 0.9,
    }})
    assert ga.dialect_hint() is Dialect.GA and beta.dialect_hint() is Dialect.BETA
    for ev in (ga, beta):
        r = ev.to_command().overrides
        assert r.out_of_band and r.metadata == {"k": "v"}
        s = r.apply_to(base)
        assert s.instructions == "shout"
        assert s.output_modalities == TEXT_MODALITIES and not s.audio_output
        assert s.max_output_tokens == 100 and s.voice == "cedar"
        assert s.output_format == AudioFormat("alaw", 8000)
    assert beta.to_command().overrides.apply_to(base).temperature == 0.9
    assert base == SessionSettings()  # overrides never touch the session's settings
    assert ResponseCreate(type="response.create").dialect_hint() is None


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------


def test_invalid_json() -> None:
    err = error_of("{not json")
    assert err.code == "invalid_json" and err.event_id is None
    assert error_of(b"\xff\xfe").code == "invalid_json"
    assert error_of("").code == "invalid_json"


def test_not_an_object() -> None:
    err = error_of("[1, 2]")
    assert err.code == "invalid_request_error"
    assert "object" in str(err) and "array" in str(err)


def test_missing_and_unknown_type() -> None:
    err = error_of({"event_id": "e1", "audio": "AA"})
    assert (err.code, err.param, err.event_id) == ("invalid_request_error", "type", "e1")
    err = error_of({"event_id": "e2", "type": 3})
    assert (err.code, err.param, err.event_id) == ("invalid_request_error", "type", "e2")
    err = error_of({"event_id": "e3", "type": "response.frobnicate"})
    assert (err.code, err.param, err.event_id) == ("unknown_event", "type", "e3")
    assert "'response.frobnicate'" in str(err)


@pytest.mark.parametrize(
    ("obj", "code", "param"),
    [
        ({"type": "conversation.item.delete"}, "missing_required_parameter", "item_id"),
        ({"type": "input_audio_buffer.append"}, "missing_required_parameter", "audio"),
        ({"type": "session.update"}, "missing_required_parameter", "session"),
        ({"type": "input_audio_buffer.append", "audio": 5}, "invalid_type", "audio"),
        ({"type": "session.update", "session": "x"}, "invalid_type", "session"),
        ({"type": "session.update", "session": {"instructions": ["a"]}},
         "invalid_type", "session.instructions"),
        ({"type": "session.update", "session": {"turn_detection": {"create_response": 1}}},
         "invalid_type", "session.turn_detection.create_response"),
        ({"type": "session.update", "session": {"turn_detection": {"prefix_padding_ms": 1.5}}},
         "invalid_type", "session.turn_detection.prefix_padding_ms"),
        ({"type": "session.update", "session": {"turn_detection": {"threshold": "0.5"}}},
         "invalid_type", "session.turn_detection.threshold"),
        ({"type": "conversation.item.truncate", "item_id": "i", "content_index": 0},
         "missing_required_parameter", "audio_end_ms"),
        ({"type": "conversation.item.create", "item": {"role": "user", "content": []}},
         "missing_required_parameter", "item.type"),
        ({"type": "conversation.item.create", "item": {"type": "message", "content": []}},
         "missing_required_parameter", "item.role"),
        ({"type": "conversation.item.create",
          "item": {"type": "message", "role": "user", "content": [{"type": "input_text"}]}},
         "missing_required_parameter", "item.content[0].text"),
        ({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
          "content": [{"type": "input_text", "text": "a"}, {"type": "output_audio"}]}},
         "invalid_value", "item.content[1].type"),
        ({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
          "content": [{"type": "input_image"}]}},
         "missing_required_parameter", "item.content[0].image_url"),
        ({"type": "conversation.item.create", "item": {"type": "message", "role": "system",
          "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}},
         "invalid_value", "item.content[0].type"),
        ({"type": "conversation.item.create", "item": {"type": "note"}},
         "invalid_value", "item.type"),
        ({"type": "response.create", "response": {"conversation": "conv_x"}},
         "invalid_value", "response.conversation"),
        ({"type": "response.create", "response": {"output_modalities": []}},
         "invalid_value", "response.output_modalities"),
        ({"type": "response.create", "response": {"modalities": ["text", "video"]}},
         "invalid_value", "response.modalities[1]"),
        ({"type": "response.create", "response": {"max_output_tokens": "lots"}},
         "invalid_type", "response.max_output_tokens"),
    ],
)
def test_field_errors(obj: dict, code: str, param: str) -> None:
    err = error_of({**obj, "event_id": "evt_bad"})
    assert (err.code, err.param) == (code, param)
    assert err.event_id == "evt_bad"
    # OpenAI's wording opens the message where it has one, then voxline's detail
    openai = {"missing_required_parameter": f"Missing required parameter: '{param}'. (",
              "invalid_type": f"Invalid type for '{param}': expected "}.get(code)
    assert (openai is not None and str(err).startswith(openai)
            or str(err).startswith(f"{obj['type']}: "))
    assert f"{obj['type']}: " in str(err)
    assert f"'{param}'" in str(err)


@pytest.mark.parametrize(
    ("session", "param", "needle"),
    [
        ({"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 1.5}}}},
         "session.audio.input.turn_detection.threshold", "less than or equal to 1"),
        ({"turn_detection": {"threshold": -0.1}}, "session.turn_detection.threshold", "greater"),
        ({"turn_detection": {"silence_duration_ms": -1}},
         "session.turn_detection.silence_duration_ms", "greater than or equal to 0"),
        ({"audio": {"input": {"turn_detection": {"idle_timeout_ms": -5}}}},
         "session.audio.input.turn_detection.idle_timeout_ms", "greater than or equal to 0"),
        ({"temperature": 2.5}, "session.temperature", "less than or equal to 2"),
        ({"temperature": -1}, "session.temperature", "greater than or equal to 0"),
        ({"speed": 3}, "session.speed", "less than or equal to 1.5"),
        ({"audio": {"output": {"speed": 0.1}}}, "session.audio.output.speed", "greater"),
        ({"max_output_tokens": 0}, "session.max_output_tokens", "between 1 and 4096"),
        ({"max_response_output_tokens": 5000}, "session.max_response_output_tokens", "4096"),
        ({"turn_detection": {"type": "push_to_talk"}}, "session.turn_detection.type",
         "'server_vad' or 'semantic_vad'"),
        ({"type": "translation"}, "session.type", "'realtime' or 'transcription'"),
    ],
)
def test_out_of_range_values(session: dict, param: str, needle: str) -> None:
    err = error_of({"type": "session.update", "event_id": "e9", "session": session})
    assert (err.code, err.param, err.event_id) == ("invalid_value", param, "e9")
    assert needle in str(err)
    assert str(err).startswith("session.update: invalid value for ")


@pytest.mark.parametrize(
    ("session", "param", "needle"),
    [
        ({"audio": {"input": {"format": {"type": "audio/opus"}}}},
         "session.audio.input.format.type", "'audio/opus'"),
        ({"audio": {"output": {"format": {"type": "audio/pcmu", "rate": 16000}}}},
         "session.audio.output.format.rate", "8000"),
        ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 44100}}}},
         "session.audio.input.format.rate", "44100"),
        ({"input_audio_format": "opus"}, "session.input_audio_format", "'pcm16'"),
        ({"output_audio_format": "g722"}, "session.output_audio_format", "'g711_ulaw'"),
    ],
)
def test_unknown_audio_formats(session: dict, param: str, needle: str) -> None:
    err = error_of({"type": "session.update", "session": session})
    assert (err.code, err.param) == ("invalid_value", param)
    assert needle in str(err)
    err = error_of({"type": "response.create", "response": {"output_audio_format": "mp3"}})
    assert err.param == "response.output_audio_format"


def test_event_id_of_wrong_type_is_reported_not_echoed() -> None:
    err = error_of({"type": "input_audio_buffer.clear", "event_id": 12})
    assert (err.code, err.param, err.event_id) == ("invalid_type", "event_id", None)


def test_error_event_from_protocol_error() -> None:
    err = error_of({"type": "conversation.item.delete", "event_id": "c1"})
    wire = render(ErrorEvent.from_exception(err), Dialect.GA)
    assert wire["type"] == "error" and wire["event_id"].startswith("event_")
    assert wire["error"] == {
        "type": "invalid_request_error",
        "code": "missing_required_parameter",
        "message": str(err),
        "param": "item_id",
        "event_id": "c1",
    }


# ---------------------------------------------------------------------------------------
# Session settings: defaults, round trips, merge
# ---------------------------------------------------------------------------------------


def test_defaults_are_openais() -> None:
    s = SessionSettings()
    td = render_session(s, Dialect.GA)["audio"]["input"]["turn_detection"]
    assert td == {
        "type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
        "silence_duration_ms": 500, "create_response": True, "interrupt_response": True,
        "idle_timeout_ms": None,
    }
    assert render_session(s, Dialect.GA)["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert render_session(s, Dialect.GA)["output_modalities"] == ["audio"]
    assert render_session(s, Dialect.GA)["max_output_tokens"] == "inf"
    beta = render_session(s, Dialect.BETA)
    assert beta["input_audio_format"] == beta["output_audio_format"] == "pcm16"
    assert beta["modalities"] == ["text", "audio"]
    assert beta["input_audio_transcription"] is None
    assert beta["turn_detection"]["threshold"] == 0.5
    assert s.transcription_enabled is False and s.temperature == DEFAULT_TEMPERATURE == 0.0  # voxline: greedy by default
    assert settings_from_wire({}) == s == settings_from_wire({})


FULL_GA = {
    "type": "realtime",
    "model": "gpt-realtime",
    "output_modalities": ["text"],
    "instructions": "hello",
    "audio": {
        "input": {
            "format": {"type": "audio/pcmu"},
            "transcription": {"model": "whisper-1", "language": "de", "prompt": "names"},
            "noise_reduction": {"type": "far_field"},
            "turn_detection": {
                "type": "server_vad", "threshold": 0.3, "prefix_padding_ms": 100,
                "silence_duration_ms": 250, "create_response": False,
                "interrupt_response": True, "idle_timeout_ms": 8000,
            },
        },
        "output": {"format": {"type": "audio/pcm", "rate": 16000}, "voice": "ash", "speed": 0.9},
    },
    "max_output_tokens": 1024,
    "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {}}],
    "tool_choice": "required",
    "tracing": "auto",
    "truncation": "disabled",
}

FULL_BETA = {
    "model": "gpt-4o-realtime-preview",
    "modalities": ["text", "audio"],
    "instructions": "hello",
    "voice": "verse",
    "speed": 1.1,
    "input_audio_format": "g711_ulaw",
    "output_audio_format": "g711_alaw",
    "input_audio_transcription": {"model": "gpt-4o-transcribe"},
    "input_audio_noise_reduction": {"type": "near_field"},
    "turn_detection": {"type": "semantic_vad", "eagerness": "low", "create_response": True,
                       "interrupt_response": False},
    "temperature": 0.6,
    "max_response_output_tokens": 200,
    "tools": [],
    "tool_choice": "none",
    "tracing": None,
}


def test_round_trip_ga() -> None:
    s = settings_from_wire(FULL_GA)
    assert render_session(s, Dialect.GA) == FULL_GA
    assert settings_from_wire(render_session(s, Dialect.GA)) == s
    assert settings_from_wire(FULL_GA) == s


def test_round_trip_beta() -> None:
    s = settings_from_wire(FULL_BETA)
    assert render_session(s, Dialect.BETA) == FULL_BETA
    assert settings_from_wire(render_session(s, Dialect.BETA)) == s
    assert s.turn_detection == TurnDetection(
        type="semantic_vad", eagerness="low", interrupt_response=False
    )


def test_cross_dialect_round_trip() -> None:
    """Rendering in the other dialect and reading back keeps what that dialect can express."""
    s = settings_from_wire(FULL_BETA)
    # GA sessions have no temperature: it falls back to the default
    assert settings_from_wire(render_session(s, Dialect.GA)) == replace(s, temperature=DEFAULT_TEMPERATURE)
    ga = settings_from_wire(FULL_GA)
    back = settings_from_wire(render_session(ga, Dialect.BETA))
    # beta has no truncation nor idle timeout, and its pcm16 is always 24 kHz
    assert back == replace(ga, truncation="auto", output_format=AudioFormat("pcm16", 24000),
                           turn_detection=replace(ga.turn_detection, idle_timeout_ms=None))


def test_from_ga_reports_invalid_session() -> None:
    with pytest.raises(ProtocolError) as info:
        settings_from_wire({"audio": {"input": {"turn_detection": {"threshold": 9}}}})
    assert info.value.param == "session.audio.input.turn_detection.threshold"


def test_merge_session() -> None:
    current = {"a": {"b": 1, "c": [1, 2]}, "td": {"type": "server_vad", "threshold": 0.5},
               "fmt": {"type": "audio/pcm", "rate": 24000}, "x": 1}
    snapshot = json.loads(json.dumps(current))
    patch = {"a": {"c": [3]}, "td": {"threshold": 0.7}, "fmt": {"type": "audio/pcmu"},
             "x": None, "new": {"k": 1}}
    merged = merge_session(current, patch)
    assert merged == {"a": {"b": 1, "c": [3]}, "td": {"type": "server_vad", "threshold": 0.7},
                      "fmt": {"type": "audio/pcmu"}, "x": None, "new": {"k": 1}}
    assert current == snapshot  # inputs untouched
    merged["new"]["k"] = 2
    assert patch["new"]["k"] == 1


def test_apply_merges_and_disables() -> None:
    s = settings_from_wire(FULL_GA)
    s2 = s.apply(changes({"type": "session.update", "session": {
        "audio": {"input": {"turn_detection": {"threshold": 0.9}}}}}))
    assert s2.turn_detection == TurnDetection(
        threshold=0.9, prefix_padding_ms=100, silence_duration_ms=250, create_response=False,
        idle_timeout_ms=8000,
    )
    assert s2.instructions == "hello" and s2.transcription == s.transcription
    # null turns features off; null on a plain field changes nothing
    s3 = s2.apply(changes({"type": "session.update", "session": {
        "turn_detection": None, "input_audio_transcription": None, "instructions": None,
        "tracing": None}}))
    assert s3.turn_detection is None and s3.transcription is None and s3.tracing is None
    assert s3.instructions == "hello"
    # idle timeout can be switched off alone
    s4 = s2.apply(changes({"type": "session.update", "session": {
        "turn_detection": {"idle_timeout_ms": None}}}))
    assert s4.turn_detection.idle_timeout_ms is None and s4.turn_detection.threshold == 0.9
    # a turn detection patch on a disabled one starts from defaults
    s5 = s3.apply(changes({"type": "session.update", "session": {
        "turn_detection": {"silence_duration_ms": 800}}}))
    assert s5.turn_detection == TurnDetection(silence_duration_ms=800)
    # switching variants replaces instead of merging
    s6 = s2.apply(changes({"type": "session.update", "session": {
        "turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}))
    assert s6.turn_detection == TurnDetection(type="semantic_vad", eagerness="high")


def test_ga_and_beta_patches_agree() -> None:
    ga = {"type": "realtime", "output_modalities": ["text"], "max_output_tokens": 50,
          "audio": {"input": {"format": {"type": "audio/pcma"},
                              "turn_detection": {"type": "server_vad", "threshold": 0.2}},
                    "output": {"voice": "echo", "speed": 1.3, "format": {"type": "audio/pcmu"}}}}
    beta = {"modalities": ["text"], "max_response_output_tokens": 50,
            "input_audio_format": "g711_alaw", "output_audio_format": "g711_ulaw",
            "turn_detection": {"type": "server_vad", "threshold": 0.2}, "voice": "echo",
            "speed": 1.3}
    assert settings_from_wire(ga) == settings_from_wire(beta)


def test_custom_voice_object() -> None:
    s = settings_from_wire({"audio": {"output": {"voice": {"id": "voice_123"}}}})
    assert s.voice == "voice_123"


# ---------------------------------------------------------------------------------------
# Dialect detection
# ---------------------------------------------------------------------------------------


def test_detect_dialect() -> None:
    assert detect_dialect({}) is Dialect.GA
    assert detect_dialect(None) is Dialect.GA
    assert detect_dialect({"OpenAI-Beta": "realtime=v1"}) is Dialect.BETA
    assert detect_dialect([(b"openai-beta", b"assistants=v2, realtime=v1")]) is Dialect.BETA
    assert detect_dialect(
        {"Sec-WebSocket-Protocol": "realtime, openai-insecure-api-key.sk, openai-beta.realtime-v1"}
    ) is Dialect.BETA
    assert detect_dialect({}, parse(BETA_SESSION_UPDATE)) is Dialect.BETA
    assert detect_dialect({}, parse(GA_SESSION_UPDATE)) is Dialect.GA
    assert detect_dialect({}, parse({"type": "response.create", "response": {
        "modalities": ["text"]}})) is Dialect.BETA
    assert detect_dialect({}, parse({"type": "session.update", "session": {
        "instructions": "x"}})) is Dialect.GA
    assert detect_dialect({}, parse({"type": "input_audio_buffer.commit"})) is Dialect.GA
    # the header wins over a GA-looking first event
    assert detect_dialect({"openai-beta": "realtime=v1"}, parse(GA_SESSION_UPDATE)) is Dialect.BETA


# ---------------------------------------------------------------------------------------
# Server events: rendering per dialect
# ---------------------------------------------------------------------------------------


def _assistant_item() -> MessageItem:
    return MessageItem(
        id="item_a", role="assistant", status="completed",
        content=[ContentPart(type="output_audio", transcript="hi there")],
    )


def _response() -> RealtimeResponse:
    r = RealtimeResponse.start(SessionSettings(), conversation_id="conv_1", metadata={"k": "v"})
    r.output.append(_assistant_item())
    return r


def _samples() -> dict[type[ServerEvent], ServerEvent]:
    ids = {"response_id": "resp_1", "item_id": "item_a", "output_index": 0, "content_index": 0}
    part = ContentPart(type="output_text", text="")
    user = MessageItem(id="item_u", role="user", content=[
        ContentPart(type="input_audio", audio="QUJD", transcript=None)])
    samples: list[ServerEvent] = [
        SessionCreated(session_id="sess_1", session=SessionSettings()),
        SessionUpdated(session_id="sess_1", session=SessionSettings()),
        ConversationCreated(conversation_id="conv_1"),
        SpeechStarted(audio_start_ms=100, item_id="item_u"),
        SpeechStopped(audio_end_ms=900, item_id="item_u"),
        InputAudioCommitted(item_id="item_u", previous_item_id=None),
        InputAudioCleared(),
        InputAudioTimeoutTriggered(audio_start_ms=0, audio_end_ms=6000, item_id="item_t"),
        ItemAdded(item=user, previous_item_id=None),
        ItemDone(item=user, previous_item_id=None),
        ItemRetrieved(item=user),
        ItemTruncated(item_id="item_a", content_index=0, audio_end_ms=500),
        ItemDeleted(item_id="item_a"),
        InputTranscriptionDelta(item_id="item_u", delta="hel"),
        InputTranscriptionCompleted(item_id="item_u", transcript="hello", audio_seconds=0.8),
        InputTranscriptionFailed(item_id="item_u", error=ErrorDetail(
            type="server_error", code="asr_failed", message="boom")),
        ResponseCreated(response=RealtimeResponse.start(SessionSettings(), conversation_id="c")),
        ResponseDone(response=_response().finished("completed", usage=ResponseUsage())),
        OutputItemAdded(response_id="resp_1", output_index=0, item=_assistant_item()),
        OutputItemDone(response_id="resp_1", output_index=0, item=_assistant_item()),
        ContentPartAdded(**ids, part=part),
        ContentPartDone(**ids, part=ContentPart(type="output_text", text="done")),
        AudioDelta(**ids, delta=b"\x01\x02\x03"),
        AudioDone(**ids),
        AudioTranscriptDelta(**ids, delta="hi"),
        AudioTranscriptDone(**ids, transcript="hi there"),
        TextDelta(**ids, delta="hi"),
        TextDone(**ids, text="hi there"),
        FunctionCallArgumentsDelta(response_id="resp_1", item_id="item_c", output_index=1,
                                   call_id="call_1", delta='{"city":'),
        FunctionCallArgumentsDone(response_id="resp_1", item_id="item_c", output_index=1,
                                  call_id="call_1", name="get_weather",
                                  arguments='{"city":"Paris"}'),
        mcp_ev.McpListToolsInProgress(item_id="mcpl_1"),
        mcp_ev.McpListToolsCompleted(item_id="mcpl_1"),
        mcp_ev.McpListToolsFailed(item_id="mcpl_1"),
        mcp_ev.McpCallArgumentsDelta(response_id="resp_1", item_id="mcp_1", output_index=1,
                                     delta='{"q":'),
        mcp_ev.McpCallArgumentsDone(response_id="resp_1", item_id="mcp_1", output_index=1,
                                    arguments='{"q":"x"}'),
        mcp_ev.McpCallInProgress(item_id="mcp_1", output_index=1),
        mcp_ev.McpCallCompleted(item_id="mcp_1", output_index=1),
        mcp_ev.McpCallFailed(item_id="mcp_1", output_index=1),
        mcp_ev.VideoStarted(response_id="resp_1", video_id="video_1", prompt="a train",
                            width=32, height=16, fps=24, num_frames=33),
        mcp_ev.VideoChunk(response_id="resp_1", video_id="video_1", index=0, total=1, frames=1),
        mcp_ev.VideoFrames(response_id="resp_1", video_id="video_1", index=0, piece=0, frames=1,
                           width=1, height=1, fps=24, pixels=b"abc"),
        mcp_ev.VideoUpdated(response_id="resp_1", video_id="video_1", prompt="a cat"),
        mcp_ev.VideoDone(response_id="resp_1", video_id="video_1", status="completed"),
        OutputAudioBufferStarted(response_id="resp_1"),
        OutputAudioBufferStopped(response_id="resp_1"),
        OutputAudioBufferCleared(response_id="resp_1"),
        DtmfEventReceived(event="7", received_at=1_700_000_000),
        RateLimitsUpdated(rate_limits=[
            RateLimit(name="requests", limit=100, remaining=99, reset_seconds=1.0)]),
        ErrorEvent(error=ErrorDetail(message="bad", code="invalid_value", param="x")),
    ]
    return {type(ev): ev for ev in samples}


GA_NAMES = {
    SessionCreated: "session.created",
    SessionUpdated: "session.updated",
    ConversationCreated: "conversation.created",
    SpeechStarted: "input_audio_buffer.speech_started",
    SpeechStopped: "input_audio_buffer.speech_stopped",
    InputAudioCommitted: "input_audio_buffer.committed",
    InputAudioCleared: "input_audio_buffer.cleared",
    InputAudioTimeoutTriggered: "input_audio_buffer.timeout_triggered",
    ItemAdded: "conversation.item.added",
    ItemDone: "conversation.item.done",
    ItemRetrieved: "conversation.item.retrieved",
    ItemTruncated: "conversation.item.truncated",
    ItemDeleted: "conversation.item.deleted",
    InputTranscriptionDelta: "conversation.item.input_audio_transcription.delta",
    InputTranscriptionCompleted: "conversation.item.input_audio_transcription.completed",
    InputTranscriptionFailed: "conversation.item.input_audio_transcription.failed",
    ResponseCreated: "response.created",
    ResponseDone: "response.done",
    OutputItemAdded: "response.output_item.added",
    OutputItemDone: "response.output_item.done",
    ContentPartAdded: "response.content_part.added",
    ContentPartDone: "response.content_part.done",
    AudioDelta: "response.output_audio.delta",
    AudioDone: "response.output_audio.done",
    AudioTranscriptDelta: "response.output_audio_transcript.delta",
    AudioTranscriptDone: "response.output_audio_transcript.done",
    TextDelta: "response.output_text.delta",
    TextDone: "response.output_text.done",
    FunctionCallArgumentsDelta: "response.function_call_arguments.delta",
    FunctionCallArgumentsDone: "response.function_call_arguments.done",
    mcp_ev.McpListToolsInProgress: "mcp_list_tools.in_progress",
    mcp_ev.McpListToolsCompleted: "mcp_list_tools.completed",
    mcp_ev.McpListToolsFailed: "mcp_list_tools.failed",
    mcp_ev.McpCallArgumentsDelta: "response.mcp_call_arguments.delta",
    mcp_ev.McpCallArgumentsDone: "response.mcp_call_arguments.done",
    mcp_ev.McpCallInProgress: "response.mcp_call.in_progress",
    mcp_ev.McpCallCompleted: "response.mcp_call.completed",
    mcp_ev.McpCallFailed: "response.mcp_call.failed",
    mcp_ev.VideoStarted: "response.output_video.started",  # voxline extensions
    mcp_ev.VideoChunk: "response.output_video.chunk",
    mcp_ev.VideoFrames: None,  # pixels for the track or recorder, never sent
    mcp_ev.VideoUpdated: "response.output_video.updated",
    mcp_ev.VideoDone: "response.output_video.done",
    OutputAudioBufferStarted: "output_audio_buffer.started",
    OutputAudioBufferStopped: "output_audio_buffer.stopped",
    OutputAudioBufferCleared: "output_audio_buffer.cleared",
    DtmfEventReceived: "input_audio_buffer.dtmf_event_received",  # SIP calls
    RateLimitsUpdated: "rate_limits.updated",
    ErrorEvent: "error",
}
BETA_NAMES = {
    **GA_NAMES,
    ItemAdded: "conversation.item.created",
    ItemDone: None,
    InputAudioTimeoutTriggered: None,
    AudioDelta: "response.audio.delta",
    AudioDone: "response.audio.done",
    AudioTranscriptDelta: "response.audio_transcript.delta",
    AudioTranscriptDone: "response.audio_transcript.done",
    TextDelta: "response.text.delta",
    TextDone: "response.text.done",
    # MCP tools are GA-only: beta clients get none of their events
    **{cls: None for cls in GA_NAMES if cls.__name__.startswith("Mcp")},
    DtmfEventReceived: None,  # SIP is GA-only
}


def test_every_server_event_class_is_mapped_and_sampled() -> None:
    def subclasses(cls: type) -> set[type]:
        out = set()
        for sub in cls.__subclasses__():
            out |= {sub} | subclasses(sub)
        return out

    concrete = {c for c in subclasses(ServerEvent) if not c.__name__.startswith("_")}
    assert concrete == set(SERVER_EVENT_CLASSES) == set(GA_NAMES) == set(_samples())


@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
def test_render_type_names(dialect: Dialect) -> None:
    names = GA_NAMES if dialect is Dialect.GA else BETA_NAMES
    for cls, event in _samples().items():
        wire = render(event, dialect)
        assert wire_type(cls, dialect) == names[cls]
        if names[cls] is None:
            assert wire is None and render_json(event, dialect) is None
            continue
        assert wire["type"] == names[cls], cls
        if cls is DtmfEventReceived:  # OpenAI's schema gives it none
            assert "event_id" not in wire
        else:
            assert wire["event_id"] == event.event_id and event.event_id.startswith("event_")
        assert json.loads(render_json(event, dialect)) == wire


def test_render_content_types_per_dialect() -> None:
    ev = OutputItemDone(response_id="resp_1", output_index=0, item=_assistant_item())
    ga, beta = render(ev, Dialect.GA), render(ev, Dialect.BETA)
    assert ga["item"] == {
        "id": "item_a", "object": "realtime.item", "type": "message", "status": "completed",
        "role": "assistant", "content": [{"type": "output_audio", "transcript": "hi there"}],
    }
    assert beta["item"]["content"] == [{"type": "audio", "transcript": "hi there"}]
    part = ContentPartAdded(response_id="r", item_id="i", part=ContentPart(
        type="output_text", text="x"))
    # content_part events use "text"/"audio" in both dialects (OpenAI's schema)
    assert render(part, Dialect.GA)["part"] == {"type": "text", "text": "x"}
    assert render(part, Dialect.BETA)["part"] == {"type": "text", "text": "x"}
    audio_part = ContentPartDone(response_id="r", item_id="i", part=ContentPart(
        type="output_audio", transcript="t"))
    assert render(audio_part, Dialect.GA)["part"] == {"type": "audio", "transcript": "t"}


def test_render_audio_delta_is_base64() -> None:
    pcm = bytes(range(256))
    wire = render(AudioDelta(response_id="r", item_id="i", delta=pcm), Dialect.BETA)
    assert base64.b64decode(wire["delta"]) == pcm
    assert {k for k in wire} == {"type", "event_id", "response_id", "item_id", "output_index",
                                 "content_index", "delta"}


def test_input_audio_only_in_retrieved() -> None:
    samples = _samples()
    added = render(samples[ItemAdded], Dialect.GA)
    assert added["item"]["content"] == [{"type": "input_audio", "transcript": None}]
    assert added["previous_item_id"] is None
    retrieved = render(samples[ItemRetrieved], Dialect.GA)
    assert retrieved["item"]["content"][0]["audio"] == "QUJD"


def test_render_response_per_dialect() -> None:
    r = _response().finished("cancelled", reason="turn_detected")
    ga = render(ResponseDone(response=r), Dialect.GA)["response"]
    assert ga["object"] == "realtime.response" and ga["id"].startswith("resp_")
    assert ga["status"] == "cancelled"
    assert ga["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
    assert ga["output_modalities"] == ["audio"] and ga["max_output_tokens"] == "inf"
    assert ga["audio"] == {"output": {"format": {"type": "audio/pcm", "rate": 24000},
                                      "voice": "alloy"}}
    assert ga["output"][0]["content"][0]["type"] == "output_audio"
    assert ga["conversation_id"] == "conv_1" and ga["metadata"] == {"k": "v"}
    beta = render(ResponseDone(response=r), Dialect.BETA)["response"]
    assert beta["modalities"] == ["text", "audio"] and beta["output_audio_format"] == "pcm16"
    assert beta["voice"] == "alloy" and beta["temperature"] == DEFAULT_TEMPERATURE
    assert beta["output"][0]["content"][0]["type"] == "audio"
    assert "audio" not in beta and "output_modalities" not in beta
    usage = ResponseUsage(total_tokens=30, input_tokens=10, output_tokens=20)
    done = render(ResponseDone(response=r.finished("completed", usage=usage)), Dialect.GA)
    assert done["response"]["status_details"] is None
    assert done["response"]["usage"] == {
        "total_tokens": 30, "input_tokens": 10, "output_tokens": 20,
        "input_token_details": {"cached_tokens": 0, "text_tokens": 0, "audio_tokens": 0},
        "output_token_details": {"text_tokens": 0, "audio_tokens": 0},
    }
    failed = r.finished("failed", error=ErrorDetail(type="server_error", message="x"))
    details = render(ResponseDone(response=failed), Dialect.GA)["response"]["status_details"]
    assert details["type"] == "failed" and details["error"]["message"] == "x"


def test_render_session_per_dialect() -> None:
    s = settings_from_wire(FULL_GA)
    ga = render(SessionCreated(session_id="sess_1", session=s), Dialect.GA)["session"]
    assert ga == {"id": "sess_1", "object": "realtime.session", **FULL_GA}
    s = settings_from_wire(FULL_BETA)
    beta = render(SessionUpdated(session_id="sess_1", session=s), Dialect.BETA)["session"]
    assert beta == {"id": "sess_1", **FULL_BETA}


def test_transcription_completed_usage() -> None:
    ev = InputTranscriptionCompleted(item_id="i", transcript="t", audio_seconds=1.5)
    for dialect in Dialect:
        wire = render(ev, dialect)
        assert wire["usage"] == {"type": "duration", "seconds": 1.5}
        assert (wire["item_id"], wire["content_index"], wire["transcript"]) == ("i", 0, "t")


def test_event_ids_unique() -> None:
    ids = {InputAudioCleared().event_id for _ in range(5000)}
    assert len(ids) == 5000
    assert all(i.startswith("event_") and len(i) == len("event_") + 22 and i[6:].isalnum() for i in ids)
    assert render(InputAudioCleared(), Dialect.GA)["event_id"] != render(
        InputAudioCleared(), Dialect.GA)["event_id"]


def test_server_events_are_strict() -> None:
    with pytest.raises(ValueError):
        AudioDelta(response_id="r", item_id="i", delta="base64 text is a bug")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SpeechStarted(audio_start_ms=1, item_id="i", bogus=1)  # type: ignore[call-arg]


@pytest.mark.parametrize("raw", [
    "[" * 100_000 + "]" * 100_000,
    '{"type": "session.update", "event_id": "deep", "session": '
    + '{"instructions": ' * 5000 + '"x"' + "}" * 5001,
])
def test_deeply_nested_json_is_an_error_not_a_crash(raw: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_client_event(raw)
    assert "nested too deeply" in str(info.value)


def test_an_event_id_no_utf8_frame_can_carry_is_refused_by_name_and_not_echoed() -> None:
    # JSON can escape a lone surrogate; echoing it back would break the error's own frame
    with pytest.raises(ProtocolError) as refused:
        parse_client_event('{"type": "input_audio_buffer.clear", "event_id": "\\ud800"}')
    err = refused.value
    assert err.param == "event_id" and err.event_id is None
    assert "input_audio_buffer.clear" in str(err) and "lone surrogate" in str(err)
    with pytest.raises(ProtocolError) as unknown:  # refused for its type: still not echoed
        parse_client_event('{"type": "no.such.event", "event_id": "\\ud800"}')
    assert unknown.value.event_id is None and unknown.value.param == "type"
