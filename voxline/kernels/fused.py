"""Fused elementwise blocks for the decoder layers (``torch.compile``, GPU only).

After CUDA graphs the Qwen3-TTS step is bound by its count of tiny kernels; RMSNorm
(eight eager kernels) and the SwiGLU product (two) each become one. The eager functions
of :mod:`.layer_ops` are the twins: the same operations in the same order, used on the
CPU and as reference.
"""

from __future__ import annotations

import functools

import torch

from .layer_ops import rms_norm, silu_mul

__all__ = ["compiled_kernels"]


@functools.cache
def compiled_kernels() -> tuple:
    """(rms_norm, silu_mul) compiled once; dynamic shapes serve every batch bucket and layer."""
    return (torch.compile(rms_norm, dynamic=True), torch.compile(silu_mul, dynamic=True))
