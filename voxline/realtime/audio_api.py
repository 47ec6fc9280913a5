"""OpenAI-compatible audio endpoints: `POST /v1/audio/speech` and `POST /v1/audio/transcriptions`.

Both run on the shared engine through one short-lived stream per HTTP request (a unique
id, always closed, also when the client goes away). Errors use OpenAI's body shape
``{"error": {"message", "type", "param", "code"}}``: 400 for bad input, 401 for a wrong
API key (when `Settings.api_key` is set), 413 for an oversized upload, 503 while the
engine is not ready or is at capacity, 500 when the engine fails a request.

Speech (`/v1/audio/speech`, JSON body):

- ``input`` (required, 1..4096 characters), ``model`` and ``voice`` (any string: the
  shipped Piper voice speaks for every OpenAI voice name), ``instructions`` (accepted;
  the shipped voice cannot follow style instructions), ``speed`` 0.25..4.0, ``seed``
  (voxline extension: same text, speed and seed give the same samples), unknown keys 400.
- Audio is 24 kHz mono (OpenAI's rate), resampled from the TTS model's rate with soxr.
- ``response_format`` as OpenAI's: ``mp3`` (the default), ``opus`` (Ogg Opus), ``aac``
  (ADTS), ``flac``, ``wav``, ``pcm`` (raw PCM16 LE). Every format is *streamed*: each
  sentence's audio is encoded (on a worker thread) and sent as soon as the engine has
  synthesized it. Containers are written forward only, so the streamed WAV header
  declares unknown sizes (RIFF and data size 0xFFFFFFFF, as FFmpeg writes to pipes),
  FLAC's STREAMINFO carries no total length and MP3 has no Xing/LAME header; readers
  take the data up to the end of the file.
- ``stream_format="sse"`` sends ``speech.audio.delta`` events whose ``audio`` is base64
  bytes of the ``response_format`` (their concatenation is the file; ``wav`` deltas are
  its PCM16 samples, without a header), then one ``speech.audio.done`` event with
  ``usage``; a failure mid-stream sends an ``error`` event. Streamed bodies that fail after the first byte are cut off (the
  connection closes without the final chunk) rather than ending as if complete.
- The status code is decided once the first sentence's audio exists, so an engine
  failure on it is an HTTP error, not a 200 with an empty body; input with nothing to
  speak (no letters or digits, e.g. ``"..."``) is a 400.

Transcription (`/v1/audio/transcriptions`, multipart form):

- ``file`` (required, any format PyAV decodes, at most 25 MiB and 10 minutes of audio),
  ``model`` (any), ``language`` (only ``en``: the shipped ASR is Moonshine base-en),
  ``response_format`` ``json`` (default) | ``text`` | ``verbose_json``; ``prompt``,
  ``temperature``, ``timestamp_granularities[]``, ``include[]`` and
  ``chunking_strategy`` are accepted and ignored; ``stream=true`` is refused.
- The upload is decoded and resampled to 16 kHz on a worker thread. Audio shorter than
  the engine's minimum utterance (100 ms) gives ``{"text": ""}``.
- Moonshine takes at most 64 s per call, so audio longer than `ASR_WINDOW_SECONDS` (30 s)
  is cut into windows of at most that length; each cut is placed at the quietest 20 ms
  frame of the window's last `ASR_CUT_SEARCH_SECONDS` (10 s), so words are rarely split.
  Windows are transcribed one after another (other sessions' utterances can run in
  between) and their texts joined with spaces.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import struct
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from voxline.codecs import Resampler, float_to_pcm16
from voxline.codecs.opus import FILE_FORMATS, StreamingFileEncoder, decode_audio_file
from voxline.engines import protocol as p
from voxline.engines.client import ENGINE_CLOSED, ENGINE_DEAD, StreamHandle
from voxline.errors import AudioFormatError, EngineDeadError, EngineError
from voxline.realtime.app import ServerState, get_state

logger = logging.getLogger(__name__)

router = APIRouter()

SPEECH_RATE = 24000
MAX_INPUT_CHARS = 4096
MIN_SPEED, MAX_SPEED = 0.25, 4.0
SPEECH_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")  # OpenAI's, mp3 the default
MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm",
               **{name: fmt.media_type for name, fmt in FILE_FORMATS.items()}}
STREAM_FORMATS = ("audio", "sse")
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage",
                 "shimmer", "verse", "marin", "cedar")
SPEECH_FIELDS = frozenset({"model", "input", "voice", "instructions", "response_format", "speed",
                           "stream_format", "seed"})
MAX_SEED = 2**63 - 1

TRANSCRIPTION_FORMATS = ("json", "text", "verbose_json")
TRANSCRIPTION_LANGUAGES = ("en",)
MAX_UPLOAD_BYTES = 25 * 1024 * 1024  # OpenAI's limit
MAX_TRANSCRIPTION_SECONDS = 600.0
ASR_WINDOW_SECONDS = 30.0
ASR_CUT_SEARCH_SECONDS = 10.0
MIN_UTTERANCE_SECONDS = 0.1  # the engine refuses to commit less (OpenAI's minimum)
IGNORED_TRANSCRIPTION_FIELDS = frozenset({
    "prompt", "temperature", "timestamp_granularities", "timestamp_granularities[]",
    "include", "include[]", "chunking_strategy",
})
TRANSCRIPTION_FIELDS = frozenset({"file", "model", "language", "response_format", "stream"}
                                 ) | IGNORED_TRANSCRIPTION_FIELDS


# ------------------------------------------------------------------------------- errors


class AudioAPIError(Exception):
    """An HTTP error with OpenAI's error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def _bad(message: str, param: str | None, code: str = "invalid_value") -> AudioAPIError:
    return AudioAPIError(400, message, param=param, code=code)


