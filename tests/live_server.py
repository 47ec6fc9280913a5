"""A real voxline server (uvicorn + the shipped models) on a free loopback port, in a thread."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn

from voxline.config import load_settings
from voxline.realtime.app import create_app
from voxline.realtime.server import make_engine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def live_server(startup_timeout: float = 300.0, **overrides: object) -> Iterator[str]:
    """Serve until the block ends; yields the base URL (http://127.0.0.1:PORT)."""
    overrides.setdefault("engine", "inprocess")
    settings = load_settings(host="127.0.0.1", port=free_port(), **overrides)
    app = create_app(settings, make_engine(settings))
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning",
                            ws="websockets-sansio", ws_max_size=settings.max_event_bytes + 1024)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="live-server")
    thread.start()
    base = f"http://{settings.host}:{settings.port}"
    deadline = time.monotonic() + startup_timeout
    try:
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("voxline server did not become healthy")
            time.sleep(0.2)
        yield base
    finally:
        server.should_exit = True
        thread.join(60)
