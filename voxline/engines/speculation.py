"""Speculative replies: a response started from the transcript of a pause in the user's
turn, before the turn has ended.

It runs the LLM and speaks its first segment, but everything it would send is held
(`ResponseBook.send`). When the caller then asks for exactly that response (the
stream's `auto_response`), it is committed: the held text and audio go out at once
under the caller's ids and the response goes on as any other. Anything else (speech
resumes, the conversation changes, another response is asked for) discards it: the
tentative user item leaves the conversation and the KV slot is rolled back to the
tokens it held before, as if the speculation had never run.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from voxline.engines import protocol as p
from voxline.engines.llm_stage import LLMStage
from voxline.engines.remote_llm import RemoteLLMStage
from voxline.engines.reply_prompt import ReplyPrompts
from voxline.engines.response_run import ResponseBook, ResponseRun, Speculative
from voxline.engines.streams import StreamState
from voxline.engines.trace import trace
from voxline.engines.warm_prefill import WarmPrefills


class Speculations:
    """Starts, commits and discards speculative runs in `book`.

    `stop(run)` stops a run's LLM request and speech; `finish_if_done(stream)` ends the
    stream's response once all of it is out (a committed one may already be).
    """

    def __init__(self, book: ResponseBook, llm: LLMStage | RemoteLLMStage,
                 prompts: ReplyPrompts, stop: Callable[[ResponseRun], None],
                 finish_if_done: Callable[[StreamState], None]) -> None:
        self.book = book
        self.llm = llm
        self.prompts = prompts
        self._stop = stop
        self._finish_if_done = finish_if_done
        self.warm: WarmPrefills | None = None  # prefills turns while they are spoken
        # A speculation speaks its first segment inside the silence window, so the first
        # words' audio is ready when the turn is committed (False: text only, a benchmark's
        # comparison).
        self.speaks = True

    def speculate(self, stream: StreamState, item_id: str, text: str) -> bool:
        """Start the stream's `auto_response` to the user's turn so far (`text`, the turn
        `item_id` paused on), holding its output; nothing if a response is under way.
        Whether one started."""
        sid = stream.internal_id
        cfg = stream.config.auto_response
        if (cfg is None or not text or sid in self.book.runs or sid in self.book.deferred
                or stream.pending_finals or stream.conversation.has(item_id)
                or stream.config.tools or cfg.tools):  # a function call is not held back
            return False
        before = len(stream.slot.tokens) if stream.slot is not None else 0
        warm = self.warm.adopt(stream) if self.warm is not None else None
        before = before if warm is None else warm  # discarded, it undoes the warm prefill
        stream.conversation.add(item_id, "user", text)
        run = self.prompts.new_run(stream, cfg, "", "")
        if run is None:
            stream.conversation.delete(item_id)
            return False
        run.key = f"speculation-{stream.responses}"
        run.speculative = Speculative(item_id, before, dropped=frozenset(stream.window.dropped),
                                      speaks=self.speaks)
        self.book.runs[sid] = run
        assert run.request is not None
        self.llm.add(run.request)
        trace(stream.internal_id, "speculation_started")
        self.book.emit(p.Speculation(stream.external_id, p.SpeculationOutcome.STARTED))
        return True

    def turn_ended(self, stream: StreamState, item_id: str) -> None:
        """The user turn `item_id` is final: a speculation no longer owns its user item."""
        run = self.book.runs.get(stream.internal_id)
        if run is not None and run.speculative is not None and run.speculative.user_item == item_id:
            run.speculative.user_item = None

    def commit(self, stream: StreamState, run: ResponseRun, msg: p.CreateResponse) -> None:
        """The caller asked for the speculated response: release what it holds."""
        spec = run.speculative
        assert spec is not None
        run.speculative = None
        trace(stream.internal_id, "commit", held=len(spec.held))
        run.response_id, run.item_id = msg.response_id, msg.item_id
        self.book.emit(p.Speculation(stream.external_id, p.SpeculationOutcome.COMMITTED))
        for out in spec.held:
            if isinstance(out, p.ReplyTextDelta | p.AudioChunk):
                out = msgspec.structs.replace(out, response_id=msg.response_id)
            self.book.emit(out)
        self._finish_if_done(stream)

    def discard(self, stream: StreamState) -> None:
        """Drop the stream's speculative response, if any, leaving no trace of it."""
        run = self.book.runs.get(stream.internal_id)
        if run is None or run.speculative is None:
            return
        spec = run.speculative
        trace(stream.internal_id, "speculation_discarded")
        del self.book.runs[stream.internal_id]
        self._stop(run)
        if spec.user_item is not None and stream.conversation.has(spec.user_item):
            stream.conversation.delete(spec.user_item)
        if stream.slot is not None:
            self.llm.roll_back(stream.slot, spec.slot_tokens)
        stream.window.dropped = set(spec.dropped)  # a cut it made never happened
        self.book.emit(p.Speculation(stream.external_id, p.SpeculationOutcome.DISCARDED))
