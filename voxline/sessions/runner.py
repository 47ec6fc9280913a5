"""Drives a SessionActor on asyncio: client events, engine outputs and the clock in; server
events out, in order, through one writer. Transport-agnostic: a transport supplies an
async iterator of parsed client events and an async `send` for server events.

Bounds. Server events wait for the writer in a queue of `OUTGOING_LIMIT`; past it the
client is not reading and the session ends (`SessionEnded(1008)`). An engine input the
engine refuses because its input queue is full (`EngineBusyError`) is not lost silently:
the actor hears it as the engine's own refusal, a `server_busy` error naming the client
event that caused it (and a refused `response.create` ends its response as failed), and
the session lives on. An input sent while the engine is going down (its death seen, the
streams not failed yet) is not sent: the stream's `engine_dead` end follows and ends the
session with that error, not with an internal one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from voxline.aio import cancel_and_wait
from voxline.config import setting_default
from voxline.engines import protocol as ep
from voxline.engines.client import EngineClient, StreamHandle
from voxline.errors import EngineBusyError, EngineDeadError, EngineError, ProtocolError
from voxline.sessions import events as ev
from voxline.sessions.actor import SessionActor
from voxline.sessions.commands import ClientCommand
from voxline.sessions.mcp_client import McpWorker
from voxline.sessions.mcp_servers import McpOutcome

logger = logging.getLogger(__name__)

OUTGOING_LIMIT = 4096  # server events queued for a client that stopped reading


class SessionEnded(Exception):
    """The session must end; `code`/`reason` are for the transport's close frame."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class SessionRunner:
    def __init__(
        self,
        actor: SessionActor,
        engine: EngineClient,
        send: Callable[[ev.ServerEvent], Awaitable[None]],
        *,
        max_seconds: float = setting_default("max_session_seconds"),
        observe: Callable[[str, float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.actor = actor
        self.engine = engine
        self._send = send
        self._observe = observe
        self._clock = clock
        self._max_seconds = max_seconds
        self._outgoing: asyncio.Queue[ev.ServerEvent | None] = asyncio.Queue(OUTGOING_LIMIT)
        self._wake = asyncio.Event()
        self._stream: StreamHandle | None = None
        self._cause = "the session"  # what the commands being sent were for (for errors)
        self._busy = False  # the engine refused the last input (logged once per episode)
        self._no_response = asyncio.Event()  # set while the actor has no response in flight
        self._no_response.set()
        self._mcp = McpWorker(self._mcp_done)  # MCP tool I/O, off the actor (sessions/mcp.py)

    async def run(self, incoming: AsyncIterator[ClientCommand | ProtocolError]) -> None:
        """Serve until the client leaves, the engine fails, or the time limit passes.

        Raises SessionEnded when the server ends the session.
        """
        actor = self.actor
        actor.start(self._clock())
        opens = [c for c in actor.take_commands() if isinstance(c, ep.OpenStream)]
        self._stream = await self.engine.open_stream(actor.stream_id, opens[0].config)
        self._flush()
        tasks = [
            asyncio.create_task(self._writer(), name="session-writer"),
            asyncio.create_task(self._read_client(incoming), name="session-client"),
            asyncio.create_task(self._read_engine(), name="session-engine"),
            asyncio.create_task(self._clock_loop(), name="session-clock"),
        ]
        try:
            done, _ = await asyncio.wait(tasks, timeout=self._max_seconds,
                                         return_when=asyncio.FIRST_COMPLETED)
            if not done:
                actor.expire(self._max_seconds)
                self._flush()
                raise SessionEnded(1000, "session expired")
            for task in done:
                if task.cancelled():  # not by us: a bug to report, not our caller's cancel
                    raise RuntimeError(f"the session's {task.get_name()} task was cancelled")
                exc = task.exception()
                if exc is not None:
                    raise exc
        finally:
            for task in tasks:
                if task.get_name() != "session-writer":
                    task.cancel()
            # let the writer deliver what is queued (e.g. the final error), then stop it
            with contextlib.suppress(asyncio.QueueFull):
                self._outgoing.put_nowait(None)
            # asyncio.wait, not wait_for: 3.11's wait_for can swallow our own cancellation
            await asyncio.wait(tasks[:1], timeout=2.0)
            await cancel_and_wait(*tasks)
            await self._mcp.aclose()
            if self._stream is not None and not self._stream.ended:
                with contextlib.suppress(EngineError):
                    await self._stream.aclose()

    async def wait_no_response(self) -> None:
        """Return once no response is in flight (its `response.done` is queued)."""
        await self._no_response.wait()

    def _flush(self) -> None:
        actor = self.actor
        stream = self._stream
        if actor.response is None:
            self._no_response.set()
        else:
            self._no_response.clear()
        refused: list[ep.EngineOutput] = []
        for cmd in actor.take_commands():
            if stream is not None and not stream.ended:
                try:
                    stream.send(cmd)
                    self._busy = False
                except EngineBusyError as exc:
                    refused.extend(self._refusal(cmd, exc))
                except EngineDeadError:  # going down: the stream's `engine_dead` end follows
                    logger.debug("session %s: engine down, %s not sent", actor.session_id,
                                 type(cmd).__name__)
        for out in refused:  # after the sends: the actor may queue commands of its own
            actor.on_engine(out, self._clock())
        if refused:
            self._flush()
            return
        for name, value in actor.observations:
            if self._observe:
                self._observe(name, value)
        actor.observations.clear()
        for request in actor.take_mcp_requests():
            self._mcp.submit(request)
        for event in actor.take_events():
            try:
                self._outgoing.put_nowait(event)
            except asyncio.QueueFull as exc:
                raise SessionEnded(1008, "client is not reading its events") from exc
        self._wake.set()

    def _refusal(self, cmd: ep.EngineInput, exc: EngineBusyError) -> list[ep.EngineOutput]:
        """What the engine would have said had it refused `cmd` itself."""
        if not self._busy:
            logger.warning("session %s: engine busy, %s refused: %s", self.actor.session_id,
                           type(cmd).__name__, exc)
        self._busy = True
        outs: list[ep.EngineOutput] = [ep.StreamError(
            cmd.stream_id, f"{self._cause}: the engine is busy and refused it ({exc}); "
            "try again shortly", code=ep.ErrorCode.SERVER_BUSY)]
        if isinstance(cmd, ep.CreateResponse):
            outs.append(ep.ResponseFinished(cmd.stream_id, cmd.response_id,
                                        ep.ResponseStatus.FAILED, ""))
        return outs

    def _mcp_done(self, outcome: McpOutcome) -> None:
        self.actor.on_mcp(outcome, self._clock())
        self._flush()

    async def _writer(self) -> None:
        while (event := await self._outgoing.get()) is not None:
            await self._send(event)

    async def _read_client(self, incoming: AsyncIterator[ClientCommand | ProtocolError]) -> None:
        async for item in incoming:
            if isinstance(item, ProtocolError):
                self.actor.protocol_error(item)
            else:
                self.actor.receive(item, self._clock())
                self._cause = item.name
            self._flush()
            self._cause = "the session"

    async def _read_engine(self) -> None:
        assert self._stream is not None
        async for out in self._stream:
            self.actor.on_engine(out, self._clock())
            self._flush()
            if self.actor.closed is not None:
                raise SessionEnded(1011, self.actor.closed.message[:120])

    async def _clock_loop(self) -> None:
        while True:
            now = self._clock()
            deadline = self.actor.next_deadline(now)
            self._wake.clear()
            timeout = None if deadline is None else max(0.0, deadline - now)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self.actor.tick(self._clock())
            self._flush()
