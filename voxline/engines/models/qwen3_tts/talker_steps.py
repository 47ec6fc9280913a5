"""The pure tensor functions :class:`~.graphed_talker.GraphedTalkerGenerator` compiles per bucket.

Each is a function of tensors and constants only (weights are arguments, see
:mod:`voxline.kernels.decoder_step`), so one compiled specialisation serves every layer
of a shape and a step captures them whole: a talker decode layer over a gathered cache,
a code-predictor sub-step (every layer plus the head), the sub-step's head alone.
Uncompiled they are the eager twins.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voxline.engines.models.layers import RMSNorm
from voxline.kernels import prologue_gemv
from voxline.kernels.decode_attention import attend_decode
from voxline.kernels.decoder_step import attn_mlp, attn_out_mlp, attn_prep, concat_weights
from voxline.kernels.gemv import small_linear, split_for
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
    values into the given buffers in place, and those same buffers are returned. Where
    :func:`~voxline.kernels.prologue_gemv.layer_available` holds too (few rows), the
    layer's SwiGLU product runs in the down projection's prologue and, with the norm
    prologues on, its norms and residual adds in its projections' (:func:`_prologue_layer`:
    five launches a layer), the last residual add and the final norm in the codebook
    head's. Only when compiled (the served path), so the uncompiled eager twin stays the
    unfused reference; the module is off by default (slower on an H200 in round 6)."""
    h = x
    pending: Tensor | None = None  # float32 partials of the last down projection, not yet added to h
    new_k: list[Tensor] = []
    new_v: list[Tensor] = []
    for (prep_w, post_w), k_buf, v_buf, mask in zip(layers, keys, values, masks, strict=True):
        if torch.compiler.is_compiling() and fused_available(h, pos, k_buf, v_buf, mask, *prep_w) \
                and prologue_gemv.layer_available(h, pending, prep_w, post_w):
            h, pending = _prologue_layer(h, pending, pos, inv_freq, k_buf, v_buf, mask, prep_w, post_w,
                                         norm=prologue_gemv.norm_enabled())
            new_k.append(k_buf)
            new_v.append(v_buf)
            continue
        h, pending = _add_pending(h, pending), None  # (fused into the next norm by the compiler)
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
    norm_w, eps, lm_w = head[:3]
    if pending is not None and h.shape[1] == 1 and prologue_gemv.norm_enabled() \
            and prologue_gemv.norm_available(h[:, -1], pending, norm_w, lm_w):
        # The last residual add and the final norm in the codebook head's prologue.
        parts, _ = prologue_gemv.norm_linear(h[:, -1], pending, norm_w, eps, lm_w)
        code, emb, x = _sample_embed(parts.sum(0).to(h.dtype).float(), *head[3:])
    else:
        code, emb, x = predictor_head(_add_pending(h, pending)[:, -1], *head)
    return code, emb, x, new_k, new_v


def _add_pending(h: Tensor, pending: Tensor | None) -> Tensor:
    """The deferred residual add of a down projection's partials (as ``small_linear``'s
    caller: summed in float32, rounded, then added)."""
    return h if pending is None else h + pending.sum(0).to(h.dtype).view(h.shape)


def _prologue_layer(
    h: Tensor, pending: Tensor | None, pos: Tensor, inv_freq: Tensor, k_buf: Tensor, v_buf: Tensor,
    mask: Tensor, prep_w: tuple, post_w: tuple, norm: bool = True,
) -> tuple[Tensor, Tensor]:
    """One predictor layer with ``norm`` in five launches (:mod:`voxline.kernels.prologue_gemv`): QKV
    projection of ``rms_norm(h + pending)``, the attention block (keys/values written in
    place), output projection, gate/up projection of ``rms_norm(residual + output)``, down
    projection of ``silu(gate) * up``. Returns the residual and the down projection's
    partials, whose add the next layer's (or the head's) prologue does. ``norm`` False:
    only the SwiGLU prologue (``pending`` added first, the rest as :func:`attn_out_mlp`)."""
    ln_w, eps, qkv_w = prep_w[:3]
    o_w, _, post_ln_w, post_eps, gu_w, _, down_w, _ = post_w
    if not norm:
        h = _add_pending(h, pending)  # (fused into the QKV norm by the compiler)
        out = qkv_attention(h, pos, inv_freq, k_buf, v_buf, mask, *prep_w)
        h = h + small_linear(out, o_w)
        hn = rms_norm(h, post_ln_w, post_eps).reshape(-1, h.shape[-1])
        gu_parts = torch.ops.voxline.gemv_partials(hn, gu_w, split_for(gu_w.shape[0], gu_w.shape[1]))
        return h, prologue_gemv.swiglu_linear(gu_parts, down_w)
    qkv_parts, h = prologue_gemv.norm_linear(h, pending, ln_w, eps, qkv_w)
    out = qkv_attention(h, pos, inv_freq, k_buf, v_buf, mask, *prep_w, parts=qkv_parts)
    out = out.view(-1, out.shape[-1])
    o_parts = torch.ops.voxline.gemv_partials(out, o_w, split_for(o_w.shape[0], o_w.shape[1]))
    gu_parts, h = prologue_gemv.norm_linear(h, o_parts, post_ln_w, post_eps, gu_w)
    return h, prologue_gemv.swiglu_linear(gu_parts, down_w)


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
    return _sample_embed(logits, table, next_table, temperature, top_k, top_p, seed, counter, max_top_k)


def _sample_embed(
    logits: Tensor, table: Tensor, next_table: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor,
    seed: Tensor, counter: Tensor, max_top_k: int = 0,
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`predictor_head` after its logits."""
    code = sample_rows(logits, temperature, top_k, top_p, seed, counter, max_top_k)
    emb = F.embedding(code, table)
    x = F.embedding(code, next_table)
    return code, emb, x[:, None]
