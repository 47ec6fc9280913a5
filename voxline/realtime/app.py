"""The HTTP application, the composition root: the routers, the shared state and the
engine's lifecycle (the engine loads in the background while the server answers)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from voxline.aio import cancel_and_wait
from voxline.config import Settings
from voxline.engines.client import EngineClient
from voxline.logs import GC_PAUSES, LoopLag
from voxline.realtime.auth import client_secrets
from voxline.realtime.http import demo_page, speech, transcription, videos, voices
from voxline.realtime.ops import routes as ops
from voxline.realtime.state import ServerState
from voxline.realtime.transports import sip, sip_routes, twilio, webrtc, websocket
from voxline.version import __version__

logger = logging.getLogger(__name__)


async def _start_engine(engine: EngineClient, kind: str) -> None:
    t0 = time.perf_counter()
    logger.info("starting engine (%s) ...", kind)
    try:
        await engine.start()
    except Exception:
        logger.exception("engine failed to start; /health stays 503")
        return
    logger.info("engine ready in %.1f s", time.perf_counter() - t0)


LOOP_REPORT_S = 10.0  # as often as the engine's stage load lines


async def report_loop_lag(state: ServerState, every_s: float = LOOP_REPORT_S) -> None:
    """Log how late this process's event loop woke, every `every_s` while sessions are
    open: every session's audio out passes through this loop, so a stall here is a gap a
    listener hears even when the engine was ahead. Also the `voxline_loop_lag_max_ms` gauge."""
    lag = LoopLag()
    lag.start()
    try:
        while True:
            await asyncio.sleep(every_s)
            took = lag.take()
            if took is None:
                continue
            state.metrics.set("voxline_loop_lag_max_ms", "API event loop: the latest wake in "
                              "the last report period, ms", took["max_ms"])
            gc_note = GC_PAUSES.take()
            if state.sessions:
                logger.info("api loop lag over %.0f s (%d sessions): p50 %.1f ms, p99 %.1f ms, "
                            "max %.1f ms%s", every_s, state.sessions, took["p50_ms"],
                            took["p99_ms"], took["max_ms"], f"; {gc_note}" if gc_note else "")
    finally:
        lag.cancel()  # this task is being cancelled: nothing more to await here


def create_app(settings: Settings, engine: EngineClient, *, manage_engine: bool = True,
               watch_loop: bool = False) -> FastAPI:
    """Build the app. With `manage_engine`, the app starts and closes the engine itself;
    with `watch_loop` (`voxline serve`), it logs its event loop's lag (`report_loop_lag`)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The engine loads in the background: the server answers at once (/health says
        # 503 "engine is starting") and Ctrl-C during a long model load exits promptly.
        starting: asyncio.Task[None] | None = None
        if manage_engine:
            starting = asyncio.create_task(_start_engine(engine, settings.engine))
        keep_voices = asyncio.create_task(voices.keep_engine_voices(app.state))
        background = [keep_voices]
        if watch_loop:
            background.append(asyncio.create_task(report_loop_lag(app.state.voxline)))
        sip_server = None
        if settings.sip_port is not None:
            sip_server = sip.SipServer(app.state)
            await sip_server.start()
        app.state.sip = sip_server
        try:
            yield
        finally:
            if sip_server is not None:
                await sip_server.close()
            await cancel_and_wait(*background)
            await webrtc.close_all_calls(app.state.voxline)
            await videos.close_videos(app.state)  # their files' folder goes too
            if starting is not None:
                logger.info("stopping engine ...")
                await cancel_and_wait(starting)
                await engine.close()

    app = FastAPI(title="voxline", version=__version__, lifespan=lifespan)
    app.state.voxline = ServerState(settings, engine)

    app.include_router(speech.router)
    app.include_router(videos.router)
    app.include_router(voices.router)
    app.include_router(transcription.router)
    app.include_router(ops.router)
    app.include_router(websocket.router)
    app.include_router(twilio.router)
    app.include_router(webrtc.router)
    app.include_router(sip_routes.router)
    app.include_router(client_secrets.router)
    app.include_router(demo_page.router)
    return app
