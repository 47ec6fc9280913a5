"""The response lifecycle, in one home: start, stream text, cancel, truncate, done; each
concern in its own unit, which `Responses` composes and the engine core calls through.

A response is one `ResponseRun` on a stream (`response_run`): an LLM `GenerationRequest`
(none for `Speak`), a text chunker that closes speakable segments as text arrives, and
the segments waiting for (or being spoken by) the TTS stage. It ends with exactly one
`ResponseFinished`, when the LLM has finished and the last segment has been spoken, or
at once when cancelled; after that nothing of it is sent. A reply that produced tokens
joins the conversation with the exact tokens sampled and the audio spans that spoke
them, which is what `truncate` cuts.

The units, each readable and testable alone:
- `reply_prompt.ReplyPrompts`: a reply's prompt and generation request;
- `speculation.Speculations`: replies started inside the user's pause, held, then
  committed or discarded without a trace;
- `reply_speech.ReplySpeech`: segments to the TTS stage, audio back (the TTS row);
- `speech_pacing.PlayoutPacing`: flow control, a bounded lead ahead of playout;
  `speech_pacing.VoiceReserve`: whether a reply is short of unplayed audio (video waits);
- `truncation.truncate_to_heard`: an item cut to what its listener heard.
`Responses` keeps the lifecycle itself and the LLM row of the stage table.
"""

from __future__ import annotations

from collections.abc import Callable

from voxline.engines import protocol as p
from voxline.engines.llm_stage import ChatModel, FinishReason, GenerationRequest, LLMStage, StepPlan
from voxline.engines.remote_llm import RemoteLLMStage, RemotePlan
from voxline.engines.reply_prompt import ReplyPrompts
from voxline.engines.reply_speech import ReplySpeech
from voxline.engines.response_run import (
    FIRST_CLAUSE_CHARS,
    FIRST_MAX_CHARS,
    STREAMED_MAX_CHARS,
    ResponseBook,
    ResponseRun,
    call_item_id,
    new_chunker,
)
from voxline.engines.speculation import Speculations
from voxline.engines.speech_model import SpeechOut
from voxline.engines.speech_pacing import PlayoutPacing, VoiceReserve
from voxline.engines.stage import StreamId
from voxline.engines.streams import StreamState
from voxline.engines.trace import trace
from voxline.engines.truncation import truncate_to_heard
from voxline.engines.tts_stage import SpeechOwner, TTSPlan, TTSStage
from voxline.engines.warm_prefill import WarmPrefills

__all__ = ["FIRST_CLAUSE_CHARS", "FIRST_MAX_CHARS", "STREAMED_MAX_CHARS", "Responses",
           "new_chunker"]


