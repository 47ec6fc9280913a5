"""How fast `voxline serve` starts, cold and warm, and comes back after its engine dies.

    python benchmarks/gpu_serving/bench_gpu_start.py /tmp/ckpt --out OUT/start.json
    python benchmarks/gpu_serving/bench_gpu_start.py --tiny --out /tmp/start.json   # CPU smoke

Three arms, one after the other, each within its own budget (the defaults add up to
under 9 minutes):

- **cold**: ``voxline serve`` with a fresh ``--cache`` folder (no compile cache, no
  converted weights): seconds from the server's spawn until ``/health`` answers 200, the
  engine's ``start-up phase`` lines, and, with ``background_graphs=auto``, until the
  buckets left for after ready are all captured (``... graphs in the background``).
- **warm**: a second server on the same folder: the same numbers.
- **crash**: on that warm server, under light load (``voxline bench`` text turns, a few
  sessions), the engine process is SIGKILLed; then a new ``/v1/realtime`` session is
  tried every quarter second: seconds until one gets ``session.created``, until
  ``/health`` is 200, and the server's ``engine back after S s (restart #k)``.

The GPU arms serve the random real-shape checkpoints of ``bench_gpu_serve.py build CKPT``
(Qwen3-TTS-1.7B-shaped TTS, Llama-1B-shaped LLM, Moonshine on the GPU) with
``--serve-args`` added (the capacity flags of the run to compare with, e.g.
``--max-sessions 64 --tts-max-streams 64``). ``--tiny`` serves the CPU default models
(no checkpoint): the same code path, for a smoke run on a machine without a GPU. The
JSON at ``--out`` holds every arm's numbers and phases; each server's log is beside it
(``<out stem>_<arm>.log``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

PHASE = re.compile(r"start-up phase: (?P<name>.+): (?P<s>[0-9.]+) s$")
ENGINE_READY = re.compile(r"engine process ready after (?P<s>[0-9.]+) s")
ENGINE_BACK = re.compile(r"engine back after (?P<s>[0-9.]+) s \(restart #(?P<k>\d+)\)")
LEFT = re.compile(r"(?P<name>\w+): (?P<n>\d+) graph buckets left for after ready")
BACKGROUND_DONE = re.compile(r"start-up phase: (?P<name>\w+) graphs in the background")
BUDGETS = {"cold": 270.0, "warm": 110.0, "crash": 90.0}  # seconds; 470 in all, + stops


def log_lines(log: Path) -> list[str]:
    return log.read_text(errors="replace").splitlines() if log.exists() else []


def phases(lines: list[str]) -> list[dict[str, object]]:
    """Every ``start-up phase: NAME: S.S s`` line, in order."""
    out = []
    for line in lines:
        if (m := PHASE.search(line)) is not None:
            out.append({"phase": m["name"], "s": float(m["s"])})
    return out


def health(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read())
        except ValueError:
            return exc.code, {}
    except (OSError, ValueError):
        return 0, {}


async def _try_session(ws_url: str) -> str:
    import websockets

    try:
        async with asyncio.timeout(3.0), websockets.connect(ws_url, max_size=None) as ws:
            first = json.loads(await ws.recv())
            kind = first.get("type", "?")
            if kind == "error":
                return f"error: {first.get('error', {}).get('message', '')}"
            return kind
    except (OSError, TimeoutError) as exc:
        return f"{type(exc).__name__}"
    except Exception as exc:  # refused handshakes and closes: the server said no
        return f"{type(exc).__name__}: {exc}"


def try_session(url: str) -> str:
    """One new /v1/realtime session: its first event's type, or why there was none."""
    return asyncio.run(_try_session("ws" + url[len("http"):] + "/v1/realtime"))


