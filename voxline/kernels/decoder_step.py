"""One Qwen3 decoder layer as two pure functions over tensors, for static-shape compile.

The layer is split where the caller touches its key/value store: :func:`attn_prep`
(input RMSNorm, Q/K/V projections, per-head q/k RMSNorm, RoPE) and :func:`attn_mlp`
(attention over the keys/values the caller gathered, output projection, residual,
post-attention RMSNorm, SwiGLU MLP, residual). Cache writes stay outside the compiled
regions, so the compiler never sees an in-place update of a multi-megabyte cache (which
it would functionalise into a copy of the whole buffer). Weights are arguments, not
module attributes, so one compiled specialisation serves every layer of the same shape.
Q/K/V and gate/up take one concatenated weight each (:func:`concat_weights`): one matmul
instead of three (two), which at decode batch sizes is launch count, not arithmetic.

The operations and their order are those of the eager modules (``RMSNorm``,
``Attention``, ``MLP`` of ``voxline.engines.models``; both call :mod:`.layer_ops`), so
uncompiled these functions are bit-identical to them: the eager twin. The projections go through
:func:`~voxline.kernels.gemv.small_linear`, which is ``F.linear`` except for a few
bf16/fp16 rows on CUDA (decode steps), where one Triton launch reads the weight once
(equal within bf16 rounding, not bit-identical).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .attention import attend
from .fused_linear import fused_available, linear_residual
from .gemv import small_linear
from .layer_ops import apply_rope, rms_norm, rope_tables, silu_mul

__all__ = ["attn_mlp", "attn_out_mlp", "attn_prep", "concat_weights"]


def concat_weights(*linears: torch.nn.Linear) -> tuple[Tensor, Tensor | None]:
    """Weights (and biases, if any) of linears over the same input, stacked on outputs."""
    weight = torch.cat([m.weight.detach() for m in linears])
    if any(m.bias is None for m in linears):
        return weight, None
    return weight, torch.cat([m.bias.detach() for m in linears])  # type: ignore[union-attr]


def attn_prep(
    x: Tensor, pos: Tensor, inv_freq: Tensor,
    ln_w: Tensor, eps: float, qkv_w: Tensor, qkv_b: Tensor | None, q_out: int, kv_out: int,
    qn_w: Tensor | None, kn_w: Tensor | None, qk_eps: float, head_dim: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """``x [B, Q, hidden]`` at positions ``pos [B, Q]`` -> q ``[B, Hq, Q, D]``, k, v ``[B, Hkv, Q, D]``.

    ``qkv_w``: q, k, v projection weights stacked (``q_out + 2 * kv_out`` rows);
    ``qn_w``/``kn_w`` None: no per-head norm."""
    b, q_len, _ = x.shape
    h = rms_norm(x, ln_w, eps)
    q, k, v = small_linear(h, qkv_w, qkv_b).split((q_out, kv_out, kv_out), dim=-1)
    q = q.reshape(b, q_len, -1, head_dim)
    k = k.reshape(b, q_len, -1, head_dim)
    if qn_w is not None:
        q = rms_norm(q, qn_w, qk_eps)
    if kn_w is not None:
        k = rms_norm(k, kn_w, qk_eps)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = v.reshape(b, q_len, -1, head_dim).transpose(1, 2)
    # 1-D RoPE: equal to M-RoPE when all three position streams agree (text and codec tokens).
    cos, sin = rope_tables(pos, inv_freq, x.dtype)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    return q, k, v


def attn_mlp(
    x: Tensor, q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None,
    o_w: Tensor, o_b: Tensor | None, ln_w: Tensor, eps: float,
    gate_up_w: Tensor, gate_up_b: Tensor | None, down_w: Tensor, down_b: Tensor | None,
    attention: Callable[..., Tensor] = attend,
) -> Tensor:
    """Residual stream ``x [B, Q, hidden]`` after attention of ``q`` over ``keys``/``values``
    (boolean ``mask [B|1, 1, Q, K]``) and the SwiGLU MLP (``gate_up_w``: gate and up
    projection weights stacked). ``attention``: :func:`~voxline.kernels.attention.attend`
    or one of its spelled-out equals for decode shapes."""
    out = attention(q, keys, values, mask)
    return attn_out_mlp(x, out, o_w, o_b, ln_w, eps, gate_up_w, gate_up_b, down_w, down_b)


def attn_out_mlp(
    x: Tensor, out: Tensor, o_w: Tensor, o_b: Tensor | None, ln_w: Tensor, eps: float,
    gate_up_w: Tensor, gate_up_b: Tensor | None, down_w: Tensor, down_b: Tensor | None,
) -> Tensor:
    """The rest of :func:`attn_mlp` given the attention output ``out [B, Hq, Q, D]``.

    At decode rows on CUDA the output and down projections add their own split-K partials
    and the residual (:func:`~voxline.kernels.fused_linear.linear_residual`: one launch each)."""
    b, _, q_len, _ = out.shape
    x = _add_linear(x, out.transpose(1, 2).reshape(b, q_len, -1), o_w, o_b)
    h = rms_norm(x, ln_w, eps)
    gate, up = small_linear(h, gate_up_w, gate_up_b).chunk(2, dim=-1)
    return _add_linear(x, silu_mul(gate, up), down_w, down_b)


def _add_linear(resid: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``resid + small_linear(x, weight, bias)``: one launch where the fused kernel serves."""
    if fused_available(x, weight, resid):
        return linear_residual(x, weight, bias, resid)
    return resid + small_linear(x, weight, bias)
