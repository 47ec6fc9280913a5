"""Client events of ``/v1/realtime`` and the conversation items they carry.

:func:`parse_client_event` turns one WebSocket / data-channel message into a typed event
or raises :class:`voxline.errors.ProtocolError` naming the event type, the field (a
dotted ``param`` such as ``session.audio.input.turn_detection.threshold`` or
``item.content[0].type``) and what was wrong, keeping the client's ``event_id``.
Unknown fields are ignored, as OpenAI does. Audio stays base64 text here; the session
decodes it with :mod:`voxline.codecs`.

Conversation items are stored in canonical (GA) form: beta's assistant ``text`` /
``audio`` content types become ``output_text`` / ``output_audio`` on input, and the
server renderer maps them back for beta clients.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Annotated, Any, Literal, Self

from pydantic import Field, PrivateAttr, TypeAdapter, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from voxline.errors import ProtocolError
from voxline.realtime.events_session import (
    AudioFormat,
    AudioFormatWire,
    BetaFormatName,
    Dialect,
    MaxTokens,
    Milliseconds,
    Modalities,
    SessionPatch,
    SessionSettings,
    Temperature,
    Voice,
    WireModel,
    json_type_name,
    merge_session,
    new_id,
    normalize_modalities,
    protocol_error_from_validation,
)

# ---------------------------------------------------------------------------------------
# Conversation items
# ---------------------------------------------------------------------------------------

ContentType = Literal["input_text", "input_audio", "output_text", "output_audio"]
ItemStatus = Literal["completed", "incomplete", "in_progress"]

# role -> {type as sent: canonical type}; beta's "text"/"audio" resolve by role.
_ROLE_CONTENT: dict[str, dict[str, ContentType]] = {
    "system": {"input_text": "input_text", "text": "input_text"},
    "user": {
        "input_text": "input_text",
        "text": "input_text",
        "input_audio": "input_audio",
        "audio": "input_audio",
    },
    "assistant": {
        "output_text": "output_text",
        "text": "output_text",
        "output_audio": "output_audio",
        "audio": "output_audio",
    },
}


class ContentPart(WireModel):
    """One part of a message's content; ``type`` is canonical once inside a MessageItem.

    ``audio`` is base64 as the client sent it (never decoded here); server-made audio
    parts carry only ``transcript``.
    """

    type: Literal["input_text", "input_audio", "output_text", "output_audio", "text", "audio"]
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None

    @property
    def is_audio(self) -> bool:
        return self.type in ("input_audio", "output_audio", "audio")


class _ItemBase(WireModel):
    id: str | None = None
    status: ItemStatus = "completed"

    def with_id(self, item_id: str | None = None) -> Self:
        """This item if it has an id, else a copy with ``item_id`` (or a fresh ``item_...``)."""
        if self.id is not None:
            return self
        return self.model_copy(update={"id": item_id or new_id("item")})


class MessageItem(_ItemBase):
    """A ``message`` item; content types are validated against the role."""

    type: Literal["message"] = "message"
    role: Literal["system", "user", "assistant"]
    content: list[ContentPart]
    _dialect_hint: Dialect | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _canonical_content(self) -> Self:
        allowed = _ROLE_CONTENT[self.role]
        for i, part in enumerate(self.content):
            canonical = allowed.get(part.type)
            if canonical is None:
                raise PydanticCustomError(
                    "invalid_content",
                    "content type {got} is not allowed in a {role} message; allowed: {allowed}",
                    {
                        "got": repr(part.type),
                        "role": self.role,
                        "allowed": ", ".join(repr(t) for t in allowed),
                        "field": ("content", i, "type"),
                    },
                )
            if canonical.endswith("_text") and part.text is None:
                raise PydanticCustomError(
                    "missing_field", "missing text", {"field": ("content", i, "text")}
                )
            if self.role == "assistant" and part.type != canonical:
                self._dialect_hint = Dialect.BETA
            elif self.role == "assistant":
                self._dialect_hint = Dialect.GA
            part.type = canonical
        return self

    def dialect_hint(self) -> Dialect | None:
        """BETA for assistant ``text``/``audio`` parts, GA for ``output_*``, else None."""
        return self._dialect_hint

    @property
    def text(self) -> str:
        """All text of the message: text parts and audio transcripts, joined in order."""
        return "".join(p.text or p.transcript or "" for p in self.content)


class FunctionCallItem(_ItemBase):
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str = ""


class FunctionCallOutputItem(_ItemBase):
    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    output: str


class ItemReference(WireModel):
    """Reference to an existing item; valid only inside ``response.input``."""

    type: Literal["item_reference"]
    id: str


ConversationItem = Annotated[
    MessageItem | FunctionCallItem | FunctionCallOutputItem, Field(discriminator="type")
]
ResponseInputItem = Annotated[
    MessageItem | FunctionCallItem | FunctionCallOutputItem | ItemReference,
    Field(discriminator="type"),
]
ITEM_TYPES = (MessageItem, FunctionCallItem, FunctionCallOutputItem)

# ---------------------------------------------------------------------------------------
# response.create parameters
# ---------------------------------------------------------------------------------------

_RESPONSE_BETA_FIELDS = frozenset(
    {"modalities", "max_response_output_tokens", "voice", "output_audio_format", "temperature"}
)
_RESPONSE_GA_FIELDS = frozenset({"output_modalities", "max_output_tokens", "audio"})


class ResponseAudioOutputParams(WireModel):
    format: AudioFormatWire | None = None
    voice: Voice | None = None


class ResponseAudioParams(WireModel):
    output: ResponseAudioOutputParams | None = None


class ResponseParams(WireModel):
    """The ``response`` object of ``response.create``: per-response overrides, either dialect."""

    instructions: str | None = None
    output_modalities: Modalities | None = None
    modalities: Modalities | None = None
    max_output_tokens: MaxTokens | None = None
    max_response_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    conversation: Literal["auto", "none"] | None = None
    metadata: Annotated[dict[str, str], Field(max_length=16)] | None = None
    voice: Voice | None = None
    output_audio_format: BetaFormatName | None = None
    audio: ResponseAudioParams | None = None
    input: list[ResponseInputItem] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None

    @property
    def out_of_band(self) -> bool:
        """True for ``conversation: "none"``: the output is not added to the conversation."""
        return self.conversation == "none"

    def dialect_hint(self) -> Dialect | None:
        if self.model_fields_set & _RESPONSE_BETA_FIELDS:
            return Dialect.BETA
        if self.model_fields_set & _RESPONSE_GA_FIELDS:
            return Dialect.GA
        return None

    def apply_to(self, settings: SessionSettings) -> SessionSettings:
        """The settings this one response runs with; the session's own stay unchanged."""
        changes: dict[str, Any] = {}
        if self.instructions is not None:
            changes["instructions"] = self.instructions
        modalities = self.output_modalities or self.modalities
        if modalities is not None:
            changes["output_modalities"] = normalize_modalities(modalities)
        tokens = self.max_output_tokens or self.max_response_output_tokens
        if tokens is not None:
            changes["max_output_tokens"] = None if tokens == "inf" else tokens
        if self.temperature is not None:
            changes["temperature"] = self.temperature
        out = self.audio.output if self.audio else None
        voice = (out.voice if out else None) or self.voice
        if voice is not None:
            changes["voice"] = voice
        if out is not None and out.format is not None:
            fmt = merge_session(
                settings.output_format.to_ga(), out.format.model_dump(exclude_none=True)
            )
            changes["output_format"] = AudioFormat.from_ga(fmt)
        elif self.output_audio_format is not None:
            changes["output_format"] = AudioFormat.from_beta(self.output_audio_format)
        if self.tools is not None:
            changes["tools"] = tuple(self.tools)
        if self.tool_choice is not None:
            changes["tool_choice"] = self.tool_choice
        return replace(settings, **changes)


