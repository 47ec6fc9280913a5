"""A Twilio Media Streams stand-in: a WebSocket client that speaks Twilio's exact JSON
shapes, sends caller audio as 20 ms μ-law frames in real time, and plays what it gets
back like Twilio does (a `mark` is echoed once the audio before it has played; `clear`
drops the buffered audio and echoes every outstanding mark at once)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections import deque
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
from websockets.asyncio.client import connect

from voxline.codecs.g711 import float_to_ulaw, ulaw_to_float

FRAME = 160  # 20 ms at 8 kHz
STREAM_SID = "MZ18ad3ab5a668481ce02b83e7395059f0"
CALL_SID = "CA2a84ea3ef1b2a7e2e5b3fe2d9d61e4c1"
ACCOUNT_SID = "AC0123456789abcdef0123456789abcdef"


class TwilioPeer:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.messages: list[dict] = []  # everything the server sent, in order
        self.echoed: list[str] = []  # mark names echoed back, in order
        self._pending: deque[tuple[str, float]] = deque()  # (mark, when it has played)
        self._play_end = 0.0
        self._seq = 0
        self._chunk = 0
        self._new = asyncio.Event()
        self._tasks = [asyncio.create_task(self._receive()), asyncio.create_task(self._echo())]

    async def send(self, event: str, **body: Any) -> None:
        self._seq += 1
        msg = {"event": event, "sequenceNumber": str(self._seq), **body}
        if event != "connected":
            msg["streamSid"] = STREAM_SID
        await self.ws.send(json.dumps(msg))

    async def start(self, **custom: str) -> None:
        await self.ws.send(json.dumps({"event": "connected", "protocol": "Call",
                                       "version": "1.0.0"}))
        await self.send("start", start={
            "accountSid": ACCOUNT_SID, "streamSid": STREAM_SID, "callSid": CALL_SID,
            "tracks": ["inbound"], "customParameters": custom,
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}})

    async def speak(self, audio: np.ndarray) -> float:
        """Stream 8 kHz float audio as 20 ms μ-law frames at real time; returns when the
        last frame was sent (monotonic)."""
        ulaw = float_to_ulaw(audio)
        t0 = time.monotonic()
        for i in range(0, len(ulaw) - FRAME + 1, FRAME):
            self._chunk += 1
            await self.send("media", media={
                "track": "inbound", "chunk": str(self._chunk),
                "timestamp": str(self._chunk * 20),
                "payload": base64.b64encode(ulaw[i:i + FRAME]).decode()})
            await asyncio.sleep(max(0.0, t0 + (i // FRAME + 1) * 0.02 - time.monotonic()))
        return time.monotonic()

    async def dtmf(self, digit: str) -> None:
        await self.send("dtmf", dtmf={"track": "inbound_track", "digit": digit})

    async def stop(self) -> None:
        await self.send("stop", stop={"accountSid": ACCOUNT_SID, "callSid": CALL_SID})

    async def _receive(self) -> None:
        async for raw in self.ws:
            msg = json.loads(raw)
            msg["_at"] = time.monotonic()
            self.messages.append(msg)
            now = time.monotonic()
            if msg["event"] == "media":
                n = len(base64.b64decode(msg["media"]["payload"]))
                self._play_end = max(self._play_end, now) + n / 8000
            elif msg["event"] == "mark":
                self._pending.append((msg["mark"]["name"], max(self._play_end, now)))
            elif msg["event"] == "clear":
                self._play_end = now
                while self._pending:
                    await self._echo_mark(self._pending.popleft()[0], cleared=True)
            self._new.set()

    async def _echo(self) -> None:
        while True:
            while self._pending and self._pending[0][1] <= time.monotonic():
                await self._echo_mark(self._pending.popleft()[0], cleared=False)
            await asyncio.sleep(0.01)

    async def _echo_mark(self, name: str, *, cleared: bool) -> None:
        if not cleared:
            self.echoed.append(name)
        await self.send("mark", mark={"name": name})

    async def until(self, pred, timeout: float) -> dict:
        async def scan() -> dict:
            seen = 0
            while True:
                for msg in self.messages[seen:]:
                    if pred(msg):
                        return msg
                seen = len(self.messages)
                self._new.clear()
                await self._new.wait()
        return await asyncio.wait_for(scan(), timeout)

    def media_audio(self, start: int = 0, end: int | None = None) -> np.ndarray:
        """The reply audio received in messages[start:end], as float at 8 kHz."""
        data = b"".join(base64.b64decode(m["media"]["payload"])
                        for m in self.messages[start:end] if m["event"] == "media")
        return ulaw_to_float(data)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@asynccontextmanager
async def twilio_call(base_url: str, **headers: str):
    url = base_url.replace("http://", "ws://") + "/v1/telephony/twilio"
    async with connect(url, additional_headers=headers) as ws:
        peer = TwilioPeer(ws)
        try:
            yield peer
        finally:
            await peer.close()
