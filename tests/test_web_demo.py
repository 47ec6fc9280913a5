"""The browser voice-chat page at `/`: served with the right types, and a real headless
Chromium holding a spoken conversation with the real server (slow).

The browser test drives Debian's `chromium` over the Chrome DevTools Protocol (plain
`websockets`, no browser download). Chromium's fake microphone plays a WAV of espeak-ng
asking a question; the page must show the user's transcript and the reply, and play the
reply's audio: over WebRTC (the page's default) the reply track must turn audible, over
the WebSocket (`?transport=websocket`) every received sample must be played out.

WebRTC stays on this machine: the server offers only 127.0.0.1 (`ice_hosts`), and
Chromium's checks go to it. Chromium never gathers on loopback, so its own end is its
socket on this machine's interface address (packets between the two go over `lo`).
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import wave
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import TIME_FACTOR
from starlette.testclient import TestClient
from websockets.sync.client import ClientConnection, connect

from voxline.config import load_settings
from voxline.engines.client import InProcessEngineClient
from voxline.realtime.app import create_app

ECHO = "echo_core:make_echo_core"
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
        assert "v1/realtime/calls" in script.text and "oai-events" in script.text
        assert client.head("/").status_code == 200
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


def fake_microphone_wav(path: Path, phrases: tuple[tuple[str, float], ...],
                        lead_s: float = 1.0) -> Path:
    """Each phrase spoken by espeak-ng and followed by its seconds of silence, as 48 kHz
    mono PCM16 for Chromium's fake capture device (played once: `%noloop`)."""
    import soxr
    from speech import espeak_wav

    parts = [np.zeros(int(lead_s * 48000), np.float32)]
    for text, silence_s in phrases:
        with wave.open(str(espeak_wav(text)), "rb") as w:
            rate = w.getframerate()
            pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
        parts += [soxr.resample(pcm, rate, 48000).astype(np.float32),
                  np.zeros(int(silence_s * 48000), np.float32)]
    audio = np.concatenate(parts)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(48000)
        w.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    return path


