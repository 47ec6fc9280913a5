"""End of speech -> first reply audio, WebRTC vs WebSocket, measured by the client in one
run against one live server (shipped models, loopback only).

Both microphones stream in real time (the question, then silence); both clock from the
arrival of `input_audio_buffer.speech_stopped`; the WebSocket turn ends at the first
`response.output_audio.delta`, the WebRTC turn at the first audible frame on the reply
track. Run: .venv/bin/python -m benchmarks.cpu_latency.bench_webrtc_latency [N]
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time

import numpy as np
import websockets

from tests.live_server import live_server
from tests.speech import espeak
from tests.webrtc_client import CallClient

QUESTION = "What is the capital of France?"
SESSION = {"type": "realtime", "instructions": "Answer in at most eight words."}


def spoken(rate: int) -> np.ndarray:
    return np.concatenate([espeak(QUESTION, rate=rate), np.zeros(rate, np.float32)])


async def websocket_turn(base: str) -> float:
    url = base.replace("http", "ws") + "/v1/realtime"
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": SESSION}))
        pcm = (spoken(24000) * 32767).astype("<i2").tobytes()

        async def microphone() -> None:  # 20 ms appends in real time, then silence, as a mic
            silence = bytes(960)
            for i in range(0, 10**9, 960):
                chunk = pcm[i:i + 960] or silence
                await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(chunk).decode()}))
                await asyncio.sleep(0.02)

        mic = asyncio.create_task(microphone())
        try:
            stopped = None
            async for raw in ws:
                event = json.loads(raw)
                if event["type"] == "input_audio_buffer.speech_stopped":
                    stopped = time.monotonic()
                if event["type"] == "response.output_audio.delta" and stopped is not None:
                    return time.monotonic() - stopped
        finally:
            mic.cancel()
    raise RuntimeError("no reply audio")


async def webrtc_turn(base: str) -> float:
    call = await CallClient.place(base, session=SESSION)
    try:
        await call.open()
        call.mic.say(spoken(48000))
        stopped_at, _ = await call.until(
            lambda e: e["type"] == "input_audio_buffer.speech_stopped")
        await call.until(lambda e: e["type"] == "output_audio_buffer.started")
        for _ in range(200):
            loud = [at for at, pcm in call.audio if at > stopped_at and np.abs(pcm).max() > 300]
            if loud:
                return loud[0] - stopped_at
            await asyncio.sleep(0.02)
        raise RuntimeError("no audible reply frame")
    finally:
        await call.hangup()
        await call.close()


async def main(n: int) -> None:
    with live_server(ice_hosts="127.0.0.1") as base:
        ws, rtc = [], []
        for _ in range(n):  # interleaved, so both see the same machine load
            ws.append(await websocket_turn(base))
            rtc.append(await webrtc_turn(base))
    for name, xs in (("websocket", ws), ("webrtc", rtc)):
        ms = np.array(xs) * 1000
        print(f"{name:9s} end of speech -> first audio: p50 {np.percentile(ms, 50):.0f} ms, "
              f"p90 {np.percentile(ms, 90):.0f} ms over {n} turns")
    print(f"webrtc / websocket p50: {np.median(rtc) / np.median(ws):.2f}")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3))
