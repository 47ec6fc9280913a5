"""The response lifecycle, in one home: start, speak, stream text and audio, cancel,
truncate, done.

A response is one `ResponseRun` on a stream: an LLM `GenerationRequest` (none for
`Speak`), a text chunker that closes speakable segments as text arrives, and the
segments waiting for (or being spoken by) the TTS stage, one at a time in order.
It ends with exactly one `ResponseDone`, when the LLM has finished and the last
segment has been spoken, or at once when cancelled; after that nothing of it is sent.
A reply that produced tokens joins the conversation with the exact tokens sampled and
the audio spans that spoke them, which is what `truncate` cuts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from voxline.engines import protocol as p
from voxline.engines.llm_stage import ChatModel, FinishReason, GenerationRequest, LLMStage, Slot
from voxline.engines.prompt_cache import AudioSpan, ItemNotFound, cut_spans
from voxline.engines.speech_stage import SpeechOut
from voxline.engines.stage import StreamId
from voxline.engines.streams import StreamState
from voxline.engines.text_chunker import TextChunker
from voxline.engines.tts_stage import SpeechOwner, TTSStage

# A reply's first clause may be short ("Sure,") so its audio starts early; later
# segments are longer, which sounds more natural.
FIRST_CLAUSE_CHARS = 10
FIRST_MAX_CHARS = 60  # a first sentence with no boundary is cut at a space by then

_STATUS = {
    FinishReason.STOP: p.ResponseStatus.COMPLETED,
    FinishReason.LENGTH: p.ResponseStatus.INCOMPLETE,
    FinishReason.ABORT: p.ResponseStatus.CANCELLED,
    FinishReason.ERROR: p.ResponseStatus.FAILED,
}


def new_chunker() -> TextChunker:
    return TextChunker(first_clause_chars=FIRST_CLAUSE_CHARS, first_max_chars=FIRST_MAX_CHARS)


@dataclass
class ResponseRun:
    response_id: str
    item_id: str
    config: p.ResponseConfig
    request: GenerationRequest | None  # None: speech only (`Speak`), no LLM behind it
    chunker: TextChunker
    speed: float
    emitted: str = ""
    tts_queue: deque[str] = field(default_factory=deque)
    tts_job: int | None = None  # the segment being spoken (segments are spoken in order)
    spans: list[AudioSpan] = field(default_factory=list)
    audio_ms: float = 0.0
    llm_done: bool = False
    llm_ms: float = 0.0
    tts_ms: float = 0.0

    @property
    def speech_ready(self) -> bool:
        """A segment waits and none is being spoken."""
        return bool(self.tts_queue) and self.tts_job is None

    @property
    def finished(self) -> bool:
        return self.llm_done and not self.tts_queue and self.tts_job is None

    def status(self) -> p.ResponseStatus:
        req = self.request
        return _STATUS[req.finish if req is not None and req.finish else FinishReason.STOP]


class Responses:
    """Starts, advances and ends the responses of every stream; outputs go to `emit`.

    Holds each stream's running response and the one waiting for a transcript
    (`deferred`); a stream has at most one of the two.
    """

    def __init__(self, model: ChatModel, llm: LLMStage, tts: TTSStage,
                 emit: Callable[[p.EngineOutput], None]) -> None:
        self.model = model
        self.llm = llm
        self.tts = tts
        self._emit = emit
        self._runs: dict[StreamId, ResponseRun] = {}
        self._deferred: dict[StreamId, p.CreateResponse] = {}

    def active(self, stream: StreamState) -> ResponseRun | None:
        return self._runs.get(stream.internal_id)

    def speech_ready(self) -> bool:
        """Some response has a segment for the TTS stage."""
        return any(run.speech_ready for run in self._runs.values())

    def _error(self, stream: StreamState, message: str, code: str) -> None:
        self._emit(p.StreamError(stream.external_id, message, code))

    # ------------------------------------------------------------------------ start

    def create(self, stream: StreamState, msg: p.CreateResponse) -> None:
        """Start a response; one asked for while a user turn is still being transcribed
        waits for that transcript, so the reply always answers what was said."""
        sid = stream.internal_id
        active = self._runs.get(sid) or self._deferred.get(sid)
        if active is not None:
            self._error(stream, "response: the conversation already has an active "
                        f"response {active.response_id!r}", "conversation_already_has_active_response")
            return
        if stream.pending_finals > 0:
            self._deferred[sid] = msg
            return
        llm = self.model
        if stream.slot is None:
            index = llm.alloc_slot()
            if index is None:
                self._error(stream, "response: no free LLM slot (engine at capacity), try "
                            "again later", "capacity")
                return
            stream.slot = Slot(index)
        cfg = msg.config
        system = llm.render_message("system", cfg.instructions or stream.config.instructions)
        header = llm.generation_header()
        conversation = stream.conversation
        max_tokens = cfg.max_output_tokens or stream.config.max_output_tokens
        # room for the header and the reply (capped so a huge limit can't starve context)
        budget = llm.max_len - len(header) - min(max_tokens, llm.max_len // 4)
        temperature = stream.config.temperature if cfg.temperature is None else cfg.temperature
        generator = None
        if cfg.seed is not None:
            generator = torch.Generator().manual_seed(cfg.seed)
        stream.responses += 1
        request = GenerationRequest(
            request_id=f"{stream.internal_id}/{stream.responses}",
            slot=stream.slot,
            prompt=lambda: conversation.render(system, budget) + header,
            max_tokens=max_tokens,
            temperature=temperature,
            generator=generator,
            stream_id=stream.internal_id,
        )
        self._runs[sid] = ResponseRun(msg.response_id, msg.item_id, cfg, request, new_chunker(),
                                      stream.config.speed)
        self.llm.add(request)

    def speak(self, stream: StreamState, msg: p.Speak) -> None:
        sid = stream.internal_id
        if sid in self._runs or sid in self._deferred:
            self._error(stream, "speak: the stream already has an active response",
                        "conversation_already_has_active_response")
            return
        if msg.reference is not None and msg.reference.name and not msg.text.strip():
            self.tts.register_voice(msg.reference)  # registration only: nothing to speak
        cfg = p.ResponseConfig(seed=msg.seed, voice=msg.voice, reference=msg.reference)
        run = ResponseRun(msg.response_id, "", cfg, None, new_chunker(), msg.speed,
                          emitted=msg.text, llm_done=True)
        run.tts_queue.extend(run.chunker.push(msg.text) + run.chunker.flush())
        self._runs[sid] = run
        self.finish_if_done(stream)

    def transcript_landed(self, stream: StreamState) -> None:
        """A final transcript landed (or failed): a response waiting for it may start."""
        stream.pending_finals -= 1
        msg = self._deferred.pop(stream.internal_id, None) if stream.pending_finals == 0 else None
        if msg is not None:
            self.create(stream, msg)

    # ---------------------------------------------------------------------- advance

    def conversation_changed(self, stream: StreamState) -> None:
        """A running generation re-reads the conversation; an in-flight step is discarded."""
        run = self._runs.get(stream.internal_id)
        if run is not None and run.request is not None:
            run.request.epoch += 1

    def of(self, stream: StreamState, req: GenerationRequest) -> ResponseRun | None:
        """The response `req` serves, if it is still the stream's running one."""
        run = self._runs.get(stream.internal_id)
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
                response.emitted = text
                self._emit(p.TextDelta(stream.external_id, response.response_id, delta))
                if response.config.audio:
                    response.tts_queue.extend(response.chunker.push(delta))
        if req.finish is not None:
            self.llm_finished(stream, req)

    def llm_finished(self, stream: StreamState, req: GenerationRequest,
                     error: str | None = None) -> None:
        response = self.of(stream, req)
        if response is None:
            return
        response.llm_done = True
        if req.finish == FinishReason.ERROR:
            self._error(stream, error or "the conversation no longer fits the model's context "
                        "window; delete items or start a new session", "context_length_exceeded")
        if response.config.audio:
            response.tts_queue.extend(response.chunker.flush())
        self.finish_if_done(stream)

    def start_speech(self) -> None:
        """Hand every response its next segment for the TTS stage if none is being spoken."""
        for sid, run in self._runs.items():
            if run.speech_ready:
                run.tts_job = self.tts.add(SpeechOwner(sid, run.response_id),
                                           run.tts_queue.popleft(), run.speed, run.config.seed,
                                           run.config.voice, run.config.reference)

    def on_speech(self, stream: StreamState, owner: SpeechOwner, out: SpeechOut,
                  step_ms: float) -> None:
        response = self._runs.get(stream.internal_id)
        if response is None or response.response_id != owner.response_id:
            if not out.finished:  # stale: the response was cancelled or replaced
                self.tts.cancel(out.job_id)
            return
        response.tts_ms += step_ms
        if len(out.audio):
            audio = np.asarray(out.audio, dtype=np.float32)
            ms = len(audio) * 1000 / out.sample_rate
            if out.text or not response.spans:
                response.spans.append(AudioSpan(response.audio_ms, response.audio_ms, out.text))
            response.spans[-1].end_ms += ms  # a continuation extends the open span
            response.audio_ms += ms
            self._emit(p.AudioChunk(stream.external_id, owner.response_id, audio.tobytes(),
                                    out.sample_rate, ms, out.text))
        if out.finished:
            response.tts_job = None
            self.finish_if_done(stream)

    def speech_failed(self, stream: StreamState, owner: SpeechOwner, error: Exception) -> None:
        """The TTS step speaking the response's segment failed; the job is already dropped."""
        self._error(stream, f"speech synthesis failed: {error}", "tts_error")
        response = self._runs.get(stream.internal_id)
        if response is not None and response.response_id == owner.response_id:
            response.tts_job = None
            self.finish_if_done(stream)

    # -------------------------------------------------------------------------- end

    def cancel(self, stream: StreamState) -> None:
        msg = self._deferred.pop(stream.internal_id, None)
        if msg is not None:
            self._emit(p.ResponseDone(stream.external_id, msg.response_id,
                                      p.ResponseStatus.CANCELLED, ""))
            return
        response = self._runs.get(stream.internal_id)
        if response is None:
            return  # nothing to cancel is not an error (OpenAI: no-op)
        self._stop(response)
        self.finish_if_done(stream, p.ResponseStatus.CANCELLED)

    def abort(self, stream: StreamState) -> None:
        """The stream is closing: stop its response without a `ResponseDone`."""
        run = self._runs.pop(stream.internal_id, None)
        if run is not None:
            self._stop(run)
        self._deferred.pop(stream.internal_id, None)

    def _stop(self, response: ResponseRun) -> None:
        if response.request is not None:
            self.llm.abort(response.request.request_id)
        response.tts_queue.clear()
        if response.tts_job is not None:
            self.tts.cancel(response.tts_job)
            response.tts_job = None

    def finish_if_done(self, stream: StreamState, status: p.ResponseStatus | None = None) -> None:
        """End the response with `status`, or (None) once its text and audio are all out."""
        response = self._runs.get(stream.internal_id)
        if response is None:
            return
        if status is None:
            if not response.finished:
                return
            status = response.status()
        req = response.request
        text = response.emitted.strip()
        del self._runs[stream.internal_id]
        if req is None:
            self._emit(p.ResponseDone(stream.external_id, response.response_id, status, text,
                                      tts_ms=response.tts_ms))
            return
        if req.generated:
            stream.conversation.add_generated(response.item_id, self.model.generation_header(),
                                              req.generated, text, self.model.message_footer(),
                                              response.spans)
        self._emit(p.ResponseDone(
            stream.external_id, response.response_id, status, text,
            input_tokens=req.prompt_tokens, output_tokens=len(req.generated),
            cached_tokens=max(req.cached_tokens, 0), llm_ms=response.llm_ms,
            tts_ms=response.tts_ms))

    def truncate(self, stream: StreamState, msg: p.TruncateItem) -> None:
        """Cut an assistant item to its first `audio_end_ms` of audio (clamped to its length).

        The session validated the request against the audio it sent; here the item's own
        audio length is the bound, and a cut past it (a second truncate after an earlier,
        shorter one) keeps the item as it is rather than failing.
        """
        run = self._runs.get(stream.internal_id)
        if run is not None and run.item_id == msg.item_id:
            self.cancel(stream)
        try:
            item = stream.conversation.find(msg.item_id)
        except ItemNotFound:
            # a reply cancelled before its first token never joined the conversation:
            # nothing was said, so nothing is left to cut
            self._emit(p.ItemTruncated(stream.external_id, msg.item_id, 0, ""))
            return
        if item.role != "assistant":
            self._error(stream, f"truncate: item {msg.item_id!r} is a {item.role} message; "
                        "only assistant audio can be truncated", "invalid_value")
            return
        end_ms = min(msg.audio_end_ms, int(item.audio_ms))
        spans = cut_spans(item.spans, end_ms)
        text = " ".join(s.text.strip() for s in spans if s.text.strip())
        if text != item.text:
            self.conversation_changed(stream)
            item = stream.conversation.set_text(msg.item_id, text)
        item.spans = spans
        self._emit(p.ItemTruncated(stream.external_id, msg.item_id, end_ms, text))
