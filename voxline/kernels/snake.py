"""SnakeBeta activation, ``y = x + sin(alpha * x)^2 / (beta + eps)`` per channel.

The eager version below is the reference (and the CPU path): it performs the same
operations in the same order as the published vocoder, so it is bit-exact with it.
A fused GPU kernel registers under the same signature and must agree with it.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["SNAKE_EPS", "snake_beta", "snake_beta_eager"]

SNAKE_EPS = 1e-9


def snake_beta_eager(x: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
    """``x [B, C, T]``; ``alpha``, ``beta`` ``[C]`` already exponentiated (positive)."""
    a = alpha[None, :, None]
    b = beta[None, :, None]
    return x + (1.0 / (b + SNAKE_EPS)) * torch.pow(torch.sin(x * a), 2)


def snake_beta(x: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
    """SnakeBeta over channels of ``x [B, C, T]``; dispatches to the fastest exact path."""
    return snake_beta_eager(x, alpha, beta)
