"""Server events: what a session tells its client, neutral of any wire.

The session actor builds these (canonical content types, audio payloads already in the
session's output format) and never thinks about wire dialects; a transport renders them
(``voxline.realtime.openai.server_events`` for OpenAI's GA and beta shapes). Every event gets a
fresh unique ``event_...`` id.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from voxline.errors import ProtocolError
from voxline.sessions.ids import new_id
from voxline.sessions.items import (
    ContentPart,
    ConversationItem,
    ErrorDetail,
    RateLimit,
    RealtimeResponse,
)
from voxline.sessions.settings import SessionSettings


class ServerEvent(BaseModel):
    """Base of every server event; each gets a fresh unique ``event_...`` id."""

    model_config = ConfigDict(strict=True, extra="forbid")

    event_id: str = Field(default_factory=lambda: new_id("event"))


class SessionCreated(ServerEvent):
    session_id: str
    session: SessionSettings


class SessionUpdated(ServerEvent):
    session_id: str
    session: SessionSettings


class ConversationCreated(ServerEvent):
    conversation_id: str


class SpeechStarted(ServerEvent):
    audio_start_ms: int
    item_id: str


class SpeechStopped(ServerEvent):
    audio_end_ms: int
    item_id: str


class InputAudioCommitted(ServerEvent):
    item_id: str
    previous_item_id: str | None = None


class InputAudioCleared(ServerEvent):
    pass


class InputAudioTimeoutTriggered(ServerEvent):
    """Idle timeout (``turn_detection.idle_timeout_ms``) fired; a response follows.

    GA only: beta has no such event, and strictly typed beta clients reject unknown ones.
    """

    audio_start_ms: int
    audio_end_ms: int
    item_id: str


class ItemAdded(ServerEvent):
    """An item entered the conversation (beta: ``conversation.item.created``)."""

    item: ConversationItem
    previous_item_id: str | None = None


class ItemDone(ServerEvent):
    """An item is final (GA only; beta clients get nothing)."""

    item: ConversationItem
    previous_item_id: str | None = None


class ItemRetrieved(ServerEvent):
    """Answer to ``conversation.item.retrieve``; the only event rendering audio bytes."""

    item: ConversationItem


class ItemTruncated(ServerEvent):
    item_id: str
    content_index: int
    audio_end_ms: int


class ItemDeleted(ServerEvent):
    item_id: str


class LogProb(BaseModel):
    """One transcript token's log-probability (``include`` asked for them)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    token: str
    logprob: float
    bytes: list[int]


class InputTranscriptionDelta(ServerEvent):
    """``logprobs``: the delta's tokens, when the session's ``include`` asks (else None)."""

    item_id: str
    content_index: int = 0
    delta: str
    logprobs: list[LogProb] | None = None


class InputTranscriptionCompleted(ServerEvent):
    """Final transcript of a user audio item; ``audio_seconds`` is rendered as its usage.
    ``logprobs``: the transcript's tokens, when the session's ``include`` asks."""

    item_id: str
    content_index: int = 0
    transcript: str
    audio_seconds: float
    logprobs: list[LogProb] | None = None


class InputTranscriptionFailed(ServerEvent):
    item_id: str
    content_index: int = 0
    error: ErrorDetail


class ResponseCreated(ServerEvent):
    response: RealtimeResponse


class ResponseDone(ServerEvent):
    response: RealtimeResponse


class OutputItemAdded(ServerEvent):
    response_id: str
    output_index: int
    item: ConversationItem


class OutputItemDone(ServerEvent):
    response_id: str
    output_index: int
    item: ConversationItem


class _ContentEvent(ServerEvent):
    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0


class ContentPartAdded(_ContentEvent):
    part: ContentPart


class ContentPartDone(_ContentEvent):
    part: ContentPart


class AudioDelta(_ContentEvent):
    """Output audio, already encoded in the session's output format; rendered as base64."""

    delta: bytes


class AudioDone(_ContentEvent):
    pass


class AudioTranscriptDelta(_ContentEvent):
    delta: str


class AudioTranscriptDone(_ContentEvent):
    transcript: str


class TextDelta(_ContentEvent):
    delta: str


class TextDone(_ContentEvent):
    text: str


class FunctionCallArgumentsDelta(ServerEvent):
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    delta: str


class FunctionCallArgumentsDone(ServerEvent):
    """The call's arguments are complete (also sent for a call cut off by a cancel)."""

    response_id: str
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str


class McpListToolsInProgress(ServerEvent):
    item_id: str


class McpListToolsCompleted(ServerEvent):
    item_id: str


class McpListToolsFailed(ServerEvent):
    item_id: str


