"""LLM scheduler logic with a hand-built model (no weights): batching, reuse, discard."""

from __future__ import annotations

from fakes import EOS, CountingLM

from voxline.config import Settings
from voxline.engines.llm_stage import (
    STEP_TOKENS,
    FinishReason,
    GenerationRequest,
    LLMStage,
    Slot,
    plan_kind,
)


def make_request(lm: CountingLM, rid: str, prompt: list[int], max_tokens: int = 32) -> GenerationRequest:
    slot = Slot(lm.alloc_slot())
    return GenerationRequest(rid, slot, lambda: list(prompt), max_tokens)


def run_step(stage: LLMStage):
    plan = stage.schedule()
    assert plan is not None
    return plan, stage.update(plan, stage.execute(plan))


def test_requests_join_and_leave_the_batch_every_step():
    lm = CountingLM(stop_after=3)
    stage = LLMStage(lm)
    a = make_request(lm, "a#1", [1, 9, 3])
    stage.add(a)
    run_step(stage)  # a: prefill
    b = make_request(lm, "b#1", [5, 1, 9, 3])
    stage.add(b)
    plan, _ = run_step(stage)
    assert {e.request.request_id for e in plan.entries} == {"a#1", "b#1"}
    # a decodes one token while b prefills its whole prompt in the same forward
    assert [len(t) for t in plan.tokens] == [1, 4]
    while stage.has_work():
        run_step(stage)
    assert a.finish == b.finish == FinishReason.STOP
    assert len(a.generated) == len(b.generated) == 3
    assert EOS not in a.generated


def test_the_load_note_describes_the_plans_since_the_last_one():
    lm = CountingLM(stop_after=3)
    stage = LLMStage(lm)
    assert stage.load_note() is None
    stage.add(make_request(lm, "a#1", [1, 9, 3]))
    plan, _ = run_step(stage)  # a prefills 3 tokens
    kinds = [plan_kind(plan)]
    stage.add(make_request(lm, "b#1", [5, 1, 9, 3, 7]))
    plan, _ = run_step(stage)  # a decodes beside b's 5-token prompt
    kinds.append(plan_kind(plan))
    plan, _ = run_step(stage)  # both decode
    kinds.append(plan_kind(plan))
    assert stage.load_note() == ("1.0 decode rows a plan; 2 plans with prompts, 4 prompt "
                                 "tokens each; largest 6 tokens")
    assert stage.load_note() is None  # reset
    # the load report times the plans by kind (stage_table)
    assert kinds == ["with prompts", "with prompts", "decode only"]


def test_max_tokens_finishes_with_length():
    lm = CountingLM(stop_after=100)
    stage = LLMStage(lm)
    req = make_request(lm, "a#1", [1, 9, 3], max_tokens=5)
    stage.add(req)
    while stage.has_work():
        run_step(stage)
    assert req.finish == FinishReason.LENGTH and len(req.generated) == 5


def test_new_turn_is_appended_to_the_cached_prefix_without_reprefill():
    lm = CountingLM(stop_after=4)
    stage = LLMStage(lm)
    convo = [1, 5, 3, 20, 21, 2, 3]
    slot = Slot(lm.alloc_slot())
    first = GenerationRequest("s#1", slot, lambda: convo + [1, 9, 3], 16)
    stage.add(first)
    while stage.has_work():
        run_step(stage)
    # the assistant turn joins the conversation with its exact sampled tokens, then a user turn
    convo += [1, 9, 3] + first.generated + [2, 3] + [1, 5, 3, 30, 2, 3]
    second = GenerationRequest("s#2", slot, lambda: convo + [1, 9, 3], 16)
    stage.add(second)
    lm.calls.clear()
    plan, _ = run_step(stage)
    fed = plan.tokens[0]
    # only what the cache lacks: the footer (the EOS was sampled, never fed), the new
    # user turn and the header; never the earlier prefix
    assert fed == [2, 3, 1, 5, 3, 30, 2, 3, 1, 9, 3]
    assert second.cached_tokens == len(slot.tokens) - len(fed)


