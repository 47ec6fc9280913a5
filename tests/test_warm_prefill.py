"""Warm prefill: partial transcripts prefill the reply's prompt while the user speaks.

Nothing is sent and the conversation is untouched while the turn goes on; the reply at
the end of the turn then computes only the tokens that changed since the partial and
leaves the cache and conversation exactly as a plain prefill of the final transcript
would; a discarded warm prefill (or a speculation that adopted one) leaves no trace.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fakes import CountingLM, EnergyVAD, ToneTTS, tone
from test_engine_core import has
from test_speculation import feed, outcomes, silence, speculating

from voxline.engines import protocol as p
from voxline.engines.core import EngineCore, Models
from voxline.engines.llm_stage import (
    TENTATIVE_CHUNK,
    FinishReason,
    GenerationRequest,
    LLMStage,
    Slot,
)
from voxline.engines.speech_model import SentenceSpeechModel

PARTIAL = "book a table fo"  # the last word differs from the final's: a differing tail
FINAL = "book a table for four people please."
AUTO = p.ResponseConfig(voice="alloy", max_output_tokens=8)
CFG = p.StreamConfig(auto_response=AUTO, instructions="Be brief.")


class GrowingASR:
    """Hears `PARTIAL` in under 1.5 s of audio (the partial), `FINAL` in more."""

    def transcribe(self, audio: np.ndarray) -> str:
        if not len(audio):
            return ""
        return PARTIAL if len(audio) < 24000 else FINAL


class Engine:
    """An EngineCore over hand-built VAD/ASR/TTS and the given LLM."""

    def __init__(self, lm, warm: bool, speculate_after_ms: float = 0) -> None:
        from core_driver import CoreDriver

        self.driver = CoreDriver()
        self.lm = lm
        self.core = EngineCore(Models(EnergyVAD(), GrowingASR(), lm,
                                      SentenceSpeechModel(ToneTTS())),
                               self.driver.woke.set, speculate_after_ms=speculate_after_ms,
                               warm_prefill=warm)
        self.driver.core = self.core

    def idle(self) -> None:
        self.driver.run_until(lambda _: not self.core.llm.has_work()
                              and self.core._llm_worker.idle)


def speak_with_partial(e: Engine) -> None:
    """The user speaks; a partial transcript lands and the LLM goes idle (mid-turn)."""
    feed(e.driver, np.concatenate([silence(0.3), tone(1.0)]))
    e.driver.run_until(has(p.TranscriptPartial))
    e.idle()


def slot_state(e: Engine):
    stream = e.core.streams["s1"]
    items = [(i.role, i.text, i.tokens) for i in stream.conversation.items]
    return items, list(stream.slot.tokens) if stream.slot is not None else []


def counting_turn(warm: bool, speculate_after_ms: float = 0):
    """An earlier exchange, then a spoken turn with a partial, its final, its reply."""
    e = Engine(CountingLM(stop_after=6), warm, speculate_after_ms)
    d = e.driver
    d.send(p.OpenStream("s1", CFG), p.AddItem("s1", "u0", "user", "an earlier question"),
           p.CreateResponse("s1", "r0", "a0", AUTO))
    d.run_until(has(p.ResponseFinished, response_id="r0"))
    n = len(d.outputs)
    speak_with_partial(e)
    mid_turn = d.outputs[n:], slot_state(e)
    feed(d, np.concatenate([tone(0.6), silence(0.7)]))
    d.run_until(has(p.TranscriptFinal))
    d.send(p.CreateResponse("s1", "r1", "a1", AUTO))
    d.run_until(has(p.ResponseFinished, response_id="r1"))
    done = d.of(p.ResponseFinished)[-1]
    stream = e.core.streams["s1"]
    cache = list(e.lm.cache[stream.slot.index])
    state = slot_state(e), cache
    e.core.close()
    return done, state, mid_turn


@pytest.mark.parametrize("speculate_after_ms", [0, 160])
def test_the_reply_reuses_the_warm_prefill_and_ends_as_a_plain_prefill_would(speculate_after_ms):
    cold_done, cold_state, (_, cold_mid) = counting_turn(False, speculate_after_ms)
    done, state, (mid_outputs, mid) = counting_turn(True, speculate_after_ms)
    # mid-turn: the partial was prefilled into the slot, nothing sent, conversation untouched
    items, slot_tokens = mid
    assert items == cold_mid[0] and [role for role, _, _ in items] == ["user", "assistant"]
    assert len(slot_tokens) > len(cold_mid[1])
    assert not [o for o in mid_outputs
                if isinstance(o, p.ReplyTextDelta | p.AudioChunk | p.Speculation | p.StreamError
                              | p.ResponseFinished)]
    # the reply: same text, same conversation, same cache as without warm prefill
    assert state == cold_state
    assert (done.text, done.input_tokens, done.status) == (
        cold_done.text, cold_done.input_tokens, cold_done.status)
    items, tokens = state[0]
    assert state[1] == tokens  # the cache holds exactly what the slot says
    # ... but its prefill at the end of the turn computed fewer tokens: only the tail
    # from the partial's differing last word on
    assert done.cached_tokens > cold_done.cached_tokens
    user = next(t for _, text, t in items if text == FINAL)
    assert done.input_tokens - done.cached_tokens < len(user)


def test_a_discarded_warm_prefill_leaves_the_slot_as_if_it_never_ran():
    states = []
    for warm in (False, True):
        e = Engine(CountingLM(stop_after=6), warm)
        d = e.driver
        d.send(p.OpenStream("s1", CFG), p.AddItem("s1", "u0", "user", "an earlier question"),
               p.CreateResponse("s1", "r0", "a0", AUTO))
        d.run_until(has(p.ResponseFinished, response_id="r0"))
        before = slot_state(e)
        speak_with_partial(e)
        if warm:
            assert len(slot_state(e)[1]) > len(before[1])  # it ran
        d.send(p.ClearAudio("s1"))
        e.idle()
        slot = e.core.streams["s1"].slot
        assert slot_state(e) == before and e.lm.cache[slot.index] == slot.tokens
        states.append((slot_state(e), list(e.lm.cache[slot.index])))
        e.core.close()
    assert states[0] == states[1]


def test_a_dropped_speculation_that_adopted_a_warm_prefill_undoes_both():
    e = Engine(CountingLM(stop_after=6), warm=True, speculate_after_ms=160)
    d = e.driver
    d.send(p.OpenStream("s1", CFG), p.AddItem("s1", "u0", "user", "an earlier question"),
           p.CreateResponse("s1", "r0", "a0", AUTO))
    d.run_until(has(p.ResponseFinished, response_id="r0"))
    before = slot_state(e)
    speak_with_partial(e)
    feed(d, silence(0.25))  # a pause: the speculation starts from the warm tokens
    d.run_until(lambda _: (run := speculating(d)) is not None
                and len(run.request.generated) >= 2)
    feed(d, tone(0.3))  # the user goes on: discarded
    d.run_until(lambda _: outcomes(d) == ["started", "discarded"])
    e.idle()
    slot = e.core.streams["s1"].slot
    assert slot_state(e) == before and e.lm.cache[slot.index] == slot.tokens
    e.core.close()


# ------------------------------------------------------------------ the scheduler


def run_step(stage: LLMStage):
    plan = stage.schedule()
    assert plan is not None
    return plan, stage.update(plan, stage.execute(plan))


def test_a_tentative_request_runs_only_when_nothing_else_does_in_small_chunks():
    lm = CountingLM(stop_after=3, max_len=512)
    stage = LLMStage(lm)
    reply = GenerationRequest("a#1", Slot(lm.alloc_slot()), lambda: [1, 9, 3], 8)
    warm_slot = Slot(lm.alloc_slot())
    prompt = [1, 5, 3] + [12] * (2 * TENTATIVE_CHUNK)
    warm = GenerationRequest("b#warm", warm_slot, lambda: prompt, 0, tentative=True)
    stage.add(reply)
    stage.add(warm)
    while reply.finish is None:
        plan, _ = run_step(stage)
        assert [e.request for e in plan.entries] == [reply]  # the reply never waits for it
    sizes = []
    while stage.has_work():
        plan, new = run_step(stage)
        assert [e.request for e in plan.entries] == [warm] and not new
        sizes.append(len(plan.tokens[0]))
    assert sizes == [TENTATIVE_CHUNK, TENTATIVE_CHUNK, 3]
    assert warm.finish == FinishReason.STOP and not warm.generated
    assert warm_slot.tokens == prompt == lm.cache[warm_slot.index]
    # a later one over the same, fully cached prompt has nothing to do
    again = GenerationRequest("b#warm2", warm_slot, lambda: prompt, 0, tentative=True)
    stage.add(again)
    assert stage.schedule() is None and not stage.has_work()


def test_rolling_a_slot_back_ends_its_tentative_request():
    lm = CountingLM()
    stage = LLMStage(lm)
    slot = Slot(lm.alloc_slot())
    warm = GenerationRequest("b#warm", slot, lambda: [1, 5, 3] * 20, 0, tentative=True)
    stage.add(warm)
    plan = stage.schedule()  # a step in flight
    stage.roll_back(slot, 0)
    stage.update(plan, stage.execute(plan))
    assert warm.finish == FinishReason.ABORT and not stage.has_work()
    assert slot.tokens == [] == lm.cache[slot.index]


def _warmed(lm, prompt: list[int]) -> tuple[LLMStage, Slot]:
    """A stage whose slot holds `prompt`, computed by a warm prefill."""
    stage = LLMStage(lm)
    slot = Slot(lm.alloc_slot())
    stage.add(GenerationRequest("s#warm", slot, lambda: prompt, 0, tentative=True))
    while stage.has_work():
        run_step(stage)
    return stage, slot


def _reply_tokens(stage: LLMStage, slot: Slot, prompt: list[int]) -> list[int]:
    reply = GenerationRequest("s#1", slot, lambda: prompt, 4)
    stage.add(reply)
    while reply.finish is None:
        run_step(stage)
    return reply.generated


def test_a_reply_over_exactly_the_warm_prompt_samples_its_first_token_from_the_kept_logits():
    prompt = [1, 5, 3, 17, 2, 1, 9, 3]
    cold_lm = CountingLM(stop_after=3)
    cold_slot = Slot(cold_lm.alloc_slot())
    cold = _reply_tokens(LLMStage(cold_lm), cold_slot, prompt)
    lm = CountingLM(stop_after=3)
    stage, slot = _warmed(lm, prompt)
    calls = len(lm.calls)
    reply = GenerationRequest("s#1", slot, lambda: prompt, 4)
    stage.add(reply)
    plan, new = run_step(stage)
    assert plan.tokens == [] and plan.entries[0].kept is not None
    assert len(lm.calls) == calls  # no forward: the first token came from the kept logits
    assert [tok for _, tok in new] == cold[:1]
    while reply.finish is None:
        run_step(stage)
    assert reply.generated == cold  # and the reply goes on as a cold one
    assert slot.tokens == lm.cache[slot.index] == cold_slot.tokens


def test_kept_logits_are_not_used_once_the_slot_holds_other_tokens():
    prompt = [1, 5, 3, 17, 2, 1, 9, 3]
    lm = CountingLM(stop_after=3)
    stage, slot = _warmed(lm, prompt)
    stage.roll_back(slot, 4)  # (a discarded speculation, say): the tail is gone
    other = prompt[:4] + [22, 1, 9, 3]
    stage.add(GenerationRequest("s#1", slot, lambda: other, 4))
    calls = len(lm.calls)
    plan, _ = run_step(stage)
    assert plan.tokens == [other[4:]] and len(lm.calls) == calls + 1
    # a reply over a prefix of the warm prompt re-feeds its own last token
    lm = CountingLM(stop_after=3)
    stage, slot = _warmed(lm, prompt)
    stage.add(GenerationRequest("s#2", slot, lambda: prompt[:6], 4))
    plan, _ = run_step(stage)
    assert plan.tokens == [[prompt[5]]]


# ------------------------------------------------------------- a real Llama model


@pytest.fixture(scope="module")
def tiny_chat_factory():
    from transformers import LlamaConfig, LlamaForCausalLM

    from voxline.engines.models.llama import checkpoint, smollm2
    from voxline.engines.models.llama.chat import ChatLLM
    from voxline.engines.models.llama.model import LlamaModel

    loaded = checkpoint.load_llm(smollm2.ensure_smollm2())
    tokenizer = loaded.tokenizer
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=len(tokenizer), max_position_embeddings=512,
                         tie_word_embeddings=True)
    hf = LlamaForCausalLM(config).eval()
    state = hf.state_dict()

    def make() -> ChatLLM:
        model = LlamaModel.from_state_dict(config, state)
        return ChatLLM(checkpoint.LoadedLLM(model, tokenizer, config), max_slots=2,
                       max_len=512, cuda_graphs=False)
    return make


def real_turn(make, warm: bool):
    lm = make()
    e = Engine(lm, warm)
    d = e.driver
    d.send(p.OpenStream("s1", CFG))
    speak_with_partial(e)
    feed(d, np.concatenate([tone(0.6), silence(0.7)]))
    d.run_until(has(p.TranscriptFinal))
    d.send(p.CreateResponse("s1", "r1", "a1", AUTO))
    d.run_until(has(p.ResponseFinished, response_id="r1"))
    done = d.of(p.ResponseFinished)[-1]
    stream = e.core.streams["s1"]
    items, tokens = slot_state(e)
    n = len(tokens)
    kv = [(lm.cache.k[layer][stream.slot.index, :, :n].clone(),
           lm.cache.v[layer][stream.slot.index, :, :n].clone())
          for layer in range(len(lm.cache.k))]
    # the next token after the reply, from the cache as it stands
    logits = lm.forward([stream.slot.index], [[tokens[-1]]])[0]
    e.core.close()
    return done, items, tokens, kv, logits


def test_on_a_real_llama_the_warm_prefill_gives_the_same_cache_logits_and_tokens(
        tiny_chat_factory):
    cold = real_turn(tiny_chat_factory, warm=False)
    warm = real_turn(tiny_chat_factory, warm=True)
    (cold_done, cold_items, cold_tokens, cold_kv, cold_logits) = cold
    (done, items, tokens, kv, logits) = warm
    assert (items, tokens) == (cold_items, cold_tokens)  # same conversation, sampled tokens
    assert done.text == cold_done.text and done.input_tokens == cold_done.input_tokens
    for (k, v), (ck, cv) in zip(kv, cold_kv, strict=True):
        torch.testing.assert_close(k, ck, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(v, cv, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(logits, cold_logits, atol=1e-4, rtol=1e-4)
    assert done.cached_tokens > cold_done.cached_tokens  # the partial's tokens were reused


def test_on_a_real_llama_the_kept_logits_are_a_cold_prefills(tiny_chat_factory):
    lm = tiny_chat_factory()
    prompt = lm.render_message("user", "book a table for four people please.") \
        + lm.generation_header()
    stage, slot = _warmed(lm, prompt)
    cold_lm = tiny_chat_factory()
    cold_slot = cold_lm.alloc_slot()
    cold_logits = cold_lm.forward([cold_slot], [prompt])[0]
    assert slot.kept is not None
    torch.testing.assert_close(slot.kept, cold_logits, atol=1e-4, rtol=1e-4)
    cold_lm.truncate(cold_slot, 0)
    assert _reply_tokens(stage, slot, prompt) == _reply_tokens(
        LLMStage(cold_lm), Slot(cold_slot), prompt)
