"""Engine clients: how the API process (or an embedding program) talks to the engine.

One ABC, two implementations (the vLLM v1 split):

- `InProcessEngineClient`: the engine loop runs on a thread of this process (SDK, tests).
- `MultiprocessEngineClient` (`voxline.engines.process`): the engine runs in a
  supervised child process behind ZeroMQ.

Streams. `open_stream()` returns a `StreamHandle` that yields the stream's outputs in
engine order. Every stream ends for its consumer with exactly one *terminal* output,
after which iteration stops:

- `StreamClosed` — the engine closed it (after `CloseStream` / `aclose()`);
- `StreamError(fatal=True)` — the engine failed the stream, or:
  `code="engine_dead"` (the engine died; every open stream gets it within a second),
  `code="output_overflow"` (the consumer fell `max_queued_outputs` behind; the client
  closes the stream in the engine rather than drop outputs silently),
  `code="engine_closed"` (the client was closed).

Once the terminal output has been consumed, `StreamHandle.next()` raises
(`EngineDeadError` for `engine_dead`, `EngineError` otherwise) while `async for` simply
ends. Outputs for streams this client has no handle for are logged at debug and dropped.

Bounds. Inputs: `send` never blocks; when the engine's input queue is full (the in-process
inbox's `engines.loop.INBOX_LIMIT`, or the engine process's socket high-water mark) it
raises `EngineBusyError` and the input is not queued: the caller reports it (a session
sends its client an `error` event, code `server_busy`); the stream stays open. Outputs:
each stream queues at most `max_queued_outputs` (default `DEFAULT_MAX_QUEUED_OUTPUTS`)
for its consumer, then ends with `output_overflow` as above.

Readiness. `wait_ready()` waits for the engine to be up; `add_ready_listener(fn)` calls
`fn()` on the event loop each time it becomes ready: after `start()` and after each
supervisor restart (`status()["restarts"]` counts those), so a user of the engine that
must re-teach a fresh engine (the voice store) is told instead of polling.
"""

from __future__ import annotations

import abc
import asyncio
import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from voxline.engines.loop import INBOX_LIMIT, Core, Inbox, run_engine_loop
from voxline.engines.protocol import (
    CloseStream,
    EngineInput,
    EngineOutput,
    OpenStream,
    StreamClosed,
    StreamConfig,
    StreamError,
)
from voxline.errors import EngineDeadError, EngineError

logger = logging.getLogger(__name__)

DEFAULT_MAX_QUEUED_OUTPUTS = 1024
ENGINE_DEAD = "engine_dead"
ENGINE_CLOSED = "engine_closed"
OUTPUT_OVERFLOW = "output_overflow"


