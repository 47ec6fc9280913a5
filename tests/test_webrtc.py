"""`/v1/realtime/calls` end to end: a real aiortc peer calls a live server (the shipped
models) over loopback; both peers offer 127.0.0.1 host candidates only, no STUN."""

from __future__ import annotations

import contextlib
import gc
import threading

import httpx
import numpy as np
import pytest
import soxr
from aiortc import RTCPeerConnection

from tests.live_server import live_server
from tests.speech import espeak
from tests.webrtc_client import CallClient

pytestmark = pytest.mark.slow

SHORT = "You are a voice assistant. Answer in at most eight words."
RATE = 48_000


@pytest.fixture(scope="module")
def server():
    with live_server(ice_hosts="127.0.0.1") as base:
        yield base


@pytest.fixture(scope="module")
def asr():
    from voxline.engines.models.moonshine_asr import MoonshineASR

    return MoonshineASR.load()


def spoken(text: str, tail_s: float = 1.0) -> np.ndarray:
    return np.concatenate([espeak(text, rate=RATE), np.zeros(int(tail_s * RATE), np.float32)])


def words(text: str) -> set[str]:
    return {w.strip(".,!?;:'\"").lower() for w in text.split() if len(w.strip(".,!?;:'\"")) >= 3}


def audible_seconds(audio: list[tuple[float, np.ndarray]], since: float) -> float:
    """Seconds of reply frames arrived since `since` that carry sound, not silence."""
    return sum(len(pcm) for at, pcm in audio
               if at >= since and len(pcm) and np.abs(pcm).max() > 1000) / RATE


def open_peer_connections() -> list[RTCPeerConnection]:
    gc.collect()
    return [o for o in gc.get_objects()
            if type(o) is RTCPeerConnection and o.connectionState != "closed"]


async def open_calls(base: str) -> float:
    async with httpx.AsyncClient(base_url=base) as http:
        text = (await http.get("/metrics")).text
    lines = [ln for ln in text.splitlines() if ln.startswith("voxline_webrtc_calls ")]
    return float(lines[0].split()[1]) if lines else 0.0


async def test_spoken_question_gets_a_spoken_answer_over_webrtc(server, asr):
    threads_before = set(threading.enumerate())
    call = await CallClient.place(server, session={
        "type": "realtime", "instructions": SHORT,
        "audio": {"input": {"transcription": {"model": "moonshine-base-en"}}}})
    try:
        await call.open()
        call.mic.say(spoken("What is the capital of France?"))
        final = await call.until_type("conversation.item.input_audio_transcription.completed")
        assert "capital" in final["transcript"].lower() and "france" in final["transcript"].lower()
        started_at, started = await call.until(
            lambda e: e["type"] == "output_audio_buffer.started")
        done = await call.until_type("response.done")
        stopped_at, stopped = await call.until(
            lambda e: e["type"] == "output_audio_buffer.stopped")
        assert started["response_id"] == stopped["response_id"] == done["response"]["id"]
        assert done["response"]["status"] == "completed"
        said = done["response"]["output"][0]["content"][0]["transcript"]
        assert "paris" in said.lower()
        types = [e["type"] for _, e in call.events]
        for t in ("session.created", "input_audio_buffer.speech_started",
                  "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
                  "response.created", "response.output_audio_transcript.delta",
                  "response.output_audio.done"):
            assert t in types, t
        # audio travels on the track, never as base64 deltas on the data channel
        assert "response.output_audio.delta" not in types
        # the last frames are still on the wire: wait for the track to pass the window's end
        await call.until_audio(lambda audio: bool(audio) and audio[-1][0] >= stopped_at + 0.3)
        reply = call.audio_between(started_at - 0.5, stopped_at + 0.3).astype(np.float32) / 32768
        heard = asr.transcribe(soxr.resample(reply, RATE, 16000).astype(np.float32))
        assert len(words(said) & words(heard)) >= len(words(said)) / 2, (heard, said)

        r = await call.hangup()
        assert r.status_code == 200
        with contextlib.suppress(TimeoutError):
            await call.until_closed(timeout=5)
        assert call.pc.connectionState == "closed"  # the server closed its side
    finally:
        await call.close()
    assert await open_calls(server) == 0
    assert open_peer_connections() == []
    again = await call.hangup()
    assert again.status_code == 404
    # what may stay: the loops' pooled executors (aiortc encodes there) and the engine's
    # stage workers; nothing of the call itself
    extra = [t.name for t in set(threading.enumerate()) - threads_before]
    assert all(n.startswith(("asyncio_", "uvloop_", "voxline-")) for n in extra), extra


