"""The code predictor's norm/SwiGLU-in-prologue projections on a GPU, off vs on, in one process.

    PYTHONPATH=. python3 benchmarks/bench_prologue_gemv.py --out /tmp/prologue_gemv.json

Same real-shape random checkpoint as ``bench_gpu_tts.py`` (code predictor 5 x 1024,
intermediate 3072), the one-kernel attention block on in both arms:

1. ``op``: one layer's QKV and gate/up projections with the norm prologue (with and
   without added partials) and its down projection with the SwiGLU prologue
   (``voxline.kernels.prologue_gemv``) against the operators' references (the unfused
   arithmetic in bf16) and float32: relative error of the summed partials; the residual
   written against the reference's (bit-equal expected).
2. ``frames``: the code predictor's frame step of ``GraphedTalkerGenerator`` (compiled and
   captured, as served) in each arm against off, fed the same random talker states,
   greedy and seeded sampling: share of equal codes, first divergent codebook.
3. ``timing``: the frame step's graph replay (median of timed blocks, CUDA events) and its
   kernel count and kernel time (one uncaptured run under the profiler) for each arm: off,
   the SwiGLU prologue alone, all prologues (``--rolled``: also with the projection loop
   rolled, ``prologue_gemv.UNROLL_MAIN_LOOP`` False).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from bench_gpu_tts import build_model  # noqa: E402
from bench_qkv_attention import compare, run_frames  # noqa: E402
from profile_gpu_tts import kernels, replay_ms  # noqa: E402

from voxline.engines.models.qwen3_tts.graphed_talker import GraphedTalkerGenerator  # noqa: E402
from voxline.engines.models.qwen3_tts.talker_steps import layer_args  # noqa: E402
from voxline.kernels import prologue_gemv as pg  # noqa: E402
from voxline.kernels import qkv_attention as qa  # noqa: E402
from voxline.kernels.layer_ops import rms_norm  # noqa: E402


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).norm() / ref.double().norm())


@torch.inference_mode()
def op_checks(model, rows: list[int]) -> dict:
    prep, post = layer_args(model.talker.code_predictor.model.layers[2])
    ln_w, eps, qkv_w = prep[:3]
    post_ln, post_eps, gu_w, down_w = post[2], post[3], post[4], post[6]
    g = torch.Generator(device="cuda").manual_seed(0)
    res = {}
    for m in rows:
        x = torch.randn(m, ln_w.shape[0], device="cuda", generator=g).bfloat16()
        add = torch.randn(8, m, ln_w.shape[0], device="cuda", generator=g) * 0.3
        for name, a, lw, w in (("qkv_no_add", None, ln_w, qkv_w), ("qkv_add", add, ln_w, qkv_w),
                               ("gate_up_add", add, post_ln, gu_w)):
            row: dict = {"available": pg.norm_available(x, a, lw, w)}
            e = eps if name.startswith("qkv") else post_eps
            if row["available"]:
                parts, r = pg.norm_linear(x, a, lw, e, w)
                ref, ref_r = pg._norm_gemv_partials_reference(x, a, lw, e, w, parts.shape[0])
                r32 = x.float() + (0 if a is None else a.sum(0))
                f32 = F.linear(rms_norm(r32, lw.float(), e), w.float())
                row |= {"vs_ref": _rel(parts.sum(0), ref.sum(0)), "vs_f32": _rel(parts.sum(0), f32),
                        "ref_vs_f32": _rel(ref.sum(0), f32), "residual_share_equal": float((r == ref_r).float().mean())}
            res[f"m{m}/{name}"] = row
        gu = torch.randn(1, m, gu_w.shape[0], device="cuda", generator=g)
        row = {"available": pg.swiglu_available(gu, down_w)}
        if row["available"]:
            parts = pg.swiglu_linear(gu, down_w)
            ref = pg._swiglu_gemv_partials_reference(gu, down_w, parts.shape[0])
            gate, up = gu.sum(0).chunk(2, dim=-1)
            f32 = F.linear(F.silu(gate) * up, down_w.float())
            row |= {"vs_ref": _rel(parts.sum(0), ref.sum(0)), "vs_f32": _rel(parts.sum(0), f32),
                    "ref_vs_f32": _rel(ref.sum(0), f32)}
        res[f"m{m}/down_swiglu"] = row
        print("op", m, json.dumps({k: v for k, v in res.items() if k.startswith(f"m{m}/")}), flush=True)
    return res


def make(model, batches: list[int], on: bool) -> GraphedTalkerGenerator:
    pg.set_enabled(on)
    return GraphedTalkerGenerator(model.talker, max_streams=max(batches), max_len=128, batch_buckets=batches,
                                  length_buckets=[128], prefill_buckets=[], capture=True, compile=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--frames", type=int, default=6)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--rolled", action="store_true", help="also time all prologues with the loop rolled")
    ap.add_argument("--no-op", action="store_true", help="skip the operator checks")
    args = ap.parse_args()
    torch._dynamo.config.suppress_errors = True
    batches = [int(b) for b in args.batches.split(",")]
    model = build_model("cuda")
    qa.set_enabled(True)
    report: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "batches": batches,
                    "max_rows": {"norm": pg.NORM_MAX_ROWS, "swiglu": pg.SWIGLU_MAX_ROWS}}

    def save() -> None:
        if args.out:
            args.out.write_text(json.dumps(report, indent=1, default=str))

    if not args.no_op:
        report["op"] = op_checks(model, [1, 2, 4])
    save()
    # Arms: the prologues off, on (projection loop rolled: the default), on with the loop
    # unrolled (pg.UNROLL_MAIN_LOOP, read at the launches the capture records).
    # (round 6's first run: rolled 6.75 ms, unrolled 3.83 ms, off 2.97 ms at batch 1, so
    # unrolled became the default and the norm prologues went off by default.) Arms now:
    # off, the SwiGLU prologue alone (the default), all prologues; --rolled adds the
    # rolled-loop variant of the last.
    arms = {"off": (False, True, False), "swiglu": (True, True, False), "all": (True, True, True)}
    if args.rolled:
        arms["all_rolled"] = (True, False, True)
    gens = {}
    for arm, (on, unroll, norm) in arms.items():
        t0 = time.perf_counter()
        pg.UNROLL_MAIN_LOOP = unroll
        pg.set_norm_enabled(norm)
        gen = make(model, batches, on)
        for b in batches:
            gen.frame_steps.get((b, gen.predictor_top_k_cap))
        torch.cuda.synchronize()
        gens[arm] = gen
        report.setdefault("ready_s", {})[arm] = round(time.perf_counter() - t0, 1)
    pg.UNROLL_MAIN_LOOP = True
    pg.set_norm_enabled(False)
    frames = report["frames"] = {}
    for b in batches:
        for name, temp in (("greedy", 0.0), ("sampled", 0.9)):
            out = {arm: run_frames(gen, b, args.frames, temp) for arm, gen in gens.items()}
            frames[f"b{b}/{name}"] = row = {f"{arm}_vs_off": compare(out[arm], out["off"])
                                            for arm in arms if arm != "off"}
            print("frames", b, name, json.dumps(row), flush=True)
    save()
    timing = report["timing"] = {}
    for b in batches:
        for arm, (on, unroll, norm) in arms.items():
            pg.set_enabled(on)  # the profiled uncaptured run goes through Dynamo's guards
            pg.set_norm_enabled(norm)
            pg.UNROLL_MAIN_LOOP = unroll
            step = gens[arm].frame_steps.get((b, gens[arm].predictor_top_k_cap))
            row = {"replay_ms": replay_ms(step, reps=50, blocks=7)}
            row |= {k: v for k, v in kernels(step._run).items() if k in ("count", "kernel_ms", "by_category", "top")}
            timing[f"b{b}/{arm}"] = row
            print("timing", b, arm, json.dumps(row), flush=True)
    save()
    print(f"{'batch':>5s} {'arm':>12s} {'replay ms':>10s} {'kernels':>8s} {'kernel ms':>10s}")
    for b in batches:
        for arm in arms:
            t = timing[f"b{b}/{arm}"]
            print(f"{b:5d} {arm:>12s} {t['replay_ms']:10.3f} {t['count']:8d} {t.get('kernel_ms', 0):10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
