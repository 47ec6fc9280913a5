"""`voxline serve`: uvicorn + uvloop around the app, with a supervised engine process."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket
from types import FrameType

import uvicorn

from voxline.config import settings_from_flags
from voxline.engines.launch import make_engine, sized_for_device
from voxline.logs import freeze_startup_objects
from voxline.realtime.app import create_app
from voxline.realtime.session_host import SessionHost

logger = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """uvicorn, but SIGTERM/SIGINT drain: refuse new sessions, let replies in flight
    finish (up to `grace` s), close sessions with 1001 and a reason, then shut down and
    exit 0.

    While it drains the server still listens, so that ``/health`` can answer 503
    ``draining`` (a load balancer's health check takes the server out of rotation) and a
    new session's handshake gets HTTP 503 (a balancer retries it on another server)
    rather than a refused connection. Plain uvicorn closes WebSockets at once (1012) and
    re-raises the signal at exit.
    """

    def __init__(self, config: uvicorn.Config, host: SessionHost, grace: float) -> None:
        super().__init__(config)
        self._host = host
        self._grace = grace
        self._drain: asyncio.Future[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self._captured_signals.clear()  # a drained shutdown is a clean exit, not a death
        with contextlib.suppress(RuntimeError):  # no loop yet: shutdown drains
            # drain from now, not from uvicorn's next tick (up to 0.1 s later): a session
            # that arrives meanwhile would be admitted only to be closed
            asyncio.get_running_loop().call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        if self._drain is None:
            self._drain = asyncio.ensure_future(self._host.drain(self._grace))

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if not self.force_exit:
            self._start_drain()
            assert self._drain is not None
            await self._drain  # still listening meanwhile: /health says why
        for server in self.servers:
            server.close()
        await super().shutdown(sockets)


def serve(args: argparse.Namespace) -> int:
    """Run the server with the Settings `args` (``voxline serve``'s flags) give."""
    settings = sized_for_device(settings_from_flags(args))  # capacity from the GPU, if any
    app = create_app(settings, make_engine(settings), watch_loop=True)
    logger.info("voxline listening on http://%s:%d (realtime: ws://%s:%d/v1/realtime)",
                settings.host, settings.port, settings.host, settings.port)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, loop="uvloop",
                            ws="websockets-sansio", log_level="info",
                            ws_max_size=settings.max_event_bytes + 1024,
                            ws_per_message_deflate=settings.ws_compression,
                            timeout_graceful_shutdown=5)
    server = DrainingServer(config, app.state.voxline.host, settings.shutdown_grace)
    freeze_startup_objects(logger)  # imports and app: out of every later full collection
    server.run()
    return 0 if server.started else 1
