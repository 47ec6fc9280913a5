"""Per-kernel profile of the Qwen3-TTS GPU steps, and A/B timings of their variants.

    PYTHONPATH=. python3 benchmarks/gpu_speech/profile_gpu_tts.py --out /tmp/profile.json

Same real-shape random checkpoint as ``bench_gpu_tts.py``. For each variant of the
talker generator (predictor sub-step fused into one compiled region or not; attention
as SDPA or spelled out; projections through the small-row linear kernel or cuBLAS; the
predictor's sampling over a top-k or a full sort) and of the streaming code2wav (SnakeBeta eager or the Triton
kernel; whole decode compiled or not), at each batch: the CUDA-graph replay time
(median of timed blocks of replays, CUDA events), and, from one uncaptured run of the
same step under ``torch.profiler``, the kernel count and kernel time by category, plus
the heaviest kernels. Replay time minus kernel time is what the launches and gaps cost.
The Triton SnakeBeta is checked against the eager reference (float32/bfloat16/float16,
strided input) and timed against it; the small-row linear kernel against cuBLAS and a
float64 reference at every projection shape.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from bench_gpu_tts import build_model  # noqa: E402

from voxline.engines.models.qwen3_tts import graphed_talker  # noqa: E402
from voxline.engines.models.qwen3_tts.graphed_code2wav import GraphedCode2Wav  # noqa: E402
from voxline.engines.models.qwen3_tts.graphed_talker import GraphedTalkerGenerator  # noqa: E402
from voxline.kernels import fused_linear, gemv, snake  # noqa: E402
from voxline.kernels.attention import attend, position_mask  # noqa: E402
from voxline.kernels.decode_attention import attend_decode  # noqa: E402

CATEGORIES = (
    ("attention", ("fmha", "flash", "attention", "sdpa", "softmax")),
    ("matmul", ("gemm", "gemv", "cutlass", "nvjet", "xmma", "cublas", "splitk", "dot_kernel")),
    ("conv", ("conv", "implicit", "winograd", "fft")),
    ("triton", ("triton",)),
    ("sort_scan", ("sort", "radix", "scan", "cumsum")),
    ("copy_index", ("copy", "index", "scatter", "gather", "cat", "fill")),
    ("elementwise", ("elementwise", "vectorized", "reduce", "unrolled")),
)


def category(name: str) -> str:
    low = name.lower()
    for cat, keys in CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def replay_ms(fn, reps: int = 30, blocks: int = 5) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(blocks):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return round(sorted(times)[len(times) // 2], 3)


def kernels(fn) -> dict:
    """Kernel count and device time (ms) by category and by name, one run of ``fn``."""
    with torch.inference_mode():
        return _kernels(fn)


def _kernels(fn) -> dict:
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    by_cat: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = e.time_range.elapsed_us()
        for table, key in ((by_cat, category(e.name)), (by_name, e.name[:100])):
            table[key][0] += 1
            table[key][1] += us / 1000
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:12]
    return {
        "count": int(sum(v[0] for v in by_cat.values())),
        "kernel_ms": round(sum(v[1] for v in by_cat.values()), 3),
        "by_category": {k: [int(v[0]), round(v[1], 3)] for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1][1])},
        "top": [[k, int(v[0]), round(v[1], 3)] for k, v in top],
    }


def part(get, label: str, report: dict, fill) -> None:
    t0 = time.perf_counter()
    step = get()  # compiles (if on) and captures now
    torch.cuda.synchronize()
    ready = time.perf_counter() - t0
    fill(step)
    row = {"replay_ms": replay_ms(step), "ready_s": round(ready, 1)}
    row |= kernels(step._run)
    report[label] = row
    cats = " ".join(f"{k}={v[0]}/{v[1]:.2f}" for k, v in row["by_category"].items())
    print(f"{label:40s} replay {row['replay_ms']:7.3f} ms  kernels {row['count']:5d} "
          f"{row['kernel_ms']:7.3f} ms  ({cats})  ready {ready:.0f} s", flush=True)


def snake_checks() -> dict:
    out = {}
    g = torch.Generator(device="cuda").manual_seed(0)
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-3}
    for dt, t in tol.items():
        x = (torch.randn(3, 96, 7700, device="cuda", generator=g) * 3).to(dt)[..., 5:7685]  # strided
        la = torch.randn(96, device="cuda", generator=g) * 0.5
        lb = torch.randn(96, device="cuda", generator=g) * 0.5
        got = snake.snake_beta_log(x, la.to(dt), lb.to(dt))
        want = snake.snake_beta_eager(x, torch.exp(la.to(dt)), torch.exp(lb.to(dt)))
        ref = snake.snake_beta_eager(x.double(), torch.exp(la.to(dt).double()), torch.exp(lb.to(dt).double()))
        err = float((got.double() - want.double()).abs().max())
        out[str(dt)] = {"dtype_kept": got.dtype == dt, "max_abs_vs_eager": err,
                        "rel_vs_fp64": float((got.double() - ref).norm() / ref.norm()),
                        "eager_rel_vs_fp64": float((want.double() - ref).norm() / ref.norm()),
                        "rel_vs_eager": float((got.double() - want.double()).norm() / want.double().norm()),
                        "tol": t}
    x = torch.randn(16, 96, 7680, device="cuda", generator=g)
    a, b = torch.rand(96, device="cuda") + 0.5, torch.rand(96, device="cuda") + 0.5
    out["fp32_16x96x7680_ms"] = {"triton": replay_ms(lambda: snake.snake_beta(x, a, b)),
                                 "eager": replay_ms(lambda: snake.snake_beta_eager(x, a, b))}
    print("snake", out, flush=True)
    return out


def attention_checks() -> dict:
    """The Triton decode attention against SDPA on the gathered rows (bf16, fresh random
    inputs): talker shape (cache slots, a length prefix, one query) and predictor shape
    (two queries over a 16-key buffer)."""
    out = {}
    g = torch.Generator(device="cuda").manual_seed(2)
    for b in (1, 16):
        ck = torch.randn(b + 3, 8, 256, 128, device="cuda", generator=g).bfloat16()
        cv = torch.randn(b + 3, 8, 256, 128, device="cuda", generator=g).bfloat16()
        slot = torch.randperm(b + 3, device="cuda", generator=g)[:b]
        q = torch.randn(b, 1, 16, 128, device="cuda", generator=g).bfloat16().transpose(1, 2)
        pos = torch.randint(0, 128, (b, 1), device="cuda", generator=g)
        mask = position_mask(pos, torch.arange(128, device="cuda").expand(b, 128))
        got = attend_decode(q, ck, cv, mask, slot=slot, length=128)
        want = attend(q.float(), ck[:, :, :128][slot].float(), cv[:, :, :128][slot].float(), mask)
        out[f"talker_b{b}"] = float((got.float() - want).norm() / want.norm())
        k = torch.randn(b, 8, 16, 128, device="cuda", generator=g).bfloat16()
        v = torch.randn(b, 8, 16, 128, device="cuda", generator=g).bfloat16()
        q = torch.randn(b, 16, 2, 128, device="cuda", generator=g).bfloat16()
        mask = position_mask(torch.tensor([[3, 4]], device="cuda"), torch.arange(16, device="cuda")[None])
        got = attend_decode(q, k, v, mask)
        want = attend(q.float(), k.float(), v.float(), mask)
        out[f"predictor_b{b}"] = float((got.float() - want).norm() / want.norm())
    out["ok"] = all(e < 1e-2 for e in out.values())
    print("decode attention", out, flush=True)
    return out


def gemv_checks(batches: list[int]) -> dict:
    """The small-row linear kernel against cuBLAS (``F.linear``) at the predictor's and the
    talker's projection shapes: error vs a float64 reference, and the time of 20 calls
    captured in one CUDA graph (launch gaps included, as inside a step)."""
    out: dict = {}
    g = torch.Generator(device="cuda").manual_seed(3)
    shapes = {"cp_qkv": (4096, 1024), "cp_o": (1024, 2048), "cp_gate_up": (6144, 1024), "cp_down": (1024, 3072),
              "cp_head": (2048, 1024), "talker_qkv": (4096, 2048), "talker_o": (2048, 2048),
              "talker_gate_up": (12288, 2048), "talker_down": (2048, 6144)}
    for label, (n, k) in shapes.items():
        ws = [torch.randn(n, k, device="cuda", generator=g).bfloat16() * 0.03 for _ in range(4)]
        for rows in sorted({1, 2, *batches}):
            x = torch.randn(rows, k, device="cuda", generator=g).bfloat16()
            ref = F.linear(x.double(), ws[0].double())
            row: dict = {}
            for impl, fn in (("cublas", F.linear), ("gemv", gemv.small_linear)):
                y = fn(x, ws[0])
                row[f"{impl}_rel"] = float((y.double() - ref).norm() / ref.norm())

                def calls(fn=fn, x=x, ws=ws) -> None:
                    for i in range(20):
                        fn(x, ws[i % 4])  # rotate weights: not all in L2

                graph = torch.cuda.CUDAGraph()
                calls()
                torch.cuda.synchronize()
                with torch.cuda.graph(graph):
                    calls()
                row[f"{impl}_us"] = round(replay_ms(graph.replay) * 1000 / 20, 2)
            row["weight_GBps_gemv"] = round(n * k * 2 / (row["gemv_us"] * 1e-6) / 1e9, 1)
            out[f"{label}/{n}x{k}/m{rows}"] = row
            print(f"gemv {label:15s} {n:5d}x{k:5d} m={rows:2d}  cublas {row['cublas_us']:6.2f} us  "
                  f"gemv {row['gemv_us']:6.2f} us  ({row['weight_GBps_gemv']} GB/s)  "
                  f"rel err {row['cublas_rel']:.1e} / {row['gemv_rel']:.1e}", flush=True)
    out["ok"] = all(v["gemv_rel"] < 1e-2 for v in out.values() if isinstance(v, dict))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--variants", default="r3:1:sdpa:0:0,r4:1:sdpa:1:64",
                    help="name:fuse_predictor:attention[:gemv[:top_k_cap[:linear]]],... (gemv: the small-row "
                         "linear kernel on/off; top_k_cap: the predictor's top-k ranking, 0 = full sort; "
                         "linear: the fused residual projections of voxline.kernels.fused_linear on/off, default on)")
    ap.add_argument("--talker-attention", default="triton", help="attention of the talker decode steps")
    ap.add_argument("--codec", default="compiled")
    ap.add_argument("--codec-frames", default="1,4", help="chunk lengths (frames) of the code2wav steps")
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--fail-file", type=Path, help="written when the decode attention check fails")
    args = ap.parse_args()
    torch._dynamo.config.suppress_errors = True
    batches = [int(b) for b in args.batches.split(",")]
    model = build_model("cuda")
    report: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "length": args.length,
                    "snake": snake_checks(), "decode_attention": attention_checks(), "steps": {}}
    steps = report["steps"]

    def save() -> None:
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))

    g = torch.Generator(device="cuda").manual_seed(1)

    def fill_hidden(step) -> None:
        for key in ("hidden", "x"):
            if key in step.inputs:
                step.inputs[key].copy_(torch.randn(step.inputs[key].shape, device="cuda", generator=g) * 0.5)

    report["gemv"] = gemv_checks(batches)
    save()
    decode_done: set[tuple[str, bool]] = set()
    for spec in args.variants.split(","):
        name, fuse, attention, *rest = spec.split(":")
        use_gemv = (rest[0] if rest else "1") == "1"
        cap = int(rest[1]) if len(rest) > 1 else graphed_talker.PREDICTOR_TOP_K_CAP
        use_linear = (rest[2] if len(rest) > 2 else "1") == "1"
        gemv.set_enabled(use_gemv)
        fused_linear.set_enabled(use_linear)
        gen = GraphedTalkerGenerator(model.talker, max_streams=max(batches), max_len=args.length,
                                     batch_buckets=batches, length_buckets=[args.length],
                                     prefill_buckets=[], attention=args.talker_attention,
                                     predictor_attention=attention, fuse_predictor=fuse == "1",
                                     predictor_top_k_cap=cap)
        for b in batches:
            part(partial(gen.frame_steps.get, (b, cap)), f"predictor_frame/{name}/b{b}", steps, fill_hidden)
            save()
        if (args.talker_attention, use_gemv, use_linear) not in decode_done:
            decode_done.add((args.talker_attention, use_gemv, use_linear))
            for b in batches:
                tag = f"{args.talker_attention}{'_gemv' if use_gemv else ''}{'_linear' if use_linear else ''}"
                part(partial(gen.decode_steps.get, (b, args.length)), f"talker_decode/{tag}/b{b}", steps, fill_hidden)
                save()
        del gen
        torch.cuda.empty_cache()
    gemv.set_enabled(True)
    fused_linear.set_enabled(True)

    fused = snake._fused
    for mode in [m for m in args.codec.split(",") if m]:
        snake._fused = fused if mode != "eager_snake" else (lambda x: False)
        codec = GraphedCode2Wav(model.code2wav, max_streams=max(batches), max_frames=4,
                                batch_buckets=batches, compile=mode == "compiled")

        def fill_codes(step) -> None:
            step.inputs["codes"].copy_(torch.randint(0, 2048, step.inputs["codes"].shape, device="cuda", generator=g))

        for b in batches:
            for t in [int(x) for x in args.codec_frames.split(",")]:
                part(partial(codec.steps.get, (b, t)), f"code2wav/{mode}/b{b}_t{t}", steps, fill_codes)
                save()
        del codec
    snake._fused = fused
    from torch._dynamo.utils import counters
    if args.fail_file and not report["decode_attention"]["ok"]:
        args.fail_file.write_text("decode attention check failed\n")
    report["compile_stats"] = {k: dict(counters[k]) for k in ("stats", "graph_break", "unimplemented")}
    save()
    print(f"{'part':44s} {'replay ms':>9s} {'kernels':>7s} {'kernel ms':>9s}")
    for label, row in steps.items():
        print(f"{label:44s} {row['replay_ms']:9.3f} {row['count']:7d} {row['kernel_ms']:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
