"""Truncation: an assistant item cut to what its listener heard (barge-in).

The session validated the request against the audio it sent; here the item's own audio
length is the bound, and a cut past it (a second truncate after an earlier, shorter one)
keeps the item as it is rather than failing. The item keeps the audio spans up to the
cut and the words they spoke; a changed text re-reads the conversation, so the next
reply's prompt holds what was heard, not what was generated.
"""

from __future__ import annotations

from collections.abc import Callable

from voxline.engines import protocol as p
from voxline.engines.conversation import ItemNotFound, cut_spans
from voxline.engines.response_run import ResponseBook
from voxline.engines.streams import StreamState


def truncate_to_heard(stream: StreamState, msg: p.TruncateItem, book: ResponseBook,
                      conversation_changed: Callable[[StreamState], None]) -> None:
    """Cut the item `msg` names to its first `audio_end_ms` (clamped to its length) and
    answer with `TruncationApplied`; an error for an item that is not the assistant's."""
    try:
        item = stream.conversation.find(msg.item_id)
    except ItemNotFound:
        # a reply cancelled before its first token never joined the conversation:
        # nothing was said, so nothing is left to cut
        book.emit(p.TruncationApplied(stream.external_id, msg.item_id, 0, ""))
        return
    if item.role != "assistant":
        book.error(stream, f"truncate: item {msg.item_id!r} is a {item.role} message; "
                   "only assistant audio can be truncated", p.ErrorCode.INVALID_VALUE)
        return
    end_ms = min(msg.audio_end_ms, int(item.audio_ms))
    spans = cut_spans(item.spans, end_ms)
    text = " ".join(s.text.strip() for s in spans if s.text.strip())
    if text != item.text:
        conversation_changed(stream)
        item = stream.conversation.set_text(msg.item_id, text)
    item.spans = spans
    book.emit(p.TruncationApplied(stream.external_id, msg.item_id, end_ms, text))
