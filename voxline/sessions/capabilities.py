"""What this server does with a session's settings: the engine's view of them
(:func:`stream_config`) and a clear refusal of what it cannot do (:func:`check_supported`),
so no setting is accepted and then ignored.

Parameters in errors use the settings-document path (OpenAI GA nesting, e.g.
``session.audio.input.noise_reduction``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec

from voxline.engines import protocol as ep
from voxline.errors import ProtocolError
from voxline.sessions import mcp_servers as mcp
from voxline.sessions.commands import ResponseOverrides
from voxline.sessions.settings import SessionSettings
from voxline.sessions.video_responses import check_video_overrides

# The shipped ASR (Moonshine base-en) transcribes English only and takes no prompt.
TRANSCRIPTION_LANGUAGES = ("en",)


@dataclass(frozen=True)
class TranscriptionSupport:
    """What the server's ASR does with session.audio.input.transcription: the languages it
    can be told (None: any), and whether it takes a prompt."""

    asr: str = "Moonshine base-en"
    languages: tuple[str, ...] | None = TRANSCRIPTION_LANGUAGES
    prompt: bool = False


MOONSHINE = TranscriptionSupport()
# Every shipped ASR (Moonshine on onnxruntime or torch, Whisper) gives its transcripts'
# token log-probabilities: each decoding step's pick scored against its own logits.
LOGPROBS = "item.input_audio_transcription.logprobs"
WHISPER_HINT = "start the server with --asr whisper:<checkpoint dir> for a Whisper ASR"
# With no tool-capable model, only "no tools" choices can be honoured.
TOOL_CHOICES_WITHOUT_TOOLS = ("auto", "none")
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # what Chat Completions servers accept


def response_config(settings: SessionSettings, session: SessionSettings) -> ep.ResponseConfig:
    """The engine's view of a response run with `settings` (the session's own, or with a
    response.create's overrides applied) in a session whose settings are `session`."""
    return ep.ResponseConfig(
        instructions=settings.instructions if settings.instructions != session.instructions
        else None,
        audio=settings.audio_output, temperature=settings.temperature,
        max_output_tokens=settings.max_output_tokens, voice=settings.voice,
        reasoning_effort=settings.reasoning_effort
        if settings.reasoning_effort != session.reasoning_effort else None,
        parallel_tool_calls=settings.parallel_tool_calls
        if settings.parallel_tool_calls != session.parallel_tool_calls else None)


def stream_config(settings: SessionSettings,
                  mcp_tools: tuple[dict[str, Any], ...] = ()) -> ep.StreamConfig:
    """The engine's view of the session settings; `mcp_tools` are the function tools the
    session's MCP servers listed (the engine sees only function tools)."""
    td = settings.turn_detection
    vad = None
    if td is not None and td.type == "semantic_vad":
        vad = ep.TurnParams(eagerness=td.eagerness)
    elif td is not None:
        vad = ep.TurnParams(td.threshold, td.prefix_padding_ms, td.silence_duration_ms)
    # what the session will ask for when a turn ends: the engine may start it early
    answers = td is not None and td.create_response and settings.responds
    auto = response_config(settings, settings) if answers else None
    tr = settings.transcription
    return ep.StreamConfig(
        instructions=settings.instructions,
        turn_detection=vad,
        transcribe_partials=settings.transcription_enabled,
        temperature=settings.temperature,
        max_output_tokens=settings.max_output_tokens or 4096,
        speed=settings.speed,
        tools=chat_tools((*settings.tools, *mcp_tools)),
        tool_choice=chat_tool_choice(settings.tool_choice),
        auto_response=auto,
        truncation=truncation_config(settings.truncation),
        noise_reduction=settings.noise_reduction,  # RNNoise before VAD and ASR
        transcription_language=tr.language if tr is not None else None,
        transcription_prompt=(tr.prompt or None) if tr is not None else None,
        transcription_logprobs=LOGPROBS in settings.include,
        reasoning_effort=settings.reasoning_effort,
        parallel_tool_calls=settings.parallel_tool_calls,
    )


def truncation_config(truncation: str | dict[str, Any]) -> ep.Truncation:
    """The engine's view of a (validated) ``truncation``: ``auto`` or a retention ratio."""
    if not isinstance(truncation, dict):
        return ep.Truncation()
    limits = truncation.get("token_limits") or {}
    return ep.Truncation(retention_ratio=truncation["retention_ratio"],
                         post_instructions=limits.get("post_instructions"))


def _refuse(event: str, param: str, what: str) -> ProtocolError:
    return ProtocolError(f"{event}: {what} is not supported by this server", code="invalid_value",
                         param=param)


def check_supported(settings: SessionSettings, event: str = "session.update", *,
                    tools_supported: bool = False,
                    transcription: TranscriptionSupport = MOONSHINE) -> None:
    """Raise ProtocolError naming the first setting this server would have to ignore."""
    if settings.truncation == "disabled":
        raise _refuse(event, "session.truncation", "truncation 'disabled' (only 'auto' or "
                      "'retention_ratio': the oldest turns are left out when the context is "
                      "full)")
    _check_transcription(event, settings, transcription)
    _check_tools(event, "session", settings.tools, settings.tool_choice, tools_supported)
    _check_reasoning(event, "session", settings.reasoning_effort, tools_supported)


