"""OpenAI Realtime client events on the wire (GA and beta) and their session commands.

:func:`parse_client_event` turns one WebSocket / data-channel message into a typed wire
event or raises :class:`voxline.errors.ProtocolError` naming the event type, the field (a
dotted ``param`` such as ``session.audio.input.turn_detection.threshold`` or
``item.content[0].type``) and what was wrong, keeping the client's ``event_id``.
Unknown fields are ignored, as OpenAI does. Each wire event's ``to_command`` gives the
neutral :mod:`voxline.sessions.commands` command the session acts on (:func:`parse_command`
does both): beta's assistant ``text`` / ``audio`` content types become ``output_text`` /
``output_audio``, base64 audio is decoded, beta names map to the neutral ones.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from voxline.codecs.pcm import b64decode_audio
from voxline.errors import AudioFormatError, ProtocolError
from voxline.realtime.openai.dialect import Dialect
from voxline.realtime.openai.session_object import (
    AudioFormatWire,
    BetaFormatName,
    MaxTokens,
    Milliseconds,
    Modalities,
    NoiseReductionWire,
    ReasoningWire,
    SessionPatch,
    Temperature,
    TranscriptionWire,
    TurnDetectionWire,
    Voice,
    WireModel,
    beta_format,
    json_type_name,
    protocol_error_from_validation,
)
from voxline.sessions import commands as cmd
from voxline.sessions.commands import ResponseOverrides, VideoParams
from voxline.sessions.items import (
    ContentPart,
    ContentType,
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    ImageDetail,
    ItemStatus,
    McpApprovalResponseItem,
    MessageItem,
)
from voxline.sessions.settings import normalize_modalities

# ---------------------------------------------------------------------------------------
# Conversation items
# ---------------------------------------------------------------------------------------

# role -> {type as sent: canonical type}; beta's "text"/"audio" resolve by role.
_ROLE_CONTENT: dict[str, dict[str, ContentType]] = {
    "system": {"input_text": "input_text", "text": "input_text"},
    "user": {
        "input_text": "input_text",
        "text": "input_text",
        "input_audio": "input_audio",
        "audio": "input_audio",
        "input_image": "input_image",
    },
    "assistant": {
        "output_text": "output_text",
        "text": "output_text",
        "output_audio": "output_audio",
        "audio": "output_audio",
    },
}


class ContentPartWire(WireModel):
    """A content part as a client sends it; beta's ``text`` / ``audio`` resolve by role."""

    type: Literal["input_text", "input_audio", "input_image", "output_text", "output_audio",
                  "text", "audio"]
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None
    image_url: str | None = None
    detail: ImageDetail | None = None


class MessageItemWire(WireModel):
    """A ``message`` item of either dialect; :meth:`to_item` gives the canonical item."""

    id: str | None = None
    status: ItemStatus = "completed"
    type: Literal["message"] = "message"
    role: Literal["system", "user", "assistant"]
    content: list[ContentPartWire]
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
            if canonical == "input_image" and part.image_url is None:
                raise PydanticCustomError(
                    "missing_field", "missing image_url",
                    {"field": ("content", i, "image_url")})
            if self.role == "assistant" and part.type != canonical:
                self._dialect_hint = Dialect.BETA
            elif self.role == "assistant":
                self._dialect_hint = Dialect.GA
            part.type = canonical
        return self

    def dialect_hint(self) -> Dialect | None:
        """BETA for assistant ``text``/``audio`` parts, GA for ``output_*``, else None."""
        return self._dialect_hint

    def to_item(self) -> MessageItem:
        return MessageItem(id=self.id, status=self.status, role=self.role, content=[
            ContentPart(type=p.type, text=p.text, audio=p.audio,  # type: ignore[arg-type]
                        transcript=p.transcript, image_url=p.image_url, detail=p.detail)
            for p in self.content])


class ItemReference(WireModel):
    """Reference to an existing item; valid only inside ``response.input``."""

    type: Literal["item_reference"]
    id: str


ConversationItemWire = Annotated[
    MessageItemWire | FunctionCallItem | FunctionCallOutputItem | McpApprovalResponseItem,
    Field(discriminator="type"),
]
ResponseInputItem = Annotated[
    MessageItemWire | FunctionCallItem | FunctionCallOutputItem | ItemReference,
    Field(discriminator="type"),
]


