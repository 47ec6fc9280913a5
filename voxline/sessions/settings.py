"""Session settings: the neutral, transport-independent configuration of one session.

A session's settings are immutable (:class:`SessionSettings`, replaced on every update).
Updates arrive as a *settings document* patch: a nested mapping that uses the nesting and
names of OpenAI's GA ``session`` object (``audio.input.turn_detection`` ...), because
that is the most complete description of a voice session there is. The transport turns
its own wire shape into that patch (``voxline.realtime`` maps both OpenAI dialects);
:meth:`SessionSettings.apply` deep-merges it (:func:`merge_session`) and rebuilds.

Voxline extensions: ``temperature`` (OpenAI's GA sessions have none) and PCM at the rates
in :data:`PCM_RATES`, not only 24 kHz.

A session is of one :data:`SessionKind`: ``realtime`` (a conversation: turns are answered)
or ``transcription`` (OpenAI's transcription sessions: input audio is transcribed turn by
turn and nothing answers; see :mod:`voxline.sessions.transcription_sessions`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from voxline.engines.protocol import DEFAULT_INSTRUCTIONS
from voxline.engines.protocol import TurnParams as EngineVAD

# ---------------------------------------------------------------------------------------
# Defaults (OpenAI's, where it has one) and limits: the one home for each
# ---------------------------------------------------------------------------------------

DEFAULT_MODEL = "voxline"
DEFAULT_VOICE = "alloy"
# voxline runs small local LLMs, which answer best greedy; clients may raise it.
DEFAULT_TEMPERATURE = 0.0
# OpenAI limits temperature to [0.6, 1.2] for its audio models; small local LLMs are
# often run colder or hotter, so voxline accepts the usual sampling range.
TEMPERATURE_MIN, TEMPERATURE_MAX = 0.0, 2.0
SPEED_MIN, SPEED_MAX = 0.25, 1.5
MAX_OUTPUT_TOKENS_LIMIT = 4096
PCM_RATES = (8000, 16000, 24000, 48000)
G711_RATE = 8000

_ENGINE_VAD = EngineVAD()  # the VAD defaults (OpenAI's) have their one home in the engine

Modality = Literal["text", "audio"]
AUDIO_MODALITIES: frozenset[str] = frozenset({"text", "audio"})
TEXT_MODALITIES: frozenset[str] = frozenset({"text"})

SessionKind = Literal["realtime", "transcription"]
ReasoningEffort = Literal["minimal", "low", "medium", "high", "xhigh"]  # OpenAI's names

AudioEncoding = Literal["pcm16", "ulaw", "alaw"]
_DOCUMENT_FORMATS: dict[str, AudioEncoding] = {
    "audio/pcm": "pcm16",
    "audio/pcmu": "ulaw",
    "audio/pcma": "alaw",
}
DOCUMENT_FORMAT_NAMES = {v: k for k, v in _DOCUMENT_FORMATS.items()}


def normalize_modalities(modalities: list[str] | tuple[str, ...] | frozenset[str]) -> frozenset[str]:
    """Canonical modality set: ``{"text", "audio"}`` (audio plus transcript) or ``{"text"}``.

    GA writes audio mode as ``["audio"]``, beta as ``["text", "audio"]``; both mean the same.
    """
    return AUDIO_MODALITIES if "audio" in modalities else TEXT_MODALITIES


@dataclass(frozen=True, slots=True)
class AudioFormat:
    """An audio format on the wire: sample encoding and rate (G.711 is always 8 kHz)."""

    encoding: AudioEncoding = "pcm16"
    rate: int = 24000

    @classmethod
    def of(cls, encoding: AudioEncoding, rate: int | None = None) -> AudioFormat:
        """``encoding`` at ``rate``; G.711 is always 8 kHz, PCM defaults to 24 kHz."""
        if encoding != "pcm16":
            return cls(encoding, G711_RATE)
        return cls("pcm16", rate or 24000)

    @classmethod
    def from_document(cls, fmt: Mapping[str, Any]) -> AudioFormat:
        """From a validated format object; a missing type means ``audio/pcm``."""
        return cls.of(_DOCUMENT_FORMATS[fmt.get("type") or "audio/pcm"], fmt.get("rate"))

    def to_document(self) -> dict[str, Any]:
        if self.encoding == "pcm16":
            return {"type": "audio/pcm", "rate": self.rate}
        return {"type": DOCUMENT_FORMAT_NAMES[self.encoding]}


@dataclass(frozen=True, slots=True)
class TurnDetection:
    """Server-side turn detection; ``semantic_vad`` uses ``eagerness``, not the VAD knobs."""

    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float = _ENGINE_VAD.threshold
    prefix_padding_ms: int = _ENGINE_VAD.prefix_padding_ms
    silence_duration_ms: int = _ENGINE_VAD.silence_duration_ms
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"

    @classmethod
    def from_document(cls, d: Mapping[str, Any]) -> TurnDetection:
        """From a validated turn_detection object; absent keys default."""
        fields = {k: v for k, v in d.items() if v is not None and k in cls.__dataclass_fields__}
        fields["idle_timeout_ms"] = d.get("idle_timeout_ms")
        return cls(**fields)

    def to_document(self) -> dict[str, Any]:
        if self.type == "semantic_vad":
            return {
                "type": "semantic_vad",
                "eagerness": self.eagerness,
                "create_response": self.create_response,
                "interrupt_response": self.interrupt_response,
            }
        out: dict[str, Any] = {
            "type": "server_vad",
            "threshold": self.threshold,
            "prefix_padding_ms": self.prefix_padding_ms,
            "silence_duration_ms": self.silence_duration_ms,
            "create_response": self.create_response,
            "interrupt_response": self.interrupt_response,
            "idle_timeout_ms": self.idle_timeout_ms,
        }
        return out


@dataclass(frozen=True, slots=True)
class Transcription:
    """Input audio transcription settings; ``model`` None means the server's default ASR."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None

    @classmethod
    def from_document(cls, d: Mapping[str, Any]) -> Transcription:
        return cls(d.get("model"), d.get("language"), d.get("prompt"))

    def to_document(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model}
        if self.language is not None:
            out["language"] = self.language
        if self.prompt is not None:
            out["prompt"] = self.prompt
        return out


