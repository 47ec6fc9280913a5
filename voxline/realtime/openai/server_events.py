"""Server events on the wire: the one place that knows both OpenAI dialects' shapes.

The session emits neutral events (:mod:`voxline.sessions.events`); :func:`render` gives
the JSON object a GA or beta client expects. Every GA/beta difference on the way out
goes through here: :data:`_WIRE_TYPES` (event type names), the ``render_*`` helpers
(content part types, response objects) and :func:`~voxline.realtime.openai.session_object.render_session`.
``render`` returns None where a dialect has no such event (beta has no
``conversation.item.done``); the transport then sends nothing.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any, NamedTuple

from pydantic import BaseModel

from voxline.realtime.openai.dialect import Dialect
from voxline.realtime.openai.session_object import beta_format_name, render_session
from voxline.sessions import events as mcp_ev  # the MCP events (GA only)
from voxline.sessions.events import (
    SERVER_EVENT_CLASSES,
    AudioDelta,
    AudioDone,
    AudioTranscriptDelta,
    AudioTranscriptDone,
    ContentPartAdded,
    ContentPartDone,
    ConversationCreated,
    DtmfEventReceived,
    ErrorEvent,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    InputAudioCleared,
    InputAudioCommitted,
    InputAudioTimeoutTriggered,
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    InputTranscriptionFailed,
    ItemAdded,
    ItemDeleted,
    ItemDone,
    ItemRetrieved,
    ItemTruncated,
    OutputAudioBufferCleared,
    OutputAudioBufferStarted,
    OutputAudioBufferStopped,
    OutputItemAdded,
    OutputItemDone,
    RateLimitsUpdated,
    ResponseCreated,
    ResponseDone,
    ServerEvent,
    SessionCreated,
    SessionUpdated,
    SpeechStarted,
    SpeechStopped,
    TextDelta,
    TextDone,
    VideoChunk,
    VideoDone,
    VideoFrames,
    VideoStarted,
    VideoUpdated,
)
from voxline.sessions.items import (
    ITEM_TYPES,
    MCP_ITEM_TYPES,
    ContentPart,
    ConversationItem,
    FunctionCallItem,
    MessageItem,
    RealtimeResponse,
)


class WireTypes(NamedTuple):
    ga: str
    beta: str | None


_WIRE_TYPES: dict[type[ServerEvent], WireTypes] = {
    SessionCreated: WireTypes("session.created", "session.created"),
    SessionUpdated: WireTypes("session.updated", "session.updated"),
    ConversationCreated: WireTypes("conversation.created", "conversation.created"),
    SpeechStarted: WireTypes(
        "input_audio_buffer.speech_started", "input_audio_buffer.speech_started"
    ),
    SpeechStopped: WireTypes(
        "input_audio_buffer.speech_stopped", "input_audio_buffer.speech_stopped"
    ),
    InputAudioCommitted: WireTypes("input_audio_buffer.committed", "input_audio_buffer.committed"),
    InputAudioCleared: WireTypes("input_audio_buffer.cleared", "input_audio_buffer.cleared"),
    InputAudioTimeoutTriggered: WireTypes("input_audio_buffer.timeout_triggered", None),
    ItemAdded: WireTypes("conversation.item.added", "conversation.item.created"),
    ItemDone: WireTypes("conversation.item.done", None),
    ItemRetrieved: WireTypes("conversation.item.retrieved", "conversation.item.retrieved"),
    ItemTruncated: WireTypes("conversation.item.truncated", "conversation.item.truncated"),
    ItemDeleted: WireTypes("conversation.item.deleted", "conversation.item.deleted"),
    InputTranscriptionDelta: WireTypes(
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.delta",
    ),
    InputTranscriptionCompleted: WireTypes(
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.input_audio_transcription.completed",
    ),
    InputTranscriptionFailed: WireTypes(
        "conversation.item.input_audio_transcription.failed",
        "conversation.item.input_audio_transcription.failed",
    ),
    ResponseCreated: WireTypes("response.created", "response.created"),
    ResponseDone: WireTypes("response.done", "response.done"),
    OutputItemAdded: WireTypes("response.output_item.added", "response.output_item.added"),
    OutputItemDone: WireTypes("response.output_item.done", "response.output_item.done"),
    ContentPartAdded: WireTypes("response.content_part.added", "response.content_part.added"),
    ContentPartDone: WireTypes("response.content_part.done", "response.content_part.done"),
    AudioDelta: WireTypes("response.output_audio.delta", "response.audio.delta"),
    AudioDone: WireTypes("response.output_audio.done", "response.audio.done"),
    AudioTranscriptDelta: WireTypes(
        "response.output_audio_transcript.delta", "response.audio_transcript.delta"
    ),
    AudioTranscriptDone: WireTypes(
        "response.output_audio_transcript.done", "response.audio_transcript.done"
    ),
    TextDelta: WireTypes("response.output_text.delta", "response.text.delta"),
    TextDone: WireTypes("response.output_text.done", "response.text.done"),
    FunctionCallArgumentsDelta: WireTypes(
        "response.function_call_arguments.delta", "response.function_call_arguments.delta"
    ),
    FunctionCallArgumentsDone: WireTypes(
        "response.function_call_arguments.done", "response.function_call_arguments.done"
    ),
    OutputAudioBufferStarted: WireTypes(
        "output_audio_buffer.started", "output_audio_buffer.started"
    ),
    OutputAudioBufferStopped: WireTypes(
        "output_audio_buffer.stopped", "output_audio_buffer.stopped"
    ),
    OutputAudioBufferCleared: WireTypes(
        "output_audio_buffer.cleared", "output_audio_buffer.cleared"
    ),
    DtmfEventReceived: WireTypes("input_audio_buffer.dtmf_event_received", None),  # SIP, GA
    RateLimitsUpdated: WireTypes("rate_limits.updated", "rate_limits.updated"),
    ErrorEvent: WireTypes("error", "error"),
    mcp_ev.McpListToolsInProgress: WireTypes("mcp_list_tools.in_progress", None),
    mcp_ev.McpListToolsCompleted: WireTypes("mcp_list_tools.completed", None),
    mcp_ev.McpListToolsFailed: WireTypes("mcp_list_tools.failed", None),
    mcp_ev.McpCallArgumentsDelta: WireTypes("response.mcp_call_arguments.delta", None),
    mcp_ev.McpCallArgumentsDone: WireTypes("response.mcp_call_arguments.done", None),
    mcp_ev.McpCallInProgress: WireTypes("response.mcp_call.in_progress", None),
    mcp_ev.McpCallCompleted: WireTypes("response.mcp_call.completed", None),
    mcp_ev.McpCallFailed: WireTypes("response.mcp_call.failed", None),
    # voxline extensions (sent only when a response asked for video): same in both dialects
    VideoStarted: WireTypes("response.output_video.started",
                            "response.output_video.started"),
    VideoChunk: WireTypes("response.output_video.chunk", "response.output_video.chunk"),
    VideoFrames: WireTypes(None, None),  # pixels for the track or recorder only
    VideoUpdated: WireTypes("response.output_video.updated",
                            "response.output_video.updated"),
    VideoDone: WireTypes("response.output_video.done", "response.output_video.done"),
}

assert set(_WIRE_TYPES) == set(SERVER_EVENT_CLASSES), "every server event has wire names"

_PAYLOAD_FIELDS: dict[type[ServerEvent], tuple[str, ...]] = {  # excluded fields stay local
    cls: tuple(name for name, info in cls.model_fields.items()
               if name != "event_id" and not info.exclude) for cls in _WIRE_TYPES
}
# OpenAI's schema gives these no event_id
_WITHOUT_EVENT_ID: frozenset[type[ServerEvent]] = frozenset({DtmfEventReceived})
_BETA_PART_TYPES = {"output_text": "text", "output_audio": "audio"}


def wire_type(event_class: type[ServerEvent], dialect: Dialect) -> str | None:
    """The ``type`` string ``event_class`` has on the wire in ``dialect`` (None: not sent)."""
    names = _WIRE_TYPES[event_class]
    return names.ga if dialect is Dialect.GA else names.beta


def render_part(part: ContentPart, dialect: Dialect, *, include_audio: bool = False) -> dict[str, Any]:
    """A content part on the wire; beta names assistant parts ``text`` / ``audio``."""
    kind = _BETA_PART_TYPES.get(part.type, part.type) if dialect is Dialect.BETA else part.type
    if part.type == "input_image":  # as sent (GA's shape; beta has no image parts)
        image: dict[str, Any] = {"type": kind, "image_url": part.image_url}
        return image if part.detail is None else {**image, "detail": part.detail}
    if not part.is_audio:
        return {"type": kind, "text": part.text or ""}
    out: dict[str, Any] = {"type": kind, "transcript": part.transcript}
    if include_audio and part.audio is not None:
        out["audio"] = part.audio
    return out


def render_item(
    item: ConversationItem, dialect: Dialect, *, include_audio: bool = False
) -> dict[str, Any]:
    """A ``realtime.item``; audio bytes only with ``include_audio`` (item retrieval)."""
    if isinstance(item, MCP_ITEM_TYPES):  # OpenAI's MCP items have no object or status
        return {"id": item.id, **item.model_dump(exclude={"id", "status"})}
    out: dict[str, Any] = {
        "id": item.id,
        "object": "realtime.item",
        "type": item.type,
        "status": item.status,
    }
    if isinstance(item, MessageItem):
        out["role"] = item.role
        out["content"] = [
            render_part(p, dialect, include_audio=include_audio) for p in item.content
        ]
    elif isinstance(item, FunctionCallItem):
        out.update(name=item.name, call_id=item.call_id, arguments=item.arguments)
    else:
        out.update(call_id=item.call_id, output=item.output)
    return out


def render_response(response: RealtimeResponse, dialect: Dialect) -> dict[str, Any]:
    """A ``realtime.response`` object in ``dialect``'s shape."""
    audio = "audio" in response.output_modalities
    tokens: int | str = "inf" if response.max_output_tokens is None else response.max_output_tokens
    out: dict[str, Any] = {
        "object": "realtime.response",
        "id": response.id,
        "status": response.status,
        "status_details": (
            response.status_details.model_dump(mode="json", exclude_none=True)
            if response.status_details
            else None
        ),
        "output": [render_item(item, dialect) for item in response.output],
        "conversation_id": response.conversation_id,
    }
    if dialect is Dialect.GA:
        out["output_modalities"] = ["audio"] if audio else ["text"]
        out["max_output_tokens"] = tokens
        out["audio"] = {
            "output": {"format": response.output_format.to_document(), "voice": response.voice}
        }
    else:
        out["modalities"] = ["text", "audio"] if audio else ["text"]
        out["max_output_tokens"] = tokens
        out["voice"] = response.voice
        out["output_audio_format"] = beta_format_name(response.output_format)
        out["temperature"] = response.temperature
    out["usage"] = response.usage.model_dump() if response.usage else None
    out["metadata"] = response.metadata
    return out


