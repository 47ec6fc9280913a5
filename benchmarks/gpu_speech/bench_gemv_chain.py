"""Projection launch configurations on a captured chain of decode-row projections (GPU).

    PYTHONPATH=. python3 benchmarks/gpu_speech/bench_gemv_chain.py --configs w4/s3,w4/s4,w4/s3/nopdl --out /tmp/chain.json

A Qwen3-TTS step at a few rows is a chain of dependent projections, each reading its
weight once. This builds that chain alone, out of :func:`~voxline.kernels.fused_linear.linear_residual`
launches with the real shapes and distinct random weights per layer (more than the L2
holds), captures it in one CUDA graph and times its replay, per configuration:

- ``wN`` / ``sN``: warps and pipeline stages of every projection kernel
  (:data:`~voxline.kernels.gemv.LAUNCH`);
- ``nN`` / ``kN`` / ``pN``: its tile (outputs, reduction columns per step) and the
  programs its K slices aim for (:func:`~voxline.kernels.gemv.configure`);
- ``nopdl``: launched without programmatic dependent launch.

Chains: ``predictor`` (hidden 1024: QKV 1024->4096, output 2048->1024, gate/up
1024->6144, down 3072->1024; 5 layers x 15 sub-steps, as a frame) and ``talker``
(hidden 2048: 2048->4096, 2048->2048, 2048->12288, 6144->2048; 28 layers, as a decode
step). Each layer feeds the first columns of its QKV and gate/up outputs to the next
projection, so every launch reads what the one before it wrote. Reported per chain and
rows: replay ms, microseconds per projection, weight GB/s, and the largest difference
from the first configuration (none from ``wN``/``sN``/``nopdl``; ``kN``, ``pN`` and ``nN``
change the K slices, so float32 partial sums add in another order).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from profile_gpu_tts import replay_ms  # noqa: E402

from voxline.kernels import fused_linear, pdl  # noqa: E402
from voxline.kernels.projection_knobs import knob_switch, set_knobs  # noqa: E402

CHAINS = {  # hidden, attention width, QKV outputs, MLP width, layers, repeats of the layers
    "predictor": (1024, 2048, 4096, 3072, 5, 15),
    "talker": (2048, 2048, 4096, 6144, 28, 1),
}


def parse_config(text: str) -> dict:
    parts = text.split("/")
    unknown = [p for p in parts if p != "nopdl" and knob_switch(p) is None]
    if unknown:
        raise SystemExit(f"--configs: unknown part {unknown[0]!r} in {text!r} (wN, sN, nN, kN, pN, nopdl)")
    return {"switches": parts, "pdl": "nopdl" not in parts}


def apply(cfg: dict) -> None:
    set_knobs([p for p in cfg["switches"] if p != "nopdl"])
    pdl.set_enabled(cfg["pdl"])


def make_layers(name: str, rows: int, seed: int = 0, device: str = "cuda",
                dtype: torch.dtype = torch.bfloat16) -> tuple[list[tuple[torch.Tensor, ...]], torch.Tensor]:
    """The chain's random weights per layer (QKV, output, gate/up, down) and its input rows."""
    hidden, attn, qkv, inter, layers, _ = CHAINS[name]
    g = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, generator=g, device=device) * scale).to(dtype)

    ws = [(rand(qkv, hidden, scale=hidden ** -0.5), rand(hidden, attn, scale=attn ** -0.5 / 4),
           rand(2 * inter, hidden, scale=hidden ** -0.5), rand(hidden, inter, scale=inter ** -0.5 / 4))
          for _ in range(layers)]
    return ws, rand(rows, hidden)


def linear_chain(name: str, ws: list[tuple[torch.Tensor, ...]], x: torch.Tensor):
    """The chain as ``linear_residual`` launches: (a function running it, launches, weight bytes read)."""
    _, attn, qkv, inter, layers, repeats = CHAINS[name]
    rows = x.shape[0]
    zero_qkv = torch.zeros(rows, qkv, dtype=x.dtype, device=x.device)
    zero_gu = torch.zeros(rows, 2 * inter, dtype=x.dtype, device=x.device)

    def chain() -> torch.Tensor:
        h = x
        for _ in range(repeats):
            for w_qkv, w_o, w_gu, w_down in ws:
                a = fused_linear.linear_residual(h, w_qkv, None, zero_qkv)
                h = fused_linear.linear_residual(a[:, :attn], w_o, None, h)
                u = fused_linear.linear_residual(h, w_gu, None, zero_gu)
                h = fused_linear.linear_residual(u[:, :inter], w_down, None, h)
        return h

    weight_bytes = sum(w.numel() * w.element_size() for layer in ws for w in layer) * repeats
    return chain, layers * repeats * 4, weight_bytes


def build(name: str, rows: int, seed: int = 0):
    return linear_chain(name, *make_layers(name, rows, seed))


def measure(name: str, rows: int, cfg: dict) -> tuple[dict, torch.Tensor]:
    apply(cfg)
    chain, launches, weight_bytes = build(name, rows)
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
    ap.add_argument("--configs", default="w4/s3,w4/s4,w4/s3/nopdl")
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
