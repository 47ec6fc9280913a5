"""Client commands: what a client asks of its session, neutral of any wire.

A transport parses its messages into these (``voxline.realtime.openai.client_events`` for OpenAI's
GA and beta JSON; an SDK or a telephony adapter builds them directly) and hands them to
:meth:`voxline.sessions.actor.SessionActor.receive`. ``event_id`` is the client's id for
the message, echoed in any error it causes. Commands are named after the OpenAI Realtime
events they mirror, since errors name the event to the client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

from voxline.sessions.items import ConversationItem
from voxline.sessions.settings import AudioFormat, SessionSettings, merge_session


@dataclass(frozen=True, kw_only=True)
class Command:
    name: ClassVar[str]
    event_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class SessionUpdate(Command):
    """Change the session's settings; ``changes`` is a validated settings-document patch
    (see :mod:`voxline.sessions.settings`)."""

    name: ClassVar[str] = "session.update"
    changes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class InputAudioAppend(Command):
    """Input audio, encoded in the session's input format (PCM16 LE or G.711 bytes)."""

    name: ClassVar[str] = "input_audio_buffer.append"
    audio: bytes


@dataclass(frozen=True, kw_only=True)
class InputAudioCommit(Command):
    name: ClassVar[str] = "input_audio_buffer.commit"


@dataclass(frozen=True, kw_only=True)
class InputAudioClear(Command):
    name: ClassVar[str] = "input_audio_buffer.clear"


@dataclass(frozen=True, kw_only=True)
class ItemCreate(Command):
    name: ClassVar[str] = "conversation.item.create"
    item: ConversationItem
    previous_item_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class ItemRetrieve(Command):
    name: ClassVar[str] = "conversation.item.retrieve"
    item_id: str


@dataclass(frozen=True, kw_only=True)
class ItemTruncate(Command):
    """Cut an assistant audio item at what the listener heard (``audio_end_ms``)."""

    name: ClassVar[str] = "conversation.item.truncate"
    item_id: str
    content_index: int = 0
    audio_end_ms: int


@dataclass(frozen=True, kw_only=True)
class ItemDelete(Command):
    name: ClassVar[str] = "conversation.item.delete"
    item_id: str


@dataclass(frozen=True)
class VideoParams:
    """A response's video (the voxline extension ``response.video``): the `/v1/videos`
    names; the engine's video model checks what it can make."""

    prompt: str
    width: int = 640
    height: int = 384
    fps: int = 24
    num_frames: int = 33
    num_inference_steps: int | None = None  # None: the video model's recommended setting
    guidance_scale: float | None = None
    negative_prompt: str = ""
    seed: int | None = None
    # steps per pyramid stage; None (and no num_inference_steps): the server's real-time
    # setting (`video_realtime_steps_per_stage`, 1 a stage)
    steps_per_stage: int | None = None


@dataclass(frozen=True)
class ResponseOverrides:
    """Per-response settings; None means "as the session says".

    ``max_output_tokens`` "inf" lifts the session's limit; ``output_format`` is a partial
    settings-document format object merged onto the session's output format.
    """

    instructions: str | None = None
    output_modalities: frozenset[str] | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    temperature: float | None = None
    voice: str | None = None
    output_format: Mapping[str, Any] | None = None
    conversation: Literal["auto", "none"] | None = None
    metadata: dict[str, str] | None = None
    custom_input: bool = False
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: str | dict[str, Any] | None = None
    video_modality: bool = False  # "video" is in output_modalities (a voxline extension)
    video: VideoParams | None = None  # response.video
    reasoning_effort: str | None = None  # response.reasoning.effort
    parallel_tool_calls: bool | None = None

    @property
    def out_of_band(self) -> bool:
        """True for ``conversation: "none"``: the output is not added to the conversation."""
        return self.conversation == "none"

    def apply_to(self, settings: SessionSettings) -> SessionSettings:
        """The settings this one response runs with; the session's own stay unchanged."""
        changes: dict[str, Any] = {}
        if self.instructions is not None:
            changes["instructions"] = self.instructions
        if self.output_modalities is not None:
            changes["output_modalities"] = self.output_modalities
        if self.max_output_tokens is not None:
            tokens = self.max_output_tokens
            changes["max_output_tokens"] = None if tokens == "inf" else tokens
        if self.temperature is not None:
            changes["temperature"] = self.temperature
        if self.voice is not None:
            changes["voice"] = self.voice
        if self.output_format is not None:
            merged = merge_session(settings.output_format.to_document(), self.output_format)
            changes["output_format"] = AudioFormat.from_document(merged)
        if self.tools is not None:
            changes["tools"] = self.tools
        if self.tool_choice is not None:
            changes["tool_choice"] = self.tool_choice
        if self.reasoning_effort is not None:
            changes["reasoning_effort"] = self.reasoning_effort
        if self.parallel_tool_calls is not None:
            changes["parallel_tool_calls"] = self.parallel_tool_calls
        return replace(settings, **changes)


@dataclass(frozen=True, kw_only=True)
class ResponseCreate(Command):
    name: ClassVar[str] = "response.create"
    overrides: ResponseOverrides | None = None


@dataclass(frozen=True, kw_only=True)
class ResponseVideoUpdate(Command):
    """voxline extension: steer the video of response `response_id` (``response.video``
    or the ``show_video`` tool's) to `prompt` from its next chunk on, keeping what it
    showed so far; `negative_prompt` None keeps the video's."""

    name: ClassVar[str] = "response.video.update"
    response_id: str
    prompt: str
    negative_prompt: str | None = None


@dataclass(frozen=True, kw_only=True)
class ResponseCancel(Command):
    name: ClassVar[str] = "response.cancel"
    response_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class OutputAudioClear(Command):
    """Stop and discard output audio queued for playout."""

    name: ClassVar[str] = "output_audio_buffer.clear"


ClientCommand = (SessionUpdate | InputAudioAppend | InputAudioCommit | InputAudioClear | ItemCreate
                 | ItemRetrieve | ItemTruncate | ItemDelete | ResponseCreate | ResponseCancel
                 | OutputAudioClear | ResponseVideoUpdate)
