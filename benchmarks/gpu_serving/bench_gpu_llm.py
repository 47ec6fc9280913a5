"""The embedded Llama's decode step on a GPU: eager vs CUDA graphs, side by side.

    python benchmarks/gpu_serving/bench_gpu_llm.py --out benchmarks/results/gpu_llm_h200.json

Builds each model shape with RANDOM weights in GPU memory, bfloat16 (nothing is
downloaded or carried): ``smollm2`` is the shipped SmolLM2-135M-Instruct's config, ``1b``
Llama-3.2-1B's. ``--max-batch`` streams are prefilled eagerly with prompts of mixed lengths
around ``--context`` tokens. Then, for each batch size ``B``, the first ``B`` streams
decode ``--steps`` greedy steps (after ``--warmup``) once through
``LlamaModel.forward_batch`` (eager) and once through ``GraphedLlamaDecoder`` (graphs
captured before timing; the capture time is reported), each stream rolled back to its
prompt between runs so both see the same cache. A step's time is host wall time from
feeding the tokens to the picks being on the host (``argmax().tolist()``), as the LLM
stage pays it. In the same run the graphs' logits are checked against eager ones.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import LlamaConfig

from voxline.engines.models.llama.graphs import GraphedLlamaDecoder
from voxline.engines.models.llama.model import LlamaModel

SHAPES = {
    "smollm2": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                    tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5,
                    max_position_embeddings=8192),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
               tie_word_embeddings=True, rope_theta=500000.0, rms_norm_eps=1e-5,
               max_position_embeddings=131072),
}

Step = Callable[[list[int], list[int]], torch.Tensor]


def build(shape: str, streams: int, max_len: int, device: str) -> tuple[LlamaModel, GraphedLlamaDecoder]:
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaModel(LlamaConfig(**SHAPES[shape]))
    model = model.to(torch.bfloat16 if device == "cuda" else torch.float32).eval()
    model.allocate_cache(streams + 1, max_len)
    return model, GraphedLlamaDecoder(model, max_streams=streams)


def run(step: Step, slots: list[int], first: list[int], n: int) -> tuple[list[float], list[list[int]]]:
    """``n`` greedy steps; per-step wall ms and the picks."""
    times, picks, toks = [], [], first
    for _ in range(n):
        t0 = time.perf_counter()
        toks = step(slots, toks).argmax(-1).tolist()
        times.append((time.perf_counter() - t0) * 1e3)
        picks.append(toks)
    return times, picks


def bench_shape(shape: str, args: argparse.Namespace) -> dict:
    streams = max(args.batches)
    max_len = args.context + 64 + args.warmup + args.steps + 1
    t0 = time.perf_counter()
    model, dec = build(shape, streams, max_len, args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    lengths = [args.context - 32 + int(torch.randint(0, 64, (), generator=gen)) for _ in range(streams)]
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    for i in range(0, streams, 8):  # eager prefill, 8 streams at a time
        model.forward_batch(list(range(i, min(i + 8, streams))), prompts[i:i + 8])
    sync()
    build_s = time.perf_counter() - t0
    need = max(lengths) + args.warmup + args.steps + 1
    # Every bucket the timed runs pass through (lengths grow across length buckets).
    keys = sorted({dec.bucket(b, n) for b in args.batches for n in range(min(lengths) + 1, need + 1)})
    t0 = time.perf_counter()
    dec.prepare(keys)
    sync()
    capture_s = time.perf_counter() - t0

    def rewind(slots: list[int]) -> None:
        for s in slots:
            model.cache.truncate(s, lengths[s])

    rows = []
    for b in args.batches:
        slots = list(range(b))
        first = [prompts[s][-1] for s in slots]
        modes = {"eager": lambda sl, tk: model.forward_batch(sl, [[t] for t in tk]), "graphs": dec.step}
        out: dict[str, dict] = {}
        for name, step in modes.items():
            run(step, slots, first, args.warmup)
            rewind(slots)
            times, picks = run(step, slots, first, args.steps)
            rewind(slots)
            ms = statistics.median(times)
            out[name] = dict(ms_p50=round(ms, 3), ms_p90=round(sorted(times)[int(0.9 * len(times))], 3),
                             tokens_per_s=round(b * 1e3 / ms, 1), picks=picks)
        # Check: one step's logits from the same cache, graph vs eager.
        want = model.forward_batch(slots, [[t] for t in first])
        rewind(slots)
        got = dec.step(slots, first)
        rewind(slots)
        rel = float((got - want).norm() / want.norm())
        same = sum(a == g for pe, pg in zip(out["eager"]["picks"], out["graphs"]["picks"], strict=True)
                   for a, g in zip(pe, pg, strict=True))
        rows.append(dict(
            batch=b, bucket=list(dec.bucket(b, need)),
            eager_ms=out["eager"]["ms_p50"], graphs_ms=out["graphs"]["ms_p50"],
            eager_ms_p90=out["eager"]["ms_p90"], graphs_ms_p90=out["graphs"]["ms_p90"],
            eager_tok_s=out["eager"]["tokens_per_s"], graphs_tok_s=out["graphs"]["tokens_per_s"],
            speedup=round(out["eager"]["ms_p50"] / out["graphs"]["ms_p50"], 2),
            logits_rel_err=round(rel, 5), greedy_picks_equal=f"{same}/{b * args.steps}",
        ))
    params = sum(p.numel() for p in model.parameters())
    result = dict(shape=shape, config=SHAPES[shape], params=params, prompt_lengths=[min(lengths), max(lengths)],
                  build_and_prefill_s=round(build_s, 2), capture_s=round(capture_s, 2),
                  captured_buckets=[list(k) for k in keys], rows=rows)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="smollm2,1b", help="comma-separated: " + ", ".join(SHAPES))
    ap.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes")
    ap.add_argument("--context", type=int, default=256, help="mean prompt length per stream")
    ap.add_argument("--steps", type=int, default=64, help="timed decode steps per batch and mode")
    ap.add_argument("--warmup", type=int, default=8, help="untimed steps first")
    ap.add_argument("--out", type=Path, help="write the JSON report here")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: float32, the graphs' eager twin (a smoke test of this script)")
    args = ap.parse_args(argv)
    args.batches = sorted(int(b) for b in args.batches.split(","))
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA GPU")
    shapes = [s for s in args.shapes.split(",") if s]
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"--shapes: unknown shape {s!r} (known: {', '.join(SHAPES)})")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    report = dict(
        command=" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if argv is None else str(argv),
        gpu=torch.cuda.get_device_name() if args.device == "cuda" else platform.processor(), torch=torch.__version__, cuda=torch.version.cuda,
        python=platform.python_version(), dtype="bfloat16", context=args.context,
        steps=args.steps, warmup=args.warmup, step_time="host wall, feed to picks on host, median",
        results=[],
    )
    for s in shapes:
        report["results"].append(bench_shape(s, args))
        if args.device == "cuda":
            torch.cuda.empty_cache()  # the last shape's model and graphs are gone
        if args.out:  # written after each shape: a partial run still leaves numbers
            args.out.write_text(json.dumps(report, indent=1))
    print(f"{'shape':8} {'B':>3} {'eager ms':>9} {'graph ms':>9} {'x':>5} {'eager tok/s':>11} "
          f"{'graph tok/s':>11} {'rel err':>8} picks")
    for res in report["results"]:
        for r in res["rows"]:
            print(f"{res['shape']:8} {r['batch']:>3} {r['eager_ms']:>9.3f} {r['graphs_ms']:>9.3f} "
                  f"{r['speedup']:>5.2f} {r['eager_tok_s']:>11.1f} {r['graphs_tok_s']:>11.1f} "
                  f"{r['logits_rel_err']:>8.4f} {r['greedy_picks_equal']}")
        print(f"{res['shape']}: capture {res['capture_s']} s for {res['captured_buckets']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