def _unavailable(message: str, code: str = "engine_unavailable") -> AudioAPIError:
    return AudioAPIError(503, message, code=code, type="server_error")


def _stream_error(err: p.StreamError) -> AudioAPIError:
    """Map an engine stream error onto an HTTP error."""
    if err.code in (ENGINE_DEAD, ENGINE_CLOSED):
        return _unavailable(f"the engine stopped while serving the request: {err.message}")
    if err.code == "capacity":
        return _unavailable(err.message, code="engine_at_capacity")
    return AudioAPIError(500, err.message, code=err.code, type="server_error")


def _check_request(request: Request) -> ServerState:
    """The server state, once the API key (if configured) and engine readiness check out."""
    state = get_state(request)
    key = state.settings.api_key
    if key:
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or token.strip() != key:
            raise AudioAPIError(401, "missing or incorrect API key: send 'Authorization: Bearer "
                                "<key>'", code="invalid_api_key")
    if not state.engine.ready:
        reason = state.engine.status().get("last_error") or "the engine is starting"
        raise _unavailable(f"the engine is not ready ({reason}); retry shortly")
    return state


async def _close_quietly(handle: StreamHandle | None) -> None:
    """Close an engine stream even while the calling task is being cancelled."""
    if handle is None:
        return
    with anyio.CancelScope(shield=True):
        try:
            await handle.aclose()
        except Exception:  # closing must never mask the request's own outcome
            logger.exception("closing engine stream %r failed", handle.stream_id)


async def _open_stream(state: ServerState, prefix: str) -> StreamHandle:
    stream_id = f"{prefix}-{uuid.uuid4().hex}"
    config = p.StreamConfig(turn_detection=None, transcribe_partials=False)
    try:
        return await state.engine.open_stream(stream_id, config)
    except EngineDeadError as exc:
        raise _unavailable(f"the engine is not ready ({exc}); retry shortly") from exc


# ------------------------------------------------------------------------------- speech


