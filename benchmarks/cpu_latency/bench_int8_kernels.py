"""The embedded LLM's int8 prefill kernels on this CPU: weight-only against dynamic.

The shipped SmolLM2-135M loaded three ways in one run: float32, int8 weight-only
(``llm_int8_prefill=weight-only``: bfloat16 activations, aten's ``_weight_int8pack_mm``)
and int8 with dynamic prefill (``llm_int8_prefill=dynamic``: steps of several tokens
quantize each token's activations to int8 and multiply with ``_int_mm``; single-token
decode steps stay weight-only). For each, in one process and interleaved:

- one step of N tokens of one sequence (a prefill of N; N=1 is a decode step) after a
  prompt of up to 40 tokens already in the cache, median ms over ``--reps``;
- greedy replies to ten short questions (a system prompt, then the question prefilled in
  one step, then ``--tokens`` decode steps): how many tokens each variant keeps equal to
  float32's before the first difference (mean over the questions).

    .venv/bin/python benchmarks/cpu_latency/bench_int8_kernels.py [--rows 1,9,16,32,64,128]
        [--reps 15] [--tokens 30] [--threads 1]

The engine's own choice on this CPU (``llm_int8_prefill=auto``) is printed first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from voxline.engines.models.llama.chat import ChatLLM  # noqa: E402
from voxline.engines.models.llama.checkpoint import INT8, load_llm  # noqa: E402
from voxline.kernels.int8_linear import dynamic_prefill_default, native_bfloat16  # noqa: E402

QUESTIONS = [
    "What is the capital of France, and what is it famous for?",
    "How many legs does a spider have?",
    "Why is the sky blue on a clear summer day?",
    "Who wrote the play Romeo and Juliet?",
    "Can you tell me the way to the nearest train station?",
    "I would like to book a table for four people tonight.",
    "At what temperature does water boil at sea level?",
    "How many days are there in a leap year?",
    "Tell me a short story about a dragon.",
    "What should I cook for dinner tonight?",
]
SYSTEM = "You are a helpful voice assistant. Answer in one or two short sentences."


def step_ms(model, context: list[int], rows: int, reps: int) -> float:
    """Median ms of one step of `rows` new tokens after `context` (cache slot 0)."""
    cache = model.cache
    new = [(context[i % len(context)] + 7) % model.config.vocab_size for i in range(rows)]
    times = []
    for _ in range(reps):
        cache.lengths[0] = 0
        model.forward_batch([0], [context])
        t0 = time.perf_counter()
        model.forward_batch([0], [new])
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def greedy(llm: ChatLLM, question: str, tokens: int) -> list[int]:
    model = llm.model
    model.cache.lengths[0] = 0
    model.forward_batch([0], [llm.render_message("system", SYSTEM)])
    prompt = llm.render_message("user", question) + llm.generation_header()
    logits = model.forward_batch([0], [prompt])
    out: list[int] = []
    for _ in range(tokens):
        out.append(int(logits[0].argmax()))
        logits = model.forward_batch([0], [[out[-1]]])
    return out


def same_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,9,16,32,64,128", help="tokens per measured step")
    ap.add_argument("--reps", type=int, default=15, help="timed steps per size and variant")
    ap.add_argument("--tokens", type=int, default=30, help="greedy tokens per question")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    print(f"CPU kernels {torch.backends.cpu.get_cpu_capability()}, native bfloat16: "
          f"{native_bfloat16()}; llm_int8_prefill=auto picks "
          f"{'dynamic' if dynamic_prefill_default() else 'weight-only'}; torch "
          f"{torch.__version__}, {args.threads} thread(s)")
    variants = {  # the engine's chat wrapper: its chat format and a one-slot cache
        "float32": ChatLLM(load_llm(None, torch.float32), max_slots=1, max_len=1024),
        "int8 weight-only": ChatLLM(load_llm(None, INT8, dynamic_prefill=False),
                                    max_slots=1, max_len=1024),
        "int8 dynamic prefill": ChatLLM(load_llm(None, INT8, dynamic_prefill=True),
                                        max_slots=1, max_len=1024),
    }
    chat = variants["float32"]
    context = (chat.render_message("system", SYSTEM)
               + chat.render_message("user", QUESTIONS[0]))[:40]
    times: dict[str, dict[int, float]] = {name: {} for name in variants}
    with torch.inference_mode():
        for r in rows:  # sizes outer, variants inner: each size sees the same machine
            for name, llm in variants.items():
                times[name][r] = step_ms(llm.model, context, r, args.reps)
        replies = {name: [greedy(llm, q, args.tokens) for q in QUESTIONS]
                   for name, llm in variants.items()}
    print(f"\none step of N tokens after a {len(context)}-token context, median ms of "
          f"{args.reps}")
    print(f"{'N':>5} | " + " | ".join(f"{name:>20}" for name in variants)
          + " | weight-only / dynamic")
    for r in rows:
        cells = " | ".join(f"{times[name][r]:>20.1f}" for name in variants)
        ratio = times["int8 weight-only"][r] / times["int8 dynamic prefill"][r]
        print(f"{r:>5} | {cells} | {ratio:>6.2f}x")
    print(f"\ngreedy replies to {len(QUESTIONS)} questions, {args.tokens} tokens: tokens equal "
          "to float32's before the first difference")
    for name in ("int8 weight-only", "int8 dynamic prefill"):
        kept = [same_prefix(a, b) for a, b in zip(replies["float32"], replies[name],
                                                  strict=True)]
        print(f"  {name:<22} mean {statistics.mean(kept):5.1f}  {kept}")
    print(f"  float32's first reply: {chat.decode(replies['float32'][0])!r}")
    print(f"  dynamic's first reply: {chat.decode(replies['int8 dynamic prefill'][0])!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