def _item(item: MessageItemWire | FunctionCallItem | FunctionCallOutputItem
          | McpApprovalResponseItem) -> ConversationItem:
    return item.to_item() if isinstance(item, MessageItemWire) else item

# ---------------------------------------------------------------------------------------
# response.create parameters
# ---------------------------------------------------------------------------------------

_RESPONSE_BETA_FIELDS = frozenset(
    {"modalities", "max_response_output_tokens", "voice", "output_audio_format", "temperature"}
)
_RESPONSE_GA_FIELDS = frozenset({"output_modalities", "max_output_tokens", "audio", "reasoning",
                                 "parallel_tool_calls"})


class ResponseAudioOutputParams(WireModel):
    format: AudioFormatWire | None = None
    voice: Voice | None = None


class ResponseAudioParams(WireModel):
    output: ResponseAudioOutputParams | None = None


def _patch_multiple(value: int) -> int:
    if value % VIDEO_SIZE_MULTIPLE:
        raise PydanticCustomError("invalid_value", "must be a multiple of {multiple} (the video "
                                  "model's patch size)", {"multiple": VIDEO_SIZE_MULTIPLE})
    return value


VIDEO_SIZE_MULTIPLE = 16
VideoSide = Annotated[int, Field(ge=VIDEO_SIZE_MULTIPLE, le=4096), AfterValidator(_patch_multiple)]
# GA output_modalities may add "video" (a voxline extension; see ResponseVideoParams)
ResponseModalities = Annotated[list[Literal["text", "audio", "video"]], Field(min_length=1)]


class ResponseVideoParams(WireModel):
    """voxline extension: ``response.video``, the video a response shows (with "video" in
    ``output_modalities``); the same names and bounds as ``POST /v1/videos``."""

    prompt: Annotated[str, Field(min_length=1, max_length=4096)]
    width: VideoSide = 640
    height: VideoSide = 384
    fps: Annotated[int, Field(ge=1, le=60)] = 24
    num_frames: Annotated[int, Field(ge=1, le=10_000)] = 33
    # None: the video model's recommended setting (Helios: 50 steps, guidance 5.0)
    num_inference_steps: Annotated[int, Field(ge=1, le=200)] | None = None
    guidance_scale: Annotated[float, Field(ge=0, le=100)] | None = None
    negative_prompt: str = ""
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    steps_per_stage: Annotated[int, Field(ge=1, le=50)] | None = None

    def to_params(self) -> VideoParams:
        return VideoParams(**self.model_dump())


class ResponseParams(WireModel):
    """The ``response`` object of ``response.create``: per-response overrides, either dialect."""

    instructions: str | None = None
    output_modalities: ResponseModalities | None = None
    modalities: Modalities | None = None  # beta: no video extension
    video: ResponseVideoParams | None = None
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
    reasoning: ReasoningWire | None = None
    parallel_tool_calls: bool | None = None

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

    def to_overrides(self) -> ResponseOverrides:
        """The neutral per-response overrides; GA names win where a client sent both."""
        modalities = self.output_modalities or self.modalities
        out = self.audio.output if self.audio else None
        fmt: dict[str, Any] | None = None
        if out is not None and out.format is not None:
            fmt = out.format.model_dump(exclude_none=True)
        elif self.output_audio_format is not None:
            fmt = beta_format(self.output_audio_format).to_document()
        return ResponseOverrides(
            instructions=self.instructions,
            output_modalities=normalize_modalities(modalities) if modalities else None,
            max_output_tokens=self.max_output_tokens or self.max_response_output_tokens,
            temperature=self.temperature,
            voice=(out.voice if out else None) or self.voice,
            output_format=fmt,
            conversation=self.conversation,
            metadata=self.metadata,
            custom_input=self.input is not None,
            tools=tuple(self.tools) if self.tools is not None else None,
            tool_choice=self.tool_choice,
            video_modality="video" in (modalities or ()),
            video=self.video.to_params() if self.video is not None else None,
            reasoning_effort=self.reasoning.effort if self.reasoning is not None else None,
            parallel_tool_calls=self.parallel_tool_calls,
        )


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
    type: Literal["session.update"]
    session: SessionPatch

    def dialect_hint(self) -> Dialect | None:
        return self.session.dialect_hint()

    def to_command(self) -> cmd.SessionUpdate:
        return cmd.SessionUpdate(changes=self.session.changes(), event_id=self.event_id)


