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

import numpy as np
from aiortp import PortAllocator, RTPSession
from aiortp.codecs import Codec as RtpCodec
from aiosipua import SdpMessage, SdpNegotiationError, negotiate_sdp

from voxline.codecs import float_to_alaw, float_to_pcm16, float_to_ulaw
from voxline.codecs.opus import OpusDecoder, OpusEncoder
from voxline.errors import AudioFormatError
from voxline.realtime.transports.call_log import log_call_event
from voxline.sessions import commands as cmd
from voxline.sessions import events as ev
from voxline.sessions.settings import AudioEncoding

logger = logging.getLogger(__name__)

FRAME_MS = 20
FRAME_BYTES = 160  # 20 ms of 8 kHz G.711
SESSION_RATE = 24000  # the session's PCM16 rate on an Opus call
G711_LAWS: dict[int, AudioEncoding] = {0: "ulaw", 8: "alaw"}  # static payload types
OPUS_CLOCK = 48000  # Opus's RTP clock, whatever rate it codes (RFC 7587)
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
    opus: bool = False  # Opus at 48 kHz RTP clock; the session hears 24 kHz PCM16 (`law`)

    @property
    def codec_name(self) -> str:
        return "Opus" if self.opus else "PCMU" if self.law == "ulaw" else "PCMA"


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
    opus = next((c.payload_type for c in audio.codecs if c.encoding_name.lower() == "opus"
                 and c.clock_rate == OPUS_CLOCK), None)
    # Opus where the caller offers it (wideband speech), else its first G.711 law
    supported = [opus] if opus is not None else list(G711_LAWS)
    try:
        answer, pt = negotiate_sdp(offer, local_ip, rtp_port, supported_codecs=supported,
                                   dtmf_payload_type=dtmf or 0, session_name="voxline")
    except SdpNegotiationError as exc:
        raise MediaRefused(f"no common codec (Opus, PCMU or PCMA): {exc}") from None
    if opus is not None:
        answered = answer.audio
        assert answered is not None
        maps = answered.attributes["rtpmap"]
        maps[0] = f"{opus} opus/{OPUS_CLOCK}/2"  # RFC 7587: always written with /2
        return MediaPlan(pt, "pcm16", dtmf, remote, answer,
                         on_hold=audio.direction in ("sendonly", "inactive")
                         or remote[0] in ("0.0.0.0", "::"), opus=True)
    cn = any(c.payload_type == CN_PAYLOAD_TYPE for c in audio.codecs)
    answered = answer.audio
    if cn and answered is not None:  # RFC 3389 comfort noise, offered: answered too
        answered.formats.insert(1, str(CN_PAYLOAD_TYPE))
        answered.attributes.setdefault("rtpmap", []).insert(1, f"{CN_PAYLOAD_TYPE} CN/8000")
    return MediaPlan(pt, G711_LAWS[pt], dtmf, remote, answer,
                     on_hold=audio.direction in ("sendonly", "inactive")
                     or remote[0] in ("0.0.0.0", "::"), comfort_noise=cn)


class PassThrough(RtpCodec):
    """RTP payload handed over as is: :class:`WireCodec` does the coding."""

    name = "passthrough"

    def __init__(self, clock_rate: int = 8000) -> None:
        self._clock_rate = clock_rate

    @property
    def sample_rate(self) -> int:
        return self._clock_rate

    @property
    def samples_per_frame(self) -> int:  # the RTP timestamp step of a 20 ms packet
        return self._clock_rate * FRAME_MS // 1000

    def encode(self, pcm: bytes) -> bytes:
        return pcm

    def decode(self, payload: bytes) -> bytes:
        return payload


class WireCodec:
    """G.711 on the wire: the session's bytes are the RTP payload, cut in 20 ms frames."""

    bytes_per_ms = 8.0  # the session's audio format

    def to_wire(self, audio: bytes) -> list[bytes]:
        return [audio[i:i + FRAME_BYTES] for i in range(0, len(audio), FRAME_BYTES)]

    def from_wire(self, payload: bytes) -> bytes:
        return payload

    def silence(self, law: AudioEncoding) -> bytes:
        """20 ms of silence in the session's format."""
        return (float_to_ulaw if law == "ulaw" else float_to_alaw)(np.zeros(160, np.float32))

    def reset(self) -> None:
        """A barge-in: forget audio buffered towards the wire."""


class OpusWire(WireCodec):
    """Opus on the wire through ``voxline.codecs.opus``; the session's side is 24 kHz
    PCM16 (its own format), so no G.711 narrowing."""

    bytes_per_ms = 48.0  # 24 kHz PCM16

    def __init__(self) -> None:
        self._encoder = OpusEncoder(SESSION_RATE, bitrate=32000, application="voip")
        self._decoder = OpusDecoder(SESSION_RATE)

    def to_wire(self, audio: bytes) -> list[bytes]:
        return self._encoder.encode(audio)

    def from_wire(self, payload: bytes) -> bytes:
        try:
            return float_to_pcm16(self._decoder.decode(payload))
        except AudioFormatError as exc:
            logger.debug("dropping an Opus packet: %s", exc)
            return b""

    def silence(self, law: AudioEncoding) -> bytes:
        return bytes(int(2 * SESSION_RATE * FRAME_MS / 1000))

    def reset(self) -> None:
        self._encoder.flush()  # drops the partial frame; the next reply starts clean


@dataclass
class RtpBridge:
    """One call's mapping between 20 ms RTP frames and the session, sans I/O."""

    ids: str
    wire: WireCodec = field(default_factory=WireCodec)
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
                                            + len(event.delta) / self.wire.bytes_per_ms)
            return self.wire.to_wire(event.delta), False, []
        if isinstance(event, ev.OutputAudioBufferCleared):
            self.wire.reset()
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
        self.wire = WireCodec()
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
        self.wire = OpusWire() if plan.opus else WireCodec()
        clock = OPUS_CLOCK if plan.opus else 8000
        self.session = await RTPSession.create(
            (bind_host, self.port), plan.remote, plan.payload_type,
            codec=PassThrough(clock), clock_rate=clock,
            dtmf_payload_type=plan.dtmf_payload_type or 101, plc=False, paced=True,
            symmetric_rtp=True, jitter_capacity=16, jitter_prefetch=2, cname="voxline",
            cn=plan.comfort_noise, cn_payload_type=CN_PAYLOAD_TYPE)
        self.session.on_audio = lambda payload, _ts: on_frame(self.wire.from_wire(payload))
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
