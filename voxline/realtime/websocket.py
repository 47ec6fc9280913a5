"""`WS /v1/realtime`: the OpenAI Realtime WebSocket transport. Holds no conversation logic:
it authenticates, parses frames into client events, renders server events in the
client's dialect, and closes with a code and reason when the session ends."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from voxline.errors import ProtocolError
from voxline.realtime.auth import Access, authenticate, offered_subprotocols
from voxline.realtime.dialect import detect_dialect
from voxline.realtime.state import get_state
from voxline.realtime.wire_client import parse_command
from voxline.realtime.wire_server import render_json
from voxline.sessions.actor import SessionActor
from voxline.sessions.commands import ClientCommand
from voxline.sessions.events import ServerEvent
from voxline.sessions.ids import new_id
from voxline.sessions.runner import SessionEnded, SessionRunner
from voxline.sessions.settings import SessionSettings

logger = logging.getLogger(__name__)
router = APIRouter()

CLOSE_POLICY = 1008  # bad credentials / abuse
CLOSE_TRY_AGAIN = 1013  # capacity


async def _client_events(ws: WebSocket, max_bytes: int) -> AsyncIterator[ClientCommand | ProtocolError]:
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
        text = message.get("text")
        if text is None:
            yield ProtocolError("binary frames are not supported; send JSON events as text "
                                "frames", code="invalid_request_error")
            continue
        if len(text) > max_bytes:
            yield ProtocolError(f"event is {len(text)} bytes, more than the {max_bytes} allowed",
                                code="invalid_request_error")
            continue
        try:
            yield parse_command(text)
        except ProtocolError as exc:
            yield exc


@router.websocket("/v1/realtime")
async def realtime(ws: WebSocket) -> None:
    state = get_state(ws)
    settings = state.settings
    offered = offered_subprotocols(ws)
    access = authenticate(ws, settings.api_key, state.client_secrets)
    if not isinstance(access, Access):
        state.metrics.inc("voxline_sessions_refused_total", "sessions refused")
        await ws.close(code=CLOSE_POLICY, reason=access)
        return
    await ws.accept(subprotocol="realtime" if "realtime" in offered else None)
    if state.sessions >= settings.max_sessions:
        state.metrics.inc("voxline_sessions_refused_total", "sessions refused")
        await ws.close(code=CLOSE_TRY_AGAIN,
                       reason=f"server is at its limit of {settings.max_sessions} sessions")
        return
    if not state.engine.ready:
        await ws.close(code=CLOSE_TRY_AGAIN, reason="engine is not ready, try again shortly")
        return
    dialect = detect_dialect(list(ws.headers.items()))
    session_id = new_id("sess")
    # the session echoes the model the client asked for (`?model=`), as OpenAI does
    requested = ws.query_params.get("model")
    initial = access.settings or SessionSettings()  # a client secret's session, if any
    if requested:
        initial = replace(initial, model=requested)
    actor = SessionActor(session_id, f"{session_id}-{uuid.uuid4().hex[:6]}", settings=initial,
                         lead_ms=settings.output_lead_ms, max_event_bytes=settings.max_event_bytes)

    async def send(event: ServerEvent) -> None:
        wire = render_json(event, dialect)
        if wire is not None:
            await ws.send_text(wire)

    runner = SessionRunner(actor, state.engine, send, max_seconds=settings.max_session_seconds,
                           observe=state.metrics.observe)
    state.sessions += 1
    state.metrics.inc("voxline_sessions_total", "realtime sessions opened")
    logger.info("session %s opened (%s dialect)", session_id, dialect.value)
    code, reason = 1000, ""
    try:
        await runner.run(_client_events(ws, settings.max_event_bytes))
    except SessionEnded as end:
        code, reason = end.code, end.reason
    except WebSocketDisconnect:
        pass
    except Exception:
        logger.exception("session %s failed", session_id)
        state.metrics.inc("voxline_session_errors_total", "sessions ended by a server error")
        code, reason = 1011, "internal server error"
    finally:
        state.sessions -= 1
        logger.info("session %s closed", session_id)
    try:
        await ws.close(code=code, reason=reason)
    except (RuntimeError, WebSocketDisconnect):
        pass  # the client already went away
