"""The talker decode layer's attention block, one kernel over the slot cache.

In the talker's captured decode step on an H200 the work between a layer's QKV
projection and its output projection (the partials' sum and per-head q/k RMSNorm with
RoPE, two kernels; the key/value writes ``cache[slot, :, pos] = k`` as two ``index_put``
launches plus their index arithmetic; the decode attention) took about nine kernels per
layer, ~250 of the step's ~525 (round 4's profile). :func:`qkv_decode_attention` is one
Triton launch instead: a program per (batch row, key/value head) sums that head's slices
of the projection's float32 partials, normalises and rotates its key and its group of
query heads, writes the new key and value into the row's cache slot at its positions (in
place), and attends over the slot's first ``length`` positions under the boolean mask
in blocks of :data:`BLOCK_K` with a streaming softmax, as
:func:`~voxline.kernels.decode_attention.attend_decode` does. Unlike the code predictor's
:func:`~voxline.kernels.qkv_attention.qkv_attention` (its whole 16-position buffer in
registers) the cache may be long: only one block of keys is live at a time.

The arithmetic follows the unfused path it replaces (:func:`~voxline.kernels.decoder_step.attn_prep`
as compiled, the cache write, ``attend_decode``): projection rounded to the activation
dtype, RMSNorm in float32 rounded before and after its weight, cos/sin rounded as
:func:`~voxline.kernels.layer_ops.rope_tables`, q and k in the activation dtype into the
tensor-core products, float32 scores and softmax, probabilities rounded before the value
product. So it equals that path within bf16 rounding, not bit-identically. It serves
bfloat16/float16 on CUDA when :func:`decode_fused_available` holds; callers keep the
unfused functions otherwise (CPU, float32, more than 16 query rows per key/value head).
:func:`set_enabled` switches it off process-wide (A/B).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import pdl
from .attention import attend
from .gemv import gemv_available, split_for
from .layer_ops import rms_norm
from .qkv_attention import _pow2, projected_qkv
from .switch import KernelSwitch

try:  # Triton ships with CUDA builds of PyTorch only.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installed torch build
    triton = None

__all__ = ["BLOCK_K", "decode_fused_available", "qkv_decode_attention", "qkv_partials", "serves", "set_enabled"]

BLOCK_K = 64  # keys per block of the streaming softmax (as attend_decode)
_ROWS = 16  # query rows per program, padded for the tensor cores
_switch = KernelSwitch()
set_enabled = _switch.set  # benchmarks A/B the kernel


def decode_fused_available(
    x: Tensor, pos: Tensor, slot: Tensor, k_cache: Tensor, v_cache: Tensor, length: int,
    mask: Tensor | None, ln_w: Tensor, eps: float, qkv_w: Tensor, qkv_b: Tensor | None,
    q_out: int, kv_out: int, qn_w: Tensor | None, kn_w: Tensor | None, qk_eps: float, head_dim: int,
) -> bool:
    """Whether :func:`qkv_decode_attention` serves these arguments: those of
    :func:`~voxline.kernels.decoder_step.attn_prep` (``x [B, Q, hidden]``, ``pos [B, Q]``),
    the cache rows ``slot [B]`` of ``k_cache``/``v_cache [S, Hkv, L, D]``, attended over
    their first ``length <= L`` positions under the boolean ``mask [B|1, 1, Q, length]``."""
    if not (_switch.on and triton is not None and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)):
        return False
    return gemv_available(x, qkv_w) and serves(x, pos, slot, k_cache, v_cache, length, mask, qkv_w,
                                               q_out, kv_out, head_dim)


def serves(
    x: Tensor, pos: Tensor, slot: Tensor, k_cache: Tensor, v_cache: Tensor, length: int,
    mask: Tensor | None, qkv_w: Tensor, q_out: int, kv_out: int, head_dim: int,
) -> bool:
    """The shape part of :func:`decode_fused_available`, whatever the device: what the
    kernel's layout assumes (tested on the CPU)."""
    if mask is None or mask.dtype != torch.bool or x.dim() != 3:
        return False
    b, q_len, _ = x.shape
    if head_dim not in (64, 128, 256) or q_out % head_dim or kv_out % head_dim:
        return False
    hq, hkv = q_out // head_dim, kv_out // head_dim
    if hq % hkv or hq // hkv * q_len > _ROWS or qkv_w.shape[0] != q_out + 2 * kv_out:
        return False
    if k_cache.dim() != 4 or not 0 < length <= k_cache.shape[2]:
        return False
    for buf in (k_cache, v_cache):
        if tuple(buf.shape) != (k_cache.shape[0], hkv, k_cache.shape[2], head_dim) \
                or buf.dtype != x.dtype or buf.stride(-1) != 1 or buf.device != x.device:
            return False
    if tuple(pos.shape) != (b, q_len) or tuple(slot.shape) != (b,) or slot.dtype not in (torch.int32, torch.int64):
        return False
    return mask.dim() == 4 and tuple(mask.shape[1:]) == (1, q_len, length) and mask.shape[0] in (1, b)


