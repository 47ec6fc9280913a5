"""A WebRTC test peer (aiortc) that calls a voxline server over loopback only.

It offers 127.0.0.1 host candidates only (no STUN), plays a microphone from numpy audio
in real time, records the reply track frame by frame, and keeps every `oai-events`
event with its arrival time.
"""

from __future__ import annotations

import asyncio
import fractions
import json
import time
from dataclasses import dataclass, field

import av
import httpx
import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from voxline.realtime.transports.ice import LOOPBACK, restrict_gathering
from voxline.realtime.transports.webrtc import FRAME_SAMPLES, MEDIA_RATE, mono_pcm16


class Microphone(MediaStreamTrack):
    """Plays queued float32 48 kHz audio in real-time 20 ms frames; silence otherwise."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._audio = np.zeros(0, np.float32)
        self._start: float | None = None
        self._frames = 0

    def say(self, audio48k: np.ndarray) -> None:
        self._audio = np.concatenate([self._audio, audio48k.astype(np.float32)])

    @property
    def speaking(self) -> bool:
        return len(self._audio) > 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        wait = self._start + self._frames * FRAME_SAMPLES / MEDIA_RATE - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        chunk = np.zeros(FRAME_SAMPLES, np.float32)
        take = self._audio[:FRAME_SAMPLES]
        chunk[:len(take)] = take
        self._audio = self._audio[FRAME_SAMPLES:]
        frame = av.AudioFrame.from_ndarray(
            (np.clip(chunk, -1, 1) * 32767).astype(np.int16).reshape(1, -1), format="s16",
            layout="mono")
        frame.sample_rate = MEDIA_RATE
        frame.pts = self._frames * FRAME_SAMPLES
        frame.time_base = fractions.Fraction(1, MEDIA_RATE)
        self._frames += 1
        return frame


@dataclass
class CallClient:
    base: str
    pc: RTCPeerConnection
    mic: Microphone
    events: list[tuple[float, dict]] = field(default_factory=list)
    audio: list[tuple[float, np.ndarray]] = field(default_factory=list)  # (arrival, int16 48k)
    video: list[tuple[float, av.VideoFrame]] = field(default_factory=list)  # (arrival, frame)
    call_id: str = ""
    channel: object = None
    _new: asyncio.Event = field(default_factory=asyncio.Event)
    _new_audio: asyncio.Event = field(default_factory=asyncio.Event)
    _closed: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task] = field(default_factory=list)

    @classmethod
    async def place(cls, base: str, *, session: dict | None = None,
                    headers: dict[str, str] | None = None, video: bool = False) -> CallClient:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        client = cls(base, pc, Microphone())
        pc.addTrack(client.mic)
        if video:  # a video m-line (recvonly): the server may show video on it
            pc.addTransceiver("video", direction="recvonly")
        channel = pc.createDataChannel("oai-events")
        client.channel = channel
        channel.on("message", client._on_message)
        pc.on("track", client._on_track)
        pc.on("connectionstatechange", client._on_state)
        restrict_gathering(pc, [LOOPBACK])
        await pc.setLocalDescription(await pc.createOffer())
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            if session is None:
                r = await http.post("/v1/realtime/calls", content=pc.localDescription.sdp,
                                    headers={"Content-Type": "application/sdp", **(headers or {})})
            else:
                r = await http.post("/v1/realtime/calls", headers=headers, files={
                    "sdp": (None, pc.localDescription.sdp), "session": (None, json.dumps(session))})
        if r.status_code != 201:
            await pc.close()
            raise RuntimeError(f"call refused: {r.status_code} {r.text}")
        client.call_id = r.headers["location"].rsplit("/", 1)[-1]
        await pc.setRemoteDescription(RTCSessionDescription(r.text, "answer"))
        return client

    def _on_message(self, message: str) -> None:
        self.events.append((time.monotonic(), json.loads(message)))
        self._new.set()

    def _on_state(self) -> None:
        if self.pc.connectionState == "closed":
            self._closed.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        record = self._record_video if track.kind == "video" else self._record
        self._tasks.append(asyncio.create_task(record(track)))

    async def _record_video(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            self.video.append((time.monotonic(), frame))
            self._new_audio.set()

    async def _record(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            pcm = np.frombuffer(mono_pcm16(frame), dtype="<i2")
            self.audio.append((time.monotonic(), pcm))
            self._new_audio.set()

    def send(self, **event: object) -> None:
        self.channel.send(json.dumps(event))  # type: ignore[attr-defined]

    async def open(self, timeout: float = 30) -> None:
        await self.until_type("session.created", timeout)

    async def until(self, pred, timeout: float = 120) -> tuple[float, dict]:
        async def wait() -> tuple[float, dict]:
            seen = 0
            while True:
                for at, e in self.events[seen:]:
                    if pred(e):
                        return at, e
                seen = len(self.events)
                self._new.clear()
                await self._new.wait()
        return await asyncio.wait_for(wait(), timeout)

    async def until_type(self, type_: str, timeout: float = 120) -> dict:
        return (await self.until(lambda e: e["type"] == type_, timeout))[1]

    async def until_audio(self, pred, timeout: float = 60) -> None:
        """Wait until `pred(self.audio)` holds, checked as each reply frame arrives."""
        async def wait() -> None:
            while not pred(self.audio):
                self._new_audio.clear()
                await self._new_audio.wait()
        await asyncio.wait_for(wait(), timeout)

    async def until_closed(self, timeout: float = 5) -> None:
        """Wait until the peer connection reaches `closed` (e.g. the server hung up)."""
        if self.pc.connectionState != "closed":
            await asyncio.wait_for(self._closed.wait(), timeout)

    def of(self, type_: str) -> list[dict]:
        return [e for _, e in self.events if e["type"] == type_]

    def audio_between(self, start: float, end: float) -> np.ndarray:
        parts = [pcm for at, pcm in self.audio if start <= at < end]
        return np.concatenate(parts) if parts else np.zeros(0, np.int16)

    async def hangup(self) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.base, timeout=30) as http:
            return await http.post(f"/v1/realtime/calls/{self.call_id}/hangup")

    async def close(self) -> None:
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
