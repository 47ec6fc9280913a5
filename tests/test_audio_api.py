"""`/v1/audio/speech` and `/v1/audio/transcriptions` against the real shipped models."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import httpx
import numpy as np
import pytest
import pytest_asyncio
from fastapi import FastAPI
from speech import espeak

from voxline.codecs import pcm16_to_float, read_wav, wav_bytes
from voxline.codecs.opus import decode_audio_file
from voxline.config import Settings
from voxline.engines.client import EngineClient, InProcessEngineClient
from voxline.engines.launch import DEFAULT_CORE
from voxline.realtime.app import create_app
from voxline.realtime.http import transcription as transcription_api

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

THREE_SENTENCES = ("The sun rose over the quiet harbor. Fishing boats drifted out to sea. "
                   "By noon the market was full of people.")


def make_app(engine: EngineClient, **settings: Any) -> FastAPI:
    """The server app, with the engine managed by the test."""
    return create_app(Settings(**settings), engine, manage_engine=False)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine():
    client = InProcessEngineClient(DEFAULT_CORE)
    await client.start()
    yield client
    await client.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app(engine):
    return make_app(engine)


@pytest_asyncio.fixture(loop_scope="module")
async def client(app):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test",
                                 timeout=120) as c:
        yield c


async def asgi_post(app: FastAPI, path: str, body: dict[str, Any], *,
                    disconnect_after_first: bool = False
                    ) -> tuple[int, dict[str, str], list[tuple[float, bytes]]]:
    """POST JSON straight through ASGI, keeping each body message and its arrival time
    (httpx's ASGI transport joins the body into one piece)."""
    raw = json.dumps(body).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": ("test", 1), "server": ("test", 80),
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(raw)).encode())],
    }
    first_body = asyncio.Event()
    request_sent = False
    start: dict[str, Any] = {}
    chunks: list[tuple[float, bytes]] = []
    t0 = time.perf_counter()

    async def receive() -> dict[str, Any]:
        nonlocal request_sent
        if not request_sent:
            request_sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        if disconnect_after_first:
            await first_body.wait()
        else:
            await asyncio.Event().wait()  # the client stays; cancelled when the response ends
        return {"type": "http.disconnect"}

    async def send(msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            start.update(msg)
        elif msg["type"] == "http.response.body" and msg.get("body"):
            chunks.append((time.perf_counter() - t0, bytes(msg["body"])))
            first_body.set()

    await app(scope, receive, send)
    headers = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
    return start["status"], headers, chunks


async def speech(client: httpx.AsyncClient, text: str, **kw: Any) -> httpx.Response:
    r = await client.post("/v1/audio/speech",
                          json={"model": "tts-1", "voice": "alloy", "input": text, **kw})
    assert r.status_code == 200, r.text
    return r


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if len(x) else 0.0


def assert_error(r: httpx.Response, status: int, param: str | None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param, err
    assert err["message"]
    return err


# ------------------------------------------------------------------------------- speech


async def test_speech_wav_is_24khz_speech(client, app):
    r = await speech(client, "Hello world. This is a test of the speech endpoint.",
                     voice="shimmer", seed=1, response_format="wav")
    assert r.headers["content-type"] == "audio/wav"
    audio, rate = read_wav(r.content)
    assert rate == 24000
    assert 1.5 < len(audio) / rate < 8.0
    assert rms(audio) > 0.01
    assert np.array_equal(decode_audio_file(r.content)[0], audio)  # FFmpeg reads it too
    assert app.state.voxline.metrics.value("voxline_speech_request_seconds_count") >= 1


async def test_speech_pcm_streams_sentence_by_sentence(app, client):
    status, headers, chunks = await asgi_post(app, "/v1/audio/speech", {
        "model": "tts-1", "voice": "alloy", "input": THREE_SENTENCES,
        "response_format": "pcm", "seed": 3})
    assert status == 200 and headers["content-type"] == "audio/pcm"
    assert len(chunks) > 1
    assert chunks[0][0] < chunks[-1][0]
    pcm = b"".join(c for _, c in chunks)
    assert len(pcm) % 2 == 0
    # The same text and seed as WAV: the stream's concatenation is exactly that audio.
    wav = (await speech(client, THREE_SENTENCES, seed=3, response_format="wav")).content
    assert wav[44:] == pcm
    assert 4.0 < len(pcm) / 2 / 24000 < 15.0


async def test_speech_opus_and_flac_decode_back(client):
    text = "Compressed audio should still sound the same."
    ref, _ = read_wav((await speech(client, text, seed=5, response_format="wav")).content)
    flac = await speech(client, text, seed=5, response_format="flac")
    assert flac.headers["content-type"] == "audio/flac" and flac.content[:4] == b"fLaC"
    audio, rate = decode_audio_file(flac.content)
    assert rate == 24000
    np.testing.assert_allclose(audio, ref, atol=1e-6)  # lossless at PCM16
    opus = await speech(client, text, seed=5, response_format="opus")
    assert opus.headers["content-type"] == "audio/ogg" and opus.content[:4] == b"OggS"
    audio, rate = decode_audio_file(opus.content)
    assert abs(len(audio) / rate - len(ref) / 24000) < 0.03
    assert rms(audio) > 0.5 * rms(ref)


async def test_speech_defaults_to_mp3_and_streams_every_format(app, client):
    text = "Compressed audio should still sound the same."
    ref, _ = read_wav((await speech(client, text, seed=5, response_format="wav")).content)
    mp3 = await speech(client, text, seed=5)  # no response_format: OpenAI's default, mp3
    assert mp3.headers["content-type"] == "audio/mpeg"
    for fmt, media in [("mp3", "audio/mpeg"), ("aac", "audio/aac"), ("opus", "audio/ogg"),
                       ("flac", "audio/flac")]:
        status, headers, chunks = await asgi_post(app, "/v1/audio/speech", {
            "input": THREE_SENTENCES, "response_format": fmt, "seed": 3})
        assert status == 200 and headers["content-type"] == media
        assert len(chunks) > 1, fmt  # sent sentence by sentence, not encoded at the end
        audio, rate = decode_audio_file(b"".join(c for _, c in chunks), 24000)
        assert rms(audio) > 0.01, fmt
        assert 4.0 < len(audio) / rate < 15.0, fmt
    for fmt in ("mp3", "aac"):
        r = mp3 if fmt == "mp3" else await speech(client, text, seed=5, response_format=fmt)
        audio, rate = decode_audio_file(r.content)
        # lossy codecs add priming samples; the length and loudness stay the speech's
        assert rate == 24000 and abs(len(audio) - len(ref)) / 24000 < 0.15, fmt
        assert rms(audio) > 0.5 * rms(ref), fmt


async def test_speech_sse_carries_the_response_format(client):
    r = await speech(client, THREE_SENTENCES, seed=3, stream_format="sse")
    events = [json.loads(line[len("data: "):]) for line in r.text.split("\n\n") if line]
    assert events[-1]["type"] == "speech.audio.done" and len(events) > 2
    data = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    audio, rate = decode_audio_file(data)  # the deltas concatenate to an MP3 file
    assert rate == 24000 and rms(audio) > 0.01
    assert abs(len(audio) / rate - events[-1]["usage"]["output_audio_seconds"]) < 0.2


async def test_speech_sse_events(client):
    r = await speech(client, THREE_SENTENCES, seed=3, stream_format="sse",
                     response_format="pcm")
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[len("data: "):]) for line in r.text.split("\n\n") if line]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert len(events) > 2
    done = events[-1]
    assert done["type"] == "speech.audio.done"
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert {"input_tokens", "output_tokens", "total_tokens"} <= set(done["usage"])
    assert done["usage"]["output_audio_seconds"] == pytest.approx(len(pcm) / 48000, abs=1e-3)
    assert rms(pcm16_to_float(pcm)) > 0.01