def build_core(spec: str, kwargs: Mapping[str, Any], wake: Callable[[], None]) -> Core:
    """Build a core from `"package.module:factory"`: `factory(wake=wake, **kwargs)`.

    Runs where the core will live (engine thread or process); may take seconds.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"core spec {spec!r} is not of the form 'package.module:factory'")
    factory = getattr(importlib.import_module(module_name), attr)
    return factory(wake=wake, **kwargs)


def _is_terminal(out: EngineOutput) -> bool:
    return isinstance(out, StreamClosed) or (isinstance(out, StreamError) and out.fatal)


class StreamHandle:
    """One open stream: its outputs, in engine order, and a way to send it inputs.

    Single consumer: iterate it (or call `next()`) from one task. The queue holds at
    most `max_queued_outputs` outputs plus one reserved slot for the terminal output,
    so a stream's end is always deliverable.
    """

    def __init__(self, client: EngineClient, stream_id: str, max_queued_outputs: int) -> None:
        self.stream_id = stream_id
        self._client = client
        self._limit = max_queued_outputs
        self._queue: asyncio.Queue[EngineOutput] = asyncio.Queue(max_queued_outputs + 1)
        self._terminal: StreamClosed | StreamError | None = None
        self._terminal_consumed = False
        self._closing = False  # CloseStream sent; waiting for the engine to confirm
        self._released = asyncio.get_running_loop().create_future()  # engine is done with it

    @property
    def ended(self) -> bool:
        """True once the terminal output is queued: no further outputs will come."""
        return self._terminal is not None

    @property
    def terminal(self) -> StreamClosed | StreamError | None:
        """How the stream ended (None while it is open)."""
        return self._terminal

    def send(self, msg: EngineInput) -> None:
        """Send one input for this stream (non-blocking).

        Raises the stream's end as an error if it has ended (`EngineDeadError` when the
        engine died), ValueError if `msg` names another stream.
        """
        if msg.stream_id != self.stream_id:
            raise ValueError(
                f"{type(msg).__name__}.stream_id {msg.stream_id!r} is not {self.stream_id!r}"
            )
        if self._terminal is not None:
            raise self._end_error()
        self._client.send(msg)

    async def next(self) -> EngineOutput:
        """The next output; raises `EngineError`/`EngineDeadError` after the terminal one."""
        if self._terminal_consumed:
            raise self._end_error()
        out = await self._queue.get()
        if out is self._terminal:
            self._terminal_consumed = True
        return out

    def __aiter__(self) -> StreamHandle:
        return self

    async def __anext__(self) -> EngineOutput:
        if self._terminal_consumed:
            raise StopAsyncIteration
        return await self.next()

    async def aclose(self, confirm_timeout: float = 5.0) -> None:
        """Close the stream in the engine and wait (up to `confirm_timeout` s) until it confirms.

        Idempotent. Outputs the engine produced before the close stay readable (space
        permitting), followed by the terminal output. Afterwards the id may be reused.
        """
        if not self._released.done():
            if not self._closing:
                self._closing = True
                try:
                    self._client._send_to_engine(CloseStream(self.stream_id))
                except EngineError:  # engine down: nothing left to close there
                    self._released.set_result(None)
            try:
                await asyncio.wait_for(asyncio.shield(self._released), confirm_timeout)
            except TimeoutError:
                logger.warning(
                    "stream %r: engine did not confirm close in %.1f s",
                    self.stream_id,
                    confirm_timeout,
                )
        self._client._release(self, StreamClosed(self.stream_id))

    # -- called by the client on the event loop -------------------------------------------

    def _deliver(self, out: EngineOutput) -> bool:
        """Queue a non-terminal output; False if the queue is full."""
        if self._terminal is not None:
            return True  # already ended (e.g. overflow): nobody will read it
        if self._queue.qsize() >= self._limit:
            if self._closing:  # the caller asked to close: it will not read this far
                logger.debug("stream %r: closing; dropping %s", self.stream_id, type(out).__name__)
                return True
            return False
        self._queue.put_nowait(out)
        return True

    def _finish(self, terminal: StreamClosed | StreamError) -> None:
        """Queue the terminal output (first one wins) into the reserved slot."""
        if self._terminal is None:
            self._terminal = terminal
            self._queue.put_nowait(terminal)

    def _end_error(self) -> EngineError:
        t = self._terminal
        if isinstance(t, StreamError):
            cls = EngineDeadError if t.code == ENGINE_DEAD else EngineError
            return cls(t.message, self.stream_id)
        return EngineError(f"stream {self.stream_id!r} is closed", self.stream_id)


class EngineClient(abc.ABC):
    """Async client of one engine. Use from one event loop; `send` is loop-thread only.

    Lifecycle: `await start()` (returns once the core is loaded), open streams, then
    `await close()` (leaves no threads or processes behind; open streams end with
    `engine_closed`). Subclasses provide the transport; stream bookkeeping and output
    dispatch live here.
    """

    def __init__(self, max_queued_outputs: int = DEFAULT_MAX_QUEUED_OUTPUTS) -> None:
        self._max_queued = max_queued_outputs
        self._streams: dict[str, StreamHandle] = {}
        self._ready = False
        self._ready_event = asyncio.Event()
        self._ready_listeners: list[Callable[[], None]] = []
        self._closed = False
        self._pid: int | None = None
        self._load_seconds: float | None = None
        self._restarts = 0
        self._last_error: str | None = None

    # -- public API -----------------------------------------------------------------------

    @abc.abstractmethod
    async def start(self) -> None:
        """Start the engine and return when it is ready; raises `EngineError` if it fails."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop the engine gracefully and release every thread, process and socket."""

    @property
    def ready(self) -> bool:
        """True while the engine accepts inputs."""
        return self._ready

    async def wait_ready(self) -> None:
        """Return once the engine is ready (e.g. after a restart); bound it with a timeout."""
        await self._ready_event.wait()

    def add_ready_listener(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener()` (on the event loop) each time the engine becomes ready, the
        first start and every restart; returns a function that removes it."""
        self._ready_listeners.append(listener)

        def remove() -> None:
            if listener in self._ready_listeners:
                self._ready_listeners.remove(listener)

        return remove

    def status(self) -> dict[str, Any]:
        """Health snapshot: ready, pid, restarts, last_error, load_seconds, open_streams."""
        return {
            "ready": self._ready,
            "pid": self._pid,
            "restarts": self._restarts,
            "last_error": self._last_error,
            "load_seconds": self._load_seconds,
            "open_streams": len(self._streams),
        }

    def send(self, msg: EngineInput) -> None:
        """Enqueue one input for an open stream without blocking.

        Raises `EngineDeadError` if the engine is not running, `EngineBusyError` if its
        input queue is full (the input was not queued), `EngineError` if the stream is not
        open on this client (use `open_stream` to open one).
        """
        if isinstance(msg, OpenStream):
            raise EngineError(
                "open streams with open_stream(), not send(OpenStream)", msg.stream_id
            )
        if msg.stream_id not in self._streams:
            raise EngineError(
                f"{type(msg).__name__}: stream {msg.stream_id!r} is not open", msg.stream_id
            )
        self._send_to_engine(msg)

    async def open_stream(self, stream_id: str, config: StreamConfig | None = None) -> StreamHandle:
        """Open a stream in the engine; raises `EngineError` if the id is already in use."""
        if stream_id in self._streams:
            raise EngineError(f"stream {stream_id!r} is already open", stream_id)
        self._send_to_engine(OpenStream(stream_id, config or StreamConfig()))
        handle = StreamHandle(self, stream_id, self._max_queued)
        self._streams[stream_id] = handle
        return handle

    # -- for subclasses ---------------------------------------------------------------------

    def _send_to_engine(self, msg: EngineInput) -> None:
        if not self._ready:
            reason = f": {self._last_error}" if self._last_error else ""
            raise EngineDeadError(f"engine is not running{reason}", msg.stream_id)
        self._transmit(msg)

    @abc.abstractmethod
    def _transmit(self, msg: EngineInput) -> None:
        """Hand one input to the engine without blocking (engine known to be up)."""

    def _set_ready(self, pid: int, load_seconds: float) -> None:
        self._pid = pid
        self._load_seconds = load_seconds
        self._ready = True
        self._ready_event.set()
        for listener in list(self._ready_listeners):
            try:
                listener()
            except Exception:  # one listener's bug must not stop the engine coming up
                logger.exception("engine ready listener failed")

    def _set_down(self, error: str | None) -> None:
        self._ready = False
        self._pid = None
        self._ready_event.clear()
        if error is not None:
            self._last_error = error

    def _dispatch(self, outputs: Sequence[EngineOutput]) -> None:
        """Route engine outputs to their streams (event loop only)."""
        for out in outputs:
            handle = self._streams.get(out.stream_id)
            if handle is None:
                logger.debug("dropping %s for unknown stream %r", type(out).__name__, out.stream_id)
            elif _is_terminal(out):
                self._release(handle, out)  # type: ignore[arg-type]
            elif not handle._deliver(out):
                self._overflow(handle)

    def _overflow(self, handle: StreamHandle) -> None:
        sid = handle.stream_id
        logger.warning(
            "stream %r: consumer is %d outputs behind; failing the stream", sid, self._max_queued
        )
        handle._finish(
            StreamError(
                sid,
                f"stream {sid!r} failed: its consumer fell {self._max_queued} outputs behind",
                code=OUTPUT_OVERFLOW,
                fatal=True,
            )
        )
        handle._closing = True
        try:
            self._send_to_engine(CloseStream(sid))  # registry entry stays until the engine confirms
        except EngineError:
            self._release(handle, handle._terminal)  # type: ignore[arg-type]

    def _release(self, handle: StreamHandle, terminal: StreamClosed | StreamError) -> None:
        """End `handle` (if not ended yet) and forget it: the engine is done with it."""
        handle._finish(terminal)
        if self._streams.get(handle.stream_id) is handle:
            del self._streams[handle.stream_id]
        if not handle._released.done():
            handle._released.set_result(None)

    def _fail_all_streams(self, message: str, code: str) -> None:
        """End every open stream with a fatal `StreamError` (engine died or closed)."""
        for handle in list(self._streams.values()):
            self._release(handle, StreamError(handle.stream_id, message, code=code, fatal=True))


class InProcessEngineClient(EngineClient):
    """Runs the engine loop on a thread of this process; same contract as the process client.

    The core is built on that thread. If the loop dies (a core bug), open streams get
    `engine_dead` and the client stays down: there is no restart in-process.
    """

    def __init__(
        self,
        core_spec: str,
        core_kwargs: Mapping[str, Any] | None = None,
        *,
        max_queued_outputs: int = DEFAULT_MAX_QUEUED_OUTPUTS,
        max_queued_inputs: int = INBOX_LIMIT,
        stop_timeout: float = 10.0,
    ) -> None:
        super().__init__(max_queued_outputs)
        self._spec = core_spec
        self._kwargs = dict(core_kwargs or {})
        self._stop_timeout = stop_timeout
        self._inbox = Inbox(max_queued_inputs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exited: asyncio.Future[None] | None = None

    async def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("engine client already started")
        self._loop = asyncio.get_running_loop()
        self._exited = self._loop.create_future()
        started: asyncio.Future[float] = self._loop.create_future()
        t0 = time.perf_counter()
        logger.info("starting in-process engine (%s)", self._spec)
        self._thread = threading.Thread(target=self._run, args=(started,), name="voxline-engine")
        self._thread.start()
        _stop_at_interpreter_exit(self._stop, self._inbox)
        try:
            load_seconds = await started
        except BaseException:
            self._closed = True
            self._stop.set()
            await self._join()
            raise
        if self._closed:
            raise EngineError("engine client was closed during start-up")
        self._set_ready(os.getpid(), load_seconds)
        logger.info(
            "in-process engine ready in %.2f s (core load %.2f s)",
            time.perf_counter() - t0,
            load_seconds,
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._set_down(None)
        self._fail_all_streams("engine client closed", ENGINE_CLOSED)
        if self._thread is not None:
            self._stop.set()
            self._inbox.wake()
            await self._join()
        logger.info("in-process engine stopped")

    def _transmit(self, msg: EngineInput) -> None:
        self._inbox.put(msg)  # full: EngineBusyError (never blocks the event loop)

    async def _join(self) -> None:
        assert self._thread is not None and self._exited is not None
        try:
            await asyncio.wait_for(asyncio.shield(self._exited), self._stop_timeout)
        except TimeoutError:
            logger.error("engine thread did not stop within %.1f s", self._stop_timeout)
            return
        self._thread.join()

    # -- engine thread ----------------------------------------------------------------------

    def _run(self, started: asyncio.Future[float]) -> None:
        assert self._exited is not None
        try:
            t0 = time.perf_counter()
            try:
                core = build_core(self._spec, self._kwargs, self._inbox.wake)
            except Exception as exc:
                logger.exception("engine core failed to load")
                err = EngineError(f"engine core failed to load: {type(exc).__name__}: {exc}")
                self._notify(_set_exception_if_pending, started, err)
                return
            self._notify(_set_result_if_pending, started, time.perf_counter() - t0)
            try:
                run_engine_loop(core, self._inbox, self._emit, self._stop)
            except Exception as exc:
                logger.exception("engine loop crashed")
                self._notify(self._on_loop_crash, f"{type(exc).__name__}: {exc}")
        finally:
            self._notify(_set_result_if_pending, self._exited, None)

    def _emit(self, outputs: Sequence[EngineOutput]) -> None:
        self._notify(self._dispatch, list(outputs))

    def _notify(self, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn(*args)` on the client's event loop; stop the engine if that loop is gone."""
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop closed without close()
            if not self._stop.is_set():
                logger.warning("event loop closed without EngineClient.close(); stopping engine")
                self._stop.set()

    def _on_loop_crash(self, error: str) -> None:
        message = f"engine loop crashed: {error}"
        self._set_down(message)
        self._fail_all_streams(message, ENGINE_DEAD)


def _stop_at_interpreter_exit(stop: threading.Event, inbox: Inbox) -> None:
    """Stop the (non-daemon) engine thread before the interpreter joins it at exit,
    so a forgotten `close()` cannot hang the process."""

    def stop_engine() -> None:
        stop.set()
        inbox.wake()

    register = getattr(threading, "_register_atexit", None)  # runs before the thread join
    if register is not None:
        register(stop_engine)


def _set_result_if_pending(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception_if_pending(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
