"""`POST /v1/realtime/client_secrets`: short-lived tokens a browser can use instead of the
server's API key, as OpenAI issues them (`ek_...`, an expiry, an optional session that
the call or WebSocket opened with the token starts with). Tokens are signed, not stored
(`auth.access.ClientSecrets`): any server with the same ``client_secret_keys`` accepts them."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from voxline.errors import ProtocolError
from voxline.realtime.auth.access import authorized, settings_from_session
from voxline.realtime.openai.dialect import Dialect
from voxline.realtime.openai.error_body import error_response
from voxline.realtime.openai.server_events import render
from voxline.realtime.state import get_state
from voxline.sessions import events as ev
from voxline.sessions.settings import SessionSettings

router = APIRouter()

DEFAULT_SECONDS = 600  # OpenAI's defaults and limits for expires_after.seconds
MIN_SECONDS, MAX_SECONDS = 10, 7200


def render_session(settings: SessionSettings) -> dict[str, Any]:
    rendered = render(ev.SessionCreated(session_id="", session=settings), Dialect.GA)
    assert rendered is not None
    session = rendered["session"]
    session.pop("id", None)
    return session


@router.post("/v1/realtime/client_secrets")
async def create_client_secret(request: Request) -> JSONResponse:
    state = get_state(request)
    # a client secret cannot mint another: only the server's key may
    if not authorized(request, state.settings.api_key):
        return error_response(401, "invalid or missing API key", code="invalid_api_key")
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        return error_response(400, f"body is not JSON: {exc}", code="invalid_json")
    if not isinstance(body, dict):
        return error_response(400, "body must be a JSON object", code="invalid_value")
    expires = body.get("expires_after") or {}
    if not isinstance(expires, dict):
        return error_response(400, "expires_after must be an object", code="invalid_value",
                              param="expires_after")
    seconds = expires.get("seconds", DEFAULT_SECONDS)
    if expires.get("anchor", "created_at") != "created_at":
        return error_response(400, "expires_after.anchor must be 'created_at'",
                              code="invalid_value", param="expires_after.anchor")
    if not isinstance(seconds, int) or isinstance(seconds, bool) or not (
            MIN_SECONDS <= seconds <= MAX_SECONDS):
        return error_response(400, f"expires_after.seconds must be an integer from {MIN_SECONDS} "
                              f"to {MAX_SECONDS}, got {seconds!r}", code="invalid_value",
                              param="expires_after.seconds")
    settings = None
    if body.get("session") is not None:
        try:
            settings = settings_from_session(body["session"],
                                             tools_supported=state.settings.remote_llm,
                                             transcription=state.host.limits.transcription)
        except ProtocolError as exc:
            return error_response(400, str(exc), code=exc.code,
                                  param=f"session.{exc.param}" if exc.param else "session")
    secret = state.client_secrets.issue(seconds, settings, body.get("session"))
    return JSONResponse({"value": secret.value, "expires_at": secret.expires_at,
                         "session": render_session(settings or SessionSettings())})