async def test_client_disconnect_closes_the_engine_stream(app, engine, client):
    long_text = " ".join([THREE_SENTENCES] * 4)
    status, _, chunks = await asgi_post(app, "/v1/audio/speech", {
        "input": long_text, "response_format": "pcm"}, disconnect_after_first=True)
    assert status == 200 and 1 <= len(chunks) < 12  # 12 sentences: it stopped early
    assert engine.status()["open_streams"] == 0
    await speech(client, "Still working.")  # the engine serves the next request


@pytest.mark.parametrize(("body", "param", "needle"), [
    ({}, "input", "required"),
    ({"input": ""}, "input", "empty"),
    ({"input": "   "}, "input", "empty"),
    ({"input": "x" * 4097}, "input", "4096"),
    ({"input": "... !!"}, "input", "nothing to speak"),
    ({"input": 12}, "input", "string"),
    ({"input": "hi", "response_format": "ogg"}, "response_format", "mp3, opus, aac, flac"),
    ({"input": "hi", "speed": 5}, "speed", "0.25"),
    ({"input": "hi", "speed": "fast"}, "speed", "number"),
    ({"input": "hi", "voice": 3}, "voice", "voice"),
    ({"input": "hi", "stream_format": "chunks"}, "stream_format", "sse"),
    ({"input": "hi", "seed": -1}, "seed", "integer"),
    ({"input": "hi", "temperature": 1}, "temperature", "unrecognized"),
    ({"input": "hi", "instructions": "whisper it"}, "instructions", "not supported"),
])
async def test_speech_rejects_bad_input(client, body, param, needle):
    r = await client.post("/v1/audio/speech", json=body)
    err = assert_error(r, 400, param)
    assert err["type"] == "invalid_request_error"
    assert needle in err["message"]


