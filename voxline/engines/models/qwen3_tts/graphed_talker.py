"""Talker frame generation over fixed-shape steps: CUDA graphs in size buckets.

:class:`GraphedTalkerGenerator` is a :class:`TalkerGenerator` whose per-frame work runs
as three kinds of static step (:mod:`voxline.kernels.cuda_graphs`):

- the code predictor's whole frame for ``B`` rows (15 sub-steps with their sampling,
  then the frame's talker input embedding): one graph per batch bucket;
- the talker's one-frame decode (K/V write, attention over the first ``L`` cache
  positions, codec head, first-code logit processing and sampling): one graph per
  (batch, length) bucket;
- the prompt prefill of new streams: one graph per (batch, prompt length) bucket, the
  prompt padded at its end (padded positions write cache entries past the stream's
  length, which are never read and are overwritten by its later frames).

Every decoder layer runs as the two pure functions of :mod:`voxline.kernels.decoder_step`.
In the frame and decode steps they are compiled once per process with static shapes
(``compile``, default on with capture): each bucket gets its own specialisation, traced
and captured at load, and nothing else calls them, so no step recompiles or falls back.
The prefill runs them uncompiled: a compile per prompt bucket would double the load time,
and the graph replay already removes the launch cost that dominated it. The code
predictor's keys/values live in a fixed ``[B, Hkv, G, D]`` buffer per layer (masked by
position), so its 15 sub-steps share two shapes (2 queries for the first, 1 after); each
sub-step (every layer, its key/value writes, the head and sampling) is one compiled
function, and a pick's next input is a row of its codebook table pre-projected to the
predictor's width. The talker decode attends through
:func:`~voxline.kernels.decode_attention.attend_decode` by default: one Triton launch per
layer reading the streams' cache rows in place (SDPA off CUDA or outside bf16/fp16); with
it, on CUDA in bf16/fp16, the whole attention block from the QKV partials to the output
projection's input (norms, RoPE, cache write, attention) is one launch
(:mod:`voxline.kernels.qkv_decode_attention`).

At up to 16 rows on CUDA a layer's output and down projections add their own split-K
partials and the residual (:mod:`voxline.kernels.fused_linear`), and the predictor's
top-k ranking is one Triton program per row (:mod:`voxline.kernels.topk`).

Batches or lengths past the largest bucket run eagerly on the modules. Only the first
codes go to the host (one copy per step, needed to see EOS); frames and hidden states
stay on the device. :class:`~.graphed_code2wav.GraphedCode2Wav` does the same for the
streaming codec decoder; the pure functions the steps compile are in :mod:`.talker_steps`.

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
from collections.abc import Callable, Hashable, Sequence

import numpy as np
import torch
from torch import Tensor

from voxline.engines.models.layers import fuse_decoder_modules
from voxline.kernels.attention import attend, attend_matmul, attend_sum, position_mask
from voxline.kernels.compiled import maybe_compile
from voxline.kernels.cuda_graphs import (
    BucketedSteps,
    GraphBackfill,
    PackedInputs,
    StaticStep,
    bucket_for,
    copy_in,
    pow2_buckets,
    same_tail,
)
from voxline.kernels.decode_attention import attend_decode
from voxline.kernels.decoder_step import attn_mlp, attn_out_mlp, attn_prep
from voxline.kernels.qkv_decode_attention import (
    decode_fused_available,
    qkv_decode_attention,
    qkv_partials,
)
from voxline.kernels.sampling import sample_rows

from .generation import (
    FinishReason,
    TalkerFrame,
    TalkerGenerator,
    TalkerSampling,
    TalkerStream,
    record_frame,
    triage,
)
from .prompt import TalkerPrompt
from .talker import Talker, _window_masks
from .talker_steps import gathered_attn_mlp, layer_args, predictor_head, predictor_substep

__all__ = ["ATTENTION", "PREDICTOR_TOP_K_CAP", "GraphedTalkerGenerator"]

_MIN_LENGTH_BUCKET = 64
_MIN_PREFILL_BUCKET = 16
_MAX_PREFILL_BUCKET = 256  # longer prompts (rare: one text segment) prefill eagerly
# Attention inside the decode and predictor steps (the prefill always uses SDPA).
# "triton": one Triton kernel per layer reading the cache rows in place (bf16/fp16 on
# CUDA; SDPA on the gathered rows otherwise).
ATTENTION = {"sdpa": attend, "matmul": attend_matmul, "sum": attend_sum, "triton": attend_decode}
# Measured on an H200 (benchmarks/results/gpu_tts_h200_r3_profile_attention.json): the
# kernel saves the talker ~0.15-0.25 ms a frame; in the predictor's fused sub-step SDPA
# stays ahead.
DEFAULT_ATTENTION = "triton"
DEFAULT_PREDICTOR_ATTENTION = "sdpa"
# The code predictor ranks only this many best ids when every sampled stream's top-k
# fits (the published 50 does): a top-k instead of a sort of 2048 logits per sub-step.
# A frame with a larger (or no) top-k runs a separate full-sort step, made on first use.
PREDICTOR_TOP_K_CAP = 64
# Rows of (int64, float32) settings a step reads: a code-predictor frame's, and the first
# code's (talker decode and prefill); each step's are one packed input (PackedInputs).
FRAME_ROWS = (4, 2)
FIRST_ROWS = (6, 3)
SettingsFill = Callable[[Sequence[TalkerStream], dict[str, np.ndarray]], None]


def send_settings(packed: PackedInputs, fill: SettingsFill, streams: Sequence[TalkerStream]) -> None:
    """Fill a step's packed settings for ``streams`` on the host and copy them over."""
    raw, views = packed.host()
    fill(streams, views)
    packed.send(raw)


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
        prefill_buckets: Sequence[int] | None = None,
        capture: bool | None = None,
        compile: bool | None = None,
        fuse: bool = False,
        attention: str | None = None,
        predictor_attention: str | None = None,
        fuse_predictor: bool = True,
        predictor_top_k_cap: int = PREDICTOR_TOP_K_CAP,
    ) -> None:
        """``batch_buckets`` default to powers of two up to ``max_streams``,
        ``length_buckets`` to powers of two from 64 up to ``max_len``, ``prefill_buckets``
        (prompt lengths) to powers of two from 16 up to 256 (or ``max_len``); an empty
        list runs exact shapes eagerly. ``capture`` defaults to whether the talker is on CUDA,
        ``compile`` (static-shape ``torch.compile`` of the layer functions) to ``capture``.
        ``fuse`` (round-1 experiment, superseded by ``compile``) routes the talker's
        RMSNorms and MLPs through compiled kernels (:func:`fuse_decoder_modules`; equal
        within dtype tolerance, not bit-exact). ``attention`` picks how the decode and
        predictor steps attend (``ATTENTION``: SDPA, or spelled out so the compiler fuses
        it, or one Triton kernel; default ``DEFAULT_ATTENTION``), ``predictor_attention`` the
        code predictor's (default ``DEFAULT_PREDICTOR_ATTENTION``); ``fuse_predictor`` makes each predictor sub-step (all its layers, the
        key/value writes and the head) one compiled region instead of two per layer.
        ``predictor_top_k_cap``: the code predictor samples from a ``topk`` of this many ids
        when every stream's sub-talker top-k fits (0: always a full sort); frame steps are
        keyed ``(batch, cap)``, ``cap`` 0 for the full sort."""
        attention = DEFAULT_ATTENTION if attention is None else attention
        predictor_attention = DEFAULT_PREDICTOR_ATTENTION if predictor_attention is None else predictor_attention
        for name, value in (("attention", attention), ("predictor_attention", predictor_attention)):
            if value not in ATTENTION:
                raise ValueError(f"{name} must be one of {sorted(ATTENTION)}, got {value!r}")
        super().__init__(talker, max_streams=max_streams + 1, max_len=max_len)
        self.scratch = max_streams  # the extra slot padding rows write to
        self._free.remove(self.scratch)
        dev = talker.device
        self.capture = dev.type == "cuda" if capture is None else capture
        self.batch_buckets = sorted(pow2_buckets(1, max_streams) if batch_buckets is None else batch_buckets)
        self.length_buckets = sorted(
            pow2_buckets(min(_MIN_LENGTH_BUCKET, max_len), max_len) if length_buckets is None else length_buckets
        )
        self.prefill_buckets = sorted(
            pow2_buckets(min(_MIN_PREFILL_BUCKET, max_len), min(_MAX_PREFILL_BUCKET, max_len))
            if prefill_buckets is None else prefill_buckets
        )
        if fuse:
            fuse_decoder_modules(talker)
        for rope in (talker.rope, talker.code_predictor.rope):
            rope.inv_freq = rope.inv_freq.to(dev)  # no host->device copy inside a step
        self._groups = talker.num_code_groups
        self.compiled = self.capture if compile is None else compile
        self._prep = maybe_compile(attn_prep, self.compiled)
        self._post = maybe_compile(attn_mlp, self.compiled)
        self._head = maybe_compile(predictor_head, self.compiled)
        self._post_gather = maybe_compile(gathered_attn_mlp, self.compiled)
        self._qkv_parts = maybe_compile(qkv_partials, self.compiled)
        self._out_mlp = maybe_compile(attn_out_mlp, self.compiled)
        self._substep = maybe_compile(predictor_substep, self.compiled)
        self._attention = ATTENTION[attention]
        self._cp_attention = ATTENTION[predictor_attention]
        self.fuse_predictor = fuse_predictor
        self.predictor_top_k_cap = predictor_top_k_cap
        self._talker_w = [layer_args(layer) for layer in talker.model.layers]
        cp = talker.code_predictor
        self._cp_w = [layer_args(layer) for layer in cp.model.layers]
        # Each codebook's embedding table already through the predictor's input projection:
        # a pick's next input is one row lookup instead of a matmul per sub-step.
        with torch.no_grad():
            self._cp_next = [cp.small_to_mtp_projection(cp.model.codec_embedding[step].weight)
                             for step in range(self._groups - 1)]
        # Fixed predictor key/value positions: the talker state, codebook 0, then codes 1..G-2.
        self._cp_len = self._groups
        k_pos = torch.arange(self._cp_len, device=dev)[None]
        self._cp_pos: list[Tensor] = []
        self._cp_masks: list[dict[int | None, Tensor]] = []
        self._cp_cb: list[Tensor] = []
        for step in range(self._groups - 1):
            q_pos = torch.arange(step + (0 if step == 0 else 1), step + 2, device=dev)[None]
            self._cp_pos.append(q_pos)
            self._cp_masks.append({w: position_mask(q_pos, k_pos, window=w) for w in set(cp.windows)})
            self._cp_cb.append(torch.tensor(step + 1, device=dev))
        # First codes each slot drew (the repetition penalty's history), on the device.
        self.seen = torch.zeros(max_streams + 1, talker.config.vocab_size, dtype=torch.bool, device=dev)
        self._seeds = [0] * (max_streams + 1)
        self._true = torch.ones((), dtype=torch.bool, device=dev)
        self.decode_steps: BucketedSteps[tuple[int, int]] = BucketedSteps(
            self._make_decode, capture=self.capture, name="talker decode")
        self.frame_steps: BucketedSteps[tuple[int, int]] = BucketedSteps(
            self._make_frame, capture=self.capture, name="code predictor frame",
            fits=same_tail)  # (batch, top-k cap): a cap is exact
        self.prefill_steps: BucketedSteps[tuple[int, int]] = BucketedSteps(
            self._make_prefill, capture=self.capture, name="talker prefill")

    def prepare(self, max_length: int | None = None, backfill: GraphBackfill | None = None) -> None:
        """Create (capture) every bucket now instead of on first use; lengths up to
        ``max_length`` (default: all). With a ``backfill``, only the buckets that cover
        the rest now (:meth:`BucketedSteps.prepare`)."""
        lengths = [n for n in self.length_buckets if max_length is None or n <= max_length]
        self.frame_steps.prepare([(b, self.predictor_top_k_cap) for b in self.batch_buckets],
                                 backfill=backfill)
        self.decode_steps.prepare([(b, n) for b in self.batch_buckets for n in lengths],
                                  backfill=backfill)
        self.prefill_steps.prepare([(b, q) for b in self.batch_buckets for q in self.prefill_buckets],
                                   backfill=backfill)

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
        live, results, completing = triage(streams, self.eos)

        decode: list[TalkerStream] = []
        kept: list[int] = []  # rows of `completing` that decode on
        texts: list[Tensor] = []
        if completing:
            frames, embeds = self._complete(completing)
            # rows as views in one call, not an index per stream (each call gives up the GIL)
            for i, (s, frame) in enumerate(zip(completing, frames.unbind(0), strict=True)):
                results[id(s)] = record_frame(s, frame)
                if s.finished:
                    continue
                if self.cache.lengths[s.slot] + 1 > self.cache.max_len:
                    s.finish = results[id(s)].finish = FinishReason.LENGTH
                    continue
                decode.append(s)
                kept.append(i)
                texts.append(s.prompt.text_for_frame(s.frames - 1))

        fed: list[TalkerStream] = []
        hiddens: list[Tensor] = []
        codes: list[Tensor] = []
        prefill = [s for s in live if s.hidden is None]
        if prefill:
            hidden, code = self._prefill(prefill)
            fed += prefill
            hiddens.append(hidden)
            codes.append(code)
        if decode:
            # one add for the batch, not one per row: each torch call gives up the GIL
            # the other stages' threads are waiting for
            rows = embeds if len(kept) == len(completing) else torch.stack([embeds[i] for i in kept])
            hidden, code = self._decode(decode, rows + torch.stack(texts))
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

    def _frame_settings(self, streams: Sequence[TalkerStream], views: dict[str, np.ndarray]) -> None:
        """Write a frame's settings (``ints [4, B]``, ``floats [2, B]``: host views of its
        packed inputs) for ``streams``; rows past them stay padding."""
        ints, floats = views["ints"], views["floats"]
        n = len(streams)
        ints[0, :n] = [s.pending for s in streams]
        ints[1, :n] = [s.params.subtalker_top_k for s in streams]
        ints[2, :n] = [self._seeds[s.slot] for s in streams]
        ints[3, :n] = [s.frames * self._groups for s in streams]
        floats[0, :n] = [s.params.subtalker_temperature for s in streams]
        floats[1] = 1.0  # top-p of padding: off
        floats[1, :n] = [s.params.subtalker_top_p for s in streams]

    def _top_k_cap(self, streams: Sequence[TalkerStream]) -> int:
        """The frame's ``max_top_k``: the cap when every sampled stream's top-k fits, else 0."""
        cap = self.predictor_top_k_cap
        fits = all(s.params.subtalker_temperature <= 0 or 0 < s.params.subtalker_top_k <= cap
                   for s in streams)
        return cap if fits else 0

    def _frame_fn(self, hidden: Tensor, ints: Tensor, floats: Tensor, max_top_k: int = 0) -> dict[str, Tensor]:
        """The code predictor's whole frame (as ``Talker.complete_frames`` then
        ``Talker.embed_frames``) over fixed shapes: keys/values in a position-masked buffer;
        ``max_top_k`` as :func:`~voxline.kernels.sampling.sample_rows`."""
        first, top_k, seed, counter = ints
        temperature, top_p = floats
        t = self.talker
        cp = t.code_predictor
        b = hidden.shape[0]
        attn = cp.model.layers[0].self_attn
        kv_shape = (b, attn.num_kv_heads, self._cp_len, attn.head_dim)
        keys = [hidden.new_zeros(kv_shape) for _ in cp.model.layers]
        values = [hidden.new_zeros(kv_shape) for _ in cp.model.layers]
        first_embed = t.embed_codec(first)
        x = cp.small_to_mtp_projection(torch.stack((hidden, first_embed), dim=1))
        codes, embeds = [first], [first_embed]
        for step in range(self._groups - 1):
            q_pos = self._cp_pos[step]
            pos = q_pos.expand(b, -1)
            head = (cp.model.norm.weight, cp.model.norm.eps, cp.lm_head[step].weight,
                    cp.model.codec_embedding[step].weight, self._cp_next[step],
                    temperature, top_k, top_p, seed, counter + self._cp_cb[step], max_top_k)
            if self.fuse_predictor:
                masks = [self._cp_masks[step][w] for w in cp.windows]
                code, emb, x, keys, values = self._substep(
                    x, pos, q_pos[0], cp.rope.inv_freq, keys, values, masks, self._cp_w, head,
                    self._cp_attention)
                codes.append(code)
                embeds.append(emb)
                continue
            h = x
            for i, window in enumerate(cp.windows):
                prep_w, post_w = self._cp_w[i]
                q, k, v = self._prep(h, pos, cp.rope.inv_freq, *prep_w)
                keys[i].index_copy_(2, q_pos[0], k)
                values[i].index_copy_(2, q_pos[0], v)
                h = self._post(h, q, keys[i], values[i], self._cp_masks[step][window], *post_w,
                               attention=self._cp_attention)
            code, emb, x = self._head(h[:, -1], *head)
            codes.append(code)
            embeds.append(emb)
        # One reduction over the stacked codebook embeddings, as embed_frames does.
        return {"frames": torch.stack(codes, dim=1), "embeds": torch.stack(embeds, dim=1).sum(1)}

    def _make_frame(self, key: tuple[int, int]) -> StaticStep:
        b, cap = key
        t = self.talker
        hidden = torch.zeros(b, t.config.hidden_size, dtype=t.dtype, device=t.device)
        return StaticStep(functools.partial(self._frame_fn, max_top_k=cap), {"hidden": hidden},
                          packed=self._settings(FRAME_ROWS, b, self._frame_settings, []))

    def _settings(self, rows: tuple[int, int], b: int, fill: SettingsFill,
                  streams: Sequence[TalkerStream]) -> PackedInputs:
        """``rows`` (ints, floats) of settings for ``b`` rows in one device buffer, filled
        for ``streams`` (padding after them)."""
        packed = PackedInputs({"ints": ((rows[0], b), torch.int64),
                               "floats": ((rows[1], b), torch.float32)}, self.talker.device)
        send_settings(packed, fill, streams)
        return packed

    def _complete(self, streams: Sequence[TalkerStream]) -> tuple[Tensor, Tensor]:
        """Frames ``[n, G]`` and their talker input embeddings ``[n, D]``."""
        n = len(streams)
        hidden = torch.stack([s.hidden for s in streams])  # type: ignore[misc]
        b = bucket_for(n, self.batch_buckets)
        cap = self._top_k_cap(streams)
        if b is None:  # no bucket: the same function on the exact shape
            settings = self._settings(FRAME_ROWS, n, self._frame_settings, streams).tensors
            out = self._frame_fn(hidden, settings["ints"], settings["floats"], cap)
            return out["frames"], out["embeds"]
        b, cap = self.frame_steps.ready((b, cap))
        step = self.frame_steps.get((b, cap))
        step.inputs["hidden"][:n].copy_(hidden)
        send_settings(step.packed, self._frame_settings, streams)  # type: ignore[arg-type]
        out = step()
        # frames are kept (pending for the codec): copied out of the buffer the next replay
        # writes; embeds are only read before it (the caller's add makes a new tensor)
        return out["frames"][:n].clone(), out["embeds"][:n]

    # -- talker prefill --------------------------------------------------------------

    def _prefill_fn(self, x: Tensor, ints: Tensor, floats: Tensor, last: Tensor) -> dict[str, Tensor]:
        """Fresh streams' padded prompts ``x [B, Q, D]`` from position 0; the hidden state
        and first code at each row's ``last`` real position."""
        t, cache = self.talker, self.cache
        slot = ints[0]
        b, q, _ = x.shape
        pos = torch.arange(q, device=x.device).expand(b, q)
        masks = _window_masks(t.windows, pos, pos)
        h = x
        for i, window in enumerate(t.windows):
            prep_w, post_w = self._talker_w[i]
            qh, k, v = attn_prep(h, pos, t.rope.inv_freq, *prep_w)
            cache.k[i][slot, :, :q] = k
            cache.v[i][slot, :, :q] = v
            h = attn_mlp(h, qh, k, v, masks[window], *post_w)  # a fresh stream sees only its prompt
        h = t.model.norm(h[torch.arange(b, device=x.device), last])
        return {"hidden": h, "code": self._pick(t.codec_head(h).float(), ints, floats)}

    def _make_prefill(self, key: tuple[int, int]) -> StaticStep:
        b, q = key
        t = self.talker
        x = torch.zeros(b, q, t.config.hidden_size, dtype=t.dtype, device=t.device)
        last = torch.zeros(b, dtype=torch.int64, device=t.device)
        return StaticStep(self._prefill_fn, {"x": x, "last": last},
                          packed=self._settings(FIRST_ROWS, b, self._first_settings, []))

    def _prefill(self, streams: Sequence[TalkerStream]) -> tuple[Tensor, Tensor]:
        """Prefill fresh streams' prompts; hidden ``[n, D]`` and first codes ``[n]``."""
        cache = self.cache
        n = len(streams)
        counts = [int(s.prompt.embeds.shape[0]) for s in streams]
        b = bucket_for(n, self.batch_buckets)
        q = bucket_for(max(counts), self.prefill_buckets)
        fresh = all(cache.lengths[s.slot] == 0 for s in streams)
        if b is None or q is None or q > cache.max_len or not fresh:
            hidden, logits = self.talker.forward_batch([s.slot for s in streams],
                                                       [s.prompt.embeds for s in streams])
            settings = self._settings(FIRST_ROWS, n, self._first_settings, streams).tensors
            return hidden, self._pick(logits, settings["ints"], settings["floats"])
        b, q = self.prefill_steps.ready((b, q))
        step = self.prefill_steps.get((b, q))
        x = step.inputs["x"]
        x.zero_()  # padded positions: finite and never attended to by real ones
        for i, s in enumerate(streams):
            x[i, : counts[i]].copy_(s.prompt.embeds)
        send_settings(step.packed, self._first_settings, streams)  # type: ignore[arg-type]
        copy_in(step.inputs["last"], torch.tensor([c - 1 for c in counts] + [0] * (b - n)))
        out = step()
        for s, c in zip(streams, counts, strict=True):
            cache.lengths[s.slot] += c
            cache.written[s.slot] = cache.lengths[s.slot]
        return out["hidden"][:n].clone(), out["code"][:n]

    # -- talker decode ---------------------------------------------------------------

    def _first_settings(self, streams: Sequence[TalkerStream], views: dict[str, np.ndarray]) -> None:
        """Write the first-code settings of a talker step (``ints [6, B]``, ``floats
        [3, B]``: host views of its packed inputs) for ``streams``; padding after them
        uses the scratch slot."""
        ints, floats = views["ints"], views["floats"]
        n = len(streams)
        lengths = self.cache.lengths
        ints[0] = self.scratch
        ints[0, :n] = [s.slot for s in streams]
        ints[1, :n] = [lengths[s.slot] for s in streams]
        ints[2, :n] = [s.params.top_k for s in streams]
        ints[3, :n] = [self._seeds[s.slot] for s in streams]
        ints[4, :n] = [len(s.history) * self._groups for s in streams]
        ints[5, :n] = [int(len(s.history) < s.params.min_frames) for s in streams]
        floats[1:] = 1.0  # top-p and repetition penalty of padding: off
        floats[0, :n] = [s.params.temperature for s in streams]
        floats[1, :n] = [s.params.top_p for s in streams]
        floats[2, :n] = [s.params.repetition_penalty for s in streams]

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
        """One new position per row at ``pos`` of ``slot``, attending over ``[0, length)``.

        With the ``triton`` attention on CUDA in bf16/fp16, a layer's attention block (after
        the QKV projection, up to the output projection: q/k norm, RoPE, the cache write,
        attention) is one kernel (:func:`~voxline.kernels.qkv_decode_attention.qkv_decode_attention`,
        called between two compiled regions so the cache's in-place write stays out of them)."""
        t, cache = self.talker, self.cache
        b = x.shape[0]
        q_pos = pos[:, None]
        k_pos = torch.arange(length, device=x.device).expand(b, length)
        masks = _window_masks(t.windows, q_pos, k_pos)
        h = x[:, None]
        for i, window in enumerate(t.windows):
            prep_w, post_w = self._talker_w[i]
            ck, cv = cache.k[i], cache.v[i]  # [S, Hkv, L, D]
            if self._attention is attend_decode and \
                    decode_fused_available(h, q_pos, slot, ck, cv, length, masks[window], *prep_w):
                ln_w, eps, qkv_w, qkv_b, q_out, _, qn_w, kn_w, qk_eps, head_dim = prep_w
                parts = self._qkv_parts(h, ln_w, eps, qkv_w)
                out = qkv_decode_attention(parts, q_pos, slot, t.rope.inv_freq, ck, cv, length, masks[window],
                                           qkv_b, q_out, qn_w, kn_w, qk_eps, head_dim)
                h = self._out_mlp(h, out, *post_w)
                continue
            q, k, v = self._prep(h, q_pos, t.rope.inv_freq, *prep_w)
            ck[slot, :, pos] = k[:, :, 0]
            cv[slot, :, pos] = v[:, :, 0]
            h = self._post_gather(h, q, ck, cv, slot, length, masks[window], post_w, self._attention)
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
        x = torch.zeros(b, t.config.hidden_size, dtype=t.dtype, device=t.device)
        return StaticStep(self._decode_fn(length), {"x": x},
                          packed=self._settings(FIRST_ROWS, b, self._first_settings, []))

    def _decode(self, streams: Sequence[TalkerStream], x: Tensor) -> tuple[Tensor, Tensor]:
        """Feed one frame input per stream; returns hidden ``[n, D]`` and first codes ``[n]``."""
        n = len(streams)
        need = max(self.cache.lengths[s.slot] for s in streams) + 1
        b = bucket_for(n, self.batch_buckets)
        length = bucket_for(need, self.length_buckets)
        if b is None or length is None:
            settings = self._settings(FIRST_ROWS, n, self._first_settings, streams).tensors
            out = self._decode_fn(need)(x, settings["ints"], settings["floats"])
            hidden, code = out["hidden"], out["code"]
        else:
            step = self.decode_steps.get(self.decode_steps.ready((b, length)))
            step.inputs["x"][:n].copy_(x)
            send_settings(step.packed, self._first_settings, streams)  # type: ignore[arg-type]
            out = step()
            hidden, code = out["hidden"][:n].clone(), out["code"][:n]
        for s in streams:
            self.cache.lengths[s.slot] += 1
            self.cache.written[s.slot] = self.cache.lengths[s.slot]
        return hidden, code
