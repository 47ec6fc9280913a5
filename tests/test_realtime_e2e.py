"""`/v1/realtime` end to end: the real server with the real models, driven by the official
`openai` SDK and by a raw WebSocket client (slow)."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
import soxr
from conftest import TIME_FACTOR
from live_server import live_server
from speech import espeak
from websockets.asyncio.client import connect

from voxline.codecs.g711 import float_to_ulaw, ulaw_to_float
from voxline.codecs.pcm import float_to_pcm16, pcm16_to_float

pytestmark = pytest.mark.slow

SHORT = "You are a voice assistant. Answer in at most eight words."


@pytest.fixture(scope="module")
def server():
    with live_server() as base:
        yield base


@pytest.fixture(scope="module")
def asr():
    from voxline.engines.models.moonshine_asr import MoonshineASR

    return MoonshineASR.load()


def spoken(text: str, rate: int = 24000, lead_s: float = 0.4, tail_s: float = 1.0) -> np.ndarray:
    return np.concatenate([np.zeros(int(lead_s * rate), np.float32), espeak(text, rate=rate),
                           np.zeros(int(tail_s * rate), np.float32)])


def words(text: str) -> set[str]:
    return {w.strip(".,!?;:'\"").lower() for w in text.split() if len(w.strip(".,!?;:'\"")) >= 3}


def sounds_like(heard: str, said: str) -> bool:
    """ASR of our own TTS is not word-perfect; half of the content words is speech."""
    want = words(said)
    return bool(want) and len(want & words(heard)) >= len(want) / 2


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Conn:
    """A raw realtime WebSocket client that keeps every event it receives."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.events: list[dict] = []

    async def send(self, **event) -> None:
        await self.ws.send(json.dumps(event))

    async def append(self, pcm: bytes, chunk: int = 9600) -> None:
        for i in range(0, len(pcm), chunk):
            await self.send(type="input_audio_buffer.append", audio=b64(pcm[i:i + chunk]))

    async def until(self, pred, timeout: float = 120.0) -> dict:
        async def loop():
            while True:
                event = json.loads(await self.ws.recv())
                self.events.append(event)
                if pred(event):
                    return event
        return await asyncio.wait_for(loop(), timeout * TIME_FACTOR)

    async def until_type(self, type_: str, timeout: float = 120.0) -> dict:
        return await self.until(lambda e: e["type"] == type_, timeout)

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    def of(self, type_: str) -> list[dict]:
        return [e for e in self.events if e["type"] == type_]


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://") + "/v1/realtime?model=voxline"


async def open_conn(base: str, headers: dict | None = None) -> tuple[object, Conn]:
    ws = await connect(ws_url(base), additional_headers=headers or {}, max_size=2**24)
    conn = Conn(ws)
    await conn.until_type("session.created")
    return ws, conn


async def test_openai_sdk_voice_turn(server, asr):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=server + "/v1", api_key="unused")
    seen: list = []
    audio = bytearray()
    async with client.realtime.connect(model="voxline") as rt:
        await rt.session.update(session={
            "type": "realtime", "instructions": SHORT, "output_modalities": ["audio"],
            "audio": {"input": {"transcription": {"model": "moonshine-base-en"},
                                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}},
                      "output": {"format": {"type": "audio/pcm", "rate": 24000}}}})
        pcm = float_to_pcm16(spoken("What is the capital of France?"))
        for i in range(0, len(pcm), 4800):  # 100 ms chunks
            await rt.input_audio_buffer.append(audio=b64(pcm[i:i + 4800]))

        async def collect():
            async for event in rt:
                seen.append(event)
                if event.type == "response.output_audio.delta":
                    audio.extend(base64.b64decode(event.delta))
                if event.type == "response.done":
                    return
        await asyncio.wait_for(collect(), 180 * TIME_FACTOR)
    types = [e.type for e in seen]
    order = ["session.created", "session.updated", "input_audio_buffer.speech_started",
             "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
             "response.created", "response.output_item.added", "response.content_part.added",
             "response.output_audio.delta", "response.output_audio.done",
             "response.output_audio_transcript.done", "response.content_part.done",
             "response.output_item.done", "response.done"]
    positions = [types.index(t) for t in order]
    assert positions == sorted(positions), types
    final, = [e for e in seen if e.type == "conversation.item.input_audio_transcription.completed"]
    assert "capital" in final.transcript.lower() and "france" in final.transcript.lower()
    done = seen[-1].response
    assert done.status == "completed" and done.usage.output_tokens > 0
    deltas = "".join(e.delta for e in seen if e.type == "response.output_audio_transcript.delta")
    transcript, = [e.transcript for e in seen if e.type == "response.output_audio_transcript.done"]
    assert transcript == deltas.strip() and "paris" in transcript.lower()
    # what the client received is speech saying the reply
    wave = soxr.resample(pcm16_to_float(bytes(audio)), 24000, 16000)
    heard = asr.transcribe(wave)
    assert sounds_like(heard, transcript), (heard, transcript)


