"""LLM decode throughput: the engine's continuous batching vs sequential transformers generate().

For each stream count S (``--streams``), in one run and interleaved:

- engine: S generation requests are added to one `LLMStage` (our `LlamaModel` with its
  slot KV cache, via `ChatLLM`) at once and stepped until all are done, exactly as the
  engine's LLM worker does (schedule -> execute -> update), minus the thread hop;
- reference: the same S prompts through transformers' `generate()` one after another
  (batch 1, greedy, KV cache on), the way a server without batching would serve them.

Both sides generate exactly ``--tokens`` tokens per stream, greedy: the engine masks the
stop tokens out of the logits before sampling (so EOS is never picked and never ends a
request), and `generate()` gets ``min_new_tokens == max_new_tokens`` with the same stop
ids (its `MinNewTokensLengthLogitsProcessor` does the same masking). Same weights, same
prompts, same dtype, so the outputs should match token for token in float32; the
parity column says how many streams matched.

Only generated tokens are counted. "prefill" is the time until every stream has its
first token (engine: one batched pass; reference: summed over the sequential calls);
"decode tok/s" counts the tokens generated after that point over the time after it.

    .venv/bin/python benchmarks/cpu_latency/bench_llm.py [--dtype float32|bfloat16] [--streams 1,4,16]
                                             [--tokens 64] [--reps 1] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from voxline.engines.llm_stage import GenerationRequest, LLMStage, Slot  # noqa: E402
from voxline.engines.models.llama.chat import ChatLLM  # noqa: E402
from voxline.engines.models.llama.checkpoint import load_hf_smollm2, load_llm  # noqa: E402

SYSTEM = "You are a knowledgeable assistant who writes long, detailed answers."
# Long-answer prompts, so that even without the EOS mask the model would keep going.
QUESTIONS = [
    "Write a detailed essay about the history of the Roman Empire.",
    "Explain in detail how a car engine works.",
    "Describe the water cycle step by step, with examples.",
    "Write a long story about a dragon who learns to bake bread.",
    "Explain how computers store and process information.",
    "Describe the life cycle of a star in as much detail as you can.",
    "Write a long letter to a friend describing your summer holiday.",
    "Explain the causes and effects of the French Revolution.",
    "Describe how plants turn sunlight into energy.",
    "Write a detailed guide to planting a vegetable garden.",
    "Explain how the human heart pumps blood through the body.",
    "Write a long story about a sailor lost at sea.",
    "Describe the main features of the Renaissance in Europe.",
    "Explain how airplanes are able to fly.",
    "Write a detailed review of your favourite book.",
    "Describe how a city's public transport system could be improved.",
]
PROMPT_ROOM = 96


# --------------------------------------------------------------------------- helpers


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def print_header(args: argparse.Namespace) -> None:
    print("command: " + shlex.join([sys.executable, *sys.argv]))
    print(f"torch {torch.__version__}, torch threads {torch.get_num_threads()}, "
          f"dtype {args.dtype}, {args.tokens} generated tokens per stream")
    print(f"machine: {load_note()}. The CPUs are shared with other work, so absolute numbers "
          "are noisy; engine and generate() runs are interleaved per stream count, so compare "
          "the ratios.")


class FixedLengthLM:
    """`ChatLLM` as seen by `LLMStage`, with stop tokens masked out: every request runs to
    `max_tokens` (the engine-side twin of `min_new_tokens == max_new_tokens`)."""

    eos_token_ids: frozenset[int] = frozenset()

    def __init__(self, llm: ChatLLM) -> None:
        self.llm = llm
        self.max_len = llm.max_len
        self._stop = sorted(llm.eos_token_ids)

    def alloc_slot(self) -> int | None:
        return self.llm.alloc_slot()

    def free_slot(self, slot: int) -> None:
        self.llm.free_slot(slot)

    def truncate(self, slot: int, length: int) -> None:
        self.llm.truncate(slot, length)

    def save_prefix(self, slot: int, tokens: list[int]) -> None:
        self.llm.save_prefix(slot, tokens)

    def load_prefix(self, slot: int, target: list[int]) -> int:
        return self.llm.load_prefix(slot, target)

    def forward(self, slots: list[int], tokens: list[list[int]]) -> torch.Tensor:
        return self.llm.forward(slots, tokens)

    def sample(self, logits: torch.Tensor, temperatures: list[float],
               generators: list[torch.Generator | None]) -> list[int]:
        logits = logits.clone()
        logits[:, self._stop] = float("-inf")
        return self.llm.sample(logits, temperatures, generators)


@dataclass
class RunResult:
    total_s: float  # first input -> last token
    prefill_s: float  # until every stream had its first token
    generated: int  # tokens generated in all
    decode_tokens: int  # of which generated after prefill_s
    outputs: list[list[int]]
    steps: int = 0
    cpu_s: float = 0.0  # process CPU time (all threads) spent in the run

    @property
    def tok_cpu_s(self) -> float:
        return self.generated / max(self.cpu_s, 1e-9)

    @property
    def tok_s(self) -> float:
        return self.generated / self.total_s

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / max(self.total_s - self.prefill_s, 1e-9)


def run_engine(llm: ChatLLM, prompts: Sequence[list[int]], tokens: int) -> RunResult:
    """All prompts join one LLMStage at once; step it until every request is done."""
    model = FixedLengthLM(llm)
    stage = LLMStage(model)
    requests: list[GenerationRequest] = []
    for i, prompt in enumerate(prompts):
        index = model.alloc_slot()
        if index is None:
            raise RuntimeError(f"no free KV slot for stream {i}: raise max_slots")
        requests.append(GenerationRequest(f"bench#{i}", Slot(index), lambda p=prompt: p, tokens))
    c0 = time.process_time()
    t0 = time.perf_counter()
    for req in requests:
        stage.add(req)
    prefill_s: float | None = None
    at_prefill = 0
    steps = 0
    try:
        while stage.has_work():
            plan = stage.schedule()
            if plan is None:
                break
            stage.update(plan, stage.execute(plan))
            steps += 1
            if prefill_s is None and all(r.generated for r in requests):
                prefill_s = time.perf_counter() - t0
                at_prefill = sum(len(r.generated) for r in requests)
        total_s = time.perf_counter() - t0
        cpu_s = time.process_time() - c0
    finally:
        for req in requests:
            model.free_slot(req.slot.index)
    bad = [r.request_id for r in requests if len(r.generated) != tokens]
    if bad:
        raise RuntimeError(f"engine requests ended early: {bad} ({requests[0].finish!r})")
    generated = sum(len(r.generated) for r in requests)
    return RunResult(total_s, prefill_s or total_s, generated, generated - at_prefill,
                     [list(r.generated) for r in requests], steps, cpu_s)


class _StepClock:
    """A no-op logits processor that notes when each generate() step reaches sampling."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.times.append(time.perf_counter())
        return scores


