"""Linear layers for a few rows (decode steps): one Triton launch, weights read once.

At decode batch sizes a linear layer is a matrix-vector product bound by reading its
weight. cuBLAS picks tiles made for larger products there: inside the code predictor's
captured frame on an H200 its gate/up projection (1024 -> 6144, 12.6 MB in bf16) took
~12 us, ~1 TB/s, and the predictor runs 315 projections a frame (round 3's profile;
with this kernel the frame went from 4.37 to 3.59 ms at batch 1). :func:`small_linear` spreads the
weight over at least two programs per multiprocessor instead: a program per block of
``BLOCK_N`` output features and (when the outputs alone give too few programs) per
slice of the reduction, each reading its weight tile once for all rows (padded to 16
for the tensor cores). Slices write float32 partial sums ``[split, M, N]``; their sum
and the cast back happen in the caller's compiled region, fused into whatever consumes
the result (residual add, SwiGLU, RoPE), so the split costs no extra launch there.

It serves bfloat16/float16 on CUDA for up to :data:`MAX_ROWS` rows and reductions that
are a multiple of :data:`BLOCK_K`; anything else (CPU, float32, prefill) is
``F.linear``, the reference it is checked against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import pdl
from .switch import KernelSwitch

try:  # Triton ships with CUDA builds of PyTorch only.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installed torch build
    triton = None

__all__ = ["LAUNCH", "MAX_ROWS", "WIDE_STAGES", "configure", "gemv_available", "launch_options", "set_enabled",
           "small_linear", "split_for"]

MAX_ROWS = 64
BLOCK_M = 16
BLOCK_N = 32
BLOCK_K = 128
TARGET_PROGRAMS = 264  # two per multiprocessor of an H100/H200
# Launch options of every projection kernel up to one row block (benchmarks sweep them).
# Four pipeline stages: on an H200 the batch-1 predictor frame 2.55 -> 2.50 ms and the
# talker decode 1.59 -> 1.53 ms against three (round 12); at batch 32 (two row blocks) four
# were 3 % slower, so wider launches keep three.
LAUNCH = {"num_warps": 4, "num_stages": 4}
WIDE_STAGES = 3
_TILE_KNOBS = {"block_n": "BLOCK_N", "block_k": "BLOCK_K", "programs": "TARGET_PROGRAMS"}
_switch = KernelSwitch()
set_enabled = _switch.set  # benchmarks A/B the kernel


def gemv_available(x: Tensor, weight: Tensor) -> bool:
    rows = x.numel() // max(1, x.shape[-1])
    return (_switch.on and triton is not None and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == x.dtype and rows <= MAX_ROWS and x.shape[-1] % BLOCK_K == 0
            and weight.stride(-1) == 1)


def configure(**knobs: int) -> dict[str, int]:
    """Set the projection kernels' tiles (``block_n``, ``block_k``, ``programs``: the split
    target) and launch options (``num_warps``, ``num_stages`` up to one row block) for every
    later launch, and return all five. For benchmarks, which sweep them; graphs captured
    before keep theirs."""
    unknown = [key for key in knobs if key not in LAUNCH and key not in _TILE_KNOBS]
    if unknown:  # before any change
        raise ValueError(f"gemv.configure: unknown knob {unknown[0]!r} (known: {', '.join([*_TILE_KNOBS, *LAUNCH])})")
    for key, value in knobs.items():
        if key in LAUNCH:
            LAUNCH[key] = int(value)
        else:
            globals()[_TILE_KNOBS[key]] = int(value)
    return {**{key: globals()[name] for key, name in _TILE_KNOBS.items()}, **LAUNCH}


def launch_options(rows: int) -> dict[str, int]:
    """:data:`LAUNCH` for a projection of ``rows`` rows (:data:`WIDE_STAGES` past one row block)."""
    return LAUNCH if rows <= BLOCK_M else {**LAUNCH, "num_stages": WIDE_STAGES}


def split_for(n: int, k: int) -> int:
    """Slices of the reduction: enough programs to fill the chip, each slice a whole
    number of ``BLOCK_K`` blocks (a power of two)."""
    blocks = -(-n // BLOCK_N)
    split = 1
    while blocks * split * 2 <= TARGET_PROGRAMS and k % (split * 2 * BLOCK_K) == 0:
        split *= 2
    return split


def small_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``; through the Triton kernel when
    :func:`gemv_available` (float32 accumulation, one rounding to ``x.dtype`` as cuBLAS)."""
    if not gemv_available(x, weight):
        return F.linear(x, weight, bias)
    n, k = weight.shape
    rows = x.reshape(-1, k)
    parts = torch.ops.voxline.gemv_partials(rows, weight, split_for(n, k))
    y = parts.sum(0) if parts.shape[0] > 1 else parts[0]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*x.shape[:-1], n)


if triton is not None:

    @triton.jit
    def gemv_tile(
        x_ptr, w_ptr, M, N, sxm, swn,
        K_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        PDL: tl.constexpr = False,
    ):
        """This program's float32 tile of ``x [M, K] @ w[N, K].T`` over its K slice (program
        ids: output block, K slice, row block), with its rows, columns and their masks.
        ``PDL``: launched with the attribute (:mod:`~voxline.kernels.pdl`)."""
        pid_n = tl.program_id(0)
        pid_s = tl.program_id(1)
        pid_m = tl.program_id(2)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        row_ok = rm < M
        col_ok = rn < N
        pdl.begin(PDL)  # nothing is read or written before it
        x_base = x_ptr + rm[:, None] * sxm + pid_s * K_SPLIT
        w_base = w_ptr + rn[:, None] * swn + pid_s * K_SPLIT
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for kk in range(0, K_SPLIT, BLOCK_K):
            x = tl.load(x_base + kk + rk[None, :], mask=row_ok[:, None], other=0.0)
            w = tl.load(w_base + kk + rk[None, :], mask=col_ok[:, None], other=0.0)
            acc += tl.dot(x, tl.trans(w))
        return acc, rm, rn, row_ok, col_ok

    @triton.jit
    def _gemv_kernel(
        x_ptr, w_ptr, out_ptr, M, N, sxm, swn,
        K_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        PDL: tl.constexpr,
    ):
        acc, rm, rn, row_ok, col_ok = gemv_tile(x_ptr, w_ptr, M, N, sxm, swn, K_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K,
                                                PDL)
        out = out_ptr + (tl.program_id(1) * M + rm[:, None]) * N + rn[None, :]
        tl.store(out, acc, mask=row_ok[:, None] & col_ok[None, :])


@torch.library.custom_op("voxline::gemv_partials", mutates_args=())
def _gemv_partials(x: Tensor, weight: Tensor, split: int) -> Tensor:
    """``[split, M, N]`` float32 partial products of ``x [M, K]`` and ``weight [N, K]``
    over ``split`` equal slices of K. Opaque to ``torch.compile`` (one external call)."""
    m, k = x.shape
    n = weight.shape[0]
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, BLOCK_N), split, triton.cdiv(m, BLOCK_M))
    use_pdl = pdl.active(x)
    _gemv_kernel[grid](x, weight, out, m, n, x.stride(0), weight.stride(0),
                       K_SPLIT=k // split, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, PDL=use_pdl,
                       launch_pdl=use_pdl, **launch_options(m))
    return out


@_gemv_partials.register_fake
def _(x: Tensor, weight: Tensor, split: int) -> Tensor:
    return x.new_empty((split, x.shape[0], weight.shape[0]), dtype=torch.float32)