# Beta names a transcription session's events apart (GA has session.* for both kinds).
_BETA_TRANSCRIPTION_TYPES: dict[type[ServerEvent], str] = {
    SessionCreated: "transcription_session.created",
    SessionUpdated: "transcription_session.updated",
}


def _render_session(event: SessionCreated | SessionUpdated, dialect: Dialect) -> dict[str, Any]:
    # The beta session type declares `id` but no `object`; OpenAI's GA server sends both
    # (its published examples do) although the GA SDK type declares neither; its beta
    # server sends both in a transcription session's object.
    head: dict[str, Any] = {"id": event.session_id}
    transcribing = event.session.kind == "transcription"
    if dialect is Dialect.GA or transcribing:
        head["object"] = "realtime.transcription_session" if transcribing else "realtime.session"
    return {"session": {**head, **render_session(event.session, dialect)}}


def _render_conversation(event: ConversationCreated, dialect: Dialect) -> dict[str, Any]:
    return {"conversation": {"id": event.conversation_id, "object": "realtime.conversation"}}


def _render_retrieved(event: ItemRetrieved, dialect: Dialect) -> dict[str, Any]:
    return {"item": render_item(event.item, dialect, include_audio=True)}


def _render_transcription(event: InputTranscriptionCompleted, dialect: Dialect) -> dict[str, Any]:
    out: dict[str, Any] = {
        "item_id": event.item_id,
        "content_index": event.content_index,
        "transcript": event.transcript,
        "usage": {"type": "duration", "seconds": event.audio_seconds},
    }
    if event.logprobs is not None:  # only when the session's `include` asks for them
        out["logprobs"] = [lp.model_dump() for lp in event.logprobs]
    return out


