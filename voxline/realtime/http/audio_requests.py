"""What both OpenAI audio endpoints share: the error body, the request checks (API key,
engine ready) and one short-lived engine stream per request.

Both run on the shared engine through one short-lived stream per HTTP request (a unique
id, always closed, also when the client goes away). Errors use OpenAI's body shape
``{"error": {"message", "type", "param", "code"}}``: 400 for bad input, 401 for a wrong
API key (when `Settings.api_key` is set), 413 for an oversized upload, 503 while the
engine is not ready or is at capacity, 500 when the engine fails a request.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse

from voxline.engines import protocol as p
from voxline.engines.client import ENGINE_CLOSED, ENGINE_DEAD, StreamHandle
from voxline.errors import EngineDeadError
from voxline.realtime.auth.access import authorized
from voxline.realtime.state import ServerState, get_state

logger = logging.getLogger(__name__)


RETRY_AFTER_S = 1


class AudioAPIError(Exception):
    """An HTTP error with OpenAI's error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        # 503 is temporary (engine starting or restarting, at capacity): say when to retry
        headers = {"Retry-After": str(RETRY_AFTER_S)} if self.status == 503 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def bad(message: str, param: str | None, code: str = "invalid_value") -> AudioAPIError:
    return AudioAPIError(400, message, param=param, code=code)


def unavailable(message: str, code: str = "engine_unavailable") -> AudioAPIError:
    return AudioAPIError(503, message, code=code, type="server_error")


def stream_error(err: p.StreamError) -> AudioAPIError:
    """Map an engine stream error onto an HTTP error."""
    if err.code in (ENGINE_DEAD, ENGINE_CLOSED):
        return unavailable(f"the engine stopped while serving the request: {err.message}")
    if err.code == "capacity":
        return unavailable(err.message, code="engine_at_capacity")
    if err.code == "server_busy":
        return unavailable(err.message, code="server_busy")
    return AudioAPIError(500, err.message, code=err.code, type="server_error")


def check_request(request: Request) -> ServerState:
    """The server state, once the API key (if configured) and engine readiness check out."""
    state = get_state(request)
    if not authorized(request, state.settings.api_key):
        raise AudioAPIError(401, "missing or incorrect API key: send 'Authorization: Bearer "
                            "<key>'", code="invalid_api_key")
    if not state.engine.ready:
        reason = state.engine.status().get("last_error") or "the engine is starting"
        raise unavailable(f"the engine is not ready ({reason}); retry shortly")
    return state


async def close_quietly(handle: StreamHandle | None) -> None:
    """Close an engine stream even while the calling task is being cancelled."""
    if handle is None:
        return
    with anyio.CancelScope(shield=True):
        try:
            await handle.aclose()
        except Exception:  # closing must never mask the request's own outcome
            logger.exception("closing engine stream %r failed", handle.stream_id)


async def open_stream(state: ServerState, prefix: str) -> StreamHandle:
    stream_id = f"{prefix}-{uuid.uuid4().hex}"
    config = p.StreamConfig(turn_detection=None, transcribe_partials=False)
    try:
        return await state.engine.open_stream(stream_id, config)
    except EngineDeadError as exc:
        raise unavailable(f"the engine is not ready ({exc}); retry shortly") from exc
