"""Session configuration of ``/v1/realtime``: both wire dialects and one neutral view.

Clients speak one of two dialects. GA (``gpt-realtime``) nests audio settings under
``audio.input`` / ``audio.output``; beta (``OpenAI-Beta: realtime=v1``) keeps them flat
(``input_audio_format``, ``turn_detection``, ``voice``...). One lenient validator,
:class:`SessionPatch`, accepts either shape with strict JSON types and reports errors at
the path the client wrote. A validated patch is moved into GA shape
(:meth:`SessionPatch.to_ga_dict`), deep-merged onto the current settings
(:func:`merge_session`) and rebuilt, so there is one builder and two renderers
(:meth:`SessionSettings.to_ga` / :meth:`SessionSettings.to_beta`).

Voxline extensions (never sent by OpenAI clients, harmless to them): ``temperature`` is
accepted in both dialects (GA sessions have none, so GA renders omit it), and
``audio/pcm`` accepts the rates in :data:`PCM_RATES`, not only 24 kHz.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from voxline.errors import ProtocolError


class Dialect(StrEnum):
    """Which OpenAI Realtime wire shape a connection speaks."""

    GA = "ga"
    BETA = "beta"


def new_id(prefix: str) -> str:
    """``prefix_`` + 22 hex digits of 88 random bits; unique without coordination."""
    return f"{prefix}_{os.urandom(11).hex()}"


# ---------------------------------------------------------------------------------------
# Defaults (OpenAI's) and limits
# ---------------------------------------------------------------------------------------

DEFAULT_MODEL = "voxline"
# Kept in step with the engine's default: small local models ramble without a firm limit.
DEFAULT_INSTRUCTIONS = (
    "You are a helpful, concise voice assistant. Answer in one or two short sentences."
)
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

Modality = Literal["text", "audio"]
AUDIO_MODALITIES: frozenset[str] = frozenset({"text", "audio"})
TEXT_MODALITIES: frozenset[str] = frozenset({"text"})

AudioEncoding = Literal["pcm16", "ulaw", "alaw"]
_GA_FORMAT_TO_ENCODING: dict[str, AudioEncoding] = {
    "audio/pcm": "pcm16",
    "audio/pcmu": "ulaw",
    "audio/pcma": "alaw",
}
_BETA_FORMAT_TO_ENCODING: dict[str, AudioEncoding] = {
    "pcm16": "pcm16",
    "g711_ulaw": "ulaw",
    "g711_alaw": "alaw",
}
_ENCODING_TO_GA = {v: k for k, v in _GA_FORMAT_TO_ENCODING.items()}
_ENCODING_TO_BETA = {v: k for k, v in _BETA_FORMAT_TO_ENCODING.items()}


def normalize_modalities(modalities: list[str] | tuple[str, ...] | frozenset[str]) -> frozenset[str]:
    """Canonical modality set: ``{"text", "audio"}`` (audio plus transcript) or ``{"text"}``.

    GA writes audio mode as ``["audio"]``, beta as ``["text", "audio"]``; both mean the same.
    """
    return AUDIO_MODALITIES if "audio" in modalities else TEXT_MODALITIES


# ---------------------------------------------------------------------------------------
# Validation building blocks (strict JSON types; unknown fields ignored like OpenAI)
# ---------------------------------------------------------------------------------------


class WireModel(BaseModel):
    """Base of models validated from client JSON: strict types, unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")


def _choice_check(allowed: Mapping[str, Any], what: str):
    choices = ", ".join(repr(k) for k in allowed)

    def check(value: str) -> str:
        if value not in allowed:
            raise PydanticCustomError(
                "unsupported_value",
                "unsupported {what} {got}; supported: {choices}",
                {"what": what, "got": repr(value), "choices": choices},
            )
        return value

    return check


def _check_max_tokens(value: Any) -> int | str:
    if value == "inf":
        return "inf"
    if isinstance(value, bool) or not isinstance(value, int):
        raise PydanticCustomError(
            "invalid_type",
            "expected an integer or 'inf', got {got}",
            {"got": json_type_name(value)},
        )
    if not 1 <= value <= MAX_OUTPUT_TOKENS_LIMIT:
        raise PydanticCustomError(
            "out_of_range",
            "must be between 1 and {limit} or 'inf' (got {got})",
            {"limit": MAX_OUTPUT_TOKENS_LIMIT, "got": value},
        )
    return value


def _voice_name(value: Any) -> Any:
    """GA allows a custom voice object ``{"id": ...}``; voxline keeps the id string."""
    if isinstance(value, Mapping) and isinstance(value.get("id"), str):
        return value["id"]
    return value


