"""One-kernel attention for decode steps (a few queries over a short key/value history).

In a CUDA-graphed decode step, SDPA costs two to three launches per layer (cuDNN wants
its own layout, so the compiler adds a copy kernel before it) and the talker first
gathers each stream's rows of the cache. :func:`attend_decode` is one Triton launch per
layer: a program per (batch row, key/value head) takes that head's query rows (grouped
query heads x query positions, padded to 16 for the tensor cores), reads keys and values
straight from the cache rows named by ``slot`` (no gather copy), and runs a streaming
softmax over blocks of 64 keys under the boolean mask. It serves bfloat16 and float16 on
CUDA; anything else (CPU, float32) takes :func:`~voxline.kernels.attention.attend` on the
gathered rows, which is also the reference it is checked against.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .attention import attend

try:  # Triton ships with CUDA builds of PyTorch only.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installed torch build
    triton = None

__all__ = ["attend_decode", "decode_kernel_available"]

_BLOCK_ROWS = 16
_BLOCK_K = 64


def decode_kernel_available(x: Tensor) -> bool:
    return triton is not None and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)


if triton is not None:

    @triton.jit
    def stream_attend(q, k_base, skk, v_base, svk, m_base, smq, smk, qi, real, d, scale,
                      LENGTH: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_K: tl.constexpr):
        """Attention of the query rows ``q [ROWS, D]`` (row r at query position ``qi[r]``;
        ``real``: not padding) over the first ``LENGTH`` keys/values at ``k_base``/``v_base``
        (``skk``/``svk`` apart), under the boolean mask at ``m_base + qi * smq + key * smk``,
        in blocks of ``BLOCK_K`` keys with a streaming softmax: float32 ``[ROWS, D]``. Scores
        and softmax in float32, probabilities rounded to the values' dtype before their
        product. Shared by the decode kernel and the talker's fused attention block."""
        m_i = tl.full((ROWS,), -1.0e30, tl.float32)
        l_i = tl.zeros((ROWS,), tl.float32)
        acc = tl.zeros((ROWS, HEAD_DIM), tl.float32)
        for start in range(0, LENGTH, BLOCK_K):
            kk = start + tl.arange(0, BLOCK_K)
            inside = kk < LENGTH
            k = tl.load(k_base + kk[:, None] * skk + d[None, :], mask=inside[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)) * scale  # [ROWS, BLOCK_K], float32
            allowed = tl.load(m_base + qi[:, None] * smq + kk[None, :] * smk,
                              mask=real[:, None] & inside[None, :], other=0) != 0
            s = tl.where(allowed, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_base + kk[:, None] * svk + d[None, :], mask=inside[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        return acc / tl.where(l_i > 0, l_i, 1.0)[:, None]

    @triton.jit
    def _decode_attn_kernel(
        q_ptr, k_ptr, v_ptr, m_ptr, slot_ptr, o_ptr,
        sqb, sqh, sqq, skb, skh, skk, svb, svh, svk, smb, smq, smk,
        scale, Q_LEN: tl.constexpr, LENGTH: tl.constexpr,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        b = tl.program_id(0)
        hkv = tl.program_id(1)
        slot = tl.load(slot_ptr + b)
        r = tl.arange(0, ROWS)  # row r: query head hkv * GROUP + r // Q_LEN, position r % Q_LEN
        g = r // Q_LEN
        qi = r % Q_LEN
        real = r < GROUP * Q_LEN
        d = tl.arange(0, HEAD_DIM)
        h = hkv * GROUP + g
        q = tl.load(q_ptr + b * sqb + h[:, None] * sqh + qi[:, None] * sqq + d[None, :],
                    mask=real[:, None], other=0.0)
        out = stream_attend(q, k_ptr + slot * skb + hkv * skh, skk, v_ptr + slot * svb + hkv * svh, svk,
                            m_ptr + b * smb, smq, smk, qi, real, d, scale,
                            LENGTH, ROWS, HEAD_DIM, BLOCK_K)
        o_off = ((b * (tl.num_programs(1) * GROUP) + h[:, None]) * Q_LEN + qi[:, None]) * HEAD_DIM + d[None, :]
        tl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=real[:, None])


def attend_decode(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor, *, slot: Tensor | None = None,
    length: int | None = None, scale: float | None = None,
) -> Tensor:
    """Attention of ``q [B, Hq, Q, D]`` over keys/values ``[S, Hkv, L, D]``: rows ``slot``
    (``[B]``; default ``arange(B)``), first ``length`` positions (default all), under the
    boolean ``mask [B|1, 1, Q, length]`` (True = may attend). Returns ``[B, Hq, Q, D]``.
    Every query row must see at least one key."""
    b, hq, q_len, dim = q.shape
    hkv = k.shape[1]
    length = k.shape[2] if length is None else length
    if not decode_kernel_available(q) or hq % hkv or hq // hkv * q_len > _BLOCK_ROWS \
            or dim not in (64, 128, 256):
        ks = k[:, :, :length] if slot is None else k[:, :, :length].index_select(0, slot)
        vs = v[:, :, :length] if slot is None else v[:, :, :length].index_select(0, slot)
        return attend(q, ks, vs, mask, scale=scale)
    if slot is None:
        slot = torch.arange(b, device=q.device)
    return torch.ops.voxline.decode_attention(q, k, v, mask, slot, length, dim ** -0.5 if scale is None else scale)


@torch.library.custom_op("voxline::decode_attention", mutates_args=())
def _decode_attention_op(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, slot: Tensor, length: int,
                         scale: float) -> Tensor:
    """The kernel launch as an opaque operator: ``torch.compile`` keeps it in its region
    as one external call (Dynamo cannot trace this Triton version's launcher)."""
    b, hq, q_len, dim = q.shape
    hkv = k.shape[1]
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out = torch.empty((b, hq, q_len, dim), dtype=q.dtype, device=q.device)
    smb = mask.stride(0) if mask.shape[0] > 1 else 0
    _decode_attn_kernel[(b, hkv)](
        q, k, v, mask, slot, out,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), smb, mask.stride(2), mask.stride(3),
        scale, Q_LEN=q_len, LENGTH=length,
        GROUP=hq // hkv, HEAD_DIM=dim, ROWS=_BLOCK_ROWS, BLOCK_K=_BLOCK_K,
    )
    return out


@_decode_attention_op.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, slot: Tensor, length: int, scale: float) -> Tensor:
    return q.new_empty(q.shape)
