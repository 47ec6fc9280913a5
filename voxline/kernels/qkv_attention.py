"""A decode layer's attention block between its Q/K/V and output projections, one kernel.

In the code predictor's captured frame on an H200 the work between a layer's QKV
projection and its output projection (the partials' sum, the q/k/v split, per-head q/k
RMSNorm, RoPE, the out-of-place key/value writes, SDPA and its layout copies) took about
seven kernels per layer and sub-step, ~500 of a frame's ~1,300, each a few microseconds
of mostly launch latency. :func:`qkv_attention` is one Triton launch instead: a program
per (batch row, key/value head) sums that head's slices of the projection's float32
partials (:func:`~voxline.kernels.gemv.small_linear`'s ``[split, M, N]``, so the sum
kernel goes too), normalises and rotates its key and its group of query heads, writes the
new key and value into the layer's key/value buffer at the row's positions (in place),
and attends over the buffer's positions under the boolean mask (all of it in registers:
the predictor's buffer holds 16 positions).

The arithmetic follows the unfused functions (:func:`~voxline.kernels.decoder_step.attn_prep`,
the key/value write, :func:`~voxline.kernels.attention.attend`): the projection rounds to
the activation dtype, RMSNorm normalises in float32 and rounds before and after its
weight, the cos/sin tables are rounded as :func:`~voxline.kernels.layer_ops.rope_tables`
does, scores and softmax are float32. So it equals them within bf16 rounding, not
bit-identically (as the compiled unfused path does not either). It serves bfloat16/float16
on CUDA when :func:`fused_available` holds; callers keep the unfused functions otherwise
(CPU, float32, long buffers). :func:`set_enabled` switches it off process-wide (A/B).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import pdl
from .attention import attend
from .gemv import gemv_available, split_for
from .layer_ops import apply_rope, rms_norm, rope_tables
from .switch import KernelSwitch

try:  # Triton ships with CUDA builds of PyTorch only.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installed torch build
    triton = None

__all__ = ["fused_available", "qkv_attention", "set_enabled"]

# Score and output temporaries are [query rows, buffer positions, head dim] float32 per
# program; past this many elements they would spill out of registers.
_MAX_TILE = 16384
_switch = KernelSwitch()
set_enabled = _switch.set  # benchmarks A/B the kernel


def _pow2(n: int) -> int:
    p = 1
    while p < n:  # a plain loop: traced by Dynamo as constants
        p *= 2
    return p


def fused_available(
    x: Tensor, pos: Tensor, k_buf: Tensor, v_buf: Tensor, mask: Tensor | None,
    ln_w: Tensor, eps: float, qkv_w: Tensor, qkv_b: Tensor | None, q_out: int, kv_out: int,
    qn_w: Tensor | None, kn_w: Tensor | None, qk_eps: float, head_dim: int,
) -> bool:
    """Whether :func:`qkv_attention` serves these arguments (those of
    :func:`~voxline.kernels.decoder_step.attn_prep` plus the buffers ``[B, Hkv, L, D]`` and
    the boolean mask ``[B|1, 1, Q, L]``)."""
    if not (_switch.on and triton is not None and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)):
        return False
    if mask is None or mask.dtype != torch.bool or not gemv_available(x, qkv_w) or x.dim() != 3:
        return False
    b, q_len, _ = x.shape
    if head_dim not in (64, 128, 256) or q_out % head_dim or kv_out % head_dim:
        return False
    hq, hkv = q_out // head_dim, kv_out // head_dim
    if hq % hkv or qkv_w.shape[0] != q_out + 2 * kv_out:
        return False
    length = k_buf.shape[2] if k_buf.dim() == 4 else 0
    for buf in (k_buf, v_buf):
        if tuple(buf.shape) != (b, hkv, length, head_dim) or buf.dtype != x.dtype or buf.stride(-1) != 1:
            return False
    if tuple(pos.shape) != (b, q_len) or mask.dim() != 4 or tuple(mask.shape[1:]) != (1, q_len, length) \
            or mask.shape[0] not in (1, b):
        return False
    return _pow2(hq // hkv * q_len) * _pow2(length) * head_dim <= _MAX_TILE


def qkv_attention(
    x: Tensor, pos: Tensor, inv_freq: Tensor, k_buf: Tensor, v_buf: Tensor, mask: Tensor,
    ln_w: Tensor, eps: float, qkv_w: Tensor, qkv_b: Tensor | None, q_out: int, kv_out: int,
    qn_w: Tensor | None, kn_w: Tensor | None, qk_eps: float, head_dim: int,
) -> Tensor:
    """:func:`~voxline.kernels.decoder_step.attn_prep` of ``x [B, Q, hidden]`` at positions
    ``pos [B, Q]``, its keys/values written into ``k_buf``/``v_buf [B, Hkv, L, D]`` at those
    positions (in place), and attention of its queries over the buffers under ``mask``:
    returns the attention output ``[B, Q, Hq * D]`` (heads flattened, the output
    projection's input). Only where :func:`fused_available` holds."""
    b, q_len, hidden = x.shape
    h = rms_norm(x, ln_w, eps).reshape(-1, hidden)
    parts = torch.ops.voxline.gemv_partials(h, qkv_w, split_for(qkv_w.shape[0], hidden))
    out = torch.ops.voxline.qkv_rope_attention(parts, qkv_b, pos, inv_freq, qn_w, kn_w, k_buf, v_buf, mask,
                                               q_len, q_out // head_dim, qk_eps, head_dim ** -0.5)
    return out.view(b, q_len, q_out)


if triton is not None:

    @triton.jit
    def _projected(parts_ptr, bias_ptr, row, col, ok, MN, N, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr):
        """Rows ``row`` and columns ``col`` (same shape) of the projection: its partials'
        sum in the order ``parts.sum(0)`` adds them, plus the bias (float32)."""
        off = row * N + col
        acc = tl.load(parts_ptr + off, mask=ok, other=0.0)
        for s in tl.static_range(1, SPLIT):
            acc += tl.load(parts_ptr + s * MN + off, mask=ok, other=0.0)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + col, mask=ok, other=0.0).to(tl.float32)
        return acc

    @triton.jit
    def _norm_rope(x, xr, w_ptr, d, d_rot, sign, cos, sin, eps,
                   HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr, DT: tl.constexpr):
        """Per-head RMSNorm then RoPE of ``x [R, D]`` (float32 holding ``DT`` values);
        ``xr``: the same rows at the rotate-half partner columns ``d_rot``."""
        x = x.to(DT).to(tl.float32)
        xr = xr.to(DT).to(tl.float32)
        if HAS_NORM:
            r = tl.rsqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)[:, None]
            w = tl.load(w_ptr + d).to(tl.float32)[None, :]
            wr = tl.load(w_ptr + d_rot).to(tl.float32)[None, :]
            x = (w * (x * r).to(DT).to(tl.float32)).to(DT).to(tl.float32)
            xr = (wr * (xr * r).to(DT).to(tl.float32)).to(DT).to(tl.float32)
        return (x * cos + sign[None, :] * xr * sin).to(DT)

    @triton.jit
    def _tables(pos, freq, DT: tl.constexpr):
        """cos/sin ``[R, D]`` of positions ``pos [R]``, rounded to ``DT`` as rope_tables."""
        ang = pos.to(tl.float32)[:, None] * freq[None, :]
        return tl.cos(ang).to(DT).to(tl.float32), tl.sin(ang).to(DT).to(tl.float32)

    @triton.jit
    def _new_kv(parts_ptr, bias_ptr, pos_ptr, kn_ptr, b, spb, spq, k_col, v_col, d, d_rot, sign, freq,
                MN, N, eps, SPLIT: tl.constexpr, Q_LEN: tl.constexpr, QP: tl.constexpr,
                HEAD_DIM: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_KN: tl.constexpr, DT: tl.constexpr):
        """Row ``b``'s new key (normed, rotated) and value ``[QP, D]`` in ``DT`` at each of its
        query positions, with those positions ``[QP]`` and the rows' validity ``[QP, D]``: the
        part both fused kernels share before writing them to their own buffers."""
        t = tl.arange(0, QP)
        t_ok = t < Q_LEN
        t_pos = tl.load(pos_ptr + b * spb + t * spq, mask=t_ok, other=0)
        ok = t_ok[:, None] & (d[None, :] < HEAD_DIM)
        row = (b * Q_LEN + t)[:, None] + d[None, :] * 0
        cos, sin = _tables(t_pos, freq, DT)
        k = _norm_rope(_projected(parts_ptr, bias_ptr, row, k_col + d[None, :], ok, MN, N, SPLIT, HAS_BIAS),
                       _projected(parts_ptr, bias_ptr, row, k_col + d_rot[None, :], ok, MN, N, SPLIT, HAS_BIAS),
                       kn_ptr, d, d_rot, sign, cos, sin, eps, HEAD_DIM, HAS_KN, DT)
        v = _projected(parts_ptr, bias_ptr, row, v_col + d[None, :], ok, MN, N, SPLIT, HAS_BIAS).to(DT)
        return k, v, t_pos, ok

    @triton.jit
    def _qkv_attn_kernel(
        parts_ptr, bias_ptr, pos_ptr, freq_ptr, qn_ptr, kn_ptr, k_ptr, v_ptr, m_ptr, o_ptr,
        M, N, spb, spq, skb, skh, skl, svb, svh, svl, smb, smq, sml, eps, scale,
        SPLIT: tl.constexpr, Q_LEN: tl.constexpr, QP: tl.constexpr, GROUP: tl.constexpr,
        ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, LENGTH: tl.constexpr, L_PAD: tl.constexpr,
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

        # This row's new key and value at each of its query positions.
        k, v, t_pos, ok = _new_kv(parts_ptr, bias_ptr, pos_ptr, kn_ptr, b, spb, spq, k_col, v_col, d, d_rot,
                                  sign, freq, MN, N, eps, SPLIT, Q_LEN, QP, HEAD_DIM, HAS_BIAS, HAS_KN, DT)
        tl.store(k_ptr + b * skb + hkv * skh + t_pos[:, None] * skl + d[None, :], k, mask=ok)
        tl.store(v_ptr + b * svb + hkv * svh + t_pos[:, None] * svl + d[None, :], v, mask=ok)
        # The attention below reads those positions back through other threads of this
        # program: a block barrier makes its global writes visible to them.
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
                       qn_ptr, d, d_rot, sign, cos, sin, eps, HEAD_DIM, HAS_QN, DT).to(tl.float32)

        j = tl.arange(0, L_PAD)
        j_ok = j < LENGTH
        keys = tl.load(k_ptr + b * skb + hkv * skh + j[:, None] * skl + d[None, :],
                       mask=j_ok[:, None], other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * keys[None, :, :], axis=2) * scale  # [ROWS, L_PAD]
        allowed = tl.load(m_ptr + b * smb + qi[:, None] * smq + j[None, :] * sml,
                          mask=real[:, None] & j_ok[None, :], other=0) != 0
        s = tl.where(allowed, s, float("-inf"))
        m = tl.max(s, axis=1)
        m = tl.where(m > float("-inf"), m, 0.0)  # padding rows (and fully masked ones): no NaN
        p = tl.exp(s - m[:, None])
        denom = tl.sum(p, axis=1)
        values = tl.load(v_ptr + b * svb + hkv * svh + j[:, None] * svl + d[None, :],
                         mask=j_ok[:, None], other=0.0).to(tl.float32)
        out = tl.sum(p[:, :, None] * values[None, :, :], axis=1) / tl.where(denom > 0, denom, 1.0)[:, None]
        tl.store(o_ptr + q_row * q_cols + q_col + d[None, :], out.to(DT), mask=q_ok)

    _TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@torch.library.custom_op("voxline::qkv_rope_attention", mutates_args=("k_buf", "v_buf"))
