"""`WS /v1/telephony/twilio`: a Twilio Media Streams call as a voice session, and
`POST /v1/telephony/twilio/twiml`, the TwiML that points a number at it.

The transport holds no conversation logic. :class:`TwilioBridge` (sans I/O) maps Twilio
messages to session commands and session events to Twilio messages: caller audio is
appended as μ-law; reply audio goes out as 20 ms ``media`` frames, 20 ms apart with a 60 ms lead
(:mod:`frame_pacer`), each reply chunk followed by a ``mark``. Twilio echoes a mark when the audio before it
has played, so at barge-in (the session clears its output buffer) the bridge sends
``clear`` first and then truncates the reply at the last mark echoed: what the caller
actually heard. The session is told the transport reports playout, so it does not cut by
its own clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from fastapi import APIRouter, Request, Response, WebSocket, WebSocketDisconnect

from voxline.errors import ProtocolError
from voxline.realtime.http.voices import session_voice_check
from voxline.realtime.openai.session_object import validate_session
from voxline.realtime.session_host import (
    CLOSE_POLICY,
    Admission,
    SessionEnd,
)
from voxline.realtime.state import get_state
from voxline.realtime.transports import twilio_wire as tw
from voxline.realtime.transports.call_log import log_call_event
from voxline.realtime.transports.frame_pacer import FramePacer
from voxline.realtime.transports.outbox import Outbox, admit_or_close, close_after
from voxline.sessions import commands as cmd
from voxline.sessions import events as ev
from voxline.sessions.runner import SessionEnded
from voxline.sessions.settings import AudioFormat, SessionSettings, Transcription

logger = logging.getLogger(__name__)
router = APIRouter()

STREAM_PATH = "/v1/telephony/twilio"
FRAME_BYTES = 160  # 20 ms of 8 kHz μ-law, the frame Twilio sends and expects
COMMAND_LIMIT = 1024  # caller frames the session has not taken yet (20 s of audio)

PHONE_SETTINGS = SessionSettings(input_format=AudioFormat.of("ulaw"),
                                 output_format=AudioFormat.of("ulaw"),
                                 transcription=Transcription())


@dataclass
class TwilioBridge:
    """One call's mapping between Twilio's messages and the session, sans I/O."""

    stream_sid: str | None = None
    call_sid: str | None = None
    stopped: bool = False
    _marks: dict[str, tuple[str, float]] = field(default_factory=dict)  # name -> (item, ms)
    _heard_ms: dict[str, float] = field(default_factory=dict)  # item -> played, per marks
    _sent_ms: dict[str, float] = field(default_factory=dict)  # item -> audio sent
    _items: dict[str, str] = field(default_factory=dict)  # response -> its audio item

    @property
    def ids(self) -> str:
        return f"call {self.call_sid or '?'} stream {self.stream_sid or '?'}"

    # -- Twilio -> session ----------------------------------------------------------

    def on_twilio(self, msg: tw.TwilioMessage) -> list[cmd.ClientCommand]:
        """Commands for one message from Twilio; raises TwilioMessageError if it is unusable."""
        match msg:
            case tw.Start():
                return self._start(msg)
            case tw.Media():
                if msg.track not in ("inbound", "inbound_track"):
                    return []
                return [cmd.InputAudioAppend(audio=msg.payload)] if msg.payload else []
            case tw.Mark():
                played = self._marks.pop(msg.name, None)
                if played is not None:
                    item, ms = played
                    self._heard_ms[item] = max(self._heard_ms.get(item, 0.0), ms)
                return []
            case tw.Dtmf():
                # Keypresses do not enter the conversation (nothing here can act on them);
                # the in-band tone is short and ends no turn by itself.
                logger.info("%s: caller pressed %s", self.ids, msg.digit)
                return []
            case tw.Stop():
                self.stopped = True
                return []
        return []

    def _start(self, msg: tw.Start) -> list[cmd.ClientCommand]:
        self.stream_sid, self.call_sid = msg.stream_sid, msg.call_sid
        if (msg.encoding, msg.sample_rate, msg.channels) != (tw.MULAW_ENCODING, tw.MULAW_RATE, 1):
            raise tw.TwilioMessageError(
                f"start.mediaFormat is {msg.encoding} {msg.sample_rate} Hz x{msg.channels}; "
                f"only {tw.MULAW_ENCODING} {tw.MULAW_RATE} Hz mono is supported")
        changes: dict[str, Any] = {}
        params = msg.custom_parameters
        if "instructions" in params:
            changes["instructions"] = params["instructions"]
        if "voice" in params:
            changes["audio"] = {"output": {"voice": params["voice"]}}
        if not changes:
            return []
        try:
            validate_session({"type": "realtime", **changes})
        except ProtocolError as exc:
            raise tw.TwilioMessageError(f"start.customParameters: {exc}") from None
        return [cmd.SessionUpdate(changes=changes, event_id="twilio_start")]

    # -- session -> Twilio ----------------------------------------------------------

    def on_event(self, event: ev.ServerEvent) -> tuple[list[dict[str, Any]], list[cmd.ClientCommand]]:
        """Twilio messages to send for one session event, and commands for the session."""
        sid = self.stream_sid
        if isinstance(event, ev.AudioDelta) and sid is not None:
            self._items[event.response_id] = event.item_id
            out = [tw.media_message(sid, event.delta[i:i + FRAME_BYTES])
                   for i in range(0, len(event.delta), FRAME_BYTES)]
            end = self._sent_ms.get(event.item_id, 0.0) + len(event.delta) * 1000 / tw.MULAW_RATE
            self._sent_ms[event.item_id] = end
            name = f"{event.item_id}:{int(end)}"  # unique: every chunk is >= 20 ms
            self._marks[name] = (event.item_id, end)
            out.append(tw.mark_message(sid, name))
            return out, []
        if isinstance(event, ev.OutputAudioBufferCleared) and sid is not None:
            return [tw.clear_message(sid)], self._cut(event.response_id)
        self._log(event)
        return [], []

    def _cut(self, response_id: str) -> list[cmd.ClientCommand]:
        """After `clear`: forget the reply's outstanding marks (Twilio echoes them at once)
        and truncate it at the last one echoed before."""
        item = self._items.pop(response_id, None)  # one cut per reply
        if item is None:
            return []
        self._marks = {n: m for n, m in self._marks.items() if m[0] != item}
        heard = int(self._heard_ms.get(item, 0.0))
        if heard >= int(self._sent_ms.get(item, 0.0)):
            return []
        logger.info("%s: barge-in, reply %s heard to %d ms", self.ids, item, heard)
        return [cmd.ItemTruncate(item_id=item, audio_end_ms=heard)]

    def _log(self, event: ev.ServerEvent) -> None:
        log_call_event(logger, self.ids, event)


def _public_url(url: str, headers: Any, *, websocket: bool) -> str:
    """The URL as the caller addressed it (a TLS proxy's scheme and host win)."""
    parts = urlsplit(url)
    scheme = parts.scheme
    proto = headers.get("x-forwarded-proto")
    if proto:
        scheme = ("wss" if proto == "https" else "ws") if websocket else proto
    host = headers.get("x-forwarded-host") or headers.get("host") or parts.netloc
    return urlunsplit((scheme, host, parts.path, parts.query, ""))


def _signed(token: str | None, url: str, headers: Any, params: list[tuple[str, str]],
            schemes: tuple[str, ...]) -> bool:
    if token is None:
        return True
    return tw.signature_valid(token, _public_url(url, headers, websocket=schemes[0] == "wss"),
                              params,
                              headers.get("x-twilio-signature"), schemes=schemes)


@router.post(STREAM_PATH + "/twiml")
async def twiml(request: Request) -> Response:
    """TwiML for a number's voice webhook: connect the call to this server's stream.
    Query parameters (e.g. ``?instructions=...&voice=...``) reach the session."""
    state = get_state(request)
    form = await request.form()
    params = [(k, v) for k, v in form.multi_items() if isinstance(v, str)]
    if not _signed(state.settings.twilio_auth_token, str(request.url), request.headers, params,
                   ("https", "http")):
        return Response("invalid X-Twilio-Signature", status_code=403)
    public = urlsplit(_public_url(str(request.url), request.headers, websocket=False))
    scheme = "wss" if public.scheme == "https" else "ws"
    stream_url = f"{scheme}://{public.netloc}{STREAM_PATH}"
    body = tw.connect_stream_twiml(stream_url, dict(request.query_params))
    return Response(body, media_type="application/xml")


async def _read_twilio(ws: WebSocket, bridge: TwilioBridge,
                       inbox: asyncio.Queue[cmd.ClientCommand | None]) -> None:
    """Twilio's messages as session commands, until `stop` or the socket drops."""
    try:
        while not bridge.stopped:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                break
            text = message.get("text") or message.get("bytes")
            try:
                msg = tw.parse_message(text or "")
                if msg is None:
                    logger.debug("%s: ignoring an unknown Twilio event", bridge.ids)
                    continue
                for command in bridge.on_twilio(msg):
                    await inbox.put(command)
            except tw.TwilioMessageError as exc:
                logger.error("%s: malformed Twilio message (%s): %.200r", bridge.ids, exc, text)
    finally:
        await inbox.put(None)


async def _commands(inbox: asyncio.Queue[cmd.ClientCommand | None]) -> AsyncIterator[cmd.ClientCommand]:
    while (command := await inbox.get()) is not None:
        yield command


@router.websocket(STREAM_PATH)
async def twilio_stream(ws: WebSocket) -> None:
    state = get_state(ws)
    if not _signed(state.settings.twilio_auth_token, str(ws.url), ws.headers, [],
                   ("wss", "ws")):
        state.host.count_refusal()
        await ws.close(code=CLOSE_POLICY, reason="invalid X-Twilio-Signature")
        return
    await ws.accept()
    admission = await admit_or_close(ws, state.host)
    if admission is None:
        return
    with admission:  # the slot is released however the call ends
        await _serve(ws, admission)


async def _serve(ws: WebSocket, admission: Admission) -> None:
    state = get_state(ws)
    bridge = TwilioBridge()
    inbox: asyncio.Queue[cmd.ClientCommand | None] = asyncio.Queue(COMMAND_LIMIT)
    outbox = Outbox(ws.send_text, state.settings.send_buffer_kb * 1024)
    pacer = FramePacer(outbox.put)  # the reply's frames 20 ms apart, a little ahead

    async def send(event: ev.ServerEvent) -> None:
        if pacer.failure is not None:
            raise pacer.failure
        out, commands = bridge.on_event(event)
        for message in out:
            if message["event"] == "clear":  # barge-in: what is not sent is never sent
                pacer.clear()
            pacer.push(json.dumps(message, separators=(",", ":")),
                       is_frame=message["event"] == "media")
        pacer.pump()  # what is due goes now; never waits on Twilio; may raise SlowClient
        for command in commands:
            await inbox.put(command)  # one per barge-in

    async def stop_reader() -> None:
        reader.cancel()
        await pacer.stop()
        await asyncio.gather(reader, return_exceptions=True)

    async def close(end: SessionEnd) -> None:
        with contextlib.suppress(SessionEnded):  # a slow peer: the close says so anyway
            pacer.flush()  # the rest of the reply, for Twilio's buffer to play
        await close_after(ws, outbox, end, state.metrics)

    def hung_up(exc: Exception) -> bool:  # the caller hung up while a reply frame was sent
        return isinstance(exc, WebSocketDisconnect) or reader.done()

    runner = admission.runner(send, settings=PHONE_SETTINGS, transport_reports_playout=True,
                              voice_error=session_voice_check(ws.app.state))
    reader = asyncio.create_task(_read_twilio(ws, bridge, inbox), name="twilio-reader")
    logger.info("twilio session %s opened", admission.session_id)
    outbox.start()
    pacer.start()
    # SIGTERM: the reply in flight ends, then 1001
    await state.host.serve(admission, runner, _commands(inbox), close=close,
                           cleanup=stop_reader, peer_gone=hung_up)
    logger.info("%s: twilio session %s closed", bridge.ids, admission.session_id)
