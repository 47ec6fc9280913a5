"""The engine's busy loop, shared by the in-process and the multiprocess engine.

The loop owns the core: only the loop thread calls `add_input` / `step`. Model work
that runs on helper threads (ASR, TTS) wakes the loop through `Inbox.wake()` when it
finishes, so an idle engine blocks on its inbox instead of polling.

Back-pressure. The inbox holds at most `INBOX_LIMIT` inputs (every stream's together);
the loop takes all of them at the start of each step. Past the bound a producer either
waits for room (`put(block=True)`: the engine process's socket pump, which then stops
reading its socket, so the socket's high-water mark pushes back to the client) or is
refused with `EngineBusyError` (`put(block=False)`: the in-process client, which must
not block its event loop). Either way the input is never dropped silently: a refused
send raises to the caller, who turns it into an error event for the client.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from voxline.engines.protocol import EngineInput, EngineOutput
from voxline.errors import EngineBusyError, EngineDeadError

logger = logging.getLogger(__name__)

INBOX_LIMIT = 4096  # engine inputs queued for the loop, all streams together


class Core(Protocol):
    """What the loop drives. `step` does one bounded unit of work for every stage."""

    def add_input(self, msg: EngineInput) -> None: ...

    def step(self) -> list[EngineOutput]: ...

    def has_work(self) -> bool: ...

    def close(self) -> None: ...


class Inbox:
    """The loop's bounded, thread-safe input queue; `wake()` interrupts an idle wait.

    A wake is a flag, not an item: it never takes room and is never refused. `close()`
    releases every waiting producer; from then on inputs are refused with
    `EngineDeadError` (the loop has stopped).
    """

    def __init__(self, limit: int = INBOX_LIMIT) -> None:
        self.limit = limit
        self._items: deque[EngineInput] = deque()
        self._woken = False
        self._closed = False
        self._cond = threading.Condition()

    def put(self, msg: EngineInput, block: bool = False) -> None:
        """Queue one input. Full: wait for room if `block`, else raise `EngineBusyError`."""
        with self._cond:
            while len(self._items) >= self.limit and block and not self._closed:
                self._cond.wait()
            if self._closed:
                raise EngineDeadError("the engine loop has stopped", msg.stream_id)
            if len(self._items) >= self.limit:
                raise EngineBusyError(
                    f"engine input queue is full ({self.limit} messages): the engine is not "
                    "keeping up", msg.stream_id)
            self._items.append(msg)
            self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def drain(self, block: bool, timeout: float | None = None) -> list[EngineInput]:
        """Take every queued input; if `block`, first wait (up to `timeout` s) for an
        input or a wake when there is none."""
        with self._cond:
            if block and not self._items and not self._woken:
                self._cond.wait_for(lambda: self._items or self._woken, timeout)
            self._woken = False
            out = list(self._items)
            self._items.clear()
            if out:
                self._cond.notify_all()  # producers waiting for room
            return out


def run_engine_loop(
    core: Core,
    inbox: Inbox,
    emit: Callable[[Sequence[EngineOutput]], None],
    stop: threading.Event,
    idle_timeout: float = 0.5,
) -> None:
    """Run until `stop` is set: take inputs, step the core, emit outputs.

    A failing input or step is reported as a stream error by the core itself; an
    exception escaping `step` is a bug and ends the loop (the supervisor restarts it).
    Whoever sets `stop` also calls `inbox.wake()`, so an idle loop notices at once.
    """
    try:
        while not stop.is_set():
            msgs = inbox.drain(block=not core.has_work(), timeout=idle_timeout)
            for msg in msgs:
                core.add_input(msg)
            outputs = core.step()
            if outputs:
                emit(outputs)
    finally:
        inbox.close()
    core.close()
