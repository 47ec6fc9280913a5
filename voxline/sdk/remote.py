"""Sessions on a voxline server, over ``/v1/realtime`` (OpenAI GA JSON).

``voxline.connect(url)`` stands where ``voxline.Engine()`` stood: the same
``session(...)`` and the same typed events (:mod:`voxline.realtime.openai.peer` maps the
wire both ways), so a bot moves to a server by changing that one line.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from voxline.errors import ProtocolError
from voxline.realtime.openai.peer import parse_server_event, render_command
from voxline.sdk.session import SessionError, SessionFactory, Transport
from voxline.sessions import commands as cmd
from voxline.sessions import events as ev

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def realtime_url(url: str) -> str:
    """``http://host:8000`` / ``ws://host:8000/v1/realtime?model=x`` -> the WebSocket URL."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise ValueError(f"voxline.connect: {url!r} is not an http(s):// or ws(s):// URL")
    path = parts.path.rstrip("/")
    if not path.endswith("/v1/realtime"):
        path += "/v1/realtime"
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


class WebSocketTransport(Transport):
    def __init__(self, url: str, api_key: str | None) -> None:
        self._url = url
        self._api_key = api_key
        self._ws: ClientConnection | None = None

    async def open(self) -> None:
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        self._ws = await ws_connect(self._url, additional_headers=headers,
                                    max_size=MAX_MESSAGE_BYTES)

    async def send(self, command: cmd.ClientCommand) -> None:
        assert self._ws is not None, "open() first"
        try:
            await self._ws.send(json.dumps(render_command(command), separators=(",", ":")))
        except ConnectionClosed as exc:
            raise SessionError(f"the session has ended ({exc})") from exc

    async def events(self) -> AsyncIterator[ev.ServerEvent]:
        assert self._ws is not None, "open() first"
        try:
            async for message in self._ws:
                try:
                    event = parse_server_event(message)
                except ProtocolError:
                    logger.exception("dropping a server event voxline cannot read")
                    continue
                if event is not None:
                    yield event
        except ConnectionClosed:
            pass
        if self._ws.close_code not in (None, 1000):
            logger.warning("session closed by the server: %s %s", self._ws.close_code,
                           self._ws.close_reason)

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()


class RemoteEngine(SessionFactory):
    """A voxline server: ``session(...)`` opens a ``/v1/realtime`` WebSocket per session."""

    def __init__(self, url: str, *, api_key: str | None = None) -> None:
        self.url = realtime_url(url)
        self.api_key = api_key

    async def __aenter__(self) -> RemoteEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass  # sessions own their sockets; nothing is shared

    def _transport(self) -> Transport:
        return WebSocketTransport(self.url, self.api_key)


def connect(url: str, *, api_key: str | None = None) -> RemoteEngine:
    """A voxline server at ``url`` (``http://host:port`` or its ``ws://.../v1/realtime``),
    used like ``voxline.Engine``: ``async with voxline.connect(url) as engine:``."""
    return RemoteEngine(url, api_key=api_key)
