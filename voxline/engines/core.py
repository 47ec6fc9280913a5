"""The engine core: every stream's state and the stages that serve them.

Stages and where they run (the loop thread owns all state; workers only compute):
- VAD: inline, one batched model call per step over every stream that has a frame.
- ASR: one worker thread; final transcripts jump ahead of partials.
- LLM: one worker thread runs the batched forward of a `StepPlan` while the loop keeps
  taking inputs; `LLMStage.update` then confirms or discards the step's work.
- TTS: one worker thread steps a `SpeechStage` holding every stream's current text
  segment. A segment starts as soon as the text chunker closes it (async chunk): the
  first clause is spoken while the LLM is still writing the rest.

A result that comes back for a response that has since been cancelled or replaced is
dropped (its `response_id` no longer matches): a stale chunk is never sent.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from voxline.engines import protocol as p
from voxline.engines.conversation import AudioSpan, Conversation, ItemNotFound, cut_spans
from voxline.engines.llm_stage import (
    FinishReason,
    GenerationRequest,
    LanguageModel,
    LLMStage,
    Slot,
    StepPlan,
)
from voxline.engines.speech_stage import SpeechJob, SpeechOut, SpeechStage
from voxline.engines.text_chunker import TextChunker
from voxline.engines.turns import TurnDetector, TurnEvent, TurnState

logger = logging.getLogger(__name__)

VAD_FRAME = 512
FRAME_MS = VAD_FRAME * 1000 / p.INPUT_RATE  # 32 ms
MIN_COMMIT_MS = 100  # OpenAI refuses to commit less audio than this
# A reply's first clause may be short ("Sure,") so its audio starts early; later
# segments are longer, which sounds more natural.
FIRST_CLAUSE_CHARS = 10
FIRST_MAX_CHARS = 60  # a first sentence with no boundary is cut at a space by then


def new_chunker() -> TextChunker:
    return TextChunker(first_clause_chars=FIRST_CLAUSE_CHARS, first_max_chars=FIRST_MAX_CHARS)


class VADModel(Protocol):
    def new_state(self) -> Any: ...

    def process(self, frames: np.ndarray, states: list[Any]) -> np.ndarray: ...


class ASRModel(Protocol):
    def transcribe(self, audio: np.ndarray) -> str: ...


class ChatModel(LanguageModel, Protocol):
    """A LanguageModel plus its chat format."""

    def render_message(self, role: str, text: str) -> list[int]: ...

    def generation_header(self) -> list[int]: ...

    def message_footer(self) -> list[int]: ...

    def decode(self, tokens: list[int]) -> str: ...


@dataclass
class Models:
    vad: VADModel
    asr: ASRModel
    llm: ChatModel
    tts: SpeechStage


def _timed_call(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - t0


def new_item_id() -> str:
    return "item_" + uuid.uuid4().hex[:20]


@dataclass
class Utterance:
    """Audio of one user turn (speech in progress, or the manual-commit buffer)."""

    item_id: str
    start_ms: float
    chunks: list[np.ndarray] = field(default_factory=list)
    samples: int = 0
    last_partial_samples: int = 0
    partial_queued: bool = False

    def add(self, audio: np.ndarray) -> None:
        self.chunks.append(audio)
        self.samples += len(audio)

    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)


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


class StreamState:
    def __init__(self, stream_id: str, config: p.StreamConfig, models: Models) -> None:
        self.stream_id = stream_id
        self.config = config
        self.vad_state = models.vad.new_state()
        self.detector = TurnDetector(config.turn_detection) if config.turn_detection else None
        self.pending = np.zeros(0, np.float32)  # input not yet cut into VAD frames
        self.audio_ms = 0.0  # input clock: ms of audio framed so far
        self.history: deque[np.ndarray] = deque(maxlen=64)  # recent frames (prefix padding)
        self.utterance: Utterance | None = None
        self.conversation = Conversation(models.llm.render_message)
        self.slot: Slot | None = None
        self.response: ResponseRun | None = None
        self.responses = 0
        self.pending_finals = 0  # utterances whose final transcript is still being made
        self.deferred: p.CreateResponse | None = None  # waits for pending_finals == 0

    def configure(self, config: p.StreamConfig) -> None:
        if config.turn_detection != self.config.turn_detection:
            self.detector = TurnDetector(config.turn_detection) if config.turn_detection else None
        self.config = config


@dataclass
class ASRJob:
    stream_id: str
    item_id: str
    audio: np.ndarray
    final: bool


class EngineCore:
    """All streams and stages of one engine; driven by `run_engine_loop`."""

    def __init__(self, models: Models, wake: Callable[[], None], max_streams: int = 64) -> None:
        self.models = models
        self._wake = wake
        self.max_streams = max_streams
        self.streams: dict[str, StreamState] = {}
        self.llm = LLMStage(models.llm)
        self._outputs: list[p.EngineOutput] = []
        self._asr_pool = ThreadPoolExecutor(1, thread_name_prefix="voxline-asr")
        self._tts_pool = ThreadPoolExecutor(1, thread_name_prefix="voxline-tts")
        self._llm_pool = ThreadPoolExecutor(1, thread_name_prefix="voxline-llm")
        self._asr_jobs: deque[ASRJob] = deque()
        self._asr_running: tuple[ASRJob, Future[tuple[str, float]]] | None = None
        self._tts_running: Future[tuple[list[SpeechOut], float]] | None = None
        self._tts_jobs: dict[int, tuple[str, str]] = {}  # job id -> (stream id, response id)
        self._tts_cancels: list[int] = []  # applied between steps
        self._job_ids = 0
        self._llm_running: tuple[StepPlan, Future[tuple[torch.Tensor, float]]] | None = None

    # ------------------------------------------------------------------ loop interface

    def has_work(self) -> bool:
        if self._outputs:
            return True
        for running in (self._asr_running, self._llm_running):
            if running is not None and running[1].done():
                return True
        if self._tts_running is not None and self._tts_running.done():
            return True
        if self._asr_running is None and self._asr_jobs:
            return True
        if self._llm_running is None and self.llm.has_work():
            return True
        if self._tts_running is None and (self.models.tts.has_work() or any(
                self._tts_ready(s) for s in self.streams.values())):
            return True
        return any(
            len(s.pending) >= VAD_FRAME for s in self.streams.values() if s.detector is not None
        )

    def step(self) -> list[p.EngineOutput]:
        self._finish_llm()
        self._finish_asr()
        self._finish_tts()
        self._run_vad()
        self._start_asr()
        self._start_tts()
        self._start_llm()
        out, self._outputs = self._outputs, []
        return out

    def close(self) -> None:
        for sid in list(self.streams):
            self._close_stream(sid, announce=False)
        for pool in (self._asr_pool, self._tts_pool, self._llm_pool):
            pool.shutdown(wait=True, cancel_futures=True)

    def add_input(self, msg: p.EngineInput) -> None:
        try:
            self._dispatch(msg)
        except Exception as exc:  # one bad input must not take down the engine
            logger.exception("input %s failed", type(msg).__name__)
            self._error(msg.stream_id, f"{type(msg).__name__} failed: {exc}", "engine_error")

    # ---------------------------------------------------------------------- inputs

    def _dispatch(self, msg: p.EngineInput) -> None:
        if isinstance(msg, p.OpenStream):
            self._open_stream(msg)
            return
        stream = self.streams.get(msg.stream_id)
        if stream is None:
            self._error(msg.stream_id, f"{type(msg).__name__}: no open stream {msg.stream_id!r}",
                        "unknown_stream")
            return
        match msg:
            case p.UpdateStream():
                stream.configure(msg.config)
            case p.AppendAudio():
                self._append_audio(stream, np.frombuffer(msg.audio, dtype="<f4"))
            case p.CommitAudio():
                self._commit_audio(stream, msg.item_id)
            case p.ClearAudio():
                stream.pending = np.zeros(0, np.float32)
                stream.utterance = None
                if stream.detector:
                    stream.detector.reset()
            case p.AddItem():
                self._conversation_changed(stream)
                stream.conversation.add(msg.item_id, msg.role, msg.text, msg.previous_item_id)
            case p.DeleteItem():
                # the session owns the item list; an item the engine never held (a reply
                # cancelled before its first token) has nothing to delete here
                if stream.conversation.has(msg.item_id):
                    stream.conversation.delete(msg.item_id)
                    self._conversation_changed(stream)
            case p.TruncateItem():
                self._truncate_item(stream, msg)
            case p.CreateResponse():
                self._create_response(stream, msg)
            case p.Speak():
                self._speak(stream, msg)
            case p.CancelResponse():
                self._cancel_response(stream)
            case p.CloseStream():
                self._close_stream(msg.stream_id, announce=True)

    def _open_stream(self, msg: p.OpenStream) -> None:
        if msg.stream_id in self.streams:
            self._error(msg.stream_id, f"OpenStream: stream {msg.stream_id!r} is already open",
                        "stream_exists")
            return
        if len(self.streams) >= self.max_streams:
            self._error(msg.stream_id, f"OpenStream: engine is at capacity ({self.max_streams} "
                        "streams)", "capacity", fatal=True)
            return
        self.streams[msg.stream_id] = StreamState(msg.stream_id, msg.config, self.models)

    def _close_stream(self, stream_id: str, announce: bool) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            return
        if stream.response is not None:
            if stream.response.request is not None:
                self.llm.abort(stream.response.request.request_id)
            self._drop_tts_job(stream.response)
            stream.response = None
        if stream.slot is not None:
            self.models.llm.free_slot(stream.slot.index)
        self._asr_jobs = deque(j for j in self._asr_jobs if j.stream_id != stream_id)
        if announce:
            self._outputs.append(p.StreamClosed(stream_id))

    def _error(self, stream_id: str, message: str, code: str, fatal: bool = False) -> None:
        self._outputs.append(p.StreamError(stream_id, message, code, fatal))

    def _conversation_changed(self, stream: StreamState) -> None:
        """A running generation re-reads the conversation; an in-flight step is discarded."""
        if stream.response is not None and stream.response.request is not None:
            stream.response.request.epoch += 1

    # ------------------------------------------------------------------------- audio

    def _append_audio(self, stream: StreamState, audio: np.ndarray) -> None:
        if stream.detector is None:
            if stream.utterance is None:
                stream.utterance = Utterance("", stream.audio_ms)
            stream.utterance.add(audio.copy())
            stream.audio_ms += len(audio) * 1000 / p.INPUT_RATE
            return
        stream.pending = np.concatenate([stream.pending, audio]) if len(stream.pending) else audio.copy()

    def _commit_audio(self, stream: StreamState, item_id: str) -> None:
        utt = stream.utterance
        ms = utt.samples * 1000 / p.INPUT_RATE if utt else 0.0
        if utt is None or ms < MIN_COMMIT_MS:
            self._error(stream.stream_id, f"commit: input audio buffer too small, expected at least "
                        f"{MIN_COMMIT_MS} ms of audio, have {ms:.0f} ms", "input_audio_buffer_commit_empty")
            return
        stream.utterance = None
        if stream.detector:
            stream.detector.reset()
        self._queue_final(stream, item_id, utt.audio())

    def _queue_final(self, stream: StreamState, item_id: str, audio: np.ndarray) -> None:
        stream.pending_finals += 1
        self._asr_jobs.appendleft(ASRJob(stream.stream_id, item_id, audio, final=True))

    def _run_vad(self) -> None:
        """Batched VAD: one model call per round, one 32 ms frame from each stream."""
        for _ in range(256):  # bounded: a backlog is worked off over several steps
            ready = [s for s in self.streams.values()
                     if s.detector is not None and len(s.pending) >= VAD_FRAME]
            if not ready:
                return
            frames = np.stack([s.pending[:VAD_FRAME] for s in ready])
            probs = self.models.vad.process(frames, [s.vad_state for s in ready])
            for stream, frame, prob in zip(ready, frames, probs, strict=True):
                stream.pending = stream.pending[VAD_FRAME:]
                self._on_vad_frame(stream, frame, float(prob))

    def _on_vad_frame(self, stream: StreamState, frame: np.ndarray, prob: float) -> None:
        det = stream.detector
        assert det is not None
        start_ms = stream.audio_ms
        stream.audio_ms += FRAME_MS
        stream.history.append(frame)
        event = det.update(prob, start_ms, FRAME_MS)
        if event == TurnEvent.STARTED:
            pad_ms = det.params.prefix_padding_ms
            first_ms = max(0.0, det.speech_start_ms - pad_ms)
            n = min(len(stream.history), int(round((stream.audio_ms - first_ms) / FRAME_MS)))
            utt = Utterance(new_item_id(), first_ms)
            for f in list(stream.history)[-n:]:
                utt.add(f)
            stream.utterance = utt
            self._outputs.append(p.SpeechStarted(stream.stream_id, int(det.speech_start_ms),
                                                 utt.item_id))
            return
        utt = stream.utterance
        if utt is None or det.state == TurnState.SILENCE and event is None:
            return
        utt.add(frame)
        if event == TurnEvent.STOPPED:
            stream.utterance = None
            self._outputs.append(p.SpeechStopped(stream.stream_id, int(det.last_voice_ms),
                                                 utt.item_id))
            self._queue_final(stream, utt.item_id, utt.audio())
            return
        interval = stream.config.partial_interval_ms * p.INPUT_RATE // 1000
        # Partials only on voiced frames: one started in the pause before the end of a
        # turn would still be running when the final transcript is needed.
        if (stream.config.transcribe_partials and not utt.partial_queued
                and prob >= det.params.threshold
                and utt.samples - utt.last_partial_samples >= interval):
            utt.partial_queued = True
            utt.last_partial_samples = utt.samples
            self._asr_jobs.append(ASRJob(stream.stream_id, utt.item_id, utt.audio(), final=False))

    # --------------------------------------------------------------------------- ASR

    def _start_asr(self) -> None:
        if self._asr_running is not None or not self._asr_jobs:
            return
        job = self._asr_jobs.popleft()
        fut = self._asr_pool.submit(_timed_call, self.models.asr.transcribe, job.audio)
        fut.add_done_callback(lambda _f: self._wake())
        self._asr_running = (job, fut)

    def _finish_asr(self) -> None:
        if self._asr_running is None or not self._asr_running[1].done():
            return
        job, fut = self._asr_running
        self._asr_running = None
        stream = self.streams.get(job.stream_id)
        if stream is None:
            return
        try:
            text, seconds = fut.result()
            text = text.strip()
        except Exception as exc:
            logger.exception("ASR failed")
            self._error(job.stream_id, f"transcription failed: {exc}", "asr_error")
            if job.final:
                self._final_done(stream)
            return
        if not job.final:
            utt = stream.utterance
            if utt is not None and utt.item_id == job.item_id:
                utt.partial_queued = False
                if text:
                    self._outputs.append(p.TranscriptPartial(job.stream_id, job.item_id, text))
            return
        if text:
            self._conversation_changed(stream)
            stream.conversation.add(job.item_id, "user", text)
        self._outputs.append(p.TranscriptFinal(job.stream_id, job.item_id, text, seconds * 1000))
        self._final_done(stream)

    def _final_done(self, stream: StreamState) -> None:
        """A final transcript landed (or failed): a response waiting for it may start."""
        stream.pending_finals -= 1
        if stream.pending_finals == 0 and stream.deferred is not None:
            msg, stream.deferred = stream.deferred, None
            self._create_response(stream, msg)

    # --------------------------------------------------------------------------- LLM

    def _create_response(self, stream: StreamState, msg: p.CreateResponse) -> None:
        """Start a response; one asked for while a user turn is still being transcribed
        waits for that transcript, so the reply always answers what was said."""
        if stream.response is not None or stream.deferred is not None:
            active = stream.response.response_id if stream.response else stream.deferred.response_id  # type: ignore[union-attr]
            self._error(stream.stream_id, "response: the conversation already has an active "
                        f"response {active!r}", "conversation_already_has_active_response")
            return
        if stream.pending_finals > 0:
            stream.deferred = msg
            return
        llm = self.models.llm
        if stream.slot is None:
            index = llm.alloc_slot()
            if index is None:
                self._error(stream.stream_id, "response: no free LLM slot (engine at "
                            "capacity), try again later", "capacity")
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
            request_id=f"{stream.stream_id}#{stream.responses}",
            slot=stream.slot,
            prompt=lambda: conversation.render(system, budget) + header,
            max_tokens=max_tokens,
            temperature=temperature,
            generator=generator,
        )
        stream.response = ResponseRun(msg.response_id, msg.item_id, cfg, request, new_chunker(),
                                      stream.config.speed)
        self.llm.add(request)

    def _speak(self, stream: StreamState, msg: p.Speak) -> None:
        if stream.response is not None or stream.deferred is not None:
            self._error(stream.stream_id, "speak: the stream already has an active response",
                        "conversation_already_has_active_response")
            return
        cfg = p.ResponseConfig(seed=msg.seed, voice=msg.voice)
        run = ResponseRun(msg.response_id, "", cfg, None, new_chunker(), msg.speed,
                          emitted=msg.text, llm_done=True)
        run.tts_queue.extend(run.chunker.push(msg.text) + run.chunker.flush())
        stream.response = run
        self._maybe_finish_response(stream.stream_id)

    def _start_llm(self) -> None:
        if self._llm_running is not None:
            return
        for req in self.llm.finished_with_error():
            self._llm_finished(req)
        plan = self.llm.schedule()
        for req in self.llm.finished_with_error():
            self._llm_finished(req)
        if plan is None:
            return
        fut = self._llm_pool.submit(_timed_call, self.llm.execute, plan)
        fut.add_done_callback(lambda _f: self._wake())
        self._llm_running = (plan, fut)

    def _finish_llm(self) -> None:
        if self._llm_running is None or not self._llm_running[1].done():
            return
        plan, fut = self._llm_running
        self._llm_running = None
        try:
            logits, seconds = fut.result()
        except Exception as exc:
            logger.exception("LLM step failed")
            for entry in plan.entries:
                req = self.llm.abort(entry.request.request_id)
                if req is not None:
                    req.finish = FinishReason.ERROR
                    self._llm_finished(req, f"LLM step failed: {exc}")
            return
        self.llm.update(plan, logits)
        for entry in plan.entries:
            req = entry.request
            response = self._response_of(req)
            if response is None:
                continue
            response.llm_ms += seconds * 1000
            self._emit_text(response, req)
            if req.finish is not None:
                self._llm_finished(req)

    def _response_of(self, req: GenerationRequest) -> ResponseRun | None:
        stream = self.streams.get(req.request_id.rsplit("#", 1)[0])
        if stream is None or stream.response is None or stream.response.request is not req:
            return None
        return stream.response

    def _emit_text(self, response: ResponseRun, req: GenerationRequest) -> None:
        text = self.models.llm.decode(req.generated)
        if text.endswith("\ufffd") and req.finish is None:  # wait for the rest of a UTF-8 char
            return
        if not text.startswith(response.emitted):  # a tokenizer merge rewrote the tail
            return
        delta = text[len(response.emitted):]
        if not delta:
            return
        response.emitted = text
        stream_id = req.request_id.rsplit("#", 1)[0]
        self._outputs.append(p.TextDelta(stream_id, response.response_id, delta))
        if response.config.audio:
            response.tts_queue.extend(response.chunker.push(delta))

    def _llm_finished(self, req: GenerationRequest, error: str | None = None) -> None:
        response = self._response_of(req)
        if response is None:
            return
        response.llm_done = True
        if req.finish == FinishReason.ERROR:
            stream_id = req.request_id.rsplit("#", 1)[0]
            self._error(stream_id, error or "the conversation no longer fits the model's "
                        "context window; delete items or start a new session", "context_length_exceeded")
        if response.config.audio:
            response.tts_queue.extend(response.chunker.flush())
        self._maybe_finish_response(req.request_id.rsplit("#", 1)[0])

    def _maybe_finish_response(self, stream_id: str, status: p.ResponseStatus | None = None) -> None:
        stream = self.streams[stream_id]
        response = stream.response
        if response is None:
            return
        if status is None:
            if not response.llm_done or response.tts_queue or response.tts_job is not None:
                return
            status = {
                FinishReason.STOP: p.ResponseStatus.COMPLETED,
                FinishReason.LENGTH: p.ResponseStatus.INCOMPLETE,
                FinishReason.ABORT: p.ResponseStatus.CANCELLED,
                FinishReason.ERROR: p.ResponseStatus.FAILED,
            }[response.request.finish if response.request and response.request.finish
              else FinishReason.STOP]
        req = response.request
        llm = self.models.llm
        text = response.emitted.strip()
        stream.response = None
        if req is None:
            self._outputs.append(p.ResponseDone(stream_id, response.response_id, status, text,
                                                tts_ms=response.tts_ms))
            return
        if req.generated:
            stream.conversation.add_generated(response.item_id, llm.generation_header(),
                                              req.generated, text, llm.message_footer(),
                                              response.spans)
        self._outputs.append(p.ResponseDone(
            stream_id, response.response_id, status, text,
            input_tokens=req.prompt_tokens, output_tokens=len(req.generated),
            cached_tokens=max(req.cached_tokens, 0), llm_ms=response.llm_ms,
            tts_ms=response.tts_ms))

    def _cancel_response(self, stream: StreamState) -> None:
        if stream.deferred is not None:
            msg, stream.deferred = stream.deferred, None
            self._outputs.append(p.ResponseDone(stream.stream_id, msg.response_id,
                                                p.ResponseStatus.CANCELLED, ""))
            return
        response = stream.response
        if response is None:
            return  # nothing to cancel is not an error (OpenAI: no-op)
        if response.request is not None:
            self.llm.abort(response.request.request_id)
        response.tts_queue.clear()
        self._drop_tts_job(response)
        self._maybe_finish_response(stream.stream_id, p.ResponseStatus.CANCELLED)

    def _truncate_item(self, stream: StreamState, msg: p.TruncateItem) -> None:
        """Cut an assistant item to its first `audio_end_ms` of audio (clamped to its length).

        The session validated the request against the audio it sent; here the item's own
        audio length is the bound, and a cut past it (a second truncate after an earlier,
        shorter one) keeps the item as it is rather than failing.
        """
        if stream.response is not None and stream.response.item_id == msg.item_id:
            self._cancel_response(stream)
        try:
            item = stream.conversation.find(msg.item_id)
        except ItemNotFound:
            # a reply cancelled before its first token never joined the conversation:
            # nothing was said, so nothing is left to cut
            self._outputs.append(p.ItemTruncated(stream.stream_id, msg.item_id, 0, ""))
            return
        if item.role != "assistant":
            self._error(stream.stream_id, f"truncate: item {msg.item_id!r} is a {item.role} "
                        "message; only assistant audio can be truncated", "invalid_value")
            return
        end_ms = min(msg.audio_end_ms, int(item.audio_ms))
        spans = cut_spans(item.spans, end_ms)
        text = " ".join(s.text.strip() for s in spans if s.text.strip())
        if text != item.text:
            self._conversation_changed(stream)
            item = stream.conversation.set_text(msg.item_id, text)
        item.spans = spans
        self._outputs.append(p.ItemTruncated(stream.stream_id, msg.item_id, end_ms, text))

    # --------------------------------------------------------------------------- TTS

    @staticmethod
    def _tts_ready(stream: StreamState) -> bool:
        r = stream.response
        return r is not None and bool(r.tts_queue) and r.tts_job is None

    def _drop_tts_job(self, response: ResponseRun) -> None:
        if response.tts_job is not None:
            self._tts_jobs.pop(response.tts_job, None)
            self._tts_cancels.append(response.tts_job)
            response.tts_job = None

    def _start_tts(self) -> None:
        """Between steps: apply cancels, hand each response its next segment, run a step."""
        if self._tts_running is not None:
            return
        stage = self.models.tts
        for job_id in self._tts_cancels:
            stage.cancel(job_id)
        self._tts_cancels.clear()
        for stream in self.streams.values():
            response = stream.response
            if not self._tts_ready(stream):
                continue
            assert response is not None
            self._job_ids += 1
            job = SpeechJob(self._job_ids, response.tts_queue.popleft(), response.speed,
                            response.config.seed, response.config.voice)
            response.tts_job = job.job_id
            self._tts_jobs[job.job_id] = (stream.stream_id, response.response_id)
            stage.start(job)
        if stage.has_work():
            fut = self._tts_pool.submit(_timed_call, stage.step)
            fut.add_done_callback(lambda _f: self._wake())
            self._tts_running = fut

    def _finish_tts(self) -> None:
        fut = self._tts_running
        if fut is None or not fut.done():
            return
        self._tts_running = None
        try:
            outs, seconds = fut.result()
        except Exception as exc:
            logger.exception("TTS step failed")
            for job_id, (stream_id, _rid) in list(self._tts_jobs.items()):
                self._tts_cancels.append(job_id)  # the stage must drop it too
                self._error(stream_id, f"speech synthesis failed: {exc}", "tts_error")
                self._on_speech(SpeechOut(job_id, np.zeros(0, np.float32), 1, "", True), 0.0)
            return
        for out in outs:
            self._on_speech(out, seconds * 1000)

    def _on_speech(self, out: SpeechOut, step_ms: float) -> None:
        owner = self._tts_jobs.get(out.job_id)
        if owner is None:
            return  # stale: the response was cancelled or replaced meanwhile
        stream_id, response_id = owner
        stream = self.streams.get(stream_id)
        response = stream.response if stream else None
        if response is None or response.response_id != response_id:
            self._tts_jobs.pop(out.job_id, None)
            return
        response.tts_ms += step_ms
        if len(out.audio):
            audio = np.asarray(out.audio, dtype=np.float32)
            ms = len(audio) * 1000 / out.sample_rate
            if out.text or not response.spans:
                response.spans.append(AudioSpan(response.audio_ms, response.audio_ms, out.text))
            response.spans[-1].end_ms += ms  # a continuation extends the open span
            response.audio_ms += ms
            self._outputs.append(p.AudioChunk(stream_id, response_id, audio.tobytes(),
                                              out.sample_rate, ms, out.text))
        if out.finished:
            self._tts_jobs.pop(out.job_id, None)
            response.tts_job = None
            self._maybe_finish_response(stream_id)
