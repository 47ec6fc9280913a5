"""conversation.item.create anywhere: `previous_item_id: "root"` puts the item first (OpenAI's
documented meaning) and an item id puts it right after that item, for messages of any role.
The session's order, its events and the engine's conversation agree, and the engine keeps
the KV cache of the unchanged prefix. LiveKit Agents (livekit-plugins-openai 1.8.9) syncs
its chat context exactly so: its first item with "root", each later one after the last."""

from __future__ import annotations

from core_driver import CoreDriver
from fakes import CountingLM, EnergyVAD, FixedASR, ToneTTS
from test_engine_core import has

from voxline.engines import protocol as p
from voxline.engines.core import EngineCore, Models
from voxline.engines.speech_model import SentenceSpeechModel
from voxline.realtime.openai.client_events import parse_command
from voxline.sessions import events as ev
from voxline.sessions.actor import SessionActor


def make_actor() -> SessionActor:
    actor = SessionActor("sess_1", "s1")
    actor.start(0.0)
    actor.take_events()
    actor.take_commands()
    return actor


def livekit_create(item_id: str, role: str, text: str, previous: str | None) -> dict:
    """A `conversation.item.create` as LiveKit's `_create_update_chat_ctx_events` sends it."""
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "conversation.item.create", "event_id": f"chat_ctx_create_{item_id}",
            "previous_item_id": "root" if previous is None else previous,
            "item": {"id": item_id, "type": "message", "role": role,
                     "content": [{"type": kind, "text": text}]}}


HISTORY = [("item_a", "user", "My name is Ana."),
           ("item_b", "assistant", "Nice to meet you, Ana."),
           ("item_c", "user", "What is the capital of France?")]


def sync_history(actor: SessionActor) -> list[p.EngineInput]:
    """LiveKit's chat-context sync of HISTORY onto an empty conversation."""
    previous = None
    commands: list[p.EngineInput] = []
    for item_id, role, text in HISTORY:
        actor.receive(parse_command(livekit_create(item_id, role, text, previous)), 0.0)
        commands += actor.take_commands()
        previous = item_id
    return commands


def test_livekit_first_item_at_root_of_an_empty_conversation_and_the_rest_after_it():
    actor = make_actor()
    commands = sync_history(actor)
    events = actor.take_events()
    assert not [e for e in events if isinstance(e, ev.ErrorEvent)], events
    added = [(e.item.id, e.previous_item_id) for e in events if isinstance(e, ev.ItemAdded)]
    assert added == [("item_a", None), ("item_b", "item_a"), ("item_c", "item_b")]
    assert actor.order == ["item_a", "item_b", "item_c"]
    assert [(c.item_id, c.role, c.previous_item_id) for c in commands] == [
        ("item_a", "user", "root"), ("item_b", "assistant", "item_a"), ("item_c", "user", "item_b")]


def test_root_and_after_an_item_insert_into_an_existing_conversation_for_either_role():
    actor = make_actor()
    sync_history(actor)
    actor.take_events()
    actor.receive(parse_command(livekit_create("item_sys", "system", "Be brief.", None)), 0.0)
    actor.receive(parse_command(livekit_create("item_x", "assistant", "Hello!", "item_a")), 0.0)
    actor.receive(parse_command(livekit_create("item_y", "user", "Hi.", "item_sys")), 0.0)
    assert actor.order == ["item_sys", "item_y", "item_a", "item_x", "item_b", "item_c"]
    added = [(e.item.id, e.previous_item_id) for e in actor.take_events()
             if isinstance(e, ev.ItemAdded)]
    assert added == [("item_sys", None), ("item_x", "item_a"), ("item_y", "item_sys")]


def test_an_unknown_previous_item_or_a_reserved_id_is_refused_in_openai_words():
    actor = make_actor()
    actor.receive(parse_command(livekit_create("item_a", "user", "Hi.", "item_gone")), 0.0)
    err, = actor.take_events()
    assert err.error.code == "item_create_invalid_previous_item_id"
    assert err.error.message.startswith(
        "Error adding item: the previous item with id 'item_gone' does not exist.")
    assert (err.error.param, err.error.event_id) == ("previous_item_id", "chat_ctx_create_item_a")
    actor.receive(parse_command(livekit_create("root", "user", "Hi.", None)), 0.0)
    err, = actor.take_events()
    assert (err.error.code, err.error.param) == ("invalid_value", "item.id")
    assert actor.order == [] and actor.take_commands() == []


# --------------------------------------------------------------------------- the engine


class Engine(CoreDriver):
    def __init__(self) -> None:
        super().__init__()
        self.lm = CountingLM(stop_after=4)
        self.core = EngineCore(Models(EnergyVAD(), FixedASR(), self.lm,
                                      SentenceSpeechModel(ToneTTS())), self.woke.set)

    def respond(self, response_id: str, item_id: str) -> p.ResponseFinished:
        self.send(p.CreateResponse("s1", response_id, item_id, p.ResponseConfig(audio=False)))
        self.run_until(has(p.ResponseFinished, response_id=response_id))
        return next(o for o in self.of(p.ResponseFinished) if o.response_id == response_id)

    def texts(self) -> list[tuple[str, str]]:
        return [(i.item_id, i.role) for i in self.core.streams["s1"].conversation.items]


def test_the_engine_inserts_where_the_session_does_and_reuses_the_cached_prefix():
    h = Engine()
    actor = make_actor()
    h.send(p.OpenStream("s1"), *sync_history(actor))
    first = h.respond("r1", "a1")
    assert first.status == p.ResponseStatus.COMPLETED
    assert h.texts() == [("item_a", "user"), ("item_b", "assistant"), ("item_c", "user"),
                         ("a1", "assistant")]
    conversation = h.core.streams["s1"].conversation
    question = conversation.items[2].tokens
    fed = [t for _, rows in h.lm.calls for t in rows[0]]
    assert any(fed[i:i + len(question)] == question for i in range(len(fed)))  # it read it
    # an item after the first message: the cache keeps everything before it
    system_and_a = first.input_tokens - sum(len(i.tokens) for i in conversation.items[1:3])
    h.send(p.AddItem("s1", "item_x", "user", "one more thing", "item_a"))
    second = h.respond("r2", "a2")
    assert [i for i, _ in h.texts()] == ["item_a", "item_x", "item_b", "item_c", "a1", "a2"]
    assert second.cached_tokens == system_and_a
    # at the start: only the system prompt is still cached
    h.send(p.AddItem("s1", "item_s", "system", "be brief", p.CONVERSATION_START))
    third = h.respond("r3", "a3")
    assert h.texts()[0] == ("item_s", "system")
    assert 0 < third.cached_tokens < system_and_a
    h.close()


def test_an_anchor_the_engine_never_held_appends_the_item():
    h = Engine()
    h.send(p.OpenStream("s1"), p.AddItem("s1", "u1", "user", "hello"),
           p.AddItem("s1", "u2", "user", "again", "a_cancelled_before_its_first_token"))
    h.respond("r1", "a1")
    assert [i for i, _ in h.texts()] == ["u1", "u2", "a1"]
    h.close()
