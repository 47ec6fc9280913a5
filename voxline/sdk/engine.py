"""The engine in this process, and sessions on it with no HTTP in between.

:class:`Engine` owns an engine client (the shipped models on a thread by default, or a
supervised child process); each :meth:`Engine.session` runs a SessionActor under a
SessionRunner, exactly as the ``/v1/realtime`` WebSocket does, with asyncio queues for
a socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from voxline.config import Settings, load_settings
from voxline.engines.client import EngineClient, InProcessEngineClient
from voxline.realtime.server import make_engine
from voxline.sdk.session import SessionError, SessionFactory, Transport
from voxline.sessions import commands as cmd
from voxline.sessions import events as ev
from voxline.sessions.actor import SessionActor
from voxline.sessions.ids import new_id
from voxline.sessions.runner import SessionEnded, SessionRunner

COMMAND_QUEUE_LIMIT = 1024  # commands the session has not taken yet (audio frames mostly)


class LocalTransport(Transport):
    """A session running here: a SessionRunner task between two queues."""

    def __init__(self, engine: EngineClient, *, lead_ms: float = 200.0,
                 max_session_seconds: float = 24 * 3600.0, tools_supported: bool = False) -> None:
        self._engine = engine
        self._lead_ms = lead_ms
        self._tools_supported = tools_supported
        self._max_seconds = max_session_seconds
        self._inbox: asyncio.Queue[cmd.ClientCommand | None] = asyncio.Queue(COMMAND_QUEUE_LIMIT)
        self._outbox: asyncio.Queue[ev.ServerEvent | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        session_id = new_id("sess")
        actor = SessionActor(session_id, f"{session_id}-{uuid.uuid4().hex[:6]}",
                             lead_ms=self._lead_ms, tools_supported=self._tools_supported)
        runner = SessionRunner(actor, self._engine, self._outbox.put,
                               max_seconds=self._max_seconds)
        self._task = asyncio.create_task(self._run(runner), name="voxline-local-session")

    async def _run(self, runner: SessionRunner) -> None:
        try:
            await runner.run(self._commands())
        except SessionEnded:
            pass  # the final error event (if any) is already in the outbox
        finally:
            self._outbox.put_nowait(None)

    async def _commands(self) -> AsyncIterator[cmd.ClientCommand]:
        while (command := await self._inbox.get()) is not None:
            yield command

    async def send(self, command: cmd.ClientCommand) -> None:
        if self._task is None or self._task.done():
            raise SessionError("the session has ended")
        await self._inbox.put(command)

    async def events(self) -> AsyncIterator[ev.ServerEvent]:
        while (event := await self._outbox.get()) is not None:
            yield event

    async def close(self) -> None:
        if self._task is None:
            return
        if not self._task.done():
            await self._inbox.put(None)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self._task), 10.0)
        if not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class Engine(SessionFactory):
    """The voxline engine in this process. ``async with Engine() as engine:`` loads the
    shipped models (seconds); ``engine.session(...)`` then opens sessions on it.

    ``settings`` picks models and threads as for ``voxline serve`` (``engine="process"``
    runs the engine in a supervised child process). ``client`` runs sessions on an
    engine client you built and started yourself (the Engine then neither starts nor
    closes it).
    """

    def __init__(self, settings: Settings | None = None, *, client: EngineClient | None = None,
                 core: str | None = None, core_options: Mapping[str, Any] | None = None) -> None:
        self.settings = settings or load_settings(engine="inprocess")
        self._owned = client is None
        if client is not None:
            self.client = client
        elif core is not None:
            self.client = InProcessEngineClient(core, core_options)
        else:
            self.client = make_engine(self.settings)

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        if self._owned:
            await self.client.start()
        await self.client.wait_ready()

    async def close(self) -> None:
        if self._owned:
            await self.client.close()

    @property
    def tools_supported(self) -> bool:
        return self.settings.remote_llm

    def _transport(self) -> Transport:
        if not self.client.ready:
            raise SessionError("the engine is not running; use `async with Engine() as engine`")
        return LocalTransport(self.client, lead_ms=self.settings.output_lead_ms,
                              tools_supported=self.settings.remote_llm)
