"""`truncation: {"type": "retention_ratio", ...}` over a small context: when the conversation
would overflow, the oldest turns go in one cut down to the ratio, and the prompt cache keeps
hitting until the next cut; `auto` (the newest turns that fit, chosen per response) moves its
window every turn past the limit. Engine-side, with the counting LM of tests/fakes.py, and
the session side that validates the setting and hands it to the engine."""

from __future__ import annotations

import numpy as np
import pytest
from core_driver import CoreDriver
from fakes import CountingLM, EnergyVAD, FixedASR, ToneTTS, tone
from test_engine_core import has
from test_speculation import AUTO, feed, harness, outcomes, silence, speculating

from voxline.engines import protocol as p
from voxline.engines.core import EngineCore, Models
from voxline.engines.speech_model import SentenceSpeechModel
from voxline.errors import ProtocolError
from voxline.realtime.openai.client_events import parse_command
from voxline.realtime.openai.dialect import Dialect
from voxline.realtime.openai.server_events import render
from voxline.sessions import events as ev
from voxline.sessions.actor import SessionActor

LIMIT = 60  # tokens of messages after the instructions (token_limits.post_instructions)
# each user message is 10 tokens and each reply 9


def turn_text(n: int) -> str:
    """User message n: 10 tokens, its own (the counting LM's tokens are word lengths)."""
    return " ".join(["x" * (n % 30 + 1)] * 5)


class Engine(CoreDriver):
    def __init__(self, truncation: p.Truncation) -> None:
        super().__init__()
        self.lm = CountingLM(stop_after=4)
        self.core = EngineCore(Models(EnergyVAD(), FixedASR(), self.lm,
                                      SentenceSpeechModel(ToneTTS())), self.woke.set)
        self.send(p.OpenStream("s1", p.StreamConfig(turn_detection=None, truncation=truncation)))
        self.system = len(self.lm.render_message("system", p.DEFAULT_INSTRUCTIONS))
        self.header = len(self.lm.generation_header())

    def turn(self, n: int) -> p.ResponseFinished:
        """A user message and the reply to it; the reply's ResponseDone."""
        self.send(p.AddItem("s1", f"u{n}", "user", turn_text(n)),
                  p.CreateResponse("s1", f"r{n}", f"a{n}", p.ResponseConfig(audio=False)))
        self.run_until(has(p.ResponseFinished, response_id=f"r{n}"))
        return next(o for o in self.of(p.ResponseFinished) if o.response_id == f"r{n}")

    def conversation_tokens(self, done: p.ResponseFinished) -> int:
        return done.input_tokens - self.system - self.header


def run_turns(truncation: p.Truncation, turns: int = 12) -> tuple[Engine, list[p.ResponseFinished]]:
    h = Engine(truncation)
    dones = [h.turn(n) for n in range(turns)]
    assert all(d.status == p.ResponseStatus.COMPLETED for d in dones)
    return h, dones


def reread(dones: list[p.ResponseFinished], i: int) -> bool:
    """Response i's prompt did not find all of the previous prompt in the KV cache."""
    return dones[i].cached_tokens < dones[i - 1].input_tokens


def cache_misses(dones: list[p.ResponseFinished]) -> int:
    return sum(reread(dones, i) for i in range(1, len(dones)))


def test_retention_ratio_cuts_once_down_to_the_ratio_and_the_cache_hits_until_the_next_cut():
    h, dones = run_turns(p.Truncation(retention_ratio=0.5, post_instructions=LIMIT))
    sizes = [h.conversation_tokens(d) for d in dones]
    assert max(sizes) <= LIMIT  # never past the limit
    cuts = [i for i in range(1, len(sizes)) if sizes[i] < sizes[i - 1]]
    assert len(cuts) >= 2  # the context did overflow, more than once
    for i in cuts:  # each cut goes down to the ratio at once, never turn by turn
        assert sizes[i] <= 0.5 * LIMIT
    # only a cut re-reads the prompt: between cuts all of the previous one is cached
    assert [i for i in range(1, len(dones)) if reread(dones, i)] == cuts
    # the dropped turns stay in the conversation, unread
    items = h.core.streams["s1"].conversation.items
    assert [i.item_id for i in items[:2]] == ["u0", "a0"] and len(items) == 2 * len(dones)
    h.close()


