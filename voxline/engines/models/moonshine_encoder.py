"""Moonshine's encoder over static buffers: one CUDA graph per (rows, frames) bucket.

Eagerly the encoder is some 550 torch calls from Python (a strided conv stem, a
masked GroupNorm, eight transformer layers), each waiting for the GIL the TTS and LLM
threads hold on a busy server: one clip took 24 ms alone on an H200 and the ASR stage's
plans 58-76 ms at 48-64 sessions. Here the clips of a batch are copied into a zeroed
``[rows, samples]`` buffer with each row's sample count beside it, and one replay of the
bucket's graph computes every row's states; on the CPU the same function runs eagerly
(the twin the tests compare with ``encode_many``).

A bucket of ``F`` frames takes :func:`samples_for` ``(F)`` samples, the fewest whose conv
stem yields ``F`` frames; a batch takes the smallest bucket that holds its longest clip's
samples, and its states are ``F`` frames wide, so that is the decoder's frame bucket too. The
encode function derives each row's conv and frame counts from its sample count on the
device, so the GroupNorm and attention see each clip's own frames only, and states past a
row's own frames are finite padding the decoder masks. Padding rows hold zeros and count
as full rows. Large buckets stay eager: their graphs would hold their activations (a
64-row, 18 s batch needs gigabytes) for the life of the server.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor

from voxline.kernels.cuda_graphs import BucketedSteps, StaticStep, bucket_for, copy_in, pow2_buckets

from .moonshine_decoder import FRAME_BUCKETS

GRAPH_ROWS = 16  # larger batches encode eagerly
GRAPH_FRAMES = 512  # 12.3 s; longer clips encode eagerly
Count = TypeVar("Count", int, Tensor)
EncodeFn = Callable[[Tensor, Tensor], Tensor]  # (values [R, S], samples [R]) -> [R, F, H]


def conv_counts(samples: Count) -> tuple[Count, Count]:
    """The conv stem's output lengths for ``samples``: conv1 (kernel 127, stride 64), then
    the frames after conv2 (7, 3) and conv3 (3, 2). Ints, or long tensors on the device."""
    n1 = (samples - 127) // 64 + 1
    return n1, ((n1 - 7) // 3 + 1 - 3) // 2 + 1


def samples_for(frames: int) -> int:
    """The fewest samples whose conv stem yields ``frames`` frames."""
    return 384 * frames + 511


class StaticEncoder:
    """Moonshine's encoder for up to ``rows`` clips of up to ``frames[-1]`` frames."""

    def __init__(self, encode: EncodeFn, device: torch.device, *, rows: int = GRAPH_ROWS,
                 frames: Sequence[int] = tuple(f for f in FRAME_BUCKETS if f <= GRAPH_FRAMES),
                 capture: bool) -> None:
        """``encode``: encoder states of zero-padded ``values`` with each row's sample count."""
        self.encode = encode
        self.row_buckets = pow2_buckets(1, rows)
        self.frame_buckets = sorted(frames)
        self.values = torch.zeros(rows, samples_for(self.frame_buckets[-1]), device=device)
        self.samples = torch.full((rows,), self.values.shape[1], dtype=torch.long, device=device)
        self.steps: BucketedSteps[tuple[int, int]] = BucketedSteps(
            self._make, capture=capture, name="Moonshine encoder graphs")

    def keys(self) -> list[tuple[int, int]]:
        return [(r, f) for r in self.row_buckets for f in self.frame_buckets]

    def fits(self, rows: int, samples: int) -> bool:
        return rows <= self.row_buckets[-1] and samples <= self.values.shape[1]

    def _make(self, key: tuple[int, int]) -> StaticStep:
        rows, frames = key
        width = samples_for(frames)

        def fn(values: Tensor, samples: Tensor) -> dict[str, Tensor]:
            # at capture the counts are the largest bucket's: finite, and clamped to ours
            return {"states": self.encode(values, samples.clamp(max=values.shape[1]))}

        return StaticStep(fn, {"values": self.values[:rows, :width], "samples": self.samples[:rows]})

    @torch.inference_mode()
    def run(self, clips: Sequence[np.ndarray]) -> tuple[Tensor, list[int]]:
        """Encoder states ``[clips, F, hidden]`` (``F`` the batch's frame bucket) and each
        clip's own frame count; the batch must fit (:meth:`fits`)."""
        lengths = [len(c) for c in clips]
        frames = [conv_counts(n)[1] for n in lengths]
        # by samples, not frames: up to 383 samples past samples_for(F) still give F frames,
        # but the GroupNorm's statistics cover them
        fit = [f for f in self.frame_buckets if samples_for(f) >= max(lengths)]
        key = (bucket_for(len(clips), self.row_buckets), fit[0] if fit else None)
        if key[0] is None or key[1] is None:
            raise ValueError(f"{len(clips)} clips of up to {max(lengths)} samples are past the "
                             "encoder's buckets")
        key = self.steps.ready(key)  # a bucket captured in the background: padded up meanwhile
        step = self.steps.get(key)
        width = samples_for(key[1])
        values = torch.zeros(key[0], width)
        samples = torch.full((key[0],), width, dtype=torch.long)
        for i, clip in enumerate(clips):
            values[i, :len(clip)] = torch.from_numpy(clip)
            samples[i] = len(clip)
        copy_in(step.inputs["values"], values)
        copy_in(step.inputs["samples"], samples)
        return step()["states"][:len(clips)].clone(), frames  # the next replay overwrites it
