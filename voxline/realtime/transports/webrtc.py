"""`POST /v1/realtime/calls`: the OpenAI Realtime WebRTC transport, on aiortc.

The client posts an SDP offer (`application/sdp`, or multipart with `sdp` and a GA
`session` object); the answer comes back (201, `application/sdp`) with a `Location`
naming the call. Then, as on the WebSocket, a thin adapter around one session actor:

- mic: the client's Opus track, decoded by aiortc to 48 kHz PCM, goes to the session as
  input audio (the actor's `media_format`);
- reply: the actor's paced PCM frames go to an outgoing Opus track that plays 20 ms
  per frame in real time; `output_audio_buffer.cleared` empties it at once (barge-in);
- events: the same JSON as `/v1/realtime` (GA) on the `oai-events` data channel, minus
  the audio deltas, which travel on the track;
- video: when the offer has a video section, a response's video (the voxline extension)
  plays on the call's video track (`transports.video_track`) while its events go on the
  data channel.

`POST /v1/realtime/calls/{id}/hangup` ends a call, as does the peer closing, ICE failing,
the session ending, or the call never connecting. Every end closes the peer connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

import av
import numpy as np
from aiortc import (
    MediaStreamTrack,
    RTCDataChannel,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError
from fastapi import APIRouter, Request, Response

from voxline.errors import ProtocolError
from voxline.realtime.auth.access import Access, authenticate, settings_from_session
from voxline.realtime.http.voices import session_voice_check
from voxline.realtime.openai.client_events import parse_command
from voxline.realtime.openai.dialect import Dialect
from voxline.realtime.openai.error_body import error_response
from voxline.realtime.openai.server_events import render_json
from voxline.realtime.openai.session_object import session_for_intent
from voxline.realtime.ops.owned_ids import not_here_reason
from voxline.realtime.session_host import Admission, Refusal, SessionEnd, SessionRefused
from voxline.realtime.state import ServerState, get_state
from voxline.realtime.transports.ice import default_hosts, restrict_gathering, rtc_configuration
from voxline.realtime.transports.outbox import SlowClient
from voxline.realtime.transports.video_track import GeneratedVideoTrack, add_video_track
from voxline.sessions import commands as cmd
from voxline.sessions import events as ev
from voxline.sessions.actor import MEDIA_FRAME_MS
from voxline.sessions.settings import AudioFormat, SessionSettings

logger = logging.getLogger(__name__)
router = APIRouter()

EVENTS_CHANNEL = "oai-events"
MEDIA_RATE = 48_000  # Opus in WebRTC
MEDIA_FORMAT = AudioFormat("pcm16", MEDIA_RATE)
FRAME_SAMPLES = MEDIA_RATE * MEDIA_FRAME_MS // 1000
EVENTS_LIMIT = 512  # client events waiting for the session; past it the call is hung up
MIC_FRAMES_LIMIT = 512  # 20 ms mic frames waiting for the session (10 s); the mic then waits
PENDING_EVENTS_LIMIT = 1024  # server events held until the data channel opens
CONNECT_TIMEOUT_S = 30.0  # a call whose peer never connects is hung up
MAX_SDP_BYTES = 64 * 1024


class PacedAudioTrack(MediaStreamTrack):
    """The reply track: one 20 ms frame per 20 ms of wall time, silence when idle.

    The session paces what it pushes (at most its lead ahead of playout), so the
    buffer stays short and `clear` silences the track from the next frame on.
    """

    kind = "audio"

    def __init__(self, max_buffered_ms: int = 2000) -> None:
        super().__init__()
        self._buffer = bytearray()
        self._max_bytes = MEDIA_RATE * 2 * max_buffered_ms // 1000
        self._start: float | None = None
        self._frames = 0

    def push(self, pcm: bytes) -> None:
        self._buffer += pcm
        if len(self._buffer) > self._max_bytes:  # never more than the session's lead
            del self._buffer[:len(self._buffer) - self._max_bytes]

    def clear(self) -> None:
        self._buffer.clear()

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        else:  # the media clock: frame n plays at start + n * 20 ms
            wait = self._start + self._frames * MEDIA_FRAME_MS / 1000 - now
            if wait > 0:
                await asyncio.sleep(wait)
        size = FRAME_SAMPLES * 2
        chunk = bytes(self._buffer[:size])
        del self._buffer[:size]
        if len(chunk) < size:
            chunk += bytes(size - len(chunk))
        frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        frame.planes[0].update(chunk)
        frame.sample_rate = MEDIA_RATE
        frame.pts = self._frames * FRAME_SAMPLES
        frame.time_base = fractions.Fraction(1, MEDIA_RATE)
        self._frames += 1
        return frame


def mono_pcm16(frame: av.AudioFrame) -> bytes:
    """A decoded (packed s16) frame as mono PCM16: channels averaged."""
    channels = len(frame.layout.channels)
    samples = frame.to_ndarray().reshape(-1, channels)
    if channels == 1:
        return samples.astype("<i2").tobytes()
    return samples.astype(np.int32).mean(axis=1).astype("<i2").tobytes()


Incoming = cmd.ClientCommand | ProtocolError


class CallInbox:
    """What a call's session reads: client events from the data channel first, then mic
    frames. A control event (`response.cancel`, `session.update`, ...) never waits behind
    queued audio, as a system frame jumps a pipeline's data queue; each kind keeps its own
    order. Both are bounded: `put_audio` waits for room (aiortc holds the track's frames
    meanwhile); `offer` refuses (False) an event past its bound. After `end`, the events
    already offered are still read, queued audio is not."""

    def __init__(self, events_limit: int = EVENTS_LIMIT,
                 audio_limit: int = MIC_FRAMES_LIMIT) -> None:
        self._events: deque[Incoming] = deque()
        self._events_limit = events_limit
        self._audio: asyncio.Queue[cmd.InputAudioAppend] = asyncio.Queue(audio_limit)
        self._ready = asyncio.Event()
        self._ended = False

    @property
    def ended(self) -> bool:
        return self._ended

    def offer(self, item: Incoming) -> bool:
        """Queue a client event ahead of any audio; False when `events_limit` are waiting."""
        if len(self._events) >= self._events_limit:
            return False
        self._events.append(item)
        self._ready.set()
        return True

    async def put_audio(self, frame: cmd.InputAudioAppend) -> None:
        if not self._ended:  # the session no longer reads audio
            await self._audio.put(frame)
            self._ready.set()

    def end(self) -> None:
        self._ended = True
        self._ready.set()

    async def items(self) -> AsyncIterator[Incoming]:
        while True:
            if self._events:
                yield self._events.popleft()
            elif self._ended:
                return
            elif not self._audio.empty():
                yield self._audio.get_nowait()
            else:
                self._ready.clear()
                await self._ready.wait()


class Call:
    """One WebRTC call: a peer connection around a session runner. The call holds its
    admission (its slot on the session host) until it closes."""

    def __init__(self, admission: Admission, pc: RTCPeerConnection, state: ServerState,
                 settings: SessionSettings,
                 voice_error: Callable[[str], str | None] | None = None) -> None:
        self.admission = admission  # the call takes it over in `start`; `close` releases it
        self.id = admission.session_id
        self.pc = pc
        self.state = state
        self.track = PacedAudioTrack()
        self.video_track = GeneratedVideoTrack()  # sent only if the offer has video
        self.channel: RTCDataChannel | None = None
        self._pending: deque[str] = deque()
        self._inbox = CallInbox()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self.done = asyncio.Event()
        self.runner = admission.runner(self._send, settings=settings, media_format=MEDIA_FORMAT,
                                       voice_error=voice_error)
        self.actor = self.runner.actor
        pc.on("datachannel", self._on_datachannel)
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", self._on_connection_state)

    # ------------------------------------------------------------------ session side

    async def _send(self, event: ev.ServerEvent) -> None:
        self.video_track.on_event(event)  # a video event's pixels: the track plays them
        if isinstance(event, ev.AudioDelta):
            self.track.push(event.delta)
            return
        if isinstance(event, ev.OutputAudioBufferCleared):
            self.track.clear()
        wire = render_json(event, Dialect.GA)
        if wire is None:
            return
        channel = self.channel
        if channel is not None and channel.readyState == "open":
            channel.send(wire)
            limit = self.state.settings.send_buffer_kb * 1024
            if channel.bufferedAmount > limit:  # the peer stopped reading its events
                raise SlowClient(channel.bufferedAmount, limit)
        elif len(self._pending) < PENDING_EVENTS_LIMIT:
            self._pending.append(wire)
        else:
            logger.warning("call %s: data channel not open, dropped %s", self.id,
                           type(event).__name__)

    def _offer(self, item: Incoming) -> None:
        if self._inbox.ended:
            return  # hung up: the session reads no more
        if not self._inbox.offer(item):
            logger.warning("call %s: client events arrive faster than the session takes "
                           "them; hanging up", self.id)
            self.hangup()

    # ------------------------------------------------------------------ peer side

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != EVENTS_CHANNEL:
            logger.info("call %s: ignoring data channel %r", self.id, channel.label)
            return
        self.channel = channel
        channel.on("message", self._on_message)
        channel.on("open", self._flush_pending)
        if channel.readyState == "open":
            self._flush_pending()

    def _flush_pending(self) -> None:
        channel = self.channel
        while self._pending and channel is not None and channel.readyState == "open":
            channel.send(self._pending.popleft())

    def _on_message(self, message: str | bytes) -> None:
        if not isinstance(message, str):
            self._offer(ProtocolError("binary messages are not supported on oai-events; send "
                                      "JSON events as text", code="invalid_request_error"))
            return
        if len(message) > self.state.settings.max_event_bytes:
            self._offer(ProtocolError(f"event is {len(message)} bytes, more than the "
                                      f"{self.state.settings.max_event_bytes} allowed",
                                      code="invalid_request_error"))
            return
        try:
            command = parse_command(message)
        except ProtocolError as exc:
            self._offer(exc)
            return
        if isinstance(command, cmd.InputAudioAppend):
            self._offer(ProtocolError("input_audio_buffer.append: on a WebRTC call the "
                                      "microphone track carries the audio", code="invalid_value",
                                      event_id=command.event_id, param="audio"))
            return
        self._offer(command)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._tasks.append(asyncio.create_task(self._read_mic(track), name="call-mic"))

    async def _read_mic(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            await self._inbox.put_audio(cmd.InputAudioAppend(audio=mono_pcm16(frame)))

    def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        logger.info("call %s: connection %s", self.id, state)
        if state in ("failed", "closed"):
            self.hangup()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.admission.detach()  # held past the HTTP request, until `close`
        self.admission.opened()
        self._tasks.append(asyncio.create_task(self._run(), name="call-session"))
        self._tasks.append(asyncio.create_task(self._watch_connect(), name="call-connect"))

    async def _watch_connect(self) -> None:
        await asyncio.sleep(CONNECT_TIMEOUT_S)
        if self.pc.connectionState != "connected":
            logger.info("call %s: peer did not connect in %.0f s", self.id, CONNECT_TIMEOUT_S)
            self.hangup()

    async def _run(self) -> None:
        await self.state.host.serve(self.admission, self.runner, self._inbox.items(),
                                    close=self._end)

    async def _end(self, end: SessionEnd) -> None:
        if end.reason:
            logger.info("call %s: session ended: %s", self.id, end.reason)
        self._flush_pending()
        await self.close()

    def hangup(self) -> None:
        """End the call: the session stops reading, then everything closes."""
        self._inbox.end()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        self.track.stop()
        self.video_track.stop()
        self.admission.release()
        try:
            await self.pc.close()
        finally:
            self.state.calls.pop(self.id, None)
            self.state.metrics.set("voxline_webrtc_calls", "open WebRTC calls",
                                   len(self.state.calls))
            logger.info("call %s closed", self.id)
            self.done.set()


async def close_all_calls(state: ServerState) -> None:
    """Server shutdown: hang up every call and wait for it to close."""
    calls = list(state.calls.values())
    for call in calls:
        call.hangup()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(c.done.wait() for c in calls)), 10)
    for call in calls:
        await call.close()


# ------------------------------------------------------------------------- routes


async def _read_offer(request: Request) -> tuple[str, object | None]:
    """(SDP offer, GA session object or None); raises ProtocolError."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        form = await request.form()
        sdp, session = form.get("sdp"), form.get("session")
        if not isinstance(sdp, str):
            raise ProtocolError("multipart body needs an 'sdp' field holding the SDP offer",
                                code="missing_required_parameter", param="sdp")
        if session is None:
            return sdp, None
        if not isinstance(session, str):
            raise ProtocolError("the 'session' field must be JSON text", code="invalid_value",
                                param="session")
        try:
            return sdp, json.loads(session)
        except json.JSONDecodeError as exc:
            raise ProtocolError(f"the 'session' field is not JSON: {exc}", code="invalid_json",
                                param="session") from exc
    if kind not in ("application/sdp", "text/plain", ""):
        raise ProtocolError(f"expected an SDP offer as application/sdp (or multipart/form-data "
                            f"with sdp and session), got {kind}", code="invalid_value")
    body = await request.body()
    if len(body) > MAX_SDP_BYTES:
        raise ProtocolError(f"SDP offer is {len(body)} bytes, more than {MAX_SDP_BYTES}",
                            code="invalid_value", param="sdp")
    return body.decode("utf-8", errors="replace"), None


