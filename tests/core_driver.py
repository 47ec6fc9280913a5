"""Drives an `EngineCore` in a test the way `run_engine_loop` does, collecting its outputs."""

from __future__ import annotations

import threading
import time

from conftest import TIME_FACTOR

from voxline.engines import protocol as p


class CoreDriver:
    """Subclasses build `self.core` with `self.woke.set` as its wake callback."""

    core: object

    def __init__(self) -> None:
        self.woke = threading.Event()
        self.outputs: list[p.EngineOutput] = []

    def send(self, *msgs: p.EngineInput) -> None:
        for m in msgs:
            self.core.add_input(m)

    def run_until(self, pred, timeout: float = 10.0) -> list[p.EngineOutput]:
        deadline = time.monotonic() + timeout * TIME_FACTOR
        while not pred(self.outputs):
            assert time.monotonic() < deadline, f"timed out; outputs: {self.kinds()}"
            if not self.core.has_work():
                self.woke.wait(0.05)
                self.woke.clear()
            self.outputs.extend(self.core.step())
        return self.outputs

    def kinds(self) -> list[str]:
        return [type(o).__name__ for o in self.outputs]

    def of(self, cls):
        return [o for o in self.outputs if isinstance(o, cls)]

    def close(self) -> None:
        self.core.close()