# ---------------------------------------------------------------------------------------
# Client events
# ---------------------------------------------------------------------------------------


class ClientEventBase(WireModel):
    """Every client event may carry an ``event_id``; errors about it echo it back."""

    event_id: str | None = None

    def dialect_hint(self) -> Dialect | None:
        """The dialect this event's field names betray, if any."""
        return None


class SessionUpdate(ClientEventBase):
    """``session.update``; apply with ``settings.apply_update(event.session)``."""

    type: Literal["session.update"]
    session: SessionPatch

    def dialect_hint(self) -> Dialect | None:
        return self.session.dialect_hint()


class InputAudioBufferAppend(ClientEventBase):
    """``input_audio_buffer.append``; ``audio`` is base64 in the session's input format."""

    type: Literal["input_audio_buffer.append"]
    audio: str


class InputAudioBufferCommit(ClientEventBase):
    type: Literal["input_audio_buffer.commit"]


class InputAudioBufferClear(ClientEventBase):
    type: Literal["input_audio_buffer.clear"]


class ConversationItemCreate(ClientEventBase):
    type: Literal["conversation.item.create"]
    item: ConversationItem
    previous_item_id: str | None = None

    def dialect_hint(self) -> Dialect | None:
        return self.item.dialect_hint() if isinstance(self.item, MessageItem) else None


