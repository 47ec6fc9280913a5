"""Token sampling with fixed shapes and no host sync, so it can live inside a CUDA graph.

Each row carries its settings as tensors (temperature, top-k, top-p) and its random
stream as a ``(seed, counter)`` pair: the uniform noise of a draw is an integer hash of
seed, counter and vocabulary rank, so a stream's draws depend only on its own seed and
how many draws it made, never on the batch it shares or its padding. The same function
runs eagerly on the CPU (the exact twin) and under capture on a GPU; integer hashing is
identical on both.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .layer_ops import top_k_top_p_drop
from .topk import topk_rows

__all__ = ["bits_to_unit", "counter_uniform", "sample_rows"]

_MASK32 = 0xFFFFFFFF
_HASH_MUL = 0x45D9F3B  # < 2**27: products of 32-bit values stay inside int64


def _mix(x: Tensor) -> Tensor:
    for _ in range(3):
        x = ((x ^ (x >> 16)) * _HASH_MUL) & _MASK32
    return x ^ (x >> 16)


def counter_uniform(seed: Tensor, counter: Tensor, n: int) -> Tensor:
    """``[B]`` int64 seeds and counters -> ``[B, n]`` float32 uniforms in (0, 1)."""
    idx = torch.arange(n, device=seed.device, dtype=torch.int64)
    s = _mix(seed & _MASK32) ^ _mix((seed >> 32) & _MASK32)
    x = _mix((s[:, None] ^ _mix((counter[:, None] * 0x9E37 + idx[None, :]) & _MASK32)) & _MASK32)
    return bits_to_unit(x)


def bits_to_unit(x: Tensor) -> Tensor:
    """32-bit integers -> float32 in (0, 1), never 0 or 1 (an exact 1 would make the
    exponential race divide 0 by 0 and pick a masked id): 23 bits plus a half fit the
    24-bit significand exactly."""
    return ((x >> 9).float() + 0.5) * (1.0 / (1 << 23))


def sample_rows(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, seed: Tensor, counter: Tensor,
    max_top_k: int = 0,
) -> Tensor:
    """Pick one id per row of ``logits [B, V]`` (float32); returns ``[B]`` int64.

    ``temperature`` 0 is greedy (argmax); otherwise softmax at that temperature over the
    ``top_k`` best ids (0 = all) and the smallest prefix with mass >= ``top_p``, then an
    exponential race with the row's counter noise (as ``models.sampling.sample`` does with
    a generator; both filter with :func:`~.layer_ops.top_k_top_p_drop`). Every row costs
    the same work, so the shape never depends on the values.

    ``max_top_k`` > 0 promises that every sampled row has ``0 < top_k <= max_top_k``
    (the caller checks): then only the ``max_top_k`` best ids are ranked (``topk``
    instead of a sort of the whole vocabulary) and the pick is the same, since the
    noise of a draw belongs to a rank, not to an id.
    """
    vocab = logits.shape[-1]
    greedy = logits.argmax(dim=-1)
    sampled = temperature > 0
    temp = torch.where(sampled, temperature, torch.ones_like(temperature))
    if 0 < max_top_k < vocab:
        scores, order = topk_rows(logits / temp[:, None], max_top_k)
        vocab = max_top_k
    else:
        scores, order = (logits / temp[:, None]).sort(dim=-1, descending=True)
    drop = top_k_top_p_drop(scores, top_k, top_p)
    probs = scores.masked_fill(drop, float("-inf")).softmax(dim=-1)
    race = probs / -torch.log(counter_uniform(seed, counter, vocab))
    picked = order.gather(1, race.argmax(dim=-1, keepdim=True))[:, 0]
    return torch.where(sampled, picked, greedy)
