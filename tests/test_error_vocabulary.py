"""Each entry of OpenAI's error vocabulary (voxline/sessions/errors_vocabulary.py), made by
the client mistake it names: OpenAI's code, a message that opens with OpenAI's words and
goes on with voxline's detail (event and field), and an `error` event that validates
strictly against the openai package's types in both dialects. Plus the matches real
clients make: LiveKit Agents drops the barge-in cancel race by its message prefix."""

from __future__ import annotations

import json

import numpy as np
import pytest
from openai_types import strict_problems

from voxline.engines import protocol as ep
from voxline.errors import ProtocolError
from voxline.realtime.openai.client_events import parse_command
from voxline.realtime.openai.dialect import Dialect
from voxline.realtime.openai.server_events import render
from voxline.sessions import events as ev
from voxline.sessions.actor import SessionActor
from voxline.sessions.errors_vocabulary import VOCABULARY, Mistake, json_type_words


def new_actor() -> SessionActor:
    actor = SessionActor("sess_1", "s1")
    actor.start(0.0)
    actor.take_events()
    actor.take_commands()
    return actor


def send(actor: SessionActor, event: dict) -> list[ev.ServerEvent]:
    """One client event as a transport hands it over (a parse error included)."""
    try:
        actor.receive(parse_command(json.dumps(event)), 0.0)
    except ProtocolError as exc:
        actor.protocol_error(exc)
    return actor.take_events()


def text_item(item_id: str) -> dict:
    return {"id": item_id, "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Hi"}]}


def with_sent_audio(actor: SessionActor) -> str:
    """A reply with 200 ms of audio sent to the client; its item id."""
    send(actor, {"type": "response.create"})
    cmd, = actor.take_commands()
    audio = np.zeros(4410, "<f4").tobytes()
    actor.on_engine(ep.AudioChunk("s1", cmd.response_id, audio, 22050, 200.0, "Hi."), 0.0)
    actor.on_engine(ep.ResponseFinished("s1", cmd.response_id, ep.ResponseStatus.COMPLETED,
                                    "Hi.", 5, 2), 0.0)
    for t in range(1, 60):
        actor.tick(t / 100)
    actor.take_events()
    return cmd.item_id


# mistake -> (setup, the bad event, what OpenAI's message opens with exactly, voxline's detail)
CASES = {
    Mistake.CANCEL_NOT_ACTIVE: (
        None, {"type": "response.cancel"},
        "Cancellation failed: no active response found", "response.cancel: "),
    Mistake.RESPONSE_ALREADY_ACTIVE: (
        lambda a: send(a, {"type": "response.create"}), {"type": "response.create"},
        "Conversation already has an active response in progress: resp_", "response.create: "),
    Mistake.COMMIT_EMPTY: (
        lambda a: send(a, {"type": "session.update", "session": {
            "type": "realtime", "audio": {"input": {"turn_detection": None}}}}),
        {"type": "input_audio_buffer.commit"},
        "Error committing input audio buffer: buffer too small. Expected at least 100ms of "
        "audio, but buffer only has 0.00ms of audio.", "input_audio_buffer.commit: "),
    Mistake.RETRIEVE_UNKNOWN_ITEM: (
        None, {"type": "conversation.item.retrieve", "item_id": "nope"},
        "Error retrieving item: the item with id 'nope' does not exist.",
        "conversation.item.retrieve: "),
    Mistake.DELETE_UNKNOWN_ITEM: (
        None, {"type": "conversation.item.delete", "item_id": "nope"},
        "Error deleting item: the item with id 'nope' does not exist.",
        "conversation.item.delete: "),
    Mistake.TRUNCATE_UNKNOWN_ITEM: (
        None, {"type": "conversation.item.truncate", "item_id": "nope", "content_index": 0,
               "audio_end_ms": 0},
        "Error truncating item: the item with id 'nope' does not exist.",
        "conversation.item.truncate: "),
    Mistake.CREATE_UNKNOWN_PREVIOUS_ITEM: (
        None, {"type": "conversation.item.create", "previous_item_id": "nope",
               "item": text_item("u1")},
        "Error adding item: the previous item with id 'nope' does not exist.",
        "conversation.item.create: "),
    Mistake.CREATE_DUPLICATE_ITEM: (
        lambda a: send(a, {"type": "conversation.item.create", "item": text_item("u1")}),
        {"type": "conversation.item.create", "item": text_item("u1")},
        "Error adding item: an item with id 'u1' already exists.", "conversation.item.create: "),
    Mistake.TRUNCATE_PAST_AUDIO: (
        "audio", {"type": "conversation.item.truncate", "content_index": 0,
                  "audio_end_ms": 5000},
        "Audio content of 200ms is already shorter than 5000ms", "conversation.item.truncate: "),
    Mistake.MISSING_PARAMETER: (
        None, {"type": "conversation.item.delete"},
        "Missing required parameter: 'item_id'.", "conversation.item.delete: "),
    Mistake.INVALID_TYPE: (
        None, {"type": "session.update", "session": {"type": "realtime", "instructions": 7}},
        "Invalid type for 'session.instructions': expected a string, but got an integer instead.",
        "session.update: "),
}


def test_every_entry_has_a_case():
    assert set(CASES) == set(Mistake) == set(VOCABULARY)


@pytest.mark.parametrize("mistake", list(Mistake), ids=lambda m: m.name.lower())
def test_each_mistake_gets_openai_code_and_opening_then_voxline_detail(mistake):
    setup, event, opening, detail = CASES[mistake]
    actor = new_actor()
    if setup == "audio":
        event = {**event, "item_id": with_sent_audio(actor)}
    elif setup is not None:
        setup(actor)
        actor.take_commands()
    err, = send(actor, {**event, "event_id": "evt_bad"})
    assert isinstance(err, ev.ErrorEvent), err
    shape = VOCABULARY[mistake]
    assert (err.error.type, err.error.code) == (shape.type, shape.code)
    assert err.error.message.startswith(opening), err.error.message
    assert f"({detail}" in err.error.message[len(opening):]  # voxline's own words follow
    assert err.error.event_id == "evt_bad"
    for dialect in Dialect:
        wire = render(err, dialect)
        assert strict_problems(wire, dialect.value) == []
        assert wire["error"]["code"] == shape.code


def test_livekit_ignores_voxline_cancel_race_as_it_does_openai():
    """livekit-agents 1.8.9 `RealtimeSession._handle_error`: a message starting with
    "Cancellation failed" is the cancel race, dropped; so is `input_audio_buffer_commit_empty`
    under server VAD. Anything else is raised to the application."""
    actor = new_actor()
    err, = send(actor, {"type": "response.cancel"})
    assert err.error.message.startswith("Cancellation failed")
    actor.receive(parse_command('{"type": "input_audio_buffer.commit"}'), 0.0)
    err, = actor.take_events()  # server VAD is on by default
    assert err.error.code == "input_audio_buffer_commit_empty"


def test_json_types_are_named_as_openai_names_them():
    values = [None, True, 3, 2.5, "x", [1], {"a": 1}]
    assert [json_type_words(v) for v in values] == [
        "null", "a boolean", "an integer", "a number", "a string", "an array", "an object"]