async def test_speech_rejects_invalid_json(client):
    r = await client.post("/v1/audio/speech", content=b"{not json",
                          headers={"content-type": "application/json"})
    assert "JSON" in assert_error(r, 400, None)["message"]


# ------------------------------------------------------------------------ transcription


async def test_speech_transcription_round_trip(client):
    wav = (await speech(client, "The quick brown fox jumps over the lazy dog.", seed=2)).content
    r = await client.post("/v1/audio/transcriptions", data={"model": "whisper-1"},
                          files={"file": ("speech.wav", wav, "audio/wav")})
    assert r.status_code == 200, r.text
    text = r.json()["text"].lower()
    for word in ("quick", "fox", "lazy", "dog"):
        assert word in text, text
    flac = (await speech(client, "Good morning everyone.", seed=2,
                         response_format="flac")).content
    r = await client.post("/v1/audio/transcriptions",
                          data={"model": "whisper-1", "language": "en", "response_format": "text"},
                          files={"file": ("speech.flac", flac, "audio/flac")})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "morning" in r.text.lower()


async def test_long_audio_is_transcribed_in_windows(client, monkeypatch):
    monkeypatch.setattr(transcription_api, "ASR_WINDOW_SECONDS", 3.0)
    monkeypatch.setattr(transcription_api, "ASR_CUT_SEARCH_SECONDS", 1.5)
    first, second = espeak("Good morning everyone."), espeak("Please open the window.")
    audio = np.concatenate([np.zeros(1600, np.float32), first, np.zeros(20000, np.float32),
                            second])
    r = await client.post("/v1/audio/transcriptions", data={"response_format": "verbose_json"},
                          files={"file": ("long.wav", wav_bytes(audio, 16000), "audio/wav")})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["duration"] == pytest.approx(len(audio) / 16000, abs=0.01)
    assert len(body["segments"]) >= 2
    assert body["segments"][0]["start"] == 0.0
    assert body["segments"][-1]["end"] == pytest.approx(body["duration"], abs=0.01)
    text = body["text"].lower()
    assert "morning" in text and "window" in text and text.index("morning") < text.index("window")


