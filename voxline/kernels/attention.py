"""Attention over a key/value history with explicit boolean masks.

``attend`` is the one entry point model code calls: queries ``[B, Hq, Q, D]`` over keys
and values ``[B, Hkv, K, D]`` (grouped-query when ``Hkv < Hq``), with a boolean mask
``[B, 1, Q, K]`` (True = may attend) built from absolute positions by
:func:`position_mask`, so chunks appended to a cache get a bottom-right-aligned causal
mask by construction. The eager path is PyTorch's SDPA; fused kernels register here.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

__all__ = ["attend", "position_mask"]


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
