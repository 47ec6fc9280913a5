"""Which of a stream's conversation messages the reply model reads (OpenAI's `truncation`).

A conversation can outgrow the model's context. The limit on the messages' tokens is
what the response leaves them (the context less the system prompt, the generation
header and the reply's room), or `Truncation.post_instructions` if that is smaller.

- ``auto`` (no retention ratio): the newest messages that fit under the limit, chosen
  again for every prompt. Past the limit every new turn moves the window, so the
  prompt's start changes each time and the KV cache is re-filled each turn.
- ``retention_ratio`` r: when the messages would pass the limit, the oldest are dropped
  in one cut until they use at most r of it. The cut is remembered: later turns append
  to the same prefix (the cache keeps hitting) until the limit is reached again.

Dropped messages stay in the conversation (the session still lists them); they are only
left out of the prompt. The newest message is never dropped: if it alone passes the
limit, the prompt overflows and the response fails as too long for the context. A
discarded speculative reply puts the cut back as it found it (`Responses`).
"""

from __future__ import annotations

from voxline.engines import protocol as p
from voxline.engines.conversation import Conversation, Item


class ContextWindow:
    """One stream's record of the retention cut: the ids left out of the prompt."""

    def __init__(self) -> None:
        self.dropped: set[str] = set()

    def prompt(self, conversation: Conversation, system: list[int], limit: int,
               truncation: p.Truncation) -> list[int]:
        """System tokens + the messages the reply reads, their tokens at most `limit`."""
        if truncation.post_instructions is not None:
            limit = min(limit, truncation.post_instructions)
        if truncation.retention_ratio is None:
            return conversation.render(system, len(system) + limit)
        out = list(system)
        for item in self._retained(conversation.items, limit, truncation.retention_ratio):
            out.extend(item.tokens)
        return out

    def _retained(self, items: list[Item], limit: int, ratio: float) -> list[Item]:
        kept = [item for item in items if item.item_id not in self.dropped]
        total = sum(len(item.tokens) for item in kept)
        if total <= limit:
            return kept
        cut = 0  # one cut, down to the ratio; the newest message always stays
        while total > ratio * limit and cut < len(kept) - 1:
            total -= len(kept[cut].tokens)
            cut += 1
        present = {item.item_id for item in items}
        self.dropped = {i for i in self.dropped if i in present}  # forget deleted items
        self.dropped.update(item.item_id for item in kept[:cut])
        return kept[cut:]
