"""The arithmetic of the transformer layers both model families share, as plain functions.

One home each for RMSNorm, the SwiGLU product, rotary embeddings (``rotate_half``, the
cos/sin tables, their application) and top-k/top-p filtering. The eager modules of
:mod:`voxline.engines.models.layers` (Llama and Qwen3-TTS alike) and the fixed-shape
steps of this package (:mod:`.decoder_step`, :mod:`.sampling`, :mod:`.fused`) call these,
so an eager model and its compiled or captured twin run the same operations in the same
order (bit-identical when uncompiled). They live here, below ``engines``, because the
kernels cannot import model code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "apply_rope", "freq_tables", "rms_norm", "rope_tables", "rotate_half", "silu_mul", "top_k_top_p_drop",
]


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Normalise in float32 and cast back before the weight, as transformers does."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """The SwiGLU product ``silu(gate) * up`` (the MLP between its projections)."""
    return F.silu(gate) * up


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x [..., D]`` by the cos/sin tables of its positions (broadcast)."""
    return x * cos + rotate_half(x) * sin


def rope_tables(
    positions: Tensor, inv_freq: Tensor, dtype: torch.dtype, scale: float = 1.0
) -> tuple[Tensor, Tensor]:
    """``positions [B, Q]`` -> cos, sin ``[B, 1, Q, D]`` in ``dtype``, computed in float32
    (``position * inv_freq``, as the references do). ``scale`` multiplies both tables
    (static RoPE scalings); 1.0 skips the multiply (exact either way)."""
    return freq_tables(positions[..., None].float() * inv_freq, dtype, scale)


def freq_tables(freqs: Tensor, dtype: torch.dtype, scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """Rotation angles ``freqs [B, Q, D/2]`` (float32) -> cos, sin ``[B, 1, Q, D]``."""
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype)[:, None], sin.to(dtype)[:, None]


def top_k_top_p_drop(sorted_scores: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Which ranks of ``sorted_scores [B, V]`` (each row best first) top-k/top-p filtering
    drops: ranks past the row's ``top_k`` (0 or >= V: none), then those whose strictly more
    likely ranks already hold mass >= ``top_p`` (1.0: none); the best rank always stays.
    Fixed shapes and no host sync (usable under a CUDA graph)."""
    vocab = sorted_scores.shape[-1]
    rank = torch.arange(vocab, device=sorted_scores.device)[None, :]
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, torch.full_like(top_k, vocab))
    drop = rank >= k[:, None]
    probs = sorted_scores.masked_fill(drop, float("-inf")).softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass of strictly more likely ranks
    return drop | ((before >= top_p[:, None]) & (rank > 0))
