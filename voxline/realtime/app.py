"""The HTTP application: routes, engine lifecycle and shared server state."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from voxline import __version__
from voxline.config import Settings
from voxline.engines.client import EngineClient
from voxline.realtime.metrics import Metrics

logger = logging.getLogger(__name__)

MODEL_ID = "voxline"


@dataclass
class ServerState:
    settings: Settings
    engine: EngineClient
    metrics: Metrics = field(default_factory=Metrics)
    sessions: int = 0
    started: float = field(default_factory=time.time)


def get_state(request_or_ws: object) -> ServerState:
    return request_or_ws.app.state.voxline  # type: ignore[attr-defined]


async def _start_engine(engine: EngineClient, kind: str) -> None:
    t0 = time.perf_counter()
    logger.info("starting engine (%s) ...", kind)
    try:
        await engine.start()
    except Exception:
        logger.exception("engine failed to start; /health stays 503")
        return
    logger.info("engine ready in %.1f s", time.perf_counter() - t0)


def create_app(settings: Settings, engine: EngineClient, *, manage_engine: bool = True) -> FastAPI:
    """Build the app. With `manage_engine`, the app starts and closes the engine itself."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The engine loads in the background: the server answers at once (/health says
        # 503 "engine is starting") and Ctrl-C during a long model load exits promptly.
        starting: asyncio.Task[None] | None = None
        if manage_engine:
            starting = asyncio.create_task(_start_engine(engine, settings.engine))
        try:
            yield
        finally:
            if starting is not None:
                logger.info("stopping engine ...")
                starting.cancel()
                await asyncio.gather(starting, return_exceptions=True)
                await engine.close()

    app = FastAPI(title="voxline", version=__version__, lifespan=lifespan)
    app.state.voxline = ServerState(settings, engine)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        state = get_state(request)
        status = state.engine.status()
        body = {"status": "ok" if state.engine.ready else "unavailable", "engine": status,
                "sessions": state.sessions}
        if not state.engine.ready:
            body["reason"] = status.get("last_error") or "engine is starting"
        return JSONResponse(body, status_code=200 if state.engine.ready else 503)

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        return {"object": "list", "data": [
            {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "voxline"},
        ]}

    from voxline.realtime import audio_api, metrics, web, websocket

    app.include_router(audio_api.router)
    app.include_router(metrics.router)
    app.include_router(websocket.router)
    app.include_router(web.router)
    return app
