"""A real voxline server (uvicorn + the shipped models) on a free loopback port, in a thread."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from conftest import TIME_FACTOR
from websockets.sync.client import ClientConnection, connect

from voxline.config import load_settings
from voxline.engines.launch import make_engine
from voxline.realtime.app import create_app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve_app(app: object, port: int, *, startup_timeout: float = 60.0, name: str = "server",
              **config: object) -> Iterator[str]:
    """Run `app` with uvicorn on 127.0.0.1:`port` in a thread until the block ends, once
    `/health` answers 200; yields the base URL. The one home of the tests' server loop."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", ws="websockets-sansio",
                                           **config))
    thread = threading.Thread(target=server.run, name=name)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + startup_timeout
    try:
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not become healthy")
            time.sleep(0.1)
        yield base
    finally:
        server.should_exit = True
        thread.join(60)


@contextmanager
def live_server(startup_timeout: float = 300.0, **overrides: object) -> Iterator[str]:
    """The real app with the shipped models until the block ends; yields the base URL."""
    overrides.setdefault("engine", "inprocess")
    settings = load_settings(host="127.0.0.1", port=free_port(), **overrides)
    app = create_app(settings, make_engine(settings))
    with serve_app(app, settings.port, startup_timeout=startup_timeout, name="live-server",
                   ws_max_size=settings.max_event_bytes + 1024) as base:
        yield base


class JsonSocket:
    """A live server's WebSocket with the Starlette test session's `send_json` and
    `receive_json`, so event-level tests run unchanged over a real connection."""

    def __init__(self, conn: ClientConnection) -> None:
        self.conn = conn

    def send_json(self, data: object) -> None:
        self.conn.send(json.dumps(data))

    def receive_json(self) -> dict:
        return json.loads(self.conn.recv(timeout=30 * TIME_FACTOR))


@contextmanager
def live_socket(app: object, path: str = "/v1/realtime", **config: object) -> Iterator[JsonSocket]:
    """`app` served by uvicorn on a free loopback port once healthy, and a WebSocket to
    `path` on it; both closed when the block ends."""
    with serve_app(app, free_port(), **config) as base, \
            connect("ws" + base[len("http"):] + path, max_size=None) as conn:
        yield JsonSocket(conn)
