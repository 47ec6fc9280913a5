"""Decode-row projections that finish their own sum: ``resid + x @ W.T`` in one launch.

:func:`~voxline.kernels.gemv.small_linear` writes float32 split-K partials and leaves
their sum to the caller's compiled region, fused into whatever consumes it. After a
layer's output and down projections that consumer is the residual add followed by the
next RMSNorm, and Inductor often cannot fold a sum over the partials' leading dimension
into a row reduction: on an H200 the code predictor's captured frame at batch 1 ran 120
separate ``sum`` kernels (~1.7 us each, 0.21 ms a frame; round 8's profile). Here the
projection adds its own partials: each program writes its float32 tile and takes a
ticket from a per-tile counter; the program that draws the last ticket adds the tiles in
slice order (deterministic: the same bits whatever order the programs ran in), adds the
bias, rounds to the activation dtype, adds the residual with one more rounding (a bf16
add, as the unfused ``x + small_linear(...)``) and sets the counter back to zero for the
next launch.

The counters belong to the weight (a small buffer per weight, made on its first call,
which is the eager warm-up before a capture): launches of one weight are stream-ordered
(a model's steps run one after another) and two models never share a weight, so no two
running launches share a counter.

It equals the unfused arithmetic within float32 summation order (the split sums add in
another order than ``parts.sum(0)``), not bit-identically. The same kernel runs captured
and eager on CUDA, so a captured step still equals its eager twin there. Off CUDA, or
where :func:`fused_available` fails, callers keep ``x + small_linear(...)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import gemv, pdl
from .gemv import BLOCK_M, gemv_available, split_for
from .switch import KernelSwitch

try:  # Triton ships with CUDA builds of PyTorch only.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installed torch build
    triton = None

__all__ = ["MAX_ROWS", "fused_available", "linear_residual", "set_enabled"]

MAX_ROWS = BLOCK_M  # one row block: the counters are one per output block
_switch = KernelSwitch()
set_enabled = _switch.set  # benchmarks A/B the kernel
_counters: dict[tuple[str, int], Tensor] = {}
_retired: list[Tensor] = []


def fused_available(x: Tensor, weight: Tensor, resid: Tensor) -> bool:
    """Whether :func:`linear_residual` serves ``x [..., K]``, ``weight [N, K]`` and
    ``resid [..., N]``: at most one row block (:data:`MAX_ROWS`), where it was measured
    faster (a batch-32 step gained nothing from it)."""
    rows = x.numel() // max(1, x.shape[-1])
    return (_switch.on and rows <= MAX_ROWS and gemv_available(x, weight) and resid.dtype == x.dtype
            and resid.device == x.device and resid.shape[-1] == weight.shape[0]
            and resid.numel() // weight.shape[0] == rows)


def _counter(weight: Tensor) -> Tensor:
    """The weight's ticket counters, one per output block (zero between launches: the last
    program resets its own). A counter is never freed: a captured graph keeps its address,
    and a freed weight's address may come back as another weight with more outputs."""
    key = (str(weight.device), weight.data_ptr())
    blocks = -(-weight.shape[0] // gemv.BLOCK_N)
    c = _counters.get(key)
    if c is None or c.numel() < blocks:
        if c is not None:
            _retired.append(c)
        c = _counters[key] = torch.zeros(blocks, dtype=torch.int32, device=weight.device)
    return c


def linear_residual(x: Tensor, weight: Tensor, bias: Tensor | None, resid: Tensor) -> Tensor:
    """``resid + small_linear(x, weight, bias)`` in one launch (``resid`` shaped like the
    output). Only where :func:`fused_available` holds."""
    n, k = weight.shape
    out = torch.ops.voxline.gemv_residual(x.reshape(-1, k), weight, bias, resid.reshape(-1, n), split_for(n, k))
    return out.view(resid.shape)


if triton is not None:
    from .gemv import gemv_tile

    @triton.jit
    def _residual_epilogue(acc, b_ptr, r_ptr, out_ptr, rm, rn, tile_ok, N, HAS_BIAS: tl.constexpr):
        """Bias, the cast to the activation dtype, then the residual add (rounded once)."""
        dt = out_ptr.dtype.element_ty
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        out = rm[:, None] * N + rn[None, :]
        r = tl.load(r_ptr + out, mask=tile_ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + out, (r + acc.to(dt).to(tl.float32)).to(dt), mask=tile_ok)

    @triton.jit
    def _gemv_residual_kernel(
        x_ptr, w_ptr, b_ptr, r_ptr, parts_ptr, cnt_ptr, out_ptr, M, N, sxm, swn,
        K_SPLIT: tl.constexpr, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
    ):
        """A program per (``BLOCK_N`` outputs, K slice) over all rows (at most ``BLOCK_M``),
        as :func:`~voxline.kernels.gemv._gemv_kernel`; the last slice's program finishes the tile."""
        pid_n = tl.program_id(0)
        pid_s = tl.program_id(1)
        acc, rm, rn, row_ok, col_ok = gemv_tile(x_ptr, w_ptr, M, N, sxm, swn, K_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K,
                                                PDL)
        tile_ok = row_ok[:, None] & col_ok[None, :]
        tile = rm[:, None] * N + rn[None, :]
        if SPLIT == 1:
            _residual_epilogue(acc, b_ptr, r_ptr, out_ptr, rm, rn, tile_ok, N, HAS_BIAS)
        else:
            tl.store(parts_ptr + pid_s * M * N + tile, acc, mask=tile_ok)
            tl.debug_barrier()  # every thread's part of the tile is written before the ticket
            cnt = cnt_ptr + pid_n  # one row block (MAX_ROWS)
            ticket = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
            if ticket == SPLIT - 1:  # the last slice's program adds them all, in slice order
                tl.store(cnt, 0)  # the next launch finds it zero
                acc = tl.load(parts_ptr + tile, mask=tile_ok, other=0.0, cache_modifier=".cg")
                for s in tl.static_range(1, SPLIT):
                    acc += tl.load(parts_ptr + s * M * N + tile, mask=tile_ok, other=0.0, cache_modifier=".cg")
                _residual_epilogue(acc, b_ptr, r_ptr, out_ptr, rm, rn, tile_ok, N, HAS_BIAS)


@torch.library.custom_op("voxline::gemv_residual", mutates_args=())
def _gemv_residual(x: Tensor, weight: Tensor, bias: Tensor | None, resid: Tensor, split: int) -> Tensor:
    """``resid [M, N] + x [M, K] @ weight.T (+ bias)``, rounded as the unfused bf16 add."""
    m, k = x.shape
    n = weight.shape[0]
    if m > MAX_ROWS:
        raise ValueError(f"gemv_residual serves at most {MAX_ROWS} rows, got {m}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    resid = resid.contiguous()
    grid = (triton.cdiv(n, gemv.BLOCK_N), split, 1)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    parts = torch.empty((split, m, n) if split > 1 else (1,), dtype=torch.float32, device=x.device)
    cnt = _counter(weight) if split > 1 else parts
    use_pdl = pdl.active(x)
    _gemv_residual_kernel[grid](
        x, weight, bias if bias is not None else x, resid, parts, cnt, out, m, n, x.stride(0), weight.stride(0),
        K_SPLIT=k // split, SPLIT=split, HAS_BIAS=bias is not None,
        BLOCK_M=BLOCK_M, BLOCK_N=gemv.BLOCK_N, BLOCK_K=gemv.BLOCK_K, PDL=use_pdl, launch_pdl=use_pdl,
        **gemv.launch_options(m))
    return out


@_gemv_residual.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor | None, resid: Tensor, split: int) -> Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))