def test_auto_moves_its_window_every_turn_past_the_limit_so_retention_misses_less():
    h, auto = run_turns(p.Truncation(post_instructions=LIMIT))
    sizes = [h.conversation_tokens(d) for d in auto]
    assert max(sizes) <= LIMIT
    full = next(i for i, s in enumerate(sizes) if s + 19 > LIMIT)  # no room for a new turn
    assert all(reread(auto, i) for i in range(full + 1, len(auto)))  # every turn re-reads
    retention_h, retained = run_turns(p.Truncation(retention_ratio=0.5, post_instructions=LIMIT))
    assert cache_misses(retained) < cache_misses(auto)
    h.close()
    retention_h.close()


def test_without_token_limits_the_model_context_is_the_limit():
    h = Engine(p.Truncation(retention_ratio=0.8))
    limit = h.lm.max_len - h.header - h.lm.max_len // 4 - h.system
    dones = [h.turn(n) for n in range(16)]
    sizes = [h.conversation_tokens(d) for d in dones]
    assert max(sizes) <= limit < sum(10 + 9 for _ in dones)
    assert any(sizes[i] < sizes[i - 1] for i in range(1, len(sizes)))  # it cut
    h.close()


# ------------------------------------------------------------------------ the session


def update(actor: SessionActor, truncation: object) -> list:
    """A session.update of `truncation`, as a transport hands it over (a parse error too)."""
    try:
        actor.receive(parse_command({"type": "session.update", "event_id": "u", "session": {
            "type": "realtime", "truncation": truncation}}), 0.0)
    except ProtocolError as exc:
        actor.protocol_error(exc)
    return actor.take_events()


def test_the_session_accepts_retention_ratio_echoes_it_and_hands_it_to_the_engine():
    actor = SessionActor("sess_1", "s1")
    actor.start(0.0)
    actor.take_events()
    actor.take_commands()
    truncation = {"type": "retention_ratio", "retention_ratio": 0.7,
                  "token_limits": {"post_instructions": 5000}}
    updated, = update(actor, truncation)
    assert isinstance(updated, ev.SessionUpdated)
    assert render(updated, Dialect.GA)["session"]["truncation"] == truncation
    config, = actor.take_commands()
    assert config.config.truncation == p.Truncation(retention_ratio=0.7, post_instructions=5000)
    updated, = update(actor, "auto")
    assert actor.take_commands()[0].config.truncation == p.Truncation()


@pytest.mark.parametrize(("truncation", "code", "param"), [
    ({"type": "retention_ratio", "retention_ratio": 1.5}, "invalid_value",
     "session.truncation.retention_ratio"),
    ({"type": "retention_ratio"}, "missing_required_parameter",
     "session.truncation.retention_ratio"),
    ({"type": "retention_ratio", "retention_ratio": 0.5, "token_limits": {"post_instructions": 0}},
     "invalid_value", "session.truncation.token_limits.post_instructions"),
    ({"type": "sliding", "retention_ratio": 0.5}, "invalid_value", "session.truncation.type"),
    ("disabled", "invalid_value", "session.truncation"),  # refused: the server always truncates
])
def test_a_bad_truncation_is_refused_naming_the_field(truncation, code, param):
    actor = SessionActor("sess_1", "s1")
    actor.start(0.0)
    actor.take_events()
    actor.take_commands()
    err, = update(actor, truncation)
    assert isinstance(err, ev.ErrorEvent)
    assert (err.error.code, err.error.param, err.error.event_id) == (code, param, "u")
    assert actor.settings.truncation == "auto" and actor.take_commands() == []


def test_a_discarded_speculation_leaves_no_retention_cut():
    """A speculative reply's prompt may cut; discarded, it leaves the cut as it found it."""
    h = harness(stop_after=6, step_seconds=0.01, speculate_after_ms=160)
    config = p.StreamConfig(auto_response=AUTO, truncation=p.Truncation(0.5, 30))
    h.send(p.OpenStream("s1", config), p.AddItem("s1", "u0", "user", "xx " * 8),
           p.AddItem("s1", "a0", "assistant", "yyy " * 8))  # 26 of the 30 tokens
    window = h.core.streams["s1"].window
    feed(h, np.concatenate([silence(0.3), tone(0.6), silence(0.25)]))
    h.run_until(lambda _: (run := speculating(h)) is not None and run.request.generated)
    assert window.dropped == {"u0", "a0"}  # the tentative turn made the prompt cut
    feed(h, tone(0.3))  # the user goes on speaking
    h.run_until(lambda _: outcomes(h)[-1:] == ["discarded"])
    assert window.dropped == set()
    h.close()
