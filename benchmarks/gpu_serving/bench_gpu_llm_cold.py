"""Cold prompt shapes on a GPU: is a prefill slower the first time its shape is seen?

    python benchmarks/gpu_serving/bench_gpu_llm_cold.py --out /tmp/cold.json

The H200 serving runs' first level after start-up is slow (LLM plans of 25-30 ms against
6-8 ms later). The engine's prompts are prefilled eagerly (`LlamaModel.forward_batch`),
one call per step with the step's prompt rows. This builds the Llama-3.2-1B shape with
random weights (bfloat16) and times such calls on a fresh model: each shape (rows x
tokens) three times (the first is the cold one), then the same shapes' neighbours (one
token longer, never seen), then, after a warm-up over a grid of shapes, another set of
unseen shapes. It does so twice: with PyTorch's SDPA free to pick cuDNN, then with cuDNN
off (the engine's setting, `factory.shape_free_attention`), over new lengths. Last, a
warm prefill beside a thread spinning in Python, at CPython's default GIL switch
interval and at the engine's. Each call is host wall time to its logits on the host, as
the LLM stage pays it; the slot is rolled back between calls.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import LlamaConfig

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

from bench_gpu_llm import SHAPES  # noqa: E402

from voxline.engines.factory import GIL_SWITCH_INTERVAL_S  # noqa: E402
from voxline.engines.models.llama.model import LlamaModel  # noqa: E402

SEEN = [(1, 40), (1, 57), (4, 90), (8, 130), (16, 45), (1, 300), (32, 70), (64, 60)]
GRID_ROWS = (1, 2, 4, 8, 16, 32, 64)
GRID_TOKENS = (16, 32, 64, 128, 256, 512)
AFTER_GRID = [(3, 77), (1, 111), (12, 50), (48, 33), (5, 200)]


def cold_pass(call: Callable[[int, int], float], offset: int) -> dict[str, object]:
    """Each SEEN shape three times (the first is cold), its unseen neighbours, a warm-up
    grid, then more unseen shapes; token counts shifted by ``offset``."""
    out: dict[str, object] = {"seen": [], "neighbours": [], "after_grid": []}
    for rows, tokens in SEEN:
        times = [call(rows, tokens + offset) for _ in range(3)]
        out["seen"].append({"rows": rows, "tokens": tokens + offset, "ms": times})  # type: ignore[union-attr]
        print(f"{rows:3d} x {tokens + offset:4d}: first {times[0]:8.2f} ms, then {times[1]:.2f}, {times[2]:.2f}")
    for rows, tokens in SEEN:
        times = [call(rows, tokens + offset + 1) for _ in range(2)]
        out["neighbours"].append({"rows": rows, "tokens": tokens + offset + 1, "ms": times})  # type: ignore[union-attr]
        print(f"{rows:3d} x {tokens + offset + 1:4d} (unseen): first {times[0]:8.2f} ms, then {times[1]:.2f}")
    t0 = time.perf_counter()
    for rows in GRID_ROWS:
        for tokens in GRID_TOKENS:
            if rows * tokens <= 8192:
                call(rows, tokens + offset)
    out["grid_s"] = round(time.perf_counter() - t0, 2)
    print(f"warm-up grid: {out['grid_s']} s")
    for rows, tokens in AFTER_GRID:
        times = [call(rows, tokens + offset) for _ in range(2)]
        out["after_grid"].append({"rows": rows, "tokens": tokens + offset, "ms": times})  # type: ignore[union-attr]
        print(f"{rows:3d} x {tokens + offset:4d} (unseen, after grid): first {times[0]:8.2f} ms, "
              f"then {times[1]:.2f}")
    return out


def busy_thread(call: Callable[[int, int], float]) -> dict[str, list[float]]:
    """A warm 1 x 57 prefill alone, then beside a thread spinning in Python, at CPython's
    default GIL switch interval and at the engine's (`factory.GIL_SWITCH_INTERVAL_S`)."""
    out: dict[str, list[float]] = {"alone": [call(1, 57) for _ in range(3)]}
    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    default = sys.getswitchinterval()
    try:
        for label, interval in (("busy, switch 5 ms", default), ("busy, switch 0.5 ms", GIL_SWITCH_INTERVAL_S)):
            sys.setswitchinterval(interval)
            out[label] = [call(1, 57) for _ in range(2)]
    finally:
        sys.setswitchinterval(default)
        stop.set()
        spinner.join()
    for label, times in out.items():
        print(f"1 x 57 prefill, {label}: {times} ms")
    return out


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

    report: dict[str, object] = {"shape": args.shape}
    cudnn_default = torch.backends.cuda.cudnn_sdp_enabled()
    for attention, offset in (("cudnn", 0), ("no-cudnn", 2)):
        # a second pass over new lengths (offset): each pass sees only shapes it made
        torch.backends.cuda.enable_cudnn_sdp(attention == "cudnn" and cudnn_default)
        print(f"== SDPA {attention} (cudnn_sdp_enabled={torch.backends.cuda.cudnn_sdp_enabled()})")
        report[attention] = cold_pass(call, offset)
    if args.device == "cuda":
        report["busy_thread"] = busy_thread(call)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
