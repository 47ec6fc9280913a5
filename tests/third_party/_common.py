"""Shared by the third-party client drivers (run with the clients venv's python, not the
project's): reading the test's speech, a real-time microphone, and a recorder that sits
on the client's own WebSocket so the summary shows exactly what went over the wire."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time
import wave
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

RATE = 24000  # the realtime API's PCM16 rate, which both clients send and expect
CHUNK_MS = 20


def load_pcm24k(path: str) -> bytes:
    """A mono PCM16 WAV as raw 24 kHz PCM16 (the test writes 24 kHz; resample otherwise)."""
    with wave.open(path, "rb") as w:
        rate, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
        data = w.readframes(w.getnframes())
    if width != 2 or channels != 1:
        raise ValueError(f"{path}: need mono PCM16, got {channels} ch x {8 * width} bit")
    if rate != RATE:
        import numpy as np
        import soxr

        audio = np.frombuffer(data, "<i2").astype(np.float32) / 32768.0
        out = soxr.resample(audio, rate, RATE)
        data = (np.clip(out, -1, 1) * 32767).astype("<i2").tobytes()
    return data


def audio_ms(nbytes: int) -> float:
    return nbytes / 2 / RATE * 1000


class Mic:
    """A microphone: streams 20 ms chunks at real time, silence unless `say` queued speech.

    A real mic never stops sending, and the server's VAD needs the trailing silence to
    end a turn, so the stream runs from `start` to `stop`."""

    def __init__(self, push: Callable[[bytes], Awaitable[None]]) -> None:
        self._push = push
        self._pending = bytearray()
        self._done: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def say(self, pcm: bytes) -> None:
        """Queue speech and return once its last chunk went out."""
        self._done = asyncio.Event()
        self._pending.extend(pcm)
        await self._done.wait()

    async def _run(self) -> None:
        size = RATE * 2 * CHUNK_MS // 1000
        t = time.monotonic()
        while True:
            if self._pending:
                chunk = bytes(self._pending[:size]).ljust(size, b"\0")
                del self._pending[:size]
                if not self._pending and self._done:
                    self._done.set()
            else:
                chunk = bytes(size)
            await self._push(chunk)
            t += CHUNK_MS / 1000
            await asyncio.sleep(max(0.0, t - time.monotonic()))


def _elide(event: dict[str, Any]) -> dict[str, Any]:
    """Drop base64 payloads so the summary stays readable."""
    out = dict(event)
    for key in ("audio", "delta"):
        if isinstance(out.get(key), str) and len(out[key]) > 64:
            out[key] = f"<{len(out[key])} b64 chars>"
    return out


class WireLog:
    """Every event each way, per-response bookkeeping, and waits on what the server said."""

    def __init__(self, client: str) -> None:
        self.client = client
        self.t0 = time.monotonic()
        self.sent: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        self.timeline: list[str] = []
        self.responses: dict[str, dict[str, Any]] = {}
        self.phase = "connect"
        self.failure: str | None = None
        self.abort: str | None = None  # set when the client gave up; waits stop early
        # client-side errors the library reported, deduplicated (a dead socket repeats one)
        self._notes: Counter[str] = Counter()
        self.item_audio: Counter[str] = Counter()  # PCM bytes the server sent, per item
        self._changed = asyncio.Event()

    def _stamp(self) -> str:
        return f"{time.monotonic() - self.t0:7.2f}"

    def on_sent(self, message: str | bytes) -> None:
        event = json.loads(message)
        self.sent.append(_elide(event))
        if event.get("type") != "input_audio_buffer.append":
            self.timeline.append(f"{self._stamp()} > {_short(event)}")

    def on_received(self, message: str | bytes) -> None:
        event = json.loads(message)
        kind = event.get("type", "?")
        if kind == "response.created":
            rid = event["response"]["id"]
            self.responses[rid] = {"id": rid, "phase": self.phase, "status": None,
                                   "audio_bytes": 0, "transcript": "", "text": ""}
        elif kind in ("response.output_audio.delta", "response.output_audio_transcript.delta",
                      "response.output_text.delta"):
            r = self.responses.get(event.get("response_id", ""))
            if r is not None:
                if kind == "response.output_audio.delta":
                    n = len(base64.b64decode(event["delta"]))
                    r["audio_bytes"] += n
                    self.item_audio[event.get("item_id", "")] += n
                elif kind == "response.output_audio_transcript.delta":
                    r["transcript"] += event["delta"]
                else:
                    r["text"] += event["delta"]
        elif kind == "response.done":
            resp = event["response"]
            r = self.responses.setdefault(resp["id"], {"id": resp["id"], "phase": self.phase,
                                                       "audio_bytes": 0, "transcript": "",
                                                       "text": ""})
            r["status"] = resp.get("status")
            r["status_details"] = resp.get("status_details")
        self.received.append(_elide(event))
        if not kind.endswith(".delta"):
            self.timeline.append(f"{self._stamp()} < {_short(event)}")
        self._changed.set()

    def note(self, text: str) -> None:
        self._notes[text[:500]] += 1

    @property
    def notes(self) -> list[str]:
        return [f"{text} (x{n})" if n > 1 else text for text, n in self._notes.most_common(20)]

    def mark(self, phase: str) -> None:
        self.phase = phase
        self.timeline.append(f"{self._stamp()} -- phase {phase}")

    async def wait_for(self, what: str, pred: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if self.abort:
                raise RuntimeError(f"{self.abort} (while waiting for {what})")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(left, 0.5))
            except TimeoutError:
                pass

    def phase_responses(self, phase: str) -> list[dict[str, Any]]:
        return [r for r in self.responses.values() if r["phase"] == phase]

    def done_in(self, phase: str, status: str | None = None) -> bool:
        return any(r["status"] is not None and (status is None or r["status"] == status)
                   for r in self.phase_responses(phase))

    def audio_in(self, phase: str) -> bool:
        return any(r["audio_bytes"] > 0 for r in self.phase_responses(phase))

    def summary(self) -> dict[str, Any]:
        of = lambda kind, events: [e for e in events if e.get("type") == kind]  # noqa: E731
        return {
            "client": self.client,
            "failure": self.failure,
            "server_event_types": dict(Counter(e.get("type") for e in self.received)),
            "client_event_types": dict(Counter(e.get("type") for e in self.sent)),
            "errors": of("error", self.received),
            "session_updates": of("session.update", self.sent),
            "truncates": of("conversation.item.truncate", self.sent),
            "cancels": of("response.cancel", self.sent),
            "truncated": of("conversation.item.truncated", self.received),
            "other_sent": [e for e in self.sent if e.get("type") not in (
                "input_audio_buffer.append", "session.update")],
            "session": (of("session.updated", self.received) or [{}])[-1].get("session"),
            "responses": list(self.responses.values()),
            "item_audio_ms": {k: round(audio_ms(v)) for k, v in self.item_audio.items()},
            "notes": self.notes,
            "timeline": self.timeline,
        }

    def emit(self) -> None:
        print(json.dumps(self.summary()), flush=True)


def _short(event: dict[str, Any]) -> str:
    """One line per event for the timeline: type plus the fields that matter for barge-in."""
    keys = ("item_id", "content_index", "audio_end_ms", "audio_start_ms", "response_id")
    bits = [f"{k}={event[k]}" for k in keys if k in event]
    if event.get("type") == "response.done":
        bits.append(f"status={event['response'].get('status')}")
    if event.get("type") == "error":
        bits.append(json.dumps(event.get("error")))
    return " ".join([event.get("type", "?"), *bits])


class RecordingSocket:
    """Wraps a `websockets` client connection: logs each frame sent and received and
    otherwise behaves like the connection (the clients use send, async iteration, close)."""

    def __init__(self, ws: Any, log: WireLog) -> None:
        self._ws = ws
        self._log = log

    async def send(self, message: Any, *args: Any, **kwargs: Any) -> None:
        self._log.on_sent(message)
        await self._ws.send(message, *args, **kwargs)

    async def recv(self, *args: Any, **kwargs: Any) -> Any:
        message = await self._ws.recv(*args, **kwargs)
        self._log.on_received(message)
        return message

    def __aiter__(self) -> Any:
        return self._iterate()

    async def _iterate(self) -> Any:
        async for message in self._ws:
            self._log.on_received(message)
            yield message

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ws, name)


def parse_args(argv: list[str]) -> tuple[str, str, str, float]:
    """URL QUESTION_WAV BARGE_WAV [TIMEOUT_S]."""
    if len(argv) not in (4, 5):
        sys.exit(f"usage: {argv[0]} WS_BASE_URL QUESTION_WAV BARGE_WAV [TIMEOUT_S]")
    url, question, barge = argv[1:4]
    if not url.startswith(("ws://127.0.0.1:", "ws://localhost:")):
        sys.exit("refusing a non-loopback server URL")
    return url, question, barge, float(argv[4]) if len(argv) == 5 else 120.0
