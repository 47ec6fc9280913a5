"""The pure tensor functions :class:`~.graphed_talker.GraphedTalkerGenerator` compiles per bucket.

Each is a function of tensors and constants only (weights are arguments, see
:mod:`voxline.kernels.decoder_step`), so one compiled specialisation serves every layer
of a shape and a step captures them whole: a talker decode layer over a gathered cache,
a code-predictor sub-step (every layer plus the head), the sub-step's head alone.
Uncompiled they are the eager twins.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from voxline.engines.models.layers import RMSNorm
from voxline.kernels.decode_attention import attend_decode
from voxline.kernels.decoder_step import attn_mlp, attn_out_mlp, attn_prep, concat_weights
from voxline.kernels.gemv import small_linear
from voxline.kernels.layer_ops import rms_norm
from voxline.kernels.qkv_attention import fused_available, qkv_attention
from voxline.kernels.sampling import sample_rows

from .layers import DecoderLayer

__all__ = ["gathered_attn_mlp", "layer_args", "predictor_head", "predictor_substep"]


def _bias(m: nn.Module) -> Tensor | None:
    return m.bias  # type: ignore[return-value]


def layer_args(layer: DecoderLayer) -> tuple[tuple, tuple]:
    """A decoder layer's tensors and constants in :func:`attn_prep` / :func:`attn_mlp` order
    (Q/K/V and gate/up weights concatenated once: a copy of those weights)."""
    a, mlp = layer.self_attn, layer.mlp
    qn = a.q_norm.weight if isinstance(a.q_norm, RMSNorm) else None
    kn = a.k_norm.weight if isinstance(a.k_norm, RMSNorm) else None
    qk_eps = a.q_norm.eps if isinstance(a.q_norm, RMSNorm) else 0.0
    prep = (layer.input_layernorm.weight, layer.input_layernorm.eps,
            *concat_weights(a.q_proj, a.k_proj, a.v_proj),
            a.q_proj.out_features, a.k_proj.out_features, qn, kn, qk_eps, a.head_dim)
    post = (a.o_proj.weight, _bias(a.o_proj),
            layer.post_attention_layernorm.weight, layer.post_attention_layernorm.eps,
            *concat_weights(mlp.gate_proj, mlp.up_proj), mlp.down_proj.weight, _bias(mlp.down_proj))
    return prep, post


def gathered_attn_mlp(
    x: Tensor, q: Tensor, ck: Tensor, cv: Tensor, slot: Tensor, length: int, mask: Tensor,
    post_w: tuple, attention,
) -> Tensor:
    """:func:`attn_mlp` over the rows ``slot`` of a whole cache ``[S, Hkv, L, D]``, first
    ``length`` positions: the gather happens inside the compiled region (fused into the
    attention's reads) instead of as a copy before it."""
    if attention is attend_decode:
        out = attend_decode(q, ck, cv, mask, slot=slot, length=length)
        return attn_out_mlp(x, out, *post_w)
    keys = ck[:, :, :length].index_select(0, slot)
    values = cv[:, :, :length].index_select(0, slot)
    return attn_mlp(x, q, keys, values, mask, *post_w, attention=attention)


def predictor_substep(
    x: Tensor, pos: Tensor, q_idx: Tensor, inv_freq: Tensor, keys: list[Tensor], values: list[Tensor],
    masks: list[Tensor], layers: list[tuple[tuple, tuple]], head: tuple, attention,
) -> tuple[Tensor, Tensor, Tensor, list[Tensor], list[Tensor]]:
    """One code-predictor sub-step as one function (one compiled region on a GPU): every
    layer with its key/value write (out of place: the per-frame buffers are tiny), then
    :func:`predictor_head`. Returns the pick, its embedding, the next input, and the
    updated keys and values.

    On CUDA in bf16/fp16 a layer's attention block (after the QKV projection, up to the
    output projection) is one kernel instead (:func:`~voxline.kernels.qkv_attention.qkv_attention`,
    when :func:`~voxline.kernels.qkv_attention.fused_available`): it writes the keys and
    values into the given buffers in place, and those same buffers are returned."""
    h = x
    new_k: list[Tensor] = []
    new_v: list[Tensor] = []
    for (prep_w, post_w), k_buf, v_buf, mask in zip(layers, keys, values, masks, strict=True):
        if fused_available(h, pos, k_buf, v_buf, mask, *prep_w):
            out = qkv_attention(h, pos, inv_freq, k_buf, v_buf, mask, *prep_w)
            new_k.append(k_buf)
            new_v.append(v_buf)
            b, q_len, _ = out.shape
            heads = out.view(b, q_len, -1, prep_w[-1]).transpose(1, 2)  # [B, Hq, Q, D], no copy
            h = attn_out_mlp(h, heads, *post_w)
            continue
        q, k, v = attn_prep(h, pos, inv_freq, *prep_w)
        k_buf = k_buf.index_copy(2, q_idx, k)
        v_buf = v_buf.index_copy(2, q_idx, v)
        new_k.append(k_buf)
        new_v.append(v_buf)
        h = attn_mlp(h, q, k_buf, v_buf, mask, *post_w, attention=attention)
    code, emb, x = predictor_head(h[:, -1], *head)
    return code, emb, x, new_k, new_v


def predictor_head(
    h: Tensor, norm_w: Tensor, eps: float, lm_w: Tensor, table: Tensor,
    next_table: Tensor,
    temperature: Tensor, top_k: Tensor, top_p: Tensor, seed: Tensor, counter: Tensor,
    max_top_k: int = 0,
) -> tuple[Tensor, Tensor, Tensor]:
    """One predictor sub-step's tail: final norm, codebook head, sampling, and the pick's
    embedding (talker width) and next input (predictor width, ``[B, 1, D]``, a row of
    ``next_table``: the codebook's table through the predictor's input projection)."""
    logits = small_linear(rms_norm(h, norm_w, eps), lm_w).float()
    code = sample_rows(logits, temperature, top_k, top_p, seed, counter, max_top_k)
    emb = F.embedding(code, table)
    x = F.embedding(code, next_table)
    return code, emb, x[:, None]
