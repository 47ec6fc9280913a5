"""`POST /v1/audio/speech`: OpenAI's text-to-speech endpoint on the shared engine.

Speech (`/v1/audio/speech`, JSON body):

- ``input`` (required, 1..4096 characters), ``model`` and ``voice`` (any string: the
  shipped Piper voice speaks for every OpenAI voice name), ``instructions`` (accepted;
  the shipped voice cannot follow style instructions), ``speed`` 0.25..4.0, ``seed``
  (voxline extension: same text, speed and seed give the same samples), unknown keys 400.
- Voice cloning (Qwen3-TTS Base checkpoints): ``ref_audio`` (a base64 audio file or a
  ``data:audio/...;base64,`` URL) with an optional ``ref_text`` (its transcript), as
  vllm-omni's speech API; or ``voice`` naming a voice registered with `POST /v1/voices`
  (`voices.py`). Other TTS models answer 400 naming ``ref_audio``.
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
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    field_validator,
)
from pydantic_core import PydanticCustomError
from starlette.types import Receive, Scope, Send

from voxline.codecs import Resampler, float_to_pcm16
from voxline.codecs.opus import FILE_FORMATS, StreamingFileEncoder
from voxline.engines import protocol as p
from voxline.engines.client import StreamHandle
from voxline.errors import EngineError
from voxline.realtime.http.audio_requests import (
    AudioAPIError,
    bad,
    check_request,
    close_quietly,
    open_stream,
    stream_error,
    unavailable,
)
from voxline.realtime.http.voices import reference_from_request
from voxline.realtime.state import ServerState

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
SPEECH_REQUEST_FIELDS = ("model", "input", "voice", "instructions", "response_format",
                         "speed", "stream_format", "seed", "ref_audio", "ref_text")
MAX_SEED = 2**63 - 1


def _number(value: Any) -> float:
    # strict JSON number: ints count, booleans and numeric strings do not
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PydanticCustomError("invalid_type", "'speed' must be a number from {lo} to {hi}",
                                  {"lo": MIN_SPEED, "hi": MAX_SPEED})
    return float(value)


def _speed(value: float) -> float:
    if not math.isfinite(value) or not MIN_SPEED <= value <= MAX_SPEED:
        raise PydanticCustomError("out_of_range", "'speed' must be a number from {lo} to {hi}, "
                                  "got {got}", {"lo": MIN_SPEED, "hi": MAX_SPEED, "got": value})
    return value


def _text(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("empty", "'input' is empty: give the text to speak")
    if len(value) > MAX_INPUT_CHARS:
        raise PydanticCustomError("too_long", "'input' is {n} characters; the maximum is {max}",
                                  {"n": len(value), "max": MAX_INPUT_CHARS})
    return value


def _choice(allowed: tuple[str, ...], name: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in allowed:
            raise PydanticCustomError("unsupported", "'{name}' {got} is not supported; use one "
                                      "of {allowed}", {"name": name, "got": repr(value),
                                                       "allowed": ", ".join(allowed)})
        return value
    return check


class SpeechRequest(BaseModel):
    """A `/v1/audio/speech` body: OpenAI's fields plus ``seed``; unknown fields refused."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    input: Annotated[str, AfterValidator(_text)]
    model: str | None = None
    voice: Annotated[str, Field(min_length=1)] = "alloy"
    instructions: str | None = None
    response_format: Annotated[str, AfterValidator(_choice(SPEECH_FORMATS,
                                                           "response_format"))] = "mp3"
    speed: Annotated[float, PlainValidator(_number), AfterValidator(_speed)] = 1.0
    stream_format: Annotated[str, AfterValidator(_choice(STREAM_FORMATS,
                                                         "stream_format"))] = "audio"
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = None
    # Voice cloning (Base checkpoints), as vllm-omni's speech API: a reference clip (base64
    # or a data URL of any audio file) and its transcript (optional: x-vector only without).
    ref_audio: Annotated[str, Field(min_length=1)] | None = None
    ref_text: str | None = None

    @field_validator("instructions")
    @classmethod
    def _no_style(cls, value: str | None) -> str | None:
        if value:  # accepting it would mean ignoring it
            raise PydanticCustomError("unsupported", "'instructions' (a speaking style) is not "
                                      "supported by this server's voices")
        return value

    @field_validator("speed", mode="before")
    @classmethod
    def _null_speed(cls, value: Any) -> Any:
        return 1.0 if value is None else value


_MESSAGES = {
    "missing": "'{field}' is required: the text to speak",
    "string_type": "'{field}' must be a string",
    "int_type": "'{field}' must be an integer from 0 to " + str(MAX_SEED),
    "greater_than_equal": "'{field}' must be an integer from 0 to " + str(MAX_SEED),
    "less_than_equal": "'{field}' must be an integer from 0 to " + str(MAX_SEED),
    "string_too_short": "'{field}' must be a voice name such as "
                        + ", ".join(OPENAI_VOICES[:4]) + ", ...",
    "extra_forbidden": "unrecognized request argument supplied: '{field}' (supported: "
                       + ", ".join(sorted(SPEECH_REQUEST_FIELDS)) + ")",
}
_CODES = {"missing": "missing_required_parameter", "string_type": "invalid_type",
          "int_type": "invalid_type", "extra_forbidden": "unknown_parameter",
          "too_long": "string_above_max_length", "invalid_type": "invalid_type"}


