"""The OpenAI Realtime ``session`` object on the wire, in both dialects.

Clients speak one of two dialects. GA (``gpt-realtime``) nests audio settings under
``audio.input`` / ``audio.output``; beta (``OpenAI-Beta: realtime=v1``) keeps them flat
(``input_audio_format``, ``turn_detection``, ``voice``...). One lenient validator,
:class:`SessionPatch`, accepts either shape with strict JSON types and reports errors at
the path the client wrote. A validated patch becomes a settings-document patch
(:meth:`SessionPatch.changes`) that the session applies
(:meth:`voxline.sessions.settings.SessionSettings.apply`); :func:`render_session` writes
settings back in either dialect. :func:`protocol_error_from_validation` turns pydantic's
errors into protocol errors that name the event and the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Discriminator,
    Field,
    PlainValidator,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from voxline.errors import ProtocolError
from voxline.realtime.openai.dialect import Dialect
from voxline.sessions.errors_vocabulary import Mistake, client_error, json_type_words
from voxline.sessions.items import StrictModel
from voxline.sessions.settings import (
    G711_RATE,
    MAX_OUTPUT_TOKENS_LIMIT,
    PCM_RATES,
    SPEED_MAX,
    SPEED_MIN,
    TEMPERATURE_MAX,
    TEMPERATURE_MIN,
    AudioEncoding,
    AudioFormat,
    Modality,
    ReasoningEffort,
    SessionSettings,
    merge_session,
)

WireModel = StrictModel
_GA_FORMATS: dict[str, AudioEncoding] = {
    "audio/pcm": "pcm16",
    "audio/pcmu": "ulaw",
    "audio/pcma": "alaw",
}
_BETA_FORMATS: dict[str, AudioEncoding] = {
    "pcm16": "pcm16",
    "g711_ulaw": "ulaw",
    "g711_alaw": "alaw",
}
_BETA_NAMES = {v: k for k, v in _BETA_FORMATS.items()}


def beta_format(name: str) -> AudioFormat:
    """A beta format name; beta names carry no rate: ``pcm16`` means 24 kHz."""
    return AudioFormat.of(_BETA_FORMATS[name], 24000)


def beta_format_name(fmt: AudioFormat) -> str:
    return _BETA_NAMES[fmt.encoding]


# ---------------------------------------------------------------------------------------
# Validation building blocks (strict JSON types; unknown fields ignored like OpenAI)
# ---------------------------------------------------------------------------------------


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
GaFormatType = Annotated[str, AfterValidator(_choice_check(_GA_FORMATS, "audio format"))]
BetaFormatName = Annotated[
    str, AfterValidator(_choice_check(_BETA_FORMATS, "audio format"))
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


class TokenLimitsWire(WireModel):
    post_instructions: Annotated[int, Field(ge=1)] | None = None


class ReasoningWire(WireModel):
    """``reasoning``: how hard a reasoning reply model thinks (OpenAI's ``effort`` names)."""

    effort: ReasoningEffort | None = None


class RetentionRatioWire(WireModel):
    """``truncation: {"type": "retention_ratio", ...}``: drop the oldest turns in one cut."""

    type: Literal["retention_ratio"]
    retention_ratio: Threshold
    token_limits: TokenLimitsWire | None = None


# a name ("auto", "disabled") or a retention-ratio object; errors name the object's field
TruncationWire = Annotated[
    Annotated[Literal["auto", "disabled"], Tag("name")]
    | Annotated[RetentionRatioWire, Tag("ratio")],
    Discriminator(lambda v: "ratio" if isinstance(v, Mapping | RetentionRatioWire) else "name"),
]


# Fields where an explicit ``null`` means "turn off"; a null anywhere else means "unchanged".
_NULL_MEANS_OFF = frozenset(
    {"turn_detection", "transcription", "noise_reduction", "tracing", "idle_timeout_ms",
     "reasoning", "effort"}
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
_GA_ONLY_FIELDS = frozenset({"type", "audio", "output_modalities", "max_output_tokens", "truncation",
                             "include", "reasoning", "parallel_tool_calls"})


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
    type: Literal["realtime", "transcription"] | None = None
    include: list[Literal["item.input_audio_transcription.logprobs"]] | None = None
    reasoning: ReasoningWire | None = None
    parallel_tool_calls: bool | None = None
    output_modalities: Modalities | None = None
    audio: AudioWire | None = None
    max_output_tokens: MaxTokens | None = None
    truncation: TruncationWire | None = None
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

    def changes(self) -> dict[str, Any]:
        """The fields the client set as a settings-document patch (GA shape), ready for
        :meth:`SessionSettings.apply`.

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
            audio_in["format"] = beta_format(name).to_document()
        if (name := sent.pop("output_audio_format", None)) is not None:
            audio_out["format"] = beta_format(name).to_document()
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
        if sent.get("type") is None:
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
        detail = f"{event_type}: missing required field {where}"
        if param is not None:  # OpenAI's wording, then ours
            return client_error(Mistake.MISSING_PARAMETER, detail, param=param,
                                event_id=event_id)
        return ProtocolError(detail, code="missing_required_parameter", event_id=event_id)
    if kind in _TYPE_NAMES or kind == "invalid_type":
        expected = _TYPE_NAMES.get(kind)
        got = json_type_name(value)
        detail = f"expected {expected}, got {got}" if expected else err["msg"]
        detail = f"{event_type}: invalid type for {where}: {detail}"
        if expected is not None and param is not None:
            return client_error(Mistake.INVALID_TYPE, detail, param=param, event_id=event_id,
                                expected=expected, got=json_type_words(value))
        return ProtocolError(detail, code="invalid_type", event_id=event_id, param=param)
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


def settings_from_wire(session: Mapping[str, Any]) -> SessionSettings:
    """Settings from a ``session`` object of either dialect; absent fields take the defaults.

    Raises ProtocolError (params rooted at ``session``) on invalid values.
    """
    return SessionSettings().apply(validate_session(session).changes())


def render_session(settings: SessionSettings, dialect: Dialect) -> dict[str, Any]:
    """The ``session`` payload of ``session.created`` / ``session.updated``."""
    if settings.kind == "transcription":
        if dialect is Dialect.BETA:
            return render_beta_transcription_session(settings)
        return render_transcription_session(settings)
    if dialect is Dialect.GA:
        out = settings.document()
        del out["temperature"]  # a voxline extension GA sessions do not have
        if not settings.include:
            del out["include"]
        if settings.reasoning_effort is None:
            del out["reasoning"]
        if settings.parallel_tool_calls is None:
            del out["parallel_tool_calls"]
        return out
    td = settings.turn_detection.to_document() if settings.turn_detection else None
    if td is not None:
        # beta's session type has no idle timeout: a beta client's setting still applies,
        # it is just not echoed (the SDK's types reject unknown fields)
        td.pop("idle_timeout_ms", None)
    return {
        "model": settings.model,
        "modalities": ["text", "audio"] if settings.audio_output else ["text"],
        "instructions": settings.instructions,
        "voice": settings.voice,
        "speed": settings.speed,
        "input_audio_format": beta_format_name(settings.input_format),
        "output_audio_format": beta_format_name(settings.output_format),
        "input_audio_transcription": (
            settings.transcription.to_document() if settings.transcription else None
        ),
        "input_audio_noise_reduction": (
            {"type": settings.noise_reduction} if settings.noise_reduction else None
        ),
        "turn_detection": td,
        "temperature": settings.temperature,
        "max_response_output_tokens": (
            "inf" if settings.max_output_tokens is None else settings.max_output_tokens
        ),
        "tools": [dict(t) for t in settings.tools],
        "tool_choice": settings.tool_choice,
        "tracing": settings.tracing,
    }


def render_beta_transcription_session(settings: SessionSettings) -> dict[str, Any]:
    """A transcription session's object in beta's ``transcription_session.*`` events: the
    SDK's beta ``TranscriptionSession`` fields, with ``include`` and the noise reduction as
    OpenAI's server sends them; no ``client_secret`` (only a REST-created one has it)."""
    td = settings.turn_detection
    turns: dict[str, Any] | None = None
    if td is not None and td.type == "semantic_vad":
        turns = {"type": "semantic_vad"}
    elif td is not None:
        turns = {"type": td.type, "threshold": td.threshold,
                 "prefix_padding_ms": td.prefix_padding_ms,
                 "silence_duration_ms": td.silence_duration_ms}
    tr = settings.transcription
    return {
        "modalities": ["text"],
        "input_audio_format": beta_format_name(settings.input_format),
        "input_audio_transcription": tr.to_document() if tr is not None else None,
        "turn_detection": turns,
        "input_audio_noise_reduction": (
            {"type": settings.noise_reduction} if settings.noise_reduction else None),
        "include": list(settings.include),
    }


def render_transcription_session(settings: SessionSettings) -> dict[str, Any]:
    """A transcription session's object (GA ``type: "transcription"``): its input audio
    settings and ``include``; it has no output, model or instructions."""
    audio_in = settings.document()["audio"]["input"]
    return {"type": "transcription", "audio": {"input": audio_in},
            "include": list(settings.include)}


INTENTS = ("transcription",)


def session_for_intent(intent: str | None, settings: SessionSettings) -> SessionSettings:
    """The session a connection opened with ``?intent=`` starts with: ``transcription``
    gives a transcription session (a client secret's transcription session stays as it is).
    Raises ProtocolError (param ``intent``) for an intent this server does not know."""
    if intent is None or intent == "" or settings.kind == "transcription":
        return settings
    if intent not in INTENTS:
        raise ProtocolError(f"unknown intent {intent!r}; supported: "
                            + ", ".join(repr(i) for i in INTENTS),
                            code="invalid_value", param="intent")
    return SessionSettings.transcription_session(settings.model)
