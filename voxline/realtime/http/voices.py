"""Cloned voices: `POST /v1/voices` registers a reference clip, `GET` lists, `DELETE` removes.

Cloning needs a Qwen3-TTS *Base* checkpoint (``--tts qwen3:DIR``). A registered voice
is usable by name as ``voice`` in `/v1/audio/speech` and as ``session.audio.output.voice``
in `/v1/realtime` sessions. The server keeps each clip once, normalised (mono, 24 kHz,
peak <= 1: what both of the model's encoders take), and registers it with the engine's
speech stage, which encodes it on first use and caches the encoding; the engine never
sees this HTTP API, only `VoiceReference` payloads. Registrations live in the voice store
(`voice_store.VoiceStore`, a directory: the ``voice_dir`` setting, default a temporary one
a server restart forgets). Servers sharing one ``voice_dir`` share the voices: each
lookup reads the directory, and a voice this server's engine has not been told about yet
(registered through another server) is registered with it when a session names it and by
a sync every `SYNC_SECONDS`; the engine's encoded-voice cache stays per server. After an
engine restart (the supervisor's fresh engine process knows none) every stored voice is
registered with it again (:func:`keep_engine_voices`). A store that cannot be read gives
503 ``voice_store_unavailable`` on the voice endpoints and a session error naming the
voice; nothing else depends on it.

`POST /v1/voices` is multipart: ``name`` (letters, digits, ``-``/``_``, up to 64),
``audio`` (any file PyAV reads; ``file`` is accepted too) and optional ``ref_text``, the
clip's transcript (with it the clone is in-context, closer to the speaker; without it
x-vector only). Errors use OpenAI's error body and name the field at fault.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import UploadFile

from voxline.codecs.opus import decode_audio_file
from voxline.config import Settings
from voxline.engines import protocol as p
from voxline.engines.models.qwen3_tts.reference import (
    REFERENCE_RATE,
    check_duration,
    normalize_reference,
)
from voxline.errors import AudioFormatError, EngineError
from voxline.realtime.http.audio_requests import (
    AudioAPIError,
    bad,
    check_request,
    stream_error,
    unavailable,
)
from voxline.realtime.http.voice_store import StoredVoice, VoiceExists, VoiceStore, VoiceStoreError
from voxline.realtime.state import ServerState
from voxline.sessions.voices import VoiceNotRegistered

__all__ = ["StoredVoice", "VoiceStore", "clone_error", "keep_engine_voices",
           "reference_from_request", "router", "session_voice_check", "voice_store"]

logger = logging.getLogger(__name__)

router = APIRouter()

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_UPLOAD_BYTES = 20 * 1024 * 1024


SYNC_SECONDS = 2.0  # a shared store: how often voices added elsewhere reach this engine


@dataclass
class ServerVoices:
    """The store, and which of its voices this server's engine has been told about."""

    store: VoiceStore
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one engine change at a time
    known: set[str] = field(default_factory=set)  # lower-cased names the engine holds


