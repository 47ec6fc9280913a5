"""A stream's conversation as token segments, so the LLM cache is reused across turns.

Each message renders to its own token segment (ChatML concatenates messages), and an
assistant message produced by generation keeps the exact tokens the model sampled.
The prompt is the concatenation of the segments; the LLM stage compares it with what
its cache holds and only prefills the part after the longest common prefix. A new
user turn therefore costs only its own tokens, and an edit (delete, truncate) rolls
the cache back to the edit point instead of starting over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from voxline.engines.protocol import CONVERSATION_START, ImageInput
from voxline.errors import VoxlineError


@dataclass
class AudioSpan:
    """`text` was spoken by the audio from `start_ms` to `end_ms` of the item's audio."""

    start_ms: float
    end_ms: float
    text: str


@dataclass
class Item:
    item_id: str
    role: str
    text: str
    tokens: list[int]
    spans: list[AudioSpan] = field(default_factory=list)
    # a user message's images (a backend that reads them renders them into `tokens`);
    # held here, so they live exactly as long as the message
    images: tuple[ImageInput, ...] = ()

    @property
    def audio_ms(self) -> float:
        return self.spans[-1].end_ms if self.spans else 0.0


class ItemNotFound(VoxlineError):
    pass


class Conversation:
    """Ordered messages with their token segments. `render` gives the prompt tokens."""

    def __init__(self, render_message: Callable[..., list[int]]) -> None:
        self._render = render_message
        self.items: list[Item] = []

    def find(self, item_id: str) -> Item:
        for item in self.items:
            if item.item_id == item_id:
                return item
        raise ItemNotFound(f"no conversation item with id {item_id!r}")

    def has(self, item_id: str) -> bool:
        return any(item.item_id == item_id for item in self.items)

    def add(self, item_id: str, role: str, text: str, previous_item_id: str | None = None,
            images: tuple[ImageInput, ...] = ()) -> Item:
        """Insert a message after `previous_item_id`: None appends it, `CONVERSATION_START`
        puts it first. An anchor this conversation does not hold (a session item the engine
        never got, such as a reply cancelled before its first token) appends it, so no
        message is lost. The prompt then differs from the cache only from the insertion on.
        `images` go to the renderer (only a backend that reads images takes them)."""
        tokens = self._render(role, text, images) if images else self._render(role, text)
        item = Item(item_id, role, text, tokens, images=images)
        if previous_item_id == CONVERSATION_START:
            self.items.insert(0, item)
        elif previous_item_id is None or not self.has(previous_item_id):
            self.items.append(item)
        else:
            self.items.insert(self.items.index(self.find(previous_item_id)) + 1, item)
        return item

    def add_generated(self, item_id: str, header: list[int], generated: list[int], text: str,
                      footer: list[int], spans: list[AudioSpan]) -> Item:
        """An assistant message whose tokens are exactly what the model sampled."""
        item = Item(item_id, "assistant", text, header + generated + footer, list(spans))
        self.items.append(item)
        return item

    def delete(self, item_id: str) -> None:
        self.items.remove(self.find(item_id))

    def set_text(self, item_id: str, text: str) -> Item:
        item = self.find(item_id)
        item.text = text
        item.tokens = self._render(item.role, text, item.images) if item.images \
            else self._render(item.role, text)
        return item

    def render(self, system: list[int], budget: int | None = None) -> list[int]:
        """System tokens + messages. With `budget`, only the newest messages that fit
        (OpenAI's `truncation: auto`): older ones stay in the conversation, unread."""
        items = self.items
        if budget is not None:
            total, start = len(system), len(items)
            while start > 0 and total + len(items[start - 1].tokens) <= budget:
                start -= 1
                total += len(items[start].tokens)
            items = items[start:]
        out = list(system)
        for item in items:
            out.extend(item.tokens)
        return out


def cut_spans(spans: list[AudioSpan], audio_end_ms: float) -> list[AudioSpan]:
    """The spans of an item truncated at `audio_end_ms`: whole spans that ended in time,
    plus the span playing at the cut, shortened to end there and holding only the words
    heard. The item's audio then ends exactly at the cut, so a later truncate at or before
    it still finds the audio it refers to."""
    out: list[AudioSpan] = []
    for span in spans:
        if span.end_ms <= audio_end_ms:
            out.append(span)
            continue
        if span.start_ms < audio_end_ms:
            out.append(AudioSpan(span.start_ms, audio_end_ms,
                                 heard_text([span], audio_end_ms)))
        break
    return out


def heard_text(spans: list[AudioSpan], audio_end_ms: float) -> str:
    """The part of a spoken reply that played before `audio_end_ms`.

    Whole spans that ended in time are kept; the span playing at the cut is kept in
    proportion to how much of it played, rounded down to a word boundary.
    """
    parts: list[str] = []
    for span in spans:
        if span.end_ms <= audio_end_ms:
            parts.append(span.text)
            continue
        if span.start_ms < audio_end_ms:
            frac = (audio_end_ms - span.start_ms) / max(span.end_ms - span.start_ms, 1e-9)
            cut = int(len(span.text) * frac)
            partial = span.text[:cut]
            if cut < len(span.text) and not span.text[cut:cut + 1].isspace():
                partial = partial.rsplit(" ", 1)[0] if " " in partial else ""
            if partial.strip():
                parts.append(partial.rstrip())
        break
    return " ".join(p.strip() for p in parts if p.strip())
