"""Transcription sessions end to end: the official `openai` SDK against a live server (the
shipped models) over the WebSocket (`?intent=transcription`) and an aiortc call over
WebRTC opened with a client secret the SDK minted. Every event validates strictly against
the SDK's GA types; speech becomes deltas first, then one completed transcript per turn,
and nothing ever answers (slow)."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
from conftest import TIME_FACTOR
from live_server import live_server
from openai_types import strict_problems
from speech import espeak

from voxline.codecs.pcm import float_to_pcm16

pytestmark = pytest.mark.slow

COMPLETED = "conversation.item.input_audio_transcription.completed"
DELTA = "conversation.item.input_audio_transcription.delta"


@pytest.fixture(scope="module")
def server():
    with live_server(ice_hosts="127.0.0.1") as base:
        yield base


def spoken(text: str, rate: int = 24000, lead_s: float = 0.4, tail_s: float = 1.0) -> np.ndarray:
    return np.concatenate([np.zeros(int(lead_s * rate), np.float32), espeak(text, rate=rate),
                           np.zeros(int(tail_s * rate), np.float32)])


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


QUESTION = "What is the capital of France, and how many people live there?"


def said(transcript: str, text: str = QUESTION) -> bool:
    """ASR of espeak speech is not word-perfect: most of the words said is the question."""
    def words(t: str) -> set[str]:
        return {w.strip(".,!?").lower() for w in t.split() if len(w.strip(".,!?")) >= 3}
    return len(words(text) & words(transcript)) >= 0.75 * len(words(text))


class SdkSession:
    """The SDK's connection; every raw event is kept and checked strictly before the SDK
    parses it."""

    def __init__(self, rt) -> None:
        self.rt = rt
        self.raw: list[dict] = []
        self.events: list = []

    async def until(self, pred, timeout: float = 120.0):
        async def loop():
            while True:
                data = await self.rt.recv_bytes()
                self.raw.append(json.loads(data))
                event = self.rt.parse_event(data)
                self.events.append(event)
                if pred(event):
                    return event
        return await asyncio.wait_for(loop(), timeout * TIME_FACTOR)

    def types(self) -> list[str]:
        return [e.type for e in self.events]

    def problems(self) -> list[str]:
        return [p for e in self.raw for p in strict_problems(e, "ga")]


async def test_sdk_transcription_session_over_the_websocket(server):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=server + "/v1", api_key="unused")
    async with client.realtime.connect(model="voxline",
                                       extra_query={"intent": "transcription"}) as rt:
        s = SdkSession(rt)
        created = await s.until(lambda e: e.type == "session.created")
        assert created.session.type == "transcription"
        await rt.session.update(session={
            "type": "transcription",
            "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "transcription": {"model": "moonshine-base-en", "language": "en"},
                "noise_reduction": {"type": "near_field"},
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}}})
        updated = await s.until(lambda e: e.type == "session.updated")
        assert updated.session.audio.input.transcription.language == "en"
        pcm = float_to_pcm16(spoken(QUESTION))
        for i in range(0, len(pcm), 4800):  # 100 ms chunks, as a speaker says them
            await rt.input_audio_buffer.append(audio=b64(pcm[i:i + 4800]))
            await asyncio.sleep(0.1)
        final = await s.until(lambda e: e.type == COMPLETED)
        assert said(final.transcript), final.transcript
        # a response.create is refused by name, and the session goes on
        await rt.response.create(event_id="evt_reply")
        err = await s.until(lambda e: e.type == "error")
        assert err.error.event_id == "evt_reply" and err.error.param == "type"
        assert "transcription session" in err.error.message
        # a second turn, committed by hand
        await rt.session.update(session={"type": "transcription",
                                          "audio": {"input": {"turn_detection": None}}})
        await s.until(lambda e: e.type == "session.updated")
        for i in range(0, len(pcm), 4800):
            await rt.input_audio_buffer.append(audio=b64(pcm[i:i + 4800]))
        await rt.input_audio_buffer.commit()
        manual = await s.until(lambda e: e.type == COMPLETED)
        assert said(manual.transcript), manual.transcript
        # a third turn, ended by semantic turn detection
        await rt.session.update(session={"type": "transcription", "audio": {"input": {
            "turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}})
        await s.until(lambda e: e.type == "session.updated")
        # a microphone keeps sending silence: enough for semantic_vad's longest wait (2 s)
        speech_then_silence = pcm + bytes(3 * 24000 * 2)
        for i in range(0, len(speech_then_silence), 4800):
            await rt.input_audio_buffer.append(audio=b64(speech_then_silence[i:i + 4800]))
            await asyncio.sleep(0.1)
        semantic = await s.until(lambda e: e.type == COMPLETED)
        assert said(semantic.transcript), semantic.transcript
    types = s.types()
    print("SDK transcription session:", types)
    assert s.problems() == []
    assert not [t for t in types if t.startswith("response.")], types
    # fed as it is spoken, the turn is transcribed while the speaker is still talking
    assert types.index(DELTA) < types.index("input_audio_buffer.speech_stopped"), types
    first = final.item_id
    deltas = "".join(e.delta for e in s.events if e.type == DELTA and e.item_id == first)
    assert deltas == " ".join(final.transcript.split())
    assert types[:2] == ["session.created", "session.updated"]
    for t in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
              "input_audio_buffer.committed"):
        assert types.index(t) < types.index(COMPLETED), types
    assert len({first, manual.item_id, semantic.item_id}) == 3


async def test_transcription_call_over_webrtc_with_a_client_secret(server):
    from openai import AsyncOpenAI

    from tests.webrtc_client import CallClient

    client = AsyncOpenAI(base_url=server + "/v1", api_key="unused")
    secret = await client.realtime.client_secrets.create(session={
        "type": "transcription",
        "audio": {"input": {"transcription": {"model": "moonshine-base-en"}}}})
    assert secret.session.type == "transcription" and secret.value.startswith("ek_")
    call = await CallClient.place(server, headers={"Authorization": f"Bearer {secret.value}"})
    try:
        await call.open()
        call.mic.say(spoken(QUESTION, rate=48000, lead_s=0.2))
        final = await call.until_type(COMPLETED)
        assert said(final["transcript"]), final["transcript"]
        call.send(type="response.create", event_id="evt_r")
        err = await call.until_type("error")
        assert err["error"]["event_id"] == "evt_r"
        events = [e for _, e in call.events]
        types = [e["type"] for e in events]
        assert events[0]["session"]["type"] == "transcription"
        assert types.index(DELTA) < types.index(COMPLETED)
        assert not [t for t in types if t.startswith(("response.", "output_audio_buffer."))]
        assert [p for e in events for p in strict_problems(e, "ga")] == []
        await call.hangup()
    finally:
        await call.close()


async def test_an_unknown_intent_is_refused_naming_it(server):
    import httpx
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    ws_url = server.replace("http://", "ws://") + "/v1/realtime?intent=translate"
    with pytest.raises(InvalidStatus) as refused:
        async with connect(ws_url):
            pass
    assert refused.value.response.status_code == 400
    assert json.loads(refused.value.response.body)["error"]["param"] == "intent"
    async with httpx.AsyncClient(base_url=server) as http:
        r = await http.post("/v1/realtime/calls?intent=translate",
                            content="v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n", headers={"Content-Type": "application/sdp"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "intent"


async def test_sdk_transcription_session_with_logprobs(server):
    """`include` logprobs with the shipped ASR: every delta carries its own tokens' scores,
    the completed transcript all of them, each a probability a greedy pick can have."""
    import math

    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=server + "/v1", api_key="unused")
    async with client.realtime.connect(model="voxline",
                                       extra_query={"intent": "transcription"}) as rt:
        s = SdkSession(rt)
        await s.until(lambda e: e.type == "session.created")
        await rt.session.update(session={
            "type": "transcription", "include": ["item.input_audio_transcription.logprobs"],
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                                "turn_detection": {"type": "server_vad"}}}})
        updated = await s.until(lambda e: e.type == "session.updated")
        assert updated.session.include == ["item.input_audio_transcription.logprobs"]
        pcm = float_to_pcm16(spoken(QUESTION))
        for i in range(0, len(pcm), 4800):
            await rt.input_audio_buffer.append(audio=b64(pcm[i:i + 4800]))
            await asyncio.sleep(0.1)
        final = await s.until(lambda e: e.type == COMPLETED)
    assert s.problems() == []
    assert said(final.transcript), final.transcript
    assert final.logprobs, "the completed transcript carries its tokens"
    assert "".join(lp.token for lp in final.logprobs).strip() == final.transcript
    for lp in final.logprobs:
        assert -math.log(32768) - 1e-3 <= lp.logprob <= 0 and bytes(lp.bytes).decode() == lp.token
    deltas = [e for e in s.events if e.type == DELTA and e.item_id == final.item_id]
    assert deltas and all(e.logprobs is not None for e in deltas)
    for e in deltas:  # each delta's tokens spell that delta (from the hypothesis it came from)
        assert "".join(lp.token for lp in e.logprobs).strip() == e.delta.strip()


async def test_beta_client_gets_transcription_session_events(server):
    """A beta client (OpenAI-Beta: realtime=v1) with the intent: `transcription_session.*`
    events in beta's shape, configured by `transcription_session.update`, logprobs on."""
    from websockets.asyncio.client import connect

    url = server.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    events: list[dict] = []

    async def until(kind: str) -> dict:
        async def loop() -> dict:
            while True:
                event = json.loads(await ws.recv())
                events.append(event)
                if event["type"] == kind:
                    return event
        return await asyncio.wait_for(loop(), 120 * TIME_FACTOR)

    async with connect(url, additional_headers={"OpenAI-Beta": "realtime=v1"}) as ws:
        created = await until("transcription_session.created")
        assert created["session"]["object"] == "realtime.transcription_session"
        await ws.send(json.dumps({"type": "transcription_session.update", "session": {
            "input_audio_format": "pcm16", "turn_detection": {"type": "server_vad"},
            "include": ["item.input_audio_transcription.logprobs"]}}))
        updated = await until("transcription_session.updated")
        assert updated["session"]["include"] == ["item.input_audio_transcription.logprobs"]
        pcm = float_to_pcm16(spoken(QUESTION))
        for i in range(0, len(pcm), 4800):
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": b64(pcm[i:i + 4800])}))
            await asyncio.sleep(0.1)
        final = await until(COMPLETED)
    assert said(final["transcript"]), final["transcript"]
    assert final["logprobs"]
    assert [p for e in events for p in strict_problems(e, "beta")] == []
    assert not [e for e in events if e["type"].startswith(("session.", "response."))]
