"""Strict validation of server events against the official `openai` package's pydantic types.

`openai.types.realtime` (GA) and `openai.types.beta.realtime` (beta) are what the SDK parses
our events into. Their models accept unknown fields and coerce types, so this checks more
than the SDK does: strict types (no coercion) and no field the type does not declare.
"""

from __future__ import annotations

import typing
from typing import Any, Literal

from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent
from openai.types.beta.realtime import TranscriptionSessionUpdatedEvent
from openai.types.realtime import RealtimeServerEvent as GAServerEvent
from pydantic import BaseModel, TypeAdapter, ValidationError


def _by_type(union: Any) -> dict[str, type[BaseModel]]:
    """The union's member models keyed by their `type` literal (errors then name one model)."""
    out: dict[str, type[BaseModel]] = {}
    stack = [union]
    while stack:
        t = stack.pop()
        if isinstance(t, type) and issubclass(t, BaseModel):
            ann = t.model_fields["type"].annotation
            if typing.get_origin(ann) is Literal:
                out.update({name: t for name in typing.get_args(ann)})
        else:
            stack.extend(typing.get_args(t))
    return out


_MODELS = {"ga": _by_type(GAServerEvent), "beta": _by_type(BetaServerEvent)}
# Fields OpenAI's own GA server sends (its API reference examples show them) that the GA
# SDK's session type does not declare; nothing else may be undeclared.
_GA_SERVER_FIELDS = {".session.id", ".session.object"}
# Beta transcription sessions: OpenAI's server opens one with `transcription_session.created`
# (the SDK's beta union lacks it; its shape is `.updated`'s), its session object carries
# `id`, `object`, `include` and the noise reduction beside the SDK type's fields, and the
# type's required `client_secret` is "not present when a session is updated via the
# WebSocket API" (the SDK's own docstring).
_BETA_TRANSCRIPTION = {"transcription_session.created", "transcription_session.updated"}
_BETA_TRANSCRIPTION_FIELDS = {".session.id", ".session.object", ".session.include",
                              ".session.input_audio_noise_reduction"}


def _extras(value: Any, path: str) -> list[str]:
    if isinstance(value, BaseModel):
        out = [f"{path}.{k}" for k in (value.model_extra or {})]
        for name in type(value).model_fields:
            out += _extras(getattr(value, name), f"{path}.{name}")
        return out
    if isinstance(value, list | tuple):
        return [e for i, v in enumerate(value) for e in _extras(v, f"{path}[{i}]")]
    if isinstance(value, dict):
        return [e for k, v in value.items() for e in _extras(v, f"{path}.{k}")]
    return []


def strict_problems(event: dict[str, Any], dialect: str) -> list[str]:
    """What is wrong with `event` for a `dialect` ("ga" or "beta") client; [] if nothing."""
    name = event.get("type")
    transcription = dialect == "beta" and name in _BETA_TRANSCRIPTION
    cls = TranscriptionSessionUpdatedEvent if transcription else _MODELS[dialect].get(name)
    if cls is None:
        return [f"{name}: not a {dialect} server event type"]
    if transcription:
        event = {**event, "type": "transcription_session.updated",
                 "session": {"client_secret": {"expires_at": 0, "value": ""},
                             **event.get("session", {})}}
        if "client_secret" in event["session"] and event["session"]["client_secret"]["value"]:
            return [f"{name}: a client secret on the WebSocket"]
    try:
        model = TypeAdapter(cls).validate_python(event, strict=True)
    except ValidationError as exc:
        return [f"{name}: {err['loc']}: {err['msg']}" for err in exc.errors()]
    allowed = (_GA_SERVER_FIELDS if dialect == "ga"
               else _BETA_TRANSCRIPTION_FIELDS if transcription else set())
    return [f"{name}: unknown field {p}" for p in _extras(model, "")
            if p not in allowed]
