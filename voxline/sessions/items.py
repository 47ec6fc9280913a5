"""The conversation a session holds: items, responses and their parts, neutral of any wire.

Items are stored in canonical form: content types ``input_text`` / ``input_audio`` for
system and user messages, ``output_text`` / ``output_audio`` for assistant ones (a
transport maps its own spellings, e.g. OpenAI beta's ``text`` / ``audio``, before they
get here). Models validate strictly, so a transport can build them from decoded JSON and
report errors at the client's own field path; unknown fields are ignored.
"""

from __future__ import annotations

import enum
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from voxline.engines.protocol import function_call_text, function_output_text
from voxline.errors import ProtocolError
from voxline.sessions.ids import new_id
from voxline.sessions.settings import AudioFormat, SessionSettings


class StrictModel(BaseModel):
    """Base of models built from client JSON: strict types, unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")


ContentType = Literal["input_text", "input_audio", "input_image", "output_text", "output_audio"]
ImageDetail = Literal["auto", "low", "high"]
ItemStatus = Literal["completed", "incomplete", "in_progress"]
ROLE_CONTENT: dict[str, tuple[ContentType, ...]] = {
    "system": ("input_text",),
    "user": ("input_text", "input_audio", "input_image"),
    "assistant": ("output_text", "output_audio"),
}


class ContentPart(StrictModel):
    """One part of a message's content.

    ``audio`` is base64 as the client sent it (never decoded here); server-made audio
    parts carry only ``transcript``. ``image_url`` / ``detail`` are an ``input_image``'s,
    as sent (validated by :mod:`voxline.sessions.images` when the item is created).
    """

    type: ContentType
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None
    image_url: str | None = None
    detail: ImageDetail | None = None

    @property
    def is_audio(self) -> bool:
        return self.type in ("input_audio", "output_audio")


class _ItemBase(StrictModel):
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

    @model_validator(mode="after")
    def _content_fits_role(self) -> Self:
        allowed = ROLE_CONTENT[self.role]
        for i, part in enumerate(self.content):
            if part.type not in allowed:
                raise PydanticCustomError(
                    "invalid_content",
                    "content type {got} is not allowed in a {role} message; allowed: {allowed}",
                    {"got": repr(part.type), "role": self.role,
                     "allowed": ", ".join(repr(t) for t in allowed),
                     "field": ("content", i, "type")},
                )
            if part.type.endswith("_text") and part.text is None:
                raise PydanticCustomError(
                    "missing_field", "missing text", {"field": ("content", i, "text")}
                )
            if part.type == "input_image" and part.image_url is None:
                raise PydanticCustomError(
                    "missing_field", "missing image_url",
                    {"field": ("content", i, "image_url")})
        return self

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


class McpListToolsItem(_ItemBase):
    """The tools an MCP server offers (listed at session.update; see sessions/mcp.py).
    ``tools`` are ``{name, input_schema, description?, annotations?}``."""

    type: Literal["mcp_list_tools"] = "mcp_list_tools"
    server_label: str
    tools: list[dict] = Field(default_factory=list)


class McpCallItem(_ItemBase):
    """A call of an MCP tool the server ran; ``error`` is OpenAI's shape (``type``
    protocol_error / tool_execution_error / http_error, ``message``, ``code``)."""

    type: Literal["mcp_call"] = "mcp_call"
    server_label: str
    name: str
    arguments: str = ""
    approval_request_id: str | None = None
    output: str | None = None
    error: dict | None = None


class McpApprovalRequestItem(_ItemBase):
    type: Literal["mcp_approval_request"] = "mcp_approval_request"
    server_label: str
    name: str
    arguments: str = ""


class McpApprovalResponseItem(_ItemBase):
    """The client's answer to an ``mcp_approval_request``."""

    type: Literal["mcp_approval_response"] = "mcp_approval_response"
    approval_request_id: str
    approve: bool
    reason: str | None = None


MCP_ITEM_TYPES = (McpListToolsItem, McpCallItem, McpApprovalRequestItem, McpApprovalResponseItem)
ConversationItem = Annotated[
    MessageItem | FunctionCallItem | FunctionCallOutputItem | McpListToolsItem | McpCallItem
    | McpApprovalRequestItem | McpApprovalResponseItem, Field(discriminator="type")
]
ITEM_TYPES = (MessageItem, FunctionCallItem, FunctionCallOutputItem, *MCP_ITEM_TYPES)


