"""Streaming code2wav over fixed shapes: :class:`GraphedCode2Wav` (CUDA graphs per bucket).

The codec-decoder counterpart of :class:`~.graphed_talker.GraphedTalkerGenerator`: every
stream's :class:`~.code2wav.Code2WavState` lives in one slot of a device-resident store,
and a chunk call for a (batch, new frames) bucket is one graph replay (on the CPU, or
with ``capture=False``, the same function eagerly: the twin of
:meth:`~.code2wav.Code2WavDecoder.decode_batch`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch
from torch import Tensor

from voxline.kernels.compiled import maybe_compile
from voxline.kernels.cuda_graphs import (
    BucketedSteps,
    GraphBackfill,
    StaticStep,
    bucket_for,
    copy_in,
    pow2_buckets,
    same_tail,
)

from .code2wav import Code2WavDecoder, Code2WavState

__all__ = ["GraphedCode2Wav"]


def _decode_rows(
    decoder: Code2WavDecoder, tails: list[Tensor], keys: list[Tensor], values: list[Tensor],
    key_pos: Tensor, frames: Tensor, codes: Tensor,
) -> tuple[Tensor, list[Tensor], list[Tensor], list[Tensor], Tensor, Tensor]:
    """``decoder.decode`` over gathered state rows, as a function of tensors (the unit
    compiled per bucket): the waveform and the new state's tensors. The scatter back into the
    device-resident store stays outside, so the compiler never copies the store."""
    state = Code2WavState(list(tails), list(keys), list(values), key_pos, frames)
    wav = decoder.decode_chunk(state, codes)
    return wav, state.tails, state.keys, state.values, state.key_pos, state.frames


class GraphedCode2Wav:
    """Streaming code2wav over fixed shapes: one CUDA graph per (batch, new frames) bucket.

    Every stream's decoder state lives in one slot of a device-resident
    :class:`Code2WavState` with a row per slot; a step gathers its rows' state by slot
    index, decodes, and scatters the new state back, all inside the graph, so a chunk
    call is one replay plus two small copies in. Padding rows use a scratch slot no
    stream owns (codes of earlier calls, always valid ids) and their audio is dropped.
    Frame counts are exact (a padded frame would advance the causal state), so the
    buckets are every chunk length up to ``max_frames``; others run the same function
    eagerly on the exact shape. Without capture the same gather/decode/scatter runs
    eagerly: the twin of :meth:`Code2WavDecoder.decode_batch`.
    """

    def __init__(
        self, decoder: Code2WavDecoder, *, max_streams: int, max_frames: int,
        batch_buckets: Sequence[int] | None = None, capture: bool | None = None,
        compile: bool = False, compile_frames: Collection[int] | None = None,
    ) -> None:
        """``compile``: each bucket's decode compiled (static shapes) inside its graph, for
        the chunk lengths in ``compile_frames`` (default: all; a compile per bucket costs
        ~20 s at load, so callers name the lengths they use in steady state)."""
        self.decoder = decoder
        rope = decoder.pre_transformer.rope
        rope.inv_freq = rope.inv_freq.to(decoder.device)  # no host->device copy inside a step
        # A finished job holds its slot until its last chunk is decoded, after a new job
        # may already have taken its talker slot: twice the talker's slots, plus scratch.
        slots = 2 * max_streams + 1
        self.scratch = slots - 1
        self.store = decoder.new_state(slots)
        self._free = list(range(self.scratch))
        self.capture = decoder.device.type == "cuda" if capture is None else capture
        self.batch_buckets = sorted(pow2_buckets(1, max_streams) if batch_buckets is None else batch_buckets)
        self.frame_buckets = list(range(1, max_frames + 1))
        self.compiled = compile
        self.compile_frames = set(self.frame_buckets if compile_frames is None else compile_frames)
        self._compiled_decode = maybe_compile(_decode_rows, compile)
        self.steps: BucketedSteps[tuple[int, int]] = BucketedSteps(
            self._make, capture=self.capture, name="code2wav",
            fits=same_tail)  # (batch, frames): a chunk's frames are exact, not padded

    def prepare(self, backfill: GraphBackfill | None = None) -> None:
        """Capture every (batch, frames) graph now, or (``backfill``) those covering the
        rest now and the rest after the engine is ready."""
        self.steps.prepare([(b, t) for b in self.batch_buckets for t in self.frame_buckets],
                           backfill=backfill)

    def open(self) -> int:
        """A fresh stream's slot (state reset to the start of an utterance)."""
        if not self._free:
            raise RuntimeError("no free code2wav slot")
        slot = self._free.pop(0)
        st = self.store
        for x in (*st.tails, *st.keys, *st.values):
            x[slot].zero_()
        st.key_pos[slot].fill_(-1)
        st.frames[slot].zero_()
        return slot

    def release(self, slot: int) -> None:
        if 0 <= slot < self.scratch and slot not in self._free:
            self._free.append(slot)

    def _fn(self, slots: Tensor, codes: Tensor) -> dict[str, Tensor]:
        decode = self._compiled_decode if codes.shape[-1] in self.compile_frames else _decode_rows
        st = self.store

        def take(xs: list[Tensor]) -> list[Tensor]:
            return [x.index_select(0, slots) for x in xs]

        wav, *new = decode(
            self.decoder, take(st.tails), take(st.keys), take(st.values),
            st.key_pos.index_select(0, slots), st.frames.index_select(0, slots), codes)
        state = Code2WavState(*new)
        for bufs, new in ((st.tails, state.tails), (st.keys, state.keys), (st.values, state.values),
                          ([st.key_pos], [state.key_pos]), ([st.frames], [state.frames])):
            for buf, x in zip(bufs, new, strict=True):
                buf.index_copy_(0, slots, x)
        return {"wav": wav}

    def _make(self, key: tuple[int, int]) -> StaticStep:
        b, t = key
        dev = self.decoder.device
        slots = torch.full((b,), self.scratch, dtype=torch.int64, device=dev)
        codes = torch.zeros(b, self.decoder.config.num_quantizers, t, dtype=torch.int64, device=dev)
        return StaticStep(self._fn, {"slots": slots, "codes": codes})

    @torch.inference_mode()
    def decode(self, slots: Sequence[int], chunks: Sequence[Tensor]) -> list[Tensor]:
        """One chunk ``[Q, T_i]`` per stream slot -> waveforms ``[T_i * spf]``, batching equal
        ``T_i``. The results are valid until the next call (graph output buffers)."""
        if len(slots) != len(chunks):
            raise ValueError("one chunk per slot")
        out: list[Tensor | None] = [None] * len(slots)
        groups: dict[int, list[int]] = {}
        for i, c in enumerate(chunks):
            groups.setdefault(int(c.shape[-1]), []).append(i)
        for idx in groups.values():
            wav = self.decode_batch([slots[i] for i in idx], torch.stack([chunks[i] for i in idx]))
            for i, row in zip(idx, wav.unbind(0), strict=True):
                out[i] = row
        return out  # type: ignore[return-value]

    @torch.inference_mode()
    def decode_batch(self, slots: Sequence[int], codes: Tensor) -> Tensor:
        """Chunks of equal length ``codes [n, Q, T]`` of streams ``slots`` -> waveforms
        ``[n, T * spf]``: one replay of the (n's bucket, T) graph, or the same function on
        the exact shape past the buckets. Valid until the next call (graph output buffers)."""
        n, t = len(slots), int(codes.shape[-1])
        codes = codes.to(self.decoder.device)
        b = bucket_for(n, self.batch_buckets)
        if b is None or t not in self.frame_buckets:
            return self._fn(torch.tensor(list(slots), device=codes.device), codes)["wav"]
        b, t = self.steps.ready((b, t))
        step = self.steps.get((b, t))
        copy_in(step.inputs["slots"], torch.tensor([*slots, *[self.scratch] * (b - n)]))
        step.inputs["codes"][:n].copy_(codes)
        return step()["wav"][:n]
