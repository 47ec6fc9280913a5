"""A SIP call's media: the SDP answer, the RTP leg (aiortp) and the bridge between RTP and
the session.

- :func:`answer_offer` picks G.711 (PCMU or PCMA, in the caller's order of preference),
  the caller's telephone-event payload type and comfort noise (CN, 13) from an SDP offer,
  or raises
  :class:`MediaRefused` (a SIP 488).
- :class:`RtpBridge` (sans I/O) maps between the session and 20 ms G.711 frames, as the
  Twilio bridge does: caller frames become ``input_audio_buffer.append`` in the call's own
  G.711 law (the session decodes through ``voxline.codecs``); reply audio is cut into
  20 ms frames; at barge-in it drops the frames not yet on the wire and truncates the
  reply to what was sent (the session is told the transport reports playout).
- :class:`RtpLeg` is the socket side: an aiortp ``RTPSession`` (jitter buffer, symmetric
  RTP, RFC 4733 telephone-events, paced sending at ptime) on a port from the server's
  range, released however the call ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from aiortp import PortAllocator, RTPSession
from aiortp.codecs import Codec as RtpCodec
from aiosipua import SdpMessage, SdpNegotiationError, negotiate_sdp

from voxline.realtime.transports.call_log import log_call_event
from voxline.sessions import commands as cmd
from voxline.sessions import events as ev
from voxline.sessions.settings import AudioEncoding

logger = logging.getLogger(__name__)

FRAME_MS = 20
FRAME_BYTES = 160  # 20 ms of 8 kHz G.711
G711_LAWS: dict[int, AudioEncoding] = {0: "ulaw", 8: "alaw"}  # static payload types
CN_PAYLOAD_TYPE = 13  # RFC 3389 comfort noise, static at 8 kHz (RFC 3551)


class MediaRefused(Exception):
    """The offer has nothing this server can talk: a SIP 488 with this reason."""


@dataclass(frozen=True)
class MediaPlan:
    """What the SDP exchange settled: the law, payload types and the caller's address."""

    payload_type: int
    law: AudioEncoding
    dtmf_payload_type: int | None
    remote: tuple[str, int]
    answer: SdpMessage
    on_hold: bool = False  # the caller's direction is sendonly / inactive
    comfort_noise: bool = False  # both sides use RFC 3389 CN (payload type 13)


def answer_offer(offer: SdpMessage | None, local_ip: str, rtp_port: int) -> MediaPlan:
    """The SDP answer for `offer` with RTP on `local_ip`:`rtp_port`; raises MediaRefused."""
    if offer is None:
        raise MediaRefused("the INVITE carries no SDP offer")
    audio = offer.audio
    remote = offer.rtp_address
    if audio is None or remote is None:
        raise MediaRefused("the SDP offer has no audio stream with an address")
    dtmf = next((c.payload_type for c in audio.codecs
                 if c.encoding_name.lower() == "telephone-event"), None)
    try:
        answer, pt = negotiate_sdp(offer, local_ip, rtp_port, supported_codecs=list(G711_LAWS),
                                   dtmf_payload_type=dtmf or 0, session_name="voxline")
    except SdpNegotiationError as exc:
        raise MediaRefused(f"no common codec (PCMU or PCMA): {exc}") from None
    cn = any(c.payload_type == CN_PAYLOAD_TYPE for c in audio.codecs)
    answered = answer.audio
    if cn and answered is not None:  # RFC 3389 comfort noise, offered: answered too
        answered.formats.insert(1, str(CN_PAYLOAD_TYPE))
        answered.attributes.setdefault("rtpmap", []).insert(1, f"{CN_PAYLOAD_TYPE} CN/8000")
    return MediaPlan(pt, G711_LAWS[pt], dtmf, remote, answer,
                     on_hold=audio.direction in ("sendonly", "inactive")
                     or remote[0] in ("0.0.0.0", "::"), comfort_noise=cn)


class PassThrough(RtpCodec):
    """G.711 payload handed over as is: the session decodes it with voxline's codecs."""

    name = "passthrough"
    sample_rate = 8000
    samples_per_frame = FRAME_BYTES

    def encode(self, pcm: bytes) -> bytes:
        return pcm

    def decode(self, payload: bytes) -> bytes:
        return payload