# ---------------------------------------------------------------------------------------
# Responses
# ---------------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    """The ``error`` object of an ``error`` event; ``event_id`` is the client event's."""

    type: str = "invalid_request_error"
    code: str | None = None
    message: str
    param: str | None = None
    event_id: str | None = None

    @classmethod
    def from_exception(cls, exc: ProtocolError) -> ErrorDetail:
        return cls(code=exc.code, message=str(exc), param=exc.param, event_id=exc.event_id)


class InputTokenDetails(BaseModel):
    cached_tokens: int = 0
    text_tokens: int = 0
    audio_tokens: int = 0


class OutputTokenDetails(BaseModel):
    text_tokens: int = 0
    audio_tokens: int = 0


class ResponseUsage(BaseModel):
    total_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    input_token_details: InputTokenDetails = Field(default_factory=InputTokenDetails)
    output_token_details: OutputTokenDetails = Field(default_factory=OutputTokenDetails)


ResponseStatus = Literal["in_progress", "completed", "cancelled", "incomplete", "failed"]


class StatusReason(enum.StrEnum):
    """Why a response ended cancelled or incomplete; the wire carries the value."""

    TURN_DETECTED = "turn_detected"  # server-VAD barge-in
    CLIENT_CANCELLED = "client_cancelled"  # response.cancel, or a client truncate of it
    MAX_OUTPUT_TOKENS = "max_output_tokens"
    CONTENT_FILTER = "content_filter"


class ResponseStatusDetails(BaseModel):
    type: Literal["completed", "cancelled", "incomplete", "failed"]
    reason: StatusReason | None = None
    error: ErrorDetail | None = None


class RealtimeResponse(BaseModel):
    """A response as the session tracks it; rendered as ``realtime.response`` per dialect."""

    model_config = ConfigDict(strict=True)

    id: str = Field(default_factory=lambda: new_id("resp"))
    status: ResponseStatus = "in_progress"
    status_details: ResponseStatusDetails | None = None
    output: list[ConversationItem] = Field(default_factory=list)
    conversation_id: str | None = None
    output_modalities: frozenset[str]
    max_output_tokens: int | None = None
    voice: str
    output_format: AudioFormat
    temperature: float
    metadata: dict[str, str] | None = None
    usage: ResponseUsage | None = None

    @classmethod
    def start(
        cls,
        settings: SessionSettings,
        *,
        conversation_id: str | None,
        metadata: dict[str, str] | None = None,
    ) -> RealtimeResponse:
        """An ``in_progress`` response run with ``settings`` (already with overrides applied).

        ``conversation_id`` is None for out-of-band responses (``conversation: "none"``).
        """
        return cls(
            conversation_id=conversation_id,
            output_modalities=settings.output_modalities,
            max_output_tokens=settings.max_output_tokens,
            voice=settings.voice,
            output_format=settings.output_format,
            temperature=settings.temperature,
            metadata=metadata,
        )

    def finished(
        self,
        status: Literal["completed", "cancelled", "incomplete", "failed"],
        *,
        reason: StatusReason | None = None,
        error: ErrorDetail | None = None,
        usage: ResponseUsage | None = None,
    ) -> RealtimeResponse:
        """A copy in a final state; ``completed`` carries no status details, as OpenAI's."""
        details = None
        if status != "completed":
            details = ResponseStatusDetails(type=status, reason=reason, error=error)
        return self.model_copy(
            update={"status": status, "status_details": details, "usage": usage or self.usage}
        )


class RateLimit(BaseModel):
    name: Literal["requests", "tokens"]
    limit: int
    remaining: int
    reset_seconds: float


def engine_message(item: ConversationItem) -> tuple[str, str]:
    """The (role, text) of a client-created item in the engine's conversation."""
    if isinstance(item, FunctionCallItem):
        return "function_call", function_call_text(item.call_id, item.name, item.arguments)
    if isinstance(item, FunctionCallOutputItem):
        return "function_call_output", function_output_text(item.call_id, item.output)
    return item.role, item.text