class DevTools:
    """A minimal Chrome DevTools Protocol client for one page target."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.console: list[str] = []
        self.loaded = False

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

    def navigate(self, url: str, timeout: float = 30.0) -> None:
        """Open `url` and wait for its load event (so page JS is there to evaluate)."""
        self.call("Page.enable")
        self.loaded = False
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout * TIME_FACTOR
        while not self.loaded:
            self._note(json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic()))))

    def _note(self, message: dict[str, Any]) -> None:
        params = message.get("params", {})
        if message.get("method") == "Page.loadEventFired":
            self.loaded = True
        elif message.get("method") == "Runtime.consoleAPICalled":
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


@contextmanager
def headless_chromium(microphone_wav: Path | None = None) -> Iterator[DevTools]:
    exe = chromium_path()
    profile = Path(tempfile.mkdtemp(prefix="voxline-chromium-"))
    args = [
        exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
        *([f"--use-file-for-fake-audio-capture={microphone_wav}%noloop"] if microphone_wav else []),
        "--autoplay-policy=no-user-gesture-required",
        # WebRTC: plain host candidates, no mDNS names for aiortc to resolve by multicast,
        # and loopback gathered too (Chromium leaves it out by default).
        "--disable-features=WebRtcHideLocalIpsWithMdns", "--allow-loopback-in-peer-connection",
        "--window-size=900,900",
        f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
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
        with connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
            devtools = DevTools(ws)
            devtools.call("Runtime.enable")
            devtools.call("Log.enable")
            yield devtools
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(profile, ignore_errors=True)


PAGE_STATE = """JSON.stringify({
  stats: window.voxlineStats,
  status: document.getElementById('status')?.textContent ?? '',
  log: [...document.querySelectorAll('#log li')].map(li => ({
    kind: li.className, text: li.querySelector('.text').textContent})),
})"""


def page_state(page: DevTools) -> dict[str, Any]:
    return json.loads(page.evaluate(PAGE_STATE) or "{}")


def wait_for(page: DevTools, done: Callable[[dict[str, Any]], bool], what: str,
             timeout: float = 180.0) -> dict[str, Any]:
    """Poll the page until `done(state)`; fail on an error entry or after the timeout."""
    deadline = time.monotonic() + timeout * TIME_FACTOR
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        state = page_state(page)
        errors = [e for e in state.get("log", []) if e["kind"] == "error"]
        assert not errors, f"page shows errors: {state}\nconsole: {page.console}"
        if done(state):
            return state
        time.sleep(0.25)
    pytest.fail(f"page never showed {what}: {state}\nconsole: {page.console}")


def entries(state: dict[str, Any], kind: str) -> list[dict[str, str]]:
    return [e for e in state.get("log", []) if e["kind"].split()[0] == kind]


@contextmanager
def voice_chat(tmp_path: Path, *phrases: tuple[str, float], transport: str = "websocket",
               query: str = "", **server: object) -> Iterator[DevTools]:
    """The real server (`server`: settings overrides) and a headless Chromium on
    `/?autostart=1&transport=...` plus `query`, whose microphone says each phrase, then
    stays silent for its number of seconds."""
    chromium_path()
    wav = fake_microphone_wav(tmp_path / "microphone.wav", phrases)
    from live_server import live_server

    with live_server(ice_hosts="127.0.0.1", **server) as base, headless_chromium(wav) as page:
        page.navigate(f"{base}/?autostart=1&transport={transport}{query}")
        yield page


@pytest.mark.slow
def test_browser_voice_chat_with_real_server(tmp_path: Path):
    def answered_and_played(state: dict[str, Any]) -> bool:
        stats = state.get("stats") or {}
        heard = [e for e in entries(state, "user") if "capital" in e["text"].lower()]
        replies = [e for e in entries(state, "assistant")
                   if "pending" not in e["kind"] and e["text"].strip()]
        return bool(heard and replies and stats.get("responsesDone")
                    and 0 < stats["samplesScheduled"] == stats["samplesPlayed"])

    with voice_chat(tmp_path, ("What is the capital of France?", 10.0)) as page:
        state = wait_for(page, answered_and_played, "a spoken question, its answer and its audio")
        shot = page.call("Page.captureScreenshot", format="png")
        SCREENSHOT.write_bytes(base64.b64decode(shot["data"]))

    stats = state["stats"]
    assert stats["deltasReceived"] > 0 and stats["chunksSent"] > 0 and stats["errors"] == 0
    # Every received sample was scheduled and played out by the browser's audio clock.
    assert stats["samplesPlayed"] == stats["samplesScheduled"] == stats["samplesReceived"]
    assert stats["speechStarted"] == 1 and stats["playbackStops"] == 0
    assert state["status"].startswith("listening")
    assert_latency_counts_from_the_end_of_speech(state)


def assert_latency_counts_from_the_end_of_speech(state: dict[str, Any]) -> None:
    """The latency line counts from the end of the speech itself (the microphone's last
    voiced block), not from speech_stopped, which comes after the turn detector's silence
    window (the page asks for semantic VAD: at least its 200 ms agreed pause at `auto`):
    that window lies inside what it reports, and the line says both."""
    stats = state["stats"]
    line, = [e["text"] for e in entries(state, "system") if "first audio" in e["text"]]
    assert line.startswith("end of speech → first audio: ") and "(after speech_stopped: " in line
    total, after = stats["latenciesMs"][0], stats["afterStoppedMs"][0]
    print(f"page latency line: {line}")
    assert total >= after + 100, (total, after)  # (less a VAD tail's worth of the window)


IN_LOOPBACK_NAMESPACE = "VOXLINE_TEST_LOOPBACK_NETNS"


def run_in_loopback_namespace(test: str) -> None:
    """Run the pytest node `test` in a network namespace of its own whose only interface
    is loopback (`IN_LOOPBACK_NAMESPACE` set), and assert it passed."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.fail("the WebRTC browser test needs unshare and ip (util-linux, iproute2)")
    run = subprocess.run(
        ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
         sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", test],
        env={**os.environ, IN_LOOPBACK_NAMESPACE: "1"}, capture_output=True, text=True,
        timeout=600 * TIME_FACTOR)
    print(run.stdout[-3000:])
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "1 passed" in run.stdout


@pytest.mark.slow
def test_browser_voice_chat_over_webrtc():
    """The WebRTC turn runs in a network namespace of its own whose only interface is
    loopback, so browser and server can use nothing but 127.0.0.1 (Chromium would otherwise
    send from this machine's interface address)."""
    run_in_loopback_namespace(f"{Path(__file__).resolve()}::test_webrtc_turn_in_loopback_namespace")


