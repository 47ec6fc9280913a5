"""The ``k`` best entries of each row, sorted, as one Triton program per row.

The code predictor samples each of its 15 codebooks from the 64 best of 2048 logits.
``torch.topk`` does that at one row as two kernels (a radix select, then a sort of the
selected), ~18 us together on an H200, 0.28 ms of a batch-1 frame (round 8's profile):
latency, not work. :func:`topk_rows` ranks a row inside one program instead: each entry
becomes one 64-bit key, its float32 value mapped to an order-preserving integer in the
high half and its inverted index in the low half, and Triton's bitonic top-k
(``tl.topk``) sorts the keys; values and indices are unpacked from the winners. Equal
values rank lower index first (``torch.topk`` leaves that order unspecified); NaN is
not ranked meaningfully (logits never hold one).

It serves float32 rows on CUDA whose length and ``k`` are powers of two
(:func:`topk_available`); anything else is ``torch.topk``, the reference it is tested
against.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import pdl
from .switch import KernelSwitch

try:  # Triton ships with CUDA builds of PyTorch only.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installed torch build
    triton = None

__all__ = ["set_enabled", "topk_available", "topk_rows"]

_MAX_LEN = 8192  # keys per program: 64 KB of registers at most
_switch = KernelSwitch()
set_enabled = _switch.set  # benchmarks A/B the kernel


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def topk_available(x: Tensor, k: int) -> bool:
    n = x.shape[-1]
    return (_switch.on and triton is not None and x.is_cuda and x.dtype == torch.float32 and x.dim() == 2
            and _pow2(n) and _pow2(k) and k <= n <= _MAX_LEN)


def topk_rows(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``x.topk(k, dim=-1)`` of ``x [B, N]``: values ``[B, k]`` (descending) and int64 indices."""
    if not topk_available(x, k):
        return x.topk(k, dim=-1)
    return torch.ops.voxline.topk_rows(x, k)


if triton is not None:

    @triton.jit
    def _topk_kernel(x_ptr, v_ptr, i_ptr, sx, N: tl.constexpr, K: tl.constexpr, PDL: tl.constexpr):
        pdl.begin(PDL)  # nothing is read or written before it
        row = tl.program_id(0)
        idx = tl.arange(0, N)
        bits = tl.load(x_ptr + row * sx + idx).to(tl.int32, bitcast=True)
        # Negative floats order backwards as integers: flip their magnitude bits.
        ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
        key = (ordered.to(tl.int64) << 32) | (N - 1 - idx).to(tl.int64)
        best = tl.topk(key, K)
        ordered = (best >> 32).to(tl.int32)
        value = (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
        out = tl.arange(0, K)
        tl.store(v_ptr + row * K + out, value)
        tl.store(i_ptr + row * K + out, N - 1 - (best & 0xFFFFFFFF))


@torch.library.custom_op("voxline::topk_rows", mutates_args=())
def _topk_rows(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    b, n = x.shape
    values = torch.empty((b, k), dtype=x.dtype, device=x.device)
    indices = torch.empty((b, k), dtype=torch.int64, device=x.device)
    if x.stride(-1) != 1:
        x = x.contiguous()
    use_pdl = pdl.active(x)
    _topk_kernel[(b,)](x, values, indices, x.stride(0), N=n, K=k, PDL=use_pdl, num_warps=4 if n <= 2048 else 8,
                       launch_pdl=use_pdl)
    return values, indices


@_topk_rows.register_fake
def _(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    b = x.shape[0]
    return x.new_empty((b, k)), x.new_empty((b, k), dtype=torch.int64)