def _qkv_rope_attention(
    parts: Tensor, bias: Tensor | None, pos: Tensor, inv_freq: Tensor, qn_w: Tensor | None,
    kn_w: Tensor | None, k_buf: Tensor, v_buf: Tensor, mask: Tensor, q_len: int, q_heads: int,
    eps: float, scale: float,
) -> Tensor:
    """The kernel launch as an opaque operator that writes the buffers in place (declared,
    so ``torch.compile`` orders it and keeps the buffers' later readers after it):
    ``parts [split, B*Q, N]`` float32 partials of the Q/K/V projection -> the attention
    output ``[B*Q, q_heads * D]``."""
    split, m, n = parts.shape
    b, hkv, length, dim = k_buf.shape
    group = q_heads // hkv
    rows = _pow2(group * q_len)
    l_pad = _pow2(length)
    parts = parts if parts.is_contiguous() else parts.contiguous()
    out = torch.empty((m, q_heads * dim), dtype=k_buf.dtype, device=k_buf.device)
    smb = mask.stride(0) if mask.shape[0] > 1 else 0
    use_pdl = pdl.active(parts)
    # Unused pointers still need a tensor: the kernel never reads them (constexpr flags).
    _qkv_attn_kernel[(b, hkv)](
        parts, parts if bias is None else bias, pos, inv_freq,
        k_buf if qn_w is None else qn_w, k_buf if kn_w is None else kn_w, k_buf, v_buf, mask, out,
        m, n, pos.stride(0), pos.stride(1), k_buf.stride(0), k_buf.stride(1), k_buf.stride(2),
        v_buf.stride(0), v_buf.stride(1), v_buf.stride(2), smb, mask.stride(2), mask.stride(3),
        eps, scale,
        SPLIT=split, Q_LEN=q_len, QP=_pow2(q_len), GROUP=group, ROWS=rows, HEAD_DIM=dim,
        LENGTH=length, L_PAD=l_pad, HAS_BIAS=bias is not None, HAS_QN=qn_w is not None,
        HAS_KN=kn_w is not None, DT=_TL_DTYPES[k_buf.dtype], PDL=use_pdl,
        num_warps=4 if rows * l_pad * dim <= 8192 else 8, launch_pdl=use_pdl,
    )
    return out