Threshold = Annotated[float, Field(ge=0.0, le=1.0)]
Milliseconds = Annotated[int, Field(ge=0)]
Temperature = Annotated[float, Field(ge=TEMPERATURE_MIN, le=TEMPERATURE_MAX)]
Speed = Annotated[float, Field(ge=SPEED_MIN, le=SPEED_MAX)]
Modalities = Annotated[list[Modality], Field(min_length=1)]
MaxTokens = Annotated[int | Literal["inf"], PlainValidator(_check_max_tokens)]
Voice = Annotated[str, BeforeValidator(_voice_name)]
GaFormatType = Annotated[str, AfterValidator(_choice_check(_GA_FORMAT_TO_ENCODING, "audio format"))]
BetaFormatName = Annotated[
    str, AfterValidator(_choice_check(_BETA_FORMAT_TO_ENCODING, "audio format"))
]


class AudioFormatWire(WireModel):
    """GA audio format object: ``{"type": "audio/pcm", "rate": 24000}`` or μ-law/A-law."""

    type: GaFormatType | None = None
    rate: int | None = None

    @field_validator("rate")
    @classmethod
    def _rate_fits_type(cls, rate: int | None, info: ValidationInfo) -> int | None:
        if rate is None:
            return rate
        kind = info.data.get("type")
        if kind in ("audio/pcmu", "audio/pcma"):
            if rate != G711_RATE:
                raise PydanticCustomError(
                    "out_of_range", "{kind} is always {g711} Hz (got {rate})",
                    {"kind": kind, "g711": G711_RATE, "rate": rate},
                )
        elif rate not in PCM_RATES:
            raise PydanticCustomError(
                "out_of_range", "unsupported PCM rate {rate}; supported: {rates}",
                {"rate": rate, "rates": ", ".join(map(str, PCM_RATES))},
            )
        return rate


class TurnDetectionWire(WireModel):
    """Turn detection in either dialect; every field optional so a patch can touch one."""

    type: Literal["server_vad", "semantic_vad"] | None = None
    threshold: Threshold | None = None
    prefix_padding_ms: Milliseconds | None = None
    silence_duration_ms: Milliseconds | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None
    idle_timeout_ms: Milliseconds | None = None
    eagerness: Literal["low", "medium", "high", "auto"] | None = None


class TranscriptionWire(WireModel):
    model: str | None = None
    language: str | None = None
    prompt: str | None = None


class NoiseReductionWire(WireModel):
    type: Literal["near_field", "far_field"] | None = None


class AudioInputWire(WireModel):
    format: AudioFormatWire | None = None
    transcription: TranscriptionWire | None = None
    turn_detection: TurnDetectionWire | None = None
    noise_reduction: NoiseReductionWire | None = None


class AudioOutputWire(WireModel):
    format: AudioFormatWire | None = None
    voice: Voice | None = None
    speed: Speed | None = None


class AudioWire(WireModel):
    input: AudioInputWire | None = None
    output: AudioOutputWire | None = None


# Fields where an explicit ``null`` means "turn off"; a null anywhere else means "unchanged".
_NULL_MEANS_OFF = frozenset(
    {"turn_detection", "transcription", "noise_reduction", "tracing", "idle_timeout_ms"}
)
_BETA_ONLY_FIELDS = frozenset(
    {
        "modalities",
        "voice",
        "speed",
        "temperature",
        "input_audio_format",
        "output_audio_format",
        "input_audio_transcription",
        "input_audio_noise_reduction",
        "turn_detection",
        "max_response_output_tokens",
    }
)
_GA_ONLY_FIELDS = frozenset({"type", "audio", "output_modalities", "max_output_tokens", "truncation"})