def parse_speech_request(body: object) -> SpeechRequest:
    """Validate a decoded JSON body; raises `AudioAPIError` (400) naming the offending field."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_request")
    try:
        return SpeechRequest.model_validate(body)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        field = str(err["loc"][0]) if err["loc"] else None
        kind = err["type"]
        if kind == "string_type" and field == "voice":
            kind = "string_too_short"  # a voice that is not a string: say what a voice is
        template = _MESSAGES.get(kind)
        if kind == "string_too_short" and field != "voice":
            template = "'{field}' must not be empty"
        message = template.format(field=field) if template else err["msg"]
        raise bad(message, field, _CODES.get(kind, "invalid_value")) from None


class SpeechSynthesis:
    """One speech request's engine stream: `Speak` in, 24 kHz float32 audio pieces out."""

    def __init__(self, state: ServerState, req: SpeechRequest,
                 reference: p.VoiceReference | None = None) -> None:
        self.state = state
        self.req = req
        self.reference = reference
        self.handle: StreamHandle | None = None
        self.started = time.perf_counter()
        self.first_audio_seconds: float | None = None
        self.samples = 0  # at SPEECH_RATE, returned so far
        self._resampler: Resampler | None = None
        self._done = False

    async def start(self) -> None:
        """Open the stream and ask for the speech; raises `AudioAPIError` (503) if it cannot."""
        self.handle = await open_stream(self.state, "speech")
        sid = self.handle.stream_id
        try:
            self.handle.send(p.Speak(sid, f"resp_{uuid.uuid4().hex}", self.req.input,
                                     self.req.speed, self.req.seed, self.req.voice,
                                     self.reference))
        except EngineError as exc:
            await self.close()
            raise unavailable(f"the engine is not ready ({exc}); retry shortly") from exc

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
                raise unavailable(f"the engine stream ended: {exc}") from exc
            if isinstance(out, p.AudioChunk):
                if self.first_audio_seconds is None:
                    self.first_audio_seconds = time.perf_counter() - self.started
                    self.state.metrics.observe("voxline_speech_request_seconds",
                                               self.first_audio_seconds)
                audio = self._resample(np.frombuffer(out.audio, dtype="<f4"), out.sample_rate)
                if len(audio):
                    return self._count(audio)
            elif isinstance(out, p.ResponseFinished):
                self._done = True
                if out.status != p.ResponseStatus.COMPLETED:
                    raise AudioAPIError(500, f"speech synthesis ended with status "
                                        f"{out.status.name.lower()}", code="speech_failed",
                                        type="server_error")
                tail = self._resampler.flush() if self._resampler else np.zeros(0, np.float32)
                return self._count(tail) if len(tail) else None
            elif isinstance(out, p.StreamError):
                raise stream_error(out)
            elif isinstance(out, p.StreamClosed):
                raise unavailable("the engine closed the speech stream early")
        return None

    async def close(self) -> None:
        """Close the engine stream (idempotent, safe during cancellation); count the audio."""
        handle, self.handle = self.handle, None
        if handle is not None:
            m = self.state.metrics
            m.inc("voxline_speech_requests_total", "requests to /v1/audio/speech")
            m.inc("voxline_speech_audio_seconds_total", "seconds of audio /v1/audio/speech sent",
                  self.samples / SPEECH_RATE)
        await close_quietly(handle)

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
        raise bad(f"the request body is not valid JSON: {exc}", None, "invalid_json") from exc


_SPEECH_SCHEMA = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["input"], "properties": {
        "model": {"type": "string"}, "input": {"type": "string", "maxLength": MAX_INPUT_CHARS},
        "voice": {"type": "string", "default": "alloy"}, "instructions": {"type": "string"},
        "response_format": {"enum": list(SPEECH_FORMATS), "default": "mp3"},
        "speed": {"type": "number", "minimum": MIN_SPEED, "maximum": MAX_SPEED, "default": 1.0},
        "stream_format": {"enum": list(STREAM_FORMATS), "default": "audio"},
        "seed": {"type": "integer", "minimum": 0},
        "ref_audio": {"type": "string", "description": "voice to clone: base64 audio file"},
        "ref_text": {"type": "string", "description": "transcript of ref_audio"}}}}}}}
@router.post("/v1/audio/speech", response_model=None, openapi_extra=_SPEECH_SCHEMA)
async def create_speech(request: Request) -> Response:
    """Text to speech (OpenAI `audio.speech.create`); see the module docstring."""
    try:
        state = check_request(request)
        req = parse_speech_request(await _read_json(request))
        reference = await reference_from_request(request, state, req.voice, req.ref_audio,
                                                 req.ref_text)
        speech = SpeechSynthesis(state, req, reference)
        await speech.start()
    except AudioAPIError as exc:
        return exc.response()
    handed_off = False
    try:
        first = await speech.next_audio()
        if first is None:  # the text chunker found no letters or digits to speak
            raise bad("'input' has nothing to speak: it contains no words", "input")
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