@dataclass(frozen=True)
class SessionSettings:
    """Dialect-independent session configuration; immutable, replaced on every update.

    ``output_modalities`` is :data:`AUDIO_MODALITIES` (audio plus its transcript) or
    :data:`TEXT_MODALITIES`; ``max_output_tokens`` None means unlimited (``"inf"``).
    ``tools`` / ``tool_choice`` / ``tracing`` / ``truncation`` are kept as sent and echoed.
    """

    model: str = DEFAULT_MODEL
    instructions: str = DEFAULT_INSTRUCTIONS
    output_modalities: frozenset[str] = AUDIO_MODALITIES
    input_format: AudioFormat = AudioFormat()
    output_format: AudioFormat = AudioFormat()
    voice: str = DEFAULT_VOICE
    speed: float = 1.0
    turn_detection: TurnDetection | None = TurnDetection()
    transcription: Transcription | None = None
    noise_reduction: Literal["near_field", "far_field"] | None = None
    temperature: float = DEFAULT_TEMPERATURE
    max_output_tokens: int | None = None
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] = "auto"
    tracing: str | dict[str, Any] | None = None
    truncation: str | dict[str, Any] = "auto"
    kind: SessionKind = "realtime"
    include: tuple[str, ...] = ()  # e.g. "item.input_audio_transcription.logprobs"
    reasoning_effort: ReasoningEffort | None = None  # None: the reply model's own default
    parallel_tool_calls: bool | None = None  # None: the reply model's own default

    @classmethod
    def transcription_session(cls, model: str = DEFAULT_MODEL) -> SessionSettings:
        """A transcription session's defaults: server VAD turns, transcribed by the
        server's ASR, never answered."""
        return cls(model=model, kind="transcription", transcription=Transcription(),
                   output_modalities=TEXT_MODALITIES)

    @property
    def responds(self) -> bool:
        """Whether the session answers turns (False: a transcription session)."""
        return self.kind == "realtime"

    @property
    def audio_output(self) -> bool:
        return "audio" in self.output_modalities

    @property
    def transcription_enabled(self) -> bool:
        return self.transcription is not None

    @property
    def transcription_model(self) -> str | None:
        return self.transcription.model if self.transcription else None

    # -- the settings document --------------------------------------------------------

    def apply(self, changes: Mapping[str, Any]) -> SessionSettings:
        """The settings after an update: ``changes`` (a validated settings-document patch)
        deep-merged onto these; an explicit null turns a feature off."""
        return SessionSettings.from_document(merge_session(self.document(), changes))

    @classmethod
    def from_document(cls, d: Mapping[str, Any]) -> SessionSettings:
        """From a complete settings document (what :meth:`document` returns)."""
        a_in, a_out = d["audio"]["input"], d["audio"]["output"]
        td, tr, nr = a_in.get("turn_detection"), a_in.get("transcription"), a_in.get("noise_reduction")
        tokens = d["max_output_tokens"]
        return cls(
            model=d["model"],
            instructions=d["instructions"],
            output_modalities=normalize_modalities(d["output_modalities"]),
            input_format=AudioFormat.from_document(a_in["format"]),
            output_format=AudioFormat.from_document(a_out["format"]),
            voice=a_out["voice"],
            speed=a_out["speed"],
            turn_detection=None if td is None else TurnDetection.from_document(td),
            transcription=None if tr is None else Transcription.from_document(tr),
            noise_reduction=None if nr is None else (nr.get("type") or "near_field"),
            temperature=d.get("temperature", DEFAULT_TEMPERATURE),
            max_output_tokens=None if tokens == "inf" else tokens,
            tools=tuple(d["tools"]),
            tool_choice=d["tool_choice"],
            tracing=d["tracing"],
            truncation=d["truncation"],
            kind=d.get("type", "realtime"),
            include=tuple(d.get("include") or ()),
            reasoning_effort=(d.get("reasoning") or {}).get("effort"),
            parallel_tool_calls=d.get("parallel_tool_calls"),
        )

    def document(self) -> dict[str, Any]:
        """The complete settings as one nested mapping (GA nesting plus ``temperature``)."""
        return {
            "type": self.kind,
            "model": self.model,
            "output_modalities": ["audio"] if self.audio_output else ["text"],
            "instructions": self.instructions,
            "audio": {
                "input": {
                    "format": self.input_format.to_document(),
                    "transcription": self.transcription.to_document() if self.transcription else None,
                    "noise_reduction": (
                        {"type": self.noise_reduction} if self.noise_reduction else None
                    ),
                    "turn_detection": (
                        self.turn_detection.to_document() if self.turn_detection else None
                    ),
                },
                "output": {
                    "format": self.output_format.to_document(),
                    "voice": self.voice,
                    "speed": self.speed,
                },
            },
            "max_output_tokens": "inf" if self.max_output_tokens is None else self.max_output_tokens,
            "tools": copy.deepcopy(list(self.tools)),
            "tool_choice": copy.deepcopy(self.tool_choice),
            "tracing": copy.deepcopy(self.tracing),
            "truncation": copy.deepcopy(self.truncation),
            "temperature": self.temperature,
            "include": list(self.include),
            "reasoning": {"effort": self.reasoning_effort},
            "parallel_tool_calls": self.parallel_tool_calls,
        }


def merge_session(current: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``patch`` onto ``current`` and return a new dict; inputs are untouched.

    Objects merge key by key; lists, scalars and ``None`` replace. An object whose
    ``type`` differs from the current one (``server_vad`` -> ``semantic_vad``,
    ``audio/pcm`` -> ``audio/pcmu``) replaces it whole, so no stale variant fields survive.
    """
    out = copy.deepcopy(dict(current))
    for key, new in patch.items():
        old = out.get(key)
        if (
            isinstance(old, Mapping)
            and isinstance(new, Mapping)
            and ("type" not in new or old.get("type") == new["type"])
        ):
            out[key] = merge_session(old, new)
        else:
            out[key] = copy.deepcopy(new)
    return out