def _only_opus(pc: RTCPeerConnection) -> None:
    opus = [c for c in RTCRtpSender.getCapabilities("audio").codecs
            if c.mimeType.lower() == "audio/opus"]
    for transceiver in pc.getTransceivers():
        if transceiver.kind == "audio":
            transceiver.setCodecPreferences(opus)


def _check_offer(sdp: str) -> None:
    if not sdp.lstrip().startswith("v=0"):
        raise ProtocolError("body is not an SDP offer (it must start with 'v=0')",
                            code="invalid_sdp", param="sdp")
    if "\nm=audio " not in sdp.replace("\r\n", "\n"):
        raise ProtocolError("the SDP offer has no audio (m=audio) section: a call needs the "
                            "microphone track", code="invalid_sdp", param="sdp")


REFUSAL_CODES = {Refusal.SHUTTING_DOWN: "server_shutting_down", Refusal.AT_LIMIT: "server_busy",
                 Refusal.ENGINE_NOT_READY: "engine_not_ready"}


@router.post("/v1/realtime/calls")
async def create_call(request: Request) -> Response:
    state = get_state(request)
    access = authenticate(request, state.settings.api_key, state.client_secrets)
    if not isinstance(access, Access):
        state.host.count_refusal()
        return error_response(401, access, code="invalid_api_key")
    try:  # the slot is held from before the first await: concurrent offers cannot pass the limit
        # the call id names this server (rtc_<server_id>_...): a balancer routes by it
        admission = state.host.admit(prefix=f"rtc_{state.server_id}")
    except SessionRefused as refused:
        return error_response(503, refused.reason, code=REFUSAL_CODES[refused.refusal],
                              type="server_error")
    with admission:  # released on every way out, unless the answered call took it over
        return await _answer_call(request, access, admission)


