"""The engine core: the loop body that owns the streams and routes work between stages.

Stages (`voxline.engines.stage` says what schedule/execute/update mean for each):

    input audio -> VAD -> turns (`InputAudio`) -> ASR -> conversation
    CreateResponse -> LLM -> text chunker -> TTS -> audio out   (`Responses`)

VAD runs inline (one batched call per round over every stream with a frame); ASR, LLM
and TTS each run on their own `StageWorker` thread while the loop keeps taking inputs.
Only the loop thread touches state. A TTS segment starts as soon as the text chunker
closes it (async chunk): the first clause is spoken while the LLM writes the rest.

Routing is by internal stream id: an outcome whose stream has closed (or whose response
was cancelled or replaced) is dropped, so a stale chunk is never sent, and outputs
carry the caller's external id. See `streams` for stream identity and closing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from voxline.engines import protocol as p
from voxline.engines.asr_stage import ASRJob, ASRModel, ASRStage
from voxline.engines.input_audio import (
    MAX_UTTERANCE_MS,
    InputAudio,
    PartialDue,
    TurnPaused,
    TurnResumed,
    TurnStarted,
    TurnStopped,
)
from voxline.engines.llm_stage import ChatModel, FinishReason, LLMStage
from voxline.engines.prompt_cache import Conversation
from voxline.engines.remote_llm import RemoteChat, RemoteLLMStage
from voxline.engines.responses import Responses
from voxline.engines.speech_stage import SpeechStage
from voxline.engines.stage import RequestRefused, StageWorker
from voxline.engines.streams import StreamRegistry, StreamState
from voxline.engines.tts_stage import TTSStage
from voxline.engines.vad_stage import MAX_BACKLOG_MS, ROUNDS_PER_STEP, VADModel, VADStage

logger = logging.getLogger(__name__)

# A pause this long in a turn is transcribed and a reply started speculatively: long
# enough that the gaps between words rarely reach it, short enough that transcript,
# first clause and first audio are mostly ready when a 500 ms silence window closes.
DEFAULT_SPECULATE_AFTER_MS = 160.0
# With speculation off, semantic turn detection still transcribes pauses this long.
SEMANTIC_PAUSE_MS = 160.0


@dataclass
class Models:
    vad: VADModel
    asr: ASRModel
    llm: ChatModel
    tts: SpeechStage


class EngineCore:
    """All streams and stages of one engine; driven by `run_engine_loop`.

    `max_input_backlog_ms` bounds each stream's audio waiting for VAD,
    `max_utterance_ms` each manual-commit buffer; appends past them are refused.
    `max_responses` bounds the responses (replies and speech) in progress engine-wide.
    `speculate_after_ms` (0: off): a pause this long in a server-VAD turn starts the
    turn's transcript and reply speculatively (see `Responses.speculate`).
    """

    def __init__(self, models: Models, wake: Callable[[], None], max_streams: int = 64,
                 max_input_backlog_ms: float = MAX_BACKLOG_MS,
                 max_utterance_ms: float = MAX_UTTERANCE_MS, max_responses: int = 8,
                 speculate_after_ms: float = DEFAULT_SPECULATE_AFTER_MS) -> None:
        self.models = models
        self.speculate_after_ms = speculate_after_ms
        self.max_responses = max_responses
        self.max_utterance_ms = max_utterance_ms
        self.registry = StreamRegistry(max_streams)
        self.vad = VADStage(models.vad, max_input_backlog_ms)
        self.asr = ASRStage(models.asr)
        # The reply model: embedded (batched forward passes here) or a remote server.
        self.llm: LLMStage | RemoteLLMStage = (
            RemoteLLMStage(models.llm, wake) if isinstance(models.llm, RemoteChat)
            else LLMStage(models.llm))
        self.tts = TTSStage(models.tts)
        self._vad_worker = StageWorker(self.vad, wake, thread_name=None)
        self._asr_worker = StageWorker(self.asr, wake, "voxline-asr")
        self._llm_worker = StageWorker(self.llm, wake, "voxline-llm")
        self._tts_worker = StageWorker(self.tts, wake, "voxline-tts")
        self._outputs: list[p.EngineOutput] = []
        self.responses = Responses(models.llm, self.llm, self.tts, self._outputs.append)

    @property
    def streams(self) -> Mapping[str, StreamState]:
        """Open streams by the caller's id."""
        return self.registry.open_streams

    # ------------------------------------------------------------------ loop interface

    def has_work(self) -> bool:
        if self._outputs:
            return True
        workers = (self._asr_worker, self._llm_worker, self._tts_worker)
        if any(w.done() for w in workers):
            return True
        if self._asr_worker.idle and self.asr.has_work():
            return True
        if self._llm_worker.idle and self.llm.has_work():
            return True
        if self._tts_worker.idle and (self.tts.has_work() or self.responses.speech_ready()):
            return True
        return self.vad.has_work()

    def step(self) -> list[p.EngineOutput]:
        self._finish_llm()
        self._release_closed()
        self._finish_asr()
        self._finish_tts()
        self._run_vad()
        self._asr_worker.start()
        self._start_tts()
        self._start_llm()
        out = list(self._outputs)
        self._outputs.clear()  # cleared in place: `Responses` appends to this list
        return out

    def close(self) -> None:
        for external_id in list(self.streams):
            self._close_stream(external_id, announce=False)
        for worker in (self._asr_worker, self._tts_worker, self._llm_worker):
            worker.close()
        if isinstance(self.llm, RemoteLLMStage):
            self.llm.close()
        self._release_closed(force=True)

    def add_input(self, msg: p.EngineInput) -> None:
        try:
            self._dispatch(msg)
        except RequestRefused as exc:
            self._error(msg.stream_id, str(exc), exc.code, exc.fatal)
        except Exception as exc:  # one bad input must not take down the engine
            logger.exception("input %s failed", type(msg).__name__)
            self._error(msg.stream_id, f"{type(msg).__name__} failed: {exc}", "engine_error")

    # ---------------------------------------------------------------------- inputs

    def _dispatch(self, msg: p.EngineInput) -> None:
        if isinstance(msg, p.OpenStream):
            self._open_stream(msg)
            return
        stream = self.registry.get(msg.stream_id)
        if stream is None:
            self._error(msg.stream_id, f"{type(msg).__name__}: no open stream {msg.stream_id!r}",
                        "unknown_stream")
            return
        responses = self.responses
        match msg:
            case p.UpdateStream():
                responses.discard_speculation(stream)  # it answered with the old settings
                stream.config = msg.config
                stream.input.pause_ms = self._pause_ms(msg.config)
                stream.input.configure(msg.config.turn_detection)
                self.vad.enable(stream.internal_id, stream.input.detector is not None)
            case p.AppendAudio():
                audio = np.frombuffer(msg.audio, dtype="<f4")
                if stream.input.detector is None:
                    stream.input.append_manual(audio)
                else:
                    self.vad.append(stream.internal_id, audio)
            case p.CommitAudio():
                utt = stream.input.commit()
                self._queue_final(stream, msg.item_id, utt.audio())
            case p.ClearAudio():
                responses.discard_speculation(stream)
                self.vad.clear(stream.internal_id)
                stream.input.clear()
            case p.AddItem():
                responses.conversation_changed(stream)
                stream.conversation.add(msg.item_id, msg.role, msg.text, msg.previous_item_id)
            case p.DeleteItem():
                # the session owns the item list; an item the engine never held (a reply
                # cancelled before its first token) has nothing to delete here
                if stream.conversation.has(msg.item_id):
                    stream.conversation.delete(msg.item_id)
                    responses.conversation_changed(stream)
            case p.TruncateItem():
                responses.truncate(stream, msg)
            case p.CreateResponse() | p.Speak() if self._refuse_response(stream, msg):
                pass
            case p.CreateResponse():
                responses.create(stream, msg)
            case p.Speak():
                responses.speak(stream, msg)
            case p.CancelResponse():
                responses.cancel(stream)
            case p.CloseStream():
                self._close_stream(msg.stream_id, announce=True)

    def _open_stream(self, msg: p.OpenStream) -> None:
        internal_id = self.registry.new_id(msg.stream_id)
        audio_in = InputAudio(msg.config.turn_detection, self.max_utterance_ms,
                              self._pause_ms(msg.config))
        stream = StreamState(internal_id, msg.stream_id, msg.config,
                             Conversation(self.models.llm.render_message), audio_in)
        self.vad.add_stream(internal_id, enabled=audio_in.detector is not None)
        self.registry.add(stream)

    def _close_stream(self, external_id: str, announce: bool) -> None:
        """Abort every stream behind `external_id`; its resources go once no step uses them."""
        for stream in self.registry.close(external_id):
            self.responses.abort(stream)
            self.asr.drop(stream.internal_id)
            self.vad.remove_stream(stream.internal_id)
        self._release_closed()
        if announce:
            self._outputs.append(p.StreamClosed(external_id))

    def _release_closed(self, force: bool = False) -> None:
        """Free closing streams' KV slots unless the LLM step in flight still writes them."""
        plan = self._llm_worker.running
        busy = set(plan.slots) if plan is not None and not force else set()
        for stream in self.registry.closing():
            if stream.slot is not None:
                if stream.slot.index in busy:
                    continue
                self.models.llm.free_slot(stream.slot.index)
                stream.slot = None
            self.registry.release(stream)

    def _refuse_response(self, stream: StreamState, msg: p.CreateResponse | p.Speak) -> bool:
        """Admission by capacity: past `max_responses` in progress, a new response fails at
        once (an error naming the limit, then its `ResponseDone`), so its caller never waits
        on a reply that will not come and the running ones keep their pace."""
        if self.responses.in_progress() < self.max_responses:
            return False
        self.responses.discard_speculation(stream)
        self._error(stream.external_id, f"the engine is generating its limit of "
                    f"{self.max_responses} responses at once; try again shortly", "server_busy")
        self._outputs.append(p.ResponseDone(stream.external_id, msg.response_id,
                                            p.ResponseStatus.FAILED, ""))
        return True

    def _error(self, stream_id: str, message: str, code: str, fatal: bool = False) -> None:
        self._outputs.append(p.StreamError(stream_id, message, code, fatal))

    # ------------------------------------------------------------------ VAD and ASR

    def _run_vad(self) -> None:
        """Batched VAD: one model call per round, one 32 ms frame from each stream."""
        for _ in range(ROUNDS_PER_STEP):  # bounded: a backlog is worked off over several steps
            if self._vad_worker.start() is None:
                return
            done = self._vad_worker.collect()
            assert done is not None  # inline: finished within start()
            if done.error is not None:
                logger.error("VAD failed", exc_info=done.error)
                self.vad.drop(done.plan)
                for sid in done.plan.stream_ids:
                    if (stream := self.registry.live(sid)) is not None:
                        self._error(stream.external_id, f"voice activity detection failed: "
                                    f"{done.error}; the audio waiting for it was discarded",
                                    "vad_error")
                return
            for frame in self.vad.update(done.plan, done.result):
                stream = self.registry.live(frame.stream_id)
                if stream is not None and stream.input.detector is not None:
                    self._on_vad_frame(stream, frame.frame, frame.prob)

    def _on_vad_frame(self, stream: StreamState, frame: np.ndarray, prob: float) -> None:
        cfg = stream.config
        turn = stream.input.on_frame(frame, prob, cfg.transcribe_partials, cfg.partial_interval_ms)
        sid = stream.external_id
        match turn:
            case TurnStarted():
                self.responses.discard_speculation(stream)  # (a lingering one: never asked for)
                self._outputs.append(p.SpeechStarted(sid, int(turn.audio_start_ms),
                                                     turn.utterance.item_id))
            case TurnStopped():
                utt = turn.utterance
                self._outputs.append(p.SpeechStopped(sid, int(turn.audio_end_ms), utt.item_id))
                if utt.pause_text is not None:  # no speech since the pause: it is the final
                    self._final_transcript(stream, utt.item_id, utt.pause_text, utt.pause_asr_ms)
                elif utt.pause_asr:  # the pause transcript becomes the final when it lands
                    utt.ended = True
                    stream.pending_finals += 1
                else:
                    self._queue_final(stream, utt.item_id, utt.audio())
            case TurnPaused():
                utt = turn.utterance
                utt.pause_asr = True
                self.asr.add(ASRJob(stream.internal_id, utt.item_id, utt.audio(), final=False,
                                    pause=utt, generation=utt.generation))
            case TurnResumed():
                self.responses.discard_speculation(stream)
            case PartialDue():
                utt = turn.utterance
                self.asr.add(ASRJob(stream.internal_id, utt.item_id, utt.audio(), final=False))

    def _pause_ms(self, config: p.StreamConfig) -> float:
        """How long a pause in a turn must last before it is transcribed: to speculate, or
        for semantic turn detection to judge the words (0: never)."""
        td = config.turn_detection
        if td is None:
            return 0.0
        if self.speculate_after_ms > 0:
            return self.speculate_after_ms
        return SEMANTIC_PAUSE_MS if td.eagerness is not None else 0.0

    def _queue_final(self, stream: StreamState, item_id: str, audio: np.ndarray) -> None:
        stream.pending_finals += 1
        self.asr.add(ASRJob(stream.internal_id, item_id, audio, final=True))

    def _finish_asr(self) -> None:
        done = self._asr_worker.collect()
        if done is None:
            return
        job = done.plan
        stream = self.registry.live(job.stream_id)
        if stream is None:
            return  # closed meanwhile
        if job.pause is not None:
            self._pause_transcribed(stream, job, done.result, done.error, done.seconds)
            return
        if done.error is not None:
            logger.error("ASR failed", exc_info=done.error)
            self._error(stream.external_id, f"transcription failed: {done.error}", "asr_error")
            if job.final:
                self.responses.transcript_landed(stream)
            return
        assert done.result is not None
        text = self.asr.update(job, done.result)
        if not job.final:
            utt = stream.input.utterance
            if utt is not None and utt.item_id == job.item_id:
                utt.partial_queued = False
                if text:
                    self._outputs.append(p.TranscriptPartial(stream.external_id, job.item_id, text))
            return
        self._final_transcript(stream, job.item_id, text, done.seconds * 1000)
        self.responses.transcript_landed(stream)

    def _final_transcript(self, stream: StreamState, item_id: str, text: str,
                          asr_ms: float) -> None:
        """The user item joins the conversation (a speculation may have added it already)."""
        if text and not stream.conversation.has(item_id):
            self.responses.conversation_changed(stream)
            stream.conversation.add(item_id, "user", text)
        self.responses.turn_ended(stream, item_id)
        self._outputs.append(p.TranscriptFinal(stream.external_id, item_id, text, asr_ms))

    def _pause_transcribed(self, stream: StreamState, job: ASRJob, result: str | None,
                           error: BaseException | None, seconds: float) -> None:
        """A pause transcript landed: the final one if the turn ended meanwhile; else the
        words semantic turn detection judges and a speculative reply starts from."""
        utt = job.pause
        assert utt is not None
        if job.generation != utt.generation:
            return  # speech resumed after the pause: void
        utt.pause_asr = False
        if error is not None:
            logger.error("ASR failed", exc_info=error)
            if utt.ended:  # no other transcript is coming: the turn's final failed
                self._error(stream.external_id, f"transcription failed: {error}", "asr_error")
                self.responses.transcript_landed(stream)
            return  # a failed pause transcript just means no speculation
        assert result is not None
        text = self.asr.update(job, result)
        if utt.ended:
            self._final_transcript(stream, job.item_id, text, seconds * 1000)
            self.responses.transcript_landed(stream)
            return
        utt.pause_text, utt.pause_asr_ms = text, seconds * 1000
        if stream.input.utterance is utt and stream.input.detector is not None:
            stream.input.detector.judge(text)
        # speculate only with room to spare: never at the cost of replies already running
        if self.speculate_after_ms > 0 and self.responses.in_progress() < self.max_responses:
            self.responses.speculate(stream, job.item_id, text)

    # -------------------------------------------------------------------------- LLM

    def _start_llm(self) -> None:
        if not self._llm_worker.idle:
            return
        self._llm_rejected()
        self._llm_worker.start()
        self._llm_rejected()

    def _llm_rejected(self) -> None:
        """Requests the scheduler refused (context too long) end their responses."""
        for req in self.llm.finished_with_error():
            stream = self.registry.live(req.stream_id)
            if stream is not None:
                self.responses.llm_finished(stream, req)

    def _finish_llm(self) -> None:
        done = self._llm_worker.collect()
        if done is None:
            return
        plan = done.plan
        if done.error is not None:
            logger.error("LLM step failed", exc_info=done.error)
            for entry in plan.entries:
                req = self.llm.abort(entry.request.request_id)
                if req is not None:
                    req.finish = FinishReason.ERROR
                    stream = self.registry.live(req.stream_id)
                    if stream is not None:
                        self.responses.llm_finished(stream, req, f"LLM step failed: {done.error}")
            return
        assert done.result is not None
        self.llm.update(plan, done.result)
        for entry in plan.entries:
            stream = self.registry.live(entry.request.stream_id)
            if stream is not None:
                self.responses.on_llm_step(stream, entry.request, done.seconds)

    # -------------------------------------------------------------------------- TTS

    def _start_tts(self) -> None:
        """Between steps: hand each response its next segment, then run a step."""
        if not self._tts_worker.idle:
            return
        self.responses.start_speech()
        self._tts_worker.start()

    def _finish_tts(self) -> None:
        done = self._tts_worker.collect()
        if done is None:
            return
        if done.error is not None:
            logger.error("TTS step failed", exc_info=done.error)
            for _job_id, owner in self.tts.fail(done.plan):
                stream = self.registry.live(owner.stream_id)
                if stream is not None:
                    self.responses.speech_failed(stream, owner, done.error)
            return
        assert done.result is not None
        for owner, out in self.tts.update(done.plan, done.result):
            stream = self.registry.live(owner.stream_id)
            if stream is not None:
                self.responses.on_speech(stream, owner, out, done.seconds * 1000)
