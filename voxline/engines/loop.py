"""The engine's busy loop, shared by the in-process and the multiprocess engine.

The loop owns the core: only the loop thread calls `add_input` / `step`. Model work
that runs on helper threads (ASR, TTS) wakes the loop through `Inbox.wake()` when it
finishes, so an idle engine blocks on its inbox instead of polling.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from voxline.engines.protocol import EngineInput, EngineOutput

logger = logging.getLogger(__name__)

_WAKE = object()


class Core(Protocol):
    """What the loop drives. `step` does one bounded unit of work for every stage."""

    def add_input(self, msg: EngineInput) -> None: ...

    def step(self) -> list[EngineOutput]: ...

    def has_work(self) -> bool: ...

    def close(self) -> None: ...


class Inbox:
    """Thread-safe input queue of the loop; `wake()` interrupts an idle wait."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[object] = queue.SimpleQueue()

    def put(self, msg: EngineInput) -> None:
        self._q.put(msg)

    def wake(self) -> None:
        self._q.put(_WAKE)

    def drain(self, block: bool, timeout: float | None = None) -> list[EngineInput]:
        out: list[EngineInput] = []
        try:
            first = self._q.get(block=block, timeout=timeout if block else None)
        except queue.Empty:
            return out
        while True:
            if first is not _WAKE:
                out.append(first)  # type: ignore[arg-type]
            try:
                first = self._q.get_nowait()
            except queue.Empty:
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
    """
    while not stop.is_set():
        msgs = inbox.drain(block=not core.has_work(), timeout=idle_timeout)
        for msg in msgs:
            core.add_input(msg)
        outputs = core.step()
        if outputs:
            emit(outputs)
    core.close()