async def _answer_call(request: Request, access: Access, admission: Admission) -> Response:
    state = get_state(request)
    config = state.settings
    try:
        sdp, session_doc = await _read_offer(request)
        _check_offer(sdp)
        settings = session_for_intent(request.query_params.get("intent"),
                                      access.settings or SessionSettings())
        if session_doc is not None:
            settings = settings_from_session(session_doc, settings,
                                             tools_supported=config.remote_llm,
                                             transcription=state.host.limits.transcription)
    except ProtocolError as exc:
        return error_response(400, str(exc), code=exc.code, param=exc.param)

    pc = RTCPeerConnection(rtc_configuration(config.ice_server_list(), config.turn_username,
                                             config.turn_credential))
    call = Call(admission, pc, state, settings, session_voice_check(request.app.state))
    try:
        await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        pc.addTrack(call.track)
        add_video_track(pc, call.video_track)
        _only_opus(pc)
        restrict_gathering(pc, config.ice_host_list() or default_hosts(), config.rtc_port_range())
        await pc.setLocalDescription(await pc.createAnswer())
    except BaseException as exc:  # aiortc reports a bad offer as ValueError and others
        await pc.close()
        call.track.stop()
        call.video_track.stop()
        if not isinstance(exc, Exception):
            raise  # cancelled: nothing of the call stays
        logger.info("call %s refused: %s", call.id, exc)
        return error_response(400, f"cannot answer the SDP offer: {exc or type(exc).__name__}",
                              code="invalid_sdp", param="sdp")
    state.calls[call.id] = call
    state.metrics.set("voxline_webrtc_calls", "open WebRTC calls", len(state.calls))
    call.start()
    logger.info("call %s answered", call.id)
    return Response(pc.localDescription.sdp, status_code=201, media_type="application/sdp",
                    headers={"Location": f"/v1/realtime/calls/{call.id}"})


@router.post("/v1/realtime/calls/{call_id}/hangup")
async def hangup_call(call_id: str, request: Request) -> Response:
    state = get_state(request)
    access = authenticate(request, state.settings.api_key, state.client_secrets)
    if not isinstance(access, Access):
        return error_response(401, access, code="invalid_api_key")
    call = state.calls.get(call_id)
    if call is None:
        return error_response(404, f"no call with id {call_id!r} {_not_here(state, call_id)}",
                              code="call_not_found", param="call_id")
    call.hangup()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(call.done.wait(), 10)
    await call.close()
    return Response(status_code=200)


def _not_here(state: ServerState, call_id: str) -> str:
    """Why a call id is unknown here: it ended, or it names another server (a balancer
    that does not route by the id; see deploy/haproxy.cfg)."""
    return (not_here_reason(call_id, state.server_id, "/v1/realtime/calls/rtc_<server_id>_...")
            or "(it may have ended)")