class McpCallArgumentsDelta(ServerEvent):
    response_id: str
    item_id: str
    output_index: int
    delta: str


class McpCallArgumentsDone(ServerEvent):
    response_id: str
    item_id: str
    output_index: int
    arguments: str


class McpCallInProgress(ServerEvent):
    item_id: str
    output_index: int


class McpCallCompleted(ServerEvent):
    item_id: str
    output_index: int


class McpCallFailed(ServerEvent):
    item_id: str
    output_index: int


class VideoStarted(ServerEvent):
    """voxline extension ``response.output_video.started``: the response's video began.
    `video_id` names it (over the WebSocket, ``/v1/videos/{video_id}`` holds its MP4)."""

    response_id: str
    video_id: str
    prompt: str
    width: int
    height: int
    fps: int
    num_frames: int


class VideoChunk(ServerEvent):
    """voxline extension ``response.output_video.chunk``: chunk `index` of `total` made (all
    its pieces decoded), `frames` frames of it. Its pixels went before it, piece by piece,
    in `VideoFrames`."""

    response_id: str
    video_id: str
    index: int
    total: int
    frames: int


class VideoFrames(ServerEvent):
    """A decoded piece of chunk `index` of a video, as soon as the model made it: `pixels`
    (uint8 RGB, (frames, height, width, 3)) for the transport's video track or recorder
    only. Never sent to a client (`response.output_video.chunk` reports the progress)."""

    response_id: str
    video_id: str
    index: int
    piece: int
    frames: int
    width: int
    height: int
    fps: int
    pixels: bytes = Field(repr=False)


class VideoUpdated(ServerEvent):
    """voxline extension ``response.output_video.updated``: a ``response.video.update`` (or
    the ``show_video`` tool called again) was taken; the video's chunks not yet started
    show `prompt`, over what it showed so far."""

    response_id: str
    video_id: str
    prompt: str


class VideoDone(ServerEvent):
    """voxline extension ``response.output_video.done``: the video ended (``completed``,
    ``cancelled`` by response.cancel or barge-in, or ``failed`` with `error`)."""

    response_id: str
    video_id: str
    status: str
    error: str | None = None


class OutputAudioBufferStarted(ServerEvent):
    response_id: str


class OutputAudioBufferStopped(ServerEvent):
    response_id: str


class OutputAudioBufferCleared(ServerEvent):
    response_id: str


class DtmfEventReceived(ServerEvent):
    """A keypress on a SIP call (RFC 4733 telephone-event): OpenAI's
    ``input_audio_buffer.dtmf_event_received``; the digit does not enter the conversation."""

    event: str
    received_at: int  # Unix seconds


class RateLimitsUpdated(ServerEvent):
    rate_limits: list[RateLimit]


class ErrorEvent(ServerEvent):
    error: ErrorDetail

    @classmethod
    def from_exception(cls, exc: ProtocolError) -> ErrorEvent:
        return cls(error=ErrorDetail.from_exception(exc))


SERVER_EVENT_CLASSES: tuple[type[ServerEvent], ...] = (
    SessionCreated,
    SessionUpdated,
    ConversationCreated,
    SpeechStarted,
    SpeechStopped,
    InputAudioCommitted,
    InputAudioCleared,
    InputAudioTimeoutTriggered,
    ItemAdded,
    ItemDone,
    ItemRetrieved,
    ItemTruncated,
    ItemDeleted,
    InputTranscriptionDelta,
    InputTranscriptionCompleted,
    InputTranscriptionFailed,
    ResponseCreated,
    ResponseDone,
    OutputItemAdded,
    OutputItemDone,
    ContentPartAdded,
    ContentPartDone,
    AudioDelta,
    AudioDone,
    AudioTranscriptDelta,
    AudioTranscriptDone,
    TextDelta,
    TextDone,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    OutputAudioBufferStarted,
    OutputAudioBufferStopped,
    OutputAudioBufferCleared,
    DtmfEventReceived,
    RateLimitsUpdated,
    ErrorEvent,
    McpListToolsInProgress,
    McpListToolsCompleted,
    McpListToolsFailed,
    McpCallArgumentsDelta,
    McpCallArgumentsDone,
    McpCallInProgress,
    McpCallCompleted,
    McpCallFailed,
    VideoStarted,
    VideoChunk,
    VideoFrames,
    VideoUpdated,
    VideoDone,
)

# voxline's own Realtime extension events (not OpenAI's): sent only to a client that asked
# for them (a response.create with "video"); the openai SDK passes unknown types through.
VOXLINE_EXTENSION_EVENTS: tuple[type[ServerEvent], ...] = (VideoStarted, VideoChunk, VideoFrames,
                                                           VideoUpdated, VideoDone)