def _render_transcription_delta(event: InputTranscriptionDelta, dialect: Dialect
                                ) -> dict[str, Any]:
    out: dict[str, Any] = {"item_id": event.item_id, "content_index": event.content_index,
                           "delta": event.delta}
    if event.logprobs is not None:
        out["logprobs"] = [lp.model_dump() for lp in event.logprobs]
    return out


def _render_part_event(event: ContentPartAdded | ContentPartDone, dialect: Dialect) -> dict[str, Any]:
    # OpenAI's schema types response.content_part.* parts as "text"/"audio" in both
    # dialects, unlike item content (GA "output_text"/"output_audio").
    return {
        "response_id": event.response_id,
        "item_id": event.item_id,
        "output_index": event.output_index,
        "content_index": event.content_index,
        "part": render_part(event.part, Dialect.BETA),
    }


def _render_arguments_done(event: FunctionCallArgumentsDone, dialect: Dialect) -> dict[str, Any]:
    out = {"response_id": event.response_id, "item_id": event.item_id,
           "output_index": event.output_index, "call_id": event.call_id,
           "arguments": event.arguments}
    if dialect is Dialect.GA:  # beta's event has no `name`
        out["name"] = event.name
    return out


_SHAPERS: dict[type[ServerEvent], Callable[[Any, Dialect], dict[str, Any]]] = {
    SessionCreated: _render_session,
    SessionUpdated: _render_session,
    ConversationCreated: _render_conversation,
    ItemRetrieved: _render_retrieved,
    InputTranscriptionCompleted: _render_transcription,
    InputTranscriptionDelta: _render_transcription_delta,
    ContentPartAdded: _render_part_event,
    ContentPartDone: _render_part_event,
    FunctionCallArgumentsDone: _render_arguments_done,
}


