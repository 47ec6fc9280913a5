"""CUDA-graph decode steps for the embedded Llama (:class:`GraphedLlamaDecoder`).

A pure decode step (every stream feeds one token) on a GPU is all launch overhead for a
small Llama: ~15 kernels a layer, each far shorter than its launch. Such a step replays a
CUDA graph captured for a (batch, length) bucket: the smallest batch bucket >= the number
of streams and the smallest length bucket >= the longest stream's length + 1. The graph
reads static inputs (token id, cache slot, position and temperature per row, written in
numpy and sent by one non-blocking host-to-device copy: :class:`PackedInputs`), writes
each row's new K/V at its position, attends over the first ``length`` cache positions
under a mask computed on the device from the positions (no host sync inside the step),
and leaves float32 logits in a static buffer with each row's token beside them, picked at
its temperature (:func:`~voxline.engines.models.sampling.pick_rows`; 0 greedy): the host
reads one small tensor a step instead of launching the sampling itself.

Padding rows (bucket rows past the batch) feed token 0 at position 0 of a scratch cache
slot that no stream owns (the cache has one slot more than ``max_streams``), so they
write only that slot and their logits are dropped: padding never reaches a stream.

Prompts (the rows of a step that feed more than one token) run eagerly through
:meth:`LlamaModel.forward_batch`, or, given ``prefill_buckets``, one prompt at a time from
a prefill graph: a (query, length) bucket of one row whose padding queries repeat the last
real query's position and write their K/V to the scratch slot. An eager prompt is some
1,000 torch calls for a 1B model (`benchmarks/gpu_serving/host_ops.py`), each made from Python under the GIL the engine's
other stages share (16-19 ms for one 57-token prompt on an H200 alone, 777-878 ms beside a
thread spinning at the engine's switch interval: `bench_gpu_llm_cold.py`); a replay is
one launch. A prompt longer than the largest query bucket is fed in chunks of it. Both
graphs run :class:`~voxline.engines.models.llama.model.LlamaModel`'s own layers (prefill)
or the same modules (decode), so the eager model is the reference.

Decode shapes past the largest bucket run eagerly. With ``capture=False`` (and always on
the CPU) the same static-buffer steps run eagerly: the twins the CPU tests compare with
``forward_batch``. Decode attention is :func:`~voxline.kernels.decode_attention.attend_decode`:
one Triton launch a layer reading the cache rows in place (bf16/fp16 on CUDA), SDPA on
gathered rows elsewhere; prefill attention is SDPA over the slot's first ``length`` rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from voxline.engines.models.sampling import pick_rows
from voxline.kernels.cuda_graphs import (
    BucketedSteps,
    PackedInputs,
    StaticStep,
    bucket_for,
    pow2_buckets,
    to_device,
)
from voxline.kernels.decode_attention import attend_decode
from voxline.kernels.layer_ops import apply_rope

from .model import DecoderLayer, LlamaModel, StepPlan

__all__ = ["PREFILL_BUCKETS", "GraphedLlamaDecoder"]

logger = logging.getLogger(__name__)

MIN_LENGTH_BUCKET = 64
# Query buckets of the prefill graphs: a new turn's prompt past the cached conversation is
# tens of tokens; a first prompt (system + instructions) a few hundred, fed in chunks.
PREFILL_BUCKETS = (16, 32, 64, 128, 256)


def _decode_layer(layer: DecoderLayer, h: Tensor, cos: Tensor, sin: Tensor, ck: Tensor,
                  cv: Tensor, slot: Tensor, pos: Tensor, mask: Tensor, length: int) -> Tensor:
    """One decoder layer for one new token per row (``h [B, 1, H]``), the same modules and
    arithmetic as :class:`~voxline.engines.models.llama.model.Attention`, attending in place."""
    a = layer.self_attn
    b = h.shape[0]
    x = layer.input_layernorm(h)
    q = a.q_proj(x).view(b, 1, a.num_heads, a.head_dim).transpose(1, 2)
    k = a.k_proj(x).view(b, 1, a.num_kv_heads, a.head_dim).transpose(1, 2)
    v = a.v_proj(x).view(b, 1, a.num_kv_heads, a.head_dim).transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    ck[slot, :, pos] = k[:, :, 0]
    cv[slot, :, pos] = v[:, :, 0]
    out = attend_decode(q, ck, cv, mask, slot=slot, length=length)
    h = h + a.o_proj(out.transpose(1, 2).reshape(b, 1, -1))
    return h + layer.mlp(layer.post_attention_layernorm(h))


class GraphedLlamaDecoder:
    """Decode steps of a :class:`LlamaModel` over bucketed static steps (module docstring).

    The model's cache must have a slot past ``max_streams`` (``allocate_cache(max_streams
    + 1, ...)``): the scratch slot padding rows write to. Streams use slots
    ``0 .. max_streams - 1``.
    """

    def __init__(
        self,
        model: LlamaModel,
        *,
        max_streams: int,
        batch_buckets: Sequence[int] | None = None,
        length_buckets: Sequence[int] | None = None,
        capture: bool | None = None,
        prefill_buckets: Sequence[int] = (),
    ) -> None:
        """``batch_buckets`` default to powers of two up to ``max_streams``, ``length_buckets``
        to powers of two from 64 up to the cache's ``max_len``; ``prefill_buckets`` (query
        lengths, e.g. :data:`PREFILL_BUCKETS`; none: prompts run eagerly) each pair with
        every length bucket. ``capture`` defaults to whether the model is on CUDA; it is
        refused elsewhere."""
        cache = model.cache
        if cache is None:
            raise RuntimeError("no KV cache: call allocate_cache() first")
        if cache.max_slots <= max_streams:
            raise ValueError(f"the cache has {cache.max_slots} slots; graphed decode of "
                             f"{max_streams} streams needs {max_streams + 1} (one scratch slot)")
        on_cuda = model.device.type == "cuda"
        capture = on_cuda if capture is None else capture
        if capture and not on_cuda:
            raise ValueError(f"CUDA-graph capture needs the model on CUDA, not {model.device}")
        self.model = model
        self.cache = cache
        self.scratch = max_streams
        self.batch_buckets = sorted(pow2_buckets(1, max_streams) if batch_buckets is None
                                    else batch_buckets)
        self.length_buckets = sorted(
            pow2_buckets(min(MIN_LENGTH_BUCKET, cache.max_len), cache.max_len)
            if length_buckets is None else length_buckets)
        self.steps: BucketedSteps[tuple[int, int]] = BucketedSteps(
            self._make, capture=capture, name="llm decode graphs")
        self.prefill_buckets = sorted(prefill_buckets)
        if self.prefill_buckets and self.prefill_buckets[0] < 2:
            raise ValueError(f"prefill buckets must be >= 2 queries, not {self.prefill_buckets}")
        self.prefills: BucketedSteps[tuple[int, int]] | None = BucketedSteps(
            self._make_prefill, capture=capture, name="llm prefill graphs"
        ) if self.prefill_buckets else None
        self.graph_steps = 0  # decode steps served by a bucket (graph or twin)
        self.eager_steps = 0  # decode steps past the buckets, run by forward_batch
        self.prefill_steps = 0  # prompt chunks served by a prefill bucket

    @property
    def buckets(self) -> list[tuple[int, int]]:
        return [(b, n) for b in self.batch_buckets for n in self.length_buckets]

    @property
    def prefill_keys(self) -> list[tuple[int, int]]:
        return [(q, n) for q in self.prefill_buckets for n in self.length_buckets]

    def prepare(self, keys: Iterable[tuple[int, int]] | None = None) -> None:
        """Create (and capture) the given decode buckets now, default all, and every
        prefill bucket, logging progress. Prefill graphs that fail to capture are dropped
        with a warning: prompts then run eagerly, as they did before those graphs."""
        self.steps.prepare(self.buckets if keys is None else keys)
        if self.prefills is None:
            return
        try:
            self.prefills.prepare(self.prefill_keys)
        except RuntimeError as exc:
            logger.warning("llm prefill graphs failed to capture, so prompts run eagerly "
                           "(%s: %s)", type(exc).__name__, exc)
            self.prefills = None

    # -- the static step --------------------------------------------------------------

    def _fn(self, length: int):
        model, cache = self.model, self.cache

        def fn(ints: Tensor, temps: Tensor) -> dict[str, Tensor]:
            ids, slot, pos = ints[0], ints[1], ints[2]
            cos, sin = model._cos_sin(pos[:, None])  # [B, 1, 1, D]
            keys = torch.arange(length, device=ints.device)
            mask = (keys[None, :] <= pos[:, None])[:, None, None, :]  # [B, 1, 1, length]
            h = model.model.embed_tokens(ids[:, None])
            for i, layer in enumerate(model.model.layers):
                h = _decode_layer(layer, h, cos, sin, cache.k[i], cache.v[i], slot, pos, mask,
                                  length)
            logits = model.lm_head(model.model.norm(h[:, 0])).float()
            return {"logits": logits, "picks": pick_rows(logits, temps)}

        return fn

    def _inputs(self, b: int) -> PackedInputs:
        """A decode step's inputs, ``ints [3, b]`` (token, slot, position per row) and
        ``temps [b]``, in one buffer; here ``b`` padding rows: token 0 at position 0 of
        the scratch slot, greedy."""
        packed = PackedInputs({"ints": ((3, b), torch.int64), "temps": ((b,), torch.float32)},
                              self.model.device)
        raw, views = packed.host()
        views["ints"][1] = self.scratch
        packed.send(raw)
        return packed

    def _make(self, key: tuple[int, int]) -> StaticStep:
        b, length = key
        return StaticStep(self._fn(length), {}, packed=self._inputs(b), draws=True)  # pick_rows

    def _prefill_fn(self, q: int, length: int):
        """One row of ``q`` queries attending over its slot's first ``length`` positions.

        ``ints [4, q]``: token ids, positions, the slot each query's K/V is written to
        (the scratch slot for padding), and in row 3 the row's slot and its last real
        query's index; ``temps [1]`` the temperature its token is picked at."""
        model, cache = self.model, self.cache

        def fn(ints: Tensor, temps: Tensor) -> dict[str, Tensor]:
            ids, pos, write_slot = ints[0], ints[1], ints[2]
            slot, last = ints[3, :1], ints[3, 1:2]
            cos, sin = model._cos_sin(pos[None, :])  # [1, 1, q, D]
            keys = torch.arange(length, device=ints.device)
            plan = StepPlan(cos=cos, sin=sin,
                            mask=(keys[None, :] <= pos[:, None])[None, None],  # [1, 1, q, length]
                            kv_len=length, slot_index=slot,
                            write_b=torch.zeros_like(pos),
                            write_t=torch.arange(q, device=ints.device),
                            write_slot=write_slot, write_pos=pos)
            h = model.hidden(ids[None, :], plan, cache)
            logits = model.logits(h[0].index_select(0, last))
            return {"logits": logits, "picks": pick_rows(logits, temps)}

        return fn

    def _prefill_inputs(self, q: int) -> PackedInputs:
        """A prefill step's inputs in one buffer; here a row of padding only: token 0 at
        position 0 of the scratch slot, greedy."""
        packed = PackedInputs({"ints": ((4, q), torch.int64), "temps": ((1,), torch.float32)},
                              self.model.device)
        raw, views = packed.host()
        views["ints"][2] = self.scratch
        views["ints"][3, 0] = self.scratch
        packed.send(raw)
        return packed

    def _make_prefill(self, key: tuple[int, int]) -> StaticStep:
        q, length = key
        return StaticStep(self._prefill_fn(q, length), {}, packed=self._prefill_inputs(q),
                          draws=True)  # pick_rows

    # -- stepping ---------------------------------------------------------------------

    def bucket(self, n: int, need: int) -> tuple[int, int] | None:
        """The (batch, length) bucket of ``n`` rows attending over ``need`` positions."""
        b = bucket_for(n, self.batch_buckets)
        length = bucket_for(need, self.length_buckets)
        return None if b is None or length is None else (b, length)

    def forward(self, slots: Sequence[int], tokens: Sequence[Sequence[int]]) -> Tensor:
        """``forward_batch``'s step (logits of each row's last token; lengths advance) with
        the decode rows replayed from their graph (see :meth:`forward_picked`)."""
        return self.forward_picked(slots, tokens)[0]

    def forward_picked(self, slots: Sequence[int], tokens: Sequence[Sequence[int]],
                       temperatures: Sequence[float] | None = None) -> tuple[Tensor, Tensor]:
        """:meth:`forward`'s logits and each row's token picked at ``temperatures[i]``
        (default 0: greedy) on the device, ``[n]`` long. In a step that mixes decode rows
        with prompts, the prompts run apart (a prefill graph each, or one eager step): one
        eager step would pad every row to the longest prompt and gather every row's cache,
        so each arrival would stall all the streams already speaking (on an H200 serving 64
        sessions, LLM plans averaged 43-55 ms, against ~3.5 ms for a graphed decode step)."""
        temps = [0.0] * len(slots) if temperatures is None else list(temperatures)
        if len(temps) != len(slots):
            raise ValueError(f"{len(temps)} temperatures for {len(slots)} rows")
        decode = [i for i, toks in enumerate(tokens) if len(toks) == 1]
        if len(decode) == len(tokens):
            return self._step(slots, [toks[0] for toks in tokens], temps)
        if not decode:
            return self._prompts(slots, tokens, temps)
        prompt = [i for i, toks in enumerate(tokens) if len(toks) > 1]
        decoded, decoded_picks = self._step([slots[i] for i in decode],
                                            [tokens[i][0] for i in decode],
                                            [temps[i] for i in decode])
        prompted, prompted_picks = self._prompts([slots[i] for i in prompt],
                                                 [tokens[i] for i in prompt],
                                                 [temps[i] for i in prompt])
        dev = decoded.device
        logits = decoded.new_empty((len(slots), decoded.shape[-1]))
        picks = decoded_picks.new_empty(len(slots))
        rows = to_device(decode, torch.long, dev), to_device(prompt, torch.long, dev)
        logits[rows[0]], picks[rows[0]] = decoded, decoded_picks
        logits[rows[1]], picks[rows[1]] = prompted.to(decoded.dtype), prompted_picks
        return logits, picks

    def step(self, slots: Sequence[int], tokens: Sequence[int]) -> Tensor:
        """Feed ``tokens[i]`` to stream ``slots[i]``; float32 logits ``[n, V]`` of each, and
        each slot's length grows by one (as ``forward_batch`` with ``advance``)."""
        return self._step(slots, tokens, [0.0] * len(slots))[0]

    @torch.inference_mode()
    def _step(self, slots: Sequence[int], tokens: Sequence[int],
              temps: Sequence[float]) -> tuple[Tensor, Tensor]:
        cache = self.model.check_step(slots, [[t] for t in tokens])
        for slot in slots:
            if slot == self.scratch:
                raise ValueError(f"slot {slot} is the decode graphs' scratch slot")
        n = len(slots)
        key = self.bucket(n, max(cache.lengths[s] for s in slots) + 1)
        if key is None:
            self.eager_steps += 1
            logits = self.model.forward_batch(slots, [[t] for t in tokens])
            return logits, pick_rows(logits, to_device(list(temps), torch.float32, logits.device))
        step = self.steps.get(key)
        # written in numpy, sent in one copy: torch calls would each give up the GIL
        raw, views = step.packed.host()  # type: ignore[union-attr]
        ints = views["ints"]
        ints[0, :n] = tokens
        ints[1] = self.scratch
        ints[1, :n] = slots
        ints[2, :n] = [cache.lengths[s] for s in slots]
        views["temps"][:n] = temps
        step.packed.send(raw)  # type: ignore[union-attr]
        out = step()  # the buffers are the next replay's outputs: copied out
        logits, picks = out["logits"][:n].clone(), out["picks"][:n].clone()
        for slot in slots:
            cache.lengths[slot] += 1
            cache.written[slot] = cache.lengths[slot]
        self.graph_steps += 1
        return logits, picks

    def prompts(self, slots: Sequence[int], tokens: Sequence[Sequence[int]]) -> Tensor:
        """``forward_batch``'s step for prompt rows: one prefill replay (or chunks of
        replays) per row with prefill buckets, else one eager step for all of them."""
        return self._prompts(slots, tokens, [0.0] * len(slots))[0]

    def _prompts(self, slots: Sequence[int], tokens: Sequence[Sequence[int]],
                 temps: Sequence[float]) -> tuple[Tensor, Tensor]:
        if self.prefills is None:
            logits = self.model.forward_batch(slots, tokens)
            return logits, pick_rows(logits, to_device(list(temps), torch.float32, logits.device))
        self.model.check_step(slots, tokens)  # every row first: none is fed if one is bad
        rows = [self._prefill(slot, toks, temp)
                for slot, toks, temp in zip(slots, tokens, temps, strict=True)]
        if len(rows) == 1:
            return rows[0]
        return torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])

    def prefill(self, slot: int, tokens: Sequence[int]) -> Tensor:
        """Feed one stream's ``tokens`` from prefill graphs, in chunks of the largest query
        bucket; float32 logits ``[1, V]`` of the last token, and the slot's length grows
        by ``len(tokens)`` (as ``forward_batch`` with ``advance``)."""
        return self._prefill(slot, tokens, 0.0)[0]

    @torch.inference_mode()
    def _prefill(self, slot: int, tokens: Sequence[int], temp: float) -> tuple[Tensor, Tensor]:
        if self.prefills is None:
            raise RuntimeError("no prefill buckets: this decoder runs prompts eagerly")
        cache = self.model.check_step([slot], [tokens])
        if slot == self.scratch:
            raise ValueError(f"slot {slot} is the graphs' scratch slot")
        top = self.prefill_buckets[-1]
        for start in range(0, len(tokens), top):
            chunk = list(tokens[start:start + top])
            n, at = len(chunk), cache.lengths[slot]
            q = bucket_for(n, self.prefill_buckets)
            length = bucket_for(at + n, self.length_buckets)
            assert q is not None and length is not None  # chunks <= top; check_step: <= max_len
            step = self.prefills.get((q, length))
            raw, views = step.packed.host()  # type: ignore[union-attr]
            ints = views["ints"]
            ints[0, :n] = chunk
            ints[1, :n] = np.arange(at, at + n)
            ints[1, n:] = at + n - 1  # padding repeats the last real query's position
            ints[2] = self.scratch
            ints[2, :n] = slot
            ints[3, 0], ints[3, 1] = slot, n - 1
            last = start + top >= len(tokens)  # only the last chunk's pick is read
            views["temps"][0] = temp if last else 0.0
            step.packed.send(raw)  # type: ignore[union-attr]
            out = step()  # the buffers are the next replay's outputs: copied out
            logits, picks = out["logits"].clone(), out["picks"].clone()
            cache.lengths[slot] += n
            cache.written[slot] = cache.lengths[slot]
            self.prefill_steps += 1
        return logits, picks
