"""Warm prefill: the user's turn is prefilled into its stream's KV slot while they speak.

Each partial transcript of a turn (`Turns.on_transcript`) may start a *tentative* LLM
request (`GenerationRequest.tentative`) over the prompt a reply to the turn so far would
read: the conversation, the partial text as the user message, the generation header. Its
K/V go into the stream's slot and the logits after its last token are kept there
(`Slot.kept`); nothing is sampled or sent, and the conversation is not touched (the user
message exists only in the request's tokens). When the reply (or its speculation)
starts, its request finds those tokens in the slot: the longest common prefix is kept and
only the words that changed since the partial are computed (the one rule of
`LLMStage.schedule`), so at the pause only the last words are new; where none changed
(the pause transcript is the partial) the first token is sampled from the kept logits
without running the model.

Spare capacity only: a partial starts one only for a stream that answers its turns
(`auto_response`), with no response of its own and no final transcript pending, while
fewer than `max_responses` are in progress; the LLM scheduler then runs it only in a step
no other request wants, in small chunks.

Tentative until a reply adopts it: the slot length before a turn's first warm prefill is
kept (`before`). A reply that starts adopts the warm tokens, and a speculation records
`before` as what its slot held before it ran, so discarding the speculation undoes the
warm prefill too. Discarded (the turn's audio cleared), the slot is rolled back to
`before`: the KV cache and the conversation are as if it never ran. A later partial
replaces the warm prefill in place (the differing tail is recomputed, `before` stays).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from voxline.engines import protocol as p
from voxline.engines.conversation import Conversation
from voxline.engines.llm_stage import ChatModel, GenerationRequest, LLMStage, Slot
from voxline.engines.streams import StreamState

logger = logging.getLogger(__name__)


class Replies(Protocol):
    """What a warm prefill asks of the responses (`Responses` is one)."""

    def busy(self, stream: StreamState) -> bool: ...

    def in_progress(self) -> int: ...

    def prompt_frame(self, stream: StreamState, cfg: p.ResponseConfig,
                     report: bool = False) -> tuple[list[int], int, list[int]] | None: ...


@dataclass
class _Warm:
    request: GenerationRequest
    before: int  # the slot's tokens before the turn's first warm prefill


class WarmPrefills:
    """The warm prefill of every stream (at most one each); see the module docstring."""

    def __init__(self, model: ChatModel, llm: LLMStage, responses: Replies,
                 max_responses: int) -> None:
        self.model = model
        self.llm = llm
        self.responses = responses
        self.max_responses = max_responses
        self._warm: dict[int, _Warm] = {}
        self._count = 0

    def partial(self, stream: StreamState, item_id: str, text: str) -> None:
        """The turn `item_id` so far reads `text`: prefill a reply's prompt to it, if idle."""
        cfg = stream.config.auto_response
        if (cfg is None or not text or self.responses.busy(stream) or stream.pending_finals
                or self.responses.in_progress() >= self.max_responses
                or stream.conversation.has(item_id)):
            return
        prompt = self._prompt(stream, item_id, text)
        if prompt is None:
            return
        target, shared = prompt
        if stream.slot is None:
            index = self.model.alloc_slot()
            if index is None:
                return  # no free slot: the reply will ask for one itself
            stream.slot = Slot(index)
        old = self._warm.pop(stream.internal_id, None)
        before = len(stream.slot.tokens)
        if old is not None:
            self.llm.end_tentative(old.request.request_id)
            before = old.before
        self._count += 1
        request = GenerationRequest(
            request_id=f"{stream.internal_id}/warm{self._count}", slot=stream.slot,
            prompt=lambda: target, max_tokens=0, stream_id=stream.internal_id,
            shared_prefix=shared, tentative=True)
        self._warm[stream.internal_id] = _Warm(request, before)
        self.llm.add(request)
        logger.debug("warm prefill of stream %s: %d prompt tokens", stream.external_id,
                     len(target))

    def _prompt(self, stream: StreamState, item_id: str,
                text: str) -> tuple[list[int], int] | None:
        """The tokens a reply to `text` as the next user message would read, and how
        many of them are the system prompt (None: they do not fit)."""
        cfg = stream.config.auto_response
        assert cfg is not None
        frame = self.responses.prompt_frame(stream, cfg)
        if frame is None:
            return None
        system, budget, header = frame
        view = Conversation(self.model.render_message)
        view.items = list(stream.conversation.items)
        view.add(item_id, "user", text)
        window = stream.window
        dropped = set(window.dropped)  # the reply makes its own retention cut
        tokens = window.prompt(view, system, budget - len(system), stream.config.truncation)
        window.dropped = dropped
        target = tokens + header
        return (target, len(system)) if len(target) + 1 <= self.model.max_len else None

    def adopt(self, stream: StreamState) -> int | None:
        """A reply starts on the stream: it takes over the warm tokens. Returns the slot's
        length before the warm prefill (None: none ran)."""
        warm = self._warm.pop(stream.internal_id, None)
        if warm is None:
            return None
        self.llm.end_tentative(warm.request.request_id)
        return warm.before

    def discard(self, stream: StreamState) -> None:
        """Undo the stream's warm prefill: its slot as if it never ran."""
        warm = self._warm.pop(stream.internal_id, None)
        if warm is not None:
            self.llm.abort(warm.request.request_id)
            if stream.slot is not None:
                self.llm.roll_back(stream.slot, warm.before)

    def closed(self, stream: StreamState) -> None:
        """The stream is closing: its warm prefill stops (its slot is freed anyway)."""
        warm = self._warm.pop(stream.internal_id, None)
        if warm is not None:
            self.llm.abort(warm.request.request_id)