class ConversationItemRetrieve(ClientEventBase):
    type: Literal["conversation.item.retrieve"]
    item_id: str


class ConversationItemTruncate(ClientEventBase):
    """Truncate an assistant audio item at what the user heard (``audio_end_ms``)."""

    type: Literal["conversation.item.truncate"]
    item_id: str
    content_index: Milliseconds
    audio_end_ms: Milliseconds


class ConversationItemDelete(ClientEventBase):
    type: Literal["conversation.item.delete"]
    item_id: str


class ResponseCreate(ClientEventBase):
    type: Literal["response.create"]
    response: ResponseParams | None = None

    def dialect_hint(self) -> Dialect | None:
        return self.response.dialect_hint() if self.response else None


class ResponseCancel(ClientEventBase):
    type: Literal["response.cancel"]
    response_id: str | None = None


class OutputAudioBufferClear(ClientEventBase):
    """GA (WebRTC/SIP): stop and discard audio already queued for playout."""

    type: Literal["output_audio_buffer.clear"]


_CLIENT_EVENT_CLASSES: tuple[type[ClientEventBase], ...] = (
    SessionUpdate,
    InputAudioBufferAppend,
    InputAudioBufferCommit,
    InputAudioBufferClear,
    ConversationItemCreate,
    ConversationItemRetrieve,
    ConversationItemTruncate,
    ConversationItemDelete,
    ResponseCreate,
    ResponseCancel,
    OutputAudioBufferClear,
)

ClientEvent = Annotated[
    SessionUpdate
    | InputAudioBufferAppend
    | InputAudioBufferCommit
    | InputAudioBufferClear
    | ConversationItemCreate
    | ConversationItemRetrieve
    | ConversationItemTruncate
    | ConversationItemDelete
    | ResponseCreate
    | ResponseCancel
    | OutputAudioBufferClear,
    Field(discriminator="type"),
]

CLIENT_EVENT_TYPES: dict[str, type[ClientEventBase]] = {
    cls.model_fields["type"].annotation.__args__[0]: cls  # type: ignore[union-attr]
    for cls in _CLIENT_EVENT_CLASSES
}

_CLIENT_EVENT_ADAPTER: TypeAdapter[ClientEvent] = TypeAdapter(ClientEvent)


def parse_client_event(raw: str | bytes | bytearray | Mapping[str, Any]) -> ClientEvent:
    """Decode and validate one client message (JSON text, or an already-decoded object).

    Raises ProtocolError with ``code``:
    ``invalid_json`` (not JSON), ``invalid_request_error`` (not an object, or no ``type``),
    ``unknown_event`` (``type`` names no client event), ``missing_required_parameter``,
    ``invalid_type`` or ``invalid_value`` (with ``param`` the field's dotted path).
    ``event_id`` is the client's whenever it was a string, even if other fields are wrong.
    """
    if isinstance(raw, Mapping):
        obj: Any = raw
    else:
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise ProtocolError(f"invalid JSON: {exc}", code="invalid_json") from None
    if not isinstance(obj, Mapping):
        raise ProtocolError(
            f"a client event must be a JSON object, got {json_type_name(obj)}",
            code="invalid_request_error",
        )
    event_id = obj.get("event_id")
    event_id = event_id if isinstance(event_id, str) else None
    event_type = obj.get("type")
    if event_type is None:
        raise ProtocolError(
            "missing required field 'type'",
            code="invalid_request_error", event_id=event_id, param="type",
        )
    if not isinstance(event_type, str):
        raise ProtocolError(
            f"invalid type for 'type': expected a string, got {json_type_name(event_type)}",
            code="invalid_request_error", event_id=event_id, param="type",
        )
    if event_type not in CLIENT_EVENT_TYPES:
        raise ProtocolError(
            f"unknown event type {event_type!r}; supported client events: "
            + ", ".join(CLIENT_EVENT_TYPES),
            code="unknown_event", event_id=event_id, param="type",
        )
    try:
        return _CLIENT_EVENT_ADAPTER.validate_python(obj)
    except ValidationError as exc:
        raise protocol_error_from_validation(
            exc, obj, event_type=event_type, event_id=event_id
        ) from None
