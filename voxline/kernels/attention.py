"""Attention over a key/value history with explicit boolean masks.

``attend`` is the one entry point model code calls: queries ``[B, Hq, Q, D]`` over keys
and values ``[B, Hkv, K, D]`` (grouped-query when ``Hkv < Hq``), with a boolean mask
``[B, 1, Q, K]`` (True = may attend) built from absolute positions by
:func:`position_mask`, so chunks appended to a cache get a bottom-right-aligned causal
mask by construction. The eager path is PyTorch's SDPA; fused kernels register here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["attend", "attend_matmul", "attend_sum", "position_mask"]


def position_mask(
    q_pos: Tensor, k_pos: Tensor, *, window: int | None = None, k_valid: Tensor | None = None
) -> Tensor:
    """Causal (optionally sliding-window) mask from absolute positions.

    ``q_pos [B, Q]``, ``k_pos [B, K]`` -> ``[B, 1, Q, K]`` bool: query at position ``p``
    sees keys at ``p - window < k <= p`` (``window=None``: all ``k <= p``), and only keys
    with ``k_valid`` True when given (``[B, K]``).
    """
    q = q_pos[:, :, None]
    k = k_pos[:, None, :]
    mask = k <= q
    if window is not None:
        mask &= k > q - window
    if k_valid is not None:
        mask &= k_valid[:, None, :]
    return mask[:, None]


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, scale: float | None = None) -> Tensor:
    """Softmax attention; returns ``[B, Hq, Q, D]``.

    Every query row must see at least one key (callers write a query's own key before
    attending, so causal masks satisfy this); a fully masked row is undefined (NaN).
    """
    gqa = q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)


def _grouped(q: Tensor, k: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor | None, int]:
    """Queries regrouped per key/value head ``[B, Hkv, G*Q, D]`` (query head ``h`` uses key
    head ``h // G``, as SDPA's ``enable_gqa``) and the mask broadcast to match."""
    b, hq, q_len, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    qg = q.reshape(b, hkv, g * q_len, d)
    if mask is not None:
        mask = mask[:, :, None].expand(mask.shape[0], 1, g, q_len, mask.shape[-1])
        mask = mask.reshape(mask.shape[0], 1, g * q_len, mask.shape[-1])
    return qg, mask, g


def _finish(scores: Tensor, mask: Tensor | None) -> Tensor:
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1)


def attend_matmul(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, scale: float | None = None) -> Tensor:
    """:func:`attend` spelled out (scores in float32, two batched matmuls): no SDPA
    backend choice, so ``torch.compile`` sees plain ops for short decode keys."""
    b, hq, q_len, d = q.shape
    qg, mask, _ = _grouped(q, k, mask)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    p = _finish(torch.matmul(qg.float(), k.float().transpose(-1, -2)) * scale, mask)
    return torch.matmul(p.to(v.dtype), v).reshape(b, hq, q_len, d)


def attend_sum(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, scale: float | None = None) -> Tensor:
    """:func:`attend` as broadcast products and sums (float32): under ``torch.compile``
    two fused reductions with no matmul launch, for one or two decode queries over a
    short cache. Eagerly it materialises ``[B, Hkv, G*Q, K, D]``: decode shapes only."""
    b, hq, q_len, d = q.shape
    qg, mask, _ = _grouped(q, k, mask)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    scores = (qg.float()[:, :, :, None, :] * k.float()[:, :, None, :, :]).sum(-1) * scale
    p = _finish(scores, mask)
    out = (p[..., None] * v.float()[:, :, None, :, :]).sum(-2)
    return out.to(v.dtype).reshape(b, hq, q_len, d)
