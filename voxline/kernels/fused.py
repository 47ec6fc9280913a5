"""Fused elementwise blocks for the decoder layers (``torch.compile``, GPU only).

After CUDA graphs the Qwen3-TTS step is bound by its count of tiny kernels; RMSNorm
(eight eager kernels) and the SwiGLU product (two) each become one. The eager functions
are the twins: the same operations in the same order, used on the CPU and as reference.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["compiled_kernels", "rms_norm_eager", "silu_mul_eager"]


def rms_norm_eager(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def silu_mul_eager(gate: Tensor, up: Tensor) -> Tensor:
    return F.silu(gate) * up


@functools.cache
def compiled_kernels() -> tuple:
    """(rms_norm, silu_mul) compiled once; dynamic shapes serve every batch bucket and layer."""
    return (torch.compile(rms_norm_eager, dynamic=True), torch.compile(silu_mul_eager, dynamic=True))
