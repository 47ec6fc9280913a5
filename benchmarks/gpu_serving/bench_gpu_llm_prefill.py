"""Prompts from CUDA graphs against eager prompts, side by side, on one GPU.

    python benchmarks/gpu_serving/bench_gpu_llm_prefill.py --out /tmp/prefill.json            # on a GPU
    python benchmarks/gpu_serving/bench_gpu_llm_prefill.py --device cpu --shape smollm2 --reps 2 --streams 4  # smoke

The embedded LLM's prompts ran eagerly (`LlamaModel.forward_batch`): some 1,000 torch
calls for the Llama-3.2-1B shape (`host_ops.py`), each made from Python while the
engine's other stages want the GIL (16-19 ms for a lone 57-token prompt on an H200, `bench_gpu_llm_cold.py`).
`GraphedLlamaDecoder.prefill` replays one graph per (query, length) bucket instead. This
builds the shape with random weights (bfloat16), captures both kinds of graph as the
engine does (logging the prefill graphs' capture time and memory), then times, arms
interleaved rep by rep, host wall ms to the logits on the host:

- one prompt of `new` tokens after `cached` ones (a new turn on a kept conversation, a
  first prompt, one long enough to be fed in chunks), eager vs graphs;
- a mixed step: every stream but two decoding one token, the other two feeding a
  57-token turn (the LLM stage's step while others speak);
- the 157 + 57 prompt beside a thread spinning in Python at the engine's GIL switch
  interval (the TTS stage's host work, at its worst).

It also reports the largest relative difference of the graphs' logits from eager ones.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import LlamaConfig

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

from bench_gpu_llm import SHAPES  # noqa: E402

from voxline.engines.factory import GIL_SWITCH_INTERVAL_S, shape_free_attention  # noqa: E402
from voxline.engines.models.llama.graphs import PREFILL_BUCKETS, GraphedLlamaDecoder  # noqa: E402
from voxline.engines.models.llama.model import LlamaModel  # noqa: E402

PROMPTS = [(157, 57), (157, 8), (0, 57), (0, 250), (157, 400)]  # (cached, new) tokens
MAX_LEN = 2048


def pct(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": round(statistics.median(ordered), 2),
            "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="1b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the eager twins")
    ap.add_argument("--streams", type=int, default=64, help="decode streams (the mixed step)")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per arm and case")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        shape_free_attention()
    torch.manual_seed(0)
    with torch.device(args.device):
        model = LlamaModel(LlamaConfig(**SHAPES[args.shape]))
    model = model.to(torch.bfloat16 if cuda else torch.float32).eval()
    cache = model.allocate_cache(args.streams + 1, MAX_LEN)
    dec = GraphedLlamaDecoder(model, max_streams=args.streams, prefill_buckets=PREFILL_BUCKETS)
    report: dict[str, object] = {"shape": args.shape, "device": str(model.device),
                                 "prefill_buckets": list(PREFILL_BUCKETS),
                                 "length_buckets": dec.length_buckets}
    t0 = time.perf_counter()
    dec.steps.prepare(dec.buckets, progress=False)
    report["decode_capture_s"] = round(time.perf_counter() - t0, 1)
    reserved = torch.cuda.memory_reserved() if cuda else 0
    t0 = time.perf_counter()
    assert dec.prefills is not None
    dec.prefills.prepare(dec.prefill_keys, progress=False)
    report["prefill_capture_s"] = round(time.perf_counter() - t0, 1)
    report["prefill_graphs"] = len(dec.prefill_keys)
    report["prefill_pool_mib"] = round((torch.cuda.memory_reserved() - reserved) / 2**20) if cuda else None
    print(f"captured {len(dec.buckets)} decode graphs in {report['decode_capture_s']} s and "
          f"{report['prefill_graphs']} prefill graphs in {report['prefill_capture_s']} s "
          f"(+{report['prefill_pool_mib']} MiB reserved)")
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)

    def ids(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=gen).tolist()

    history = ids(MAX_LEN)  # every slot's cached tokens are a prefix of this

    def reset(slots: list[int], cached: int) -> None:
        """Slots hold ``cached`` tokens (fed once eagerly, then kept by truncation)."""
        for s in slots:
            if cache.lengths[s] < cached:
                model.forward_batch([s], [history[cache.lengths[s]:cached]])
            cache.truncate(s, cached)

    def timed(fn: Callable[[], torch.Tensor]) -> tuple[float, torch.Tensor]:
        sync()
        t0 = time.perf_counter()
        logits = fn()
        logits.argmax(-1).tolist()  # to the host, as the stage samples
        return (time.perf_counter() - t0) * 1e3, logits

    def ab(label: str, slots: list[int], tokens: list[list[int]], cached: int, mixed: bool) -> dict:
        """Eager prompts vs prompt graphs, interleaved; ``mixed`` goes through `forward`
        (the decode rows replay their graph either way)."""
        graphs = dec.prefills
        times: dict[str, list[float]] = {"eager": [], "graphs": []}
        worst = 0.0
        for _ in range(args.reps + 1):  # the first rep of each arm warms it up
            outs = {}
            for arm in ("eager", "graphs"):
                reset(slots, cached)
                dec.prefills = graphs if arm == "graphs" else None
                try:
                    ms, outs[arm] = timed(lambda: dec.forward(slots, tokens) if mixed
                                          else dec.prompts(slots, tokens))
                finally:
                    dec.prefills = graphs
                times[arm].append(ms)
            a, b = outs["eager"].float(), outs["graphs"].float()
            worst = max(worst, ((b - a).norm() / a.norm()).item())
        row = {arm: pct(ts[1:]) for arm, ts in times.items()}
        row["ratio_p50"] = round(row["eager"]["p50"] / row["graphs"]["p50"], 2)
        row["logits_rel_diff_max"] = float(f"{worst:.3g}")
        print(f"{label:34s} eager p50 {row['eager']['p50']:8.2f} p90 {row['eager']['p90']:8.2f} | "
              f"graphs p50 {row['graphs']['p50']:7.2f} p90 {row['graphs']['p90']:7.2f} ms | "
              f"x{row['ratio_p50']} | logits rel diff <= {worst:.2g}")
        return row

    cases: dict[str, object] = {}
    for cached, new in PROMPTS:
        cases[f"1 prompt, {cached} cached + {new} new"] = ab(
            f"1 prompt, {cached} cached + {new} new", [0], [ids(new)], cached, mixed=False)
    n = args.streams
    decoding, prompting = list(range(n - 2)), [n - 2, n - 1]
    toks = [[t] for t in ids(len(decoding))] + [ids(57), ids(57)]
    cases[f"mixed: {len(decoding)} decode + 2 x 57"] = ab(
        f"mixed: {len(decoding)} decode + 2 x 57", decoding + prompting, toks, 157, mixed=True)
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    default = sys.getswitchinterval()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        cases["busy: 1 prompt, 157 + 57"] = ab("busy thread: 1 prompt, 157 + 57", [0], [ids(57)],
                                               157, mixed=False)
    finally:
        stop.set()
        spinner.join()
        sys.setswitchinterval(default)
    report["cases"] = cases
    report["prefill_steps"] = dec.prefill_steps
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