class SessionPatch(WireModel):
    """A ``session`` object as a client sends it, GA or beta; only set fields are a change."""

    # both dialects
    model: str | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    tracing: Literal["auto"] | dict[str, Any] | None = None
    temperature: Temperature | None = None
    # GA
    type: Literal["realtime"] | None = None
    output_modalities: Modalities | None = None
    audio: AudioWire | None = None
    max_output_tokens: MaxTokens | None = None
    truncation: Literal["auto", "disabled"] | dict[str, Any] | None = None
    # beta
    modalities: Modalities | None = None
    voice: Voice | None = None
    speed: Speed | None = None
    input_audio_format: BetaFormatName | None = None
    output_audio_format: BetaFormatName | None = None
    input_audio_transcription: TranscriptionWire | None = None
    input_audio_noise_reduction: NoiseReductionWire | None = None
    turn_detection: TurnDetectionWire | None = None
    max_response_output_tokens: MaxTokens | None = None

    def dialect_hint(self) -> Dialect | None:
        """BETA if a beta-only field was set, GA if a GA-only one was, else None."""
        if self.model_fields_set & _BETA_ONLY_FIELDS:
            return Dialect.BETA
        if self.model_fields_set & _GA_ONLY_FIELDS:
            return Dialect.GA
        return None

    def to_ga_dict(self) -> dict[str, Any]:
        """The fields the client set, in GA shape, ready for :func:`merge_session`.

        Beta names move to their GA places; where a client sent both, the GA form wins.
        Nulls are dropped except where null turns a feature off (``_NULL_MEANS_OFF``).
        """
        sent = self.model_dump(exclude_unset=True)
        beta: dict[str, Any] = {}
        audio_in: dict[str, Any] = {}
        audio_out: dict[str, Any] = {}
        if "modalities" in sent:
            beta["output_modalities"] = sent.pop("modalities")
        if "max_response_output_tokens" in sent:
            beta["max_output_tokens"] = sent.pop("max_response_output_tokens")
        if (name := sent.pop("input_audio_format", None)) is not None:
            audio_in["format"] = AudioFormat.from_beta(name).to_ga()
        if (name := sent.pop("output_audio_format", None)) is not None:
            audio_out["format"] = AudioFormat.from_beta(name).to_ga()
        for beta_name, ga_name in (
            ("input_audio_transcription", "transcription"),
            ("turn_detection", "turn_detection"),
            ("input_audio_noise_reduction", "noise_reduction"),
        ):
            if beta_name in sent:
                audio_in[ga_name] = sent.pop(beta_name)
        for name in ("voice", "speed"):
            if name in sent:
                audio_out[name] = sent.pop(name)
        if audio_in or audio_out:
            beta["audio"] = {"input": audio_in, "output": audio_out}
        sent.pop("type", None)
        return _drop_nulls(merge_session(beta, sent))


