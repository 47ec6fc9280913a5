"""The engine in this process, and sessions on it with no HTTP in between.

:class:`Engine` owns an engine client (the shipped models on a thread by default, or a
supervised child process); each :meth:`Engine.session` is admitted and built by the
session host (:mod:`voxline.realtime.session_host`), a SessionActor under a SessionRunner
exactly as the ``/v1/realtime`` WebSocket's, with bounded asyncio queues for a socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from voxline.config import Settings, load_settings
from voxline.engines.client import EngineClient, InProcessEngineClient
from voxline.engines.launch import make_engine, sized_for_device
from voxline.realtime.session_host import (
    CLOSE_NORMAL,
    CLOSE_POLICY,
    Admission,
    SessionEnd,
    SessionHost,
    SessionLimits,
    SessionRefused,
    image_limits,
    transcription_support,
)
from voxline.sdk.session import SessionError, SessionFactory, Transport
from voxline.sessions import commands as cmd
from voxline.sessions import events as ev
from voxline.sessions.runner import SessionEnded, SessionRunner

COMMAND_QUEUE_LIMIT = 1024  # commands the session has not taken yet (audio frames mostly)
OUTBOX_LIMIT = 4096  # events the session wrote that its reader has not taken yet
SESSION_SECONDS = 24 * 3600.0  # an embedded session's time limit (a server's is shorter)

logger = logging.getLogger(__name__)


class LocalTransport(Transport):
    """A session running here: a SessionRunner task between two bounded queues.

    As the WebSocket's outbox does, the session never waits on its reader: each event is
    queued at once, and once more than `OUTBOX_LIMIT` wait unread the session ends
    ("client is not reading: ... events unread"), the reason logged, kept in `end_reason`
    and raised by `send`. A reader that keeps taking events is never near the bound, however
    fast they come (the session produces at most an inbox of commands' worth between two
    reads). Commands wait for room in the inbox; an ended session refuses them.
    """

    def __init__(self, engine: EngineClient, *, lead_ms: float = 200.0,
                 max_session_seconds: float = SESSION_SECONDS, tools_supported: bool = False,
                 host: SessionHost | None = None) -> None:
        self._host = host or SessionHost(engine, SessionLimits(
            lead_ms=lead_ms, max_session_seconds=max_session_seconds,
            tools_supported=tools_supported))
        self._inbox: asyncio.Queue[cmd.ClientCommand | None] = asyncio.Queue(COMMAND_QUEUE_LIMIT)
        self._outbox: asyncio.Queue[ev.ServerEvent | None] = asyncio.Queue(OUTBOX_LIMIT)
        self._finished = False  # the runner is done: once the outbox is empty, events end
        self._task: asyncio.Task[None] | None = None
        self.end_reason: str | None = None  # why the session ended, when not cleanly

    async def open(self) -> None:
        try:
            admission = self._host.admit()
        except SessionRefused as refused:
            raise SessionError(f"the session was not opened: {refused.reason}") from None
        runner = admission.runner(self._deliver)
        self._task = asyncio.create_task(self._run(admission, runner),
                                         name="voxline-local-session")

    async def _run(self, admission: Admission, runner: SessionRunner) -> None:
        async def ended(end: SessionEnd) -> None:  # the final error event (if any) is queued
            if end.code != CLOSE_NORMAL:
                self.end_reason = end.reason
                logger.warning("session %s ended: %s", admission.session_id, end.reason)

        with admission:
            try:
                await self._host.serve(admission, runner, self._commands(), close=ended)
            finally:
                self._finished = True
                with contextlib.suppress(asyncio.QueueFull):  # wakes a reader waiting on get
                    self._outbox.put_nowait(None)

    async def _deliver(self, event: ev.ServerEvent) -> None:
        if self._outbox.full():  # the runner ends the session with this
            raise SessionEnded(CLOSE_POLICY, f"client is not reading: {self._outbox.qsize()} "
                                             f"events unread (limit {OUTBOX_LIMIT})")
        self._outbox.put_nowait(event)

    async def _commands(self) -> AsyncIterator[cmd.ClientCommand]:
        while (command := await self._inbox.get()) is not None:
            yield command

    async def send(self, command: cmd.ClientCommand) -> None:
        if not await self._put(command):
            why = f": {self.end_reason}" if self.end_reason else ""
            raise SessionError(f"the session has ended{why}")

    async def _put(self, item: cmd.ClientCommand | None) -> bool:
        """Queue for the session, waiting for room; False once the session has ended (also
        while waiting: an ended session no longer makes room)."""
        task = self._task
        if task is None or task.done():
            return False
        if not self._inbox.full():
            self._inbox.put_nowait(item)
            return True
        put = asyncio.ensure_future(self._inbox.put(item))
        await asyncio.wait({put, task}, return_when=asyncio.FIRST_COMPLETED)
        if put.done():
            return True
        put.cancel()
        return False

    async def events(self) -> AsyncIterator[ev.ServerEvent]:
        while not (self._finished and self._outbox.empty()):
            event = await self._outbox.get()
            if event is None:
                return
            yield event

    async def close(self) -> None:
        if self._task is None:
            return
        await self._put(None)
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
        self._session_host: SessionHost | None = None
        if client is not None:
            self.client = client
        elif core is not None:
            self.client = InProcessEngineClient(core, core_options)
        else:
            self.settings = sized_for_device(self.settings)  # capacity from the GPU, if any
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
        return LocalTransport(self.client, host=self._host())

    def _host(self) -> SessionHost:
        """One host for this engine's sessions (no session limit, as before)."""
        if self._session_host is None:
            self._session_host = SessionHost(self.client, SessionLimits(
                lead_ms=self.settings.output_lead_ms, max_session_seconds=SESSION_SECONDS,
                tools_supported=self.settings.remote_llm, images=image_limits(self.settings),
                transcription=transcription_support(self.settings)))
        return self._session_host
