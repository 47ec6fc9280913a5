"""An LRU cache of prompt embeddings, so a repeated prompt skips the text encoder (UMT5).

Keyed on everything the embeddings depend on: the prompt, the negative prompt (None when
guidance is off, since it is then never encoded), the padded sequence length and the
encoder's device and dtype. Values are the tensors the transformer reads, never mutated.
Used from the video worker thread only.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, NamedTuple


class PromptKey(NamedTuple):
    prompt: str
    negative_prompt: str | None
    max_sequence_length: int
    encoder: str  # device and dtype of the embeddings


class PromptCache:
    """At most `capacity` entries; the least recently used goes first."""

    def __init__(self, capacity: int = 32) -> None:
        if capacity < 0:
            raise ValueError(f"prompt cache capacity {capacity} is negative")
        self.capacity = capacity
        self._entries: OrderedDict[PromptKey, Any] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: PromptKey) -> Any | None:
        value = self._entries.get(key)
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return value

    def clear(self) -> None:
        self._entries.clear()

    def put(self, key: PromptKey, value: Any) -> None:
        if self.capacity == 0:
            return
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
