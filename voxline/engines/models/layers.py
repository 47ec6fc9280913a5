"""Layers both model families build from: RMSNorm and the SwiGLU MLP.

Parameter names match transformers' Llama and the Qwen3-TTS reference (``weight``;
``gate_proj``, ``up_proj``, ``down_proj``), so their state dicts load unchanged. The
arithmetic is :mod:`voxline.kernels.layer_ops` (one home, shared with the fixed-shape
steps of the kernels); rotary embeddings and top-k/top-p filtering are there too.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor, nn

from voxline.kernels.fused import compiled_kernels
from voxline.kernels.layer_ops import rms_norm, silu_mul

__all__ = ["MLP", "RMSNorm", "fuse_decoder_modules"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


class MLP(nn.Module):
    """The SwiGLU MLP: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        bias = bool(getattr(config, "mlp_bias", False))
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))


def fuse_decoder_modules(root: nn.Module) -> int:
    """Route every RMSNorm and SwiGLU MLP under ``root`` through the compiled kernels of
    :mod:`voxline.kernels.fused` (per-instance ``forward``); returns how many were rerouted."""
    rms, fused_silu_mul = compiled_kernels()
    n = 0
    for m in root.modules():
        if isinstance(m, RMSNorm):
            m.forward = functools.partial(rms, weight=m.weight, eps=m.eps)  # type: ignore[method-assign]
            n += 1
        elif isinstance(m, MLP):
            def mlp(x: Tensor, m: MLP = m) -> Tensor:
                return m.down_proj(fused_silu_mul(m.gate_proj(x), m.up_proj(x)))

            m.forward = mlp  # type: ignore[method-assign]
            n += 1
    return n
