"""Token sampling with one ``torch.Generator`` per row (the Llama and the Qwen3-TTS talker).

A row's draw uses only its own generator, so a seeded request is reproducible whatever
else shares the batch. The top-k/top-p filter is
:func:`~voxline.kernels.layer_ops.top_k_top_p_drop`, shared with the fixed-shape
:func:`~voxline.kernels.sampling.sample_rows` of the CUDA-graph steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from voxline.kernels.cuda_graphs import default_rng_draw, to_device
from voxline.kernels.layer_ops import top_k_top_p_drop

__all__ = ["pick_rows", "sample"]


def sample(
    logits: Tensor,
    temperatures: Sequence[float],
    *,
    top_p: Sequence[float] | None = None,
    top_k: Sequence[int] | None = None,
    generators: Sequence[torch.Generator | None] | None = None,
) -> Tensor:
    """Pick one token per row of ``logits [B, V]``; returns ``[B]`` long on logits' device.

    Temperature 0 is greedy (argmax; top-p/top-k ignored). Otherwise softmax at that
    temperature, restricted to the ``top_k`` most likely tokens (0 = off) and the smallest
    set with probability >= ``top_p`` (1.0 = off), sampled with the row's generator. A row's
    draw uses only its own generator, so a seeded request is reproducible whatever else
    shares the batch. No host sync, except that a generator on another device than the
    logits (a request seeded on the CPU, the model on a GPU) draws there and is copied
    over: the same draws as a CPU model gets from it.
    """
    b, vocab = logits.shape
    if len(temperatures) != b:
        raise ValueError(f"{len(temperatures)} temperatures for {b} rows")
    greedy = logits.argmax(dim=-1)
    sampled_rows = [i for i, temp in enumerate(temperatures) if temp > 0]
    if not sampled_rows:
        return greedy
    dev = logits.device
    rows = to_device(sampled_rows, torch.long, dev)
    temps = to_device([float(temperatures[i]) for i in sampled_rows], torch.float32, dev)
    scores = logits.index_select(0, rows).float() / temps[:, None]
    ks = [top_k[i] if top_k else 0 for i in sampled_rows]
    ps = [top_p[i] if top_p else 1.0 for i in sampled_rows]
    if any(0 < k < vocab for k in ks) or any(p < 1.0 for p in ps):
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        drop = top_k_top_p_drop(sorted_scores, to_device(ks, torch.long, dev),
                                to_device([float(p) for p in ps], torch.float32, dev))
        scores = sorted_scores.masked_fill(drop, float("-inf"))
    else:
        order = None
    probs = scores.softmax(dim=-1)
    # Exponential-race sampling: argmax(p / E), E ~ Exp(1) drawn from each row's generator.
    # Unseeded rows share the default generator: one draw for the whole batch (a launch
    # per row was a GIL-bound cost of every decode step at 64 streams), then seeded rows
    # draw their own.
    noise = torch.empty_like(probs)
    if not generators or any(generators[i] is None for i in sampled_rows):
        with default_rng_draw(noise.device):
            noise.exponential_()
    for j, i in enumerate(sampled_rows):
        gen = generators[i] if generators else None
        if gen is None:
            continue
        if gen.device != noise.device:
            draw = torch.empty(noise.shape[1], dtype=noise.dtype, device=gen.device)
            noise[j].copy_(draw.exponential_(generator=gen))
        else:
            noise[j].exponential_(generator=gen)
    picked = (probs / noise).argmax(dim=-1)
    if order is not None:
        picked = order.gather(1, picked[:, None])[:, 0]
    return greedy.index_copy(0, rows, picked)


def pick_rows(logits: Tensor, temperatures: Tensor) -> Tensor:
    """One token per row of ``logits [B, V]`` at ``temperatures [B]`` (0: greedy), drawn
    with the default generator; ``[B]`` long. Every row does the same work whatever its
    temperature and nothing reads a value on the host, so a CUDA graph can hold it (a
    graph's draws advance the default CUDA generator at each replay). The same exponential
    race as :func:`sample`'s unseeded rows, without top-k/top-p (the LLM sets neither)."""
    greedy = logits.argmax(dim=-1)
    sampled = temperatures > 0
    temp = torch.where(sampled, temperatures, torch.ones_like(temperatures))
    probs = (logits.float() / temp[:, None]).softmax(dim=-1)
    with default_rng_draw(probs.device):
        noise = torch.empty_like(probs).exponential_()
    picked = (probs / noise).argmax(dim=-1)
    return torch.where(sampled, picked, greedy)
