"""Logging set-up, timing helpers for slow start-up work (`timed`, and `phase`: the
``start-up phase: NAME: S.S s`` lines `benchmarks/gpu_serving/bench_gpu_start.py` reads), an
event-loop lag watch, and the garbage collector's pauses (measured, and kept off the
start-up heap)."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

from voxline.aio import cancel_and_wait


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


PHASE_PREFIX = "start-up phase: "


@contextmanager
def phase(logger: logging.Logger, name: str) -> Iterator[None]:
    """Time one slow piece of start-up (loading weights, compiling, capturing a stage's
    graphs, warming up) and log ``start-up phase: NAME: S.S s`` when it ends; a piece
    that raises logs nothing (its error says enough)."""
    t0 = time.perf_counter()
    yield
    log_phase(logger, name, time.perf_counter() - t0)


def log_phase(logger: logging.Logger, name: str, seconds: float) -> None:
    """The phase line of a piece timed elsewhere (see `phase`)."""
    logger.info("%s%s: %.1f s", PHASE_PREFIX, name, seconds)


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
        """Stop watching, once the watch task has ended."""
        await cancel_and_wait(self.cancel())

    def cancel(self) -> asyncio.Task[None] | None:
        """Stop watching without waiting (for a caller that is itself being cancelled)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        return task

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


class GcPauses:
    """How long the garbage collector's full (generation-2) collections held the process.

    A full collection walks every tracked object with the GIL held, so every thread
    stops: with torch and the models imported that was 270-300 ms on a 2-core box, longer
    than the 200 ms of audio a session keeps ahead of its listener. Measured through
    ``gc.callbacks`` once :meth:`install` ran (the server and the engine process do)."""

    def __init__(self) -> None:
        self._started: float | None = None
        self._pauses: list[float] = []
        self.installed = False

    def install(self) -> None:
        if not self.installed:
            gc.callbacks.append(self._on_gc)
            self.installed = True

    def uninstall(self) -> None:
        if self.installed:
            gc.callbacks.remove(self._on_gc)
            self.installed = False

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self._pauses.append(time.perf_counter() - self._started)
            self._started = None

    def take(self) -> str | None:
        """The full collections since the last take, as words (None: there were none)."""
        pauses, self._pauses = self._pauses, []
        if not pauses:
            return None
        return f"{len(pauses)} full gc collections, max {max(pauses) * 1000:.0f} ms"


GC_PAUSES = GcPauses()  # one per process: collections stop every thread of it


def freeze_startup_objects(logger: logging.Logger) -> None:
    """Collect once, then take every object alive now (the imported libraries, models,
    compiled code) out of the collector's reach with ``gc.freeze``: later full
    collections walk only what was made since, so a busy server no longer stops for the
    start-up heap. Call once start-up is done; installs :data:`GC_PAUSES` too."""
    t0 = time.perf_counter()
    gc.collect()
    full_ms = (time.perf_counter() - t0) * 1000
    gc.freeze()
    t1 = time.perf_counter()
    gc.collect()
    after_ms = (time.perf_counter() - t1) * 1000
    GC_PAUSES.install()
    logger.info("froze %d start-up objects out of the garbage collector: a full collection "
                "took %.0f ms, now %.1f ms", gc.get_freeze_count(), full_ms, after_ms)