def _store_call(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    return asyncio.to_thread(fn, *args)


def store_down(exc: VoiceStoreError) -> AudioAPIError:
    return unavailable(str(exc), "voice_store_unavailable")


def voice_store(request: Request) -> VoiceStore:
    return store_of(request.app.state).store


def store_of(app_state: Any) -> ServerVoices:
    voices = getattr(app_state, "voices", None)
    if voices is None:
        voices = app_state.voices = ServerVoices(VoiceStore(app_state.voxline.settings.voice_dir))
    return voices


async def keep_engine_voices(app_state: Any) -> None:
    """Runs for the app's life: after each engine restart, once the new engine is ready,
    register every stored voice with it again (a restarted engine process starts with
    none; sessions naming a voice would otherwise not hear it). The engine client tells
    us when it is ready again (`add_ready_listener`); nothing polls."""
    state: ServerState = app_state.voxline
    if clone_error(state.settings) is not None:
        return  # no voices can be registered on this server
    came_up = asyncio.Event()
    remove_listener = state.engine.add_ready_listener(came_up.set)
    seen = state.engine.status().get("restarts", 0)
    shared = store_of(app_state).store.shared
    try:
        while True:
            with contextlib.suppress(TimeoutError):  # a shared store: sync now and then
                await asyncio.wait_for(came_up.wait(), SYNC_SECONDS if shared else None)
            came_up.clear()  # a restart during the registration below sets it again
            restarts = state.engine.status().get("restarts", 0)
            if not state.engine.ready:
                continue
            if restarts != seen:
                store_of(app_state).known.clear()  # a fresh engine holds none
                if await _register_all(app_state, restarted=True):
                    seen = restarts
            elif shared:
                await _register_all(app_state)
    finally:
        remove_listener()


async def _register_all(app_state: Any, *, restarted: bool = False) -> bool:
    """Bring the engine up to the store: register the stored voices it was not told about,
    unregister those gone from the store; False if the engine or the store failed (the
    next time the engine is ready, or the next sync, tries again)."""
    voices = store_of(app_state)
    try:
        async with voices.lock:
            stored = {v.name.lower(): v.name for v in await _store_call(voices.store.all)}
            added = [name for key, name in stored.items() if key not in voices.known]
            for name in added:
                await _sync_voice(app_state.voxline, voices, name)
            for key in sorted(voices.known - stored.keys()):
                await _tell_engine(app_state.voxline, p.VoiceReference(b"", REFERENCE_RATE,
                                                                       None, key))
                voices.known.discard(key)
    except (AudioAPIError, VoiceStoreError) as exc:
        logger.warning("registering stored voices with the engine failed: %s", exc)
        return False
    if added:
        logger.info("registered %d voices with the %s engine", len(added),
                    "restarted" if restarted else "(voices added on another server)")
    return True


async def _sync_voice(state: ServerState, voices: ServerVoices, name: str) -> None:
    """Tell the engine about stored voice `name` (under `voices.lock`)."""
    voice = await _store_call(voices.store.get, name)
    if voice is not None:
        await _tell_engine(state, voice.reference(named=True))
        voices.known.add(name.lower())


async def _ensure_known(app_state: Any, name: str) -> None:
    """A session names a stored voice this engine was not told about: tell it now."""
    voices = store_of(app_state)
    try:
        async with voices.lock:
            if name.lower() not in voices.known:
                await _sync_voice(app_state.voxline, voices, name)
    except (AudioAPIError, VoiceStoreError) as exc:
        logger.warning("registering voice %r with the engine failed: %s", name, exc)


@functools.cache
def _model_type(model_dir: str) -> str | None:
    try:
        return str(json.loads((Path(model_dir) / "config.json").read_text())["tts_model_type"])
    except (OSError, ValueError, KeyError):
        return None


def clone_error(settings: Settings) -> str | None:
    """Why this server's TTS cannot clone a voice, or None when it can."""
    if not settings.tts.startswith("qwen3:"):
        return (f"this server's TTS ({settings.tts}) cannot clone voices; serve a Qwen3-TTS "
                "Base checkpoint (--tts qwen3:DIR)")
    kind = _model_type(settings.tts.removeprefix("qwen3:"))
    if kind != "base":
        return (f"this server's Qwen3-TTS checkpoint is a {kind or 'unknown'} model, which "
                "cannot clone voices; serve a Base checkpoint")
    return None


def _require_clone(settings: Settings, field: str) -> None:
    why = clone_error(settings)
    if why is not None:
        raise bad(why, field, "voice_cloning_unsupported")


async def _normalised(data: bytes, field: str) -> tuple[bytes, float]:
    """An audio file -> normalised float32 bytes and its length; 400s name ``field``."""
    try:
        audio, rate = await asyncio.to_thread(decode_audio_file, data)
        audio = normalize_reference(audio, rate)
    except (AudioFormatError, ValueError) as exc:
        raise bad(f"'{field}' is not readable audio: {exc}", field, "invalid_audio") from exc
    try:
        seconds = check_duration(audio)
    except ValueError as exc:
        raise bad(f"'{field}': {exc}", field, "invalid_audio_length") from exc
    return audio.astype("<f4").tobytes(), seconds


def _decode_base64(value: str, field: str) -> bytes:
    """Plain base64 or a ``data:<mime>;base64,`` URL (as vllm-omni's speech API takes)."""
    if value.startswith("data:"):
        head, _, value = value.partition(",")
        if not head.endswith(";base64"):
            raise bad(f"'{field}' must be base64 audio or a base64 data URL", field)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise bad(f"'{field}' is not valid base64: {exc}", field) from exc


async def reference_from_request(request: Request, state: ServerState, voice: str,
                                 ref_audio: str | None,
                                 ref_text: str | None) -> p.VoiceReference | None:
    """The voice to clone for a speech request: its own ``ref_audio`` (+ ``ref_text``),
    a registered ``voice``, or None (a preset voice)."""
    if ref_audio is None:
        if ref_text is not None:
            raise bad("'ref_text' needs 'ref_audio': the transcript of the reference clip",
                      "ref_text")
        store = voice_store(request)
        try:
            stored = await _store_call(store.get, voice)
            if stored is not None:
                return stored.reference()
            if clone_error(state.settings) is not None or voice.lower() in _OPENAI_VOICES:
                return None  # a preset voice
            known = ", ".join(v.name for v in await _store_call(store.all)) or "none"
        except VoiceStoreError as exc:
            raise store_down(exc) from exc
        raise bad(f"voice {voice!r} does not exist; register it with POST /v1/voices "
                  f"(registered: {known})", "voice", "voice_not_found")
    _require_clone(state.settings, "ref_audio")
    audio, _ = await _normalised(_decode_base64(ref_audio, "ref_audio"), "ref_audio")
    text = ref_text.strip() if ref_text and ref_text.strip() else None
    return p.VoiceReference(audio, REFERENCE_RATE, text)


def session_voice_check(app_state: Any) -> Callable[[str], str | None] | None:
    """For realtime sessions on a server that clones: why a session voice cannot be used
    (a name that is neither registered nor an OpenAI voice name, which speaks with the
    checkpoint's own voice), or None. None (no check) on servers that cannot clone."""
    if clone_error(app_state.voxline.settings) is not None:
        return None
    voices = store_of(app_state)

    def why(voice: str) -> str | None:
        if voice.lower() in _OPENAI_VOICES:
            return None
        try:
            if voices.store.exists(voice):  # one stat; registered here or on another server
                if voice.lower() not in voices.known:
                    _background(_ensure_known(app_state, voice))
                return None
            # the error path only: list the names (a read of each voice's metadata)
            known = ", ".join(v.name for v in voices.store.all()) or "none"
        except VoiceStoreError as exc:
            return f"voice {voice!r} cannot be looked up: {exc}"
        return (f"voice {voice!r} does not exist; register it with POST /v1/voices "
                f"(registered: {known})")

    return why


_TASKS: set[asyncio.Task[None]] = set()  # held so they are not collected mid-run


def _background(work: Awaitable[None]) -> None:
    task = asyncio.ensure_future(work)
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)