async def test_barge_in_clears_the_outgoing_track(server):
    call = await CallClient.place(server)
    try:
        await call.open()
        call.send(type="session.update", session={
            "type": "realtime", "instructions": "Tell a long, detailed story about a dragon.",
            "max_output_tokens": 16})
        call.send(type="conversation.item.create", item={
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Tell me a long story."}]})
        call.send(type="response.create", response={"max_output_tokens": 300})
        started_at, first = await call.until(lambda e: e["type"] == "output_audio_buffer.started")
        rid = first["response_id"]
        # let some of the story play: a second of audible audio on the track
        await call.until_audio(lambda audio: audible_seconds(audio, started_at) >= 1.0)
        call.mic.say(spoken("Stop, wait a moment please."))
        cleared_at, cleared = await call.until(
            lambda e: e["type"] == "output_audio_buffer.cleared")
        assert cleared["response_id"] == rid
        done = await call.until_type("response.done")
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        # the interruption becomes a turn with its own answer; until that one starts
        # playing, the track carries silence (skip frames already in flight)
        next_at, _ = await call.until(lambda e: e["type"] == "output_audio_buffer.started"
                                      and e["response_id"] != rid, timeout=180)
        before = call.audio_between(cleared_at - 1.0, cleared_at)
        after = call.audio_between(cleared_at + 0.2, next_at)
        assert np.abs(before).max() > 1000  # the story was audible
        assert len(after) > 0 and np.abs(after).max() < 100
        await call.until(lambda e: e["type"] == "response.done"
                         and e["response"]["id"] != rid, timeout=180)
    finally:
        await call.hangup()
        await call.close()
    assert open_peer_connections() == []


async def test_data_channel_errors_keep_the_call(server):
    call = await CallClient.place(server)
    try:
        await call.open()
        call.channel.send("this is not json")
        err = await call.until_type("error")
        assert err["error"]["code"] == "invalid_json"
        call.channel.send(b"\x00\x01")
        call.send(type="input_audio_buffer.append", audio="AAAA", event_id="evt_1")
        await call.until(lambda e: e["type"] == "error"
                         and e["error"].get("event_id") == "evt_1")
        errors = call.of("error")
        assert "binary" in errors[1]["error"]["message"]
        assert "microphone track" in errors[2]["error"]["message"]
        call.send(type="session.update", session={"type": "realtime", "instructions": "Hi."})
        updated = await call.until_type("session.updated")
        assert updated["session"]["instructions"] == "Hi."
    finally:
        await call.hangup()
        await call.close()
    assert open_peer_connections() == []


async def test_bad_offers_and_unknown_calls_are_refused_cleanly(server):
    async with httpx.AsyncClient(base_url=server, timeout=30) as http:
        sdp = {"Content-Type": "application/sdp"}
        r = await http.post("/v1/realtime/calls", content="hello", headers=sdp)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_sdp"
        r = await http.post("/v1/realtime/calls", headers=sdp,
                            content="v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"
                                    "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\n")
        assert r.status_code == 400 and "cannot answer" in r.json()["error"]["message"]
        # a data-channel-only offer: no microphone
        pc = RTCPeerConnection()
        pc.createDataChannel("oai-events")
        offer = await pc.createOffer()
        await pc.close()
        r = await http.post("/v1/realtime/calls", content=offer.sdp, headers=sdp)
        assert r.status_code == 400 and "m=audio" in r.json()["error"]["message"]
        r = await http.post("/v1/realtime/calls", files={"sdp": (None, "v=0"),
                                                          "session": (None, "{oops")})
        assert r.status_code == 400 and r.json()["error"]["param"] == "session"
        r = await http.post("/v1/realtime/calls/rtc_nope/hangup")
        assert r.status_code == 404
        assert r.json()["error"] == {"message": "no call with id 'rtc_nope' (it may have ended)",
                                     "type": "invalid_request_error", "param": "call_id",
                                     "code": "call_not_found"}
    assert await open_calls(server) == 0
    assert open_peer_connections() == []