class Server:
    """One `voxline serve` in its own process group, its output in `log`."""

    def __init__(self, cmd: list[str], log: Path) -> None:
        self.log = log
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                     start_new_session=True)

    def wait_ready(self, url: str, deadline: float) -> float | None:
        """Seconds from spawn until /health says ok; None past `deadline` or on exit."""
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                return None
            if health(url)[0] == 200:
                return time.perf_counter() - self.t0
            time.sleep(0.25)
        return None

    def wait_background(self, deadline: float) -> float | None:
        """Seconds from spawn until every backfill announced in the log logged its end
        (0 when none was announced); None past `deadline`."""
        while time.perf_counter() < deadline and self.proc.poll() is None:
            lines = log_lines(self.log)
            left = {m["name"] for ln in lines if (m := LEFT.search(ln)) is not None}
            done = {m["name"] for ln in lines if (m := BACKGROUND_DONE.search(ln)) is not None}
            if left <= done:
                return time.perf_counter() - self.t0 if left else 0.0
            time.sleep(0.5)
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Nothing listens on `port` (connections of a server just stopped may linger)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def parent_pid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def serve_cmd(args: argparse.Namespace, cache: Path) -> list[str]:
    cmd = [sys.executable, "-m", "voxline.cli", "serve", "--port", str(args.port),
           "--cache", str(cache), "--engine", "process"]
    if not args.tiny:
        cmd += ["--device", "cuda", "--tts", f"qwen3:{args.ckpt}/tts",
                "--llm-checkpoint", f"{args.ckpt}/llm", "--tts-max-frames", "188"]
    return [*cmd, *args.serve_args.split()]


def start_arm(name: str, args: argparse.Namespace, cache: Path, out: Path,
              budget: float, wait_background: bool) -> tuple[dict[str, object], Server | None]:
    """Start a server and time it to ready (and, if asked, to its last background
    graph); returns the arm's numbers and the running server (None if it never got
    ready), which the caller stops."""
    url = f"http://127.0.0.1:{args.port}"
    log = out.with_name(f"{out.stem}_{name}.log")
    print(f"== {name}: {' '.join(serve_cmd(args, cache)[3:])}", flush=True)
    if not port_is_free(args.port):  # /health would be another server's
        return {"error": f"port {args.port} is taken by another process"}, None
    server = Server(serve_cmd(args, cache), log)
    deadline = server.t0 + budget
    ready = server.wait_ready(url, deadline)
    lines = log_lines(log)
    result: dict[str, object] = {"ready_s": None if ready is None else round(ready, 1),
                                 "budget_s": budget, "log": log.name}
    if ready is None:
        result["error"] = ("server exited" if server.proc.poll() is not None
                           else f"not ready within {budget:.0f} s")
        print(f"== {name}: {result['error']}; last lines:\n" + "\n".join(lines[-20:]), flush=True)
        server.stop()
        return result, None
    engine = [float(m["s"]) for ln in lines if (m := ENGINE_READY.search(ln)) is not None]
    result["engine_ready_s"] = engine[-1] if engine else None
    print(f"== {name}: ready after {ready:.1f} s (engine process {result['engine_ready_s']} s)",
          flush=True)
    if wait_background:
        done = server.wait_background(deadline)
        result["all_graphs_s"] = None if done is None else round(done, 1)
        print(f"== {name}: background graphs done after {result['all_graphs_s']} s", flush=True)
    lines = log_lines(log)
    result["phases"] = phases(lines)
    result["compile_cache"] = next((ln.split("torch.compile cache: ", 1)[1] for ln in lines
                                    if "torch.compile cache: " in ln), None)
    for p in result["phases"]:  # type: ignore[union-attr]
        print(f"   {p['phase']}: {p['s']} s", flush=True)
    return result, server


