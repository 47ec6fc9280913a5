"""The engine in a supervised child process, behind ZeroMQ + msgspec.

Wire (one pair of pipes per child process, on fresh `ipc://` paths in a private temp
dir, so nothing a dead child sent can reach its successor):

    inputs   client PUSH --connect--> child PULL (bind)    one encoded EngineInput per message
    outputs  child PUSH --connect--> client PULL (bind)    one message per engine step,
                                                           one encoded output per frame

The connecting side of each pipe queues until its peer binds, so start order does not
matter. The child sends `EngineReady(load_seconds, pid)` once its core is built, or
`EngineFailed(message)` before exiting on an error.

Back-pressure, inputs: the child's pump thread moves inputs from its socket into the
loop's bounded `Inbox` (`engines.loop.INBOX_LIMIT`) and, while the inbox is full, waits
instead of reading on; the socket then fills to its high-water mark (`_HWM` messages on
each side), and the client's non-blocking send is refused with `EngineBusyError`
("engine input queue is full"), which the session turns into an `error` event. Outputs:
the client reads its socket as fast as it arrives (past `_HWM` unread messages the child's
send waits, pausing the engine loop); each stream's own queue is bounded
(`max_queued_outputs`, see `voxline.engines.client`). The pump does not poll: it blocks
on its socket and a stop pipe; after a death the client drains the dead child's last
outputs until its socket reports the disconnect (at most `_DRAIN_TIMEOUT_S`).

Supervision. The client watches the child's sentinel fd on the event loop, so a death
is seen at once: `ready` turns False, every open stream ends with
`StreamError(fatal=True, code="engine_dead")` (see `voxline.engines.client` for how
handles end), `status()` names the exit, and (with `restart=True`) a fresh child is
started with exponential back-off between failed attempts. `close()` sends SIGTERM
(the child stops its loop and closes its core), waits `stop_timeout`, then SIGKILLs.
A child that stops on its own (a SIGTERM from elsewhere, a crashed loop) sends
`EngineFailed` *before* closing its core, which can take seconds: the supervisor treats
that message as the death, so sessions hear of it as fast as of a SIGKILL.
The child is daemonic and also exits on its own when its parent process disappears.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from voxline.aio import cancel_and_wait
from voxline.engines.client import (
    DEFAULT_MAX_QUEUED_OUTPUTS,
    ENGINE_CLOSED,
    ENGINE_DEAD,
    EngineClient,
    build_core,
)
from voxline.engines.loop import Inbox, run_engine_loop
from voxline.engines.protocol import (
    EngineFailed,
    EngineInput,
    EngineOutput,
    EngineReady,
    decode_input,
    decode_output,
    encode,
)
from voxline.errors import EngineBusyError, EngineDeadError, EngineError
from voxline.logs import freeze_startup_objects, log_phase

logger = logging.getLogger(__name__)

_HWM = 10_000  # messages buffered per direction before senders see back-pressure
_PARENT_CHECK_S = 0.5
_DRAIN_TIMEOUT_S = 0.5  # after a death: most we wait for the dead child's socket to close
_MAX_RESTART_DELAY_S = 30.0
_TMP_PREFIX = "voxline-engine-"  # the client's private directory of ipc:// pipes


# ---------------------------------------------------------------------------- child side


def _engine_process_main(
    core_spec: str,
    core_kwargs: dict[str, Any],
    input_addr: str,
    output_addr: str,
    parent_pid: int,
    log_level: int,
) -> None:
    """Entry point of the engine process (spawned; every argument is picklable)."""
    # Its own process group: a signal to the server's group (Ctrl-C in a terminal,
    # `kill -- -PGID`) is the server's to handle; it drains its sessions, then stops us.
    os.setpgid(0, 0)
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=log_level,
            format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
        )
    sys.exit(_serve(core_spec, core_kwargs, input_addr, output_addr, parent_pid))


def _serve(
    core_spec: str,
    core_kwargs: dict[str, Any],
    input_addr: str,
    output_addr: str,
    parent_pid: int,
) -> int:
    stop = threading.Event()
    inbox = Inbox()
    loaded = threading.Event()
    terminated = threading.Event()

    def on_sigterm(signum: int, frame: object) -> None:
        terminated.set()
        stop.set()
        inbox.wake()
        if not loaded.is_set():
            raise SystemExit(0)  # abandon a model load in progress

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle

    ctx = zmq.Context(io_threads=1)
    outputs = ctx.socket(zmq.PUSH)
    outputs.setsockopt(zmq.SNDHWM, _HWM)
    outputs.setsockopt(zmq.LINGER, 2000)  # flush a final EngineFailed
    outputs.connect(output_addr)
    inputs = ctx.socket(zmq.PULL)
    inputs.setsockopt(zmq.RCVHWM, _HWM)
    inputs.setsockopt(zmq.LINGER, 0)
    inputs.bind(input_addr)
    threading.Thread(
        target=_watch_parent, args=(parent_pid, stop, _private_dir(input_addr)),
        name="voxline-parent-watch", daemon=True
    ).start()

    def emit(outs: Sequence[EngineOutput]) -> None:
        outputs.send_multipart([encode(o) for o in outs])

    pump: threading.Thread | None = None
    stop_r, stop_w = os.pipe()  # written once at the end: wakes the pump to exit
    try:
        t0 = time.perf_counter()
        try:
            core = build_core(core_spec, core_kwargs, inbox.wake)
        except Exception as exc:
            logger.exception("engine core failed to load")
            outputs.send(encode(EngineFailed(f"core failed to load: {type(exc).__name__}: {exc}")))
            return 1
        loaded.set()
        load_seconds = time.perf_counter() - t0
        log_phase(logger, "engine core (models, graphs, warm-up)", load_seconds)
        freeze_startup_objects(logger)  # the models' heap never again in a full collection
        outputs.send(encode(EngineReady(load_seconds, os.getpid())))
        pump = threading.Thread(
            target=_pump_inputs, args=(inputs, inbox, stop_r), name="voxline-input-pump"
        )
        pump.start()
        def notify_then_close() -> None:
            # Runs on the loop thread after its last emit, before the (slow) core close.
            if terminated.is_set():
                outputs.send(encode(EngineFailed("it received SIGTERM and is shutting down")))
            real_close()

        real_close = core.close
        core.close = notify_then_close  # type: ignore[method-assign]
        try:
            run_engine_loop(core, inbox, emit, stop)
        except Exception as exc:
            logger.exception("engine loop crashed")
            outputs.send(encode(EngineFailed(f"engine loop crashed: {type(exc).__name__}: {exc}")))
            return 1
        return 0
    finally:
        stop.set()
        inbox.close()
        os.write(stop_w, b"\0")
        if pump is not None:
            pump.join()
        os.close(stop_r)
        os.close(stop_w)
        inputs.close()
        outputs.close()
        ctx.term()


def _pump_inputs(sock: zmq.Socket, inbox: Inbox, stop_fd: int) -> None:
    """Move decoded inputs from the socket into the loop's inbox until `stop_fd` is
    readable or the inbox closes. A full inbox blocks the pump, so inputs wait in the
    socket, whose high-water mark then refuses the client's sends (module docstring)."""
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(stop_fd, zmq.POLLIN)
    while True:
        if any(fd == stop_fd for fd, _ in poller.poll()):
            return
        while True:
            try:
                data = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                msg = decode_input(data)
            except msgspec.DecodeError as exc:  # a client bug: nothing to route an error to
                logger.error("dropping undecodable engine input (%d bytes): %s", len(data), exc)
                continue
            try:
                inbox.put(msg, block=True)
            except EngineDeadError:  # the loop has stopped
                return


