"""Protocol events of the OpenAI-compatible ``/v1/realtime`` endpoint (GA and beta).

How the pieces fit::

    transport                        session actor (dialect-blind)
    ---------                        -----------------------------
    dialect = detect_dialect(headers)
    ev = parse_client_event(msg)  ─►  handles SessionUpdate, ResponseCreate, ...
      (ProtocolError -> ErrorEvent)    settings = settings.apply_update(ev.session)
                                       emits neutral ServerEvents (ItemAdded, AudioDelta...)
    render(event, dialect) ◄────────  (None: this dialect has no such event; send nothing)

The session is created before the client speaks, so ``session.created`` is rendered in
the header-detected dialect; a transport may refine the dialect with the first event
(``detect_dialect(headers, first_event)``) for everything after.

Modules: :mod:`.events_session` (Dialect, SessionSettings, session validation, merge),
:mod:`.events_client` (client events, conversation items, parse_client_event),
:mod:`.events_server` (neutral server events, render). Import from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from voxline.realtime.events_client import (
    CLIENT_EVENT_TYPES,
    ITEM_TYPES,
    ClientEvent,
    ClientEventBase,
    ContentPart,
    ConversationItem,
    ConversationItemCreate,
    ConversationItemDelete,
    ConversationItemRetrieve,
    ConversationItemTruncate,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputAudioBufferAppend,
    InputAudioBufferClear,
    InputAudioBufferCommit,
    ItemReference,
    MessageItem,
    OutputAudioBufferClear,
    ResponseCancel,
    ResponseCreate,
    ResponseParams,
    SessionUpdate,
    parse_client_event,
)
from voxline.realtime.events_server import (
    SERVER_EVENT_CLASSES,
    AudioDelta,
    AudioDone,
    AudioTranscriptDelta,
    AudioTranscriptDone,
    ContentPartAdded,
    ContentPartDone,
    ConversationCreated,
    ErrorDetail,
    ErrorEvent,
    InputAudioCleared,
    InputAudioCommitted,
    InputAudioTimeoutTriggered,
    InputTokenDetails,
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
    OutputTokenDetails,
    RateLimit,
    RateLimitsUpdated,
    RealtimeResponse,
    ResponseCreated,
    ResponseDone,
    ResponseStatusDetails,
    ResponseUsage,
    ServerEvent,
    SessionCreated,
    SessionUpdated,
    SpeechStarted,
    SpeechStopped,
    TextDelta,
    TextDone,
    render,
    render_item,
    render_json,
    render_part,
    render_response,
    wire_type,
)
from voxline.realtime.events_session import (
    AUDIO_MODALITIES,
    TEXT_MODALITIES,
    AudioFormat,
    Dialect,
    SessionPatch,
    SessionSettings,
    Transcription,
    TurnDetection,
    merge_session,
    new_id,
    validate_session,
)

BETA_SUBPROTOCOL = "openai-beta.realtime-v1"

Headers = Mapping[str, str] | Iterable[tuple[str | bytes, str | bytes]]


def _header_items(headers: Headers | None) -> Iterable[tuple[str, str]]:
    if headers is None:
        return ()
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for key, value in pairs:
        k = key.decode("latin-1") if isinstance(key, bytes) else key
        v = value.decode("latin-1") if isinstance(value, bytes) else value
        out.append((k.lower(), v))
    return out


def detect_dialect(headers: Headers | None, first_event: ClientEvent | None = None) -> Dialect:
    """The dialect a client speaks; GA unless something says beta.

    Beta when the ``OpenAI-Beta`` header holds ``realtime=v1`` or the WebSocket
    subprotocols include ``openai-beta.realtime-v1`` (browser clients); otherwise the
    first event's field names decide (beta ``modalities``, flat ``turn_detection``,
    ``input_audio_format``, assistant ``text`` parts...; GA ``audio``,
    ``output_modalities``...). ``headers`` may be a mapping or ASGI-style byte pairs.
    """
    for key, value in _header_items(headers):
        if key == "openai-beta" and "realtime=v1" in value.replace(" ", "").lower():
            return Dialect.BETA
        if key == "sec-websocket-protocol" and BETA_SUBPROTOCOL in (
            p.strip() for p in value.split(",")
        ):
            return Dialect.BETA
    hint = first_event.dialect_hint() if first_event is not None else None
    return hint or Dialect.GA


__all__ = [
    "AUDIO_MODALITIES",
    "BETA_SUBPROTOCOL",
    "CLIENT_EVENT_TYPES",
    "ITEM_TYPES",
    "SERVER_EVENT_CLASSES",
    "TEXT_MODALITIES",
    "AudioDelta",
    "AudioDone",
    "AudioFormat",
    "AudioTranscriptDelta",
    "AudioTranscriptDone",
    "ClientEvent",
    "ClientEventBase",
    "ContentPart",
    "ContentPartAdded",
    "ContentPartDone",
    "ConversationCreated",
    "ConversationItem",
    "ConversationItemCreate",
    "ConversationItemDelete",
    "ConversationItemRetrieve",
    "ConversationItemTruncate",
    "Dialect",
    "ErrorDetail",
    "ErrorEvent",
    "FunctionCallItem",
    "FunctionCallOutputItem",
    "InputAudioBufferAppend",
    "InputAudioBufferClear",
    "InputAudioBufferCommit",
    "InputAudioCleared",
    "InputAudioCommitted",
    "InputAudioTimeoutTriggered",
    "InputTokenDetails",
    "InputTranscriptionCompleted",
    "InputTranscriptionDelta",
    "InputTranscriptionFailed",
    "ItemAdded",
    "ItemDeleted",
    "ItemDone",
    "ItemReference",
    "ItemRetrieved",
    "ItemTruncated",
    "MessageItem",
    "OutputAudioBufferClear",
    "OutputAudioBufferCleared",
    "OutputAudioBufferStarted",
    "OutputAudioBufferStopped",
    "OutputItemAdded",
    "OutputItemDone",
    "OutputTokenDetails",
    "RateLimit",
    "RateLimitsUpdated",
    "RealtimeResponse",
    "ResponseCancel",
    "ResponseCreate",
    "ResponseCreated",
    "ResponseDone",
    "ResponseParams",
    "ResponseStatusDetails",
    "ResponseUsage",
    "ServerEvent",
    "SessionCreated",
    "SessionPatch",
    "SessionSettings",
    "SessionUpdate",
    "SessionUpdated",
    "SpeechStarted",
    "SpeechStopped",
    "TextDelta",
    "TextDone",
    "Transcription",
    "TurnDetection",
    "detect_dialect",
    "merge_session",
    "new_id",
    "parse_client_event",
    "render",
    "render_item",
    "render_json",
    "render_part",
    "render_response",
    "validate_session",
    "wire_type",
]