@dataclass(frozen=True)
class SpeechRequest:
    """A validated `/v1/audio/speech` body."""

    input: str
    voice: str = "alloy"
    response_format: str = "mp3"
    speed: float = 1.0
    stream_format: str = "audio"
    seed: int | None = None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse_speech_request(body: object) -> SpeechRequest:
    """Validate a decoded JSON body; raises `AudioAPIError` (400) naming the offending field."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None, "invalid_request")
    for key in body:
        if key not in SPEECH_FIELDS:
            raise _bad(f"unrecognized request argument supplied: {key!r} (supported: "
                       f"{', '.join(sorted(SPEECH_FIELDS))})", key, "unknown_parameter")
    for key in ("model", "instructions"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise _bad(f"'{key}' must be a string", key, "invalid_type")
    text = body.get("input")
    if text is None:
        raise _bad("'input' is required: the text to speak", "input", "missing_required_parameter")
    if not isinstance(text, str):
        raise _bad("'input' must be a string", "input", "invalid_type")
    if not text.strip():
        raise _bad("'input' is empty: give the text to speak", "input")
    if len(text) > MAX_INPUT_CHARS:
        raise _bad(f"'input' is {len(text)} characters; the maximum is {MAX_INPUT_CHARS}",
                   "input", "string_above_max_length")
    voice = body.get("voice", "alloy")
    if not isinstance(voice, str) or not voice:
        raise _bad(f"'voice' must be a voice name such as {', '.join(OPENAI_VOICES[:4])}, ...",
                   "voice", "invalid_type")
    fmt = body.get("response_format", "mp3")
    if fmt not in SPEECH_FORMATS:
        raise _bad(f"'response_format' {fmt!r} is not supported; use one of "
                   f"{', '.join(SPEECH_FORMATS)}", "response_format")
    speed = body.get("speed", 1.0)
    if speed is None:
        speed = 1.0
    if not _is_number(speed) or not math.isfinite(speed) or not MIN_SPEED <= speed <= MAX_SPEED:
        raise _bad(f"'speed' must be a number from {MIN_SPEED} to {MAX_SPEED}, got {speed!r}",
                   "speed")
    stream_format = body.get("stream_format", "audio")
    if stream_format not in STREAM_FORMATS:
        raise _bad(f"'stream_format' must be one of {', '.join(STREAM_FORMATS)}, got "
                   f"{stream_format!r}", "stream_format")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)
                             or not 0 <= seed <= MAX_SEED):
        raise _bad(f"'seed' must be an integer from 0 to {MAX_SEED}, got {seed!r}", "seed")
    return SpeechRequest(text, voice, fmt, float(speed), stream_format, seed)


class SpeechSynthesis:
    """One speech request's engine stream: `Speak` in, 24 kHz float32 audio pieces out."""

    def __init__(self, state: ServerState, req: SpeechRequest) -> None:
        self.state = state
        self.req = req
        self.handle: StreamHandle | None = None
        self.started = time.perf_counter()
        self.first_audio_seconds: float | None = None
        self.samples = 0  # at SPEECH_RATE, returned so far
        self._resampler: Resampler | None = None
        self._done = False

    async def start(self) -> None:
        """Open the stream and ask for the speech; raises `AudioAPIError` (503) if it cannot."""
        self.handle = await _open_stream(self.state, "speech")
        sid = self.handle.stream_id
        try:
            self.handle.send(p.Speak(sid, f"resp_{uuid.uuid4().hex}", self.req.input,
                                     self.req.speed, self.req.seed, self.req.voice))
        except EngineError as exc:
            await self.close()
            raise _unavailable(f"the engine is not ready ({exc}); retry shortly") from exc

    async def next_audio(self) -> np.ndarray | None:
        """The next non-empty piece of audio, or None once the speech is complete.

        Raises `AudioAPIError` when the engine reports an error (a failed sentence too:
        audio is never silently missing).
        """
        assert self.handle is not None
        while not self._done:
            try:
                out = await self.handle.next()
            except EngineError as exc:
                raise _unavailable(f"the engine stream ended: {exc}") from exc
            if isinstance(out, p.AudioChunk):
                if self.first_audio_seconds is None:
                    self.first_audio_seconds = time.perf_counter() - self.started
                    self.state.metrics.observe("voxline_speech_request_seconds",
                                               self.first_audio_seconds)
                audio = self._resample(np.frombuffer(out.audio, dtype="<f4"), out.sample_rate)
                if len(audio):
                    return self._count(audio)
            elif isinstance(out, p.ResponseDone):
                self._done = True
                if out.status != p.ResponseStatus.COMPLETED:
                    raise AudioAPIError(500, f"speech synthesis ended with status "
                                        f"{out.status.name.lower()}", code="speech_failed",
                                        type="server_error")
                tail = self._resampler.flush() if self._resampler else np.zeros(0, np.float32)
                return self._count(tail) if len(tail) else None
            elif isinstance(out, p.StreamError):
                raise _stream_error(out)
            elif isinstance(out, p.StreamClosed):
                raise _unavailable("the engine closed the speech stream early")
        return None

    async def close(self) -> None:
        """Close the engine stream (idempotent, safe during cancellation); count the audio."""
        handle, self.handle = self.handle, None
        if handle is not None:
            m = self.state.metrics
            m.inc("voxline_speech_requests_total", "requests to /v1/audio/speech")
            m.inc("voxline_speech_audio_seconds_total", "seconds of audio /v1/audio/speech sent",
                  self.samples / SPEECH_RATE)
        await _close_quietly(handle)

    def _resample(self, audio: np.ndarray, rate: int) -> np.ndarray:
        if self._resampler is None or self._resampler.in_rate != rate:
            tail = self._resampler.flush() if self._resampler else np.zeros(0, np.float32)
            self._resampler = Resampler(rate, SPEECH_RATE)
            return np.concatenate([tail, self._resampler.process(audio)])
        return self._resampler.process(audio)

    def _count(self, audio: np.ndarray) -> np.ndarray:
        self.samples += len(audio)
        return audio


