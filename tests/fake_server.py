"""The real app on loopback over the engine with tests/fakes.py's stand-in models (fast)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from live_server import free_port, serve_app

from voxline.config import load_settings
from voxline.engines.client import InProcessEngineClient
from voxline.realtime.app import create_app


@contextmanager
def fake_server(core_options: dict[str, object] | None = None,
                **settings: object) -> Iterator[tuple[str, InProcessEngineClient]]:
    """The real app on loopback over the engine with tests/fakes.py's models."""
    conf = load_settings(host="127.0.0.1", port=free_port(), engine="inprocess", **settings)
    engine = InProcessEngineClient("fakes:make_fake_core", {"stop_after": 60,
                                                            **(core_options or {})})
    with serve_app(create_app(conf, engine), conf.port, name="fake-server") as base:
        yield base, engine
