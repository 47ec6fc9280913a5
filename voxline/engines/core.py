"""The engine core: the loop body that owns the streams, takes the inputs and holds the
stage table.

Stages (`voxline.engines.stage` says what schedule/execute/update mean for each):

    input audio -> VAD -> turns (`InputAudio`) -> ASR -> conversation      (`Turns`)
    CreateResponse -> LLM -> text chunker -> TTS -> audio out           (`Responses`)
    CreateVideo -> video (one chunk per step, when loaded) -> frames out  (registered)

Every stage is one row of the stage table (`voxline.engines.stage_table`): its stage,
the `StageWorker` that runs its model (VAD inline, one batched call per round; ASR, LLM
and TTS each on their own thread while the loop keeps taking inputs), and the callbacks
that route its outcomes and fail the owners of a failed plan. `has_work`, `step` and
`close` loop over the table, so every stage takes the same collect -> log -> fail ->
update -> route path. Only the loop thread touches state. A TTS segment starts as soon
as the text chunker closes it (async chunk): the first clause is spoken while the LLM
writes the rest.

Adding a stage takes its module and one registration (`stage_registry.STAGES`):
- the module holds the stage (`has_work`/`schedule`/`execute`/`update` over its own
  queue) and the routing of its outcomes to their owners by internal stream id, plus a
  `fail` that tells the owners of a failed plan (see `video_stage.Videos`);
- the registration loads its model from `Settings` (in the engine process), attaches it
  (its table rows, after the pipeline's; the engine inputs it handles; what a closed
  stream drops), gives its GPU footprint to capacity sizing, and warms it up. The core
  loops over the registrations: `Models.stages` holds their models by name, `_dispatch`
  hands their inputs over before its own cases, and `has_work`, `step` and `close`
  already cover every row. A new kind of input still gets its `protocol` message.

Routing is by internal stream id: an outcome whose stream has closed (or whose response
was cancelled or replaced) is dropped, so a stale chunk is never sent, and outputs
carry the caller's external id. See `streams` for stream identity and closing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from voxline.config import Settings, setting_default
from voxline.engines import protocol as p
from voxline.engines.asr_stage import ASRModel, ASRStage, fail_each, route_each
from voxline.engines.conversation import Conversation
from voxline.engines.input_audio import MAX_UTTERANCE_MS, InputAudio
from voxline.engines.llm_stage import STEP_TOKENS, ChatModel, LLMStage, plan_kind
from voxline.engines.remote_llm import RemoteChat, RemoteLLMStage
from voxline.engines.responses import Responses
from voxline.engines.speech_model import SpeechModel
from voxline.engines.stage import Backfill, RequestRefused, StageWorker
from voxline.engines.stage_registry import STAGES, InputHandler, StageContext, StagePart
from voxline.engines.stage_table import StageSlot, StageTable
from voxline.engines.streams import StreamRegistry, StreamState
from voxline.engines.tts_stage import TTSStage
from voxline.engines.turns import Turns
from voxline.engines.vad_stage import MAX_BACKLOG_MS, ROUNDS_PER_STEP, VADModel, VADStage
from voxline.engines.warm_prefill import WarmPrefills
from voxline.logs import GC_PAUSES

logger = logging.getLogger(__name__)

# A pause this long in a turn is transcribed and a reply started speculatively: long
# enough that the gaps between words rarely reach it, short enough that transcript,
# first clause and first audio are mostly ready when a 500 ms silence window closes.
# (Its home is the `speculate_after_ms` setting.)
DEFAULT_SPECULATE_AFTER_MS: float = setting_default("speculate_after_ms")
# How often a busy engine logs each stage's share of the wall clock (`StageTable.load_report`):
# the first place to look when sessions wait, e.g. which stage a GPU server saturates.
LOAD_REPORT_S = 10.0


@dataclass
class Models:
    """The conversation pipeline's models, and the registered stages' by name
    (`stage_registry.STAGES`; a missing one is off: no video model refuses videos, no
    end-of-turn model leaves semantic VAD to the words)."""

    vad: VADModel
    asr: ASRModel
    llm: ChatModel
    tts: SpeechModel
    stages: dict[str, Any] = field(default_factory=dict)
    # per stage name ("asr", "llm", "tts"): CUDA graphs its worker captures after the
    # engine is ready (`background_graphs`; `voxline.kernels.cuda_graphs.GraphBackfill`)
    backfills: dict[str, Backfill] = field(default_factory=dict)


class EngineCore:
    """All streams and stages of one engine; driven by `run_engine_loop`.

    `max_input_backlog_ms` bounds each stream's audio waiting for VAD,
    `max_utterance_ms` each manual-commit buffer; appends past them are refused.
    `max_responses` bounds the responses (replies and speech) in progress engine-wide.
    `speculate_after_ms` (0: off): a pause this long in a server-VAD turn starts the
    turn's transcript and reply speculatively (see `Responses.speculate`).
    `generation_lead_ms` (None: off): a reply whose playout is reported is generated at
    most this far ahead of it (flow control, see `Responses`).
    `warm_prefill`: partial transcripts prefill the reply's prompt while the user speaks,
    with spare capacity only (embedded LLM; see `warm_prefill`).
    `early_pause_transcript`: a pause transcript is taken where the speech fell silent,
    so it is mostly done when the pause is reported (see `turns`).
    `early_speculation`: under semantic VAD, that take starts the speculative reply
    when its words end a sentence, before the pause is reported (see `turns`).
    `llm_step_tokens`: the embedded LLM's tokens per batched step (`LLMStage.token_budget`).
    `max_videos`: videos rendered at once (the `video_streams` setting; see `Videos`).
    `video_voice_reserve_ms` (0: off): no video chunk starts while a spoken reply has less
    unplayed audio than this (`speech_pacing.VoiceReserve`).
    """

    def __init__(self, models: Models, wake: Callable[[], None], max_streams: int = 64,
                 max_input_backlog_ms: float = MAX_BACKLOG_MS,
                 max_utterance_ms: float = MAX_UTTERANCE_MS,
                 max_responses: int = setting_default("max_responses"),
                 speculate_after_ms: float = DEFAULT_SPECULATE_AFTER_MS,
                 generation_lead_ms: float | None = None, warm_prefill: bool = False,
                 early_pause_transcript: bool = True, early_speculation: bool = True,
                 llm_step_tokens: int = STEP_TOKENS,
                 max_videos: int = 4,
                 video_voice_reserve_ms: float = setting_default("video_voice_reserve_ms"),
                 ) -> None:
        self.models = models
        self.max_responses = max_responses
        self.max_utterance_ms = max_utterance_ms
        self.registry = StreamRegistry(max_streams)
        self.vad = VADStage(models.vad, max_input_backlog_ms)
        self.asr = ASRStage(models.asr)
        # The reply model: embedded (batched forward passes here) or a remote server.
        self.llm: LLMStage | RemoteLLMStage = (
            RemoteLLMStage(models.llm, wake) if isinstance(models.llm, RemoteChat)
            else LLMStage(models.llm, token_budget=llm_step_tokens))
        self.tts = TTSStage(models.tts)
        self._outputs: list[p.EngineOutput] = []
        self.responses = Responses(models.llm, self.llm, self.tts, self._outputs.append,
                                   self.registry.live, lead_ms=generation_lead_ms,
                                   voice_reserve_ms=video_voice_reserve_ms)
        self.warm = (WarmPrefills(models.llm, self.llm, self.responses, max_responses)
                     if warm_prefill and isinstance(self.llm, LLMStage) else None)
        self.responses.warm = self.warm
        self.turns = Turns(self.registry, self.vad, self.asr, self.responses,
                           self._outputs.append, speculate_after_ms, max_responses,
                           warm=self.warm, early_pause=early_pause_transcript,
                           early_speculation=early_speculation)
        context = StageContext(wake, self._outputs.append, self.registry.live, self.turns,
                               max_videos=max_videos, voice_low=self.responses.reserve.low)
        self.parts: dict[str, StagePart] = {
            reg.name: reg.attach(context, models.stages.get(reg.name)) for reg in STAGES}
        self._handlers: dict[type[p.EngineInput], InputHandler] = {
            kind: handle for part in self.parts.values() for kind, handle in part.handlers.items()}
        # `_release_closed` reads the LLM's running plan: KV slots a step in flight writes
        self._llm_worker = StageWorker(self.llm, wake, "voxline-llm",
                                       backfill=models.backfills.get("llm"))
        self.table = self._stage_table(wake)

    def _stage_table(self, wake: Callable[[], None]) -> StageTable:
        """The stages in table order. VAD runs first and inline, so the turns it ends
        reach ASR and the LLM in the same step; the LLM's plan lands before ASR's, so the
        KV slots it held for closed streams are free before a transcript starts a reply."""
        turns, responses, llm = self.turns, self.responses, self.llm
        llm_row = StageSlot("llm", llm, self._llm_worker, route=responses.route_llm,
                            fail=responses.fail_llm, settle=responses.end_refused,
                            landed=self._release_closed)
        if isinstance(llm, RemoteLLMStage):
            llm_row.on_close = llm.close  # its HTTP requests run outside the worker
        else:
            llm_row.note = llm.load_note
            llm_row.kind = plan_kind
        return StageTable([
            StageSlot("vad", self.vad, StageWorker(self.vad, wake, thread_name=None),
                      route=turns.on_frames, fail=turns.vad_failed, rounds=ROUNDS_PER_STEP),
            llm_row,
            StageSlot("asr", self.asr, StageWorker(self.asr, wake, "voxline-asr",
                                                   backfill=self.models.backfills.get("asr")),
                      route=route_each(turns.on_transcript), fail=fail_each(turns.asr_failed)),
            StageSlot("tts", self.tts, StageWorker(self.tts, wake, "voxline-tts",
                                                   backfill=self.models.backfills.get("tts")),
                      route=responses.route_speech, fail=responses.fail_speech,
                      waiting=responses.speech_ready, prepare=responses.start_speech,
                      note=self.tts.load_note),
            *(row for part in self.parts.values() for row in part.rows),
        ])

    @classmethod
    def from_settings(cls, models: Models, wake: Callable[[], None], settings: Settings, *,
                      max_streams: int) -> EngineCore:
        """The core the `settings` describe: the one place their engine fields are read."""
        return cls(models, wake, max_streams=max_streams, max_responses=settings.max_responses,
                   speculate_after_ms=settings.speculate_after_ms,
                   warm_prefill=settings.warm_prefill,
                   early_pause_transcript=settings.early_pause_transcript,
                   early_speculation=settings.early_speculation,
                   generation_lead_ms=settings.generation_lead_s * 1000 or None,
                   llm_step_tokens=settings.llm_step_tokens,
                   max_videos=settings.video_streams or 1,
                   video_voice_reserve_ms=settings.video_voice_reserve_ms)

    @property
    def streams(self) -> Mapping[str, StreamState]:
        """Open streams by the caller's id."""
        return self.registry.open_streams

    # ------------------------------------------------------------------ loop interface

    def has_work(self) -> bool:
        return bool(self._outputs) or self.table.has_work()

    def step(self) -> list[p.EngineOutput]:
        self.table.step()
        report = self.table.load_report(LOAD_REPORT_S)
        if report is not None:
            gc_note = GC_PAUSES.take()
            logger.info(report + (f"; {gc_note}" if gc_note else ""))
        out = list(self._outputs)
        self._outputs.clear()  # cleared in place: `Responses` and `Turns` append to it
        return out

    def close(self) -> None:
        for external_id in list(self.streams):
            self._close_stream(external_id, announce=False)
        self.table.close()
        self._release_closed(force=True)

    def add_input(self, msg: p.EngineInput) -> None:
        try:
            self._dispatch(msg)
        except RequestRefused as exc:
            self._error(msg.stream_id, str(exc), exc.code, exc.fatal)
        except Exception as exc:  # one bad input must not take down the engine
            logger.exception("input %s failed", type(msg).__name__)
            self._error(msg.stream_id, f"{type(msg).__name__} failed: {exc}",
                        p.ErrorCode.ENGINE_ERROR)

    # ---------------------------------------------------------------------- inputs

    def _dispatch(self, msg: p.EngineInput) -> None:
        if isinstance(msg, p.OpenStream):
            self._open_stream(msg)
            return
        stream = self.registry.get(msg.stream_id)
        if stream is None:
            self._error(msg.stream_id, f"{type(msg).__name__}: no open stream {msg.stream_id!r}",
                        p.ErrorCode.UNKNOWN_STREAM)
            return
        handler = self._handlers.get(type(msg))
        if handler is not None:  # a registered stage's input
            handler(stream, msg)
            return
        responses, turns = self.responses, self.turns
        match msg:
            case p.UpdateStream():
                responses.discard_speculation(stream)  # it answered with the old settings
                stream.config = msg.config
                turns.configure(stream, msg.config)
            case p.AppendAudio():
                turns.append(stream, np.frombuffer(msg.audio, dtype="<f4"))
            case p.CommitAudio():
                turns.commit(stream, msg.item_id)
            case p.ClearAudio():
                responses.discard_speculation(stream)
                if self.warm is not None:
                    self.warm.discard(stream)
                turns.clear(stream)
            case p.AddItem():
                responses.conversation_changed(stream)
                stream.conversation.add(msg.item_id, msg.role, msg.text, msg.previous_item_id,
                                        msg.images)
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
            case p.RegisterVoice():
                self._register_voice(msg)
            case p.CancelResponse():
                responses.cancel(stream)
            case p.PlayoutProgress():
                responses.playout(stream, msg)
            case p.CloseStream():
                self._close_stream(msg.stream_id, announce=True)

    def _open_stream(self, msg: p.OpenStream) -> None:
        internal_id = self.registry.new_id(msg.stream_id)
        audio_in = InputAudio(msg.config.turn_detection, self.max_utterance_ms,
                              self.turns.pause_ms(msg.config))
        stream = StreamState(internal_id, msg.stream_id, msg.config,
                             Conversation(self.models.llm.render_message), audio_in)
        self.turns.opened(stream)
        self.registry.add(stream)

    def _close_stream(self, external_id: str, announce: bool) -> None:
        """Abort every stream behind `external_id`; its resources go once no step uses them."""
        for stream in self.registry.close(external_id):
            self.responses.abort(stream)
            if self.warm is not None:
                self.warm.closed(stream)
            self.turns.closed(stream)
            for part in self.parts.values():
                part.closed(stream)
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
        once (an error naming the limit, then its `ResponseFinished`), so its caller never waits
        on a reply that will not come and the running ones keep their pace."""
        if self.responses.in_progress() < self.max_responses:
            return False
        self.responses.discard_speculation(stream)
        self._error(stream.external_id, f"the engine is generating its limit of "
                    f"{self.max_responses} responses at once; try again shortly",
                    p.ErrorCode.SERVER_BUSY)
        self._outputs.append(p.ResponseFinished(stream.external_id, msg.response_id,
                                            p.ResponseStatus.FAILED, ""))
        return True

    def _register_voice(self, msg: p.RegisterVoice) -> None:
        """Queued for the speech model's next step, so it is there for any later speech."""
        name = msg.reference.name
        if not name:
            raise RequestRefused("RegisterVoice: reference.name is required (the voice "
                                 "name later speech asks for)", p.ErrorCode.INVALID_VALUE)
        self.tts.register_voice(msg.reference)
        self._outputs.append(p.VoiceRegistered(msg.stream_id, name))

    def _error(self, stream_id: str, message: str, code: p.ErrorCode, fatal: bool = False) -> None:
        self._outputs.append(p.StreamError(stream_id, message, code, fatal))