@dataclass
class RtpBridge:
    """One call's mapping between 20 ms G.711 frames and the session, sans I/O."""

    ids: str
    _sent_ms: dict[str, float] = field(default_factory=dict)  # item -> audio queued
    _items: dict[str, str] = field(default_factory=dict)  # response -> its audio item

    def on_frame(self, payload: bytes) -> list[cmd.ClientCommand]:
        return [cmd.InputAudioAppend(audio=payload)] if payload else []

    def on_event(self, event: ev.ServerEvent, queued_frames: int
                 ) -> tuple[list[bytes], bool, list[cmd.ClientCommand]]:
        """For one session event: frames to queue, whether to drop the frames still queued
        (`queued_frames` of them), and commands for the session."""
        if isinstance(event, ev.AudioDelta):
            self._items[event.response_id] = event.item_id
            self._sent_ms[event.item_id] = (self._sent_ms.get(event.item_id, 0.0)
                                            + len(event.delta) * 1000 / 8000)
            delta = event.delta
            return [delta[i:i + FRAME_BYTES] for i in range(0, len(delta), FRAME_BYTES)], False, []
        if isinstance(event, ev.OutputAudioBufferCleared):
            return [], True, self._cut(event.response_id, queued_frames)
        self._log(event)
        return [], False, []

    def _cut(self, response_id: str, queued_frames: int) -> list[cmd.ClientCommand]:
        item = self._items.pop(response_id, None)
        if item is None or queued_frames == 0:
            return []
        heard = int(max(0.0, self._sent_ms.get(item, 0.0) - queued_frames * FRAME_MS))
        logger.info("%s: barge-in, reply %s heard to %d ms", self.ids, item, heard)
        return [cmd.ItemTruncate(item_id=item, audio_end_ms=heard)]

    def _log(self, event: ev.ServerEvent) -> None:
        log_call_event(logger, self.ids, event)


class RtpLeg:
    """The RTP socket pair of one call (aiortp), on a port from `ports`."""

    def __init__(self, ports: PortAllocator, port: int) -> None:
        self._ports = ports
        self.port = port
        self.session: RTPSession | None = None
        self.on_hold = False  # the caller does not take audio: reply frames are dropped

    @classmethod
    async def open(cls, ports: PortAllocator) -> RtpLeg:
        rtp_port, _ = await ports.allocate()
        return cls(ports, rtp_port)

    async def start(self, bind_host: str, plan: MediaPlan,
                    on_frame: Callable[[bytes], None],
                    on_dtmf: Callable[[str, int], None],
                    on_comfort_noise: Callable[[int], None] | None = None) -> None:
        # with CN agreed, aiortp's pacer sends a CN packet when our reply audio stops (and
        # every 3 s of silence); a CN packet from the caller comes to `on_comfort_noise`
        self.session = await RTPSession.create(
            (bind_host, self.port), plan.remote, plan.payload_type, codec=PassThrough(),
            dtmf_payload_type=plan.dtmf_payload_type or 101, plc=False, paced=True,
            symmetric_rtp=True, jitter_capacity=16, jitter_prefetch=2, cname="voxline",
            cn=plan.comfort_noise, cn_payload_type=CN_PAYLOAD_TYPE)
        self.session.on_audio = lambda payload, _ts: on_frame(payload)
        self.session.on_dtmf = on_dtmf
        self.session.on_cn = on_comfort_noise

    def update(self, plan: MediaPlan) -> None:
        """A re-INVITE: hold, resume, or the caller's media moved."""
        self.on_hold = plan.on_hold
        if self.session is not None and not plan.on_hold:
            self.session.update_remote(plan.remote)

    @property
    def queued_frames(self) -> int:
        return int(self.session.stats.get("queue_depth", 0)) if self.session else 0

    def send(self, frames: list[bytes]) -> None:
        if self.session is not None and not self.on_hold:
            for frame in frames:
                self.session.send_audio_auto(frame)

    async def flush(self, timeout: float) -> None:
        """Wait (at most `timeout` s) until the frames queued have gone out."""
        if self.session is not None and not self.on_hold:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.session.drain(), timeout)

    def drop_queued(self) -> None:
        sender = self.session._paced_sender if self.session is not None else None
        if sender is not None:
            sender.discard()

    async def close(self) -> None:
        """Close the sockets and give the port back (idempotent)."""
        session, self.session = self.session, None
        try:
            if session is not None:
                await session.close()
        finally:
            await self._ports.release(self.port)
