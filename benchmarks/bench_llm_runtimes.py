"""LLM runtime options for the reply model on this CPU, side by side: time to the first
spoken clause at batch 1, and decode tokens/s at batch 8.

Variants (each the shipped SmolLM2 behind the engine's own `LLMStage` + `ChatLLM`, so
continuous batching, per-stream KV slots and KV rollback are kept by every one of them):

- ``int8``: the default: each linear reads int8 weights (weight-only, bfloat16
  activations into aten's int8 GEMM), prefill too up to `int8_max_rows`
  (`VOXLINE_LLM_DTYPE=int8`);
- ``float32``: the default before int8;
- ``bfloat16``: weights and KV cache in bfloat16 (`VOXLINE_LLM_DTYPE=bfloat16`);
- ``compiled``: float32 with each decoder layer's math under `torch.compile`
  (the cache bookkeeping stays eager, so batching and rollback are unchanged).

"First clause" is what the engine speaks first: the time from a new stream's request
(system prompt + one question, nothing cached) until the engine's text chunker closes
the reply's first segment, greedy. Batch 8 decodes 32 tokens in each of 8 streams after
their prefill. The variants run interleaved, question by question, so they see the same
machine load; compare the ratios.

    .venv/bin/python benchmarks/bench_llm_runtimes.py [--questions 8] [--variants float32,int8,bfloat16,compiled]
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from voxline.engines.llm_stage import GenerationRequest, LLMStage, Slot  # noqa: E402
from voxline.engines.models.llama.chat import ChatLLM  # noqa: E402
from voxline.engines.models.llama.checkpoint import load_llm  # noqa: E402
from voxline.engines.protocol import DEFAULT_INSTRUCTIONS  # noqa: E402
from voxline.engines.responses import new_chunker  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Who wrote the play Romeo and Juliet?",
    "How many days are there in a leap year?",
    "What is the largest planet in our solar system?",
    "What is the tallest mountain in the world?",
    "What language do most people speak in Brazil?",
    "How far away is the moon from the earth?",
    "Why is the sky blue on a clear summer day?",
    "What should I cook for dinner tonight?",
]
VARIANTS = ("float32", "int8", "bfloat16", "compiled")
BATCH = 8
DECODE_TOKENS = 32


def build(variant: str) -> ChatLLM:
    loaded = load_llm(dtype=variant if variant in ("int8", "bfloat16") else "float32")
    if variant == "compiled":
        # every layer shares one forward whose guards include its layer index: without
        # room for one graph per layer, dynamo stops compiling after 8 and runs the rest eager
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                                   2 * len(loaded.model.model.layers))
        for layer in loaded.model.model.layers:
            layer.forward = torch.compile(layer.forward, dynamic=True)
    return ChatLLM(loaded, max_slots=BATCH, max_len=1024)


def request(llm: ChatLLM, rid: str, question: str, max_tokens: int) -> GenerationRequest:
    index = llm.alloc_slot()
    assert index is not None
    prompt = (llm.render_message("system", DEFAULT_INSTRUCTIONS)
              + llm.render_message("user", question) + llm.generation_header())
    return GenerationRequest(rid, Slot(index), lambda: list(prompt), max_tokens)


def step(stage: LLMStage) -> None:
    plan = stage.schedule()
    if plan is not None:
        stage.update(plan, stage.execute(plan))


def first_clause_s(llm: ChatLLM, question: str) -> tuple[float, str]:
    stage = LLMStage(llm)
    req = request(llm, "q", question, 64)
    chunker = new_chunker()
    stage.add(req)
    t0 = time.perf_counter()
    emitted = ""
    try:
        while stage.has_work():
            step(stage)
            text = llm.decode(req.generated)
            if text.startswith(emitted) and len(text) > len(emitted):
                segments = chunker.push(text[len(emitted):])
                emitted = text
                if segments:
                    return time.perf_counter() - t0, segments[0]
        return time.perf_counter() - t0, (chunker.flush() or [""])[0]
    finally:
        llm.free_slot(req.slot.index)


def batch_tok_s(llm: ChatLLM) -> float:
    stage = LLMStage(llm)
    reqs = [request(llm, f"b{i}", QUESTIONS[i % len(QUESTIONS)], 10_000) for i in range(BATCH)]
    stop = sorted(llm.eos_token_ids)
    sample = llm.sample

    def no_stop(logits: torch.Tensor, temperatures, generators) -> list[int]:
        logits = logits.clone()
        logits[:, stop] = float("-inf")
        return sample(logits, temperatures, generators)

    llm.sample = no_stop  # type: ignore[method-assign]  # every stream decodes all its tokens
    try:
        for req in reqs:
            stage.add(req)
        while any(not r.generated for r in reqs):  # prefill
            step(stage)
        t0, n0 = time.perf_counter(), sum(len(r.generated) for r in reqs)
        while min(len(r.generated) for r in reqs) < DECODE_TOKENS:
            step(stage)
        return (sum(len(r.generated) for r in reqs) - n0) / (time.perf_counter() - t0)
    finally:
        llm.sample = sample  # type: ignore[method-assign]
        for req in reqs:
            stage.abort(req.request_id)
            llm.free_slot(req.slot.index)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=8, help=f"max {len(QUESTIONS)}")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--batch-reps", type=int, default=2, help="batch-8 runs per variant")
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if not variants or any(v not in VARIANTS for v in variants):
        ap.error(f"--variants: a subset of {','.join(VARIANTS)}")
    print("command: " + shlex.join([sys.executable, *sys.argv]))
    one, five, _ = os.getloadavg()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; load average "
          f"{one:.2f}/{five:.2f} on {os.cpu_count()} CPUs (shared: compare ratios)")
    llms: dict[str, ChatLLM] = {}
    for v in variants:
        t0 = time.perf_counter()
        llms[v] = build(v)
        first_clause_s(llms[v], "Hello there, how are you?")  # warm-up (and compile)
        batch_tok_s(llms[v])
        print(f"{v}: loaded and warmed up in {time.perf_counter() - t0:.1f} s")
    clause: dict[str, list[float]] = {v: [] for v in variants}
    for i, q in enumerate(QUESTIONS[: args.questions]):
        for v in (variants if i % 2 == 0 else variants[::-1]):
            s, seg = first_clause_s(llms[v], q)
            clause[v].append(s)
            print(f"  {v:<9} {s * 1000:6.0f} ms  {q!r} -> {seg!r}", flush=True)
    tok_s: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(args.batch_reps):
        for v in (variants if r % 2 == 0 else variants[::-1]):
            tok_s[v].append(batch_tok_s(llms[v]))
    base = variants[0]
    print(f"\n{'variant':<9} | {'first clause p50':>16} {'p95':>6} | {'batch-8 tok/s':>13} | "
          f"ratio to {base} (clause, tok/s)")
    for v in variants:
        p50, p95 = (float(np.percentile(clause[v], q)) * 1000 for q in (50, 95))
        ts = float(np.median(tok_s[v]))
        r1 = p50 / (float(np.percentile(clause[base], 50)) * 1000)
        r2 = ts / float(np.median(tok_s[base]))
        print(f"{v:<9} | {p50:13.0f} ms {p95:6.0f} | {ts:13.1f} | {r1:.2f}, {r2:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
