"""The client's side of the OpenAI GA wire, for voxline's own remote SDK.

:func:`render_command` turns a neutral session command into the GA client event a server
parses (:mod:`voxline.realtime.openai.client_events` is its inverse); :func:`parse_server_event`
turns a GA server event back into the neutral :mod:`voxline.sessions.events` object that
:mod:`voxline.realtime.openai.server_events` rendered it from, so a remote session yields the same
typed events as an in-process one. Only the GA dialect is spoken here.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from voxline.errors import ProtocolError
from voxline.realtime.openai.dialect import Dialect
from voxline.realtime.openai.server_events import render_item, wire_type
from voxline.sessions import commands as cmd
from voxline.sessions import events as ev
from voxline.sessions.items import (
    ContentPart,
    ConversationItem,
    ErrorDetail,
    RateLimit,
    RealtimeResponse,
    ResponseStatusDetails,
    ResponseUsage,
)
from voxline.sessions.settings import (
    DEFAULT_TEMPERATURE,
    AudioFormat,
    SessionSettings,
    normalize_modalities,
)

# ---------------------------------------------------------------------------------------
# Commands -> GA client events
# ---------------------------------------------------------------------------------------


def _overrides(o: cmd.ResponseOverrides) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if o.instructions is not None:
        out["instructions"] = o.instructions
    if o.output_modalities is not None:
        out["output_modalities"] = ["audio"] if "audio" in o.output_modalities else ["text"]
    if o.max_output_tokens is not None:
        out["max_output_tokens"] = o.max_output_tokens
    audio_out: dict[str, Any] = {}
    if o.voice is not None:
        audio_out["voice"] = o.voice
    if o.output_format is not None:
        audio_out["format"] = dict(o.output_format)
    if audio_out:
        out["audio"] = {"output": audio_out}
    if o.conversation is not None:
        out["conversation"] = o.conversation
    if o.metadata is not None:
        out["metadata"] = o.metadata
    if o.tools is not None:
        out["tools"] = list(o.tools)
    if o.tool_choice is not None:
        out["tool_choice"] = o.tool_choice
    return out


def _item(item: ConversationItem) -> dict[str, Any]:
    out = render_item(item, Dialect.GA)
    del out["object"]
    return {k: v for k, v in out.items() if v is not None}


def render_command(command: cmd.ClientCommand) -> dict[str, Any]:
    """``command`` as a GA client event object (ready for ``json.dumps``)."""
    out: dict[str, Any] = {"type": command.name}
    if command.event_id is not None:
        out["event_id"] = command.event_id
    match command:
        case cmd.SessionUpdate():
            out["session"] = {"type": "realtime", **command.changes}
        case cmd.InputAudioAppend():
            out["audio"] = base64.b64encode(command.audio).decode("ascii")
        case cmd.ItemCreate():
            out["item"] = _item(command.item)
            if command.previous_item_id is not None:
                out["previous_item_id"] = command.previous_item_id
        case cmd.ItemRetrieve() | cmd.ItemDelete():
            out["item_id"] = command.item_id
        case cmd.ItemTruncate():
            out.update(item_id=command.item_id, content_index=command.content_index,
                       audio_end_ms=command.audio_end_ms)
        case cmd.ResponseCreate():
            if command.overrides is not None:
                out["response"] = _overrides(command.overrides)
        case cmd.ResponseCancel():
            if command.response_id is not None:
                out["response_id"] = command.response_id
        case cmd.InputAudioCommit() | cmd.InputAudioClear() | cmd.OutputAudioClear():
            pass
    return out


# ---------------------------------------------------------------------------------------
# GA server events -> neutral events
# ---------------------------------------------------------------------------------------

_EVENT_CLASSES: dict[str, type[ev.ServerEvent]] = {
    name: cls for cls in ev.SERVER_EVENT_CLASSES
    if (name := wire_type(cls, Dialect.GA)) is not None
}
_ITEM = TypeAdapter(ConversationItem)
# response.content_part.* name assistant parts "text"/"audio" in both dialects
_PART_TYPES = {"text": "output_text", "audio": "output_audio"}


def _part(d: Mapping[str, Any]) -> ContentPart:
    kind = _PART_TYPES.get(d["type"], d["type"])
    return ContentPart.model_validate({**d, "type": kind})


def _response(d: Mapping[str, Any]) -> RealtimeResponse:
    audio_out = (d.get("audio") or {}).get("output") or {}
    details = d.get("status_details")
    tokens = d.get("max_output_tokens", "inf")
    return RealtimeResponse(
        id=d["id"],
        status=d["status"],
        status_details=None if details is None else ResponseStatusDetails.model_validate(details),
        output=[_ITEM.validate_python(i) for i in d.get("output") or []],
        conversation_id=d.get("conversation_id"),
        output_modalities=normalize_modalities(d.get("output_modalities") or ["audio"]),
        max_output_tokens=None if tokens == "inf" else tokens,
        voice=audio_out.get("voice", ""),
        output_format=AudioFormat.from_document(audio_out.get("format") or {}),
        temperature=DEFAULT_TEMPERATURE,  # GA responses do not carry it
        metadata=d.get("metadata"),
        usage=None if d.get("usage") is None else ResponseUsage.model_validate(d["usage"]),
    )


def _session(d: Mapping[str, Any]) -> dict[str, Any]:
    return {"session_id": d["session"]["id"],
            "session": SessionSettings.from_document(d["session"])}


_FIELD_PARSERS: dict[str, Callable[[Any], Any]] = {
    "item": _ITEM.validate_python,
    "part": _part,
    "response": _response,
    "error": ErrorDetail.model_validate,
    "rate_limits": lambda v: [RateLimit.model_validate(r) for r in v],
}
_SPECIAL: dict[type[ev.ServerEvent], Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    ev.SessionCreated: _session,
    ev.SessionUpdated: _session,
    ev.ConversationCreated: lambda d: {"conversation_id": d["conversation"]["id"]},
    ev.InputTranscriptionCompleted: lambda d: {
        "item_id": d["item_id"], "content_index": d.get("content_index", 0),
        "transcript": d["transcript"],
        "audio_seconds": float((d.get("usage") or {}).get("seconds", 0.0))},
    ev.AudioDelta: lambda d: {
        **{k: d[k] for k in ("response_id", "item_id", "output_index", "content_index")},
        "delta": base64.b64decode(d["delta"])},
}


def parse_server_event(raw: str | bytes | Mapping[str, Any]) -> ev.ServerEvent | None:
    """The neutral event a GA server event was rendered from; None for a type voxline's
    sessions do not emit. Raises ProtocolError on JSON that does not fit its type."""
    data: Any = None
    try:
        data = json.loads(raw) if isinstance(raw, str | bytes) else raw
        cls = _EVENT_CLASSES.get(data.get("type", ""))
        if cls is None:
            return None
        special = _SPECIAL.get(cls)
        if special is not None:
            fields = special(data)
        else:
            fields = {name: _FIELD_PARSERS.get(name, lambda v: v)(data[name])
                      for name in cls.model_fields if name != "event_id" and name in data}
        return cls(event_id=data["event_id"], **fields)
    except (ValueError, KeyError, TypeError, AttributeError, ValidationError) as exc:
        kind = data.get("type") if isinstance(data, Mapping) else None
        raise ProtocolError(f"server event {kind or '?'} does not fit the GA shape: {exc}",
                            code="invalid_server_event") from exc