def _drop_nulls(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if value is None:
            if key in _NULL_MEANS_OFF:
                out[key] = None
        elif isinstance(value, dict) and key not in ("tool_choice", "tracing", "truncation"):
            out[key] = _drop_nulls(value)
        else:
            out[key] = value
    return out


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


# ---------------------------------------------------------------------------------------
# Validation errors -> ProtocolError
# ---------------------------------------------------------------------------------------

_TYPE_NAMES = {
    "string_type": "a string",
    "float_type": "a number",
    "int_type": "an integer",
    "bool_type": "a boolean",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "dataclass_type": "an object",
}
_MISSING_TYPES = frozenset({"missing", "missing_field", "union_tag_not_found"})


def json_type_name(value: Any) -> str:
    """The JSON name of a decoded value's type (``null``, ``boolean``, ``number``...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _wire_path(raw: Any, loc: tuple[Any, ...], keep_last: bool) -> list[str | int]:
    """Pydantic's loc minus union tags and validator labels, by walking the client's JSON."""
    path: list[str | int] = []
    node = raw
    for i, seg in enumerate(loc):
        if isinstance(node, Mapping) and isinstance(seg, str) and seg in node:
            path.append(seg)
            node = node[seg]
        elif isinstance(node, list) and isinstance(seg, int) and 0 <= seg < len(node):
            path.append(seg)
            node = node[seg]
        elif keep_last and i == len(loc) - 1:
            path.append(seg)
    return path


def format_param(path: list[str | int] | tuple[str | int, ...]) -> str | None:
    """``["item", "content", 0, "type"]`` -> ``"item.content[0].type"``."""
    out = ""
    for seg in path:
        if isinstance(seg, int):
            out += f"[{seg}]"
        else:
            out += f".{seg}" if out else seg
    return out or None


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def protocol_error_from_validation(
    exc: ValidationError,
    raw: Any,
    *,
    event_type: str,
    event_id: str | None,
    root: tuple[str, ...] = (),
) -> ProtocolError:
    """Turn pydantic's first error into a ProtocolError naming the event and the field.

    ``raw`` is the decoded JSON that was validated (walked to map pydantic's location to
    the client's own path); ``root`` prefixes the path when ``raw`` is a sub-object.
    Codes: ``missing_required_parameter``, ``invalid_type`` or ``invalid_value``.
    """
    err = exc.errors(include_url=False)[0]
    kind: str = err["type"]
    ctx = err.get("ctx") or {}
    path = _wire_path(raw, err["loc"], keep_last=kind == "missing")
    if kind in ("union_tag_not_found", "union_tag_invalid"):
        path.append(str(ctx.get("discriminator", "type")).strip("'"))
    if "field" in ctx:  # validators that check one sub-field report it here
        sub = ctx["field"]
        path.extend(sub if isinstance(sub, tuple) else (sub,))
    param = format_param([*root, *path])
    where = f"'{param}'" if param else "the event"
    value = err.get("input")
    if kind in _MISSING_TYPES:
        return ProtocolError(
            f"{event_type}: missing required field {where}",
            code="missing_required_parameter", event_id=event_id, param=param,
        )
    if kind in _TYPE_NAMES or kind == "invalid_type":
        expected = _TYPE_NAMES.get(kind)
        detail = (
            f"expected {expected}, got {json_type_name(value)}" if expected else err["msg"]
        )
        return ProtocolError(
            f"{event_type}: invalid type for {where}: {detail}",
            code="invalid_type", event_id=event_id, param=param,
        )
    if kind == "union_tag_invalid":
        detail = f"unknown type {ctx.get('tag')!r}; expected one of {ctx.get('expected_tags')}"
    else:
        msg: str = err["msg"]
        detail = msg[:1].lower() + msg[1:]
        if not isinstance(value, Mapping | list) and kind not in ("unsupported_value", "out_of_range"):
            detail += f" (got {_short_repr(value)})"
    return ProtocolError(
        f"{event_type}: invalid value for {where}: {detail}",
        code="invalid_value", event_id=event_id, param=param,
    )


def validate_session(session: Any, *, event_type: str = "session.update",
                     event_id: str | None = None) -> SessionPatch:
    """Validate a ``session`` object (either dialect); errors carry ``session.``-rooted params."""
    try:
        return SessionPatch.model_validate(session)
    except ValidationError as exc:
        raise protocol_error_from_validation(
            exc, session, event_type=event_type, event_id=event_id, root=("session",)
        ) from None


# ---------------------------------------------------------------------------------------
# Neutral settings
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AudioFormat:
    """A wire audio format: sample encoding and rate (G.711 is always 8 kHz)."""

    encoding: AudioEncoding = "pcm16"
    rate: int = 24000

    @classmethod
    def from_ga(cls, fmt: Mapping[str, Any]) -> AudioFormat:
        """From a validated GA format object; a missing type means ``audio/pcm``."""
        encoding = _GA_FORMAT_TO_ENCODING[fmt.get("type") or "audio/pcm"]
        if encoding != "pcm16":
            return cls(encoding, G711_RATE)
        return cls("pcm16", fmt.get("rate") or 24000)

    @classmethod
    def from_beta(cls, name: str) -> AudioFormat:
        encoding = _BETA_FORMAT_TO_ENCODING[name]
        return cls(encoding, 24000 if encoding == "pcm16" else G711_RATE)

    def to_ga(self) -> dict[str, Any]:
        if self.encoding == "pcm16":
            return {"type": "audio/pcm", "rate": self.rate}
        return {"type": _ENCODING_TO_GA[self.encoding]}

    def to_beta(self) -> str:
        """Beta names carry no rate: ``pcm16`` means 24 kHz to a beta client."""
        return _ENCODING_TO_BETA[self.encoding]


@dataclass(frozen=True, slots=True)
class TurnDetection:
    """Server-side turn detection; ``semantic_vad`` uses ``eagerness``, not the VAD knobs."""

    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> TurnDetection:
        """From a validated turn_detection object of either dialect; absent keys default."""
        fields = {k: v for k, v in d.items() if v is not None and k in cls.__dataclass_fields__}
        fields["idle_timeout_ms"] = d.get("idle_timeout_ms")
        return cls(**fields)

    def to_wire(self, dialect: Dialect) -> dict[str, Any]:
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
        }
        if dialect is Dialect.GA:
            # beta's session type has no idle timeout: a beta client's setting still
            # applies, it is just not echoed (the SDK's types reject unknown fields)
            out["idle_timeout_ms"] = self.idle_timeout_ms
        return out


@dataclass(frozen=True, slots=True)
class Transcription:
    """Input audio transcription settings; ``model`` None means the server's default ASR."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> Transcription:
        return cls(d.get("model"), d.get("language"), d.get("prompt"))

    def to_wire(self) -> dict[str, Any]:
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

    @property
    def audio_output(self) -> bool:
        return "audio" in self.output_modalities

    @property
    def transcription_enabled(self) -> bool:
        return self.transcription is not None

    @property
    def transcription_model(self) -> str | None:
        return self.transcription.model if self.transcription else None

    # -- building -------------------------------------------------------------------

    @classmethod
    def from_ga(cls, session: Mapping[str, Any]) -> SessionSettings:
        """Settings from a GA ``session`` object; absent fields take OpenAI's defaults.

        Raises ProtocolError (params rooted at ``session``) on invalid values.
        """
        return cls().apply_update(validate_session(session))

    @classmethod
    def from_beta(cls, session: Mapping[str, Any]) -> SessionSettings:
        """Settings from a beta ``session`` object; absent fields take OpenAI's defaults."""
        return cls().apply_update(validate_session(session))

    @classmethod
    def from_wire(cls, session: Mapping[str, Any], dialect: Dialect) -> SessionSettings:
        return cls.from_ga(session) if dialect is Dialect.GA else cls.from_beta(session)

    def apply_update(self, patch: SessionPatch) -> SessionSettings:
        """The settings after a ``session.update``: deep merge, nulls turn features off."""
        merged = merge_session(self._ga_with_extensions(), patch.to_ga_dict())
        return SessionSettings._from_full_ga(merged)

    @classmethod
    def _from_full_ga(cls, d: Mapping[str, Any]) -> SessionSettings:
        a_in, a_out = d["audio"]["input"], d["audio"]["output"]
        td, tr, nr = a_in.get("turn_detection"), a_in.get("transcription"), a_in.get("noise_reduction")
        tokens = d["max_output_tokens"]
        return cls(
            model=d["model"],
            instructions=d["instructions"],
            output_modalities=normalize_modalities(d["output_modalities"]),
            input_format=AudioFormat.from_ga(a_in["format"]),
            output_format=AudioFormat.from_ga(a_out["format"]),
            voice=a_out["voice"],
            speed=a_out["speed"],
            turn_detection=None if td is None else TurnDetection.from_wire(td),
            transcription=None if tr is None else Transcription.from_wire(tr),
            noise_reduction=None if nr is None else (nr.get("type") or "near_field"),
            temperature=d["temperature"],
            max_output_tokens=None if tokens == "inf" else tokens,
            tools=tuple(d["tools"]),
            tool_choice=d["tool_choice"],
            tracing=d["tracing"],
            truncation=d["truncation"],
        )

    # -- rendering ------------------------------------------------------------------

    def to_ga(self) -> dict[str, Any]:
        """The GA ``session`` payload of ``session.created`` / ``session.updated``."""
        return {
            "type": "realtime",
            "model": self.model,
            "output_modalities": ["audio"] if self.audio_output else ["text"],
            "instructions": self.instructions,
            "audio": {
                "input": {
                    "format": self.input_format.to_ga(),
                    "transcription": self.transcription.to_wire() if self.transcription else None,
                    "noise_reduction": (
                        {"type": self.noise_reduction} if self.noise_reduction else None
                    ),
                    "turn_detection": (
                        self.turn_detection.to_wire(Dialect.GA) if self.turn_detection else None
                    ),
                },
                "output": {
                    "format": self.output_format.to_ga(),
                    "voice": self.voice,
                    "speed": self.speed,
                },
            },
            "max_output_tokens": "inf" if self.max_output_tokens is None else self.max_output_tokens,
            "tools": copy.deepcopy(list(self.tools)),
            "tool_choice": copy.deepcopy(self.tool_choice),
            "tracing": copy.deepcopy(self.tracing),
            "truncation": copy.deepcopy(self.truncation),
        }

    def to_beta(self) -> dict[str, Any]:
        """The beta ``session`` payload of ``session.created`` / ``session.updated``."""
        return {
            "model": self.model,
            "modalities": ["text", "audio"] if self.audio_output else ["text"],
            "instructions": self.instructions,
            "voice": self.voice,
            "speed": self.speed,
            "input_audio_format": self.input_format.to_beta(),
            "output_audio_format": self.output_format.to_beta(),
            "input_audio_transcription": (
                self.transcription.to_wire() if self.transcription else None
            ),
            "input_audio_noise_reduction": (
                {"type": self.noise_reduction} if self.noise_reduction else None
            ),
            "turn_detection": (
                self.turn_detection.to_wire(Dialect.BETA) if self.turn_detection else None
            ),
            "temperature": self.temperature,
            "max_response_output_tokens": (
                "inf" if self.max_output_tokens is None else self.max_output_tokens
            ),
            "tools": copy.deepcopy(list(self.tools)),
            "tool_choice": copy.deepcopy(self.tool_choice),
            "tracing": copy.deepcopy(self.tracing),
        }

    def to_wire(self, dialect: Dialect) -> dict[str, Any]:
        return self.to_ga() if dialect is Dialect.GA else self.to_beta()

    def _ga_with_extensions(self) -> dict[str, Any]:
        """GA shape plus the fields GA renders omit: the complete state as one dict."""
        return {**self.to_ga(), "temperature": self.temperature}
