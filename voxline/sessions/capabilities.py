"""What this server does with a session's settings: the engine's view of them
(:func:`stream_config`) and a clear refusal of what it cannot do (:func:`check_supported`),
so no setting is accepted and then ignored.

Parameters in errors use the settings-document path (OpenAI GA nesting, e.g.
``session.audio.input.noise_reduction``).
"""

from __future__ import annotations

from voxline.engines import protocol as ep
from voxline.errors import ProtocolError
from voxline.sessions.commands import ResponseOverrides
from voxline.sessions.settings import SessionSettings

# semantic_vad: until the turn detector reads the words (the latency issue), the end of a
# turn is decided by silence alone, with `eagerness` choosing how long a pause must last.
SEMANTIC_VAD_SILENCE_MS = {"low": 1200, "medium": 600, "auto": 600, "high": 300}
# The shipped ASR (Moonshine base-en) transcribes English only and takes no prompt.
TRANSCRIPTION_LANGUAGES = ("en",)
# With no tool-capable model, only "no tools" choices can be honoured.
TOOL_CHOICES_WITHOUT_TOOLS = ("auto", "none")


def stream_config(settings: SessionSettings) -> ep.StreamConfig:
    """The engine's view of the session settings."""
    td = settings.turn_detection
    vad = None
    if td is not None and td.type == "semantic_vad":
        vad = ep.TurnDetection(silence_duration_ms=SEMANTIC_VAD_SILENCE_MS[td.eagerness])
    elif td is not None:
        vad = ep.TurnDetection(td.threshold, td.prefix_padding_ms, td.silence_duration_ms)
    return ep.StreamConfig(
        instructions=settings.instructions,
        turn_detection=vad,
        transcribe_partials=settings.transcription_enabled,
        temperature=settings.temperature,
        max_output_tokens=settings.max_output_tokens or 4096,
        speed=settings.speed,
    )


def _refuse(event: str, param: str, what: str) -> ProtocolError:
    return ProtocolError(f"{event}: {what} is not supported by this server", code="invalid_value",
                         param=param)


def check_supported(settings: SessionSettings, event: str = "session.update") -> None:
    """Raise ProtocolError naming the first setting this server would have to ignore."""
    if settings.noise_reduction is not None:
        raise _refuse(event, "session.audio.input.noise_reduction",
                      f"noise reduction ({settings.noise_reduction!r})")
    if settings.truncation != "auto":
        raise _refuse(event, "session.truncation", f"truncation {settings.truncation!r} (only "
                      "'auto': the oldest turns are left out when the context is full)")
    tr = settings.transcription
    if tr is not None and tr.language is not None and tr.language not in TRANSCRIPTION_LANGUAGES:
        raise _refuse(event, "session.audio.input.transcription.language",
                      f"transcription language {tr.language!r} (the ASR is English-only: 'en')")
    if tr is not None and tr.prompt:
        raise _refuse(event, "session.audio.input.transcription.prompt",
                      "a transcription prompt")
    _check_tools(event, "session", settings.tools, settings.tool_choice)


def check_overrides(overrides: ResponseOverrides) -> None:
    """The same for one response's overrides."""
    _check_tools("response.create", "response", overrides.tools or (), overrides.tool_choice)


def _check_tools(event: str, root: str, tools: tuple[dict, ...] | list[dict],
                 tool_choice: object) -> None:
    if tools:
        raise _refuse(event, f"{root}.tools", "function calling with the embedded model")
    if tool_choice is not None and tool_choice not in TOOL_CHOICES_WITHOUT_TOOLS:
        raise _refuse(event, f"{root}.tool_choice", f"tool_choice {tool_choice!r} without tools")
