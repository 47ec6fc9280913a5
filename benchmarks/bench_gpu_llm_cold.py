"""Cold prompt shapes on a GPU: is a prefill slower the first time its shape is seen?

    python benchmarks/bench_gpu_llm_cold.py --out /tmp/cold.json

The H200 serving runs' first level after start-up is slow (LLM plans of 25-30 ms against
6-8 ms later). The engine's prompts are prefilled eagerly (`LlamaModel.forward_batch`),
one call per step with the step's prompt rows. This builds the Llama-3.2-1B shape with
random weights (bfloat16) and times such calls on a fresh model: each shape (rows x
tokens) three times (the first is the cold one), then the same shapes' neighbours (one
token longer, never seen), then, after a warm-up over a grid of shapes, another set of
unseen shapes. Each call is host wall time to its logits on the host, as the LLM stage
pays it; the slot is rolled back between calls.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from bench_gpu_llm import SHAPES  # noqa: E402

from voxline.engines.models.llama.model import LlamaModel  # noqa: E402

SEEN = [(1, 40), (1, 57), (4, 90), (8, 130), (16, 45), (1, 300), (32, 70), (64, 60)]
GRID_ROWS = (1, 2, 4, 8, 16, 32, 64)
GRID_TOKENS = (16, 32, 64, 128, 256, 512)
AFTER_GRID = [(3, 77), (1, 111), (12, 50), (48, 33), (5, 200)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="1b", choices=sorted(SHAPES))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run (use --max-rows 2)")
    ap.add_argument("--max-rows", type=int, default=64, help="skip shapes with more rows")
    args = ap.parse_args()
    global SEEN, AFTER_GRID, GRID_ROWS
    SEEN = [s for s in SEEN if s[0] <= args.max_rows]
    AFTER_GRID = [s for s in AFTER_GRID if s[0] <= args.max_rows]
    GRID_ROWS = tuple(r for r in GRID_ROWS if r <= args.max_rows)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    torch.manual_seed(0)
    with torch.device(args.device):
        model = LlamaModel(LlamaConfig(**SHAPES[args.shape]))
    model = model.to(torch.bfloat16 if args.device == "cuda" else torch.float32).eval()
    model.allocate_cache(65, 1024)
    vocab = model.config.vocab_size

    def call(rows: int, tokens: int) -> float:
        slots = list(range(rows))
        prompts = [torch.randint(0, vocab, (tokens,)).tolist() for _ in slots]
        sync()
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.forward_batch(slots, prompts).argmax(-1).tolist()
        ms = (time.perf_counter() - t0) * 1000
        for s in slots:
            model.cache.truncate(s, 0)
        return round(ms, 2)

    report: dict[str, object] = {"shape": args.shape, "seen": [], "neighbours": [], "after_grid": []}
    for rows, tokens in SEEN:
        times = [call(rows, tokens) for _ in range(3)]
        report["seen"].append({"rows": rows, "tokens": tokens, "ms": times})  # type: ignore[union-attr]
        print(f"{rows:3d} x {tokens:4d}: first {times[0]:8.2f} ms, then {times[1]:.2f}, {times[2]:.2f}")
    for rows, tokens in SEEN:
        times = [call(rows, tokens + 1) for _ in range(2)]
        report["neighbours"].append({"rows": rows, "tokens": tokens + 1, "ms": times})  # type: ignore[union-attr]
        print(f"{rows:3d} x {tokens + 1:4d} (unseen): first {times[0]:8.2f} ms, then {times[1]:.2f}")
    t0 = time.perf_counter()
    for rows in GRID_ROWS:
        for tokens in GRID_TOKENS:
            if rows * tokens <= 8192:
                call(rows, tokens)
    report["grid_s"] = round(time.perf_counter() - t0, 2)
    print(f"warm-up grid: {report['grid_s']} s")
    for rows, tokens in AFTER_GRID:
        times = [call(rows, tokens) for _ in range(2)]
        report["after_grid"].append({"rows": rows, "tokens": tokens, "ms": times})  # type: ignore[union-attr]
        print(f"{rows:3d} x {tokens:4d} (unseen, after grid): first {times[0]:8.2f} ms, "
              f"then {times[1]:.2f}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
