"""The browser voice-chat page at `/`: served with the right types, and a real headless
Chromium holding a spoken conversation with the real server (slow).

The browser test drives Debian's `chromium` over the Chrome DevTools Protocol (plain
`websockets`, no browser download). Chromium's fake microphone plays a WAV of espeak-ng
asking a question; the page must show the user's transcript and the reply, and schedule
the reply's audio for playback.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import wave
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import TIME_FACTOR
from starlette.testclient import TestClient

from voxline.config import load_settings
from voxline.engines.client import InProcessEngineClient
from voxline.realtime.app import create_app

ECHO = "voxline.engines.echo:make_echo_core"
SCREENSHOT = Path(tempfile.gettempdir()) / "voxline_web.png"


def test_page_and_script_are_served_with_their_types():
    app = create_app(load_settings(), InProcessEngineClient(ECHO))
    with TestClient(app) as client:
        page = client.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert "<button" in page.text and 'src="web/app.js"' in page.text
        script = client.get("/web/app.js")
        assert script.status_code == 200
        assert script.headers["content-type"] == "text/javascript; charset=utf-8"
        assert "input_audio_buffer.append" in script.text and "voxlineStats" in script.text
        assert client.get("/web/missing.js").status_code == 404


# ---------------------------------------------------------------------------------------
# Real browser, real server, real models
# ---------------------------------------------------------------------------------------


def chromium_path() -> str:
    found = os.environ.get("VOXLINE_CHROMIUM") or shutil.which("chromium") \
        or shutil.which("chromium-browser")
    if found:
        return found
    reason = "chromium is not installed (apt-get install chromium); needed for the browser test"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def fake_microphone_wav(path: Path, text: str, lead_s: float = 1.0, tail_s: float = 10.0) -> Path:
    """`text` spoken by espeak-ng between silences, as 48 kHz mono PCM16 (Chromium's fake
    capture device plays it; the long tail lets server VAD end the turn and the bot reply)."""
    import soxr
    from speech import espeak_wav

    with wave.open(str(espeak_wav(text)), "rb") as w:
        rate = w.getframerate()
        speech = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    speech = soxr.resample(speech, rate, 48000).astype(np.float32)
    audio = np.concatenate([np.zeros(int(lead_s * 48000), np.float32), speech,
                            np.zeros(int(tail_s * 48000), np.float32)])
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(48000)
        w.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    return path


class DevTools:
    """A minimal Chrome DevTools Protocol client for one page target."""

    def __init__(self, ws_url: str) -> None:
        from websockets.sync.client import connect

        self.ws = connect(ws_url, max_size=None, open_timeout=30)
        self.ids = itertools.count(1)
        self.console: list[str] = []

    def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == msg_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self._note(message)

    def _note(self, message: dict[str, Any]) -> None:
        params = message.get("params", {})
        if message.get("method") == "Runtime.consoleAPICalled":
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            self.console.append(f"console.{params['type']}: {args}")
        elif message.get("method") == "Runtime.exceptionThrown":
            self.console.append(f"exception: {params['exceptionDetails']}")
        elif message.get("method") == "Log.entryAdded":
            entry = params["entry"]
            self.console.append(f"{entry['level']}: {entry['text']}")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page JS failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        self.ws.close()


@contextmanager
def headless_chromium(microphone_wav: Path) -> Iterator[DevTools]:
    exe = chromium_path()
    profile = Path(tempfile.mkdtemp(prefix="voxline-chromium-"))
    args = [
        exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={microphone_wav}%noloop",
        "--autoplay-policy=no-user-gesture-required", "--window-size=900,900",
        f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    devtools: DevTools | None = None
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30 * TIME_FACTOR
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start: {proc.stderr.read().decode()[-2000:]}"
                                   if proc.poll() is not None else "chromium did not start")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = next(t for t in targets if t["type"] == "page")
        devtools = DevTools(page["webSocketDebuggerUrl"])
        devtools.call("Runtime.enable")
        devtools.call("Log.enable")
        yield devtools
    finally:
        if devtools is not None:
            devtools.close()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(profile, ignore_errors=True)


PAGE_STATE = """JSON.stringify({
  stats: window.voxlineStats,
  status: document.getElementById('status').textContent,
  log: [...document.querySelectorAll('#log li')].map(li => ({
    kind: li.className, text: li.querySelector('.text').textContent})),
})"""


@pytest.mark.slow
def test_browser_voice_chat_with_real_server(tmp_path: Path):
    chromium_path()
    wav = fake_microphone_wav(tmp_path / "question.wav", "What is the capital of France?")
    from live_server import live_server

    with live_server() as base, headless_chromium(wav) as page:
        page.call("Page.enable")
        page.call("Page.navigate", url=f"{base}/?autostart=1")
        deadline = time.monotonic() + 180 * TIME_FACTOR
        state: dict[str, Any] = {}
        while time.monotonic() < deadline:
            state = json.loads(page.evaluate(PAGE_STATE) or "{}")
            log, stats = state.get("log", []), state.get("stats") or {}
            heard = [e["text"] for e in log if e["kind"] == "user" and "capital" in e["text"].lower()]
            replies = [e["text"] for e in log if e["kind"].startswith("assistant")
                       and "pending" not in e["kind"] and e["text"].strip()]
            if heard and replies and stats.get("samplesScheduled", 0) > 0:
                break
            assert not [e for e in log if e["kind"] == "error"], (state, page.console)
            time.sleep(0.25)
        else:
            pytest.fail(f"no spoken turn in the page: {state}\nconsole: {page.console}")
        time.sleep(1.0)  # let a little of the reply play before the screenshot
        shot = page.call("Page.captureScreenshot", format="png")
        SCREENSHOT.write_bytes(base64.b64decode(shot["data"]))
        stats = json.loads(page.evaluate("JSON.stringify(window.voxlineStats)"))

    assert stats["deltasReceived"] > 0 and stats["samplesReceived"] > 0
    # Every received sample was scheduled for playback (no barge-in happened in this turn).
    assert stats["samplesScheduled"] == stats["samplesReceived"]
    assert stats["chunksSent"] > 0 and stats["errors"] == 0
    assert stats["speechStarted"] >= 1 and stats["userTranscripts"] >= 1