def _wire_value(value: Any, dialect: Dialect) -> Any:
    if value is None or isinstance(value, str | int | float):
        return value
    if isinstance(value, ITEM_TYPES):
        return render_item(value, dialect)
    if isinstance(value, ContentPart):
        return render_part(value, dialect)
    if isinstance(value, RealtimeResponse):
        return render_response(value, dialect)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_wire_value(v, dialect) for v in value]
    return value


def render(event: ServerEvent, dialect: Dialect) -> dict[str, Any] | None:
    """``event`` as the JSON object a ``dialect`` client expects, or None if it gets none."""
    name = wire_type(type(event), dialect)
    if (dialect is Dialect.BETA and isinstance(event, SessionCreated | SessionUpdated)
            and event.session.kind == "transcription"):
        name = _BETA_TRANSCRIPTION_TYPES[type(event)]
    if name is None:
        return None
    out: dict[str, Any] = {"type": name}
    if type(event) not in _WITHOUT_EVENT_ID:
        out["event_id"] = event.event_id
    shaper = _SHAPERS.get(type(event))
    if shaper is not None:
        out.update(shaper(event, dialect))
        return out
    for field in _PAYLOAD_FIELDS[type(event)]:
        out[field] = _wire_value(getattr(event, field), dialect)
    return out


def render_json(event: ServerEvent, dialect: Dialect) -> str | None:
    """:func:`render` serialised compactly, ready for a WebSocket text frame."""
    obj = render(event, dialect)
    return None if obj is None else json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