def streaming_wav_header(rate: int) -> bytes:
    """A PCM16 mono WAV header whose RIFF and data sizes are unknown (0xFFFFFFFF)."""
    unknown = 0xFFFFFFFF
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return (b"RIFF" + struct.pack("<I", unknown) + b"WAVE" + b"fmt " + struct.pack("<I", 16)
            + fmt + b"data" + struct.pack("<I", unknown))


class EngineStreamResponse(StreamingResponse):
    """A streaming response that runs `cleanup` however it ends (done, error, disconnect)."""

    def __init__(self, content: AsyncIterator[bytes], cleanup: Callable[[], Awaitable[None]],
                 **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._cleanup()


class SpeechEncoder:
    """24 kHz float audio -> the bytes of a `response_format`, piece by piece.

    Compressed formats are encoded on a worker thread (never on the event loop).
    """

    def __init__(self, fmt: str, *, header: bool = True) -> None:
        self.fmt = fmt
        self._file = StreamingFileEncoder(fmt, SPEECH_RATE) if fmt in FILE_FORMATS else None
        self._header = header and fmt == "wav"

    async def push(self, audio: np.ndarray) -> bytes:
        if self._file is not None:
            return await asyncio.to_thread(self._file.push, audio)
        head, self._header = (streaming_wav_header(SPEECH_RATE) if self._header else b""), False
        return head + float_to_pcm16(audio)

    async def finish(self) -> bytes:
        return b"" if self._file is None else await asyncio.to_thread(self._file.finish)


async def _audio_body(speech: SpeechSynthesis, first: np.ndarray | None,
                      fmt: str) -> AsyncIterator[bytes]:
    encoder = SpeechEncoder(fmt)
    try:
        audio = first
        while audio is not None:
            data = await encoder.push(audio)
            if data:
                yield data
            audio = await speech.next_audio()
        tail = await encoder.finish()
        if tail:
            yield tail
    except AudioAPIError as exc:
        logger.error("/v1/audio/speech failed mid-stream: %s", exc.message)
        raise
    finally:
        await speech.close()


def _sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


def _sse_delta(data: bytes) -> bytes:
    return _sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})