class TranscriptionSessionPatch(WireModel):
    """Beta's ``transcription_session.update`` session: the input side of a session, flat
    (``client_secret`` applies to REST-created sessions only, so it is ignored here, as
    OpenAI's WebSocket does)."""

    include: list[Literal["item.input_audio_transcription.logprobs"]] | None = None
    input_audio_format: BetaFormatName | None = None
    input_audio_transcription: TranscriptionWire | None = None
    input_audio_noise_reduction: NoiseReductionWire | None = None
    turn_detection: TurnDetectionWire | None = None
    modalities: list[Literal["text", "audio"]] | None = None  # what a transcription yields: text

    def to_patch(self) -> SessionPatch:
        """The same settings as a session patch of a transcription session."""
        sent = self.model_dump(exclude_unset=True)
        sent.pop("modalities", None)
        return SessionPatch.model_validate({**sent, "type": "transcription"})


class TranscriptionSessionUpdate(ClientEventBase):
    """Beta's ``transcription_session.update``: a session.update of a transcription session."""

    type: Literal["transcription_session.update"]
    session: TranscriptionSessionPatch

    def dialect_hint(self) -> Dialect | None:
        return Dialect.BETA

    def to_command(self) -> cmd.SessionUpdate:
        return cmd.SessionUpdate(changes=self.session.to_patch().changes(),
                                 event_id=self.event_id)


class InputAudioBufferAppend(ClientEventBase):
    """``input_audio_buffer.append``; ``audio`` is base64 in the session's input format."""

    type: Literal["input_audio_buffer.append"]
    audio: str

    def to_command(self) -> cmd.InputAudioAppend:
        try:
            audio = b64decode_audio(self.audio)
        except AudioFormatError as exc:
            raise ProtocolError(f"input_audio_buffer.append: {exc}", code="invalid_value",
                                param="audio", event_id=self.event_id) from exc
        return cmd.InputAudioAppend(audio=audio, event_id=self.event_id)


class InputAudioBufferCommit(ClientEventBase):
    type: Literal["input_audio_buffer.commit"]

    def to_command(self) -> cmd.InputAudioCommit:
        return cmd.InputAudioCommit(event_id=self.event_id)


class InputAudioBufferClear(ClientEventBase):
    type: Literal["input_audio_buffer.clear"]

    def to_command(self) -> cmd.InputAudioClear:
        return cmd.InputAudioClear(event_id=self.event_id)


class ConversationItemCreate(ClientEventBase):
    type: Literal["conversation.item.create"]
    item: ConversationItemWire
    previous_item_id: str | None = None

    def dialect_hint(self) -> Dialect | None:
        return self.item.dialect_hint() if isinstance(self.item, MessageItemWire) else None

    def to_command(self) -> cmd.ItemCreate:
        return cmd.ItemCreate(item=_item(self.item), previous_item_id=self.previous_item_id,
                              event_id=self.event_id)


class ConversationItemRetrieve(ClientEventBase):
    type: Literal["conversation.item.retrieve"]
    item_id: str

    def to_command(self) -> cmd.ItemRetrieve:
        return cmd.ItemRetrieve(item_id=self.item_id, event_id=self.event_id)


class ConversationItemTruncate(ClientEventBase):
    """Truncate an assistant audio item at what the user heard (``audio_end_ms``)."""

    type: Literal["conversation.item.truncate"]
    item_id: str
    content_index: Milliseconds
    audio_end_ms: Milliseconds

    def to_command(self) -> cmd.ItemTruncate:
        return cmd.ItemTruncate(item_id=self.item_id, content_index=self.content_index,
                                audio_end_ms=self.audio_end_ms, event_id=self.event_id)


