"""The real app on loopback over the engine with tests/fakes.py's stand-in models (fast)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from live_server import free_port

from voxline.config import load_settings
from voxline.engines.client import InProcessEngineClient
from voxline.realtime.app import create_app


@contextmanager
def fake_server(**settings: object) -> Iterator[tuple[str, InProcessEngineClient]]:
    """The real app on loopback over the engine with tests/fakes.py's models."""
    conf = load_settings(host="127.0.0.1", port=free_port(), engine="inprocess", **settings)
    engine = InProcessEngineClient("fakes:make_fake_core", {"stop_after": 60})
    server = uvicorn.Server(uvicorn.Config(create_app(conf, engine), host=conf.host,
                                           port=conf.port, log_level="warning",
                                           ws="websockets-sansio"))
    thread = threading.Thread(target=server.run, name="twilio-fake-server")
    thread.start()
    base = f"http://{conf.host}:{conf.port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)
        yield base, engine
    finally:
        server.should_exit = True
        thread.join(30)