async def _sse_body(speech: SpeechSynthesis, first: np.ndarray | None,
                    fmt: str) -> AsyncIterator[bytes]:
    encoder = SpeechEncoder(fmt, header=False)
    try:
        audio = first
        while audio is not None:
            data = await encoder.push(audio)
            if data:
                yield _sse_delta(data)
            audio = await speech.next_audio()
        tail = await encoder.finish()
        if tail:
            yield _sse_delta(tail)
        yield _sse({"type": "speech.audio.done", "usage": {
            # voxline runs no tokenizer for TTS: token counts are 0; the extension fields
            # say what was actually spoken.
            "input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
            "input_characters": len(speech.req.input),
            "output_audio_seconds": round(speech.samples / SPEECH_RATE, 3),
        }})
    except AudioAPIError as exc:
        logger.error("/v1/audio/speech (sse) failed mid-stream: %s", exc.message)
        yield _sse({"type": "error", **exc.body()})
    finally:
        await speech.close()


async def _read_json(request: Request) -> object:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad(f"the request body is not valid JSON: {exc}", None, "invalid_json") from exc


_SPEECH_SCHEMA = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["input"], "properties": {
        "model": {"type": "string"}, "input": {"type": "string", "maxLength": MAX_INPUT_CHARS},
        "voice": {"type": "string", "default": "alloy"}, "instructions": {"type": "string"},
        "response_format": {"enum": list(SPEECH_FORMATS), "default": "mp3"},
        "speed": {"type": "number", "minimum": MIN_SPEED, "maximum": MAX_SPEED, "default": 1.0},
        "stream_format": {"enum": list(STREAM_FORMATS), "default": "audio"},
        "seed": {"type": "integer", "minimum": 0}}}}}}}
_TRANSCRIPTION_SCHEMA = {"requestBody": {"required": True, "content": {"multipart/form-data": {
    "schema": {"type": "object", "required": ["file"], "properties": {
        "file": {"type": "string", "format": "binary"}, "model": {"type": "string"},
        "language": {"enum": list(TRANSCRIPTION_LANGUAGES)},
        "response_format": {"enum": list(TRANSCRIPTION_FORMATS), "default": "json"}}}}}}}


@router.post("/v1/audio/speech", response_model=None, openapi_extra=_SPEECH_SCHEMA)
async def create_speech(request: Request) -> Response:
    """Text to speech (OpenAI `audio.speech.create`); see the module docstring."""
    try:
        state = _check_request(request)
        req = parse_speech_request(await _read_json(request))
        speech = SpeechSynthesis(state, req)
        await speech.start()
    except AudioAPIError as exc:
        return exc.response()
    handed_off = False
    try:
        first = await speech.next_audio()
        if first is None:  # the text chunker found no letters or digits to speak
            raise _bad("'input' has nothing to speak: it contains no words", "input")
        handed_off = True
        if req.stream_format == "sse":
            return EngineStreamResponse(_sse_body(speech, first, req.response_format),
                                        speech.close, media_type="text/event-stream",
                                        headers={"Cache-Control": "no-cache"})
        return EngineStreamResponse(_audio_body(speech, first, req.response_format),
                                    speech.close, media_type=MEDIA_TYPES[req.response_format])
    except AudioAPIError as exc:
        return exc.response()
    finally:
        if not handed_off:
            await speech.close()


# ------------------------------------------------------------------------ transcription