class ConversationItemDelete(ClientEventBase):
    type: Literal["conversation.item.delete"]
    item_id: str

    def to_command(self) -> cmd.ItemDelete:
        return cmd.ItemDelete(item_id=self.item_id, event_id=self.event_id)


class ResponseCreate(ClientEventBase):
    type: Literal["response.create"]
    response: ResponseParams | None = None

    def dialect_hint(self) -> Dialect | None:
        return self.response.dialect_hint() if self.response else None

    def to_command(self) -> cmd.ResponseCreate:
        overrides = self.response.to_overrides() if self.response is not None else None
        return cmd.ResponseCreate(overrides=overrides, event_id=self.event_id)


class ResponseCancel(ClientEventBase):
    type: Literal["response.cancel"]
    response_id: str | None = None

    def to_command(self) -> cmd.ResponseCancel:
        return cmd.ResponseCancel(response_id=self.response_id, event_id=self.event_id)


class ResponseVideoUpdateParams(WireModel):
    """The ``video`` object of ``response.video.update``: the new prompt (as
    ``response.video``'s) and optionally a new negative prompt."""

    prompt: Annotated[str, Field(min_length=1, max_length=4096)]
    negative_prompt: str | None = None


class ResponseVideoUpdate(ClientEventBase):
    """voxline extension: steer response `response_id`'s video in progress to a new prompt
    from its next chunk on (the picture morphs; what it showed stays its history)."""

    type: Literal["response.video.update"]
    response_id: str
    video: ResponseVideoUpdateParams

    def to_command(self) -> cmd.ResponseVideoUpdate:
        return cmd.ResponseVideoUpdate(response_id=self.response_id, prompt=self.video.prompt,
                                       negative_prompt=self.video.negative_prompt,
                                       event_id=self.event_id)


class OutputAudioBufferClear(ClientEventBase):
    """GA (WebRTC/SIP): stop and discard audio already queued for playout."""

    type: Literal["output_audio_buffer.clear"]

    def to_command(self) -> cmd.OutputAudioClear:
        return cmd.OutputAudioClear(event_id=self.event_id)


_CLIENT_EVENT_CLASSES: tuple[type[ClientEventBase], ...] = (
    SessionUpdate,
    TranscriptionSessionUpdate,
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
    ResponseVideoUpdate,
)

ClientEvent = Annotated[
    SessionUpdate
    | TranscriptionSessionUpdate
    | InputAudioBufferAppend
    | InputAudioBufferCommit
    | InputAudioBufferClear
    | ConversationItemCreate
    | ConversationItemRetrieve
    | ConversationItemTruncate
    | ConversationItemDelete
    | ResponseCreate
    | ResponseCancel
    | OutputAudioBufferClear
    | ResponseVideoUpdate,
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
        except RecursionError:  # a document nested thousands deep: refuse it, keep the session
            raise ProtocolError("invalid JSON: nested too deeply", code="invalid_json") from None
    if not isinstance(obj, Mapping):
        raise ProtocolError(
            f"a client event must be a JSON object, got {json_type_name(obj)}",
            code="invalid_request_error",
        )
    event_id = obj.get("event_id")
    event_id = event_id if isinstance(event_id, str) else None
    # JSON may escape a lone surrogate ("\ud800"), which no UTF-8 frame can carry back
    unspeakable_id = event_id is not None and not _is_utf8(event_id)
    if unspeakable_id:
        event_id = None
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
    if unspeakable_id:
        raise ProtocolError(f"{event_type}: invalid value for 'event_id': it is not valid "
                            "Unicode text (a lone surrogate)",
                            code="invalid_value", param="event_id")
    try:
        return _CLIENT_EVENT_ADAPTER.validate_python(obj)
    except ValidationError as exc:
        raise protocol_error_from_validation(
            exc, obj, event_type=event_type, event_id=event_id
        ) from None
    except RecursionError:  # e.g. a session object nested hundreds deep
        raise ProtocolError(f"{event_type}: the event is nested too deeply",
                            code="invalid_value", event_id=event_id) from None


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_command(raw: str | bytes | bytearray | Mapping[str, Any]) -> cmd.ClientCommand:
    """One client message as the session command it asks for (raises ProtocolError)."""
    return parse_client_event(raw).to_command()
