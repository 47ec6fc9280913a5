"""OpenAI's SIP call control over HTTP, and watching a call over the WebSocket.

- ``POST /v1/realtime/calls/{call_id}/accept``: a GA session object (as for
  ``/v1/realtime/calls``); the ringing call is answered with it (in the call's G.711 law).
- ``POST /v1/realtime/calls/{call_id}/reject``: ``{"status_code": 486}`` (default 603).
- ``POST /v1/realtime/calls/{call_id}/refer``: ``{"target_uri": "sip:..." | "tel:..."}``;
  the caller is sent a REFER.
- ``POST /v1/realtime/calls/{call_id}/hangup`` is the WebRTC transport's route; a SIP
  call answers it through the same interface.
- ``WS /v1/realtime?call_id=...``: the call's session events (GA or beta, as the client's
  dialect), and the client's events steer the session (``response.create``,
  ``session.update``, ...). Closing the WebSocket leaves the call up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from fastapi import APIRouter, Request, Response, WebSocket

from voxline.aio import cancel_and_wait
from voxline.errors import ProtocolError
from voxline.realtime.auth.access import (
    Access,
    authenticate,
    offered_subprotocols,
    settings_from_session,
)
from voxline.realtime.openai.client_events import parse_command
from voxline.realtime.openai.dialect import detect_dialect
from voxline.realtime.openai.error_body import error_response
from voxline.realtime.openai.server_events import render_json
from voxline.realtime.state import ServerState, get_state
from voxline.realtime.transports.outbox import Outbox
from voxline.realtime.transports.sip_call import DEFAULT_REJECT, Accept, Reject, SipCall
from voxline.sessions import events as ev
from voxline.sessions.settings import SessionSettings

logger = logging.getLogger(__name__)
router = APIRouter()

REFER_SCHEMES = ("sip:", "sips:", "tel:")


def _sip_call(state: ServerState, call_id: str) -> SipCall | None:
    call = state.calls.get(call_id)
    return call if isinstance(call, SipCall) else None


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"the body is not JSON: {exc}", code="invalid_json") from None
    if not isinstance(doc, dict):
        raise ProtocolError("the body must be a JSON object", code="invalid_value")
    return doc


async def _control(request: Request, call_id: str) -> SipCall | Response:
    state = get_state(request)
    access = authenticate(request, state.settings.api_key, state.client_secrets)
    if not isinstance(access, Access):
        return error_response(401, access, code="invalid_api_key")
    call = _sip_call(state, call_id)
    if call is None:
        return error_response(404, f"no SIP call with id {call_id!r} (it may have ended)",
                              code="call_not_found", param="call_id")
    return call


def _not_ringing(call: SipCall) -> Response:
    return error_response(409, f"call {call.id} was already accepted, rejected or hung up",
                          code="call_not_ringing", param="call_id")


@router.post("/v1/realtime/calls/{call_id}/accept")
async def accept_call(call_id: str, request: Request) -> Response:
    call = await _control(request, call_id)
    if isinstance(call, Response):
        return call
    state = get_state(request)
    try:
        doc = await _body(request)
        settings = settings_from_session(doc, SessionSettings(),
                                         tools_supported=state.settings.remote_llm,
                                         transcription=state.host.limits.transcription)
    except ProtocolError as exc:
        return error_response(400, str(exc), code=exc.code, param=exc.param)
    if not call.decide(Accept(settings)):
        return _not_ringing(call)
    logger.info("%s: accepted by the app", call.ids)
    return Response(status_code=200)


@router.post("/v1/realtime/calls/{call_id}/reject")
async def reject_call(call_id: str, request: Request) -> Response:
    call = await _control(request, call_id)
    if isinstance(call, Response):
        return call
    try:
        status = (await _body(request)).get("status_code", DEFAULT_REJECT)
    except ProtocolError as exc:
        return error_response(400, str(exc), code=exc.code, param=exc.param)
    if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 699:
        return error_response(400, f"status_code must be a SIP status from 400 to 699, got "
                              f"{status!r}", code="invalid_value", param="status_code")
    if not call.decide(Reject(status)):
        return _not_ringing(call)
    return Response(status_code=200)


@router.post("/v1/realtime/calls/{call_id}/refer")
async def refer_call(call_id: str, request: Request) -> Response:
    call = await _control(request, call_id)
    if isinstance(call, Response):
        return call
    try:
        target = (await _body(request)).get("target_uri")
    except ProtocolError as exc:
        return error_response(400, str(exc), code=exc.code, param=exc.param)
    if not isinstance(target, str) or not target.lower().startswith(REFER_SCHEMES) \
            or any(c in target for c in "\r\n<>"):
        return error_response(400, "target_uri must be a sip:, sips: or tel: URI",
                              code="invalid_value", param="target_uri")
    if call.ringing or call.ended:
        return error_response(409, f"call {call.id} is not answered", code="call_not_active",
                              param="call_id")
    if call.transfer is not None:
        return error_response(409, f"call {call.id} is already being transferred to "
                              f"{call.transfer}; wait for its outcome",
                              code="call_transfer_in_progress", param="call_id")
    call.refer(target)
    return Response(status_code=200)


# ------------------------------------------------------------------ watching a call


async def watch_call(ws: WebSocket, call_id: str) -> None:
    """``/v1/realtime?call_id=``: the call's events out, the client's events in, until
    either side ends. Authentication was checked by the caller."""
    state = get_state(ws)
    call = _sip_call(state, call_id)
    if call is None:
        await ws.send_denial_response(error_response(
            404, f"no SIP call with id {call_id!r} (it may have ended)",
            code="call_not_found", param="call_id"))
        return
    await ws.accept(subprotocol="realtime" if "realtime" in offered_subprotocols(ws) else None)
    dialect = detect_dialect(list(ws.headers.items()))
    outbox = Outbox(ws.send_text, state.settings.send_buffer_kb * 1024)

    def observe(event: ev.ServerEvent) -> None:
        wire = render_json(event, dialect)
        if wire is not None:
            outbox.put(wire)  # raises SlowClient past the bound: the watcher is dropped

    call.observers.append(observe)
    outbox.start()
    logger.info("%s: a WebSocket is watching", call.ids)
    reader = asyncio.create_task(_steer(ws, call, observe, state.settings.max_event_bytes))
    ended = asyncio.create_task(call.done.wait())
    try:
        await asyncio.wait({reader, ended}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(reader, ended)
        with contextlib.suppress(ValueError):
            call.observers.remove(observe)
        await outbox.flush(2.0)
        await outbox.stop()
        with contextlib.suppress(RuntimeError):
            await ws.close(code=1000, reason=(call.end_reason or "the call ended")
                           if call.done.is_set() else "")


async def _steer(ws: WebSocket, call: SipCall, observe: Any, max_bytes: int) -> None:
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
        text = message.get("text")
        try:
            if text is None or len(text) > max_bytes:
                raise ProtocolError("send JSON events as text frames, each at most "
                                    f"{max_bytes} bytes", code="invalid_request_error")
            command = parse_command(text)
        except ProtocolError as exc:
            observe(ev.ErrorEvent.from_exception(exc))
            continue
        if not call.steer(command):
            observe(ev.ErrorEvent.from_exception(ProtocolError(
                "the call's session is not taking events (it ended or is far behind)",
                code="invalid_request_error")))

