"""Qwen3 decoder blocks shared by the talker and the code predictor.

Parameter names match the reference (``self_attn.{q,k,v,o}_proj``, ``q_norm``,
``k_norm``, ``mlp.{gate,up,down}_proj``, ``input_layernorm``,
``post_attention_layernorm``). Attention takes its keys/values from the caller, so the
same layer serves the slot cache of the talker and the short per-frame cache of the
code predictor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from voxline.engines.models.layers import MLP, RMSNorm
from voxline.kernels.attention import attend
from voxline.kernels.layer_ops import apply_rope, freq_tables

from .config import RopeConfig, TransformerConfig

__all__ = ["Attention", "DecoderLayer", "KVHook", "Rope"]

# (layer index, new k [B, Hkv, Q, D], new v) -> (all k, all v) the queries attend over.
KVHook = Callable[[int, Tensor, Tensor], tuple[Tensor, Tensor]]


class Rope:
    """cos/sin tables for absolute positions; multimodal (3-stream) when configured.

    Computed in float32 exactly as the reference does (``position * inv_freq``), so the
    tables are bit-identical to it. With identical positions in all three streams (all
    TTS inputs are text/codec tokens) M-RoPE equals 1-D RoPE.
    """

    def __init__(self, rope: RopeConfig) -> None:
        dim = rope.head_dim
        # Explicit CPU: models are built under torch.device("meta") before loading.
        exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
        self.inv_freq = 1.0 / (rope.theta**exponents)
        self.section = rope.mrope_section
        self.interleaved = rope.mrope_interleaved

    def __call__(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``positions [B, Q]`` (or ``[3, B, Q]``) -> cos, sin ``[B, 1, Q, D]``."""
        inv_freq = self.inv_freq.to(positions.device)
        if self.section is not None and positions.dim() == 2:
            positions = positions[None].expand(3, *positions.shape)
        freqs = positions[..., None].float() * inv_freq  # [(3,) B, Q, D/2]
        if self.section is not None:
            freqs = self._select_streams(freqs)
        return freq_tables(freqs, dtype)

    def _select_streams(self, freqs: Tensor) -> Tensor:
        """Pick, per frequency, the position stream (temporal/height/width) it rotates by."""
        section = list(self.section)
        if self.interleaved:
            out = freqs[0].clone()
            n = len(section)
            for i, size in enumerate(section[1:], 1):
                out[..., i : size * n : n] = freqs[i][..., i : size * n : n]
            return out
        chunks = freqs.split(section, dim=-1)
        return torch.cat([c[i % 3] for i, c in enumerate(chunks)], dim=-1)


class Attention(nn.Module):
    """GQA self-attention with RoPE; per-head RMSNorm on q and k (Qwen3) unless
    ``qk_norm=False`` (the codec decoder's transformer)."""

    def __init__(self, config: TransformerConfig | Any, layer_idx: int, *, qk_norm: bool = True) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        bias = config.attention_bias
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.q_norm: nn.Module = RMSNorm(self.head_dim, config.rms_norm_eps) if qk_norm else nn.Identity()
        self.k_norm: nn.Module = RMSNorm(self.head_dim, config.rms_norm_eps) if qk_norm else nn.Identity()

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, kv: KVHook
    ) -> Tensor:
        b, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, q_len, -1, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, q_len, -1, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, q_len, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = kv(self.layer_idx, k, v)
        out = attend(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


class DecoderLayer(nn.Module):
    def __init__(self, config: TransformerConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, kv: KVHook) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, kv)
        return x + self.mlp(self.post_attention_layernorm(x))
