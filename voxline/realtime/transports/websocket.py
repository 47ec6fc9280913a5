"""`WS /v1/realtime`: the OpenAI Realtime WebSocket transport. Holds no conversation logic:
it authenticates, parses frames into client events, renders server events in the
client's dialect, and closes with a code and reason when the session ends."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from voxline.errors import ProtocolError
from voxline.realtime.auth.access import Access, authenticate, offered_subprotocols
from voxline.realtime.http.video_recorder import SessionVideoRecorder
from voxline.realtime.http.videos import video_store
from voxline.realtime.http.voices import session_voice_check
from voxline.realtime.openai.client_events import parse_command
from voxline.realtime.openai.dialect import detect_dialect
from voxline.realtime.openai.error_body import error_response
from voxline.realtime.openai.server_events import render_json
from voxline.realtime.openai.session_object import session_for_intent
from voxline.realtime.session_host import (
    CLOSE_POLICY,
    SHUTDOWN_REASON,
    Admission,
    SessionEnd,
)
from voxline.realtime.state import get_state
from voxline.realtime.transports.outbox import Outbox, admit_or_close, close_after
from voxline.realtime.transports.sip_routes import watch_call
from voxline.sessions.commands import ClientCommand
from voxline.sessions.events import ServerEvent
from voxline.sessions.settings import SessionSettings

logger = logging.getLogger(__name__)
router = APIRouter()


async def _client_events(ws: WebSocket, max_bytes: int, left: Callable[[], None]
                         ) -> AsyncIterator[ClientCommand | ProtocolError]:
    """The client's events until it disconnects; then `left()` (before the session's
    clean-up, which waits for the engine to close the stream)."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            left()
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
    host = state.host
    offered = offered_subprotocols(ws)
    access = authenticate(ws, state.settings.api_key, state.client_secrets)
    if not isinstance(access, Access):
        host.count_refusal()
        await ws.close(code=CLOSE_POLICY, reason=access)
        return
    try:  # ?intent=transcription: a transcription session (the client secret's, if any)
        initial = session_for_intent(ws.query_params.get("intent"),
                                     access.settings or SessionSettings())
    except ProtocolError as exc:
        host.count_refusal()
        await ws.send_denial_response(error_response(400, str(exc), code=exc.code,
                                                     param=exc.param))
        return
    if host.draining:  # HTTP 503, not a close after 101: a balancer retries elsewhere
        host.count_refusal()
        await ws.send_denial_response(error_response(503, SHUTDOWN_REASON,
                                                     code="server_shutting_down"))
        return
    call_id = ws.query_params.get("call_id")
    if call_id is not None:  # an app watching and steering a SIP call
        await watch_call(ws, call_id)
        return
    await ws.accept(subprotocol="realtime" if "realtime" in offered else None)
    admission = await admit_or_close(ws, host)
    if admission is None:
        return
    with admission:  # the slot is released however the session ends
        await _serve(ws, admission, initial)


async def _serve(ws: WebSocket, admission: Admission, initial: SessionSettings) -> None:
    state = get_state(ws)
    settings = state.settings
    dialect = detect_dialect(list(ws.headers.items()))
    # the session echoes the model the client asked for (`?model=`), as OpenAI does
    requested = ws.query_params.get("model")
    if requested:
        initial = replace(initial, model=requested)
    outbox = Outbox(ws.send_text, settings.send_buffer_kb * 1024)

    recorder = SessionVideoRecorder(video_store(ws.app.state))  # videos: MP4s in /v1/videos

    async def send(event: ServerEvent) -> None:
        await recorder.on_event(event)
        wire = render_json(event, dialect)
        if wire is not None:
            outbox.put(wire)  # never waits on the client; raises SlowClient past the bound

    async def close(end: SessionEnd) -> None:
        await close_after(ws, outbox, end, state.metrics)

    runner = admission.runner(send, settings=initial,
                              voice_error=session_voice_check(ws.app.state))
    logger.info("session %s opened (%s dialect)", admission.session_id, dialect.value)
    outbox.start()
    # the slot is freed once the client has gone, not once the engine confirmed the
    # stream's close: a client that reconnects at once is not refused at capacity (the
    # engine keeps streams beyond max_sessions for that overlap)
    incoming = _client_events(ws, settings.max_event_bytes, admission.release)
    await state.host.serve(admission, runner, incoming, close=close, cleanup=recorder.aclose,
                           peer_gone=lambda exc: isinstance(exc, WebSocketDisconnect))
