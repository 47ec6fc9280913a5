"""Batched autoregressive codec-frame generation over per-stream talker slots.

:class:`TalkerGenerator` owns the talker's slot cache. Each :meth:`~TalkerGenerator.step`
advances every given stream by one frame, batched: streams with a sampled first code
get their frame completed by the code predictor (one batched run) and emitted; then one
talker forward feeds new prompts (prefill) and the just-completed frames (decode) and
samples each stream's next first code. A stream stops when its first code is the codec
EOS (that code never becomes a frame) or after ``max_frames`` frames.

First-code logits are processed as the reference's ``generate`` does: repetition
penalty over the stream's previous first codes, EOS masked until ``min_frames`` codes
were drawn, the top 1024 ids of the codec vocabulary (control tokens) suppressed except
EOS; then greedy (temperature 0) or temperature / top-k / top-p sampling. Every random
draw of a stream comes from its own generator (seeded by ``seed``), so a seeded stream
gives the same frames whatever else shares its batch.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from voxline.engines.models.sampling import sample

from .prompt import TalkerPrompt
from .talker import Talker

__all__ = ["FinishReason", "TalkerFrame", "TalkerGenerator", "TalkerSampling", "TalkerStream",
           "awaits_text"]

# The reference suppresses the last 1024 ids of the talker vocabulary (control tokens).
_CONTROL_TOKENS = 1024


@dataclass(frozen=True)
class TalkerSampling:
    """Per-stream decoding settings (defaults: the published generation config)."""

    temperature: float = 0.9  # 0 = greedy
    top_k: int = 50  # 0 = off
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_temperature: float = 0.9  # code predictor; 0 = greedy
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    min_frames: int = 2  # EOS is masked for the first `min_frames` first-code draws
    max_frames: int = 4096
    seed: int | None = None

    @classmethod
    def greedy(cls, **overrides) -> TalkerSampling:
        return cls(**{"temperature": 0.0, "subtalker_temperature": 0.0, **overrides})


class FinishReason(enum.IntEnum):
    EOS = 1  # the talker chose the codec end-of-speech token
    LENGTH = 2  # max_frames reached, or the slot's cache is full


@dataclass(eq=False)
class TalkerStream:
    """One utterance being generated; owned by a :class:`TalkerGenerator`."""

    stream_id: Hashable
    slot: int
    prompt: TalkerPrompt
    params: TalkerSampling
    generator: torch.Generator
    history: list[int] = field(default_factory=list)  # first codes drawn so far
    hidden: Tensor | None = None  # talker state at the last fed position [D]
    pending: int | None = None  # drawn first code not yet completed into a frame
    frames: int = 0
    finish: FinishReason | None = None

    @property
    def finished(self) -> bool:
        return self.finish is not None


@dataclass
class TalkerFrame:
    """A step's result for one stream: a frame ``[G]`` (long, on the talker's device, so
    it can go to the codec decoder without a host copy), and/or the end."""

    stream: TalkerStream
    frame: Tensor | None
    finish: FinishReason | None


def triage(streams: Sequence[TalkerStream], eos: int
           ) -> tuple[list[TalkerStream], dict[int, TalkerFrame], list[TalkerStream]]:
    """A step's start, shared by the eager and the graphed generators: the unfinished
    streams, the EOS frames of those whose pending code was EOS (now finished), and those
    whose pending code completes a frame this step."""
    live = [s for s in streams if not s.finished]
    results: dict[int, TalkerFrame] = {}
    completing = []
    for s in live:
        if s.pending is None:
            continue
        if s.pending == eos:
            s.finish = FinishReason.EOS
            results[id(s)] = TalkerFrame(s, None, s.finish)
        else:
            completing.append(s)
    return live, results, completing


def record_frame(stream: TalkerStream, frame: Tensor) -> TalkerFrame:
    """Count the stream's completed frame (finishing it at its frame limit); the step's
    output for it. Shared by the eager and the graphed generators."""
    stream.frames += 1
    stream.pending = None
    if stream.frames >= stream.params.max_frames:
        stream.finish = FinishReason.LENGTH
    return TalkerFrame(stream, frame, stream.finish)


def awaits_text(stream: TalkerStream, eos: int) -> bool:
    """The stream's next step would feed a frame whose text has not arrived yet
    (streaming text input, :meth:`TalkerPrompt.has_text_for`): hold it back until it has.
    A prefill, a pending EOS, or the frame that reaches ``max_frames`` needs none."""
    if stream.finished or stream.hidden is None or stream.pending in (None, eos):
        return False
    if stream.frames + 1 >= stream.params.max_frames:
        return False
    return not stream.prompt.has_text_for(stream.frames)


class TalkerGenerator:
    """Steps many talker streams together over a slot cache allocated once."""

    def __init__(self, talker: Talker, *, max_streams: int, max_len: int) -> None:
        self.talker = talker
        self.cache = talker.allocate_cache(max_streams, max_len)
        self._free = list(range(max_streams - 1, -1, -1))
        cfg = talker.config
        self.eos = cfg.codec_eos_token_id
        suppress = torch.zeros(cfg.vocab_size, dtype=torch.bool, device=talker.device)
        suppress[max(0, cfg.vocab_size - _CONTROL_TOKENS) :] = True
        suppress[self.eos] = False
        self._suppress = suppress

    # -- stream lifecycle ------------------------------------------------------------

    def start(
        self, prompt: TalkerPrompt, params: TalkerSampling, stream_id: Hashable = None
    ) -> TalkerStream:
        """Reserve a slot for a new stream; its prompt is prefilled by the next step."""
        if params.max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {params.max_frames}")
        if not self._free:
            raise RuntimeError(f"all {self.cache.max_slots} talker slots are in use")
        if prompt.embeds.shape[0] >= self.cache.max_len:
            raise ValueError(
                f"prompt of {prompt.embeds.shape[0]} positions does not fit max_len {self.cache.max_len}"
            )
        gen = torch.Generator(device=self.talker.device)
        if params.seed is None:
            gen.seed()
        else:
            gen.manual_seed(params.seed)
        slot = self._free.pop()
        self.cache.reset(slot)
        return TalkerStream(stream_id, slot, prompt, params, gen)

    def release(self, stream: TalkerStream) -> None:
        """Free the stream's slot (finished or aborted); the stream must not step again."""
        if stream.slot < 0:
            return
        self.cache.reset(stream.slot)
        self._free.append(stream.slot)
        stream.slot = -1
        if stream.finish is None:
            stream.finish = FinishReason.LENGTH

    # -- stepping --------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, streams: Sequence[TalkerStream]) -> list[TalkerFrame]:
        """Advance each unfinished stream by one frame; one result per unfinished stream."""
        live, results, completing = triage(streams, self.eos)

        frames = None
        if completing:
            hidden = torch.stack([s.hidden for s in completing])
            first = torch.tensor([s.pending for s in completing], device=self.talker.device)
            frames = self.talker.complete_frames(hidden, first, self._code_picker(completing))
            for i, s in enumerate(completing):
                results[id(s)] = record_frame(s, frames[i])

        feed: list[TalkerStream] = []
        embeds: list[Tensor] = []
        new = [s for s in live if s.hidden is None]
        for s in new:
            feed.append(s)
            embeds.append(s.prompt.embeds)
        if frames is not None:
            rows = [i for i, s in enumerate(completing) if not s.finished]
            if rows:
                inputs = self.talker.embed_frames(frames[rows])
                for j, i in enumerate(rows):
                    s = completing[i]
                    if self.cache.lengths[s.slot] + 1 > self.cache.max_len:
                        s.finish = FinishReason.LENGTH
                        results[id(s)].finish = s.finish
                        continue
                    feed.append(s)
                    embeds.append((inputs[j] + s.prompt.text_for_frame(s.frames - 1))[None])
        if feed:
            hidden, logits = self.talker.forward_batch([s.slot for s in feed], embeds)
            codes = self._pick_first(feed, logits).tolist()
            for s, h, code in zip(feed, hidden, codes, strict=True):
                s.hidden = h
                s.pending = code
                s.history.append(code)
        return [results[id(s)] for s in live if id(s) in results]

    def generate(
        self, prompts: Sequence[TalkerPrompt], params: TalkerSampling | Sequence[TalkerSampling]
    ) -> list[Tensor]:
        """Run prompts to completion together; returns each stream's frames ``[T, G]`` (CPU)."""
        plist = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        streams = [self.start(p, sp, i) for i, (p, sp) in enumerate(zip(prompts, plist, strict=True))]
        out: list[list[Tensor]] = [[] for _ in prompts]
        try:
            while not all(s.finished for s in streams):
                for r in self.step(streams):
                    if r.frame is not None:
                        out[r.stream.stream_id].append(r.frame)
        finally:
            for s in streams:
                self.release(s)
        g = self.talker.num_code_groups
        return [torch.stack(f).cpu() if f else torch.zeros(0, g, dtype=torch.long) for f in out]

    # -- sampling --------------------------------------------------------------------

    def _pick_first(self, streams: Sequence[TalkerStream], logits: Tensor) -> Tensor:
        logits = logits.clone()
        for i, s in enumerate(streams):
            penalty = s.params.repetition_penalty
            if penalty != 1.0 and s.history:
                idx = torch.tensor(s.history, device=logits.device)
                scores = logits[i].gather(0, idx)
                scores = torch.where(scores < 0, scores * penalty, scores / penalty)
                logits[i].scatter_(0, idx, scores)
            if len(s.history) < s.params.min_frames:
                logits[i, self.eos] = float("-inf")
        logits.masked_fill_(self._suppress, float("-inf"))
        return sample(
            logits,
            [s.params.temperature for s in streams],
            top_k=[s.params.top_k for s in streams],
            top_p=[s.params.top_p for s in streams],
            generators=[s.generator for s in streams],
        )

    @staticmethod
    def _code_picker(streams: Sequence[TalkerStream]):
        temps = [s.params.subtalker_temperature for s in streams]
        top_k = [s.params.subtalker_top_k for s in streams]
        top_p = [s.params.subtalker_top_p for s in streams]
        gens = [s.generator for s in streams]

        def pick(logits: Tensor, codebook: int) -> Tensor:
            return sample(logits, temps, top_k=top_k, top_p=top_p, generators=gens)

        return pick
