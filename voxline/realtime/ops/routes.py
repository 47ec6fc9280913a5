"""Operational routes: `/health`, `/metrics` (Prometheus text) and `/v1/models`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from voxline.realtime.ops.metrics import CONTENT_TYPE
from voxline.realtime.session_host import SHUTDOWN_REASON
from voxline.realtime.state import get_state
from voxline.sessions.settings import DEFAULT_MODEL

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    state = get_state(request)
    status = state.engine.status()
    body = {"status": "ok" if state.engine.ready else "unavailable", "engine": status,
            "sessions": state.sessions, "server_id": state.server_id}
    if not state.engine.ready:
        body["reason"] = status.get("last_error") or "engine is starting"
    if state.host.draining:  # SIGTERM: take this server out of rotation
        body["status"], body["reason"] = "draining", SHUTDOWN_REASON
    return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = get_state(request)
    m = state.metrics
    m.set("voxline_sessions_active", "open realtime sessions", state.sessions)
    m.set("voxline_engine_ready", "1 when the engine is ready", 1.0 if state.engine.ready else 0.0)
    m.set("voxline_engine_restarts", "engine process restarts",
          float(state.engine.status().get("restarts", 0)))
    return Response(m.render(), media_type=CONTENT_TYPE)


@router.get("/v1/models")
async def models() -> dict[str, object]:
    return {"object": "list", "data": [
        {"id": DEFAULT_MODEL, "object": "model", "created": 0, "owned_by": "voxline"},
    ]}