async def test_barge_in_cancels_and_keeps_only_what_was_heard(server):
    ws, c = await open_conn(server)
    try:
        await c.send(type="session.update", session={
            "type": "realtime", "instructions": "Tell a long, detailed story about a dragon.",
            "max_output_tokens": 16,  # the reply to the interruption stays short
            "audio": {"input": {"turn_detection": {"type": "server_vad"}}}})
        await c.send(type="conversation.item.create", item={
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Tell me a long story."}]})
        await c.send(type="response.create", response={"max_output_tokens": 300})
        first = await c.until_type("response.output_audio.delta")
        await asyncio.sleep(0.6)  # let some audio play
        await c.append(float_to_pcm16(spoken("Stop, wait a moment please.")))
        done = await c.until(lambda e: e["type"] == "response.done"
                             and e["response"]["id"] == first["response_id"])
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        after = c.events[c.events.index(done):]
        assert not [e for e in after if e["type"] == "response.output_audio.delta"
                    and e["response_id"] == first["response_id"]]
        trunc = await c.until_type("conversation.item.truncated")
        assert trunc["item_id"] == first["item_id"]
        sent_ms = sum(len(base64.b64decode(e["delta"])) / 48 for e in c.of("response.output_audio.delta")
                      if e["response_id"] == first["response_id"])
        assert 0 < trunc["audio_end_ms"] <= sent_ms + 1
        # the user's interruption becomes a turn and gets its own response
        await c.until(lambda e: e["type"] == "response.done"
                      and e["response"]["id"] != first["response_id"], timeout=180)
        await c.send(type="conversation.item.retrieve", item_id=first["item_id"])
        item = (await c.until_type("conversation.item.retrieved"))["item"]
        heard = item["content"][0]["transcript"]
        full = done["response"]["output"][0]["content"][0]["transcript"]
        assert len(heard) < len(full) and full.startswith(heard.split(" ")[0])
    finally:
        await ws.close()


async def test_manual_commit_text_only_response(server):
    ws, c = await open_conn(server)
    try:
        await c.send(type="session.update", session={
            "type": "realtime", "instructions": SHORT, "output_modalities": ["text"],
            "audio": {"input": {"turn_detection": None,
                                "transcription": {"model": "moonshine-base-en"}}}})
        await c.until_type("session.updated")
        await c.append(float_to_pcm16(spoken("What is the capital of France?", tail_s=0.2)))
        await c.send(type="input_audio_buffer.commit", event_id="commit-1")
        committed = await c.until_type("input_audio_buffer.committed")
        await c.send(type="response.create")
        done = await c.until_type("response.done")
        assert done["response"]["status"] == "completed"
        assert not c.of("response.output_audio.delta") and not c.of("input_audio_buffer.speech_started")
        text = "".join(e["delta"] for e in c.of("response.output_text.delta"))
        assert c.of("response.output_text.done")[0]["text"] == text.strip()
        assert "paris" in text.lower()
        final, = c.of("conversation.item.input_audio_transcription.completed")
        assert final["item_id"] == committed["item_id"] and "france" in final["transcript"].lower()
        assert 1.5 < final["usage"]["seconds"] < 4.0  # the committed audio's length
        # an empty commit is an error that names the event, and the session goes on
        await c.send(type="input_audio_buffer.commit", event_id="commit-2")
        err = await c.until_type("error")
        assert err["error"]["code"] == "input_audio_buffer_commit_empty"
        assert err["error"]["event_id"] == "commit-2"
    finally:
        await ws.close()


async def test_text_item_max_tokens_truncate_and_delete(server):
    ws, c = await open_conn(server)
    try:
        await c.send(type="session.update", session={"type": "realtime", "instructions": SHORT,
                                                     "audio": {"input": {"turn_detection": None}}})
        await c.send(type="conversation.item.create", item={
            "id": "u1", "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Count from one to ten, please."}]})
        added = await c.until_type("conversation.item.added")
        assert added["item"]["id"] == "u1"
        await c.send(type="response.create", response={"max_output_tokens": 6})
        done = await c.until_type("response.done")
        assert done["response"]["status"] == "incomplete"
        assert done["response"]["status_details"]["reason"] == "max_output_tokens"
        assert done["response"]["usage"]["output_tokens"] == 6
        item_id = done["response"]["output"][0]["id"]
        sent_ms = sum(len(base64.b64decode(e["delta"])) / 48 for e in c.of("response.output_audio.delta"))
        await c.send(type="conversation.item.truncate", event_id="t-bad", item_id=item_id,
                     content_index=0, audio_end_ms=int(sent_ms) + 5000)
        err = await c.until_type("error")
        assert err["error"]["param"] == "audio_end_ms" and err["error"]["event_id"] == "t-bad"
        await c.send(type="conversation.item.truncate", item_id=item_id, content_index=0,
                     audio_end_ms=int(sent_ms // 2))
        trunc = await c.until_type("conversation.item.truncated")
        assert trunc["audio_end_ms"] == int(sent_ms // 2)
        await c.send(type="conversation.item.delete", item_id="u1")
        assert (await c.until_type("conversation.item.deleted"))["item_id"] == "u1"
        await c.send(type="conversation.item.retrieve", item_id="u1", event_id="r1")
        err = await c.until_type("error")
        assert err["error"]["code"] == "item_retrieve_invalid_item_id"
        assert err["error"]["param"] == "item_id"
        # a second response works after the edits, and a cancel of nothing is an error
        await c.send(type="response.cancel", event_id="c1")
        err = await c.until_type("error")
        assert err["error"]["code"] == "response_cancel_not_active"
        await c.send(type="conversation.item.create", item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi!"}]})
        await c.send(type="response.create", response={"output_modalities": ["text"],
                                                       "max_output_tokens": 12})
        second = await c.until(lambda e: e["type"] == "response.done"
                               and e["response"]["id"] != done["response"]["id"])
        assert second["response"]["status"] in ("completed", "incomplete")
    finally:
        await ws.close()


async def test_mulaw_in_and_out_in_the_beta_dialect(server, asr):
    ws, c = await open_conn(server, headers={"OpenAI-Beta": "realtime=v1"})
    try:
        await c.send(type="session.update", session={
            "modalities": ["text", "audio"], "instructions": SHORT,
            "input_audio_format": "g711_ulaw", "output_audio_format": "g711_ulaw",
            "input_audio_transcription": {"model": "whisper-1"},
            "turn_detection": {"type": "server_vad", "threshold": 0.5}})
        updated = await c.until_type("session.updated")
        assert updated["session"]["input_audio_format"] == "g711_ulaw"
        ulaw = float_to_ulaw(spoken("What is the capital of France?", rate=8000))
        await c.append(ulaw, chunk=1600)
        done = await c.until_type("response.done")
        assert done["response"]["status"] == "completed"
        assert "conversation.item.created" in c.types()  # beta names
        deltas = c.of("response.audio.delta")
        assert deltas and not c.of("response.output_audio.delta")
        audio = ulaw_to_float(b"".join(base64.b64decode(e["delta"]) for e in deltas))
        heard = asr.transcribe(soxr.resample(audio, 8000, 16000))
        said = done["response"]["output"][0]["content"][0]["transcript"]
        assert sounds_like(heard, said), (heard, said)
    finally:
        await ws.close()


async def test_bad_input_never_kills_the_session_or_loses_audio(server):
    ws, c = await open_conn(server)
    try:
        await c.send(type="session.update", session={
            "type": "realtime", "instructions": SHORT, "output_modalities": ["text"],
            "audio": {"input": {"turn_detection": None,
                                "transcription": {"model": "moonshine-base-en"}}}})
        await c.until_type("session.updated")
        question = float_to_pcm16(spoken("What is the capital of France?", tail_s=0.2))
        half = len(question) // 2 // 2 * 2
        await c.append(question[:half])
        bad = [
            ("{not json", "invalid_json", None),
            (json.dumps({"type": "no.such.event", "event_id": "e1"}), "unknown_event", None),
            (json.dumps({"type": "conversation.item.delete", "event_id": "e2"}),
             "missing_required_parameter", "item_id"),
            (json.dumps({"type": "input_audio_buffer.append", "event_id": "e3", "audio": 5}),
             "invalid_type", "audio"),
            (json.dumps({"type": "input_audio_buffer.append", "event_id": "e4",
                         "audio": "!!not base64!!"}), "invalid_value", "audio"),
            (json.dumps({"type": "input_audio_buffer.append", "event_id": "e5",
                         "audio": b64(b"\x01\x02\x03")}), "invalid_value", "audio"),
            (json.dumps({"type": "session.update", "event_id": "e6", "session": {
                "type": "realtime", "audio": {"input": {"turn_detection": {
                    "type": "server_vad", "threshold": 7}}}}}), "invalid_value",
             "session.audio.input.turn_detection.threshold"),
        ]
        for raw, code, param in bad:
            await ws.send(raw)
            err = await c.until_type("error")
            assert err["error"]["code"] == code, (raw, err)
            if param:
                assert err["error"]["param"] == param, (raw, err)
            sent_id = json.loads(raw).get("event_id") if raw.startswith("{\"") else None
            assert err["error"].get("event_id") == sent_id
        await ws.send(b"\x00\x01binary")
        err = await c.until_type("error")
        assert "binary" in err["error"]["message"]
        # the audio from before the bad events is still buffered: finish the question
        await c.append(question[half:])
        await c.send(type="input_audio_buffer.commit")
        await c.until_type("input_audio_buffer.committed")
        final = await c.until_type("conversation.item.input_audio_transcription.completed")
        assert "capital" in final["transcript"].lower() and "france" in final["transcript"].lower()
    finally:
        await ws.close()


@pytest.mark.parametrize("dialect", ["ga", "beta"])
async def test_live_session_events_validate_strictly(server, dialect):
    """Every event of a live session (spoken turn, text turn, cancel, barge-in, two client
    truncates) validates strictly against the openai package's types for its dialect."""
    from openai_types import strict_problems

    beta = dialect == "beta"
    url = server.replace("http://", "ws://") + "/v1/realtime?model=gpt-realtime"
    ws = await connect(url, additional_headers={"OpenAI-Beta": "realtime=v1"} if beta else {},
                       max_size=2**24)
    c = Conn(ws)
    audio_delta = "response.audio.delta" if beta else "response.output_audio.delta"

    def sent_ms(response_id: str) -> float:
        return sum(len(base64.b64decode(e["delta"])) / 48 for e in c.of(audio_delta)
                   if e["response_id"] == response_id)

    def done_of(response_id: str):
        return lambda e: e["type"] == "response.done" and e["response"]["id"] == response_id

    try:
        created = await c.until_type("session.created")
        assert created["session"]["model"] == "gpt-realtime"  # the model asked for, echoed
        transcription = {"model": "moonshine-base-en"}
        await c.send(type="session.update", session={
            "instructions": SHORT, "input_audio_transcription": transcription,
            "turn_detection": {"type": "server_vad"}} if beta else {
            "type": "realtime", "instructions": SHORT, "audio": {"input": {
                "transcription": transcription, "turn_detection": {"type": "server_vad"}}}})
        await c.until_type("session.updated")
        # a spoken turn
        await c.append(float_to_pcm16(spoken("What is the capital of France?")))
        await c.until_type("response.done", timeout=180)
        # a text turn
        await c.send(type="conversation.item.create", item={
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Name a color."}]})
        await c.send(type="response.create")
        await c.until(lambda e: e["type"] == "response.done" and len(c.of("response.done")) == 2,
                      timeout=180)
        # a client cancel, then a truncate at what was received
        story = {"instructions": "Tell a long, detailed story about a dragon.",
                 "max_output_tokens" if not beta else "max_response_output_tokens": 200}
        await c.send(type="response.create", response=story)
        first = await c.until_type(audio_delta)
        await c.send(type="response.cancel")
        await c.until(done_of(first["response_id"]))
        await c.send(type="conversation.item.truncate", item_id=first["item_id"],
                     content_index=0, audio_end_ms=int(sent_ms(first["response_id"]) * 0.8))
        await c.until_type("conversation.item.truncated")
        # a barge-in, then the client's own truncate after the server's
        await c.send(type="response.create", response=story)
        second = await c.until(lambda e: e["type"] == audio_delta
                               and e["response_id"] != first["response_id"])
        await asyncio.sleep(0.6)
        await c.append(float_to_pcm16(spoken("Stop, wait a moment please.")))
        await c.until(done_of(second["response_id"]), timeout=180)
        await c.send(type="conversation.item.truncate", item_id=second["item_id"],
                     content_index=0, audio_end_ms=int(sent_ms(second["response_id"])))
        await c.until(lambda e: e["type"] == "conversation.item.truncated"
                      and e["item_id"] == second["item_id"]
                      and len([t for t in c.of("conversation.item.truncated")
                               if t["item_id"] == second["item_id"]]) == 2)
        await c.until(lambda e: e["type"] == "response.done" and len(c.of("response.done")) == 5,
                      timeout=180)
        # the last reply's buffer, if it started (its first audio precedes its done), ends
        # before the close; a barged-in reply's cleared precedes its done
        last = c.of("response.done")[-1]["response"]

        def buffer_ended(e: dict) -> bool:
            return (e["type"] in ("output_audio_buffer.stopped", "output_audio_buffer.cleared")
                    and e["response_id"] == last["id"])
        if any(e["response_id"] == last["id"] for e in c.of("output_audio_buffer.started")) \
                and not any(map(buffer_ended, c.events)):
            try:
                await c.until(buffer_ended)
            except TimeoutError:  # say what the session did last (a rare flake, stops 34-38)
                pytest.fail(f"no buffer end for {last['id']}; last events: " + ", ".join(
                    f"{e['type']}({e.get('response_id') or e.get('item_id') or ''})"
                    for e in [e for e in c.events if not e["type"].endswith(".delta")][-60:]))
    finally:
        await ws.close()
    assert not c.of("error"), c.of("error")
    # every started buffer ends exactly once, stopped (played out) or cleared
    started = [e["response_id"] for e in c.of("output_audio_buffer.started")]
    ended = [e["response_id"] for e in c.events if e["type"] in (
        "output_audio_buffer.stopped", "output_audio_buffer.cleared")]
    assert sorted(started) == sorted(ended), (started, ended, c.types()[-40:])
    assert [p for e in c.events for p in strict_problems(e, dialect)] == []
    cancelled = [e["response"]["status_details"]["reason"] for e in c.of("response.done")
                 if e["response"]["status"] == "cancelled"]
    # the story may finish generating before the barge-in: then it is cut while playing
    assert cancelled in (["client_cancelled"], ["client_cancelled", "turn_detected"])
    assert {e["response_id"] for e in c.of("output_audio_buffer.cleared")} == {
        first["response_id"], second["response_id"]}
    for kind in ("conversation.item.input_audio_transcription.delta",
                 "output_audio_buffer.started", "output_audio_buffer.cleared"):
        assert c.of(kind), kind


async def test_a_sentence_with_a_pause_is_one_turn_and_one_reply(server):
    """Spoken at real time with a 450 ms pause mid-sentence: server VAD (500 ms) keeps it one
    turn, and whatever was speculated in the pause stays unsent; the one reply answers the
    whole sentence. (Whether a speculation starts depends on the machine's speed, so the
    counters are only checked for consistency.)"""
    import httpx

    async def counters() -> dict[str, float]:
        async with httpx.AsyncClient() as http:
            text = (await http.get(server + "/metrics")).text
        return {k: float(line.split()[1]) for line in text.splitlines()
                for k in ("started", "committed", "discarded")
                if line.startswith(f"voxline_speculation_{k}_total ")}

    before = await counters()
    rate = 24000
    def trimmed(text: str) -> np.ndarray:  # espeak pads its speech with silence
        audio = espeak(text, rate=rate)
        loud = np.nonzero(np.abs(audio) > 0.02 * np.abs(audio).max())[0]
        return audio[loud[0]:loud[-1] + 1]

    speech = np.concatenate([trimmed("I would like to book a table for"),
                             np.zeros(int(0.45 * rate), np.float32),
                             trimmed("four people tonight.")])
    pcm = float_to_pcm16(np.concatenate([np.zeros(int(0.3 * rate), np.float32), speech,
                                         np.zeros(int(1.5 * rate), np.float32)]))
    ws, c = await open_conn(server)
    try:
        await c.send(type="session.update", session={
            "type": "realtime", "instructions": SHORT,
            "audio": {"input": {"transcription": {"model": "moonshine-base-en"}}}})
        await c.until_type("session.updated")
        loop = asyncio.get_running_loop()
        t0, step = loop.time(), rate * 2 // 50  # 20 ms appends, at real time

        async def feed() -> None:
            for k, i in enumerate(range(0, len(pcm), step)):
                await c.send(type="input_audio_buffer.append", audio=b64(pcm[i:i + step]))
                await asyncio.sleep(max(0.0, t0 + (k + 1) * 0.02 - loop.time()))
        feeder = asyncio.create_task(feed())
        done = await c.until_type("response.done", timeout=180)
        await feeder
        await asyncio.sleep(0.5)  # anything more (a second turn or reply) would show now
        while True:
            try:
                c.events.append(json.loads(await asyncio.wait_for(ws.recv(), 0.2)))
            except TimeoutError:
                break
    finally:
        await ws.close()
    assert len(c.of("input_audio_buffer.speech_started")) == 1
    assert len(c.of("input_audio_buffer.speech_stopped")) == 1
    final, = c.of("conversation.item.input_audio_transcription.completed")
    assert {"table", "people"} <= words(final["transcript"])
    assert len(c.of("response.created")) == 1 and done["response"]["status"] == "completed"
    reply = done["response"]["output"][0]["content"][0]["transcript"]
    deltas = [e for e in c.of("response.output_audio.delta")]
    assert reply and deltas and {e["response_id"] for e in deltas} == {done["response"]["id"]}
    after = await counters()
    spec = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("started", "committed", "discarded")}
    assert spec["started"] == spec["committed"] + spec["discarded"], spec
    assert spec["committed"] <= 1, spec


async def test_livekit_chat_context_sync_from_root_and_the_reply_answers_it(server):
    """livekit-plugins-openai 1.8.9 syncs its chat context before replying: the first item as
    conversation.item.create with previous_item_id "root" on the empty conversation, each
    later one after the one before it (client ids, event ids chat_ctx_create_*); then
    response.create, whose reply must answer the question the history ends with."""
    ws, c = await open_conn(server)
    try:
        await c.send(type="session.update", session={
            "type": "realtime", "instructions": SHORT, "output_modalities": ["text"],
            "audio": {"input": {"turn_detection": None}}})
        await c.until_type("session.updated")
        history = [("item_lk1", "user", "Hello, I have a geography question."),
                   ("item_lk2", "assistant", "Sure, go ahead."),
                   ("item_lk3", "user", "What is the capital of France?")]
        previous = "root"
        for item_id, role, text in history:
            kind = "output_text" if role == "assistant" else "input_text"
            await c.send(type="conversation.item.create", event_id=f"chat_ctx_create_{item_id}",
                         previous_item_id=previous, item={
                             "id": item_id, "type": "message", "role": role,
                             "content": [{"type": kind, "text": text}]})
            added = await c.until_type("conversation.item.added")
            assert added["item"]["id"] == item_id
            assert added["previous_item_id"] == (None if previous == "root" else previous)
            previous = item_id
        await c.send(type="response.create")
        done = await c.until_type("response.done")
        assert done["response"]["status"] == "completed"
        assert "paris" in c.of("response.output_text.done")[0]["text"].lower()
        assert not c.of("error")
    finally:
        await ws.close()