_OPENAI_VOICES = {"alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage",
                  "shimmer", "verse", "marin", "cedar"}


async def _tell_engine(state: ServerState, reference: p.VoiceReference) -> None:
    """Register (or, with empty audio, unregister) a named reference in the speech stage,
    through the session host; engine failures as the voice API's errors."""
    try:
        await state.host.register_voice(reference)
    except VoiceNotRegistered as exc:
        raise (unavailable(str(exc)) if exc.error is None else stream_error(exc.error)) from None
    except EngineError as exc:
        raise unavailable(f"the engine is not ready ({exc}); retry shortly") from exc


@router.post("/v1/voices", response_model=None)
async def create_voice(request: Request) -> Response:
    """Register a voice to clone from an uploaded clip (see the module docstring)."""
    try:
        state = check_request(request)
        form = await request.form(max_files=1)
        name = form.get("name")
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise bad("'name' is required: 1-64 letters, digits, '-' or '_'", "name")
        _require_clone(state.settings, "audio")
        upload = form.get("audio", form.get("file"))
        if not isinstance(upload, UploadFile):
            raise bad("'audio' is required: the reference clip, as a file upload", "audio",
                      "missing_required_parameter")
        ref_text = form.get("ref_text")
        if ref_text is not None and not isinstance(ref_text, str):
            raise bad("'ref_text' must be text: the transcript of the clip", "ref_text")
        voices = store_of(request.app.state)
        if await _store_call(voices.store.exists, name):
            raise _exists(name)
        data = await upload.read()
        if len(data) > MAX_UPLOAD_BYTES:
            raise bad(f"'audio' is {len(data)} bytes; the maximum is {MAX_UPLOAD_BYTES}", "audio",
                      "file_too_large")
        audio, seconds = await _normalised(data, "audio")
        text = ref_text.strip() if ref_text and ref_text.strip() else None
        voice = StoredVoice(name, audio, text, seconds, int(time.time()))
        async with voices.lock:
            try:
                await _store_call(voices.store.put, voice)  # atomic: one server wins a name
            except VoiceExists:
                raise _exists(name) from None
            try:
                await _tell_engine(state, voice.reference(named=True))
            except AudioAPIError:
                await _store_call(voices.store.remove, name)  # not usable: not registered
                raise
            voices.known.add(name.lower())
    except VoiceStoreError as exc:
        return store_down(exc).response()
    except AudioAPIError as exc:
        return exc.response()
    return JSONResponse(voice.to_json(), status_code=201)


def _exists(name: str) -> AudioAPIError:
    return AudioAPIError(409, f"voice {name!r} already exists; delete it first", param="name",
                         code="voice_exists")


@router.get("/v1/voices", response_model=None)
async def list_voices(request: Request) -> Response:
    try:
        check_request(request)
        stored = await _store_call(voice_store(request).all)
    except VoiceStoreError as exc:
        return store_down(exc).response()
    except AudioAPIError as exc:
        return exc.response()
    return JSONResponse({"object": "list", "data": [v.to_json() for v in stored]})


@router.delete("/v1/voices/{name}", response_model=None)
async def delete_voice(request: Request, name: str) -> Response:
    try:
        state = check_request(request)
        voices = store_of(request.app.state)
        async with voices.lock:
            if not await _store_call(voices.store.exists, name):
                raise AudioAPIError(404, f"voice {name!r} does not exist", param="name",
                                    code="voice_not_found")
            await _tell_engine(state, p.VoiceReference(b"", REFERENCE_RATE, None, name))
            voices.known.discard(name.lower())
            await _store_call(voices.store.remove, name)
    except VoiceStoreError as exc:
        return store_down(exc).response()
    except AudioAPIError as exc:
        return exc.response()
    return JSONResponse({"id": name, "object": "voice", "deleted": True})
