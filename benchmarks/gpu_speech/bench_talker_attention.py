"""The talker's one-kernel attention block on a GPU, off vs on, in one process.

    PYTHONPATH=. python3 benchmarks/gpu_speech/bench_talker_attention.py --out /tmp/talker_attention.json

Same real-shape random checkpoint as ``bench_gpu_tts.py`` (talker 28 x 2048, 16 q heads
over 8 key/value heads of 128; code predictor 5 x 1024):

1. ``op``: one talker layer's attention block at each batch and cache length (rows on
   permuted cache slots, the new position near the end of the length): the kernel
   (``voxline.kernels.qkv_decode_attention``) against the unfused functions the decode
   step ran before (``attn_prep`` + ``cache[slot, :, pos] = k`` + ``attend_decode``), both
   in bf16, and both against those functions in float32 (SDPA on the gathered rows): max
   abs difference and relative error of the attention output and of the keys/values
   written.
2. ``steps``: for each arm (``--arms``: ``base`` = round 5, ``talker`` = this kernel), the ``GraphedTalkerGenerator`` steps as served (compiled, captured): the
   talker decode step at each batch (length bucket ``--length``) and the code predictor's
   frame step, fed the same random inputs and cache: graph replay time (median of timed
   blocks, CUDA events), kernel count and kernel time (one uncaptured run under the
   profiler), and the outputs against the first arm (decode: hidden state relative error
   and first codes; frame: share of equal codes, greedy).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_gpu_tts import build_model  # noqa: E402
from profile_gpu_tts import kernels, replay_ms  # noqa: E402

from voxline.engines.models.qwen3_tts.graphed_talker import GraphedTalkerGenerator  # noqa: E402
from voxline.engines.models.qwen3_tts.talker_steps import layer_args  # noqa: E402
from voxline.kernels import qkv_attention  # noqa: E402
from voxline.kernels import qkv_decode_attention as qd  # noqa: E402
from voxline.kernels.attention import attend, position_mask  # noqa: E402
from voxline.kernels.decode_attention import attend_decode  # noqa: E402
from voxline.kernels.decoder_step import attn_prep  # noqa: E402

ARMS = {"base": False, "talker": True}  # arm -> the talker kernel on; "base" is round 5 as committed


def _err(got: torch.Tensor, ref: torch.Tensor) -> dict:
    d = got.double() - ref.double()
    return {"max_abs": float(d.abs().max()), "rel": float(d.norm() / ref.double().norm())}


def _unfused(x, pos, slot, inv_freq, ck, cv, length, mask, prep, attention):
    q, k, v = attn_prep(x, pos, inv_freq, *prep)
    ck[slot, :, pos[:, 0]] = k[:, :, 0]
    cv[slot, :, pos[:, 0]] = v[:, :, 0]
    if attention is attend_decode:
        out = attend_decode(q, ck, cv, mask, slot=slot, length=length)
    else:
        out = attend(q, ck[:, :, :length][slot], cv[:, :, :length][slot], mask)
    return out


@torch.inference_mode()
def op_checks(model, batches: list[int], lengths: list[int]) -> dict:
    t = model.talker
    prep, _ = layer_args(t.model.layers[3])
    prep32 = tuple(p.float() if isinstance(p, torch.Tensor) else p for p in prep)
    inv_freq = t.rope.inv_freq.to("cuda")
    attn = t.model.layers[3].self_attn
    g = torch.Generator(device="cuda").manual_seed(0)
    res = {}
    for b in batches:
        for length in lengths:
            slots = b + 3
            slot = torch.randperm(slots, device="cuda", generator=g)[:b]
            pos = length - 1 - torch.randint(0, max(1, length // 4), (b, 1), device="cuda", generator=g)
            mask = position_mask(pos, torch.arange(length, device="cuda").expand(b, length))
            x = torch.randn(b, 1, t.config.hidden_size, device="cuda", generator=g).bfloat16()
            shape = (slots, attn.num_kv_heads, length, attn.head_dim)
            ck0 = torch.randn(shape, device="cuda", generator=g).bfloat16()
            cv0 = torch.randn(shape, device="cuda", generator=g).bfloat16()
            fused = qd.decode_fused_available(x, pos, slot, ck0, cv0, length, mask, *prep)
            row: dict = {"fused_available": fused}
            wk, wv = ck0.clone(), cv0.clone()
            want = _unfused(x, pos, slot, inv_freq, wk, wv, length, mask, prep, attend_decode)
            fk, fv = ck0.float(), cv0.float()
            f32 = _unfused(x.float(), pos, slot, inv_freq, fk, fv, length, mask, prep32, attend)
            new = (slot, slice(None), pos[:, 0])
            row["unfused_vs_f32"] = {"out": _err(want, f32), "k": _err(wk[new], fk[new]), "v": _err(wv[new], fv[new])}
            if fused:
                k_buf, v_buf = ck0.clone(), cv0.clone()
                parts = qd.qkv_partials(x, prep[0], prep[1], prep[2])
                got = qd.qkv_decode_attention(parts, pos, slot, inv_freq, k_buf, v_buf, length, mask,
                                              prep[3], prep[4], prep[6], prep[7], prep[8], prep[9])
                row["fused_vs_unfused"] = {"out": _err(got, want), "k": _err(k_buf[new], wk[new]),
                                           "v": _err(v_buf[new], wv[new])}
                row["fused_vs_f32"] = {"out": _err(got, f32), "k": _err(k_buf[new], fk[new]),
                                       "v": _err(v_buf[new], fv[new])}
                untouched = torch.ones(slots, 1, length, 1, dtype=torch.bool, device="cuda")
                untouched[slot, 0, pos[:, 0]] = False
                row["rest_of_cache_unchanged"] = bool(torch.equal(k_buf * untouched, ck0 * untouched)
                                                      and torch.equal(v_buf * untouched, cv0 * untouched))
            res[f"b{b}/L{length}"] = row
            print("op", b, length, json.dumps(row), flush=True)
    return res


def _apply(arm: str) -> None:
    qkv_attention.set_enabled(True)
    qd.set_enabled(ARMS[arm])


def _decode_inputs(gen: GraphedTalkerGenerator, step, b: int, length: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(100 + b)
    gc = torch.Generator().manual_seed(100 + b)
    step.inputs["x"].copy_(torch.randn(step.inputs["x"].shape, device="cuda", generator=g).bfloat16())
    pos = length - 1 - torch.randint(0, length // 4, (b,), generator=gc)
    ints = torch.stack([torch.arange(b), pos, torch.full((b,), 50), torch.arange(b) + 7,
                        torch.full((b,), 16), torch.zeros(b, dtype=torch.int64)])
    step.inputs["ints"].copy_(ints)
    step.inputs["floats"].copy_(torch.tensor([[0.0] * b, [1.0] * b, [1.0] * b]))
    for cache in (gen.cache.k, gen.cache.v):
        cache.copy_(torch.randn(cache.shape, device="cuda", generator=g).bfloat16())


def _frame_inputs(step, b: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(200 + b)
    gc = torch.Generator().manual_seed(200 + b)
    step.inputs["hidden"].copy_(torch.randn(step.inputs["hidden"].shape, device="cuda", generator=g) * 0.5)
    ints = torch.stack([torch.randint(0, 2048, (b,), generator=gc), torch.full((b,), 50),
                        torch.arange(b) + 100, torch.full((b,), 16)])
    step.inputs["ints"].copy_(ints)
    step.inputs["floats"].copy_(torch.tensor([[0.0] * b, [1.0] * b]))


@torch.inference_mode()
def step_arms(model, arms: list[str], batches: list[int], length: int) -> dict:
    res: dict = {}
    first: dict = {}
    for arm in arms:
        _apply(arm)
        t0 = time.perf_counter()
        gen = GraphedTalkerGenerator(model.talker, max_streams=max(batches), max_len=length,
                                     batch_buckets=batches, length_buckets=[length], prefill_buckets=[])
        for b in batches:
            for kind, key in (("decode", (b, length)), ("frame", (b, gen.predictor_top_k_cap))):
                steps = gen.decode_steps if kind == "decode" else gen.frame_steps
                step = steps.get(key)
                if kind == "decode":
                    _decode_inputs(gen, step, b, length)
                else:
                    _frame_inputs(step, b)
                out = {k: v.clone() for k, v in step().items()}
                row: dict = {"replay_ms": replay_ms(step, reps=50, blocks=7)}
                if kind == "decode":
                    _decode_inputs(gen, step, b, length)  # the replays above rewrote the cache rows
                row |= {k: v for k, v in kernels(step._run).items() if k in ("count", "kernel_ms", "by_category", "top")}
                label = f"{kind}/b{b}"
                if label not in first:
                    first[label] = out
                elif kind == "decode":
                    ref = first[label]
                    row["vs_first_arm"] = {"hidden": _err(out["hidden"], ref["hidden"]),
                                           "codes_equal": round(float((out["code"] == ref["code"]).float().mean()), 4)}
                else:
                    ref = first[label]
                    row["vs_first_arm"] = {"codes_equal": round(float((out["frames"] == ref["frames"]).float().mean()), 4)}
                res[f"{arm}/{label}"] = row
                print(f"{arm:12s} {label:10s} replay {row['replay_ms']:7.3f} ms  kernels {row['count']:5d} "
                      f"({row['kernel_ms']:.3f} ms)  {json.dumps(row.get('vs_first_arm', {}))}", flush=True)
        res[f"{arm}/ready_s"] = round(time.perf_counter() - t0, 1)
        del gen
        torch.cuda.empty_cache()
    _apply("talker")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,4,32")
    ap.add_argument("--lengths", default="64,128,512,2048", help="cache lengths of the op checks")
    ap.add_argument("--length", type=int, default=128, help="the steps' length bucket")
    ap.add_argument("--arms", default="base,talker", help=f"of {', '.join(ARMS)}")
    ap.add_argument("--no-steps", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch._dynamo.config.suppress_errors = True
    batches = [int(b) for b in args.batches.split(",")]
    arms = args.arms.split(",")
    for arm in arms:
        if arm not in ARMS:
            ap.error(f"--arms: unknown arm {arm!r}")
    model = build_model("cuda")
    report: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "batches": batches}
    print(report, flush=True)

    def save() -> None:
        if args.out:
            args.out.write_text(json.dumps(report, indent=1, default=str))

    report["op"] = op_checks(model, batches, [int(n) for n in args.lengths.split(",")])
    save()
    if not args.no_steps:
        report["steps"] = step_arms(model, arms, batches, args.length)
        from torch._dynamo.utils import counters

        report["compile_stats"] = {k: dict(counters[k]) for k in ("stats", "graph_break", "unimplemented")}
        save()
        print(f"{'arm':12s} {'step':10s} {'replay ms':>9s} {'kernels':>7s}")
        for key, row in report["steps"].items():
            if isinstance(row, dict):
                arm, label = key.split("/", 1)
                print(f"{arm:12s} {label:10s} {row['replay_ms']:9.3f} {row['count']:7d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