def _private_dir(addr: str) -> str | None:
    """The parent's private directory holding an `ipc://` pipe, if `addr` is in one."""
    directory = os.path.dirname(addr.removeprefix("ipc://"))
    return directory if os.path.basename(directory).startswith(_TMP_PREFIX) else None


def remove_orphaned_dirs() -> None:
    """Remove pipe directories whose server process is gone: only a SIGKILL to the server
    and its engine at once leaves one (an orphaned engine removes its own)."""
    for path in Path(tempfile.gettempdir()).glob(f"{_TMP_PREFIX}*-*"):
        owner = path.name.removeprefix(_TMP_PREFIX).split("-")[0]
        if owner.isdigit() and not _process_exists(int(owner)):
            shutil.rmtree(path, ignore_errors=True)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True


def _watch_parent(parent_pid: int, stop: threading.Event, private_dir: str | None) -> None:
    """Exit the process when its parent is gone (killed without closing us), removing the
    pipes' directory the parent can no longer remove. Waits on the parent's sentinel (a
    pipe that reads end-of-file once the parent is gone); without one, checks its pid."""
    parent = multiprocessing.parent_process()
    if parent is not None and parent.sentinel is not None:
        multiprocessing.connection.wait([parent.sentinel])
    else:
        while not stop.wait(_PARENT_CHECK_S) and os.getppid() == parent_pid:
            pass
    if stop.is_set():
        return  # we are shutting down anyway
    logger.error("parent process %d is gone; engine process exiting", parent_pid)
    if private_dir is not None:
        shutil.rmtree(private_dir, ignore_errors=True)
    os._exit(1)


