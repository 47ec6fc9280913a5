"""The fault harness: a real `voxline serve` process tree (server + supervised engine
process, model-free slow-reply core), WebSocket clients with turns in flight, a signal to
one process or the whole tree, and a record of what followed: what each client saw and
when, `/health` going 503 and back, how the server exited, what was left behind.

Used by the fault tests (tests/reliability/test_faults.py) and the fault table
(benchmarks/reliability/fault_table.py). Times are recorded and printed, never asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

TESTS = Path(__file__).resolve().parents[1]
TIME_FACTOR = float(os.environ.get("VOXLINE_TEST_TIME_FACTOR", "1.0"))
GRACE_S = 10.0  # --shutdown-grace of the server under test
REPLY_S = 1.0  # audio per reply: at real-time pacing a reply is in flight this long

# `voxline serve` through its CLI, with the engine's core swapped for the slow-reply echo
SERVE = """
import sys
sys.path.insert(0, {tests!r})
import voxline.realtime.server as server
from voxline.engines.process import MultiprocessEngineClient
server.make_engine = lambda settings: MultiprocessEngineClient(
    "slow_reply_core:make_slow_reply_core", {{"reply_seconds": {reply}}}, start_timeout=60)
from voxline.cli import main
sys.exit(main(["serve", "--port", sys.argv[1], "--shutdown-grace", "{grace}",
               "--max-sessions", sys.argv[2]]))
"""


SERVE_REAL = f"""
import sys
from voxline.cli import main
sys.exit(main(["serve", "--port", sys.argv[1], "--shutdown-grace", "{GRACE_S}",
               "--max-sessions", sys.argv[2], "--max-responses", sys.argv[2]]))
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes of session `sid`: the server's whole tree."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                pids.append(int(entry.name))
    return sorted(pids)


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} for {pid}")


def threads(pid: int) -> int:
    return _status(pid, "Threads")


def rss_mib(pid: int) -> float:
    return _status(pid, "VmRSS") / 1024


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@dataclass
class ClientLog:
    """What one client saw, in seconds since the fault."""

    errors: list[tuple[float, str]] = field(default_factory=list)  # (t, error code)
    close: tuple[float, int | None, str] | None = None  # (t, code, reason)
    replies_done: list[tuple[float, str]] = field(default_factory=list)  # (t, status)


@dataclass
class Outcome:
    fault: str
    load: bool
    clients: list[ClientLog]
    health_503_at: float | None = None  # first /health 503 after the fault
    recovered_at: float | None = None  # /health 200 again (engine faults)
    new_session_ok: bool | None = None  # a fresh session got a completed reply
    exit_code: int | None = None  # the server's, if it exited
    exited_at: float | None = None
    stop_exit_code: int | None = None  # a server that lived on: its exit on a later SIGTERM
    left_alive: list[int] = field(default_factory=list)  # the tree's processes still alive
    new_shm: set[str] = field(default_factory=set)
    new_engine_dirs: set[str] = field(default_factory=set)  # files left in the tree's TMPDIR
    left_after_restart: set[str] | None = None  # of those files, once a new server started
    fd_growth: int | None = None  # server fds after recovery minus before (engine faults)
    thread_growth: int | None = None

    def first_error(self) -> float | None:
        times = [c.errors[0][0] for c in self.clients if c.errors]
        return min(times) if times else None

    def first_close(self) -> float | None:
        times = [c.close[0] for c in self.clients if c.close]
        return min(times) if times else None

    def row(self) -> dict[str, object]:
        def ms(t: float | None) -> str:
            return "-" if t is None else f"{1000 * t:.0f}"

        saw = sorted({code for c in self.clients for _, code in c.errors}
                     | {f"close {c.close[1]}" + (f" '{c.close[2]}'" if c.close[2] else "")
                        for c in self.clients if c.close})
        done = sorted({s for c in self.clients for t, s in c.replies_done if t >= 0})
        return {
            "fault": self.fault, "load": "turns in flight" if self.load else "idle sessions",
            "clients saw": ", ".join(saw) or "nothing",
            "replies after fault": ", ".join(done) or "-",
            "error ms": ms(self.first_error()), "close ms": ms(self.first_close()),
            "health 503 ms": ms(self.health_503_at), "recovered ms": ms(self.recovered_at),
            "new session": {None: "-", True: "ok", False: "FAILED"}[self.new_session_ok],
            "exit": (f"{self.exit_code} @ {ms(self.exited_at)} ms" if self.exit_code is not None
                     else f"lived on; later SIGTERM: {self.stop_exit_code}"),
            "leftovers": ", ".join(
                [f"pids {self.left_alive}"] * bool(self.left_alive)
                + [f"shm {sorted(self.new_shm)}"] * bool(self.new_shm)
                + [f"{len(self.new_engine_dirs)} files in TMPDIR (removed by the next start: "
                   f"{not self.left_after_restart})"] * bool(self.new_engine_dirs)
                + ([f"fds {self.fd_growth:+d}"] if self.fd_growth else [])
                + ([f"threads {self.thread_growth:+d}"] if self.thread_growth else [])) or "none",
        }


