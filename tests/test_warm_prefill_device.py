"""The warm prefill's kept logits through the embedded chat model, on the CPU and (where
there is one) on CUDA in bfloat16 with the graphed decoder: a reply over exactly the warm
prompt samples its first token from the logits the warm prefill kept, with no step of its
own, and says what a cold reply says. The tokenizer is `bench_gpu_serve`'s locally built
one (no model files)."""

from __future__ import annotations

import pytest
import torch

from voxline.engines.llm_stage import GenerationRequest, LLMStage, Slot

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))]


def tiny_chat_config():
    """`bench_gpu_serve`'s locally built tokenizer (400 entries) and a tiny Llama config
    that matches it."""
    from random_tokenizer import chat_tokenizer
    from transformers import LlamaConfig

    tokenizer = chat_tokenizer(400)
    return tokenizer, LlamaConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=400, max_position_embeddings=256,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id)


def chat_models(device: str, n: int) -> list:
    """`n` chat models over the same tiny random Llama (bf16 and CUDA graphs on CUDA)."""
    from voxline.engines.models.llama import checkpoint
    from voxline.engines.models.llama.chat import ChatLLM
    from voxline.engines.models.llama.model import LlamaModel

    tokenizer, config = tiny_chat_config()
    torch.manual_seed(0)
    state = LlamaModel(config).state_dict()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return [ChatLLM(checkpoint.LoadedLLM(
        LlamaModel.from_state_dict(config, state, dtype=dtype, device=device), tokenizer, config),
        max_slots=2, max_len=256) for _ in range(n)]


def steps(stage: LLMStage, request: GenerationRequest) -> list:
    """Run `request` to its end; the plans it ran in."""
    stage.add(request)
    plans = []
    while stage.has_work():
        plan = stage.schedule()
        assert plan is not None
        stage.update(plan, stage.execute(plan))
        plans.append(plan)
    return plans


@pytest.mark.parametrize("device", DEVICES)
def test_a_reply_over_the_warm_prompt_starts_from_the_kept_logits(device):
    warm_lm, cold_lm = chat_models(device, 2)
    prompt = warm_lm.render_message("user", "book a table for four people please.") \
        + warm_lm.generation_header()
    warm_stage, cold_stage = LLMStage(warm_lm), LLMStage(cold_lm)
    slot, cold_slot = Slot(warm_lm.alloc_slot()), Slot(cold_lm.alloc_slot())
    steps(warm_stage, GenerationRequest("s#warm", slot, lambda: prompt, 0, tentative=True))
    assert slot.kept_logits() is not None and slot.tokens == prompt
    reply = GenerationRequest("s#1", slot, lambda: prompt, 6)
    plans = steps(warm_stage, reply)
    assert plans[0].tokens == []  # its first token came with no forward
    cold = GenerationRequest("c#1", cold_slot, lambda: prompt, 6)
    steps(cold_stage, cold)
    assert reply.generated == cold.generated and len(reply.generated) > 1
    assert slot.tokens == cold_slot.tokens
