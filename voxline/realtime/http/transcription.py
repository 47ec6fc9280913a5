"""`POST /v1/audio/transcriptions`: OpenAI's transcription endpoint on the shared engine.

Transcription (`/v1/audio/transcriptions`, multipart form):

- ``file`` (required, any format PyAV decodes, at most 25 MiB and 10 minutes of audio),
  ``model`` (any), ``language`` (only ``en``: the shipped ASR is Moonshine base-en),
  ``response_format`` ``json`` (default) | ``text`` | ``verbose_json``. What the ASR
  does anyway is accepted: ``temperature`` 0 (it decodes greedily),
  ``timestamp_granularities[]=segment`` (``verbose_json`` has segments),
  ``chunking_strategy=auto`` (it cuts long audio at quiet points). Anything it would
  have to ignore is refused with a 400 naming the field: a non-empty ``prompt``, another
  temperature, word timestamps, ``include[]``, ``stream=true``.
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
import logging
import math

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException

from voxline.codecs.opus import decode_audio_file
from voxline.engines import protocol as p
from voxline.engines.protocol import MIN_COMMIT_MS
from voxline.errors import AudioFormatError, EngineError
from voxline.realtime.http.audio_requests import (
    AudioAPIError,
    bad,
    check_request,
    close_quietly,
    open_stream,
    stream_error,
    unavailable,
)
from voxline.realtime.state import ServerState

logger = logging.getLogger(__name__)

router = APIRouter()

TRANSCRIPTION_FORMATS = ("json", "text", "verbose_json")
TRANSCRIPTION_LANGUAGES = ("en",)
MAX_UPLOAD_BYTES = 25 * 1024 * 1024  # OpenAI's limit
MAX_TRANSCRIPTION_SECONDS = 600.0
ASR_WINDOW_SECONDS = 30.0
ASR_CUT_SEARCH_SECONDS = 10.0
MIN_UTTERANCE_SECONDS = MIN_COMMIT_MS / 1000  # the engine refuses to commit less
TRANSCRIPTION_FIELDS = frozenset({
    "file", "model", "language", "response_format", "stream", "prompt", "temperature",
    "timestamp_granularities", "timestamp_granularities[]", "include", "include[]",
    "chunking_strategy",
})


_TRANSCRIPTION_SCHEMA = {"requestBody": {"required": True, "content": {"multipart/form-data": {
    "schema": {"type": "object", "required": ["file"], "properties": {
        "file": {"type": "string", "format": "binary"}, "model": {"type": "string"},
        "language": {"enum": list(TRANSCRIPTION_LANGUAGES)},
        "response_format": {"enum": list(TRANSCRIPTION_FORMATS), "default": "json"}}}}}}}


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
    handle = await open_stream(state, "transcription")
    texts: list[str] = []
    try:
        for i, (start, end) in enumerate(spans):
            item_id = f"window-{i}"
            try:
                handle.send(p.AppendAudio(handle.stream_id, audio[start:end].astype("<f4").tobytes()))
                handle.send(p.CommitAudio(handle.stream_id, item_id))
            except EngineError as exc:
                raise unavailable(f"the engine stream ended: {exc}") from exc
            while True:
                try:
                    out = await handle.next()
                except EngineError as exc:
                    raise unavailable(f"the engine stream ended: {exc}") from exc
                if isinstance(out, p.TranscriptFinal) and out.item_id == item_id:
                    texts.append(out.text.strip())
                    break
                if isinstance(out, p.StreamError):
                    raise stream_error(out)
                if isinstance(out, p.StreamClosed):
                    raise unavailable("the engine closed the transcription stream early")
    finally:
        await close_quietly(handle)
    return texts


def _refuse_unsupported(form: FormData) -> None:
    """400 for options the ASR would have to ignore (prompt, word timestamps, logprobs)."""
    if (_form_text(form, "prompt") or "").strip():
        raise bad("'prompt' is not supported: the ASR cannot be steered by a prompt", "prompt",
                  "unsupported_value")
    for key in ("timestamp_granularities", "timestamp_granularities[]"):
        for value in form.getlist(key):
            if value != "segment":
                raise bad(f"{key} {value!r} is not supported; only 'segment' (with "
                          "response_format 'verbose_json')", key, "unsupported_value")
    for key in ("include", "include[]"):
        if form.getlist(key):
            raise bad(f"'{key}' is not supported (no logprobs)", key, "unsupported_value")
    strategy = _form_text(form, "chunking_strategy")
    if strategy not in (None, "auto"):
        raise bad(f"chunking_strategy {strategy!r} is not supported; only 'auto'",
                  "chunking_strategy", "unsupported_value")


async def _read_form(request: Request) -> FormData:
    try:
        return await request.form(max_files=1)
    except HTTPException as exc:
        raise bad(f"could not parse the multipart form: {exc.detail}", None,
                   "invalid_multipart") from exc


def _form_text(form: FormData, key: str) -> str | None:
    value = form.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad(f"'{key}' must be a text field, not a file", key, "invalid_type")
    return value


async def _read_upload(form: FormData) -> bytes:
    upload = form.get("file")
    if upload is None:
        hint = "" if form else " (send the request as multipart/form-data)"
        raise bad(f"'file' is required: the audio file to transcribe{hint}", "file",
                   "missing_required_parameter")
    if not isinstance(upload, UploadFile):
        raise bad("'file' must be an uploaded file (a multipart part with a filename)",
                   "file", "invalid_type")
    if upload.size is not None and upload.size > MAX_UPLOAD_BYTES:
        raise AudioAPIError(413, f"'file' is {upload.size} bytes; the maximum is "
                            f"{MAX_UPLOAD_BYTES} bytes", param="file", code="file_too_large")
    data = await upload.read(MAX_UPLOAD_BYTES + 1)
    if len(data) > MAX_UPLOAD_BYTES:
        raise AudioAPIError(413, f"'file' is larger than {MAX_UPLOAD_BYTES} bytes",
                            param="file", code="file_too_large")
    if not data:
        raise bad("'file' is empty (0 bytes)", "file", "empty_file")
    return data


@router.post("/v1/audio/transcriptions", response_model=None, openapi_extra=_TRANSCRIPTION_SCHEMA)
async def create_transcription(request: Request) -> Response:
    """Speech to text (OpenAI `audio.transcriptions.create`); see the module docstring."""
    form: FormData | None = None
    try:
        state = check_request(request)
        form = await _read_form(request)
        for key in form:
            if key not in TRANSCRIPTION_FIELDS:
                raise bad(f"unrecognized request argument supplied: {key!r}", key,
                           "unknown_parameter")
        for key in ("model", "prompt"):
            _form_text(form, key)
        language = _form_text(form, "language")
        if language and language.strip().lower() not in TRANSCRIPTION_LANGUAGES:
            raise bad(f"language {language!r} is not supported; the ASR model (Moonshine "
                       "base-en) transcribes English only: use 'en' or omit it", "language",
                       "unsupported_language")
        fmt = _form_text(form, "response_format") or "json"
        if fmt not in TRANSCRIPTION_FORMATS:
            raise bad(f"response_format {fmt!r} is not supported; use one of "
                       f"{', '.join(TRANSCRIPTION_FORMATS)}", "response_format")
        temperature = _form_text(form, "temperature")
        if temperature is not None:
            try:
                value = float(temperature)
            except ValueError:
                raise bad(f"'temperature' must be a number, got {temperature!r}",
                           "temperature", "invalid_type") from None
            if value != 0:
                raise bad(f"'temperature' {value:g} is not supported: the ASR decodes "
                          "greedily (temperature 0)", "temperature", "unsupported_value")
        _refuse_unsupported(form)
        stream = (_form_text(form, "stream") or "false").strip().lower()
        if stream not in ("false", "0", ""):
            raise bad("streamed transcription is not supported here; use the /v1/realtime "
                       "WebSocket for live transcripts", "stream", "unsupported_value")
        data = await _read_upload(form)
        try:
            audio, _ = await asyncio.to_thread(decode_audio_file, data, p.INPUT_RATE)
        except AudioFormatError as exc:
            raise bad(f"could not decode 'file' as audio ({len(data)} bytes; formats such as "
                       f"wav, mp3, ogg, flac, webm and m4a are supported): {exc}", "file",
                       "invalid_audio") from exc
        duration = len(audio) / p.INPUT_RATE
        if duration > MAX_TRANSCRIPTION_SECONDS:
            raise bad(f"'file' holds {duration:.1f} s of audio; the maximum is "
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