async def test_asr_windows_cut_in_silence():
    rate = 16000
    loud = np.full(rate * 25, 0.5, np.float32)
    audio = np.concatenate([loud, np.zeros(rate // 2, np.float32), loud, loud])
    spans = transcription_api.asr_windows(len(audio), audio)
    assert spans[0] == (0, spans[0][1]) and 25 * rate <= spans[0][1] <= 25.5 * rate
    assert all(b - a <= 30 * rate for a, b in spans)
    assert [a for a, _ in spans[1:]] == [b for _, b in spans[:-1]] and spans[-1][1] == len(audio)
    assert transcription_api.asr_windows(rate * 10) == [(0, rate * 10)]
    assert transcription_api.asr_windows(0) == []


@pytest.mark.parametrize("samples", [0, 800])
async def test_empty_or_tiny_audio_gives_empty_text(client, samples):
    wav = wav_bytes(np.zeros(samples, np.float32), 16000)
    r = await client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav, "audio/wav")})
    assert r.status_code == 200, r.text
    assert r.json()["text"] == ""


@pytest.mark.parametrize(("kwargs", "param", "needle"), [
    ({"data": {"model": "whisper-1"}}, "file", "required"),
    ({"files": {"file": ("a.mp3", b"this is not audio at all" * 50, "audio/mpeg")}}, "file",
     "could not decode"),
    ({"files": {"file": ("a.wav", b"", "audio/wav")}}, "file", "empty"),
    ({"data": {"language": "fr"}, "files": {"file": ("a.wav", b"RIFF", "audio/wav")}},
     "language", "en"),
    ({"data": {"response_format": "srt"}, "files": {"file": ("a.wav", b"RIFF", "audio/wav")}},
     "response_format", "verbose_json"),
    ({"data": {"stream": "true"}, "files": {"file": ("a.wav", b"RIFF", "audio/wav")}},
     "stream", "realtime"),
    ({"json": {"model": "whisper-1"}}, "file", "multipart"),
    # what the ASR would have to ignore is refused, naming the field
    ({"data": {"prompt": "Voxline, Paris"}, "files": {"file": ("a.wav", b"RIFF", "audio/wav")}},
     "prompt", "prompt"),
    ({"data": {"temperature": "0.7"}, "files": {"file": ("a.wav", b"RIFF", "audio/wav")}},
     "temperature", "greedily"),
    ({"data": {"timestamp_granularities[]": "word"},
      "files": {"file": ("a.wav", b"RIFF", "audio/wav")}}, "timestamp_granularities[]", "segment"),
    ({"data": {"include[]": "logprobs"}, "files": {"file": ("a.wav", b"RIFF", "audio/wav")}},
     "include[]", "logprobs"),
    ({"data": {"chunking_strategy": "server_vad"},
      "files": {"file": ("a.wav", b"RIFF", "audio/wav")}}, "chunking_strategy", "auto"),
])
async def test_transcription_rejects_bad_input(client, kwargs, param, needle):
    r = await client.post("/v1/audio/transcriptions", **kwargs)
    assert needle in assert_error(r, 400, param)["message"]


# -------------------------------------------------------------------------- availability


async def test_engine_not_ready_gives_503_and_api_key_is_checked():
    unstarted = InProcessEngineClient(DEFAULT_CORE)
    app = make_app(unstarted, api_key="sekret")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                 base_url="http://test") as c:
        r = await c.post("/v1/audio/speech", json={"input": "hi"})
        assert assert_error(r, 401, None)["code"] == "invalid_api_key"
        c.headers["Authorization"] = "Bearer sekret"
        r = await c.post("/v1/audio/speech", json={"input": "hi"})
        assert assert_error(r, 503, None)["type"] == "server_error"
        r = await c.post("/v1/audio/transcriptions",
                         files={"file": ("a.wav", wav_bytes(np.zeros(16000), 16000), "audio/wav")})
        assert "not ready" in assert_error(r, 503, None)["message"]
