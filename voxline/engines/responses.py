"""The response lifecycle, in one home: start, speak, stream text and audio, cancel,
truncate, done.

A response is one `ResponseRun` on a stream: an LLM `GenerationRequest` (none for
`Speak`), a text chunker that closes speakable segments as text arrives, and the
segments waiting for (or being spoken by) the TTS stage, one at a time in order; a
stage that takes streaming text speaks the whole reply as one job, each segment appended
to it as it closes (one talker stream per reply, no fresh prefill per clause).
It ends with exactly one `ResponseFinished`, when the LLM has finished and the last
segment has been spoken, or at once when cancelled; after that nothing of it is sent.
A reply that produced tokens joins the conversation with the exact tokens sampled and
the audio spans that spoke them, which is what `truncate` cuts.

A response may also start *speculatively* (`speculate`), from the transcript of a pause
in the user's turn, before the turn has ended: it runs the LLM and speaks its first
segment, but everything it would send is held. When the caller then asks for exactly
that response (the stream's `auto_response`), it is committed: the held text and audio
go out at once under the caller's ids and the response goes on as any other. Anything
else (speech resumes, the conversation changes, another response is asked for) discards
it: the tentative user item leaves the conversation and the KV slot is rolled back to
the tokens it held before, as if the speculation had never run.

Flow control (`lead_ms`, the `generation_lead_s` setting): a response whose caller
reports its playout (`PlayoutProgress`) is generated only a bounded lead ahead of what
its listener has heard. While its generated audio is `lead_ms` or more ahead of the
last reported `played_ms`, the response is *held*: its LLM request sits out of the
batch (`paused`) and it starts no TTS segment (a streaming job is fed no more text);
the next report that brings it under the lead releases it. A segment starts only under
the lead, so generated audio never passes played + lead + one segment, a barge-in
discards at most that, and the cycles go to other streams meanwhile. A response never
reported on is not held. (A remote reply model streams its text at the server's pace
regardless: its deltas share one bounded queue, so only its speech is held.)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import numpy as np
import torch

from voxline.engines import protocol as p
from voxline.engines.conversation import AudioSpan, ItemNotFound, cut_spans
from voxline.engines.llm_stage import (
    ChatModel,
    FinishReason,
    GenerationRequest,
    LLMStage,
    Slot,
    StepPlan,
)
from voxline.engines.remote_llm import RemoteLLMStage, RemotePlan, function_call_text
from voxline.engines.speech_model import SpeechOut
from voxline.engines.stage import StreamId
from voxline.engines.streams import StreamState
from voxline.engines.text_chunker import TextChunker
from voxline.engines.trace import trace
from voxline.engines.tts_stage import SpeechOwner, TTSPlan, TTSStage
from voxline.engines.warm_prefill import WarmPrefills

# A reply's first clause may be short ("Sure,") so its audio starts early; later
# segments are longer, which sounds more natural.
FIRST_CLAUSE_CHARS = 10
# A first sentence with no boundary is cut at a space by then (two words at least): the
# first audio is a few words ("The capital"), which the LLM writes and Piper speaks in a
# fraction of the time of a whole sentence. 24 -> 12 took the median end of speech -> first
# audio from 1491 to 1205 ms (benchmarks/cpu_latency/bench_pipeline.py, speculation on).
FIRST_MAX_CHARS = 12

_STATUS = {
    FinishReason.STOP: p.ResponseStatus.COMPLETED,
    FinishReason.LENGTH: p.ResponseStatus.INCOMPLETE,
    FinishReason.ABORT: p.ResponseStatus.CANCELLED,
    FinishReason.ERROR: p.ResponseStatus.FAILED,
}


def call_item_id(item_id: str, index: int) -> str:
    """The conversation item of a response's `index`-th function call."""
    return f"{item_id}_call{index}"