# --------------------------------------------------------------------------- client side


def _retrieve_exception(fut: asyncio.Future[Any]) -> None:
    """Mark a future's exception as seen (its owner may have stopped waiting)."""
    if not fut.cancelled():
        fut.exception()


class _Child:
    """One engine process and the client's sockets to it."""

    def __init__(
        self, gen: int, process: BaseProcess, inputs: zmq.Socket, outputs: zmq.asyncio.Socket
    ) -> None:
        loop = asyncio.get_running_loop()
        self.gen = gen
        self.process = process
        self.inputs = inputs
        self.outputs = outputs
        self.ready: asyncio.Future[EngineReady] = loop.create_future()
        self.exited: asyncio.Future[int | None] = loop.create_future()
        self.reader: asyncio.Task[None] | None = None
        # the child's end of the output pipe closed: everything it sent has arrived
        self.disconnected = asyncio.Event()
        self.monitor = outputs.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.watcher = loop.create_task(self._watch_disconnect())
        self.failure: str | None = None  # its EngineFailed message, if any
        self.stopping = False  # we asked it to exit: its exit is expected
        self.closed = False
        self.ready.add_done_callback(_retrieve_exception)
        self.t_spawn = time.perf_counter()

    async def _watch_disconnect(self) -> None:
        while True:
            event = parse_monitor_message(await self.monitor.recv_multipart())
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self.disconnected.set()

    def close_sockets(self) -> None:
        self.watcher.cancel()
        self.outputs.disable_monitor()
        self.monitor.close()
        self.inputs.close()
        self.outputs.close()


