"""SnakeBeta activation, ``y = x + sin(alpha * x)^2 / (beta + eps)`` per channel.

:func:`snake_beta_eager` is the reference (and the CPU path): the same operations in the
same order as the published vocoder, so it is bit-exact with it. On a CUDA tensor
:func:`snake_beta` runs one Triton kernel instead (read ``x`` once, write ``y`` once,
instead of six elementwise passes), computing in float32 and storing in the input dtype:
:func:`snake_beta_fp32` is that arithmetic in PyTorch, its twin on machines without
Triton (CI). The kernel agrees with the eager reference within 1e-5 (float32), 1e-2
(bfloat16) and 1e-3 (float16).
"""

from __future__ import annotations

import torch
from torch import Tensor

try:  # Triton ships with CUDA builds of PyTorch only; the CPU path never needs it.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installed torch build
    triton = None

__all__ = ["SNAKE_EPS", "snake_beta", "snake_beta_eager", "snake_beta_fp32", "snake_beta_log",
           "triton_available"]

SNAKE_EPS = 1e-9
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_BLOCK = 1024


def snake_beta_eager(x: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
    """``x [B, C, T]``; ``alpha``, ``beta`` ``[C]`` already exponentiated (positive)."""
    a = alpha[None, :, None]
    b = beta[None, :, None]
    return x + (1.0 / (b + SNAKE_EPS)) * torch.pow(torch.sin(x * a), 2)


def snake_beta_fp32(x: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
    """What the fused kernel computes: float32 throughout, result in ``x``'s dtype."""
    xf = x.float()
    a = alpha.float()[None, :, None]
    inv_b = 1.0 / (beta.float()[None, :, None] + SNAKE_EPS)
    s = torch.sin(xf * a)
    return (xf + inv_b * (s * s)).to(x.dtype)


def triton_available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _snake_kernel(x_ptr, y_ptr, alpha_ptr, beta_ptr, channels, length, stride_b, stride_c,
                      eps, LOG_SCALE: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)  # one (batch, channel) row per program along axis 0
        b = row // channels
        c = row % channels
        t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        keep = t < length
        x = tl.load(x_ptr + b * stride_b + c * stride_c + t, mask=keep, other=0.0).to(tl.float32)
        a = tl.load(alpha_ptr + c).to(tl.float32)
        b_ = tl.load(beta_ptr + c).to(tl.float32)
        if LOG_SCALE:
            a = tl.exp(a)
            b_ = tl.exp(b_)
        inv_b = 1.0 / (b_ + eps)
        s = tl.sin(x * a)
        y = x + inv_b * (s * s)
        tl.store(y_ptr + row * length + t, y.to(y_ptr.dtype.element_ty), mask=keep)


def _snake_triton(x: Tensor, alpha: Tensor, beta: Tensor, log_scale: bool) -> Tensor:
    if x.stride(-1) != 1:
        x = x.contiguous()
    bsz, channels, length = x.shape
    y = torch.empty((bsz, channels, length), dtype=x.dtype, device=x.device)
    if y.numel():
        grid = (bsz * channels, triton.cdiv(length, _BLOCK))
        _snake_kernel[grid](x, y, alpha.contiguous(), beta.contiguous(), channels, length,
                            x.stride(0), x.stride(1), SNAKE_EPS, LOG_SCALE=log_scale, BLOCK=_BLOCK)
    return y


def snake_beta(x: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
    """SnakeBeta over channels of ``x [B, C, T]``: the fused kernel on CUDA (float32,
    bfloat16, float16 inputs, when Triton is installed), else the eager reference."""
    if _fused(x):
        return _snake_triton(x, alpha, beta, log_scale=False)
    return snake_beta_eager(x, alpha, beta)


def snake_beta_log(x: Tensor, log_alpha: Tensor, log_beta: Tensor) -> Tensor:
    """:func:`snake_beta` with log-scale parameters (as the vocoder stores them): on CUDA
    the kernel exponentiates them itself, saving two launches per activation."""
    if _fused(x):
        return _snake_triton(x, log_alpha, log_beta, log_scale=True)
    return snake_beta_eager(x, torch.exp(log_alpha), torch.exp(log_beta))


def _fused(x: Tensor) -> bool:
    # Under torch.compile the eager formula is traced instead: Inductor fuses it itself,
    # together with its neighbours.
    return (triton is not None and x.is_cuda and x.dim() == 3 and x.dtype in _DTYPES
            and not torch.compiler.is_compiling())