# A TTS that takes a reply's text as it is written (`TTSStage.streams_text`: Qwen3-TTS)
# speaks one text token per frame until the text ends, so its talker waits for every word
# the chunker still holds: an unpunctuated reply reached it as one 250-character segment.
# Such a reply's later segments are as short as its first (the segments only cut the
# text; the talker's frames are those of the whole text however it arrives).
STREAMED_MAX_CHARS = FIRST_MAX_CHARS


def new_chunker(streams_text: bool = False) -> TextChunker:
    """The chunker of one reply's text; ``streams_text``: for a TTS fed as text comes."""
    if streams_text:
        return TextChunker(min_clause_chars=FIRST_CLAUSE_CHARS, max_chars=STREAMED_MAX_CHARS)
    return TextChunker(first_clause_chars=FIRST_CLAUSE_CHARS, first_max_chars=FIRST_MAX_CHARS)


@dataclass
class Speculative:
    """What a speculative response holds until it is committed or discarded."""

    user_item: str | None  # the tentative user item it answers (None: the turn ended)
    slot_tokens: int  # KV tokens the slot held before it ran
    held: list[p.EngineOutput] = field(default_factory=list)
    dropped: frozenset[str] = frozenset()  # the retention cut before it ran
    speaks: bool = True  # it speaks its first segment while held (False: its text only)


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
    tts_open: bool = False  # tts_job is a streaming job that takes the next segments
    segments: int = 0  # segments handed to the TTS stage so far
    key: str = ""  # names the run's TTS jobs (the response id, which a speculation lacks)
    speculative: Speculative | None = None
    spans: list[AudioSpan] = field(default_factory=list)
    audio_ms: float = 0.0
    llm_done: bool = False
    llm_ms: float = 0.0
    tts_ms: float = 0.0
    played_ms: float | None = None  # playout its caller reported (None: none, never held)
    held: bool = False  # flow control: too far ahead of playout to generate more (see above)

    def __post_init__(self) -> None:
        self.key = self.key or self.response_id

    @property
    def speech_ready(self) -> bool:
        """A segment waits and none is being spoken (or the streaming job takes it), or
        the streaming job's text has ended. A speculation speaks only its first segment;
        a held response none."""
        spec = self.speculative
        if self.held or (spec is not None and (self.segments or not spec.speaks)):
            return False
        if self.tts_open:
            return bool(self.tts_queue) or self.llm_done
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
    (`deferred`); a stream has at most one of the two. The `route_*`/`fail_*` methods are
    the LLM and TTS rows of the engine's stage table: a finished step's outcomes reach the
    responses of the streams still open.
    """

    def __init__(self, model: ChatModel, llm: LLMStage | RemoteLLMStage, tts: TTSStage,
                 emit: Callable[[p.EngineOutput], None],
                 live: Callable[[StreamId], StreamState | None],
                 lead_ms: float | None = None) -> None:
        self.model = model
        self.lead_ms = lead_ms  # flow control (see the module docstring); None: off
        self.llm = llm
        self.tts = tts
        self._emit = emit
        self._live = live  # an open stream by internal id (None: closed or closing)
        self._runs: dict[StreamId, ResponseRun] = {}
        self._deferred: dict[StreamId, p.CreateResponse] = {}
        self.warm: WarmPrefills | None = None  # prefills turns while they are spoken
        # A speculation speaks its first segment inside the silence window, so the first
        # words' audio is ready when the turn is committed (False: text only, a benchmark's
        # comparison).
        self.speculate_speech = True

    def active(self, stream: StreamState) -> ResponseRun | None:
        return self._runs.get(stream.internal_id)

    def busy(self, stream: StreamState) -> bool:
        """The stream has a response running, speculating or waiting for its transcript."""
        return stream.internal_id in self._runs or stream.internal_id in self._deferred

    def in_progress(self) -> int:
        """Responses running or waiting for their transcript, across all streams."""
        return (sum(run.speculative is None for run in self._runs.values())
                + len(self._deferred))

    def speech_ready(self) -> bool:
        """Some response has a segment for the TTS stage."""
        return any(run.speech_ready for run in self._runs.values())

    def _error(self, stream: StreamState, message: str, code: p.ErrorCode,
               run: ResponseRun | None = None) -> None:
        self._send(run, p.StreamError(stream.external_id, message, code))

    def _send(self, run: ResponseRun | None, out: p.EngineOutput) -> None:
        """Emit `out` for `run`, or hold it while the run is speculative."""
        if run is not None and run.speculative is not None:
            run.speculative.held.append(out)
        else:
            self._emit(out)

    # ------------------------------------------------------------------------ start

    def create(self, stream: StreamState, msg: p.CreateResponse) -> None:
        """Start a response; one asked for while a user turn is still being transcribed
        waits for that transcript, so the reply always answers what was said."""
        sid = stream.internal_id
        run = self._runs.get(sid)
        if run is not None and run.speculative is not None:
            if msg.config == stream.config.auto_response and stream.pending_finals == 0:
                self._commit(stream, run, msg)
                return
            self.discard_speculation(stream)
        active = self._runs.get(sid) or self._deferred.get(sid)
        if active is not None:
            self._error(stream, "response: the conversation already has an active "
                        f"response {active.response_id!r}", p.ErrorCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE)
            return
        if stream.pending_finals > 0:
            self._deferred[sid] = msg
            return
        if self.warm is not None:
            self.warm.adopt(stream)  # its tokens are this reply's prompt so far
        run = self._new_run(stream, msg.config, msg.response_id, msg.item_id)
        if run is None:  # refused (the error says why): the response ends at once
            self._emit(p.ResponseFinished(stream.external_id, msg.response_id,
                                      p.ResponseStatus.FAILED, ""))
            return
        self._runs[sid] = run
        assert run.request is not None
        self.llm.add(run.request)

    def _new_run(self, stream: StreamState, cfg: p.ResponseConfig, response_id: str,
                 item_id: str) -> ResponseRun | None:
        """A response generating from the conversation as it stands (None: no free slot)."""
        llm = self.model
        if stream.slot is None:
            index = llm.alloc_slot()
            if index is None:
                self._error(stream, "response: no free LLM slot (engine at capacity), try "
                            "again later", p.ErrorCode.CAPACITY)
                return None
            stream.slot = Slot(index)
        conversation = stream.conversation
        window, truncation = stream.window, stream.config.truncation
        max_tokens = cfg.max_output_tokens or stream.config.max_output_tokens
        # (a speculation that cannot start just does not; its response will say why)
        frame = self.prompt_frame(stream, cfg, report=bool(response_id))
        if frame is None:
            return None
        system, budget, header = frame
        temperature = stream.config.temperature if cfg.temperature is None else cfg.temperature
        generator = None
        if cfg.seed is not None:
            generator = torch.Generator().manual_seed(cfg.seed)
        stream.responses += 1
        tools = stream.config.tools if cfg.tools is None else cfg.tools
        tool_choice = stream.config.tool_choice if cfg.tool_choice is None else cfg.tool_choice
        if tools and not getattr(llm, "supports_tools", False):
            self._error(stream, "response: tools need a reply model that can call functions "
                        "(a remote OpenAI-compatible server); the embedded model has none",
                        p.ErrorCode.INVALID_VALUE)
            return None
        request = GenerationRequest(
            request_id=f"{stream.internal_id}/{stream.responses}",
            slot=stream.slot,
            prompt=lambda: window.prompt(conversation, system, budget - len(system),
                                         truncation) + header,
            shared_prefix=len(system),
            max_tokens=max_tokens,
            temperature=temperature,
            generator=generator,
            stream_id=stream.internal_id,
            tools=tuple(tools),
            tool_choice=tool_choice,
        )
        return ResponseRun(response_id, item_id, cfg, request, new_chunker(self.tts.streams_text),
                           stream.config.speed)

    def prompt_frame(self, stream: StreamState, cfg: p.ResponseConfig,
                     report: bool = False) -> tuple[list[int], int, list[int]] | None:
        """What a reply's prompt is built of: the rendered instructions, the tokens they
        and the messages may take, the generation header (None: the instructions alone
        fill it; the error sent if `report`)."""
        header = self.model.generation_header()
        max_tokens = cfg.max_output_tokens or stream.config.max_output_tokens
        # room for the header and the reply (capped so a huge limit can't starve context)
        budget = self.model.max_len - len(header) - min(max_tokens, self.model.max_len // 4)
        system = self._system_prompt(stream, cfg, budget, report)
        return None if system is None else (system, budget, header)

    def _system_prompt(self, stream: StreamState, cfg: p.ResponseConfig, budget: int,
                       report: bool) -> list[int] | None:
        """The rendered instructions, or None when they alone fill the `budget` (refused
        with an error naming the field, if `report`). A text longer than `budget` tokens
        can cover (`max_token_chars` each, where the model says) is refused untokenized:
        megabytes through a tokenizer would stall the engine loop for seconds."""
        llm = self.model
        text = cfg.instructions or stream.config.instructions
        unit = getattr(llm, "context_unit", "tokens")
        per_token = getattr(llm, "max_token_chars", None)
        if per_token is not None and len(text) > budget * per_token:
            size = f"{len(text)} characters"
        else:
            system = llm.render_message("system", text)
            if len(system) <= budget:
                return system
            size = f"{len(system)} {unit}"
        if report:
            field = "response.instructions" if cfg.instructions else "session.instructions"
            self._emit(p.StreamError(
                stream.external_id, f"{field} is {size}, more than the {budget} {unit} the "
                f"reply model can hold (its context window is {llm.max_len} {unit}, less room "
                "for the reply); shorten the instructions", p.ErrorCode.CONTEXT_LENGTH_EXCEEDED,
                param=field))
        return None

    # ---------------------------------------------------------------- speculation

    def speculate(self, stream: StreamState, item_id: str, text: str) -> None:
        """Start the stream's `auto_response` to the user's turn so far (`text`, the turn
        `item_id` paused on), holding its output; nothing if a response is under way."""
        sid = stream.internal_id
        cfg = stream.config.auto_response
        if (cfg is None or not text or sid in self._runs or sid in self._deferred
                or stream.pending_finals or stream.conversation.has(item_id)
                or stream.config.tools or cfg.tools):  # a function call is not held back
            return
        before = len(stream.slot.tokens) if stream.slot is not None else 0
        warm = self.warm.adopt(stream) if self.warm is not None else None
        before = before if warm is None else warm  # discarded, it undoes the warm prefill
        stream.conversation.add(item_id, "user", text)
        run = self._new_run(stream, cfg, "", "")
        if run is None:
            stream.conversation.delete(item_id)
            return
        run.key = f"speculation-{stream.responses}"
        run.speculative = Speculative(item_id, before, dropped=frozenset(stream.window.dropped),
                                      speaks=self.speculate_speech)
        self._runs[sid] = run
        assert run.request is not None
        self.llm.add(run.request)
        trace(stream.internal_id, "speculation_started")
        self._emit(p.Speculation(stream.external_id, p.SpeculationOutcome.STARTED))

    def turn_ended(self, stream: StreamState, item_id: str) -> None:
        """The user turn `item_id` is final: a speculation no longer owns its user item."""
        run = self._runs.get(stream.internal_id)
        if run is not None and run.speculative is not None and run.speculative.user_item == item_id:
            run.speculative.user_item = None

    def _commit(self, stream: StreamState, run: ResponseRun, msg: p.CreateResponse) -> None:
        """The caller asked for the speculated response: release what it holds."""
        spec = run.speculative
        assert spec is not None
        run.speculative = None
        trace(stream.internal_id, "commit", held=len(spec.held))
        run.response_id, run.item_id = msg.response_id, msg.item_id
        self._emit(p.Speculation(stream.external_id, p.SpeculationOutcome.COMMITTED))
        for out in spec.held:
            if isinstance(out, p.ReplyTextDelta | p.AudioChunk):
                out = msgspec.structs.replace(out, response_id=msg.response_id)
            self._emit(out)
        self.finish_if_done(stream)

    def discard_speculation(self, stream: StreamState) -> None:
        """Drop the stream's speculative response, if any, leaving no trace of it."""
        run = self._runs.get(stream.internal_id)
        if run is None or run.speculative is None:
            return
        spec = run.speculative
        trace(stream.internal_id, "speculation_discarded")
        del self._runs[stream.internal_id]
        self._stop(run)
        if spec.user_item is not None and stream.conversation.has(spec.user_item):
            stream.conversation.delete(spec.user_item)
        if stream.slot is not None:
            self.llm.roll_back(stream.slot, spec.slot_tokens)
        stream.window.dropped = set(spec.dropped)  # a cut it made never happened
        self._emit(p.Speculation(stream.external_id, p.SpeculationOutcome.DISCARDED))

    def speak(self, stream: StreamState, msg: p.Speak) -> None:
        sid = stream.internal_id
        self.discard_speculation(stream)
        if sid in self._runs or sid in self._deferred:
            self._error(stream, "speak: the stream already has an active response",
                        p.ErrorCode.CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE)
            return
        cfg = p.ResponseConfig(seed=msg.seed, voice=msg.voice, reference=msg.reference)
        run = ResponseRun(msg.response_id, "", cfg, None, new_chunker(self.tts.streams_text), msg.speed,
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

    # ----------------------------------------------------------------- flow control

    def playout(self, stream: StreamState, msg: p.PlayoutProgress) -> None:
        """The caller's listener has heard `msg.played_ms` of the response's audio."""
        run = self._runs.get(stream.internal_id)
        if run is None or run.speculative is not None or run.response_id != msg.response_id:
            return  # finished, cancelled or replaced meanwhile
        run.played_ms = max(run.played_ms or 0.0, msg.played_ms)
        self._pace(run)

    def _pace(self, run: ResponseRun) -> None:
        """Hold `run` while its unplayed audio reaches the lead; release it once under."""
        run.held = (self.lead_ms is not None and run.played_ms is not None
                    and run.audio_ms - run.played_ms >= self.lead_ms)
        if run.request is not None:
            run.request.paused = run.held

    # ---------------------------------------------------------------------- advance

    def conversation_changed(self, stream: StreamState) -> None:
        """A running generation re-reads the conversation; an in-flight step is discarded.
        A speculation answered the conversation as it was: it is discarded."""
        run = self._runs.get(stream.internal_id)
        if run is not None and run.speculative is not None:
            self.discard_speculation(stream)
        elif run is not None and run.request is not None:
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
                if not response.emitted:
                    trace(stream.internal_id, "first_delta", prompt=req.prompt_tokens,
                          cached=req.cached_tokens, tokens=len(req.generated),
                          llm_ms=round(response.llm_ms))
                response.emitted = text
                self._send(response, p.ReplyTextDelta(stream.external_id, response.response_id, delta))
                if response.config.audio:
                    response.tts_queue.extend(response.chunker.push(delta))
        for index, call in enumerate(req.calls):
            if call.unsent:
                self._emit(p.FunctionCallDelta(stream.external_id, response.response_id,
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
                self._error(stream, error or req.error or "", p.ErrorCode.LLM_BACKEND_ERROR, response)
            else:
                self._error(stream, "the conversation no longer fits the model's context "
                            "window; delete items or start a new session",
                            p.ErrorCode.CONTEXT_LENGTH_EXCEEDED, response)
        if response.config.audio:
            response.tts_queue.extend(response.chunker.flush())
        self.finish_if_done(stream)

    def start_speech(self) -> None:
        """Hand every response its next segment for the TTS stage if none is being spoken;
        a streaming stage gets every segment of a reply in one job, then its end."""
        streaming = self.tts.streams_text
        for sid, run in self._runs.items():
            if not run.speech_ready:
                continue
            if run.tts_job is None:
                if not run.segments:
                    trace(sid, "first_segment",  # free text last: the fields split on spaces
                          tokens=len(run.request.generated) if run.request else None,
                          llm_ms=round(run.llm_ms), text=repr(run.tts_queue[0]))
                run.segments += 1
                run.tts_job = self.tts.add(SpeechOwner(sid, run.key),
                                           run.tts_queue.popleft(), run.speed, run.config.seed,
                                           run.config.voice, run.config.reference,
                                           more_text=streaming)
                run.tts_open = streaming
            if run.tts_open and run.speculative is None:  # a speculation: its first segment only
                while run.tts_queue:
                    self.tts.append_text(run.tts_job, run.tts_queue.popleft())
                if run.llm_done:
                    self.tts.end_text(run.tts_job)
                    run.tts_open = False

    def on_speech(self, stream: StreamState, owner: SpeechOwner, out: SpeechOut,
                  step_ms: float) -> None:
        response = self._runs.get(stream.internal_id)
        if response is None or response.key != owner.response_id:
            if not out.finished:  # stale: the response was cancelled or replaced
                self.tts.cancel(out.job_id)
            return
        response.tts_ms += step_ms
        if out.text and not len(out.audio) and response.spans:  # its audio was in earlier chunks
            response.spans[-1].text = f"{response.spans[-1].text} {out.text}"
        if len(out.audio):
            if not response.audio_ms:
                trace(stream.internal_id, "first_audio", held=response.speculative is not None,
                      step_ms=round(step_ms))
            audio = np.asarray(out.audio, dtype=np.float32)
            ms = len(audio) * 1000 / out.sample_rate
            if out.text or not response.spans:
                response.spans.append(AudioSpan(response.audio_ms, response.audio_ms, out.text))
            response.spans[-1].end_ms += ms  # a continuation extends the open span
            response.audio_ms += ms
            self._send(response, p.AudioChunk(stream.external_id, response.response_id,
                                              audio.tobytes(), out.sample_rate, ms, out.text))
            self._pace(response)
        if out.finished:
            response.tts_job = None
            self.finish_if_done(stream)

    def speech_failed(self, stream: StreamState, owner: SpeechOwner, error: Exception) -> None:
        """The TTS step speaking the response's segment failed; the job is already dropped."""
        response = self._runs.get(stream.internal_id)
        if response is None or response.key != owner.response_id:
            self._error(stream, f"speech synthesis failed: {error}", p.ErrorCode.TTS_ERROR)
        else:
            self._error(stream, f"speech synthesis failed: {error}", p.ErrorCode.TTS_ERROR, response)
            response.tts_job = None
            response.tts_open = False
            self.finish_if_done(stream)

    # ------------------------------------------------------------- stage table rows

    def route_llm(self, plan: StepPlan | RemotePlan, _tokens: object, seconds: float) -> None:
        """An LLM step landed (its tokens confirmed by `update`): each response reads them."""
        for entry in plan.entries:
            stream = self._live(entry.request.stream_id)
            if stream is not None:
                self.on_llm_step(stream, entry.request, seconds)

    def fail_llm(self, plan: StepPlan | RemotePlan, error: Exception) -> None:
        """The step failed: every request in it ends, its response failed."""
        for entry in plan.entries:
            req = self.llm.abort(entry.request.request_id)
            if req is not None:
                req.finish = FinishReason.ERROR
                stream = self._live(req.stream_id)
                if stream is not None:
                    self.llm_finished(stream, req, f"LLM step failed: {error}")

    def end_refused(self) -> None:
        """Requests the LLM scheduler refused (context too long) end their responses."""
        for req in self.llm.finished_with_error():
            stream = self._live(req.stream_id)
            if stream is not None:
                self.llm_finished(stream, req)

    def route_speech(self, plan: TTSPlan, routed: list[tuple[SpeechOwner, SpeechOut]],
                     seconds: float) -> None:
        for owner, out in routed:
            stream = self._live(owner.stream_id)
            if stream is not None:
                self.on_speech(stream, owner, out, seconds * 1000)

    def fail_speech(self, plan: TTSPlan, error: Exception) -> None:
        for _job_id, owner in self.tts.fail(plan):
            stream = self._live(owner.stream_id)
            if stream is not None:
                self.speech_failed(stream, owner, error)

    # -------------------------------------------------------------------------- end

    def cancel(self, stream: StreamState) -> None:
        msg = self._deferred.pop(stream.internal_id, None)
        if msg is not None:
            self._emit(p.ResponseFinished(stream.external_id, msg.response_id,
                                      p.ResponseStatus.CANCELLED, ""))
            return
        response = self._runs.get(stream.internal_id)
        if response is None or response.speculative is not None:
            return  # nothing to cancel is not an error (OpenAI: no-op)
        self._stop(response)
        self.finish_if_done(stream, p.ResponseStatus.CANCELLED)

    def abort(self, stream: StreamState) -> None:
        """The stream is closing: stop its response without a `ResponseFinished`."""
        self.discard_speculation(stream)
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
            response.tts_open = False

    def finish_if_done(self, stream: StreamState, status: p.ResponseStatus | None = None) -> None:
        """End the response with `status`, or (None) once its text and audio are all out."""
        response = self._runs.get(stream.internal_id)
        if response is None or response.speculative is not None:
            return  # a speculation ends only when committed or discarded
        if status is None:
            if not response.finished:
                return
            status = response.status()
        req = response.request
        text = response.emitted.strip()
        del self._runs[stream.internal_id]
        if req is None:
            self._emit(p.ResponseFinished(stream.external_id, response.response_id, status, text,
                                      tts_ms=response.tts_ms))
            return
        if req.generated:
            stream.conversation.add_generated(response.item_id, self.model.generation_header(),
                                              req.generated, text, self.model.message_footer(),
                                              response.spans)
        for index, call in enumerate(req.calls):
            item_id = call_item_id(response.item_id, index)
            if status == p.ResponseStatus.COMPLETED:  # a cut-off call is no call
                stream.conversation.add(item_id, "function_call", function_call_text(
                    call.call_id, call.name, call.arguments))
            self._emit(p.FunctionCallDone(stream.external_id, response.response_id, item_id,
                                          index, call.call_id, call.name, call.arguments,
                                          status == p.ResponseStatus.COMPLETED))
        output_tokens = req.reported_output_tokens
        self._emit(p.ResponseFinished(
            stream.external_id, response.response_id, status, text,
            input_tokens=req.prompt_tokens,
            output_tokens=len(req.generated) if output_tokens is None else output_tokens,
            cached_tokens=max(req.cached_tokens, 0), llm_ms=response.llm_ms,
            tts_ms=response.tts_ms, first_token_ms=req.first_token_ms))

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
            self._emit(p.TruncationApplied(stream.external_id, msg.item_id, 0, ""))
            return
        if item.role != "assistant":
            self._error(stream, f"truncate: item {msg.item_id!r} is a {item.role} message; "
                        "only assistant audio can be truncated", p.ErrorCode.INVALID_VALUE)
            return
        end_ms = min(msg.audio_end_ms, int(item.audio_ms))
        spans = cut_spans(item.spans, end_ms)
        text = " ".join(s.text.strip() for s in spans if s.text.strip())
        if text != item.text:
            self.conversation_changed(stream)
            item = stream.conversation.set_text(msg.item_id, text)
        item.spans = spans
        self._emit(p.TruncationApplied(stream.external_id, msg.item_id, end_ms, text))