def _check_reasoning(event: str, root: str, effort: str | None, supported: bool) -> None:
    """Reasoning effort is honoured by a remote reply model (the condition tools have)."""
    if effort is not None and not supported:
        raise _refuse(event, f"{root}.reasoning.effort", f"reasoning effort {effort!r} with the "
                      "embedded model, which does not reason (start the server with "
                      "--llm openai:<url> for a reasoning reply model)")


def _check_transcription(event: str, settings: SessionSettings,
                         support: TranscriptionSupport) -> None:
    tr = settings.transcription
    langs = support.languages
    if tr is not None and tr.language is not None and langs is not None and (
            tr.language not in langs):
        only = ("is English-only: 'en'" if langs == ("en",)
                else f"knows {', '.join(repr(c) for c in langs)}")
        hint = f"; {WHISPER_HINT}" if support is MOONSHINE else ""
        raise _refuse(event, "session.audio.input.transcription.language",
                      f"transcription language {tr.language!r} (the ASR, {support.asr}, "
                      f"{only}{hint})")
    if tr is not None and tr.prompt and not support.prompt:
        raise _refuse(event, "session.audio.input.transcription.prompt",
                      f"a transcription prompt with {support.asr} (a Whisper ASR takes one: "
                      "--asr whisper:<checkpoint dir>)")


def check_overrides(overrides: ResponseOverrides, *, session_tools: tuple[dict, ...] = (),
                    tools_supported: bool = False) -> None:
    """The same for one response's overrides (a tool_choice may name a session tool)."""
    tools = overrides.tools if overrides.tools is not None else session_tools
    _check_tools("response.create", "response", tools, overrides.tool_choice, tools_supported)
    _check_reasoning("response.create", "response", overrides.reasoning_effort, tools_supported)
    check_video_overrides(overrides)


def _check_tools(event: str, root: str, tools: tuple[dict, ...] | list[dict],
                 tool_choice: object, supported: bool) -> None:
    if tools and not supported:
        raise _refuse(event, f"{root}.tools", "function calling with the embedded model (start "
                      "the server with --llm openai:<url> for a model that calls tools)")
    names = []
    if root == "session":
        names += list(mcp.servers_of(tools, event, root))  # valid, or ProtocolError
    for i, tool in enumerate(tools):
        if root == "session" and isinstance(tool, dict) and tool.get("type") == "mcp":
            continue
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise _refuse(event, f"{root}.tools[{i}].type", f"a tool of type {kind!r} (only "
                          "'function' tools, and 'mcp' tools in session.update)")
        name = tool.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise ProtocolError(f"{event}: tools[{i}].name must be 1-64 letters, digits, _ or -, "
                                f"got {name!r}", code="invalid_value", param=f"{root}.tools[{i}].name")
        if not isinstance(tool.get("parameters", {}), dict):
            raise ProtocolError(f"{event}: tools[{i}].parameters must be a JSON schema object",
                                code="invalid_value", param=f"{root}.tools[{i}].parameters")
        names.append(name)
    if tool_choice is None or tool_choice in TOOL_CHOICES_WITHOUT_TOOLS:
        return
    if tool_choice == "required" and names:
        return
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        if tool_choice.get("name") in names:
            return
        raise ProtocolError(f"{event}: tool_choice names function {tool_choice.get('name')!r}, "
                            f"which is not among the tools ({', '.join(names) or 'none'})",
                            code="invalid_value", param=f"{root}.tool_choice.name")
    if not supported:
        raise _refuse(event, f"{root}.tool_choice", f"tool_choice {tool_choice!r} without tools")
    raise ProtocolError(f"{event}: tool_choice {tool_choice!r} needs tools (or is not one of "
                        "'auto', 'none', 'required', {'type': 'function', 'name': ...})",
                        code="invalid_value", param=f"{root}.tool_choice")


def chat_tools(tools: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> tuple[dict, ...]:
    """Realtime function tools (flat: name, description, parameters) in the Chat Completions
    shape a reply model's server takes (nested under `function`)."""
    out = []
    for tool in tools:
        if tool.get("type") == "mcp":
            continue  # its server's listed tools come as function tools
        fn: dict[str, Any] = {"name": tool["name"]}
        if tool.get("description"):
            fn["description"] = tool["description"]
        fn["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
    return tuple(out)


def chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    """A Realtime `tool_choice` in the Chat Completions shape."""
    if isinstance(choice, dict):
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def with_tool_overrides(cfg: ep.ResponseConfig, settings: SessionSettings,
                        session: SessionSettings) -> ep.ResponseConfig:
    """`cfg` with the response's own tools / tool_choice where they differ from the session's
    (the engine holds the session's)."""
    if settings.tools == session.tools and settings.tool_choice == session.tool_choice:
        return cfg
    return msgspec.structs.replace(cfg, tools=chat_tools(settings.tools),
                                   tool_choice=chat_tool_choice(settings.tool_choice))