@_qkv_rope_attention.register_fake
def _(parts: Tensor, bias: Tensor | None, pos: Tensor, inv_freq: Tensor, qn_w: Tensor | None,
      kn_w: Tensor | None, k_buf: Tensor, v_buf: Tensor, mask: Tensor, q_len: int, q_heads: int,
      eps: float, scale: float) -> Tensor:
    return k_buf.new_empty((parts.shape[1], q_heads * k_buf.shape[-1]))


def projected_qkv(
    parts: Tensor, bias: Tensor | None, pos: Tensor, inv_freq: Tensor, qn_w: Tensor | None,
    kn_w: Tensor | None, q_heads: int, kv_heads: int, dim: int, eps: float, dtype: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor]:
    """The unfused path from the projection's float32 partials ``[split, B*Q, N]`` to the
    layer's q, k, v ``[B, H, Q, D]`` in `dtype` (the partials' sum plus bias, q/k RMSNorm,
    RoPE at ``pos [B, Q]``): what both fused kernels' CPU references start with."""
    b, q_len = pos.shape
    y = parts.sum(0)
    if bias is not None:
        y = y + bias.float()
    q, k, v = y.to(dtype).view(b, q_len, -1).split((q_heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
    q = q.reshape(b, q_len, q_heads, dim)
    k = k.reshape(b, q_len, kv_heads, dim)
    if qn_w is not None:
        q = rms_norm(q, qn_w, eps)
    if kn_w is not None:
        k = rms_norm(k, kn_w, eps)
    cos, sin = rope_tables(pos, inv_freq, dtype)
    q = apply_rope(q.transpose(1, 2), cos, sin)
    k = apply_rope(k.transpose(1, 2), cos, sin)
    return q, k, v.reshape(b, q_len, kv_heads, dim).transpose(1, 2)


@_qkv_rope_attention.register_kernel("cpu")
def _qkv_rope_attention_reference(
    parts: Tensor, bias: Tensor | None, pos: Tensor, inv_freq: Tensor, qn_w: Tensor | None,
    kn_w: Tensor | None, k_buf: Tensor, v_buf: Tensor, mask: Tensor, q_len: int, q_heads: int,
    eps: float, scale: float,
) -> Tensor:
    """The operator spelled with the unfused functions (what ``attn_prep``, the key/value
    write and ``attend`` do after the projection): its CPU kernel, the reference the Triton
    kernel is checked against (tests call it on CUDA tensors too)."""
    m = parts.shape[1]
    b, hkv, _, dim = k_buf.shape
    q, k, v = projected_qkv(parts, bias, pos, inv_freq, qn_w, kn_w, q_heads, hkv, dim, eps, k_buf.dtype)
    rows = torch.arange(b, device=k_buf.device)
    for t in range(q_len):
        k_buf[rows, :, pos[:, t]] = k[:, :, t]
        v_buf[rows, :, pos[:, t]] = v[:, :, t]
    out = attend(q, k_buf, v_buf, mask, scale=scale)
    return out.transpose(1, 2).reshape(m, q_heads * dim)
