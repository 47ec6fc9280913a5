"""Logging set-up, a timing helper for slow start-up work, and an event-loop lag watch."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@contextmanager
def timed(logger: logging.Logger, what: str) -> Iterator[None]:
    """Log `what` when it starts and how long it took when it ends."""
    logger.info("%s ...", what)
    t0 = time.perf_counter()
    yield
    logger.info("%s done in %.2f s", what, time.perf_counter() - t0)


class LoopLag:
    """How late an asyncio loop wakes: a task sleeps `tick_s` at a time and records the
    overshoot. A loop busy with one callback for 300 ms delays every timer and socket read
    behind it by as much, which a listener hears as a gap although the audio was ready."""

    def __init__(self, tick_s: float = 0.02) -> None:
        self.tick_s = tick_s
        self._lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _watch(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(self.tick_s)
            self._lags.append(max(0.0, time.perf_counter() - t0 - self.tick_s))

    def take(self) -> dict[str, float] | None:
        """p50/p99/max lag in ms since the last take (None: no tick ended), and reset."""
        lags, self._lags = sorted(self._lags), []
        if not lags:
            return None
        at = lambda q: lags[min(len(lags) - 1, int(q * len(lags)))] * 1000  # noqa: E731
        return {"p50_ms": round(at(0.5), 1), "p99_ms": round(at(0.99), 1),
                "max_ms": round(lags[-1] * 1000, 1), "ticks": len(lags)}
