"""`ChatLLM`: our Llama + its tokenizer, as the chat model the engine's LLM stage drives.

Messages are rendered one at a time with the tokenizer's own chat template, by
difference: render([anchor, message]) minus render([anchor]). That keeps each message
an independent token segment (so a conversation's cache can be reused turn after turn)
and still follows whatever template the checkpoint ships.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from voxline.engines.models.sampling import sample

from .checkpoint import LoadedLLM, stop_token_ids
from .graphs import PREFILL_BUCKETS, GraphedLlamaDecoder
from .model import LlamaModel

logger = logging.getLogger(__name__)

_ANCHOR = [{"role": "system", "content": "A"}]
SHARED_PREFIXES = 8  # system prompts whose K/V are kept for new streams (a few MB each)
_PROBE = "\x00probe\x00"


class ChatLLM:
    """Slot allocation, cache edits, batched forward, sampling and the chat format."""

    def __init__(self, loaded: LoadedLLM, max_slots: int = 8, max_len: int = 2048,
                 cuda_graphs: bool | None = None, prefill_graphs: bool = True) -> None:
        """``cuda_graphs`` (default: whether the model is on CUDA) replays decode steps as
        CUDA graphs (:mod:`~voxline.engines.models.llama.graphs`), captured here, and with
        ``prefill_graphs`` prompts too (one row at a time); without ``cuda_graphs`` every
        step runs eagerly."""
        self.model: LlamaModel = loaded.model
        self.tokenizer: Any = loaded.tokenizer
        limit = int(getattr(loaded.config, "max_position_embeddings", max_len) or max_len)
        self.max_len = min(max_len, limit)
        graphs = self.model.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        # One slot more for the graphs' padding rows; streams never get it.
        self.cache = self.model.allocate_cache(max_slots + int(graphs), self.max_len)
        self.decoder: GraphedLlamaDecoder | None = None
        if graphs:
            self.decoder = GraphedLlamaDecoder(
                self.model, max_streams=max_slots, capture=True,
                prefill_buckets=PREFILL_BUCKETS if prefill_graphs else ())
            self.decoder.prepare()
            if not prefill_graphs:
                logger.info("LLM prompts run eagerly (no prefill graphs)")
        # K/V of prompt prefixes every stream starts with (system prompts), newest last
        self._prefixes: OrderedDict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = (
            OrderedDict())
        self.eos_token_ids = frozenset(stop_token_ids(self.tokenizer, loaded.config))
        # the most characters one token can cover (a vocabulary entry is at least as long
        # as its text): lets the engine refuse megabytes of instructions untokenized
        self.max_token_chars = max(map(len, self.tokenizer.get_vocab()), default=1)
        self._free = list(range(max_slots))
        base = self._template(_ANCHOR)
        with_gen = self._template(_ANCHOR, add_generation_prompt=True)
        self._header = self._encode(with_gen[len(base):])
        segment = self._segment_text("assistant", _PROBE)
        self._footer = self._encode(segment[segment.index(_PROBE) + len(_PROBE):])

    def _template(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def _segment_text(self, role: str, text: str) -> str:
        base = self._template(_ANCHOR)
        full = self._template(_ANCHOR + [{"role": role, "content": text}])
        if not full.startswith(base):
            raise ValueError("the chat template does not render messages independently")
        return full[len(base):]

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # -- chat format ----------------------------------------------------------------

    def render_message(self, role: str, text: str) -> list[int]:
        return self._encode(self._segment_text(role, text))

    def generation_header(self) -> list[int]:
        return list(self._header)

    def message_footer(self) -> list[int]:
        return list(self._footer)

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    # -- slots and steps ------------------------------------------------------------

    def alloc_slot(self) -> int | None:
        if not self._free:
            return None
        slot = self._free.pop(0)
        self.cache.reset(slot)
        return slot

    @property
    def device(self) -> torch.device:
        return self.model.device

    def free_slot(self, slot: int) -> None:
        self.cache.reset(slot)
        self._free.append(slot)

    def truncate(self, slot: int, length: int) -> None:
        self.cache.truncate(slot, min(length, self.cache.lengths[slot]))

    def save_prefix(self, slot: int, tokens: list[int]) -> None:
        key = tuple(tokens)
        if key in self._prefixes:
            self._prefixes.move_to_end(key)
            return
        self._prefixes[key] = self.cache.export_prefix(slot, len(tokens))
        while len(self._prefixes) > SHARED_PREFIXES:
            self._prefixes.popitem(last=False)

    def load_prefix(self, slot: int, target: list[int]) -> int:
        best = max((k for k in self._prefixes if tuple(target[:len(k)]) == k), key=len,
                   default=None)
        if best is None:
            return 0
        self._prefixes.move_to_end(best)
        return self.cache.import_prefix(slot, self._prefixes[best])

    def forward(self, slots: list[int], tokens: list[list[int]]) -> torch.Tensor:
        if self.decoder is not None:
            return self.decoder.forward(slots, tokens)
        return self.model.forward_batch(slots, tokens)

    def sample(self, logits: torch.Tensor, temperatures: Sequence[float],
               generators: Sequence[torch.Generator | None]) -> list[int]:
        return sample(logits, temperatures, generators=generators).tolist()

    def forward_and_pick(self, slots: list[int], tokens: list[list[int]],
                         temperatures: Sequence[float],
                         generators: Sequence[torch.Generator | None]) -> tuple[torch.Tensor, list[int]]:
        """:meth:`forward`, and each row's token at ``temperatures[i]`` with
        ``generators[i]`` (as :meth:`sample`). With CUDA graphs the unseeded rows' tokens
        are picked inside the step's graphs and read in one go; seeded rows draw from
        their own generators here, from the logits."""
        if self.decoder is None:
            logits = self.forward(slots, tokens)
            return logits, self.sample(logits, temperatures, generators)
        seeded = [i for i, (t, g) in enumerate(zip(temperatures, generators, strict=True))
                  if g is not None and t > 0]
        in_graph = list(temperatures)
        for i in seeded:  # greedy in the graph, their pick replaced below
            in_graph[i] = 0.0
        logits, picks = self.decoder.forward_picked(slots, tokens, in_graph)
        out = picks.tolist()
        if seeded:
            own = self.sample(logits[seeded], [temperatures[i] for i in seeded],
                              [generators[i] for i in seeded])
            for i, tok in zip(seeded, own, strict=True):
                out[i] = tok
        return logits, out