@pytest.mark.slow
def test_webrtc_turn_in_loopback_namespace(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """The page's default transport: mic track up, reply track down, events on oai-events."""
    if os.environ.get(IN_LOOPBACK_NAMESPACE) != "1":
        pytest.skip("run by test_browser_voice_chat_over_webrtc in its own network namespace")
    caplog.set_level(logging.INFO, logger="aioice.ice")  # the server's ICE checks
    def answered_and_heard(state: dict[str, Any]) -> bool:
        stats = state.get("stats") or {}
        heard = [e for e in entries(state, "user") if "capital" in e["text"].lower()]
        replies = [e for e in entries(state, "assistant")
                   if "pending" not in e["kind"] and e["text"].strip()]
        return bool(heard and replies and stats.get("responsesDone")
                    and stats.get("latenciesMs") and state["status"].startswith("listening"))

    started = time.monotonic()
    with voice_chat(tmp_path, ("What is the capital of France?", 10.0),
                    transport="webrtc") as page:
        state = wait_for(page, answered_and_heard, "a spoken question, its answer and its audio")
        # the reply's tail may still be in the jitter buffer: read the stats once the page
        # has metered another half second of the track (25 blocks of 20 ms)
        seen = state["stats"]["framesReceived"]
        stats = wait_for(page, lambda s: s["stats"]["framesReceived"] >= seen + 25,
                         "the reply track metered past the reply")["stats"]
    print(f"webrtc page: end of speech -> first audio {stats['latenciesMs']} ms, "
          f"{stats['audibleFrames']} audible 20 ms frames of {stats['framesReceived']}, "
          f"pair {stats['candidatePair']}, {time.monotonic() - started:.1f} s in all")
    assert stats["transport"] == "webrtc" and stats["errors"] == 0
    assert [e for e in entries(state, "system") if "first audio" in e["text"]]
    # Reply audio came down the track and was audible for a while (seconds of speech),
    # and nothing went through the WebSocket path.
    assert stats["audibleFrames"] >= 25 and stats["framesReceived"] > stats["audibleFrames"]
    assert stats["deltasReceived"] == 0 and stats["chunksSent"] == 0
    assert stats["outputStarted"] >= 1 and stats["speechStarted"] == 1
    assert stats["playbackStops"] == 0
    assert 0 < stats["latenciesMs"][0] < 60_000
    assert_latency_counts_from_the_end_of_speech({**state, "stats": stats})
    # Loopback only: the browser used the server's 127.0.0.1 candidate, and every pair the
    # server checked ran between 127.0.0.1 sockets.
    assert stats["candidatePair"]["remote"].startswith("127.0.0.1:"), stats["candidatePair"]
    pairs = set(re.findall(r"CandidatePair\(\('([^']*)', \d+\) -> \('([^']*)', \d+\)\)",
                           caplog.text))
    assert pairs and all(a == b == "127.0.0.1" for a, b in pairs), pairs


@pytest.mark.slow
def test_talking_over_the_reply_stops_playback(tmp_path: Path):
    story = "Tell me a long story about a brave knight and a dragon."
    with voice_chat(tmp_path, (story, 7.0), ("Stop. What is two plus two?", 10.0)) as page:
        state = wait_for(page, lambda s: (s.get("stats") or {}).get("playbackStops", 0) >= 1,
                         "playback stopped by barge-in")
        stopped = state["stats"]
        assert stopped["speechStarted"] >= 2
        assert [e for e in entries(state, "assistant") if "interrupted" in e["kind"]]
        # the barrier: every reply created before the stop has ended (response.done), so
        # the server sends no more of the interrupted reply's audio after this point
        after = wait_for(page, lambda s: s["stats"]["responsesDone"] >= stopped["responsesCreated"],
                         "the interrupted reply's response.done")["stats"]
    # The stop cut audio that was still queued, and nothing more of the interrupted reply
    # was scheduled afterwards (only a new reply, to the second question, may play).
    assert stopped["samplesPlayed"] < stopped["samplesScheduled"]
    assert (after["samplesScheduled"] == stopped["samplesScheduled"]
            or after["responsesCreated"] > stopped["responsesCreated"])


@contextmanager
def not_ready_server(**settings: Any) -> Iterator[int]:
    """A server whose engine never becomes ready (`settings`: overrides); yields its port."""
    import threading

    import uvicorn
    from live_server import free_port

    app = create_app(load_settings(**settings), InProcessEngineClient(ECHO),
                     manage_engine=False)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           ws="websockets-sansio"))
    thread = threading.Thread(target=server.run, name="not-ready-server")
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive()
            time.sleep(0.05)
        yield port
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.mark.slow
def test_page_shows_why_the_server_refused_a_webrtc_call():
    """Over WebRTC the refusal is the call's 503 answer; the page says why."""
    chromium_path()
    state: dict[str, Any] = {}
    with not_ready_server() as port, headless_chromium() as page:
        page.navigate(f"http://127.0.0.1:{port}/?autostart=1")
        deadline = time.monotonic() + 30 * TIME_FACTOR
        while time.monotonic() < deadline:
            state = page_state(page)
            if state.get("stats", {}).get("state") == "error":
                break
            time.sleep(0.1)
    assert state["status"].startswith("could not start") and "engine is not ready" in state["status"]
    assert state["stats"]["transport"] == "webrtc"
    assert [e for e in entries(state, "error") if "server busy or not ready" in e["text"]]


@pytest.mark.slow
def test_page_shows_why_the_server_closed():
    """An engine that is not ready closes the socket with 1013 and a reason the page shows."""
    chromium_path()
    state: dict[str, Any] = {}
    with not_ready_server() as port, headless_chromium() as page:
        page.navigate(f"http://127.0.0.1:{port}/?autostart=1&transport=websocket")
        deadline = time.monotonic() + 30 * TIME_FACTOR
        while time.monotonic() < deadline:
            state = page_state(page)
            if state.get("stats", {}).get("lastClose"):
                break
            time.sleep(0.1)
    assert state["stats"]["lastClose"]["code"] == 1013
    assert state["status"].startswith("disconnected") and "engine is not ready" in state["status"]
    assert [e for e in entries(state, "error") if "1013" in e["text"]]