def qkv_partials(x: Tensor, ln_w: Tensor, eps: float, qkv_w: Tensor) -> Tensor:
    """The input RMSNorm and the QKV projection of ``x [B, Q, hidden]`` as float32 split-K
    partials ``[split, B*Q, N]`` (:func:`~voxline.kernels.gemv.small_linear`'s), the
    kernel's input. Callers compile this (the norm is one fused kernel there)."""
    hidden = x.shape[-1]
    h = rms_norm(x, ln_w, eps).reshape(-1, hidden)
    return torch.ops.voxline.gemv_partials(h, qkv_w, split_for(qkv_w.shape[0], hidden))


def qkv_decode_attention(
    parts: Tensor, pos: Tensor, slot: Tensor, inv_freq: Tensor, k_cache: Tensor, v_cache: Tensor,
    length: int, mask: Tensor, qkv_b: Tensor | None, q_out: int, qn_w: Tensor | None,
    kn_w: Tensor | None, qk_eps: float, head_dim: int,
) -> Tensor:
    """The rest of :func:`~voxline.kernels.decoder_step.attn_prep` after
    :func:`qkv_partials`, the new keys/values written into ``k_cache``/``v_cache`` at
    ``[slot, :, pos]`` (in place), and attention of the queries over the rows' first
    ``length`` positions under ``mask``: returns ``[B, Hq, Q, D]`` (a view of the output
    projection's input ``[B, Q, Hq * D]``, as :func:`~voxline.kernels.decoder_step.attn_out_mlp`
    takes it). Only where :func:`decode_fused_available` holds."""
    b, q_len = pos.shape
    out = torch.ops.voxline.qkv_rope_decode_attention(
        parts, qkv_b, pos, slot, inv_freq, qn_w, kn_w, k_cache, v_cache, mask, length,
        q_out // head_dim, qk_eps, head_dim ** -0.5)
    return out.view(b, q_len, q_out // head_dim, head_dim).transpose(1, 2)


if triton is not None:
    from .decode_attention import stream_attend
    from .qkv_attention import _TL_DTYPES, _new_kv, _norm_rope, _projected, _tables

    @triton.jit
    def _qkv_decode_kernel(
        parts_ptr, bias_ptr, pos_ptr, slot_ptr, freq_ptr, qn_ptr, kn_ptr, k_ptr, v_ptr, m_ptr, o_ptr,
        M, N, spb, spq, skb, skh, skl, svb, svh, svl, smb, smq, sml, eps, scale,
        SPLIT: tl.constexpr, Q_LEN: tl.constexpr, QP: tl.constexpr, GROUP: tl.constexpr,
        ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, LENGTH: tl.constexpr, BLOCK: tl.constexpr,
        HAS_BIAS: tl.constexpr, HAS_QN: tl.constexpr, HAS_KN: tl.constexpr, DT: tl.constexpr,
        PDL: tl.constexpr,
    ):
        pdl.begin(PDL)  # nothing is read or written before it
        b = tl.program_id(0)
        hkv = tl.program_id(1)
        n_kv = tl.num_programs(1)
        HALF: tl.constexpr = HEAD_DIM // 2
        d = tl.arange(0, HEAD_DIM)
        d_rot = (d + HALF) % HEAD_DIM  # rotate_half: -x[d + D/2] below D/2, x[d - D/2] above
        sign = tl.where(d < HALF, -1.0, 1.0)
        freq = tl.load(freq_ptr + d % HALF)
        MN = M * N
        q_cols = n_kv * GROUP * HEAD_DIM
        k_col = q_cols + hkv * HEAD_DIM
        v_col = q_cols + n_kv * HEAD_DIM + hkv * HEAD_DIM
        slot = tl.load(slot_ptr + b).to(tl.int64)  # int64: slot * stride can pass 2**31
        k_base = k_ptr + slot * skb + hkv * skh
        v_base = v_ptr + slot * svb + hkv * svh

        # This row's new key and value at each of its query positions, into its slot.
        k, v, t_pos, ok = _new_kv(parts_ptr, bias_ptr, pos_ptr, kn_ptr, b, spb, spq, k_col, v_col, d, d_rot,
                                  sign, freq, MN, N, eps, SPLIT, Q_LEN, QP, HEAD_DIM, HAS_BIAS, HAS_KN, DT)
        tl.store(k_base + t_pos[:, None] * skl + d[None, :], k, mask=ok)
        tl.store(v_base + t_pos[:, None] * svl + d[None, :], v, mask=ok)
        # The attention below reads those positions back through other threads of this
        # program: a block barrier makes its global writes visible to them. (Taking the new
        # rows from registers instead, with no barrier, made the kernel 8.5 -> 18.5 us.)
        tl.debug_barrier()

        # Query rows r: head hkv * GROUP + r // Q_LEN at query position r % Q_LEN.
        r = tl.arange(0, ROWS)
        real = r < GROUP * Q_LEN
        qi = r % Q_LEN
        r_pos = tl.load(pos_ptr + b * spb + qi * spq, mask=real, other=0)
        q_row = (b * Q_LEN + qi)[:, None] + d[None, :] * 0
        q_col = ((hkv * GROUP + r // Q_LEN) * HEAD_DIM)[:, None]
        q_ok = real[:, None] & (d[None, :] < HEAD_DIM)
        cos, sin = _tables(r_pos, freq, DT)
        q = _norm_rope(_projected(parts_ptr, bias_ptr, q_row, q_col + d[None, :], q_ok, MN, N, SPLIT, HAS_BIAS),
                       _projected(parts_ptr, bias_ptr, q_row, q_col + d_rot[None, :], q_ok, MN, N, SPLIT, HAS_BIAS),
                       qn_ptr, d, d_rot, sign, cos, sin, eps, HEAD_DIM, HAS_QN, DT)

        out = stream_attend(q, k_base, skl, v_base, svl, m_ptr + b * smb, smq, sml, qi, real, d, scale,
                            LENGTH, ROWS, HEAD_DIM, BLOCK)
        tl.store(o_ptr + q_row * q_cols + q_col + d[None, :], out.to(DT), mask=q_ok)


@torch.library.custom_op("voxline::qkv_rope_decode_attention", mutates_args=("k_cache", "v_cache"))
def _qkv_rope_decode_attention(
    parts: Tensor, bias: Tensor | None, pos: Tensor, slot: Tensor, inv_freq: Tensor, qn_w: Tensor | None,
    kn_w: Tensor | None, k_cache: Tensor, v_cache: Tensor, mask: Tensor, length: int, q_heads: int,
    eps: float, scale: float,
) -> Tensor:
    """The kernel launch as an opaque operator that writes the caches in place (declared,
    so a compiled caller orders it and keeps the caches' later readers after it):
    ``parts [split, B*Q, N]`` float32 partials of the Q/K/V projection -> the attention
    output ``[B*Q, q_heads * D]``."""
    split, m, n = parts.shape
    b, q_len = pos.shape
    hkv, dim = k_cache.shape[1], k_cache.shape[3]
    parts = parts if parts.is_contiguous() else parts.contiguous()
    out = torch.empty((m, q_heads * dim), dtype=k_cache.dtype, device=k_cache.device)
    smb = mask.stride(0) if mask.shape[0] > 1 else 0
    use_pdl = pdl.active(parts)
    # Unused pointers still need a tensor: the kernel never reads them (constexpr flags).
    _qkv_decode_kernel[(b, hkv)](
        parts, parts if bias is None else bias, pos, slot, inv_freq,
        k_cache if qn_w is None else qn_w, k_cache if kn_w is None else kn_w, k_cache, v_cache, mask, out,
        m, n, pos.stride(0), pos.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), smb, mask.stride(2), mask.stride(3),
        eps, scale,
        SPLIT=split, Q_LEN=q_len, QP=_pow2(q_len), GROUP=q_heads // hkv, ROWS=_ROWS, HEAD_DIM=dim,
        LENGTH=length, BLOCK=BLOCK_K, HAS_BIAS=bias is not None, HAS_QN=qn_w is not None,
        HAS_KN=kn_w is not None, DT=_TL_DTYPES[k_cache.dtype], PDL=use_pdl, launch_pdl=use_pdl,
    )
    return out


@_qkv_rope_decode_attention.register_fake
def _(parts: Tensor, bias: Tensor | None, pos: Tensor, slot: Tensor, inv_freq: Tensor, qn_w: Tensor | None,
      kn_w: Tensor | None, k_cache: Tensor, v_cache: Tensor, mask: Tensor, length: int, q_heads: int,
      eps: float, scale: float) -> Tensor:
    return k_cache.new_empty((parts.shape[1], q_heads * k_cache.shape[-1]))


@_qkv_rope_decode_attention.register_kernel("cpu")
def _qkv_rope_decode_attention_reference(
    parts: Tensor, bias: Tensor | None, pos: Tensor, slot: Tensor, inv_freq: Tensor, qn_w: Tensor | None,
    kn_w: Tensor | None, k_cache: Tensor, v_cache: Tensor, mask: Tensor, length: int, q_heads: int,
    eps: float, scale: float,
) -> Tensor:
    """The operator spelled with the unfused functions (what ``attn_prep``, the talker's
    cache write and ``attend`` over the gathered rows do after the projection): its CPU
    kernel, the reference the Triton kernel is checked against (tests call it on CUDA
    tensors too)."""
    m = parts.shape[1]
    q_len = pos.shape[1]
    hkv, dim = k_cache.shape[1], k_cache.shape[3]
    q, k, v = projected_qkv(parts, bias, pos, inv_freq, qn_w, kn_w, q_heads, hkv, dim, eps, k_cache.dtype)
    for t in range(q_len):
        k_cache[slot, :, pos[:, t]] = k[:, :, t]
        v_cache[slot, :, pos[:, t]] = v[:, :, t]
    keys = k_cache[:, :, :length].index_select(0, slot)
    values = v_cache[:, :, :length].index_select(0, slot)
    out = attend(q, keys, values, mask, scale=scale)
    return out.transpose(1, 2).reshape(m, q_heads * dim)