class ServeTree:
    """`voxline serve` in its own session (so the whole tree can be signalled)."""

    def __init__(self, max_sessions: int = 8, reply_seconds: float = REPLY_S,
                 tmpdir: str | None = None, real_models: bool = False) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/v1/realtime"
        self.shm_before = shm_entries()
        # a private TMPDIR: whatever the tree leaves in its temp dir (the engine's pipes)
        self.tmpdir = tmpdir or tempfile.mkdtemp(prefix="voxline-fault-")
        code = SERVE_REAL if real_models else SERVE.format(tests=str(TESTS), reply=reply_seconds,
                                                           grace=GRACE_S)
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(self.port),
                                      str(max_sessions)], start_new_session=True,
                                     env={**os.environ, "TMPDIR": self.tmpdir},
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pid = self.proc.pid

    async def wait_healthy(self, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout * TIME_FACTOR
        async with httpx.AsyncClient(base_url=self.base, timeout=2) as http:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    r = await http.get("/health")
                    if r.status_code == 200:
                        return r.json()
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("voxline serve did not become healthy")
                await asyncio.sleep(0.05)

    async def engine_pid(self) -> int:
        return int((await self.wait_healthy())["engine"]["pid"])

    def leftover_files(self) -> set[str]:
        """What the tree left in its temp dir (relative paths)."""
        root = Path(self.tmpdir)
        return {str(p.relative_to(root)) for p in root.rglob("*")}

    def kill_all(self, keep_tmpdir: bool = False) -> None:
        _signal_every_process(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        if not keep_tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


async def _recv(ws, timeout: float = 10.0) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout * TIME_FACTOR))


async def _client(url: str, log: ClientLog, started: asyncio.Event, t0: list[float],
                  load: bool) -> None:
    """One session: with `load`, reply after reply (always one in flight); else idle."""
    def now() -> float:
        return time.perf_counter() - t0[0] if t0 else -1.0

    try:
        async with connect(url, open_timeout=10 * TIME_FACTOR) as ws:
            assert (await _recv(ws))["type"] == "session.created"
            if load:
                await ws.send(json.dumps({"type": "response.create"}))
            started.set()
            while True:
                event = json.loads(await ws.recv())
                if event["type"] == "error":
                    log.errors.append((now(), event["error"]["code"]))
                elif event["type"] == "response.done":
                    log.replies_done.append((now(), event["response"]["status"]))
                    if load and not t0:  # before the fault: keep one reply in flight
                        await ws.send(json.dumps({"type": "response.create"}))
    except ConnectionClosed as closed:
        rcvd = closed.rcvd
        log.close = (now(), rcvd.code if rcvd else 1006, rcvd.reason if rcvd else "")
    except OSError as exc:
        log.close = (now(), None, f"{type(exc).__name__}")


async def _watch_health(tree: ServeTree, out: Outcome, t0: float, stop: asyncio.Event,
                        engine_pid: int | None) -> None:
    async with httpx.AsyncClient(base_url=tree.base, timeout=1) as http:
        while not stop.is_set():
            try:
                r = await http.get("/health")
                t = time.perf_counter() - t0
                if r.status_code == 503 and out.health_503_at is None:
                    out.health_503_at = t
                if (r.status_code == 200 and out.health_503_at is not None
                        and out.recovered_at is None
                        and r.json()["engine"].get("pid") != engine_pid):
                    out.recovered_at = t
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.02)


async def _fresh_session_works(tree: ServeTree) -> bool:
    try:
        async with connect(tree.ws_url, open_timeout=10 * TIME_FACTOR) as ws:
            if (await _recv(ws))["type"] != "session.created":
                return False
            await ws.send(json.dumps({"type": "response.create"}))
            while (event := await _recv(ws))["type"] != "response.done":
                pass
            return event["response"]["status"] == "completed"
    except (ConnectionClosed, OSError, TimeoutError):
        return False


