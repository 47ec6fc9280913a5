"""Fused elementwise blocks for the decoder layers (``torch.compile``, GPU only).

After CUDA graphs the Qwen3-TTS step is bound by its count of tiny kernels; RMSNorm
(eight eager kernels) and the SwiGLU product (two) each become one. The eager functions
are the twins: the same operations in the same order, used on the CPU and as reference.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["fuse_decoder_modules", "rms_norm_eager", "silu_mul_eager"]


def rms_norm_eager(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def silu_mul_eager(gate: Tensor, up: Tensor) -> Tensor:
    return F.silu(gate) * up


@functools.cache
def _compiled():
    # dynamic shapes: one compile serves every batch bucket and layer.
    return (torch.compile(rms_norm_eager, dynamic=True), torch.compile(silu_mul_eager, dynamic=True))


def fuse_decoder_modules(root: nn.Module) -> int:
    """Route every RMSNorm and SwiGLU MLP under ``root`` through the compiled kernels
    (per-instance ``forward``); returns how many modules were rerouted."""
    from voxline.engines.models.llama import MLP, RMSNorm  # kernels must not import engines at load

    rms, silu_mul = _compiled()
    n = 0
    for m in root.modules():
        if isinstance(m, RMSNorm):
            m.forward = functools.partial(rms, weight=m.weight, eps=m.eps)  # type: ignore[method-assign]
            n += 1
        elif isinstance(m, MLP):
            def mlp(x: Tensor, m: MLP = m) -> Tensor:
                return m.down_proj(silu_mul(m.gate_proj(x), m.up_proj(x)))

            m.forward = mlp  # type: ignore[method-assign]
            n += 1
    return n
