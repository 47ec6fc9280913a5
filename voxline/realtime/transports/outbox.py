"""A connection's outgoing messages, bounded in bytes, written to the socket by one task.

A session never waits on its client's socket: `put` queues and returns, the writer task
sends. A client that stops reading fills the OS buffers, then the transport's, then this
queue; once the queue passes its bound, `put` raises `SlowClient` and the transport drops
the connection. Nothing here blocks the event loop, so other sessions keep their pace.

The bound (`limit_bytes`, the `send_buffer_kb` setting) counts every unsent message but
one: the largest, when it alone is larger than the bound. Such a message is the client's
own input echoed back (a `session.updated` carrying megabytes of instructions, bounded by
`max_event_bytes`); a client that reads normally takes it, however large, so it is never
a backlog. Two of them waiting, or a backlog of ordinary events past the bound, is a
client that stopped reading.

Also the two ends of a hosted WebSocket session the WebSocket transports share:
`admit_or_close` (the host's refusal as a close frame) and `close_after` (the session's
end as one, once its events are out).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from fastapi import WebSocket, WebSocketDisconnect

from voxline.aio import cancel_and_wait
from voxline.realtime.ops.metrics import Metrics
from voxline.realtime.session_host import (
    CLOSE_POLICY,
    Admission,
    SessionEnd,
    SessionHost,
    SessionRefused,
    refusal_close,
)
from voxline.sessions.runner import SessionEnded

logger = logging.getLogger(__name__)

CLOSE_FLUSH_S = 2.0  # how long queued events may take to leave before the close


class SlowClient(SessionEnded):
    """The client stopped reading: more than the bound is waiting to be sent to it. The
    session ends with 1008 and this reason."""

    def __init__(self, pending: int, limit: int) -> None:
        super().__init__(CLOSE_POLICY, f"client is not reading: {pending // 1024} KiB of "
                                       f"events unsent (limit {limit // 1024} KiB)")


class Outbox:
    def __init__(self, write: Callable[[str], Awaitable[None]], limit_bytes: int) -> None:
        self._write = write
        self.limit_bytes = limit_bytes
        self.pending_bytes = 0
        self._queue: deque[str] = deque()
        self._oversized: list[int] = []  # sizes of the queued messages larger than the bound
        self._ready = asyncio.Event()
        self._drained = asyncio.Event()  # set while nothing is queued
        self._drained.set()
        self._task: asyncio.Task[None] | None = None
        self.overflowed = False

    @property
    def backlog_bytes(self) -> int:
        """The unsent bytes that count against the bound (see the module docstring)."""
        return self.pending_bytes - max(self._oversized, default=0)

    def put(self, text: str) -> None:
        """Queue one message; raises `SlowClient` once the backlog passes the bound."""
        self.pending_bytes += len(text)
        if len(text) > self.limit_bytes:
            self._oversized.append(len(text))
        self._queue.append(text)
        self._drained.clear()
        self._ready.set()
        if self.backlog_bytes > self.limit_bytes:
            self.overflowed = True
            raise SlowClient(self.backlog_bytes, self.limit_bytes)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="outbox-writer")

    async def _run(self) -> None:
        while True:
            await self._ready.wait()
            while self._queue:
                text = self._queue[0]
                await self._write(text)
                self._queue.popleft()
                self.pending_bytes -= len(text)
                if len(text) > self.limit_bytes:
                    self._oversized.remove(len(text))
            self._ready.clear()
            self._drained.set()

    async def flush(self, timeout: float) -> bool:
        """Wait until everything queued was handed to the socket (or the socket is gone);
        False if that took longer than `timeout` s: the client is not reading."""
        if not self._queue or self._task is None or self._task.done():
            return True
        drained = asyncio.ensure_future(self._drained.wait())
        try:
            await asyncio.wait({drained, self._task}, timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            drained.cancel()
        return not self._queue or self._task.done()

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)


async def admit_or_close(ws: WebSocket, host: SessionHost) -> Admission | None:
    """Admit a session on an accepted WebSocket, or close it with the refusal's code and
    reason (1001 while draining, 1013 at capacity or while the engine starts) and None."""
    try:
        return host.admit()
    except SessionRefused as refused:
        end = refusal_close(refused)
        await ws.close(code=end.code, reason=end.reason)
        return None


async def close_after(ws: WebSocket, outbox: Outbox, end: SessionEnd, metrics: Metrics) -> None:
    """Close once the queued events are out; a client that stopped reading (its outbox
    overflowed, or it will not take them within a few seconds) is dropped at once: no
    close frame can pass a full pipe, and its socket must not outlive the session."""
    if outbox.overflowed or not await outbox.flush(CLOSE_FLUSH_S):
        logger.warning("dropping a client that stopped reading (%d KiB unsent, limit %d KiB)",
                       outbox.pending_bytes // 1024, outbox.limit_bytes // 1024)
        metrics.inc("voxline_slow_clients_dropped_total", "connections dropped because the "
                    "client stopped reading")
        await outbox.stop()
        abort_connection(ws)
        return
    await outbox.stop()
    try:
        await asyncio.wait_for(ws.close(code=end.code, reason=end.reason), CLOSE_FLUSH_S)
    except TimeoutError:
        abort_connection(ws)
    except (RuntimeError, WebSocketDisconnect):
        pass  # the client already went away


def abort_connection(ws: WebSocket) -> None:
    """Drop a WebSocket's TCP connection now. ASGI has no abort; uvicorn's protocol (whose
    bound `send` the app was handed) holds the transport. Elsewhere the server closes the
    connection once the app returns."""
    transport = getattr(getattr(ws._send, "__self__", None), "transport", None)
    if transport is not None:
        transport.abort()