class Responses:
    """Starts, advances and ends the responses of every stream; outputs go to `emit`.

    The `route_*`/`fail_*` methods are the LLM and TTS rows of the engine's stage table:
    a finished step's outcomes reach the responses of the streams still open.
    """

    def __init__(self, model: ChatModel, llm: LLMStage | RemoteLLMStage, tts: TTSStage,
                 emit: Callable[[p.EngineOutput], None],
                 live: Callable[[StreamId], StreamState | None],
                 lead_ms: float | None = None, voice_reserve_ms: float = 0.0) -> None:
        self.model = model
        self.llm = llm
        self.tts = tts
        self.book = ResponseBook(emit, live)
        self.pacing = PlayoutPacing(lead_ms)
        self.reserve = VoiceReserve(self.book.runs, self.pacing, voice_reserve_ms)
        self.prompts = ReplyPrompts(model, tts, self.book)
        self.speech = ReplySpeech(tts, self.book, self.pacing, self.finish_if_done)
        self.speculations = Speculations(self.book, llm, self.prompts, self._stop,
                                         self.finish_if_done)

    # The units' settings, where the core and benchmarks set them.
    @property
    def warm(self) -> WarmPrefills | None:
        """Prefills turns while they are spoken (the core sets it once built)."""
        return self.speculations.warm

    @warm.setter
    def warm(self, warm: WarmPrefills | None) -> None:
        self.speculations.warm = warm

    @property
    def speculate_speech(self) -> bool:
        """A speculation speaks its first segment while held (False: its text only)."""
        return self.speculations.speaks

    @speculate_speech.setter
    def speculate_speech(self, speaks: bool) -> None:
        self.speculations.speaks = speaks

    @property
    def lead_ms(self) -> float | None:
        return self.pacing.lead_ms

    def active(self, stream: StreamState) -> ResponseRun | None:
        return self.book.run(stream)

    def busy(self, stream: StreamState) -> bool:
        """The stream has a response running, speculating or waiting for its transcript."""
        return self.book.busy(stream)

    def in_progress(self) -> int:
        """Responses running or waiting for their transcript, across all streams."""
        return (sum(run.speculative is None for run in self.book.runs.values())
                + len(self.book.deferred))

    def speech_ready(self) -> bool:
        """Some response has a segment for the TTS stage."""
        return self.speech.speech_ready()

    def prompt_frame(self, stream: StreamState, cfg: p.ResponseConfig,
                     report: bool = False) -> tuple[list[int], int, list[int]] | None:
        """See `ReplyPrompts.prompt_frame`."""
        return self.prompts.prompt_frame(stream, cfg, report)

    # ------------------------------------------------------------------------ start

    def create(self, stream: StreamState, msg: p.CreateResponse) -> None:
        """Start a response; one asked for while a user turn is still being transcribed
        waits for that transcript, so the reply always answers what was said."""
        sid = stream.internal_id
        run = self.book.runs.get(sid)
        if run is not None and run.speculative is not None:
            if msg.config == stream.config.auto_response and stream.pending_finals == 0:
                self.speculations.commit(stream, run, msg)
                self.pacing.committed(run)
                return
            self.speculations.discard(stream)
        active = self.book.runs.get(sid) or self.book.deferred.get(sid)
        if active is not None:
            self.book.error(stream, "response: the conversation already has an active "
                            f"response {active.response_id!r}", p.ErrorCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE)
            return
        if stream.pending_finals > 0:
            self.book.deferred[sid] = msg
            return
        if self.warm is not None:
            self.warm.adopt(stream)  # its tokens are this reply's prompt so far
        run = self.prompts.new_run(stream, msg.config, msg.response_id, msg.item_id)
        if run is None:  # refused (the error says why): the response ends at once
            self.book.emit(p.ResponseFinished(stream.external_id, msg.response_id,
                                      p.ResponseStatus.FAILED, ""))
            return
        self.book.runs[sid] = run
        assert run.request is not None
        self.llm.add(run.request)

    # ---------------------------------------------------------------- speculation

    def speculate(self, stream: StreamState, item_id: str, text: str) -> bool:
        """See `Speculations.speculate`."""
        return self.speculations.speculate(stream, item_id, text)

    def turn_ended(self, stream: StreamState, item_id: str) -> None:
        """See `Speculations.turn_ended`."""
        self.speculations.turn_ended(stream, item_id)

    def discard_speculation(self, stream: StreamState) -> None:
        """Drop the stream's speculative response, if any, leaving no trace of it."""
        self.speculations.discard(stream)

    def speak(self, stream: StreamState, msg: p.Speak) -> None:
        sid = stream.internal_id
        self.speculations.discard(stream)
        if sid in self.book.runs or sid in self.book.deferred:
            self.book.error(stream, "speak: the stream already has an active response",
                            p.ErrorCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE)
            return
        cfg = p.ResponseConfig(seed=msg.seed, voice=msg.voice, reference=msg.reference)
        run = ResponseRun(msg.response_id, "", cfg, None, new_chunker(self.tts.streams_text), msg.speed,
                          emitted=msg.text, llm_done=True)
        run.tts_queue.extend(run.chunker.push(msg.text) + run.chunker.flush())
        self.book.runs[sid] = run
        self.finish_if_done(stream)

    def transcript_landed(self, stream: StreamState) -> None:
        """A final transcript landed (or failed): a response waiting for it may start."""
        stream.pending_finals -= 1
        msg = self.book.deferred.pop(stream.internal_id, None) if stream.pending_finals == 0 else None
        if msg is not None:
            self.create(stream, msg)

    # ----------------------------------------------------------------- flow control

    def playout(self, stream: StreamState, msg: p.PlayoutProgress) -> None:
        """The caller's listener has heard `msg.played_ms` of the response's audio."""
        run = self.book.runs.get(stream.internal_id)
        if run is None or run.speculative is not None or run.response_id != msg.response_id:
            return  # finished, cancelled or replaced meanwhile
        self.pacing.reported(run, msg.played_ms)

    # ---------------------------------------------------------------------- advance

    def conversation_changed(self, stream: StreamState) -> None:
        """A running generation re-reads the conversation; an in-flight step is discarded.
        A speculation answered the conversation as it was: it is discarded."""
        run = self.book.runs.get(stream.internal_id)
        if run is not None and run.speculative is not None:
            self.speculations.discard(stream)
        elif run is not None and run.request is not None:
            run.request.epoch += 1

    def of(self, stream: StreamState, req: GenerationRequest) -> ResponseRun | None:
        """The response `req` serves, if it is still the stream's running one."""
        run = self.book.runs.get(stream.internal_id)
        return run if run is not None and run.request is req else None

    def on_llm_step(self, stream: StreamState, req: GenerationRequest, seconds: float) -> None:
        response = self.of(stream, req)
        if response is None:
            return
        response.llm_ms += seconds * 1000
        text = self.model.decode(req.generated)
        if (not (text.endswith("\ufffd") and req.finish is None)  # wait for the rest of a UTF-8 char
                and text.startswith(response.emitted)):  # else a tokenizer merge rewrote the tail
            delta = text[len(response.emitted):]
            if delta:
                if not response.emitted:
                    trace(stream.internal_id, "first_delta", prompt=req.prompt_tokens,
                          cached=req.cached_tokens, tokens=len(req.generated),
                          llm_ms=round(response.llm_ms))
                response.emitted = text
                self.book.send(response, p.ReplyTextDelta(stream.external_id, response.response_id, delta))
                if response.config.audio:
                    response.tts_queue.extend(response.chunker.push(delta))
        for index, call in enumerate(req.calls):
            if call.unsent:
                self.book.emit(p.FunctionCallDelta(stream.external_id, response.response_id,
                                               call_item_id(response.item_id, index), index,
                                               call.call_id, call.name, call.unsent))
                call.unsent = ""
        if req.finish is not None:
            self.llm_finished(stream, req)

    def llm_finished(self, stream: StreamState, req: GenerationRequest,
                     error: str | None = None) -> None:
        response = self.of(stream, req)
        if response is None:
            return
        response.llm_done = True
        if req.finish == FinishReason.ERROR:
            if error or req.error:
                self.book.error(stream, error or req.error or "", p.ErrorCode.LLM_BACKEND_ERROR, response)
            else:
                self.book.error(stream, "the conversation no longer fits the model's context "
                                "window; delete items or start a new session",
                                p.ErrorCode.CONTEXT_LENGTH_EXCEEDED, response)
        if response.config.audio:
            response.tts_queue.extend(response.chunker.flush())
        self.finish_if_done(stream)

    # ------------------------------------------------------------- stage table rows

    def route_llm(self, plan: StepPlan | RemotePlan, _tokens: object, seconds: float) -> None:
        """An LLM step landed (its tokens confirmed by `update`): each response reads them."""
        for entry in plan.entries:
            stream = self.book.live(entry.request.stream_id)
            if stream is not None:
                self.on_llm_step(stream, entry.request, seconds)

    def fail_llm(self, plan: StepPlan | RemotePlan, error: Exception) -> None:
        """The step failed: every request in it ends, its response failed."""
        for entry in plan.entries:
            req = self.llm.abort(entry.request.request_id)
            if req is not None:
                req.finish = FinishReason.ERROR
                stream = self.book.live(req.stream_id)
                if stream is not None:
                    self.llm_finished(stream, req, f"LLM step failed: {error}")

    def end_refused(self) -> None:
        """Requests the LLM scheduler refused (context too long) end their responses."""
        for req in self.llm.finished_with_error():
            stream = self.book.live(req.stream_id)
            if stream is not None:
                self.llm_finished(stream, req)

    def start_speech(self) -> None:
        """See `ReplySpeech.start_speech` (the TTS row's `prepare`)."""
        self.speech.start_speech()

    def route_speech(self, plan: TTSPlan, routed: list[tuple[SpeechOwner, SpeechOut]],
                     seconds: float) -> None:
        self.speech.route_speech(plan, routed, seconds)

    def fail_speech(self, plan: TTSPlan, error: Exception) -> None:
        self.speech.fail_speech(plan, error)

    # -------------------------------------------------------------------------- end

    def cancel(self, stream: StreamState) -> None:
        msg = self.book.deferred.pop(stream.internal_id, None)
        if msg is not None:
            self.book.emit(p.ResponseFinished(stream.external_id, msg.response_id,
                                      p.ResponseStatus.CANCELLED, ""))
            return
        response = self.book.runs.get(stream.internal_id)
        if response is None or response.speculative is not None:
            return  # nothing to cancel is not an error (OpenAI: no-op)
        self._stop(response)
        self.finish_if_done(stream, p.ResponseStatus.CANCELLED)

    def abort(self, stream: StreamState) -> None:
        """The stream is closing: stop its response without a `ResponseFinished`."""
        self.speculations.discard(stream)
        run = self.book.runs.pop(stream.internal_id, None)
        if run is not None:
            self._stop(run)
        self.book.deferred.pop(stream.internal_id, None)

    def _stop(self, response: ResponseRun) -> None:
        if response.request is not None:
            self.llm.abort(response.request.request_id)
        self.speech.stop(response)

    def finish_if_done(self, stream: StreamState, status: p.ResponseStatus | None = None) -> None:
        """End the response with `status`, or (None) once its text and audio are all out."""
        response = self.book.runs.get(stream.internal_id)
        if response is None or response.speculative is not None:
            return  # a speculation ends only when committed or discarded
        if status is None:
            if not response.finished:
                return
            status = response.status()
        req = response.request
        text = response.emitted.strip()
        del self.book.runs[stream.internal_id]
        if req is None:
            self.book.emit(p.ResponseFinished(stream.external_id, response.response_id, status, text,
                                      tts_ms=response.tts_ms))
            return
        if req.generated:
            stream.conversation.add_generated(response.item_id, self.model.generation_header(),
                                              req.generated, text, self.model.message_footer(),
                                              response.spans)
        for index, call in enumerate(req.calls):
            item_id = call_item_id(response.item_id, index)
            if status == p.ResponseStatus.COMPLETED:  # a cut-off call is no call
                stream.conversation.add(item_id, "function_call", p.function_call_text(
                    call.call_id, call.name, call.arguments))
            self.book.emit(p.FunctionCallDone(stream.external_id, response.response_id, item_id,
                                          index, call.call_id, call.name, call.arguments,
                                          status == p.ResponseStatus.COMPLETED))
        output_tokens = req.reported_output_tokens
        self.book.emit(p.ResponseFinished(
            stream.external_id, response.response_id, status, text,
            input_tokens=req.prompt_tokens,
            output_tokens=len(req.generated) if output_tokens is None else output_tokens,
            cached_tokens=max(req.cached_tokens, 0), llm_ms=response.llm_ms,
            tts_ms=response.tts_ms, first_token_ms=req.first_token_ms))

    def truncate(self, stream: StreamState, msg: p.TruncateItem) -> None:
        """Cut an assistant item to its first `audio_end_ms` of audio (`truncation`); a
        response still speaking it is cancelled first."""
        run = self.book.runs.get(stream.internal_id)
        if run is not None and run.item_id == msg.item_id:
            self.cancel(stream)
        truncate_to_heard(stream, msg, self.book, self.conversation_changed)
