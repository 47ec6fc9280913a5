"""Projection launch configurations on a captured chain of decode-row projections (GPU).

    PYTHONPATH=. python3 benchmarks/bench_gemv_chain.py --configs pre0/w4/s3,pre512/w4/s3 --out /tmp/chain.json

A Qwen3-TTS step at a few rows is a chain of dependent projections, each reading its
weight once. This builds that chain alone, out of :func:`~voxline.kernels.fused_linear.linear_residual`
launches with the real shapes and distinct random weights per layer (more than the L2
holds), captures it in one CUDA graph and times its replay, per configuration:

- ``preN``: weight columns a program reads before it waits for its input
  (:func:`~voxline.kernels.gemv.set_preload`);
- ``wN`` / ``sN``: warps and pipeline stages of every projection kernel;
- ``nopdl``: launched without programmatic dependent launch;
- ``pfN``: while each projection runs, a side stream asks L2 for the weight of the
  projection N launches later (``pf``: the next; one bulk prefetch per 2 KB; the graph
  forks and joins).

Chains: ``predictor`` (hidden 1024: QKV 1024->4096, output 2048->1024, gate/up
1024->6144, down 3072->1024; 5 layers x 15 sub-steps, as a frame) and ``talker``
(hidden 2048: 2048->4096, 2048->2048, 2048->12288, 6144->2048; 28 layers, as a decode
step). Each layer feeds the first columns of its QKV and gate/up outputs to the next
projection, so every launch reads what the one before it wrote. Reported per chain and
rows: replay ms, microseconds per projection, weight GB/s, and the largest difference
from the first configuration (the split and preload orders add partial sums in another
order, so a few bf16 units).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from profile_gpu_tts import replay_ms  # noqa: E402

from voxline.kernels import fused_linear, gemv, pdl  # noqa: E402

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CUDA builds of torch ship Triton
    triton = None

_PF_CHUNK = 65536  # bytes of weight per prefetch program (32 lanes x 2 KB)

if triton is not None:

    @triton.jit
    def _prefetch_kernel(w_ptr, nbytes, CHUNK: tl.constexpr, LANES: tl.constexpr):
        """Ask L2 for ``CHUNK`` bytes from ``w_ptr`` per program (one bulk prefetch per lane,
        sm_90's ``cp.async.bulk.prefetch.L2``): nothing is waited for or written."""
        lane = tl.arange(0, LANES)
        start = tl.program_id(0).to(tl.int64) * CHUNK + lane * (CHUNK // LANES)
        size = tl.maximum(tl.minimum(CHUNK // LANES, nbytes - start), 0).to(tl.int32)
        ptr = w_ptr.to(tl.pointer_type(tl.int8)) + start
        tl.inline_asm_elementwise(
            "{\n\t.reg .pred p;\n\tsetp.gt.s32 p, $2, 0;\n\t@p cp.async.bulk.prefetch.L2.global [$1], $2;"
            "\n\tmov.u32 $0, 0;\n\t}", "=r,l,r", [ptr, size], dtype=tl.int32, is_pure=False, pack=1)


def prefetch_l2(w: torch.Tensor) -> None:
    """Start reading ``w`` into L2 on the current stream (returns at once)."""
    nbytes = w.numel() * w.element_size()
    _prefetch_kernel[(triton.cdiv(nbytes, _PF_CHUNK),)](w, nbytes, CHUNK=_PF_CHUNK, LANES=32, num_warps=1)

CHAINS = {  # hidden, attention width, QKV outputs, MLP width, layers, repeats of the layers
    "predictor": (1024, 2048, 4096, 3072, 5, 15),
    "talker": (2048, 2048, 4096, 6144, 28, 1),
}


def parse_config(text: str) -> dict:
    cfg = {"preload": 0, "num_warps": 4, "num_stages": 3, "pdl": True, "prefetch": 0}
    for part in text.split("/"):
        if part == "nopdl":
            cfg["pdl"] = False
        elif part.startswith("pf"):
            cfg["prefetch"] = int(part[2:] or 1)
        elif part.startswith("pre"):
            cfg["preload"] = int(part[3:])
        elif part.startswith("w"):
            cfg["num_warps"] = int(part[1:])
        elif part.startswith("s"):
            cfg["num_stages"] = int(part[1:])
        else:
            raise SystemExit(f"--configs: unknown part {part!r} in {text!r} (preN, wN, sN, nopdl, pf)")
    return cfg


def apply(cfg: dict) -> None:
    gemv.set_preload(cfg["preload"])
    gemv.LAUNCH.update(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    pdl.set_enabled(cfg["pdl"])


def build(name: str, rows: int, prefetch: int, seed: int = 0):
    hidden, attn, qkv, inter, layers, repeats = CHAINS[name]
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, generator=g, device="cuda") * scale).to(torch.bfloat16)

    ws = [(rand(qkv, hidden, scale=hidden ** -0.5), rand(hidden, attn, scale=attn ** -0.5 / 4),
           rand(2 * inter, hidden, scale=hidden ** -0.5), rand(hidden, inter, scale=inter ** -0.5 / 4))
          for _ in range(layers)]
    x = rand(rows, hidden)
    zero_qkv = torch.zeros(rows, qkv, dtype=torch.bfloat16, device="cuda")
    zero_gu = torch.zeros(rows, 2 * inter, dtype=torch.bfloat16, device="cuda")

    order = [w for _ in range(repeats) for layer in ws for w in layer]
    side = torch.cuda.Stream()

    def project(i: int, x_in: torch.Tensor, resid: torch.Tensor) -> torch.Tensor:
        ahead = range(1, prefetch + 1) if i == 0 else [prefetch] if prefetch else []
        ahead = [i + a for a in ahead if i + a < len(order)]
        if ahead:  # later weights stream into L2 while this projection runs
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for j in ahead:
                    prefetch_l2(order[j])
        return fused_linear.linear_residual(x_in, order[i], None, resid)

    def chain() -> torch.Tensor:
        h = x
        for i in range(0, len(order), 4):
            a = project(i, h, zero_qkv)
            h = project(i + 1, a[:, :attn], h)
            u = project(i + 2, h, zero_gu)
            h = project(i + 3, u[:, :inter], h)
        if prefetch:  # join the side stream (a capture must end on its own stream)
            torch.cuda.current_stream().wait_stream(side)
        return h

    weight_bytes = sum(w.numel() * 2 for layer in ws for w in layer) * repeats
    return chain, layers * repeats * 4, weight_bytes


def measure(name: str, rows: int, cfg: dict) -> tuple[dict, torch.Tensor]:
    apply(cfg)
    chain, launches, weight_bytes = build(name, rows, cfg["prefetch"])
    chain()  # compiles this configuration's kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain()
    ms = replay_ms(graph.replay)
    res = {"replay_ms": ms, "us_per_projection": round(ms * 1000 / launches, 2),
           "weight_gb_per_s": round(weight_bytes / (ms / 1000) / 1e9, 1)}
    result = out.clone()
    del graph, chain
    torch.cuda.empty_cache()
    return res, result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="pre0/w4/s3,pre512/w4/s3,pre256/w4/s3,pre0/w4/s3/nopdl")
    ap.add_argument("--chains", default="predictor,talker")
    ap.add_argument("--rows", default="1,4,16")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    configs = [(c, parse_config(c)) for c in args.configs.split(",")]
    rows = [int(r) for r in args.rows.split(",")]
    if max(rows) > fused_linear.MAX_ROWS:
        raise SystemExit(f"--rows: at most {fused_linear.MAX_ROWS} (the fused projection's row block)")
    report: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "pdl_supported": pdl.supported(),
                    "results": []}
    print(f"{'chain':10s} {'rows':>4s} {'config':22s} {'replay ms':>9s} {'us/proj':>8s} {'GB/s':>7s} {'max diff':>9s}")
    with torch.inference_mode():
        for name in args.chains.split(","):
            for r in rows:
                first = None
                for text, cfg in configs:
                    res, out = measure(name, r, cfg)
                    first = out if first is None else first
                    res.update(chain=name, rows=r, config=text,
                               max_abs_diff=float((out.float() - first.float()).abs().max()))
                    report["results"].append(res)
                    print(f"{name:10s} {r:4d} {text:22s} {res['replay_ms']:9.3f} {res['us_per_projection']:8.2f} "
                          f"{res['weight_gb_per_s']:7.0f} {res['max_abs_diff']:9.2e}", flush=True)
                    if args.out:
                        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