def crash_arm(args: argparse.Namespace, server: Server, budget: float) -> dict[str, object]:
    """SIGKILL the engine under light load; time until a new session is accepted."""
    url = f"http://127.0.0.1:{args.port}"
    t_arm = time.perf_counter()
    load = subprocess.Popen(
        [sys.executable, "-m", "voxline.cli", "bench", "--url", url, "--quiet", "--input",
         "text", "--concurrency", str(args.load_sessions), "--requests", "10000",
         "--timeout", "60", "--max-output-tokens", "20"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    result: dict[str, object] = {"budget_s": budget, "load_sessions": args.load_sessions}
    try:
        time.sleep(args.load_s)
        pid = health(url)[1].get("engine", {}).get("pid")
        if not pid or parent_pid(int(pid)) != server.proc.pid:  # only our server's engine
            result["error"] = f"engine pid {pid} from /health is not a child of our server"
            return result
        result["open_streams_at_kill"] = health(url)[1].get("engine", {}).get("open_streams")
        before = len(log_lines(server.log))
        os.kill(int(pid), signal.SIGKILL)
        t_kill = time.perf_counter()
        print(f"== crash: SIGKILL to engine process {pid}", flush=True)
        deadline = t_arm + budget
        refusals: dict[str, int] = {}
        accepted = health_ok = None
        down = None  # when /health first said the engine was not ready
        while time.perf_counter() < deadline and accepted is None:
            code, body = health(url)
            now = time.perf_counter() - t_kill
            if code != 200 and down is None:
                down = now
            new_engine = body.get("engine", {}).get("pid") not in (None, int(pid))
            if code == 200 and new_engine:
                if health_ok is None:
                    health_ok = now
                # a session the new engine process accepts (before it is seen, the
                # server still takes the killed one for alive)
                kind = try_session(url)
                if kind == "session.created":
                    accepted = time.perf_counter() - t_kill
                    continue
            else:
                kind = "engine down" if code != 200 else "killed engine not yet seen"
            refusals[kind[:80]] = refusals.get(kind[:80], 0) + 1
            time.sleep(0.25)
        result["down_seen_s"] = None if down is None else round(down, 2)
        lines = log_lines(server.log)[before:]
        back = [(float(m["s"]), int(m["k"])) for ln in lines
                if (m := ENGINE_BACK.search(ln)) is not None]
        result.update({
            "session_accepted_s": None if accepted is None else round(accepted, 2),
            "health_ok_s": None if health_ok is None else round(health_ok, 2),
            "engine_back_s": back[-1][0] if back else None,
            "restart": back[-1][1] if back else None,
            "refused_meanwhile": refusals, "phases": phases(lines)})
        if accepted is None:
            result["error"] = f"no session accepted within {budget:.0f} s of the arm"
        print(f"== crash: new session accepted {result['session_accepted_s']} s after the "
              f"kill (health {result['health_ok_s']} s, engine back {result['engine_back_s']} s)",
              flush=True)
        return result
    finally:
        os.killpg(load.pid, signal.SIGKILL)
        load.wait(10)


def device_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip() or "cpu"
    except (OSError, subprocess.TimeoutExpired):
        return "cpu"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ckpt", nargs="?", help="bench_gpu_serve.py build's folder (not with --tiny)")
    parser.add_argument("--out", required=True, help="the JSON to write (logs beside it)")
    parser.add_argument("--tiny", action="store_true", help="CPU default models, no checkpoint")
    parser.add_argument("--serve-args", default="", help="more `voxline serve` flags")
    parser.add_argument("--port", type=int, default=0,
                        help="the servers' port (default: a free one)")
    parser.add_argument("--cache", default=None, help="the fresh cache folder of the cold "
                        "arm (default: a new temporary one; removed at the end unless given)")
    parser.add_argument("--arms", default="cold,warm,crash",
                        help="comma-separated subset, in this order (warm and crash reuse "
                             "the cache the cold arm filled, or --cache)")
    for arm, s in BUDGETS.items():
        parser.add_argument(f"--{arm}-budget", type=float, default=s,
                            help=f"seconds for the {arm} arm (default: %(default)s)")
    parser.add_argument("--load-sessions", type=int, default=4,
                        help="text sessions running when the engine is killed")
    parser.add_argument("--load-s", type=float, default=5.0,
                        help="seconds of load before the kill")
    args = parser.parse_args(argv)
    if not args.tiny and not args.ckpt:
        parser.error("CKPT is needed (or --tiny)")
    arms = [a for a in args.arms.split(",") if a]
    if unknown := set(arms) - set(BUDGETS):
        parser.error(f"unknown arms {sorted(unknown)}; choose from {list(BUDGETS)}")
    args.port = args.port or free_port()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cache = Path(args.cache) if args.cache else Path(tempfile.mkdtemp(prefix="voxline-start-"))
    report: dict[str, object] = {
        "device": device_name(), "tiny": args.tiny, "serve_args": args.serve_args,
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "cache": str(cache),
        "arms": {}}
    results: dict[str, object] = report["arms"]  # type: ignore[assignment]
    t0 = time.perf_counter()
    server: Server | None = None
    try:
        for arm in arms:
            budget = getattr(args, f"{arm}_budget")
            if arm == "crash":
                if server is None:
                    results["crash"], server = start_arm("crash_start", args, cache, out,
                                                         budget, wait_background=False)
                    if server is None:
                        continue
                results["crash"] = crash_arm(args, server, budget)
                continue
            if server is not None:
                server.stop()
                server = None
            results[arm], server = start_arm(arm, args, cache, out, budget,
                                             wait_background=True)
            out.write_text(json.dumps(report, indent=1))
    finally:
        if server is not None:
            server.stop()
        if not args.cache:
            shutil.rmtree(cache, ignore_errors=True)
    report["total_s"] = round(time.perf_counter() - t0, 1)
    out.write_text(json.dumps(report, indent=1))
    print(f"== wrote {out} ({report['total_s']} s in all)", flush=True)
    failed = [a for a, r in results.items() if isinstance(r, dict) and "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