def run_reference(hf: Any, prompts: Sequence[list[int]], tokens: int,
                  stop_ids: list[int], pad_id: int) -> RunResult:
    """Sequential greedy generate() calls, one prompt at a time."""
    from transformers import GenerationConfig, LogitsProcessorList

    config = GenerationConfig(do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens,
                              eos_token_id=stop_ids, pad_token_id=pad_id, use_cache=True)
    total = prefill = 0.0
    outputs: list[list[int]] = []
    decode_tokens = 0
    c0 = time.process_time()
    for prompt in prompts:
        ids = torch.tensor([prompt], dtype=torch.long)
        clock = _StepClock()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                              logits_processor=LogitsProcessorList([clock]))
        t1 = time.perf_counter()
        new = out[0, len(prompt):].tolist()
        if len(new) != tokens:
            raise RuntimeError(f"generate() made {len(new)} tokens, expected {tokens}")
        outputs.append(new)
        total += t1 - t0
        prefill += clock.times[0] - t0
        decode_tokens += tokens - 1
    return RunResult(total, prefill, tokens * len(prompts), decode_tokens, outputs,
                     steps=tokens * len(prompts), cpu_s=time.process_time() - c0)


def median_result(results: list[RunResult]) -> RunResult:
    """The run with the median total time (one run: itself)."""
    return sorted(results, key=lambda r: r.total_s)[(len(results) - 1) // 2]


def parity(a: list[list[int]], b: list[list[int]]) -> str:
    same = sum(x == y for x, y in zip(a, b, strict=True))
    prefixes = []
    for x, y in zip(a, b, strict=True):
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        prefixes.append(n)
    return f"{same}/{len(a)} (min prefix {min(prefixes)})"


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--streams", default="1,4,16",
                    help="comma-separated concurrent stream counts (default 1,4,16)")
    ap.add_argument("--tokens", type=int, default=64, help="generated tokens per stream")
    ap.add_argument("--reps", type=int, default=1,
                    help="repetitions per stream count (median reported; order alternates)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    args = ap.parse_args(argv)
    args.stream_counts = [int(s) for s in args.streams.split(",") if s.strip()]
    if not args.stream_counts or min(args.stream_counts) < 1 or args.tokens < 1 or args.reps < 1:
        ap.error("--streams, --tokens and --reps must be positive")
    if max(args.stream_counts) > len(QUESTIONS):
        ap.error(f"at most {len(QUESTIONS)} streams (one distinct prompt each)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print_header(args)

    t0 = time.perf_counter()
    loaded = load_llm(None, args.dtype)
    hf = load_hf_smollm2(args.dtype)
    max_streams = max(args.stream_counts)
    # Cache sized for the longest prompt (< PROMPT_ROOM tokens) plus the generated tokens.
    llm = ChatLLM(loaded, max_slots=max_streams, max_len=PROMPT_ROOM + args.tokens)
    system = llm.render_message("system", SYSTEM)
    header = llm.generation_header()
    prompts = [system + llm.render_message("user", q) + header for q in QUESTIONS]
    prompt_tokens = max(len(p) for p in prompts)
    if prompt_tokens >= PROMPT_ROOM:
        raise RuntimeError(f"prompts of {prompt_tokens} tokens exceed PROMPT_ROOM")
    stop_ids = sorted(llm.eos_token_ids)
    pad_id = loaded.tokenizer.pad_token_id
    pad_id = stop_ids[0] if pad_id is None else int(pad_id)
    print(f"models loaded in {time.perf_counter() - t0:.1f} s; prompts "
          f"{min(len(p) for p in prompts)}-{prompt_tokens} tokens; engine KV cache "
          f"{llm.cache.nbytes / 2**20:.0f} MiB ({max_streams} slots x {llm.max_len} positions)")

    # Warm-up (first-call allocations, oneDNN kernels) on both sides, not measured.
    run_engine(llm, prompts[:2], 4)
    run_reference(hf, prompts[:1], 4, stop_ids, pad_id)

    rows: list[tuple[int, RunResult, RunResult]] = []
    for streams in args.stream_counts:
        batch = prompts[:streams]
        engine_runs: list[RunResult] = []
        ref_runs: list[RunResult] = []
        for rep in range(args.reps):
            order = ("engine", "ref") if (rep + len(rows)) % 2 == 0 else ("ref", "engine")
            for side in order:
                if side == "engine":
                    engine_runs.append(run_engine(llm, batch, args.tokens))
                else:
                    ref_runs.append(run_reference(hf, batch, args.tokens, stop_ids, pad_id))
            e, r = engine_runs[-1], ref_runs[-1]
            print(f"  streams {streams:>2} rep {rep + 1}: engine {e.total_s:6.2f} s "
                  f"({e.tok_s:6.1f} tok/s, {e.steps} steps) | generate() {r.total_s:6.2f} s "
                  f"({r.tok_s:6.1f} tok/s) | CPU s {e.cpu_s:.1f} vs {r.cpu_s:.1f}  "
                  f"[{load_note()}]", flush=True)
        rows.append((streams, median_result(engine_runs), median_result(ref_runs)))

    print()
    print(f"Aggregate generated tokens/s, {args.tokens} tokens per stream, {args.dtype}, "
          f"median of {args.reps} rep(s); ratio = engine / sequential generate()")
    head = (f"{'streams':>7} | {'engine tok/s':>12} {'decode':>8} {'prefill s':>9} | "
            f"{'generate() tok/s':>16} {'decode':>8} {'prefill s':>9} | {'ratio':>6} "
            f"{'decode ratio':>12} | {'greedy parity':>18}")
    print(head)
    print("-" * len(head))
    for streams, e, r in rows:
        print(f"{streams:>7} | {e.tok_s:>12.1f} {e.decode_tok_s:>8.1f} {e.prefill_s:>9.3f} | "
              f"{r.tok_s:>16.1f} {r.decode_tok_s:>8.1f} {r.prefill_s:>9.3f} | "
              f"{e.tok_s / r.tok_s:>5.2f}x {e.decode_tok_s / r.decode_tok_s:>11.2f}x | "
              f"{parity(e.outputs, r.outputs):>18}")
    print()
    print("Same runs per CPU-second (process CPU time, all threads): less sensitive to other "
          "load than wall time, exactly so with --threads 1 (busy-waiting threads inflate it)")
    head2 = f"{'streams':>7} | {'engine tok/CPU-s':>16} | {'generate() tok/CPU-s':>20} | {'ratio':>6}"
    print(head2)
    print("-" * len(head2))
    for streams, e, r in rows:
        print(f"{streams:>7} | {e.tok_cpu_s:>16.1f} | {r.tok_cpu_s:>20.1f} | "
              f"{e.tok_cpu_s / r.tok_cpu_s:>5.2f}x")
    print()
    print("tok/s: all generated tokens / wall time from first input to last token. "
          "decode: tokens generated after every stream had its first token / time after it. "
          "prefill s: time until every stream had its first token (generate(): summed over "
          "the sequential calls). parity: streams whose tokens equal generate()'s.")
    print(f"machine at end: {load_note()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