def test_token_of_a_step_in_flight_is_discarded_when_input_changes():
    lm = CountingLM(stop_after=50)
    stage = LLMStage(lm)
    convo = [1, 5, 3, 20, 2, 3]
    req = make_request(lm, "s#1", [])
    req.prompt = lambda: convo + [1, 9, 3]
    stage.add(req)
    run_step(stage)
    run_step(stage)
    confirmed = list(req.slot.tokens)
    generated = list(req.generated)
    plan = stage.schedule()  # decode step scheduled ...
    logits = stage.execute(plan)  # ... and run, while new input arrives:
    convo[3] = 25
    req.epoch += 1
    new = stage.update(plan, logits)
    assert new == []
    assert req.generated == generated  # the unconfirmed token is gone
    assert req.slot.tokens == confirmed  # nothing of the step was confirmed
    assert lm.cache[req.slot.index] == confirmed  # and the cache was rolled back
    # the next step re-prefills from the edit point, carrying the confirmed tokens over
    plan, _ = run_step(stage)
    assert plan.tokens[0] == [25, 2, 3, 1, 9, 3] + generated


def test_abort_frees_the_batch_slot_within_one_step():
    lm = CountingLM(stop_after=50)
    stage = LLMStage(lm)
    a = make_request(lm, "a#1", [1, 9, 3])
    b = make_request(lm, "b#1", [1, 9, 3])
    stage.add(a)
    stage.add(b)
    run_step(stage)
    plan = stage.schedule()
    stage.abort("a#1")
    stage.update(plan, stage.execute(plan))
    assert a.finish == FinishReason.ABORT
    plan = stage.schedule()
    assert [e.request.request_id for e in plan.entries] == ["b#1"]
    assert lm.cache[a.slot.index] == a.slot.tokens  # aborted step rolled back


def test_context_overflow_fails_the_request_only():
    lm = CountingLM(max_len=16)
    stage = LLMStage(lm)
    big = make_request(lm, "big#1", list(range(10, 30)))
    ok = make_request(lm, "ok#1", [1, 9, 3])
    stage.add(big)
    stage.add(ok)
    plan = stage.schedule()
    assert [e.request.request_id for e in plan.entries] == ["ok#1"]
    assert [r.request_id for r in stage.finished_with_error()] == ["big#1"]
    assert big.finish == FinishReason.ERROR


def test_prefill_is_chunked_under_the_token_budget():
    lm = CountingLM(stop_after=2)
    stage = LLMStage(lm, token_budget=4)
    req = make_request(lm, "a#1", [1, 5, 3, 11, 12, 13, 2, 3, 1, 9, 3])
    stage.add(req)
    sizes = []
    while stage.has_work():
        plan, _ = run_step(stage)
        sizes.append(len(plan.tokens[0]))
    assert sizes[:3] == [4, 4, 3] and len(req.generated) == 2


def test_running_replies_take_the_budget_first_and_a_new_prompt_the_rest():
    lm = CountingLM(stop_after=8)
    stage = LLMStage(lm, token_budget=4)
    a, b = make_request(lm, "a#1", [1, 9, 3]), make_request(lm, "b#1", [1, 9, 3])
    stage.add(a)
    stage.add(b)
    plan, _ = run_step(stage)  # a's prompt whole, b's first token of it
    assert [len(t) for t in plan.tokens] == [3, 1]
    run_step(stage)  # a decodes, b's prompt goes on
    c = make_request(lm, "c#1", [5, 1, 9, 3, 7, 7])
    stage.add(c)
    plan, _ = run_step(stage)  # a and b decode one token each; c gets what is left
    assert [(e.request.request_id, len(t)) for e, t in zip(plan.entries, plan.tokens, strict=True)] == [
        ("a#1", 1), ("b#1", 1), ("c#1", 2)]


