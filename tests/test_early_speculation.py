"""Semantic turn detection starts the speculative reply before the pause when the early
take's words end a sentence (`Turns._speculate_early`), and drops it unsent, leaving no
trace, when voice comes before the pause (hand-built models).
"""

from __future__ import annotations

import numpy as np
from fakes import tone
from test_early_pause import LevelVAD
from test_engine_core import Harness, has
from test_speculation import AUTO, _state, feed, outcomes, silence, speculating

from voxline.engines import protocol as p

SEMANTIC = p.StreamConfig(auto_response=AUTO, turn_detection=p.TurnParams(eagerness="auto"))


class PhraseASR:
    """Transcribes each burst of tone in the audio as the next of `phrases`."""

    def __init__(self, *phrases: str) -> None:
        self.phrases = phrases

    def transcribe(self, audio: np.ndarray) -> str:
        frames = audio[: len(audio) // 512 * 512].reshape(-1, 512)
        voiced = np.sqrt((frames**2).mean(axis=1)) > 0.01
        bursts = int(voiced[0]) + int(np.sum(voiced[1:] & ~voiced[:-1])) if len(voiced) else 0
        return " ".join(self.phrases[:bursts])


def harness(*phrases: str, config: p.StreamConfig = SEMANTIC, **kwargs) -> Harness:
    h = Harness(stop_after=6, step_seconds=0.01, **kwargs)
    h.core.asr.model = PhraseASR(*phrases)
    h.send(p.OpenStream("s1", config))
    return h


def _before_the_pause(h: Harness) -> None:
    """Speech, then 96 ms of silence (the take is made at 32 ms; the pause is at 160);
    run until the early take has landed."""
    feed(h, np.concatenate([silence(0.3), tone(0.6), silence(0.096)]))
    sid = h.core.streams["s1"].internal_id
    h.run_until(lambda _: (take := h.core.turns._takes.get(sid)) is not None
                and take.text is not None)


def test_words_that_end_a_sentence_start_the_reply_before_the_pause_and_it_is_committed():
    h = harness("What time is it?")
    _before_the_pause(h)
    det = h.core.streams["s1"].input.detector
    assert not det.paused and outcomes(h) == ["started"]  # before the pause is reported
    assert not h.of(p.ReplyTextDelta)  # held
    feed(h, silence(0.6))
    h.run_until(has(p.TranscriptFinal))
    final, = h.of(p.TranscriptFinal)
    assert final.text == "What time is it?"
    h.send(p.CreateResponse("s1", "r1", "a1", AUTO))
    h.run_until(has(p.ResponseFinished))
    assert outcomes(h) == ["started", "committed"]  # the pause did not start a second one
    assert {o.response_id for o in h.of(p.ReplyTextDelta) + h.of(p.AudioChunk)} == {"r1"}
    items = h.core.streams["s1"].conversation.items
    assert [(i.role, i.text) for i in items][0] == ("user", "What time is it?")
    h.close()


def test_words_that_trail_off_or_give_no_sign_wait_for_the_pause_as_before():
    for words in ("I would like a table for", "Paris is nice"):
        h = harness(words)
        _before_the_pause(h)
        assert outcomes(h) == [], words
        feed(h, silence(0.1))  # the pause (160 ms): it speculates as it always did
        h.run_until(has(p.Speculation, outcome="started"))
        assert h.core.streams["s1"].input.detector.paused
        h.close()


def test_off_or_under_server_vad_the_reply_waits_for_the_pause():
    server = p.StreamConfig(auto_response=AUTO)
    for h in (harness("What time is it?", early_speculation=False),
              harness("What time is it?", config=server)):
        _before_the_pause(h)
        assert outcomes(h) == []
        feed(h, silence(0.1))
        h.run_until(has(p.Speculation, outcome="started"))
        h.close()


def _resumed_before_the_pause(early: bool):
    """An earlier exchange, then "What time is it?", a gap shorter than the pause, and
    more words: the turn goes on."""
    h = harness("What time is it?", "And the date?", early_speculation=early)
    h.send(p.AddItem("s1", "u0", "user", "an earlier question"),
           p.CreateResponse("s1", "r0", "a0", AUTO))
    h.run_until(has(p.ResponseFinished, response_id="r0"))
    _before_the_pause(h)
    if early:
        h.run_until(lambda _: (run := speculating(h)) is not None
                    and len(run.request.generated) >= 2)
    feed(h, tone(0.3))  # the user goes on before any pause
    h.run_until(lambda _: not h.core.llm.has_work() and h.core._llm_worker.idle)
    state = _state(h)
    assert outcomes(h) == (["started", "discarded"] if early else [])
    assert not h.of(p.ReplyTextDelta) or {d.response_id for d in h.of(p.ReplyTextDelta)} == {"r0"}
    h.close()
    return state


def test_voice_before_the_pause_drops_it_leaving_cache_and_conversation_as_if_it_never_ran():
    dropped = _resumed_before_the_pause(early=True)
    assert dropped == _resumed_before_the_pause(early=False)
    items, slot_tokens, cache = dropped
    assert [role for role, _, _ in items] == ["user", "assistant"]
    assert cache == slot_tokens


def _answered(h) -> p.TranscriptFinal:
    """The rest of the turn: the pause runs out, its final transcript, the reply to it."""
    feed(h, silence(0.6))
    h.run_until(has(p.TranscriptFinal))
    h.send(p.CreateResponse("s1", "r1", "a1", AUTO))
    h.run_until(has(p.ResponseFinished))
    final, = h.of(p.TranscriptFinal)
    return final


def test_the_resumed_turn_is_one_item_answered_once():
    h = harness("What time is it?", "And the date?")
    _before_the_pause(h)
    feed(h, np.concatenate([tone(0.4), silence(0.2)]))
    h.run_until(lambda _: outcomes(h) == ["started", "discarded", "started"])
    final = _answered(h)
    assert final.text == "What time is it? And the date?"
    assert outcomes(h) == ["started", "discarded", "started", "committed"]
    assert [i.text for i in h.core.streams["s1"].conversation.items][0] == final.text
    h.close()


def test_a_breath_before_the_pause_drops_it_and_the_pause_speculates_on_what_it_hears():
    """A breath keeps the turn's voice without resuming it: the take before it no longer
    covers the turn, so its reply is dropped, and the pause starts one over its own
    transcript, which is the turn's final."""
    h = harness("What time is it?", "And the date?")
    h.core.vad.model = LevelVAD()
    _before_the_pause(h)
    assert outcomes(h) == ["started"]
    feed(h, np.concatenate([tone(0.1, level=0.11), silence(0.25)]))
    h.run_until(lambda _: outcomes(h) == ["started", "discarded", "started"])
    final = _answered(h)
    assert outcomes(h)[-1] == "committed"
    assert h.core.streams["s1"].conversation.items[0].text == final.text == \
        "What time is it? And the date?"
    h.close()
