"""The Realtime session actor: one conversation's protocol state machine, sans I/O.

Inputs: parsed client events (`receive`), engine outputs (`on_engine`) and the clock
(`tick`); every call takes `now` (seconds, monotonic) and nothing here reads a clock
or touches a socket. Outputs: neutral server events (`take_events`, rendered per
dialect by the transport), engine inputs (`take_commands`) and metric observations.

The session decides *when*: turns (server VAD events from the engine), responses,
barge-in and truncation, and real-time pacing of output audio. The engine decides
how fast. Client mistakes become `error` events naming the event and the field; the
session and its buffered audio survive them.

Media tracks: with `media_format` set (a WebRTC call), audio travels on the transport's
media tracks both ways in that format, whatever the session's wire formats say: appended
input is decoded in it, and `AudioDelta` payloads are paced PCM frames of
`MEDIA_FRAME_MS` for the outgoing track, never wire events. The transport routes them.

One state machine in one file, so that every transition reads in one place.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from voxline.config import setting_default
from voxline.engines import protocol as ep
from voxline.errors import AudioFormatError, ProtocolError
from voxline.sessions import capabilities
from voxline.sessions import commands as cmd
from voxline.sessions import events as ev
from voxline.sessions import items as it
from voxline.sessions import transcription_sessions as ts
from voxline.sessions.audio import InputConverter, OutputEncoder
from voxline.sessions.capabilities import (
    check_overrides,
    check_supported,
    response_config,
    stream_config,
)
from voxline.sessions.errors_vocabulary import UNKNOWN_ITEM, Mistake, client_error
from voxline.sessions.function_calls import FunctionCalls
from voxline.sessions.ids import new_id
from voxline.sessions.images import ImageLimits, engine_images
from voxline.sessions.mcp import McpOutcome, McpRequest, McpTools
from voxline.sessions.pacing import OutFrame, OutputBufferFull, OutputPacer
from voxline.sessions.playout_lead import PlayoutReports
from voxline.sessions.records import ActiveResponse, ItemRecord, log_trace
from voxline.sessions.settings import AudioFormat, SessionSettings
from voxline.sessions.show_video import ShowVideoTool
from voxline.sessions.transcription import PartialTranscript, tokens_of_words, word_count
from voxline.sessions.video_responses import VideoResponses

logger = logging.getLogger(__name__)

_STATUS = {
    ep.ResponseStatus.COMPLETED: "completed",
    ep.ResponseStatus.CANCELLED: "cancelled",
    ep.ResponseStatus.INCOMPLETE: "incomplete",
    ep.ResponseStatus.FAILED: "failed",
}

MEDIA_FRAME_MS = 20  # one RTP packet of Opus: barge-in stops a track within one frame


def _logprobs(tokens: list[ep.TokenLogprob] | None, first: int = 0,
              stop: int | None = None) -> list[ev.LogProb] | None:
    """The engine's transcript tokens as events carry them: all, or those of words
    `first` .. `stop` - 1 (a delta's); None when the stream did not ask for them."""
    if tokens is None:
        return None
    picked = tokens if stop is None else tokens_of_words(tokens, first, stop)
    return [ev.LogProb(token=t.token, logprob=t.logprob, bytes=list(t.utf8)) for t in picked]


def _role(item: it.ConversationItem) -> str:
    """A message's role, else the item's type (``function_call``...)."""
    return item.role if isinstance(item, it.MessageItem) else item.type


@dataclass
class SessionActor:
    session_id: str
    stream_id: str
    settings: SessionSettings = field(default_factory=SessionSettings)
    lead_ms: float = setting_default("output_lead_ms")
    max_event_bytes: int = setting_default("max_event_bytes")
    media_format: AudioFormat | None = None  # audio on media tracks (see the module doc)
    # The transport learns what the listener heard (e.g. Twilio's mark echoes) and sends
    # TruncateItem itself; the actor then never truncates from its own playout clock.
    transport_reports_playout: bool = False
    # The reply model can call functions (a remote backend): session.tools are accepted.
    tools_supported: bool = False
    # ... and the server has a video model: the model is offered show_video (sessions.show_video)
    show_video_tool: bool = False
    # Why the server cannot speak with a named voice (e.g. a clone that is not registered),
    # or None when it can; None here: every name is accepted (a one-voice TTS speaks all).
    voice_error: Callable[[str], str | None] | None = None
    # The reply model reads images, within these bounds; None: input_image is refused.
    images: ImageLimits | None = None
    transcription: capabilities.TranscriptionSupport = capabilities.MOONSHINE  # ASR hints taken
    playout: PlayoutReports = field(default_factory=PlayoutReports.off)  # engine flow control

    def __post_init__(self) -> None:
        self.images_accepted = 0  # over the session's life (see sessions.images)
        self.events: list[ev.ServerEvent] = []
        self.commands: list[ep.EngineInput] = []
        self.observations: list[tuple[str, float]] = []
        self.items: dict[str, ItemRecord] = {}
        self.order: list[str] = []  # item ids in conversation order
        self.response: ActiveResponse | None = None
        self.barged_in: str | None = None  # the last response a barge-in cut, until the next
        self.pacer = OutputPacer(self.lead_ms)
        self.input = self._new_input()
        self.manual_buffer_ms = 0.0  # audio appended since the last commit/clear (manual turns)
        self.turn_ms: dict[str, float] = {}  # user audio item -> its length (transcription usage)
        self.speech_start_ms = 0.0
        self.in_speech: str | None = None  # item id of the user turn being spoken
        self.speech_stopped_at: float | None = None
        self.last_activity: float = 0.0  # for idle_timeout_ms
        self.closed: it.ErrorDetail | None = None  # set when the session must end
        self.reply_after_cancel = False  # a turn ended while the interrupted reply winds down
        self.conversation_id = new_id("conv")
        self.partials: dict[str, PartialTranscript] = {}  # user item -> deltas sent so far
        self.playing: str | None = None  # response whose audio the client is playing
        self.last_audio_response: str | None = None
        self.mcp = McpTools(self)  # MCP tools: listing, calls, approvals (sessions/mcp.py)
        self.calls = FunctionCalls(self)  # client-run tools' items (sessions/function_calls.py)
        self.video = VideoResponses(self)  # a response's video (sessions/video_responses.py)
        self.show_video = ShowVideoTool(self, self.show_video_tool)  # sessions/show_video.py

    # ------------------------------------------------------------------------ outputs

    def take_events(self) -> list[ev.ServerEvent]:
        out, self.events = self.events, []
        return out

    def take_commands(self) -> list[ep.EngineInput]:
        out, self.commands = self.commands, []
        return out

    def take_mcp_requests(self) -> list[McpRequest]:
        """MCP network work for the runner; its outcomes come back through `on_mcp`."""
        return self.mcp.take_requests()

    def engine_stream_config(self) -> ep.StreamConfig:
        """The engine stream's config now: the session's settings and every tool offered."""
        mcp_tools = self.mcp.function_tools()
        return stream_config(self.settings, (*mcp_tools, *self.show_video.function_tools()))

    def emit(self, event: ev.ServerEvent) -> None:
        self.events.append(event)

    def send_error(self, message: str, *, code: str, event_id: str | None = None,
                   param: str | None = None, type: str = "invalid_request_error") -> None:
        self.emit(ev.ErrorEvent(error=it.ErrorDetail(type=type, code=code, message=message,
                                                     param=param, event_id=event_id)))

    # ---------------------------------------------------------------------- lifecycle

    def start(self, now: float) -> None:
        self.last_activity = now
        self.commands.append(ep.OpenStream(self.stream_id, self.engine_stream_config()))
        self.emit(ev.SessionCreated(session_id=self.session_id, session=self.settings))
        self.mcp.configure(self.settings.tools)

    def expire(self, max_seconds: float) -> None:
        """The session hit its time limit; the transport closes it after this event."""
        self.send_error(f"session reached its maximum duration of {max_seconds:.0f} s",
                        code="session_expired")

    def protocol_error(self, exc: ProtocolError) -> None:
        """A client message that failed to parse (transport-level)."""
        self.emit(ev.ErrorEvent.from_exception(exc))

    # ------------------------------------------------------------------ client events

    def receive(self, event: cmd.ClientCommand, now: float) -> None:
        handler: Callable[[cmd.ClientCommand, float], None] = self._handlers()[type(event)]
        try:
            handler(event, now)
        except ProtocolError as exc:
            if exc.event_id is None:
                exc.event_id = event.event_id
            self.protocol_error(exc)

    def _handlers(self) -> dict[type, Callable]:
        return {
            cmd.SessionUpdate: self._session_update,
            cmd.InputAudioAppend: self._append,
            cmd.InputAudioCommit: self._commit,
            cmd.InputAudioClear: self._clear,
            cmd.ItemCreate: self._item_create,
            cmd.ItemRetrieve: self._item_retrieve,
            cmd.ItemTruncate: self._item_truncate,
            cmd.ItemDelete: self._item_delete,
            cmd.ResponseCreate: self._response_create,
            cmd.ResponseCancel: self._response_cancel,
            cmd.OutputAudioClear: self._output_clear,
            cmd.ResponseVideoUpdate: self.video.update,
        }

    def _new_input(self) -> InputConverter:
        fmt = self.media_format or self.settings.input_format
        return InputConverter(fmt.encoding, fmt.rate)

    def _session_update(self, e: cmd.SessionUpdate, now: float) -> None:
        old = self.settings
        new = ts.check_session_kind(old, old.apply(e.changes), conversation_started=bool(
            self.order))
        # refused: the session keeps its settings
        check_supported(new, tools_supported=self.tools_supported,
                        transcription=self.transcription)
        if new.voice != old.voice:
            self._check_voice(new.voice, "session.update", "session.audio.output.voice")
        self.settings = new
        if self.media_format is None and self.settings.input_format != old.input_format:
            self.input = self._new_input()
        self.commands.append(ep.UpdateStream(self.stream_id, self.engine_stream_config()))
        self.emit(ev.SessionUpdated(session_id=self.session_id, session=self.settings))
        self.mcp.configure(self.settings.tools)

    def _append(self, e: cmd.InputAudioAppend, now: float) -> None:
        if len(e.audio) > self.max_event_bytes:
            raise ProtocolError(f"input_audio_buffer.append: audio is {len(e.audio)} bytes, "
                                f"more than the {self.max_event_bytes} allowed",
                                code="invalid_value", param="audio")
        try:
            samples = self.input.convert(e.audio)
        except AudioFormatError as exc:
            raise ProtocolError(f"input_audio_buffer.append: {exc}", code="invalid_value",
                                param="audio") from exc
        if self.settings.turn_detection is None:
            self.manual_buffer_ms += len(samples) * 1000 / ep.INPUT_RATE
        if len(samples):
            self.commands.append(ep.AppendAudio(self.stream_id, samples.astype("<f4").tobytes()))

    def _commit(self, e: cmd.InputAudioCommit, now: float) -> None:
        if self.settings.turn_detection is None:
            if self.manual_buffer_ms < ep.MIN_COMMIT_MS:
                raise client_error(
                    Mistake.COMMIT_EMPTY, "input_audio_buffer.commit: buffer too small: expected "
                    f"at least {ep.MIN_COMMIT_MS} ms of audio, have {self.manual_buffer_ms:.0f} ms",
                    min_ms=ep.MIN_COMMIT_MS, have_ms=self.manual_buffer_ms)
            item_id = new_id("item")
            self.turn_ms[item_id] = self.manual_buffer_ms
        elif self.in_speech is not None:
            item_id, self.in_speech = self.in_speech, None
        else:
            raise client_error(Mistake.COMMIT_EMPTY, "input_audio_buffer.commit: the buffer "
                               "holds no speech to commit (server VAD commits turns itself)",
                               min_ms=ep.MIN_COMMIT_MS, have_ms=0.0)
        self.manual_buffer_ms = 0.0
        self.commands.append(ep.CommitAudio(self.stream_id, item_id))
        self._user_audio_item(item_id)
        self.speech_stopped_at = now

    def _clear(self, e: cmd.InputAudioClear, now: float) -> None:
        self.manual_buffer_ms = 0.0
        self.in_speech = None
        self.commands.append(ep.ClearAudio(self.stream_id))
        self.emit(ev.InputAudioCleared())

    def _user_audio_item(self, item_id: str) -> None:
        previous = self.order[-1] if self.order else None
        item = it.MessageItem(id=item_id, role="user", status="completed",
                              content=[it.ContentPart(type="input_audio", transcript=None)])
        self.add_record(ItemRecord(item, pending_transcript=True))
        self.emit(ev.InputAudioCommitted(item_id=item_id, previous_item_id=previous))
        self.emit(ev.ItemAdded(item=item, previous_item_id=previous))

    def add_record(self, record: ItemRecord, previous_item_id: str | None = None) -> None:
        """Add after `previous_item_id` (None: at the end; "root": at the start)."""
        assert record.item.id is not None
        self.items[record.item.id] = record
        if previous_item_id is None:
            self.order.append(record.item.id)
        elif previous_item_id == ep.CONVERSATION_START:
            self.order.insert(0, record.item.id)
        else:
            self.order.insert(self.order.index(previous_item_id) + 1, record.item.id)

    def _find(self, item_id: str, event: str) -> ItemRecord:
        record = self.items.get(item_id)
        if record is None:
            raise client_error(UNKNOWN_ITEM[event], f"{event}: no item with id {item_id!r} in "
                               "the conversation", param="item_id", item_id=item_id)
        return record

    def _item_create(self, e: cmd.ItemCreate, now: float) -> None:
        item = e.item
        if isinstance(item, it.McpApprovalResponseItem):
            return self.mcp.approval(item, e.previous_item_id)
        if isinstance(item, it.MCP_ITEM_TYPES):
            raise ProtocolError(f"conversation.item.create: {item.type} items are made by the "
                                "server", code="invalid_value", param="item.type")
        if not isinstance(item, it.MessageItem):
            self._check_tool_item(item)
        for i, part in enumerate(item.content if isinstance(item, it.MessageItem) else ()):
            if part.type == "input_audio" and part.transcript is None:
                raise ProtocolError("conversation.item.create: audio content is not supported; "
                                    "send audio with input_audio_buffer.append or give a "
                                    "transcript", code="invalid_value",
                                    param=f"item.content[{i}].audio")
        images = engine_images(item.content, self.images, self.images_accepted) \
            if isinstance(item, it.MessageItem) else ()
        item = item.with_id()
        assert item.id is not None
        if item.id in self.items:
            raise client_error(Mistake.CREATE_DUPLICATE_ITEM, "conversation.item.create: an item "
                               f"with id {item.id!r} already exists", param="item.id",
                               item_id=item.id)
        if item.id == ep.CONVERSATION_START:
            raise ProtocolError(f"conversation.item.create: item id {item.id!r} is reserved "
                                "(previous_item_id 'root' means the start of the conversation)",
                                code="invalid_value", param="item.id")
        # "root": at the start (OpenAI's meaning); an item id: right after that item
        previous = e.previous_item_id
        if previous not in (None, ep.CONVERSATION_START) and previous not in self.items:
            raise client_error(Mistake.CREATE_UNKNOWN_PREVIOUS_ITEM, "conversation.item.create: "
                               f"no item with id {previous!r} in the conversation",
                               param="previous_item_id", previous_item_id=previous)
        self.add_record(ItemRecord(item), previous)
        self.images_accepted += len(images)
        self.commands.append(ep.AddItem(self.stream_id, item.id, *it.engine_message(item), previous,
                                        images=images))
        prev = self.previous_item(item.id)
        self.emit(ev.ItemAdded(item=item, previous_item_id=prev))
        self.emit(ev.ItemDone(item=item, previous_item_id=prev))
        if isinstance(item, it.FunctionCallOutputItem) and (held := self.calls.answered()):
            self.receive(held, now)  # its own errors carry its own event_id

    def _check_tool_item(self, item: it.FunctionCallItem | it.FunctionCallOutputItem) -> None:
        if not self.tools_supported:
            raise ProtocolError(f"conversation.item.create: {item.type} items are not supported "
                                "(the embedded model calls no tools)", code="invalid_value",
                                param="item.type")
        if isinstance(item, it.FunctionCallOutputItem) and not any(
                isinstance(r.item, it.FunctionCallItem) and r.item.call_id == item.call_id
                for r in self.items.values()):
            raise ProtocolError(f"conversation.item.create: no function_call item with call_id "
                                f"{item.call_id!r} in the conversation", code="invalid_value",
                                param="item.call_id")

    def _item_retrieve(self, e: cmd.ItemRetrieve, now: float) -> None:
        self.emit(ev.ItemRetrieved(item=self._find(e.item_id, "conversation.item.retrieve").item))

    def _item_delete(self, e: cmd.ItemDelete, now: float) -> None:
        self._find(e.item_id, "conversation.item.delete")
        if self.response is not None and self.response.item_id == e.item_id:
            raise ProtocolError("conversation.item.delete: the item is being generated; cancel "
                                "the response first", code="invalid_value", param="item_id")
        del self.items[e.item_id]
        self.order.remove(e.item_id)
        self.commands.append(ep.DeleteItem(self.stream_id, e.item_id))
        self.emit(ev.ItemDeleted(item_id=e.item_id))

    def _item_truncate(self, e: cmd.ItemTruncate, now: float) -> None:
        record = self._find(e.item_id, "conversation.item.truncate")
        if _role(record.item) != "assistant":
            raise ProtocolError(f"conversation.item.truncate: item {e.item_id!r} is a "
                                f"{_role(record.item)} item; only assistant audio can be "
                                "truncated", code="invalid_value", param="item_id")
        if e.content_index != 0:
            raise ProtocolError("conversation.item.truncate: the item has one content part; "
                                f"content_index must be 0, got {e.content_index}",
                                code="invalid_value", param="content_index")
        if e.audio_end_ms < 0:
            raise ProtocolError("conversation.item.truncate: audio_end_ms must be >= 0, got "
                                f"{e.audio_end_ms}", code="invalid_value", param="audio_end_ms")
        if e.audio_end_ms > record.sent_ms + 1:
            raise client_error(Mistake.TRUNCATE_PAST_AUDIO, "conversation.item.truncate: "
                               f"audio_end_ms {e.audio_end_ms} is beyond the audio sent for item "
                               f"{e.item_id!r} ({record.sent_ms:.0f} ms)", param="audio_end_ms",
                               audio_ms=round(record.sent_ms), audio_end_ms=e.audio_end_ms)
        if self.response is not None and self.response.item_id == e.item_id:
            self._cancel(now, it.StatusReason.CLIENT_CANCELLED, interrupt=True)
        # The client owns playback: its cut replaces the server's playout estimate. After
        # an earlier, shorter cut the engine clamps this one to what is left.
        record.client_truncated = True
        self.commands.append(ep.TruncateItem(self.stream_id, e.item_id, e.audio_end_ms))

    def _response_create(self, e: cmd.ResponseCreate, now: float) -> None:
        params = e.overrides
        if not self.settings.responds:
            raise ts.refuse_response()
        if self.calls.hold(e):  # parallel calls: the reply waits for every output
            return
        if params is not None and params.out_of_band:
            raise ProtocolError("response.create: out-of-band responses (conversation: 'none') "
                                "are not supported", code="invalid_value",
                                param="response.conversation")
        if params is not None and params.custom_input:
            raise ProtocolError("response.create: a custom input list is not supported",
                                code="invalid_value", param="response.input")
        if params is not None:
            check_overrides(params, session_tools=self.settings.tools,
                            tools_supported=self.tools_supported)
            if params.voice is not None:
                self._check_voice(params.voice, "response.create", "response.audio.output.voice")
        settings = params.apply_to(self.settings) if params is not None else self.settings
        self._start_response(settings, now, trigger=now, metadata=params.metadata if params else None)
        self.video.start(self.response, params)

    def _check_voice(self, voice: str, event: str, param: str) -> None:
        why = self.voice_error(voice) if self.voice_error is not None else None
        if why is not None:
            raise ProtocolError(f"{event}: {why}", code="invalid_value", param=param)

    def _response_cancel(self, e: cmd.ResponseCancel, now: float) -> None:
        r = self.response
        if r is None and self.barged_in is not None and e.response_id in (None, self.barged_in):
            return  # the client's cancel of the reply a barge-in already ended: done
        if r is None and self.video.cancel_lingering(e.response_id):
            return  # a show_video video that outlived its response
        if r is None:
            raise client_error(Mistake.CANCEL_NOT_ACTIVE,
                               "response.cancel: there is no response in progress")
        if e.response_id is not None and e.response_id != r.response.id:
            raise client_error(Mistake.CANCEL_NOT_ACTIVE, f"response.cancel: response "
                               f"{e.response_id!r} is not in progress (the active one is "
                               f"{r.response.id!r})", param="response_id")
        if r.cancel_reason is not None:
            # already cancelled (a barge-in) but its response.done is not out yet: on the
            # wire it is still active, so a client's cancel racing the server's is a no-op
            return
        self._cancel(now, it.StatusReason.CLIENT_CANCELLED, interrupt=False)

    def _output_clear(self, e: cmd.OutputAudioClear, now: float) -> None:
        rid = self.playing or self.last_audio_response
        if rid is None:
            raise ProtocolError("output_audio_buffer.clear: no response has sent audio in this "
                                "session, so there is no output audio buffer to clear",
                                code="invalid_value")
        self.pacer.interrupt(now)
        self.playing = None
        self.emit(ev.OutputAudioBufferCleared(response_id=rid))

    # ---------------------------------------------------------------------- responses

    def _start_response(self, settings: SessionSettings, now: float, *, trigger: float,
                        metadata: dict[str, str] | None = None) -> None:
        if self.response is not None:
            active = self.response.response.id
            raise client_error(Mistake.RESPONSE_ALREADY_ACTIVE, "response.create: conversation "
                               f"already has an active response {active!r}", response_id=active)
        response = it.RealtimeResponse.start(settings, conversation_id=self.conversation_id,
                                             metadata=metadata)
        item_id = new_id("item")
        r = ActiveResponse(response, item_id, settings, started=now, trigger=trigger)
        if r.audio and self.media_format is not None:
            r.encoder = OutputEncoder(self.media_format.encoding, self.media_format.rate,
                                      frame_ms=MEDIA_FRAME_MS)
        elif r.audio:
            r.encoder = OutputEncoder(settings.output_format.encoding, settings.output_format.rate)
        self.response = r
        self.barged_in = None
        part_type = "output_audio" if r.audio else "output_text"
        item = it.MessageItem(id=item_id, role="assistant", status="in_progress", content=[])
        previous = self.order[-1] if self.order else None
        self.add_record(ItemRecord(item))
        self.emit(ev.ResponseCreated(response=response))
        self.emit(ev.OutputItemAdded(response_id=response.id, output_index=0, item=item))
        self.emit(ev.ItemAdded(item=item, previous_item_id=previous))
        part = it.ContentPart(type=part_type, transcript="" if r.audio else None,
                              text=None if r.audio else "")
        self.emit(ev.ContentPartAdded(response_id=response.id, item_id=item_id, part=part))
        cfg = response_config(settings, self.settings)
        cfg = capabilities.with_tool_overrides(cfg, settings, self.settings)
        self.commands.append(ep.CreateResponse(self.stream_id, response.id, item_id, cfg))

    def _cancel(self, now: float, reason: it.StatusReason, *, interrupt: bool) -> None:
        r = self.response
        if r is None or r.cancel_reason is not None:
            return
        r.cancel_reason = reason
        if interrupt:
            self.pacer.interrupt(now)
        else:
            self.pacer.clear(now)
        self._buffer_cleared()
        self.commands.append(ep.CancelResponse(self.stream_id))
        self.video.cancel()

    def _buffer_cleared(self) -> None:
        """The client's output audio buffer was dropped (barge-in, cancel)."""
        if self.playing is not None:
            self.emit(ev.OutputAudioBufferCleared(response_id=self.playing))
            self.playing = None

    def _finish_response(self, now: float) -> None:
        r = self.response
        assert r is not None and r.engine_done is not None
        done = r.engine_done
        self.response = None
        rid, item_id = r.response.id, r.item_id
        status = _STATUS.get(done.status, "failed")
        if status == "completed" and r.cancel_reason is not None:
            # generated in full but cut off while it played (we pace playout, so a
            # response is in progress until its audio has played): the client heard less
            status = "cancelled"
        reason = None
        if status == "cancelled":
            reason = r.cancel_reason or it.StatusReason.CLIENT_CANCELLED
            if reason == it.StatusReason.TURN_DETECTED:
                self.barged_in = rid
        elif status == "incomplete":
            reason = it.StatusReason.MAX_OUTPUT_TOKENS
        record = self.items.get(item_id)
        heard = self.pacer.heard_ms(item_id, now)
        text = r.transcript.strip()
        part = (it.ContentPart(type="output_audio", transcript=text) if r.audio
                else it.ContentPart(type="output_text", text=text))
        item = it.MessageItem(id=item_id, role="assistant",
                              status="completed" if status == "completed" else "incomplete",
                              content=[part])
        if record is not None:
            record.item = item
        if r.audio:
            self.emit(ev.AudioDone(response_id=rid, item_id=item_id))
            self.emit(ev.AudioTranscriptDone(response_id=rid, item_id=item_id, transcript=text))
        else:
            self.emit(ev.TextDone(response_id=rid, item_id=item_id, text=text))
        self.emit(ev.ContentPartDone(response_id=rid, item_id=item_id, part=part))
        self.emit(ev.OutputItemDone(response_id=rid, output_index=0, item=item))
        self.emit(ev.ItemDone(item=item, previous_item_id=self.previous_item(item_id)))
        usage = it.ResponseUsage(
            total_tokens=done.input_tokens + done.output_tokens,
            input_tokens=done.input_tokens, output_tokens=done.output_tokens,
            input_token_details=it.InputTokenDetails(cached_tokens=done.cached_tokens,
                                                     text_tokens=done.input_tokens),
            output_token_details=it.OutputTokenDetails(text_tokens=done.output_tokens))
        calls = [self.items[c].item for c in r.calls if c in self.items]
        final = r.response.model_copy(update={"output": [item, *calls]}).finished(
            status, reason=reason, usage=usage)  # type: ignore[arg-type]
        self.emit(ev.ResponseDone(response=final))
        self.observations.append(("voxline_response_seconds", now - r.started))
        log_trace(self.settings.tracing, self.session_id, r, final, now)
        if (r.audio and record is not None and r.cancel_reason == it.StatusReason.TURN_DETECTED
                and not record.client_truncated and done.output_tokens
                and not self.transport_reports_playout):
            # server-VAD barge-in: the conversation keeps only what the user heard, by the
            # server's playout clock. After a client's response.cancel the client owns
            # playback and truncates (or not) itself.
            self.commands.append(ep.TruncateItem(self.stream_id, item_id, int(heard)))
        self.last_activity = now
        if self.reply_after_cancel:
            self.reply_after_cancel = False
            self._start_response(self.settings, now, trigger=self.speech_stopped_at or now)

    def previous_item(self, item_id: str) -> str | None:
        """The item before `item_id` in conversation order (None: first, or unknown)."""
        i = self.order.index(item_id) if item_id in self.order else 0
        return self.order[i - 1] if i > 0 else None

    # ------------------------------------------------------------------ engine output

    def on_engine(self, out: ep.EngineOutput, now: float) -> None:
        match out:
            case ep.VoiceStarted():
                self._speech_started(out, now)
            case ep.VoiceStopped():
                self._speech_stopped(out, now)
            case ep.TranscriptPartial():
                self._transcript_partial(out)
            case ep.TranscriptFinal():
                self._transcript_final(out)
            case ep.ReplyTextDelta():
                self._text_delta(out)
            case ep.FunctionCallDelta() | ep.FunctionCallDone() if self.show_video.owns(out.name):
                self.show_video.on_call(self._current(out.response_id), out)
            case ep.FunctionCallDelta() | ep.FunctionCallDone() if self.mcp.owner(out.name):
                self.mcp.on_call(self._current(out.response_id), out)
            case ep.FunctionCallDelta():
                self.calls.delta(self._current(out.response_id), out)
            case ep.FunctionCallDone():
                self.calls.done(self._current(out.response_id), out)
            case ep.AudioChunk():
                self._audio_chunk(out, now)
            case ep.ResponseFinished():
                self._engine_response_done(out, now)
            case ep.VideoChunk() | ep.VideoDone():
                self.video.on_engine(out)
            case ep.TruncationApplied():
                self._item_truncated(out)
            case ep.StreamError():
                self._engine_error(out)
            case ep.Speculation():
                self.observations.append((f"voxline_speculation_{out.outcome}_total", 1.0))
            case ep.StreamClosed():
                pass
        self.tick(now)

    def on_mcp(self, out: McpOutcome, now: float) -> None:
        """The result of an MCP request the runner ran (see `take_mcp_requests`)."""
        self.mcp.on_outcome(out, now)
        self.tick(now)

    def _speech_started(self, out: ep.VoiceStarted, now: float) -> None:
        self.in_speech = out.item_id
        self.speech_start_ms = out.audio_start_ms
        self.last_activity = now
        self.emit(ev.SpeechStarted(audio_start_ms=out.audio_start_ms, item_id=out.item_id))
        td = self.settings.turn_detection
        if td is None or not td.interrupt_response:
            return
        if self.response is None:
            self.video.cancel()  # barge-in stops a show_video video that outlived its response
        if self.response is not None:  # barge-in
            self._cancel(now, it.StatusReason.TURN_DETECTED, interrupt=True)
        elif self.pacer.buffered_ms(now) > 0:
            # the reply finished generating but was still playing: cut it where it stopped
            last = next((i for i in reversed(self.order)
                         if _role(self.items[i].item) == "assistant"), None)
            heard = self.pacer.heard_ms(last, now) if last else 0.0
            self.pacer.interrupt(now)
            self._buffer_cleared()
            if (last is not None and heard < self.items[last].audio_ms
                    and not self.transport_reports_playout):
                self.commands.append(ep.TruncateItem(self.stream_id, last, int(heard)))

    def _speech_stopped(self, out: ep.VoiceStopped, now: float) -> None:
        self.in_speech = None
        self.speech_stopped_at = now
        self.turn_ms[out.item_id] = max(0.0, out.audio_end_ms - self.speech_start_ms)
        self.emit(ev.SpeechStopped(audio_end_ms=out.audio_end_ms, item_id=out.item_id))
        self._user_audio_item(out.item_id)
        td = self.settings.turn_detection
        if td is None or not td.create_response or not self.settings.responds:
            return
        if self.response is None:
            self._start_response(self.settings, now, trigger=now)
        elif self.response.cancel_reason is not None:
            self.reply_after_cancel = True  # answer once the cancelled reply has finished

    def _transcript_partial(self, out: ep.TranscriptPartial) -> None:
        if not self.settings.transcription_enabled:
            return
        partial = self.partials.setdefault(out.item_id, PartialTranscript())
        sent = word_count(partial.sent)
        delta = partial.delta(out.text)
        if delta:
            self.emit(ev.InputTranscriptionDelta(
                item_id=out.item_id, delta=delta,
                logprobs=_logprobs(out.logprobs, sent, word_count(partial.sent))))

    def _transcript_final(self, out: ep.TranscriptFinal) -> None:
        partial = self.partials.pop(out.item_id, None)
        record = self.items.get(out.item_id)
        if record is None:
            return
        record.pending_transcript = False
        record.item = record.item.model_copy(update={"content": [
            it.ContentPart(type="input_audio", transcript=out.text)]})
        if self.settings.transcription_enabled:
            partial = partial or PartialTranscript()
            sent = word_count(partial.sent)
            rest = partial.final_delta(out.text)
            if rest:
                self.emit(ev.InputTranscriptionDelta(
                    item_id=out.item_id, delta=rest,
                    logprobs=_logprobs(out.logprobs, sent, word_count(partial.sent))))
            seconds = self.turn_ms.pop(out.item_id, 0.0) / 1000
            self.emit(ev.InputTranscriptionCompleted(
                item_id=out.item_id, transcript=out.text, audio_seconds=seconds,
                logprobs=_logprobs(out.logprobs)))
        self.emit(ev.ItemDone(item=record.item, previous_item_id=self.previous_item(out.item_id)))

    def _current(self, response_id: str) -> ActiveResponse | None:
        r = self.response
        return r if r is not None and r.response.id == response_id else None

    def _text_delta(self, out: ep.ReplyTextDelta) -> None:
        r = self._current(out.response_id)
        if r is None or r.cancel_reason is not None:
            return
        r.transcript += out.text
        if r.audio:
            self.emit(ev.AudioTranscriptDelta(response_id=r.response.id, item_id=r.item_id,
                                              delta=out.text))
        else:
            self.emit(ev.TextDelta(response_id=r.response.id, item_id=r.item_id, delta=out.text))

    def _audio_chunk(self, out: ep.AudioChunk, now: float) -> None:
        r = self._current(out.response_id)
        if r is None or r.cancel_reason is not None or r.encoder is None:
            return
        audio = np.frombuffer(out.audio, dtype="<f4")
        try:
            for payload, ms in r.encoder.push(audio, out.sample_rate):
                self.pacer.push(OutFrame(r.response.id, r.item_id, payload, ms))
        except OutputBufferFull as exc:
            # a reply far longer than anyone listens to: cut it as if it hit its limit
            self.send_error(f"the response's audio ran too far ahead of playout: {exc}; the "
                            "response was cut", code="output_buffer_full", type="server_error")
            self._cancel(now, it.StatusReason.MAX_OUTPUT_TOKENS, interrupt=False)

    def _engine_response_done(self, out: ep.ResponseFinished, now: float) -> None:
        r = self._current(out.response_id)
        if r is None:
            return
        r.engine_done = out
        if out.first_token_ms is not None:
            self.observations.append(("voxline_llm_first_token_seconds",
                                      out.first_token_ms / 1000))
        if r.encoder is not None and r.cancel_reason is None:
            for payload, ms in r.encoder.flush():
                self.pacer.push(OutFrame(r.response.id, r.item_id, payload, ms))

    def _item_truncated(self, out: ep.TruncationApplied) -> None:
        record = self.items.get(out.item_id)
        if record is None:
            return
        record.audio_ms = min(record.audio_ms, out.audio_end_ms)
        # the engine clamped a cut past the item's (already truncated) audio
        record.item = record.item.model_copy(update={"content": [
            it.ContentPart(type="output_audio", transcript=out.text)]})
        self.emit(ev.ItemTruncated(item_id=out.item_id, content_index=0,
                                   audio_end_ms=out.audio_end_ms))

    def _engine_error(self, out: ep.StreamError) -> None:
        if out.fatal:
            self.closed = it.ErrorDetail(type="server_error", code=out.code, message=out.message)
            self.emit(ev.ErrorEvent(error=self.closed))
            return
        self.send_error(out.message, code=out.code, param=out.param, type="server_error"
                        if ep.ErrorCode(out.code).server_side else "invalid_request_error")

    # ---------------------------------------------------------------------- the clock

    def tick(self, now: float) -> None:
        """Send output audio that is due; finish a response whose audio has all been sent."""
        for frame in self.pacer.due(now):
            r = self._current(frame.response_id)
            if r is None:
                continue
            if not r.buffer_started:
                r.buffer_started = True
                if self.playing is not None:  # the previous reply's audio was all sent
                    self.emit(ev.OutputAudioBufferStopped(response_id=self.playing))
                self.playing = self.last_audio_response = r.response.id
                self.emit(ev.OutputAudioBufferStarted(response_id=r.response.id))
            if r.first_audio is None:
                r.first_audio = now
                self.observations.append(("voxline_first_audio_seconds", now - r.trigger))
            record = self.items.get(frame.item_id)
            if record is not None:
                record.audio_ms += frame.ms
                record.sent_ms += frame.ms
            self.emit(ev.AudioDelta(response_id=r.response.id, item_id=r.item_id,
                                    delta=frame.payload))
        r = self.response
        self.commands.extend(self.playout.report(self.stream_id, r, self.pacer, now))
        if (r is not None and r.engine_done is not None and not self.pacer.pending(r.response.id)
                and not self.video.holds(r.response.id)
                and (r.cancel_reason is not None or not self.mcp.holds(r.response.id))):
            self._finish_response(now)
        mcp_results = self.mcp.take_follow_up()  # MCP results the model has not answered yet
        if self.show_video.take_follow_up() or mcp_results:  # ... or a show_video result
            self._start_response(self.settings, now, trigger=now)
        self._check_played_out(now)
        self._check_idle(now)

    def _stop_owed(self) -> bool:
        """The buffer playing belongs to a finished response: it owes its `stopped`
        (a response still in progress may send more audio)."""
        return self.playing is not None and (
            self.response is None or self.response.response.id != self.playing)

    def _check_played_out(self, now: float) -> None:
        """`output_audio_buffer.stopped` once a finished response's audio has played."""
        rid = self.playing
        if not self._stop_owed() or self.pacer.pending(rid) or self.pacer.buffered_ms(now) > 0:
            return
        assert rid is not None
        self.playing = None
        self.emit(ev.OutputAudioBufferStopped(response_id=rid))

    def _check_idle(self, now: float) -> None:
        td = self.settings.turn_detection
        if (td is None or td.idle_timeout_ms is None or self.response is not None
                or not self.settings.responds or self.in_speech is not None
                or self.pacer.buffered_ms(now) > 0):
            return
        if now - self.last_activity >= td.idle_timeout_ms / 1000:
            # As OpenAI does: the silent stretch is committed as an (empty) user audio
            # item, and the model answers it.
            item_id = new_id("item")
            end = int(self.input.received_ms)
            self.emit(ev.InputAudioTimeoutTriggered(
                audio_start_ms=max(0, end - td.idle_timeout_ms), audio_end_ms=end,
                item_id=item_id))
            self._user_audio_item(item_id)
            self._transcript_final(ep.TranscriptFinal(self.stream_id, item_id, ""))
            self.commands.append(ep.AddItem(self.stream_id, item_id, "user", "", None))
            self.last_activity = now
            self._start_response(replace(self.settings), now, trigger=now)

    def next_deadline(self, now: float) -> float | None:
        """When `tick` must run next even if nothing arrives (None: only on input)."""
        deadlines = []
        d = self.pacer.next_deadline(now)
        if d is not None:
            deadlines.append(d)
        if self.playing is not None and (self.pacer.play_end > now or self._stop_owed()):
            # played out; a stop owed since a tick whose clock read fell just short of the
            # end is due at once (the end has passed: `buffered_ms` is 0 from here on)
            deadlines.append(self.pacer.play_end)
        td = self.settings.turn_detection
        if td is not None and td.idle_timeout_ms is not None and self.response is None:
            deadlines.append(self.last_activity + td.idle_timeout_ms / 1000)
        return min(deadlines) if deadlines else None
