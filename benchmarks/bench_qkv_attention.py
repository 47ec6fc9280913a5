"""The code predictor's one-kernel attention block on a GPU, off vs on, in one process.

    PYTHONPATH=. python3 benchmarks/bench_qkv_attention.py --out /tmp/qkv_attention.json

Same real-shape random checkpoint as ``bench_gpu_tts.py`` (code predictor 5 x 1024, 16 q
heads over 8 key/value heads of 128, a 16-position key/value buffer per layer):

1. ``op``: one predictor layer's attention block at each batch and query count (2 queries
   at positions 0-1 as the first sub-step, 1 query at a later one): the kernel
   (``voxline.kernels.qkv_attention``) against the unfused functions the sub-step ran
   before (``attn_prep`` + ``index_copy`` + ``attend``), both in bf16, and both against
   those functions in float32: max abs difference and relative error of the attention
   output and of the keys/values written.
2. ``frames``: the code predictor's frame step of ``GraphedTalkerGenerator`` (compiled
   and captured, as served) with the kernel off and on, fed the same random talker
   states for several frames, greedy and seeded sampling: the share of equal codes and
   the max abs difference of the frame's talker input embedding; the same for the eager
   twin (uncompiled, not captured) on vs off, and compiled-off vs eager-off as the
   baseline of what compilation alone changes.
3. ``timing``: the frame step's graph replay (median of timed blocks, CUDA events) and
   its kernel count and kernel time (one uncaptured run under the profiler), off vs on.
4. ``--twin``: ``bench_gpu_tts``'s twin check (captured graphs vs the eager twin vs the
   plain generator, audio) with the kernel on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_gpu_tts import build_model, build_tokenizer, twin_check  # noqa: E402
from profile_gpu_tts import kernels, replay_ms  # noqa: E402

from voxline.engines.models.qwen3_tts.graphed_talker import GraphedTalkerGenerator  # noqa: E402
from voxline.engines.models.qwen3_tts.talker_steps import layer_args  # noqa: E402
from voxline.kernels import qkv_attention as qa  # noqa: E402
from voxline.kernels.attention import attend, position_mask  # noqa: E402
from voxline.kernels.decoder_step import attn_prep  # noqa: E402


def _err(got: torch.Tensor, ref: torch.Tensor) -> dict:
    d = (got.double() - ref.double())
    return {"max_abs": float(d.abs().max()), "rel": float(d.norm() / ref.double().norm())}


def _unfused(x, pos, q_idx, inv_freq, k_buf, v_buf, mask, prep):
    q, k, v = attn_prep(x, pos, inv_freq, *prep)
    k_buf = k_buf.index_copy(2, q_idx, k)
    v_buf = v_buf.index_copy(2, q_idx, v)
    out = attend(q, k_buf, v_buf, mask)
    b, _, q_len, _ = out.shape
    return out.transpose(1, 2).reshape(b, q_len, -1), k_buf, v_buf


@torch.inference_mode()
def op_checks(model, batches: list[int]) -> dict:
    cp = model.talker.code_predictor
    layer = cp.model.layers[2]
    prep, _ = layer_args(layer)
    prep32 = tuple(t.float() if isinstance(t, torch.Tensor) else t for t in prep)
    inv_freq = cp.rope.inv_freq.to("cuda")
    attn = layer.self_attn
    length = model.talker.num_code_groups
    k_pos = torch.arange(length, device="cuda")[None]
    g = torch.Generator(device="cuda").manual_seed(0)
    res = {}
    for b in batches:
        for positions in ([0, 1], [7], [15]):
            q_pos = torch.tensor(positions, device="cuda")[None]
            pos = q_pos.expand(b, -1)
            mask = position_mask(q_pos, k_pos)
            x = torch.randn(b, len(positions), cp.config.hidden_size, device="cuda", generator=g).bfloat16()
            # earlier sub-steps' keys/values below the first position, zeros above (as a frame)
            shape = (b, attn.num_kv_heads, length, attn.head_dim)
            filled = (torch.arange(length, device="cuda") < positions[0])[None, None, :, None]
            k0 = torch.randn(shape, device="cuda", generator=g).bfloat16() * filled
            v0 = torch.randn(shape, device="cuda", generator=g).bfloat16() * filled
            fused = qa.fused_available(x, pos, k0, v0, mask, *prep)
            row: dict = {"fused_available": fused}
            want, wk, wv = _unfused(x, pos, q_pos[0], inv_freq, k0, v0, mask, prep)
            f32, fk, fv = _unfused(x.float(), pos, q_pos[0], inv_freq, k0.float(), v0.float(), mask, prep32)
            row["unfused_vs_f32"] = {"out": _err(want, f32), "k": _err(wk, fk), "v": _err(wv, fv)}
            if fused:
                k_buf, v_buf = k0.clone(), v0.clone()
                got = qa.qkv_attention(x, pos, inv_freq, k_buf, v_buf, mask, *prep)
                row["fused_vs_unfused"] = {"out": _err(got, want), "k": _err(k_buf, wk), "v": _err(v_buf, wv)}
                row["fused_vs_f32"] = {"out": _err(got, f32), "k": _err(k_buf, fk), "v": _err(v_buf, fv)}
            res[f"b{b}/q{'-'.join(map(str, positions))}"] = row
            print("op", b, positions, json.dumps(row), flush=True)
    return res


def _settings(b: int, frame: int, temperature: float, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    first = torch.randint(0, 2048, (b,), generator=g)
    ints = torch.stack([first, torch.full((b,), 50), torch.arange(b) + 100 * frame,
                        torch.full((b,), frame * 16)]).cuda()
    floats = torch.tensor([[temperature] * b, [1.0] * b], dtype=torch.float32).cuda()
    return ints, floats


@torch.inference_mode()
def run_frames(gen: GraphedTalkerGenerator, b: int, frames: int, temperature: float) -> list[dict]:
    step = gen.frame_steps.get((b, gen.predictor_top_k_cap))
    g = torch.Generator().manual_seed(b)
    outs = []
    for f in range(frames):
        hidden = torch.randn(b, gen.talker.config.hidden_size, generator=g).to("cuda", torch.bfloat16)
        ints, floats = _settings(b, f, temperature, g)
        step.inputs["hidden"].copy_(hidden)
        step.inputs["ints"].copy_(ints)
        step.inputs["floats"].copy_(floats)
        out = step()
        outs.append({k: v.clone() for k, v in out.items()})
    return outs


def compare(a: list[dict], b: list[dict]) -> dict:
    codes_a = torch.stack([o["frames"] for o in a])
    codes_b = torch.stack([o["frames"] for o in b])
    same = codes_a == codes_b
    rows_same = same.all(-1)  # a frame row whose 16 codes all agree: its embedding is comparable
    emb = torch.stack([o["embeds"] for o in a]).float() - torch.stack([o["embeds"] for o in b]).float()
    return {"codes_equal": round(float(same.float().mean()), 4),
            "first_divergent_codebook": int(same.all(0).all(0).float().argmin()) if not bool(same.all()) else None,
            "embeds_max_abs_where_codes_equal": float(emb[rows_same].abs().max()) if bool(rows_same.any()) else None}


def make(model, batches: list[int], fused: bool, compiled: bool) -> GraphedTalkerGenerator:
    qa.set_enabled(fused)
    return GraphedTalkerGenerator(model.talker, max_streams=max(batches), max_len=128, batch_buckets=batches,
                                  length_buckets=[128], prefill_buckets=[], capture=compiled, compile=compiled)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,4,32")
    ap.add_argument("--frames", type=int, default=6)
    ap.add_argument("--twin", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch._dynamo.config.suppress_errors = True
    batches = [int(b) for b in args.batches.split(",")]
    model = build_model("cuda")
    report: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "batches": batches}

    def save() -> None:
        if args.out:
            args.out.write_text(json.dumps(report, indent=1, default=str))

    report["op"] = op_checks(model, batches)
    save()
    gens = {}
    for fused in (False, True):
        for compiled in (True, False):
            t0 = time.perf_counter()
            gen = make(model, batches, fused, compiled)
            for b in batches:
                gen.frame_steps.get((b, gen.predictor_top_k_cap))
            torch.cuda.synchronize()
            gens[(fused, compiled)] = gen
            report.setdefault("ready_s", {})[f"{'on' if fused else 'off'}/{'compiled' if compiled else 'eager'}"] = \
                round(time.perf_counter() - t0, 1)
    frames = report["frames"] = {}
    for b in batches:
        for name, temp in (("greedy", 0.0), ("sampled", 0.9)):
            out = {}
            for (fused, compiled), gen in gens.items():
                qa.set_enabled(fused)  # read when the eager twin runs (and by Dynamo's guards)
                out[(fused, compiled)] = run_frames(gen, b, args.frames, temp)
            frames[f"b{b}/{name}"] = row = {
                "compiled_on_vs_off": compare(out[(True, True)], out[(False, True)]),
                "eager_on_vs_off": compare(out[(True, False)], out[(False, False)]),
                "compiled_off_vs_eager_off": compare(out[(False, True)], out[(False, False)]),
                "compiled_on_vs_eager_on": compare(out[(True, True)], out[(True, False)]),
            }
            print("frames", b, name, json.dumps(row), flush=True)
    save()
    timing = report["timing"] = {}
    for b in batches:
        for fused in (False, True):
            qa.set_enabled(fused)  # the profiled uncaptured run goes through Dynamo's guards
            step = gens[(fused, True)].frame_steps.get((b, gens[(fused, True)].predictor_top_k_cap))
            row = {"replay_ms": replay_ms(step, reps=50, blocks=7)}
            row |= {k: v for k, v in kernels(step._run).items() if k in ("count", "kernel_ms", "by_category")}
            timing[f"b{b}/{'on' if fused else 'off'}"] = row
            print("timing", b, "on" if fused else "off", json.dumps(row), flush=True)
    save()
    del gens
    torch.cuda.empty_cache()
    if args.twin:
        qa.set_enabled(True)
        report["twin_check_on"] = twin_check(model, build_tokenizer(model.config), 12)
        print("twin check (kernel on)", report["twin_check_on"], flush=True)
        save()
    print(f"{'batch':>5s} {'off ms':>8s} {'on ms':>8s} {'off kernels':>11s} {'on kernels':>10s}")
    for b in batches:
        off, on = timing[f"b{b}/off"], timing[f"b{b}/on"]
        print(f"{b:5d} {off['replay_ms']:8.3f} {on['replay_ms']:8.3f} {off['count']:11d} {on['count']:10d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
