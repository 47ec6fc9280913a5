"""Small-row projections whose input is computed in the kernel's prologue, one launch each.

In the code predictor's captured frame on an H200, after the one-kernel attention block
(:mod:`.qkv_attention`) a layer still ran three elementwise kernels between its
projections: the residual add + RMSNorm before the QKV projection, the same before the
gate/up projection, and the partials' sum + SwiGLU product before the down projection.
Each is a few microseconds of launch latency over a few kilobytes. Here they move into the
prologue of the projection that consumes them (the weight tiles, split-K partials and
launch grid are those of :func:`~voxline.kernels.gemv.small_linear`):

- :func:`norm_linear`: ``rms_norm(x + add) @ weight.T`` as float32 partials ``[split, M, N]``,
  where ``add`` (optional) is the float32 partials of the previous projection (the
  deferred residual add). Every program recomputes its rows' sum of squares over the
  whole row (a few kilobytes from L2 at decode batch sizes) and normalises its K slice;
  one program also writes the new residual ``x + add``.
- :func:`swiglu_linear`: ``silu(gate) * up`` of the gate/up projection's partials, then
  ``@ weight.T`` as partials: each program sums and rounds its K slice of gate and up.

Rounding points are the unfused path's: the added partials are summed in float32 and
rounded once to the activation dtype before the residual add (rounded again); RMSNorm
normalises in float32 and rounds before and after its weight (:func:`~.layer_ops.rms_norm`);
gate and up round after their sum, ``silu(gate)`` and the product round as eager bf16
ops do. So results equal the unfused functions within bf16 rounding (the summation order
of the float32 partials may differ), not bit-identically.

Measured on an H200 (round 6, code predictor frame step at batch 1, graph replay; results
in ``benchmarks/results/gpu_tts_h200_r6_prologue_*.json``): off 2.97 ms / 903 kernels;
SwiGLU prologue alone 3.32 ms / 828; all prologues 3.85 ms / 515 (6.75 ms with the
projection loop rolled). The launches go, but each prologue kernel costs more than the
kernels it replaces (uncaptured profile: down projection with the SwiGLU prologue 9.5 us
against 3.6 us + ~1 us for gemv + SwiGLU; norm-prologue projections ~11.7 us against
~4.4 us), so the module is **off by default** (:func:`set_enabled`); bench_gpu_tts
``--prologue-gemv ab`` compares. A likely cause, not yet confirmed: the prologue's operand
is made in registers and goes to the tensor cores through a layout conversion each chunk,
where the plain kernel's operands stream through Triton's pipelined shared-memory loads.

Served (once enabled) on CUDA in bfloat16/float16 when :func:`norm_available` / :func:`swiglu_available`
hold (few rows: the norm prologue re-reads whole rows in every program, which stops
paying past :data:`NORM_MAX_ROWS`); callers keep the unfused functions otherwise (CPU,
float32, larger batches). :func:`set_enabled` switches them on or off process-wide
(A/B), :func:`set_norm_enabled` the norm prologues within that (off by default: with
them off a layer takes only the SwiGLU prologue, the less slow of the two).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .gemv import BLOCK_K, BLOCK_M, BLOCK_N, gemv_available, split_for
from .layer_ops import rms_norm, silu_mul

try:  # Triton ships with CUDA builds of PyTorch only.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installed torch build
    triton = None

__all__ = ["NORM_MAX_ROWS", "SWIGLU_MAX_ROWS", "UNROLL_MAIN_LOOP", "layer_available", "norm_available",
           "norm_enabled", "norm_linear", "set_enabled", "set_norm_enabled", "swiglu_available", "swiglu_linear"]

# Each program of the norm prologue reads its rows whole (and the added partials): that
# L2 traffic grows with the rows and outweighs the saved launch past a few.
NORM_MAX_ROWS = 4
# The SwiGLU prologue reads only its K slice, as float32 gate and up (4x today's bf16 input).
SWIGLU_MAX_ROWS = 16
# The projection loop rolled (Triton pipelines the weight tiles' loads) or unrolled (every
# chunk's prologue loads can be in flight at once); read at each launch, so a benchmark
# that sets it before capturing a graph compares the two.
UNROLL_MAIN_LOOP = True
# Off by default: on an H200 (round 6) both prologues measured slower than the kernels
# they replace (see the module docstring); the switch stays for the A/B and later work.
_enabled = False
# The norm prologues (QKV and gate/up projections, the codebook head): off by default, as
# they measured slower than the kernels they replace on an H200 (see the module docstring);
# with them off a layer still takes the SwiGLU prologue.
_norm = False


def set_enabled(on: bool) -> bool:
    """Switch the fused prologues on or off process-wide (benchmarks A/B them); returns
    the old value. Only affects steps traced or run after the call."""
    global _enabled
    old, _enabled = _enabled, on
    return old


def set_norm_enabled(on: bool) -> bool:
    """Switch the norm prologues on or off process-wide (within :func:`set_enabled`);
    returns the old value. Only affects steps traced after the call."""
    global _norm
    old, _norm = _norm, on
    return old


def norm_enabled() -> bool:
    """Whether a decoder layer takes the norm prologues too (:func:`layer_available`)."""
    return _norm


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _rows(x: Tensor) -> int:
    return x.numel() // max(1, x.shape[-1])


def norm_available(x: Tensor, add: Tensor | None, ln_w: Tensor, weight: Tensor, bias: Tensor | None = None) -> bool:
    """Whether :func:`norm_linear` serves ``x [..., K]`` (plus ``add [S, M, K]`` float32
    partials, or None), the norm weight ``[K]`` and the projection ``weight [N, K]``
    (no bias)."""
    if not (_enabled and triton is not None and bias is None and gemv_available(x, weight)):
        return False
    k = x.shape[-1]
    rows = _rows(x)
    if rows > NORM_MAX_ROWS or tuple(ln_w.shape) != (k,) or ln_w.dtype != x.dtype or weight.shape[1] != k:
        return False
    return add is None or (add.dim() == 3 and tuple(add.shape[1:]) == (rows, k) and add.dtype == torch.float32)


def swiglu_available(gate_up: Tensor, weight: Tensor, bias: Tensor | None = None) -> bool:
    """Whether :func:`swiglu_linear` serves the gate/up partials ``[S, M, 2K]`` (float32)
    and the down projection ``weight [N, K]`` (no bias)."""
    if not (_enabled and triton is not None and bias is None and gate_up.dim() == 3):
        return False
    _, m, n2 = gate_up.shape
    k = n2 // 2
    return (gate_up.is_cuda and gate_up.dtype == torch.float32 and weight.is_cuda
            and weight.dtype in (torch.bfloat16, torch.float16) and n2 == 2 * k and weight.shape[1] == k
            and k % BLOCK_K == 0 and m <= SWIGLU_MAX_ROWS and weight.stride(-1) == 1)


def layer_available(x: Tensor, pending: Tensor | None, prep_w: tuple, post_w: tuple) -> bool:
    """Whether a decoder layer's projections (``prep_w``/``post_w``: the weight arguments of
    :func:`~.decoder_step.attn_prep` and :func:`~.decoder_step.attn_out_mlp`) can all run
    through the prologue kernels for the residual ``x [B, Q, hidden]`` with the previous
    layer's down-projection partials ``pending`` still to add: the QKV projection with the
    norm prologue, the output projection as plain partials, gate/up with the residual add
    and norm prologue, down with the SwiGLU prologue; with the norm prologues off
    (:func:`set_norm_enabled`) only the last, the rest as the unfused path. No output,
    gate/up or down bias."""
    ln_w, _, qkv_w, _, q_out, _, _, _, _, _ = prep_w
    o_w, o_b, post_ln_w, _, gu_w, gu_b, down_w, down_b = post_w
    rows, hidden = _rows(x), x.shape[-1]
    inter = down_w.shape[-1]
    if o_b is not None or gu_b is not None or down_b is not None or rows > SWIGLU_MAX_ROWS:
        return False
    if _norm:
        if not (norm_available(x, pending, ln_w, qkv_w) and norm_available(x, None, post_ln_w, gu_w)):
            return False
    elif not (_enabled and triton is not None and gemv_available(x, gu_w)):
        return False
    return (tuple(o_w.shape) == (hidden, q_out) and q_out % BLOCK_K == 0 and o_w.dtype == x.dtype
            and o_w.stride(-1) == 1 and tuple(gu_w.shape) == (2 * inter, hidden) and inter % BLOCK_K == 0
            and tuple(down_w.shape) == (hidden, inter) and down_w.dtype == x.dtype and down_w.stride(-1) == 1)


def norm_linear(x: Tensor, add: Tensor | None, ln_w: Tensor, eps: float, weight: Tensor) -> tuple[Tensor, Tensor]:
    """``r = x + add`` (``add``: float32 partials ``[S, M, K]`` summed and rounded, or
    None), then ``rms_norm(r, ln_w, eps) @ weight.T`` as float32 partials ``[split, M, N]``.
    Returns the partials and ``r`` (``x``'s shape). Only where :func:`norm_available`."""
    k = x.shape[-1]
    parts, res = torch.ops.voxline.norm_gemv_partials(x.reshape(-1, k), add, ln_w, eps, weight,
                                                      split_for(weight.shape[0], k))
    return parts, res.view(x.shape)


def swiglu_linear(gate_up: Tensor, weight: Tensor) -> Tensor:
    """``silu(gate) * up`` of the gate/up partials ``[S, M, 2K]`` (summed, rounded to
    ``weight.dtype``), ``@ weight.T`` as float32 partials ``[split, M, N]``. Only where
    :func:`swiglu_available`."""
    n, k = weight.shape
    return torch.ops.voxline.swiglu_gemv_partials(gate_up, weight, split_for(n, k))


def _split_linear(a: Tensor, weight: Tensor, split: int) -> Tensor:
    """Float32 partial products of ``a [M, K]`` and ``weight [N, K]`` over ``split`` K slices."""
    ks = a.shape[-1] // split
    a, w = a.float(), weight.float()
    return torch.stack([F.linear(a[:, i * ks:(i + 1) * ks], w[:, i * ks:(i + 1) * ks]) for i in range(split)])


if triton is not None:

    @triton.jit
    def _residual(x_ptr, add_ptr, rm, cols, row_ok, M, K, sxm,
                  ADD_SPLIT: tl.constexpr, HAS_ADD: tl.constexpr, DT: tl.constexpr):
        """Rows ``rm`` and columns ``cols`` of ``x + round(sum(add))``, rounded (float32
        holding ``DT`` values)."""
        ok = row_ok[:, None]
        r = tl.load(x_ptr + rm[:, None] * sxm + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        if HAS_ADD:
            off = rm[:, None] * K + cols[None, :]
            p = tl.load(add_ptr + off, mask=ok, other=0.0)
            for s in tl.static_range(1, ADD_SPLIT):
                p += tl.load(add_ptr + s * M * K + off, mask=ok, other=0.0)
            r = (r + p.to(DT).to(tl.float32)).to(DT).to(tl.float32)
        return r

    @triton.jit
    def _norm_chunk(x_ptr, add_ptr, ln_ptr, w_base, rm, rk, row_ok, col_ok, inv, k0, kk, M, K, sxm,
                    ADD_SPLIT: tl.constexpr, HAS_ADD: tl.constexpr, DT: tl.constexpr):
        """One ``BLOCK_K`` chunk's product: ``rms_norm`` of the residual's columns
        ``k0 + kk + rk`` (``inv``: the rows' 1/rms) times the weight tile's."""
        cols = k0 + kk + rk
        r = _residual(x_ptr, add_ptr, rm, cols, row_ok, M, K, sxm, ADD_SPLIT, HAS_ADD, DT)
        ln = tl.load(ln_ptr + cols).to(tl.float32)[None, :]
        a = (ln * (r * inv).to(DT).to(tl.float32)).to(DT)
        w = tl.load(w_base + kk + rk[None, :], mask=col_ok[:, None], other=0.0)
        return tl.dot(a, tl.trans(w))

    @triton.jit
    def _swiglu_chunk(gu_ptr, w_base, rm, rk, row_ok, col_ok, k0, kk, M, K,
                      GU_SPLIT: tl.constexpr, DT: tl.constexpr):
        """One ``BLOCK_K`` chunk's product: ``silu(gate) * up`` of columns ``k0 + kk + rk``
        (gate/up partials summed and rounded, each op rounded as eager) times the weight's."""
        two_k = 2 * K
        off = rm[:, None] * two_k + (k0 + kk + rk)[None, :]
        g = tl.load(gu_ptr + off, mask=row_ok[:, None], other=0.0)
        u = tl.load(gu_ptr + off + K, mask=row_ok[:, None], other=0.0)
        for s in tl.static_range(1, GU_SPLIT):
            g += tl.load(gu_ptr + s * M * two_k + off, mask=row_ok[:, None], other=0.0)
            u += tl.load(gu_ptr + s * M * two_k + off + K, mask=row_ok[:, None], other=0.0)
        g = g.to(DT).to(tl.float32)
        u = u.to(DT).to(tl.float32)
        sg = (g / (1.0 + tl.exp(-g))).to(DT).to(tl.float32)
        a = (sg * u).to(DT)
        w = tl.load(w_base + kk + rk[None, :], mask=col_ok[:, None], other=0.0)
        return tl.dot(a, tl.trans(w))

    @triton.jit
    def _norm_gemv_kernel(
        x_ptr, add_ptr, ln_ptr, w_ptr, out_ptr, res_ptr, M, N, sxm, swn, eps,
        K: tl.constexpr, ADD_SPLIT: tl.constexpr, HAS_ADD: tl.constexpr, K_SPLIT: tl.constexpr, DT: tl.constexpr,
        ROWS: tl.constexpr, UNROLL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        pid_n = tl.program_id(0)
        pid_s = tl.program_id(1)
        pid_m = tl.program_id(2)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        row_ok = rm < M
        col_ok = rn < N
        # The whole rows' sum of squares over only the ROWS real rows (padded to a power of
        # two; the dot's BLOCK_M tile pads to 16), unrolled so the loads of every chunk can
        # be in flight together (a rolled loop waits out one L2 round trip per chunk).
        # Program (0, 0) of each row block also writes the residual (nothing else reads it
        # in this launch).
        writer = (pid_n == 0) & (pid_s == 0)
        rr = pid_m * BLOCK_M + tl.arange(0, ROWS)
        rr_ok = rr < M
        ss = tl.zeros((ROWS,), tl.float32)
        for c in tl.static_range(K // BLOCK_K):
            r = _residual(x_ptr, add_ptr, rr, c * BLOCK_K + rk, rr_ok, M, K, sxm, ADD_SPLIT, HAS_ADD, DT)
            ss += tl.sum(r * r, axis=1)
            tl.store(res_ptr + rr[:, None] * K + c * BLOCK_K + rk[None, :], r.to(DT), mask=rr_ok[:, None] & writer)
        inv_rows = tl.rsqrt(ss / K + eps)
        # ... spread onto the tile's BLOCK_M rows (padding rows: 0, their inputs are 0).
        inv = tl.sum(tl.where(rm[:, None] == rr[None, :], inv_rows[None, :], 0.0), axis=1)[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        w_base = w_ptr + rn[:, None] * swn + pid_s * K_SPLIT
        if UNROLL:
            for c in tl.static_range(K_SPLIT // BLOCK_K):
                acc += _norm_chunk(x_ptr, add_ptr, ln_ptr, w_base, rm, rk, row_ok, col_ok, inv, pid_s * K_SPLIT,
                                   c * BLOCK_K, M, K, sxm, ADD_SPLIT, HAS_ADD, DT)
        else:
            for kk in range(0, K_SPLIT, BLOCK_K):
                acc += _norm_chunk(x_ptr, add_ptr, ln_ptr, w_base, rm, rk, row_ok, col_ok, inv, pid_s * K_SPLIT,
                                   kk, M, K, sxm, ADD_SPLIT, HAS_ADD, DT)
        out = out_ptr + (pid_s * M + rm[:, None]) * N + rn[None, :]
        tl.store(out, acc, mask=row_ok[:, None] & col_ok[None, :])

    @triton.jit
    def _swiglu_gemv_kernel(
        gu_ptr, w_ptr, out_ptr, M, N, swn,
        K: tl.constexpr, GU_SPLIT: tl.constexpr, K_SPLIT: tl.constexpr, DT: tl.constexpr,
        UNROLL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        pid_n = tl.program_id(0)
        pid_s = tl.program_id(1)
        pid_m = tl.program_id(2)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        row_ok = rm < M
        col_ok = rn < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        w_base = w_ptr + rn[:, None] * swn + pid_s * K_SPLIT
        if UNROLL:
            for c in tl.static_range(K_SPLIT // BLOCK_K):
                acc += _swiglu_chunk(gu_ptr, w_base, rm, rk, row_ok, col_ok, pid_s * K_SPLIT, c * BLOCK_K, M, K,
                                     GU_SPLIT, DT)
        else:
            for kk in range(0, K_SPLIT, BLOCK_K):
                acc += _swiglu_chunk(gu_ptr, w_base, rm, rk, row_ok, col_ok, pid_s * K_SPLIT, kk, M, K,
                                     GU_SPLIT, DT)
        out = out_ptr + (pid_s * M + rm[:, None]) * N + rn[None, :]
        tl.store(out, acc, mask=row_ok[:, None] & col_ok[None, :])

    _TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@torch.library.custom_op("voxline::norm_gemv_partials", mutates_args=())
def _norm_gemv_partials(
    x: Tensor, add: Tensor | None, ln_w: Tensor, eps: float, weight: Tensor, split: int,
) -> tuple[Tensor, Tensor]:
    """``x [M, K]`` plus the partials ``add [S, M, K]`` (or None) -> float32 partials
    ``[split, M, N]`` of ``rms_norm(x + add) @ weight.T`` and the residual ``x + add [M, K]``
    (a new tensor also without ``add``). Opaque to ``torch.compile`` (one external call)."""
    m, k = x.shape
    n = weight.shape[0]
    if x.stride(-1) != 1:
        x = x.contiguous()
    if add is not None and not add.is_contiguous():
        add = add.contiguous()
    out = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    res = torch.empty((m, k), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(n, BLOCK_N), split, triton.cdiv(m, BLOCK_M))
    _norm_gemv_kernel[grid](
        x, x if add is None else add, ln_w, weight, out, res, m, n, x.stride(0), weight.stride(0), eps,
        K=k, ADD_SPLIT=1 if add is None else add.shape[0], HAS_ADD=add is not None, K_SPLIT=k // split,
        DT=_TL_DTYPES[x.dtype], ROWS=max(2, _pow2(min(m, BLOCK_M))), UNROLL=UNROLL_MAIN_LOOP,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=4, num_stages=3,
    )
    return out, res


@_norm_gemv_partials.register_fake
def _(x: Tensor, add: Tensor | None, ln_w: Tensor, eps: float, weight: Tensor, split: int) -> tuple[Tensor, Tensor]:
    return x.new_empty((split, x.shape[0], weight.shape[0]), dtype=torch.float32), x.new_empty(x.shape)


@_norm_gemv_partials.register_kernel("cpu")
def _norm_gemv_partials_reference(
    x: Tensor, add: Tensor | None, ln_w: Tensor, eps: float, weight: Tensor, split: int,
) -> tuple[Tensor, Tensor]:
    """The operator spelled with the unfused functions (the residual add as
    ``small_linear``'s caller does it, :func:`~.layer_ops.rms_norm`, then the projection's
    partials): its CPU kernel and the reference tests check the Triton kernel against."""
    res = x.clone() if add is None else x + add.sum(0).to(x.dtype)
    return _split_linear(rms_norm(res, ln_w, eps), weight, split), res


@torch.library.custom_op("voxline::swiglu_gemv_partials", mutates_args=())
def _swiglu_gemv_partials(gate_up: Tensor, weight: Tensor, split: int) -> Tensor:
    """Gate/up partials ``[S, M, 2K]`` -> float32 partials ``[split, M, N]`` of
    ``silu(gate) * up @ weight.T`` (``weight [N, K]``). Opaque to ``torch.compile``."""
    s, m, n2 = gate_up.shape
    n, k = weight.shape
    if not gate_up.is_contiguous():
        gate_up = gate_up.contiguous()
    out = torch.empty((split, m, n), dtype=torch.float32, device=weight.device)
    grid = (triton.cdiv(n, BLOCK_N), split, triton.cdiv(m, BLOCK_M))
    _swiglu_gemv_kernel[grid](
        gate_up, weight, out, m, n, weight.stride(0),
        K=k, GU_SPLIT=s, K_SPLIT=k // split, DT=_TL_DTYPES[weight.dtype], UNROLL=UNROLL_MAIN_LOOP,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=4, num_stages=3,
    )
    return out


@_swiglu_gemv_partials.register_fake
def _(gate_up: Tensor, weight: Tensor, split: int) -> Tensor:
    return gate_up.new_empty((split, gate_up.shape[1], weight.shape[0]))


@_swiglu_gemv_partials.register_kernel("cpu")
def _swiglu_gemv_partials_reference(gate_up: Tensor, weight: Tensor, split: int) -> Tensor:
    """The operator spelled with the unfused functions (``small_linear``'s sum and cast,
    ``chunk``, :func:`~.layer_ops.silu_mul`): its CPU kernel and the tests' reference."""
    gate, up = gate_up.sum(0).to(weight.dtype).chunk(2, dim=-1)
    return _split_linear(silu_mul(gate, up), weight, split)
