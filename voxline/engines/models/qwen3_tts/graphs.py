"""Talker frame generation over fixed-shape steps: CUDA graphs in size buckets.

:class:`GraphedTalkerGenerator` is a :class:`TalkerGenerator` whose per-frame work runs
as two static steps (:mod:`voxline.kernels.cuda_graphs`):

- the code predictor's whole frame for ``B`` rows (15 sub-steps with their sampling,
  then the frame's talker input embedding): one graph per batch bucket;
- the talker's one-frame decode (K/V write, attention over the first ``L`` cache
  positions, codec head, first-code logit processing and sampling): one graph per
  (batch, length) bucket.

Prompt prefill (variable length, once per stream) runs eagerly, as do batches or
lengths past the largest bucket. Only the first codes go to the host (one copy per step,
needed to see EOS); frames and hidden states stay on the device.

Padding rows point at a scratch cache slot that no stream owns (position 0, greedy), so
they write only that slot and their picks are dropped: padding never reaches a stream.
Sampling is :func:`~voxline.kernels.sampling.sample_rows` with the stream's seed and a
draw counter (``frame * G + codebook``): a seeded stream gives the same frames whatever
shares its batch, captured or eager. Greedy decoding gives the frames of
:class:`TalkerGenerator`; seeded sampling draws other (equally distributed) noise than it.

Without CUDA, or with ``capture=False``, the same padded steps run eagerly: the twin the
CPU tests compare against.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Hashable, Sequence

import torch
from torch import Tensor, nn

from voxline.engines.models.llama import MLP, RMSNorm
from voxline.kernels.cuda_graphs import BucketedSteps, StaticStep, bucket_for, pow2_buckets
from voxline.kernels.fused import compiled_kernels
from voxline.kernels.sampling import sample_rows

from .generation import FinishReason, TalkerFrame, TalkerGenerator, TalkerSampling, TalkerStream
from .prompt import TalkerPrompt
from .talker import Talker, _window_masks

__all__ = ["GraphedTalkerGenerator"]

_MIN_LENGTH_BUCKET = 64


class GraphedTalkerGenerator(TalkerGenerator):
    """:class:`TalkerGenerator` on bucketed static steps; see the module docstring."""

    def __init__(
        self,
        talker: Talker,
        *,
        max_streams: int,
        max_len: int,
        batch_buckets: Sequence[int] | None = None,
        length_buckets: Sequence[int] | None = None,
        capture: bool | None = None,
        fuse: bool = False,
    ) -> None:
        """``batch_buckets`` default to powers of two up to ``max_streams``,
        ``length_buckets`` to powers of two from 64 up to ``max_len``; an empty list runs
        exact shapes eagerly. ``capture`` defaults to whether the talker is on CUDA.
        ``fuse`` routes the talker's RMSNorms and MLPs through compiled kernels
        (:func:`fuse_decoder_modules`; equal within dtype
        tolerance, not bit-exact)."""
        super().__init__(talker, max_streams=max_streams + 1, max_len=max_len)
        self.scratch = max_streams  # the extra slot padding rows write to
        self._free.remove(self.scratch)
        dev = talker.device
        self.capture = dev.type == "cuda" if capture is None else capture
        self.batch_buckets = sorted(pow2_buckets(1, max_streams) if batch_buckets is None else batch_buckets)
        self.length_buckets = sorted(
            pow2_buckets(min(_MIN_LENGTH_BUCKET, max_len), max_len) if length_buckets is None else length_buckets
        )
        if fuse:
            fuse_decoder_modules(talker)
        for rope in (talker.rope, talker.code_predictor.rope):
            rope.inv_freq = rope.inv_freq.to(dev)  # no host->device copy inside a step
        self._groups = talker.num_code_groups
        # First codes each slot drew (the repetition penalty's history), on the device.
        self.seen = torch.zeros(max_streams + 1, talker.config.vocab_size, dtype=torch.bool, device=dev)
        self._seeds = [0] * (max_streams + 1)
        self._true = torch.ones((), dtype=torch.bool, device=dev)
        self.decode_steps: BucketedSteps[tuple[int, int]] = BucketedSteps(
            self._make_decode, capture=self.capture, name="talker decode")
        self.frame_steps: BucketedSteps[int] = BucketedSteps(
            self._make_frame, capture=self.capture, name="code predictor frame")

    def prepare(self, max_length: int | None = None) -> None:
        """Create (capture) every bucket now instead of on first use; lengths up to
        ``max_length`` (default: all)."""
        lengths = [n for n in self.length_buckets if max_length is None or n <= max_length]
        self.frame_steps.prepare(self.batch_buckets)
        self.decode_steps.prepare([(b, n) for b in self.batch_buckets for n in lengths])

    # -- stream lifecycle ------------------------------------------------------------

    def start(
        self, prompt: TalkerPrompt, params: TalkerSampling, stream_id: Hashable = None
    ) -> TalkerStream:
        stream = super().start(prompt, params, stream_id)
        self._seeds[stream.slot] = secrets.randbits(62) if params.seed is None else params.seed
        self.seen[stream.slot].zero_()
        return stream

    # -- stepping --------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, streams: Sequence[TalkerStream]) -> list[TalkerFrame]:
        """As :meth:`TalkerGenerator.step`: one frame per unfinished stream."""
        live = [s for s in streams if not s.finished]
        results: dict[int, TalkerFrame] = {}
        completing = []
        for s in live:
            if s.pending is None:
                continue
            if s.pending == self.eos:
                s.finish = FinishReason.EOS
                results[id(s)] = TalkerFrame(s, None, s.finish)
            else:
                completing.append(s)

        decode: list[TalkerStream] = []
        inputs: list[Tensor] = []
        if completing:
            frames, embeds = self._complete(completing)
            for i, s in enumerate(completing):
                s.frames += 1
                s.pending = None
                if s.frames >= s.params.max_frames:
                    s.finish = FinishReason.LENGTH
                results[id(s)] = TalkerFrame(s, frames[i], s.finish)
                if s.finished:
                    continue
                if self.cache.lengths[s.slot] + 1 > self.cache.max_len:
                    s.finish = results[id(s)].finish = FinishReason.LENGTH
                    continue
                decode.append(s)
                inputs.append(embeds[i] + s.prompt.text_for_frame(s.frames - 1))

        fed: list[TalkerStream] = []
        hiddens: list[Tensor] = []
        codes: list[Tensor] = []
        prefill = [s for s in live if s.hidden is None]
        if prefill:
            hidden, logits = self.talker.forward_batch([s.slot for s in prefill],
                                                       [s.prompt.embeds for s in prefill])
            ints, floats = self._first_settings(prefill, len(prefill))
            fed += prefill
            hiddens.append(hidden)
            codes.append(self._pick(logits, ints.to(logits.device), floats.to(logits.device)))
        if decode:
            hidden, code = self._decode(decode, torch.stack(inputs))
            fed += decode
            hiddens.append(hidden)
            codes.append(code)
        if fed:
            hidden = torch.cat(hiddens)
            for s, h, code in zip(fed, hidden, torch.cat(codes).tolist(), strict=True):
                s.hidden = h
                s.pending = code
                s.history.append(code)
        return [results[id(s)] for s in live if id(s) in results]

    # -- code predictor frame --------------------------------------------------------

    def _frame_settings(self, streams: Sequence[TalkerStream], b: int) -> tuple[Tensor, Tensor]:
        pad = b - len(streams)
        ints = torch.tensor([
            [s.pending for s in streams] + [0] * pad,  # type: ignore[misc]
            [s.params.subtalker_top_k for s in streams] + [0] * pad,
            [self._seeds[s.slot] for s in streams] + [0] * pad,
            [s.frames * self._groups for s in streams] + [0] * pad,
        ], dtype=torch.int64)
        floats = torch.tensor([
            [s.params.subtalker_temperature for s in streams] + [0.0] * pad,
            [s.params.subtalker_top_p for s in streams] + [1.0] * pad,
        ], dtype=torch.float32)
        return ints, floats

    def _frame_fn(self, hidden: Tensor, ints: Tensor, floats: Tensor) -> dict[str, Tensor]:
        first, top_k, seed, counter = ints
        temperature, top_p = floats

        def pick(logits: Tensor, codebook: int) -> Tensor:
            return sample_rows(logits, temperature, top_k, top_p, seed, counter + codebook)

        frames = self.talker.complete_frames(hidden, first, pick)
        return {"frames": frames, "embeds": self.talker.embed_frames(frames)}

    def _make_frame(self, b: int) -> StaticStep:
        t = self.talker
        ints, floats = self._frame_settings([], b)
        hidden = torch.zeros(b, t.config.hidden_size, dtype=t.dtype, device=t.device)
        return StaticStep(self._frame_fn, {"hidden": hidden, "ints": ints.to(t.device),
                                           "floats": floats.to(t.device)})

    def _complete(self, streams: Sequence[TalkerStream]) -> tuple[Tensor, Tensor]:
        """Frames ``[n, G]`` and their talker input embeddings ``[n, D]``."""
        n = len(streams)
        hidden = torch.stack([s.hidden for s in streams])  # type: ignore[misc]
        b = bucket_for(n, self.batch_buckets)
        if b is None:  # no bucket: the same function on the exact shape
            ints, floats = self._frame_settings(streams, n)
            out = self._frame_fn(hidden, ints.to(hidden.device), floats.to(hidden.device))
            return out["frames"], out["embeds"]
        step = self.frame_steps.get(b)
        ints, floats = self._frame_settings(streams, b)
        step.inputs["hidden"][:n].copy_(hidden)
        step.inputs["ints"].copy_(ints)
        step.inputs["floats"].copy_(floats)
        out = step()
        return out["frames"][:n].clone(), out["embeds"][:n].clone()

    # -- talker decode ---------------------------------------------------------------

    def _first_settings(self, streams: Sequence[TalkerStream], b: int) -> tuple[Tensor, Tensor]:
        pad = b - len(streams)
        lengths = self.cache.lengths
        ints = torch.tensor([
            [s.slot for s in streams] + [self.scratch] * pad,
            [lengths[s.slot] for s in streams] + [0] * pad,
            [s.params.top_k for s in streams] + [0] * pad,
            [self._seeds[s.slot] for s in streams] + [0] * pad,
            [len(s.history) * self._groups for s in streams] + [0] * pad,
            [int(len(s.history) < s.params.min_frames) for s in streams] + [0] * pad,
        ], dtype=torch.int64)
        floats = torch.tensor([
            [s.params.temperature for s in streams] + [0.0] * pad,
            [s.params.top_p for s in streams] + [1.0] * pad,
            [s.params.repetition_penalty for s in streams] + [1.0] * pad,
        ], dtype=torch.float32)
        return ints, floats

    def _pick(self, logits: Tensor, ints: Tensor, floats: Tensor) -> Tensor:
        """First-code logit processing (as ``_pick_first``) and sampling, fixed shapes."""
        slot, _, top_k, seed, counter, eos_block = ints
        temperature, top_p, penalty = floats
        p = penalty[:, None]
        seen = self.seen.index_select(0, slot)
        logits = torch.where(seen, torch.where(logits < 0, logits * p, logits / p), logits)
        eos = torch.where(eos_block.bool(), float("-inf"), logits[:, self.eos])
        logits = logits.masked_fill(self._suppress, float("-inf"))
        logits[:, self.eos] = eos
        code = sample_rows(logits, temperature, top_k, top_p, seed, counter)
        self.seen.index_put_((slot, code), self._true)  # a device scalar: capturable
        return code

    def _decode_forward(self, x: Tensor, slot: Tensor, pos: Tensor, length: int) -> tuple[Tensor, Tensor]:
        """One new position per row at ``pos`` of ``slot``, attending over ``[0, length)``."""
        t, cache = self.talker, self.cache
        b = x.shape[0]
        q_pos = pos[:, None]
        cos, sin = t.rope(q_pos, t.dtype)
        k_pos = torch.arange(length, device=x.device).expand(b, length)
        masks = _window_masks(t.windows, q_pos, k_pos)

        def kv(layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
            ck, cv = cache.k[layer], cache.v[layer]  # [S, Hkv, L, D]
            ck[slot, :, pos] = k[:, :, 0]
            cv[slot, :, pos] = v[:, :, 0]
            return ck[:, :, :length].index_select(0, slot), cv[:, :, :length].index_select(0, slot)

        h = x[:, None]
        for layer, window in zip(t.model.layers, t.windows, strict=True):
            h = layer(h, cos, sin, masks[window], kv)
        h = t.model.norm(h[:, 0])
        return h, t.codec_head(h).float()

    def _decode_fn(self, length: int):
        def fn(x: Tensor, ints: Tensor, floats: Tensor) -> dict[str, Tensor]:
            hidden, logits = self._decode_forward(x, ints[0], ints[1], length)
            return {"hidden": hidden, "code": self._pick(logits, ints, floats)}

        return fn

    def _make_decode(self, key: tuple[int, int]) -> StaticStep:
        b, length = key
        t = self.talker
        ints, floats = self._first_settings([], b)
        x = torch.zeros(b, t.config.hidden_size, dtype=t.dtype, device=t.device)
        return StaticStep(self._decode_fn(length), {"x": x, "ints": ints.to(t.device),
                                                    "floats": floats.to(t.device)})

    def _decode(self, streams: Sequence[TalkerStream], x: Tensor) -> tuple[Tensor, Tensor]:
        """Feed one frame input per stream; returns hidden ``[n, D]`` and first codes ``[n]``."""
        n = len(streams)
        need = max(self.cache.lengths[s.slot] for s in streams) + 1
        b = bucket_for(n, self.batch_buckets)
        length = bucket_for(need, self.length_buckets)
        if b is None or length is None:
            ints, floats = self._first_settings(streams, n)
            out = self._decode_fn(need)(x, ints.to(x.device), floats.to(x.device))
            hidden, code = out["hidden"], out["code"]
        else:
            step = self.decode_steps.get((b, length))
            ints, floats = self._first_settings(streams, b)
            step.inputs["x"][:n].copy_(x)
            step.inputs["ints"].copy_(ints)
            step.inputs["floats"].copy_(floats)
            out = step()
            hidden, code = out["hidden"][:n].clone(), out["code"][:n]
        for s in streams:
            self.cache.lengths[s.slot] += 1
            self.cache.written[s.slot] = self.cache.lengths[s.slot]
        return hidden, code


def fuse_decoder_modules(root: nn.Module) -> int:
    """Route every RMSNorm and SwiGLU MLP under ``root`` through the compiled kernels of
    :mod:`voxline.kernels.fused` (per-instance ``forward``); returns how many were rerouted."""
    rms, silu_mul = compiled_kernels()
    n = 0
    for m in root.modules():
        if isinstance(m, RMSNorm):
            m.forward = functools.partial(rms, weight=m.weight, eps=m.eps)  # type: ignore[method-assign]
            n += 1
        elif isinstance(m, MLP):
            def mlp(x: Tensor, m: MLP = m) -> Tensor:
                return m.down_proj(silu_mul(m.gate_proj(x), m.up_proj(x)))

            m.forward = mlp  # type: ignore[method-assign]
            n += 1
    return n
