"""Is a persistent kernel faster than a chain of PDL launches? The projection chain both ways (GPU).

    PYTHONPATH=. python3 benchmarks/bench_persistent_chain.py --out /tmp/persistent.json

Round 11 (benchmarks/README.md) found a decode-row projection costs ~4.9 us in a captured
chain of PDL launches at one row, ~3x what its weight read takes at the H200's bandwidth,
and that reading weights before the wait or prefetching them from a side stream does not
help. The candidate left is a persistent kernel: one program per multiprocessor walks
the whole chain, phase by phase, with a grid-wide barrier between dependent phases, and
asks L2 for the next phase's weight while it computes the current one (so its reads hit
L2 once the barrier opens). Before building that for a real layer (norms, attention),
this measures it on the same chain ``bench_gemv_chain.py`` times, side by side:

- ``chain``: the chain of :func:`~voxline.kernels.fused_linear.linear_residual` launches
  (PDL on where supported), captured in one graph;
- ``persistent``: one launch of :func:`persistent_chain` (``--programs`` per SM, prefetch
  on where the next weight is at most ``--prefetch-mb``), captured likewise;
- ``persistent_noprefetch``; and ``persistent_nosync`` (barriers off: a wrong result, timed
  only to split the persistent time into streaming and barriers).

Every program of a launch must be resident at once (the barrier waits for all of
them): ``--programs`` of 1 or 2 per multiprocessor fit beside nothing else (96-128
registers a thread, 8 KB of shared memory, by ptxas for sm_90). Run it under ``timeout``.

Reported per chain and rows: replay ms, us per projection, and the largest difference
between the persistent result and the chain's (K slices sized for the programs, not as
the chain's kernels size them, add partial sums in another order: a few bf16 units). The kernel's arithmetic is checked on the CPU by
``tests/test_persistent_chain.py`` (Triton's interpreter, one program, where the barrier
never waits).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CUDA builds of torch ship Triton
    triton = None

BLOCK_M = 16  # rows, padded for the tensor cores
BLOCK_N = 16  # outputs per tile (narrow: more tiles before a phase needs K slices)
BLOCK_K = 128
TABLE_COLS = 8  # per phase: N, K, weight, input, input row stride, output and residual offsets, K slices

if triton is not None:

    @triton.jit
    def _grid_sync(bar_ptr, target):
        """Wait until ``target`` arrivals: this program's writes are visible to every
        program after it, and theirs to it (release on arrival, acquire on the poll)."""
        tl.debug_barrier()  # every warp's stores are issued before the arrival
        tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
        seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        while seen < target:
            seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()

    @triton.jit
    def _prefetch_share(w_ptr, nbytes, pid, G):
        """Ask L2 for this program's share of ``nbytes`` from ``w_ptr`` (bulk prefetch,
        sm_90: 32 lanes, 16-byte aligned pieces); nothing waits for it."""
        share = ((nbytes + G - 1) // G + 511) // 512 * 512
        lane = tl.arange(0, 32)
        start = pid.to(tl.int64) * share + lane * (share // 32)
        size = tl.maximum(tl.minimum(share // 32, nbytes - start), 0).to(tl.int32)
        ptr = w_ptr.to(tl.pointer_type(tl.int8)) + start
        tl.inline_asm_elementwise(
            "{\n\t.reg .pred p;\n\tsetp.gt.s32 p, $2, 0;\n\t@p cp.async.bulk.prefetch.L2.global [$1], $2;"
            "\n\tmov.u32 $0, 0;\n\t}", "=r,l,r", [ptr, size], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def _epilogue(acc, act_ptr, out_off, r_off, tile, row_ok):
        """Round to the activation dtype, add the residual (rounded once more), store."""
        dt = act_ptr.dtype.element_ty
        out = acc.to(dt)
        if r_off >= 0:
            r = tl.load(act_ptr + r_off + tile, mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
            out = (r.to(tl.float32) + out.to(tl.float32)).to(dt)
        tl.store(act_ptr + out_off + tile, out, mask=row_ok[:, None])

    @triton.jit
    def _chain_kernel(w_ptr, act_ptr, table_ptr, bar_ptr, part_ptr, cnt_ptr, M, P, prefetch_max,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      PREFETCH: tl.constexpr, SYNC: tl.constexpr):
        """Phases ``0..P-1`` of ``table [P, 8]`` in order, each ``out = x @ W.T (+ resid)``
        over ``M`` rows: work items of ``BLOCK_N`` outputs by one of ``split`` K slices,
        shared round-robin by the programs, a grid barrier between phases. A split tile's
        slices write float32 partials (``part``) and take a ticket (``cnt``, one per tile);
        the last one adds them in slice order and finishes the tile, as
        :mod:`voxline.kernels.fused_linear` does. ``bar [2]`` and ``cnt`` are zero at launch
        and again at exit."""
        pid = tl.program_id(0)
        G = tl.num_programs(0)
        rm = tl.arange(0, BLOCK_M)
        row_ok = rm < M
        rk = tl.arange(0, BLOCK_K)
        rn0 = tl.arange(0, BLOCK_N)
        for p in range(P):
            row = table_ptr + p * 8
            n = tl.load(row)
            k = tl.load(row + 1)
            w_off = tl.load(row + 2)
            x_off = tl.load(row + 3)
            sx = tl.load(row + 4)
            out_off = tl.load(row + 5)
            r_off = tl.load(row + 6)
            split = tl.load(row + 7)
            if PREFETCH:
                if p + 1 < P:
                    nbytes = tl.load(row + 8) * tl.load(row + 9) * 2
                    if nbytes <= prefetch_max:
                        _prefetch_share(w_ptr + tl.load(row + 10), nbytes, pid, G)
            k_slice = k // split
            for i in range(pid, n // BLOCK_N * split, G):
                t = i // split
                k0 = (i % split) * k_slice
                rn = t * BLOCK_N + rn0
                acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
                for kk in range(k0, k0 + k_slice, BLOCK_K):
                    x = tl.load(act_ptr + x_off + rm[:, None] * sx + kk + rk[None, :], mask=row_ok[:, None],
                                other=0.0, cache_modifier=".cg")  # written by other programs: past L1
                    w = tl.load(w_ptr + w_off + rn[:, None] * k + kk + rk[None, :])
                    acc += tl.dot(x, tl.trans(w))
                tile = rm[:, None] * n + rn[None, :]
                if split == 1:
                    _epilogue(acc, act_ptr, out_off, r_off, tile, row_ok)
                else:
                    part = part_ptr + rm[:, None] * n + rn[None, :]
                    tl.store(part + (i % split) * BLOCK_M * n, acc)
                    tl.debug_barrier()  # every thread's part of the tile is written before the ticket
                    if tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel", scope="gpu") == split - 1:
                        tl.store(cnt_ptr + t, 0)  # the next phase (or launch) finds it zero
                        acc = tl.load(part, cache_modifier=".cg")
                        for s in range(1, split):
                            acc += tl.load(part + s * BLOCK_M * n, cache_modifier=".cg")
                        _epilogue(acc, act_ptr, out_off, r_off, tile, row_ok)
            if SYNC:
                if p + 1 < P:
                    _grid_sync(bar_ptr, (p + 1) * G)
        # The last program out resets the counters: every program is past its last poll.
        if SYNC:
            if tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu") == G - 1:
                tl.store(bar_ptr, 0)
                tl.store(bar_ptr + 1, 0)


def split_for(n: int, k: int, programs: int) -> int:
    """K slices per tile: the fewest (a power of two) giving every program a work item,
    each slice a whole number of ``BLOCK_K`` blocks."""
    split = 1
    while n // BLOCK_N * split < programs and k % (split * 2 * BLOCK_K) == 0:
        split *= 2
    return split


def phase_table(phases: list[tuple[int, ...]], device: torch.device, programs: int) -> torch.Tensor:
    """``[P, 8]`` int64 rows of ``(N, K, weight offset, input offset, input row stride,
    output offset, residual offset or -1, K slices)``, element offsets into the weight and
    activation buffers; the slices sized for ``programs`` (:func:`split_for`)."""
    for p in phases:
        if p[0] % BLOCK_N or p[1] % BLOCK_K:
            raise ValueError(f"phase {p}: N must be a multiple of {BLOCK_N}, K of {BLOCK_K}")
    rows = [[*p, split_for(p[0], p[1], programs)] for p in phases]
    return torch.tensor(rows, dtype=torch.int64, device=device)


def persistent_chain(weights: torch.Tensor, act: torch.Tensor, table: torch.Tensor, bar: torch.Tensor,
                     part: torch.Tensor, cnt: torch.Tensor, rows: int, programs: int, *,
                     prefetch_max: int = 0, sync: bool = True) -> None:
    """Run the phases of ``table`` (:func:`phase_table`) over the flat ``weights`` and ``act``
    buffers (same dtype) in one launch of ``programs`` programs (all must be resident at
    once when ``programs > 1``: at most what the GPU holds side by side). ``bar``: two
    int32 zeros; ``part``: float32, slices x ``BLOCK_M`` x the widest split phase's N;
    ``cnt``: int32 zeros, one per tile of that phase."""
    if rows > BLOCK_M:
        raise ValueError(f"at most {BLOCK_M} rows, got {rows}")
    _chain_kernel[(programs,)](weights, act, table, bar, part, cnt, rows, table.shape[0], prefetch_max,
                               BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                               PREFETCH=prefetch_max > 0, SYNC=sync, num_warps=4, num_stages=4)


class FlatChain:
    """A projection chain laid out for :func:`persistent_chain`: every weight in one flat
    buffer, the activations in another (ping-pong residual streams), and the phase table.
    ``layers`` of (QKV, output, gate/up, down) as ``bench_gemv_chain.py`` builds them."""

    def __init__(self, layers: list[tuple[torch.Tensor, ...]], x: torch.Tensor, repeats: int, attn: int,
                 inter: int) -> None:
        dev, dt = x.device, x.dtype
        rows, hidden = x.shape
        self.weights = torch.cat([w.reshape(-1) for layer in layers for w in layer])
        offs, o = [], 0
        for layer in layers:
            offs.append([])
            for w in layer:
                offs[-1].append(o)
                o += w.numel()
        qkv, gu = layers[0][0].shape[0], layers[0][2].shape[0]
        sizes = {"hA": rows * hidden, "hB": rows * hidden, "a": rows * qkv, "u": rows * gu}
        self.at, o = {}, 0
        for name, size in sizes.items():
            self.at[name] = o
            o += size
        self.act = torch.zeros(o, dtype=dt, device=dev)
        self.act[:rows * hidden] = x.reshape(-1)
        phases = []
        for _ in range(repeats):
            for off in offs:
                phases += [
                    (qkv, hidden, off[0], self.at["hA"], hidden, self.at["a"], -1),
                    (hidden, attn, off[1], self.at["a"], qkv, self.at["hB"], self.at["hA"]),
                    (gu, hidden, off[2], self.at["hB"], hidden, self.at["u"], -1),
                    (hidden, inter, off[3], self.at["u"], gu, self.at["hA"], self.at["hB"]),
                ]
        self.phases = phases
        self.tables: dict[int, tuple[torch.Tensor, list[list[int]]]] = {}
        self.bar = torch.zeros(2, dtype=torch.int32, device=dev)
        self.part = torch.zeros(0, dtype=torch.float32, device=dev)  # split tiles' partials
        self.cnt = torch.zeros(max(p[0] for p in phases) // BLOCK_N, dtype=torch.int32, device=dev)
        self.rows, self.hidden, self.x = rows, hidden, x

    def table(self, programs: int) -> tuple[torch.Tensor, list[list[int]]]:
        """The phase table with its K slices sized for ``programs``, and its rows on the
        host (read without a device sync)."""
        if programs not in self.tables:
            t = phase_table(self.phases, self.x.device, programs)
            self.tables[programs] = (t, t.tolist())
        return self.tables[programs]

    def run(self, programs: int, prefetch_max: int = 0, sync: bool = True,
            split_programs: int | None = None) -> torch.Tensor:
        """The chain's final residual stream ``[rows, hidden]`` (a view into ``act``), run by
        ``programs`` programs with the K slices sized for ``split_programs`` (default the same)."""
        table, rows = self.table(split_programs or programs)
        need = max(BLOCK_M * n * split for n, *_, split in rows)
        if self.part.numel() < need:  # grown on an eager call, before any capture uses it
            self.part = torch.zeros(need, dtype=torch.float32, device=self.x.device)
        self.act[:self.rows * self.hidden].copy_(self.x.reshape(-1))
        persistent_chain(self.weights, self.act, table, self.bar, self.part, self.cnt, self.rows, programs,
                         prefetch_max=prefetch_max, sync=sync)
        return self.act[self.at["hA"]:self.at["hA"] + self.rows * self.hidden].view(self.rows, self.hidden)


def reference(layers: list[tuple[torch.Tensor, ...]], x: torch.Tensor, repeats: int, attn: int,
              inter: int) -> torch.Tensor:
    """The chain in float32 matmuls, rounded where the kernel rounds."""
    h = x
    for _ in range(repeats):
        for w_qkv, w_o, w_gu, w_down in layers:
            a = (h.float() @ w_qkv.float().T).to(x.dtype)
            h = (h.float() + (a[:, :attn].float() @ w_o.float().T).to(x.dtype).float()).to(x.dtype)
            u = (h.float() @ w_gu.float().T).to(x.dtype)
            h = (h.float() + (u[:, :inter].float() @ w_down.float().T).to(x.dtype).float()).to(x.dtype)
    return h


def main() -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_gemv_chain import CHAINS, apply, linear_chain, make_layers, parse_config
    from profile_gpu_tts import replay_ms

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chains", default="predictor,talker")
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--programs", default="1,2", help="programs per multiprocessor, comma-separated")
    ap.add_argument("--prefetch-mb", type=float, default=24.0, help="prefetch a next weight up to this size")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    report: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "sms": sms, "results": []}

    def timed(fn) -> tuple[float, torch.Tensor]:
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
        ms = replay_ms(graph.replay)
        graph.replay()
        torch.cuda.synchronize()
        return ms, out.clone()

    print(f"{'chain':10s} {'rows':>4s} {'arm':28s} {'replay ms':>9s} {'us/proj':>8s} {'max diff':>9s}")
    with torch.inference_mode():
        for name in args.chains.split(","):
            hidden, attn, _, inter, _, repeats = CHAINS[name]
            for r in (int(x) for x in args.rows.split(",")):
                apply(parse_config("w4/s3"))
                layers, x = make_layers(name, r)
                chain, launches, _ = linear_chain(name, layers, x)
                ms, ref = timed(chain)
                arms = [("chain", ms, ref)]
                flat = FlatChain(layers, x, repeats, attn, inter)  # the same weights and input, laid out flat
                for per_sm in (int(x) for x in args.programs.split(",")):
                    g = per_sm * sms
                    for arm, kw in ((f"persistent/{per_sm}", {"prefetch_max": int(args.prefetch_mb * 2 ** 20)}),
                                    (f"persistent_noprefetch/{per_sm}", {}),
                                    (f"persistent_nosync/{per_sm}", {"sync": False})):
                        ms, out = timed(lambda g=g, kw=kw, flat=flat: flat.run(g, **kw))
                        arms.append((arm, ms, out))
                for arm, ms, out in arms:
                    row = {"chain": name, "rows": r, "arm": arm, "replay_ms": ms,
                           "us_per_projection": round(ms * 1000 / launches, 2),
                           "max_abs_diff": float((out.float() - ref.float()).abs().max())}
                    report["results"].append(row)
                    print(f"{name:10s} {r:4d} {arm:28s} {ms:9.3f} {row['us_per_projection']:8.2f} "
                          f"{row['max_abs_diff']:9.2e}", flush=True)
                if args.out:
                    args.out.write_text(json.dumps(report, indent=1))
                del chain, flat, layers
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
