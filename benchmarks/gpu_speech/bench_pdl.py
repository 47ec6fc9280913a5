"""Programmatic dependent launch (voxline.kernels.pdl) on the Qwen3-TTS GPU steps:
graph replay times and exactness, arms side by side in one process.

    PYTHONPATH=. python3 benchmarks/gpu_speech/bench_pdl.py --arms off,pdl,pdl+inductor,off --out /tmp/pdl.json

Same real-shape random checkpoint as ``bench_gpu_tts.py``. For each arm (``off``; ``pdl``:
this package's kernels launched with PDL; ``inductor``: Inductor's generated kernels;
the projections' knobs ``wN``/``sN``/``nN``/``kN``/``pN`` of ``bench_gemv_chain.py``, shipped
values when absent) and each batch bucket, the code
predictor's frame step and the talker's decode step are built and captured, fed the same
seeded inputs (greedy codes, a random key/value cache, distinct slots), and:

- the CUDA-graph replay time (median of timed blocks, CUDA events);
- determinism: ``--repeats`` more replays must give the first replay's outputs bit for
  bit (a missing wait shows up here as a race);
- exactness: codes differing, and the largest difference of the talker's hidden state,
  against the first arm and against the first arm of the same compilation. PDL changes
  no arithmetic, so arms that share compiled regions must agree bit for bit; switching
  Inductor's PDL recompiles them (Dynamo reset), and Inductor then benchmarks its
  reduction configurations again and may pick others, which round differently.

Exits 1 when a replay differs from its first run or two arms of one compilation differ.
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
from profile_gpu_tts import replay_ms  # noqa: E402

from voxline.engines.models.qwen3_tts.graphed_talker import GraphedTalkerGenerator  # noqa: E402
from voxline.kernels import pdl  # noqa: E402
from voxline.kernels.projection_knobs import knob_switch, set_knobs  # noqa: E402


def set_arm(arm: str) -> tuple[dict, bool]:
    """Switch the arm on; returns its switches and whether Inductor's regions recompile."""
    on = set(arm.split("+")) - {"off"}
    if not {s for s in on if knob_switch(s) is None} <= {"pdl", "inductor"}:
        raise SystemExit(f"--arms: unknown switch in {arm!r} (known: off, pdl, inductor, wN, sN, nN, kN, pN)")
    pdl.set_enabled("pdl" in on)
    knobs = set_knobs(on)
    recompile = pdl.set_inductor("inductor" in on) != ("inductor" in on)
    if recompile:
        torch._dynamo.reset()  # Inductor reads its PDL switch when a region compiles
    switches = {"ours": "pdl" in on, "inductor": pdl.inductor_enabled(), "knobs": knobs}
    return switches, recompile


def seeded(shape: tuple[int, ...], seed: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, device="cuda", generator=g) * 0.5).to(dtype)


def run_step(step, outputs: tuple[str, ...], repeats: int) -> tuple[dict, int]:
    """Outputs of one replay (cloned) and how many of ``repeats`` more replays differ."""
    first = {k: v.clone() for k, v in step().items() if k in outputs}
    differ = 0
    for _ in range(repeats):
        out = step()
        differ += any(not torch.equal(out[k], first[k]) for k in outputs)
    return first, differ


def measure_arm(model, arm: str, batches: list[int], length: int, repeats: int) -> dict:
    switches, recompiled = set_arm(arm)
    t0 = time.perf_counter()
    gen = GraphedTalkerGenerator(model.talker, max_streams=max(batches), max_len=length,
                                 batch_buckets=batches, length_buckets=[length], prefill_buckets=[])
    dtype = model.talker.dtype
    for i, (k, v) in enumerate(zip(gen.cache.k, gen.cache.v, strict=True)):
        k.copy_(seeded(tuple(k.shape), 100 + i, dtype))
        v.copy_(seeded(tuple(v.shape), 200 + i, dtype))
    row: dict = {"switches": switches, "recompiled": recompiled, "steps": {}}
    outs: dict = {}
    for b in batches:
        frame = gen.frame_steps.get((b, gen.predictor_top_k_cap))
        frame.inputs["hidden"].copy_(seeded(tuple(frame.inputs["hidden"].shape), b, dtype))
        f_out, f_differ = run_step(frame, ("frames",), repeats)
        decode = gen.decode_steps.get((b, length))
        decode.inputs["x"].copy_(seeded(tuple(decode.inputs["x"].shape), 1000 + b, dtype))
        decode.inputs["ints"][0].copy_(torch.arange(b))  # distinct slots: no two rows write one cache entry
        decode.inputs["ints"][1].fill_(length - 1)
        d_out, d_differ = run_step(decode, ("hidden", "code"), repeats)
        row["steps"][str(b)] = {
            "predictor_frame_ms": replay_ms(frame), "talker_decode_ms": replay_ms(decode),
            "replays_differing": f_differ + d_differ,
        }
        outs[b] = {"frames": f_out["frames"], "hidden": d_out["hidden"], "code": d_out["code"]}
        print(arm, b, row["steps"][str(b)], flush=True)
    row["ready_s"] = round(time.perf_counter() - t0, 1)
    del gen
    torch.cuda.empty_cache()
    return row | {"_outs": outs}


def compare(ref: dict, outs: dict) -> dict:
    res = {}
    for b, o in outs.items():
        r = ref[b]
        res[str(b)] = {
            "frame_codes_differing": int((o["frames"] != r["frames"]).sum()), "frame_codes": r["frames"].numel(),
            "first_codes_differing": int((o["code"] != r["code"]).sum()),
            "hidden_max_abs_diff": float((o["hidden"].float() - r["hidden"].float()).abs().max()),
        }
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", default="off,pdl,pdl+inductor,off")
    ap.add_argument("--batches", default="1,4,32")
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=50, help="replays compared with the first, per step")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch._dynamo.config.suppress_errors = True
    batches = [int(b) for b in args.batches.split(",")]
    model = build_model("cuda")
    report: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "length": args.length,
                    "pdl_supported": pdl.supported(), "arms": []}
    first = same = None  # outputs of the first arm, and of the first arm of this compilation
    ok = True
    for arm in args.arms.split(","):
        row = measure_arm(model, arm, batches, args.length, args.repeats)
        outs = row.pop("_outs")
        first = first or outs
        same = outs if same is None or row["recompiled"] else same
        row["arm"] = arm
        row["against_first_arm"] = compare(first, outs)
        row["against_same_compilation"] = compare(same, outs)
        print(arm, "vs first arm", row["against_first_arm"], flush=True)
        bad_replays = any(s["replays_differing"] for s in row["steps"].values())
        bad_pdl = any(c["frame_codes_differing"] or c["first_codes_differing"] or c["hidden_max_abs_diff"]
                      for c in row["against_same_compilation"].values())
        row["ok"] = not (bad_replays or bad_pdl)
        ok &= row["ok"]
        report["arms"].append(row)
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))
    print(f"{'arm':16s} {'b':>3s} {'frame ms':>9s} {'decode ms':>9s} {'codes diff':>10s} {'hidden diff':>11s}")
    for row in report["arms"]:
        for b, s in row["steps"].items():
            c = row["against_first_arm"][b]
            print(f"{row['arm']:16s} {b:>3s} {s['predictor_frame_ms']:9.3f} {s['talker_decode_ms']:9.3f} "
                  f"{c['frame_codes_differing'] + c['first_codes_differing']:10d} {c['hidden_max_abs_diff']:11.2e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