class MultiprocessEngineClient(EngineClient):
    """Runs the engine in a supervised child process ("spawn"); see the module docstring.

    `start()` raises `EngineError` if the first child fails to load (with the child's
    message), dies, or is not ready within `start_timeout` seconds. `core_spec` and
    `core_kwargs` must be picklable; as with any "spawn" child, a script that starts
    this client needs the `if __name__ == "__main__":` guard.
    """

    def __init__(
        self,
        core_spec: str,
        core_kwargs: Mapping[str, Any] | None = None,
        restart: bool = True,
        *,
        max_queued_outputs: int = DEFAULT_MAX_QUEUED_OUTPUTS,
        start_timeout: float | None = None,
        stop_timeout: float = 5.0,
    ) -> None:
        super().__init__(max_queued_outputs)
        self._spec = core_spec
        self._kwargs = dict(core_kwargs or {})
        self._restart = restart
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._mp = multiprocessing.get_context("spawn")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._sync_ctx: zmq.Context | None = None  # same context, for non-blocking sends
        self._tmpdir: str | None = None
        self._remove_tmpdir: weakref.finalize | None = None  # also runs at exit without close()
        self._gen = 0
        self._child: _Child | None = None  # the live, ready child
        self._children: set[_Child] = set()  # every child not yet stopped (live or starting)
        self._tasks: set[asyncio.Task[None]] = set()  # death handling and restarts
        self._down_since: float | None = None  # when the live child was seen gone

    async def start(self) -> None:
        if self._ctx is not None:
            raise RuntimeError("engine client already started")
        self._loop = asyncio.get_running_loop()
        remove_orphaned_dirs()
        self._tmpdir = tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{os.getpid()}-")
        self._remove_tmpdir = weakref.finalize(self, shutil.rmtree, self._tmpdir, True)
        self._ctx = zmq.asyncio.Context()
        self._sync_ctx = zmq.Context.shadow(self._ctx.underlying)
        try:
            await self._bring_up()
        except BaseException:
            self._closed = True
            self._teardown()
            raise

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._set_down(None)
        self._fail_all_streams("engine client closed", ENGINE_CLOSED)
        await cancel_and_wait(*self._tasks)
        self._child = None
        await asyncio.gather(*(self._stop_child(c) for c in list(self._children)))
        self._teardown()
        logger.info("engine client closed (%d restarts)", self._restarts)

    def _transmit(self, msg: EngineInput) -> None:
        assert self._child is not None
        try:
            self._child.inputs.send(encode(msg), zmq.NOBLOCK)
        except zmq.Again:
            raise EngineBusyError(
                f"engine input queue is full ({_HWM} messages): the engine is not keeping up",
                msg.stream_id,
            ) from None

    # -- bring-up -----------------------------------------------------------------------------

    def _spawn(self) -> _Child:
        assert self._ctx is not None and self._sync_ctx is not None and self._tmpdir is not None
        loop = asyncio.get_running_loop()
        self._gen += 1
        input_addr = f"ipc://{self._tmpdir}/in-{self._gen}"
        output_addr = f"ipc://{self._tmpdir}/out-{self._gen}"
        outputs = self._ctx.socket(zmq.PULL)
        outputs.setsockopt(zmq.RCVHWM, _HWM)
        outputs.setsockopt(zmq.LINGER, 0)
        outputs.bind(output_addr)
        inputs = self._sync_ctx.socket(zmq.PUSH)
        inputs.setsockopt(zmq.SNDHWM, _HWM)
        inputs.setsockopt(zmq.LINGER, 0)
        inputs.connect(input_addr)
        process = self._mp.Process(
            target=_engine_process_main,
            args=(
                self._spec,
                self._kwargs,
                input_addr,
                output_addr,
                os.getpid(),
                logging.getLogger().getEffectiveLevel(),
            ),
            name=f"voxline-engine-{self._gen}",
            daemon=True,
        )
        try:
            process.start()
        except BaseException:
            inputs.close()
            outputs.close()
            raise
        child = _Child(self._gen, process, inputs, outputs)
        self._children.add(child)
        loop.add_reader(process.sentinel, self._on_child_exit, child)
        child.reader = loop.create_task(self._read_outputs(child))
        logger.info("engine process %d spawned (%s)", process.pid, self._spec)
        return child

    async def _bring_up(self) -> None:
        """Spawn a child and make it the live engine once it is ready."""
        child = self._spawn()
        try:
            try:
                ready = await asyncio.wait_for(asyncio.shield(child.ready), self._start_timeout)
            except TimeoutError:
                raise EngineError(
                    f"engine process {child.process.pid} not ready within {self._start_timeout} s"
                ) from None
        except BaseException:
            await self._stop_child(child)
            raise
        if self._closed:  # close() ran while we waited; it has stopped this child
            raise EngineError("engine client was closed during start-up")
        self._child = child
        self._set_ready(ready.pid, ready.load_seconds)
        logger.info(
            "engine process ready after %.1f s (pid %d, core load %.1f s)",
            time.perf_counter() - child.t_spawn,
            ready.pid,
            ready.load_seconds,
        )
        if self._down_since is not None:  # the line bench_gpu_start.py times a crash by
            logger.warning("engine back after %.1f s (restart #%d)",
                           time.perf_counter() - self._down_since, self._restarts)
            self._down_since = None

    async def _read_outputs(self, child: _Child) -> None:
        while True:
            self._handle_frames(child, await child.outputs.recv_multipart())

    def _handle_frames(self, child: _Child, frames: list[bytes]) -> None:
        outputs: list[EngineOutput] = []
        for frame in frames:
            try:
                msg = decode_output(frame)
            except msgspec.DecodeError as exc:  # an engine bug: no stream to route it to
                logger.error("dropping undecodable engine output (%d bytes): %s", len(frame), exc)
                continue
            if isinstance(msg, EngineReady):
                if not child.ready.done():
                    child.ready.set_result(msg)
            elif isinstance(msg, EngineFailed):
                if outputs and child is self._child:  # what it sent before failing comes first
                    self._dispatch(outputs)
                outputs = []
                child.failure = msg.message
                if child.stopping:  # we stopped it: its going is no failure
                    logger.info("engine process %d stopping: %s", child.process.pid, msg.message)
                else:
                    logger.error("engine process %d failed: %s", child.process.pid, msg.message)
                if not child.ready.done():
                    child.ready.set_exception(EngineError(f"engine failed to start: {msg.message}"))
                elif child is self._child and not child.stopping:
                    self._retire(child)
            else:
                outputs.append(msg)
        if outputs and child is self._child:
            self._dispatch(outputs)

    def _retire(self, child: _Child) -> None:
        """The live child said it is going away: fail its streams now, not at its exit."""
        message = f"engine process {child.process.pid} failed: {child.failure}"
        self._down_since = time.perf_counter()
        child.stopping = True  # its exit is now expected
        self._child = None
        self._set_down(message)
        logger.error("%s; failing %d open streams", message, len(self._streams))
        self._fail_all_streams(message, ENGINE_DEAD)
        self._track(self._stop_then_restart(child))

    async def _stop_then_restart(self, child: _Child) -> None:
        await self._stop_child(child)
        if self._restart and not self._closed:
            await self._restart_until_ready()

    # -- supervision --------------------------------------------------------------------------

    def _on_child_exit(self, child: _Child) -> None:
        """Sentinel callback: the child process has exited."""
        assert self._loop is not None
        self._loop.remove_reader(child.process.sentinel)
        child.process.join(1.0)  # reap; its fds close just before it becomes reapable
        code = child.process.exitcode
        if not child.exited.done():
            child.exited.set_result(code)
        if child.stopping:
            return
        if child is self._child:
            self._down_since = time.perf_counter()
            self._set_down(self._death_message(child, code))
            self._track(self._handle_death(child))
        elif not child.ready.done():
            self._track(self._handle_startup_death(child, code))

    async def _handle_startup_death(self, child: _Child, code: int | None) -> None:
        await self._drain(child)  # pick up an EngineFailed that raced the exit
        if not child.ready.done():
            child.ready.set_exception(
                EngineError(self._death_message(child, code, "during start-up"))
            )

    async def _handle_death(self, child: _Child) -> None:
        message = self._last_error or "engine process died"
        logger.error("%s; failing %d open streams", message, len(self._streams))
        await self._drain(child)  # outputs it sent before dying come before the error
        self._child = None
        self._fail_all_streams(message, ENGINE_DEAD)
        await self._stop_child(child)
        if self._restart and not self._closed:
            self._track(self._restart_until_ready())

    async def _drain(self, child: _Child) -> None:
        """Handle what the dead child sent before dying: all of it has arrived once its
        end of the pipe is seen closed (a child that never connected: after the timeout)."""
        if child.reader is not None:
            child.reader.cancel()
            await asyncio.gather(child.reader, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(child.disconnected.wait(), _DRAIN_TIMEOUT_S)
        while await child.outputs.poll(0, zmq.POLLIN):
            self._handle_frames(child, await child.outputs.recv_multipart())

    async def _restart_until_ready(self) -> None:
        delay = 0.0
        while not self._closed:
            if delay:
                await asyncio.sleep(delay)
            self._restarts += 1
            logger.warning("restarting engine process (restart #%d)", self._restarts)
            try:
                await self._bring_up()
                return
            except Exception as exc:
                self._last_error = str(exc)
                delay = min(max(0.5, 2 * delay), _MAX_RESTART_DELAY_S)
                logger.error("engine restart failed: %s; next attempt in %.1f s", exc, delay)

    def _death_message(self, child: _Child, code: int | None, when: str = "") -> str:
        if code is not None and code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        msg = f"engine process {child.process.pid} {how}"
        if when:
            msg += f" {when}"
        if child.failure:
            msg += f": {child.failure}"
        return msg

    def _track(self, coro: Any) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("engine supervision task failed", exc_info=task.exception())

    async def _stop_child(self, child: _Child) -> None:
        """Stop `child` (SIGTERM, then SIGKILL after `stop_timeout`) and close its sockets."""
        assert self._loop is not None
        child.stopping = True
        if not child.ready.done():
            child.ready.set_exception(EngineError("engine process stopped during start-up"))
        if not child.exited.done():
            child.process.terminate()
            try:
                await asyncio.wait_for(asyncio.shield(child.exited), self._stop_timeout)
            except TimeoutError:
                logger.warning(
                    "engine process %d ignored SIGTERM for %.1f s; killing it",
                    child.process.pid,
                    self._stop_timeout,
                )
                child.process.kill()
                try:
                    await asyncio.wait_for(asyncio.shield(child.exited), 5.0)
                except TimeoutError:
                    logger.error("engine process %d did not die", child.process.pid)
                    self._loop.remove_reader(child.process.sentinel)
        if child.reader is not None and not child.reader.done():
            child.reader.cancel()
            await asyncio.gather(child.reader, return_exceptions=True)
        if not child.closed:
            child.closed = True
            child.close_sockets()
            if child.process.exitcode is not None:
                child.process.close()
        self._children.discard(child)

    def _teardown(self) -> None:
        if self._ctx is not None and not self._ctx.closed:
            self._ctx.destroy(linger=0)
        if self._remove_tmpdir is not None:
            self._remove_tmpdir()