def test_the_step_token_setting_reaches_the_llm_stage(monkeypatch):
    from fakes import make_fake_core

    from voxline.engines import core, factory

    assert make_fake_core(lambda: None).llm.token_budget == STEP_TOKENS == Settings().llm_step_tokens
    seen: dict = {}
    monkeypatch.setattr(factory, "load_models", lambda *a, **k: None)
    monkeypatch.setattr(factory.EngineCore, "from_settings",
                        lambda models, wake, settings, **kw: seen.update(settings=settings))
    factory.make_engine_core(lambda: None, {"llm_step_tokens": 96})
    assert seen["settings"].llm_step_tokens == 96
    real = core.EngineCore(make_fake_core(lambda: None).models, lambda: None, llm_step_tokens=96)
    assert real.llm.token_budget == 96
    assert real.table["llm"].kind is plan_kind  # its load line times plans with prompts apart


def test_the_prefill_graph_setting_reaches_the_chat_model_or_is_refused(monkeypatch):
    import pytest

    from voxline.engines import factory
    from voxline.engines.models.llama import chat, checkpoint

    seen: dict = {}
    monkeypatch.setattr(checkpoint, "load_llm", lambda *a, **k: "loaded")
    monkeypatch.setattr(chat, "ChatLLM", lambda loaded, **kw: seen.update(kw))
    monkeypatch.setattr(factory, "llm_device", lambda settings: settings.llm_device)
    for mode, on in (("auto", True), ("off", False)):
        factory.load_reply_model(Settings(llm_device="cuda", llm_prefill_graphs=mode), None, 4, 256)
        assert seen["prefill_graphs"] is on
    # 'off' where no prompt could run from a graph is refused, naming the setting
    with pytest.raises(ValueError, match="llm_prefill_graphs=off applies to the embedded LLM on CUDA"):
        factory.load_reply_model(Settings(llm_prefill_graphs="off"), None, 4, 256)
    with pytest.raises(ValueError, match="llm_prefill_graphs=off .*llm=openai"):
        factory.load_reply_model(Settings(llm_prefill_graphs="off", llm_device="cuda",
                                          llm="openai:http://127.0.0.1:9/v1", llm_model="m"),
                                 None, 4, 256)
    with pytest.raises(ValueError, match="llm_prefill_graphs"):
        Settings(llm_prefill_graphs="on")


def test_a_new_stream_starts_from_the_kept_system_prompt():
    lm = CountingLM(max_slots=2, stop_after=2)
    stage = LLMStage(lm)
    system = lm.render_message("system", "be brief and kind")
    header = lm.generation_header()
    first = make_request(lm, "a", system + lm.render_message("user", "hi") + header)
    first.shared_prefix = len(system)
    stage.add(first)
    while stage.has_work():
        run_step(stage)
    second = make_request(lm, "b", system + lm.render_message("user", "hello you") + header)
    second.shared_prefix = len(system)
    stage.add(second)
    plan, _ = run_step(stage)
    fed, = plan.tokens
    assert fed == lm.render_message("user", "hello you") + header  # no system prefill
    assert second.cached_tokens == len(system)
    assert lm.cache[second.slot.index][: len(system)] == system
    while stage.has_work():
        run_step(stage)
    assert second.finish == FinishReason.STOP and len(second.generated) == 2


def test_tokens_are_sampled_in_execute_on_the_worker_and_update_only_confirms_them():
    lm = CountingLM(stop_after=50)
    stage = LLMStage(lm)
    seen: list[tuple[list[float], int]] = []
    argmax = lm.sample
    lm.sample = lambda logits, temps, gens: seen.append((temps, len(logits))) or argmax(logits, temps, gens)
    a, b = make_request(lm, "a", [1, 9, 3]), make_request(lm, "b", [1, 7, 7, 3])
    b.temperature = 0.7  # reaches the model's sampler with its row
    stage.add(a)
    stage.add(b)
    plan = stage.schedule()
    result = stage.execute(plan)
    assert seen == [([0.0, 0.7], 2)]  # one batched sampling call, in execute
    assert len(result.picks) == 2 and result.logits.shape[0] == 2
    lm.sample = None  # update must not sample again (the engine loop runs it)
    assert stage.update(plan, result) == [(a, result.picks[0]), (b, result.picks[1])]
    assert a.generated == [result.picks[0]] and b.generated == [result.picks[1]]