def asr_windows(num_samples: int, audio: np.ndarray | None = None, rate: int = p.INPUT_RATE,
                window_s: float = ASR_WINDOW_SECONDS,
                search_s: float = ASR_CUT_SEARCH_SECONDS) -> list[tuple[int, int]]:
    """Split `num_samples` into `(start, end)` windows of at most `window_s` seconds.

    Each cut lies at the quietest 20 ms frame (lowest RMS of `audio`) within the last
    `search_s` seconds of its window, at the window's end without `audio`.
    """
    window = int(window_s * rate)
    search = min(int(search_s * rate), window)
    frame = max(1, rate // 50)
    spans: list[tuple[int, int]] = []
    start = 0
    while num_samples - start > window:
        cut = start + window
        if audio is not None and search >= frame:
            lo = start + window - search
            region = audio[lo:start + window]
            n = len(region) // frame
            rms = np.sqrt(np.mean(np.square(region[: n * frame].reshape(n, frame),
                                            dtype=np.float64), axis=1))
            cut = lo + int(np.argmin(rms)) * frame + frame // 2
        spans.append((start, cut))
        start = cut
    if num_samples > start:
        spans.append((start, num_samples))
    return spans


async def _transcribe(state: ServerState, audio: np.ndarray,
                      spans: list[tuple[int, int]]) -> list[str]:
    """Transcribe each window (in order) on one engine stream."""
    handle = await _open_stream(state, "transcription")
    texts: list[str] = []
    try:
        for i, (start, end) in enumerate(spans):
            item_id = f"window-{i}"
            try:
                handle.send(p.AppendAudio(handle.stream_id, audio[start:end].astype("<f4").tobytes()))
                handle.send(p.CommitAudio(handle.stream_id, item_id))
            except EngineError as exc:
                raise _unavailable(f"the engine stream ended: {exc}") from exc
            while True:
                try:
                    out = await handle.next()
                except EngineError as exc:
                    raise _unavailable(f"the engine stream ended: {exc}") from exc
                if isinstance(out, p.TranscriptFinal) and out.item_id == item_id:
                    texts.append(out.text.strip())
                    break
                if isinstance(out, p.StreamError):
                    raise _stream_error(out)
                if isinstance(out, p.StreamClosed):
                    raise _unavailable("the engine closed the transcription stream early")
    finally:
        await _close_quietly(handle)
    return texts


async def _read_form(request: Request) -> FormData:
    try:
        return await request.form(max_files=1)
    except HTTPException as exc:
        raise _bad(f"could not parse the multipart form: {exc.detail}", None,
                   "invalid_multipart") from exc


def _form_text(form: FormData, key: str) -> str | None:
    value = form.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad(f"'{key}' must be a text field, not a file", key, "invalid_type")
    return value


async def _read_upload(form: FormData) -> bytes:
    upload = form.get("file")
    if upload is None:
        hint = "" if form else " (send the request as multipart/form-data)"
        raise _bad(f"'file' is required: the audio file to transcribe{hint}", "file",
                   "missing_required_parameter")
    if not isinstance(upload, UploadFile):
        raise _bad("'file' must be an uploaded file (a multipart part with a filename)",
                   "file", "invalid_type")
    if upload.size is not None and upload.size > MAX_UPLOAD_BYTES:
        raise AudioAPIError(413, f"'file' is {upload.size} bytes; the maximum is "
                            f"{MAX_UPLOAD_BYTES} bytes", param="file", code="file_too_large")
    data = await upload.read(MAX_UPLOAD_BYTES + 1)
    if len(data) > MAX_UPLOAD_BYTES:
        raise AudioAPIError(413, f"'file' is larger than {MAX_UPLOAD_BYTES} bytes",
                            param="file", code="file_too_large")
    if not data:
        raise _bad("'file' is empty (0 bytes)", "file", "empty_file")
    return data


@router.post("/v1/audio/transcriptions", response_model=None, openapi_extra=_TRANSCRIPTION_SCHEMA)
async def create_transcription(request: Request) -> Response:
    """Speech to text (OpenAI `audio.transcriptions.create`); see the module docstring."""
    form: FormData | None = None
    try:
        state = _check_request(request)
        form = await _read_form(request)
        for key in form:
            if key not in TRANSCRIPTION_FIELDS:
                raise _bad(f"unrecognized request argument supplied: {key!r}", key,
                           "unknown_parameter")
        for key in ("model", "prompt"):
            _form_text(form, key)
        language = _form_text(form, "language")
        if language and language.strip().lower() not in TRANSCRIPTION_LANGUAGES:
            raise _bad(f"language {language!r} is not supported; the ASR model (Moonshine "
                       "base-en) transcribes English only: use 'en' or omit it", "language",
                       "unsupported_language")
        fmt = _form_text(form, "response_format") or "json"
        if fmt not in TRANSCRIPTION_FORMATS:
            raise _bad(f"response_format {fmt!r} is not supported; use one of "
                       f"{', '.join(TRANSCRIPTION_FORMATS)}", "response_format")
        temperature = _form_text(form, "temperature")
        if temperature is not None:
            try:
                float(temperature)
            except ValueError:
                raise _bad(f"'temperature' must be a number, got {temperature!r}",
                           "temperature", "invalid_type") from None
        stream = (_form_text(form, "stream") or "false").strip().lower()
        if stream not in ("false", "0", ""):
            raise _bad("streamed transcription is not supported here; use the /v1/realtime "
                       "WebSocket for live transcripts", "stream", "unsupported_value")
        data = await _read_upload(form)
        try:
            audio, _ = await asyncio.to_thread(decode_audio_file, data, p.INPUT_RATE)
        except AudioFormatError as exc:
            raise _bad(f"could not decode 'file' as audio ({len(data)} bytes; formats such as "
                       f"wav, mp3, ogg, flac, webm and m4a are supported): {exc}", "file",
                       "invalid_audio") from exc
        duration = len(audio) / p.INPUT_RATE
        if duration > MAX_TRANSCRIPTION_SECONDS:
            raise _bad(f"'file' holds {duration:.1f} s of audio; the maximum is "
                       f"{MAX_TRANSCRIPTION_SECONDS:.0f} s", "file", "audio_too_long")
        spans = [s for s in asr_windows(len(audio), audio, window_s=ASR_WINDOW_SECONDS,
                                          search_s=ASR_CUT_SEARCH_SECONDS)
                 if (s[1] - s[0]) >= MIN_UTTERANCE_SECONDS * p.INPUT_RATE]
        texts = await _transcribe(state, audio, spans) if spans else []
    except AudioAPIError as exc:
        return exc.response()
    finally:
        if form is not None:
            await form.close()
    m = state.metrics
    m.inc("voxline_transcription_requests_total", "requests to /v1/audio/transcriptions")
    m.inc("voxline_transcription_audio_seconds_total",
          "seconds of audio /v1/audio/transcriptions received", duration)
    text = " ".join(t for t in texts if t)
    if fmt == "text":
        return PlainTextResponse(text)
    if fmt == "verbose_json":
        segments = [{"id": i, "start": round(a / p.INPUT_RATE, 3),
                     "end": round(b / p.INPUT_RATE, 3), "text": t}
                    for i, ((a, b), t) in enumerate(zip(spans, texts, strict=True))]
        return JSONResponse({"task": "transcribe", "language": "english",
                             "duration": round(duration, 3), "text": text,
                             "segments": segments,
                             "usage": {"type": "duration", "seconds": math.ceil(duration)}})
    return JSONResponse({"text": text, "usage": {"type": "duration",
                                                 "seconds": math.ceil(duration)}})


__all__ = [
    "AudioAPIError",
    "SpeechRequest",
    "SpeechSynthesis",
    "asr_windows",
    "parse_speech_request",
    "router",
    "streaming_wav_header",
]