# Targets: the engine process; the server process; the server's process group (what a
# terminal's Ctrl-C or `kill -- -PGID` reaches: the engine has a group of its own); every
# process of the tree at once (systemd's KillMode=control-group).
TARGETS = ("engine", "server", "group", "every process")
FAULTS = {  # name -> (target, signal)
    f"{sig.name} to {target}": (target, sig)
    for target in TARGETS
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL)
}


def _signal_every_process(sid: int, sig: signal.Signals) -> None:
    for pid in session_members(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


async def run_fault(name: str, load: bool, n_clients: int = 3) -> Outcome:
    """Start a tree, open `n_clients` sessions (turns in flight with `load`), deliver the
    fault, and record what follows until recovery or exit; the tree is gone afterwards."""
    target, sig = FAULTS[name]
    tree = ServeTree()
    try:
        engine_pid = await tree.engine_pid()
        assert await _fresh_session_works(tree), "the server does not serve a session"
        await _settle(tree)  # warmed up: what a session creates lazily exists now
        fd0, th0 = fds(tree.pid), threads(tree.pid)
        logs = [ClientLog() for _ in range(n_clients)]
        t0: list[float] = []
        started = [asyncio.Event() for _ in logs]
        tasks = [asyncio.create_task(_client(tree.ws_url, log, ev, t0, load))
                 for log, ev in zip(logs, started, strict=True)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 30 * TIME_FACTOR)
        await asyncio.sleep(0.3)  # replies are streaming
        out = Outcome(name, load, logs)
        t0.append(time.perf_counter())
        stop = asyncio.Event()
        watcher = asyncio.create_task(_watch_health(tree, out, t0[0], stop, engine_pid))
        {"engine": lambda: os.kill(engine_pid, sig), "server": lambda: os.kill(tree.pid, sig),
         "group": lambda: os.killpg(tree.pid, sig),
         "every process": lambda: _signal_every_process(tree.pid, sig)}[target]()
        deadline = time.monotonic() + (GRACE_S + 20) * TIME_FACTOR
        while time.monotonic() < deadline:
            if tree.proc.poll() is not None:
                out.exit_code, out.exited_at = tree.proc.returncode, time.perf_counter() - t0[0]
                break
            if target == "engine" and (out.recovered_at is not None or (
                    sig == signal.SIGINT and time.perf_counter() - t0[0] > 2 * REPLY_S + 1)):
                break
            await asyncio.sleep(0.02)
        stop.set()
        await asyncio.gather(watcher, return_exceptions=True)
        if tree.proc.poll() is None:  # the server lives on: it must serve a fresh session
            out.new_session_ok = await _fresh_session_works(tree)
            for task in tasks:  # the survivors of an ignored signal hang up now
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await _settle(tree)
            out.fd_growth, out.thread_growth = fds(tree.pid) - fd0, threads(tree.pid) - th0
            tree.proc.send_signal(signal.SIGTERM)  # then a clean stop ends the case
            out.stop_exit_code = tree.proc.wait(30 * TIME_FACTOR)
        else:
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True),
                                   10 * TIME_FACTOR)
        await asyncio.sleep(0)
        deadline = time.monotonic() + 5 * TIME_FACTOR  # an orphan notices within 0.5 s
        while True:
            members = session_members(tree.pid)
            if not members or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        out.left_alive = members
        out.new_shm = shm_entries() - tree.shm_before
        out.new_engine_dirs = tree.leftover_files()
        if out.new_engine_dirs:  # does the next start clean up after this tree?
            out.left_after_restart = await next_start_removes(tree.tmpdir)
        return out
    finally:
        tree.kill_all()


async def _settle(tree: ServeTree) -> None:
    """Wait until the server counts no session (closes land asynchronously)."""
    deadline = time.monotonic() + 10 * TIME_FACTOR
    async with httpx.AsyncClient(base_url=tree.base, timeout=2) as http:
        while True:
            if not (await http.get("/health")).json().get("sessions"):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("sessions did not close")
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)


async def next_start_removes(leftovers_of: str) -> set[str]:
    """Start a server in the temp dir a killed tree used; what is left of the old files
    once it is healthy (a new start removes orphaned pipe directories)."""
    tree = ServeTree(tmpdir=leftovers_of)
    try:
        before = tree.leftover_files()
        await tree.wait_healthy()
        return before & tree.leftover_files()
    finally:
        tree.kill_all()
