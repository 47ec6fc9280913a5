"""The embedded LLM picks its tokens inside its step (`ChatLLM.forward_and_pick`): with
CUDA graphs the unseeded rows are drawn in the graphs, seeded rows from their own
generators, and a seeded reply says the same beside other replies. Run here on the
graphs' CPU twins (the CUDA case is skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from voxline.engines.llm_stage import GenerationRequest, LLMStage, Slot
from voxline.engines.models.sampling import sample

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))]


def graphed_chat(device: str, monkeypatch: pytest.MonkeyPatch, max_slots: int = 3):
    """A tiny random Llama as a `ChatLLM` with graphed steps (their eager twins on the CPU)."""
    from test_warm_prefill_device import tiny_chat_config

    from voxline.engines.models.llama import chat, checkpoint
    from voxline.engines.models.llama.graphs import GraphedLlamaDecoder
    from voxline.engines.models.llama.model import LlamaModel

    if device == "cpu":  # the twins: the same steps, not captured
        monkeypatch.setattr(chat, "GraphedLlamaDecoder",
                            lambda model, **kw: GraphedLlamaDecoder(model, **{**kw, "capture": False}))
    tokenizer, config = tiny_chat_config()
    torch.manual_seed(0)
    model = LlamaModel.from_state_dict(config, LlamaModel(config).state_dict(),
                                       dtype=torch.bfloat16 if device == "cuda" else torch.float32,
                                       device=device)
    lm = chat.ChatLLM(checkpoint.LoadedLLM(model, tokenizer, config), max_slots=max_slots,
                      max_len=256, cuda_graphs=True)
    assert lm.decoder is not None
    return lm


@pytest.mark.parametrize("device", DEVICES)
def test_seeded_rows_draw_from_their_own_generator_the_rest_in_the_graph(device, monkeypatch):
    lm = graphed_chat(device, monkeypatch)
    slots = [lm.alloc_slot() for _ in range(3)]
    prompts = [lm.render_message("user", t) + lm.generation_header()
               for t in ("hello there", "what time is it", "tell me a story")]
    logits, picks = lm.forward_and_pick(slots, prompts, [50.0, 0.0, 50.0],
                                        [torch.Generator().manual_seed(7), None, None])
    assert len(picks) == 3 and logits.shape[0] == 3
    assert picks[1] == int(logits[1].argmax())  # temperature 0: greedy
    for seed in (7, 8, 9):  # what a seeded generator draws from its row alone, whatever the batch
        lm2 = graphed_chat(device, monkeypatch)
        s2 = [lm2.alloc_slot() for _ in range(3)]
        _, got = lm2.forward_and_pick(s2, prompts, [50.0, 0.0, 50.0],
                                      [torch.Generator().manual_seed(seed), None, None])
        own = sample(logits[:1], [50.0], generators=[torch.Generator().manual_seed(seed)])
        assert got[0] == own.tolist()[0], seed
    steps = lm.decoder.prefill_steps
    lm.forward_and_pick(slots, [[picks[0]], [picks[1]], [picks[2]]], [50.0, 0.0, 50.0],
                        [None, None, None])
    assert lm.decoder.graph_steps == 1 and lm.decoder.prefill_steps == steps  # one decode replay


def seeded_reply(lm, prompt: list[int], neighbours: int) -> list[int]:
    """A seeded reply's tokens, beside ``neighbours`` unseeded hot replies."""
    stage = LLMStage(lm)
    mine = GenerationRequest("mine", Slot(lm.alloc_slot()), lambda: list(prompt), max_tokens=8,
                             temperature=50.0, generator=torch.Generator().manual_seed(42))
    stage.add(mine)
    for i in range(neighbours):
        other = lm.render_message("user", "some other question " * (i + 1)) + lm.generation_header()
        stage.add(GenerationRequest(f"n{i}", Slot(lm.alloc_slot()), lambda o=other: o,
                                    max_tokens=8, temperature=50.0))
    while stage.has_work():
        plan = stage.schedule()
        stage.update(plan, stage.execute(plan))
    return mine.generated


def test_a_seeded_reply_says_the_same_beside_other_replies(monkeypatch):
    lm, other_lm = graphed_chat("cpu", monkeypatch), graphed_chat("cpu", monkeypatch)
    prompt = lm.render_message("user", "book a table for four") + lm.generation_header()
    alone = seeded_reply(lm, prompt, neighbours=0)
    assert len(alone) == 8  # (no EOS drawn: a distinct reply to compare)
    assert seeded_reply(other_lm, prompt, neighbours=2) == alone
    assert other_lm.decoder.graph_steps > 0  # the neighbours' tokens came from the graph path
