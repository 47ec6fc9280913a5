"""One SIP call: its INVITE dialog, session slot, media leg, the app's decision while it
rings, and the WebSockets watching it (``/v1/realtime?call_id=``).

The call is listed in the server state's ``calls`` under its OpenAI call id (``rtc_...``)
from admission until it is released, beside WebRTC calls: ``POST /v1/realtime/calls/{id}/
hangup`` reaches either through the same :meth:`SipCall.hangup`, ``done`` and ``close``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from aiosipua import IncomingCall, prettify_header_name

from voxline.errors import ProtocolError
from voxline.realtime.session_host import Admission
from voxline.realtime.transports.sip_early_media import EarlyMedia
from voxline.realtime.transports.sip_media import MediaPlan, RtpLeg
from voxline.sessions import commands as cmd
from voxline.sessions import events as ev
from voxline.sessions.settings import SessionSettings

logger = logging.getLogger(__name__)

FRAME_SAMPLES = 160  # 20 ms of 8 kHz G.711
FRAME_S = 0.02
COMMAND_LIMIT = 1024  # caller frames the session has not taken yet (20 s of audio)
DEFAULT_REJECT = 603  # Decline, OpenAI's default for /reject


@dataclass(frozen=True)
class Accept:
    settings: SessionSettings | None  # None: the server's default session


@dataclass(frozen=True)
class Reject:
    status: int  # 0: nothing to send (the caller cancelled; aiosipua answered 487)
    reason: str = ""  # the reason phrase (empty: the status's usual one)
    retry_after: int | None = None  # seconds, for a 503 while the server drains


Decision = Accept | Reject
Observer = Callable[[ev.ServerEvent], None]  # raises to be dropped


@dataclass(eq=False)
class SipCall:
    """One ringing or answered call."""

    invite: IncomingCall
    admission: Admission
    leg: RtpLeg | None = None
    plan: MediaPlan | None = None
    dtmf: list[str] = field(default_factory=list)  # digits received, in order
    inbox: asyncio.Queue[cmd.ClientCommand | None] = field(
        default_factory=lambda: asyncio.Queue(COMMAND_LIMIT + 64))
    decision: asyncio.Future[Decision] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    observers: list[Observer] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    ended: bool = False
    heard_at: float = field(default_factory=lambda: asyncio.get_running_loop().time())  # RTP
    transfer: str | None = None  # the REFER target while a transfer is in progress
    end_reason: str | None = None  # why the server ends the call, when it is not the caller
    early: EarlyMedia | None = None  # the ringback (or WAV) played while ringing
    early_answer: str | None = None  # the SDP sent with 183 Session Progress
    silence: asyncio.Task[None] | None = None  # silence frames while the caller sends CN

    @property
    def id(self) -> str:
        """The OpenAI call id (``rtc_...``) the app names the call by."""
        return self.admission.session_id

    @property
    def sip_call_id(self) -> str:
        return self.invite.call_id

    @property
    def ids(self) -> str:
        return f"sip call {self.id} (Call-ID {self.sip_call_id})"

    @property
    def ringing(self) -> bool:
        return not self.decision.done()

    def sip_headers(self) -> list[tuple[str, str]]:
        """The INVITE's headers as (name, value) pairs, in the order they came."""
        return [(prettify_header_name(name), value)
                for name, values in self.invite.invite.headers.items() for value in values]

    def progress(self) -> None:
        """The provisional response of a ringing call: 183 Session Progress with the SDP
        answer once early media plays, else 180 Ringing (again, for a retransmission)."""
        if self.early_answer is None:
            self.invite.ringing()
        else:
            self.invite._send_response(183, "Session Progress", body=self.early_answer,
                                       content_type="application/sdp")

    # -- the app's and the caller's doings ------------------------------------------

    def decide(self, decision: Decision) -> bool:
        """Settle a ringing call; False if it was settled already."""
        if self.decision.done():
            return False
        self.decision.set_result(decision)
        return True

    def end(self) -> None:
        """The caller hung up (BYE, CANCEL) or the app did: the session's input ends."""
        self.decide(Reject(0))
        if self.silence is not None:
            self.silence.cancel()
            self.silence = None
        if not self.ended:
            self.ended = True
            self.inbox.put_nowait(None)  # room is kept for it

    def hangup(self) -> None:
        """``/hangup``: decline a ringing call, end an answered one (the server sends BYE)."""
        if not self.decide(Reject(DEFAULT_REJECT)):
            self.end()

    async def close(self) -> None:
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)

    def refer(self, target: str) -> None:
        """Ask the caller to call `target` instead (REFER, RFC 3515); its progress comes
        back through :meth:`transfer_progress`."""
        self.transfer = target
        via = self.invite._signaling_addr()
        request = self.invite.dialog.create_request("REFER", via_host=via[0], via_port=via[1])
        request.headers.set_single("Refer-To", f"<{target}>")
        request.headers.set_single("Referred-By", f"<{self.invite.dialog.local_uri}>")
        assert self.invite.transport is not None
        self.invite.transport.send(request, self.invite.source_addr)
        logger.info("%s: REFER to %s", self.ids, target)

    def transfer_progress(self, status: int, reason: str) -> None:
        """The transferee's report (a NOTIFY's sipfrag, or a REFER refused outright): a 2xx
        ends the call, a failure keeps it and tells the watchers."""
        target = self.transfer
        if target is None or status < 200:
            if target is not None:
                logger.info("%s: transfer to %s: %d %s", self.ids, target, status, reason)
            return
        self.transfer = None
        if status < 300:
            logger.info("%s: transferred to %s (%d %s); ending the call", self.ids, target,
                        status, reason)
            self.end_reason = f"transferred to {target}"
            self.end()
            return
        logger.warning("%s: the transfer to %s failed: %d %s; the call goes on", self.ids,
                       target, status, reason)
        self.publish(ev.ErrorEvent.from_exception(ProtocolError(
            f"the transfer to {target} failed: SIP {status} {reason}".rstrip(),
            code="call_transfer_failed", param="target_uri")))

    # -- media and events -----------------------------------------------------------

    def frame(self, payload: bytes) -> None:
        self.heard_at = asyncio.get_running_loop().time()
        if self.silence is not None:  # the caller talks again: its own audio follows
            self.silence.cancel()
            self.silence = None
        if self.ended or self.ringing or not payload:  # ringing: not talking to us yet
            return
        self._append(payload)

    def comfort_noise(self, level: int) -> None:
        """An RFC 3389 CN packet: the caller's phone stopped sending audio because the
        caller is silent. Until its audio resumes the session gets 20 ms silence frames
        at real time, so VAD and turn detection hear the silence that is there."""
        self.heard_at = asyncio.get_running_loop().time()
        if self.silence is None and not self.ended and not self.ringing and self.plan \
                and self.leg is not None:
            silent = self.leg.wire.silence(self.plan.law)
            self.silence = asyncio.create_task(self._fill_silence(silent),
                                               name=f"sip-cn-{self.id}")

    async def _fill_silence(self, silent: bytes) -> None:
        loop = asyncio.get_running_loop()
        start, sent = loop.time(), 0
        while not self.ended:
            due = int((loop.time() - start) / FRAME_S) + 1  # by the clock: no drift
            for _ in range(due - sent):
                self._append(silent)
            sent = due
            await asyncio.sleep(start + sent * FRAME_S - loop.time())

    def _append(self, payload: bytes) -> None:
        if self.inbox.qsize() >= COMMAND_LIMIT:
            logger.warning("%s: the session is behind; a caller frame was dropped", self.ids)
            return
        self.inbox.put_nowait(cmd.InputAudioAppend(audio=payload))

    def steer(self, command: cmd.ClientCommand) -> bool:
        """A command from a watching WebSocket; False if the session is too far behind."""
        if self.ended or self.inbox.qsize() >= COMMAND_LIMIT + 32:
            return False
        self.inbox.put_nowait(command)
        return True

    def digit(self, digit: str) -> None:
        """An RFC 4733 telephone-event: recorded, logged and told to the watchers."""
        self.dtmf.append(digit)
        logger.info("%s: caller pressed %s", self.ids, digit)
        self.publish(ev.DtmfEventReceived(event=digit, received_at=int(time.time())))

    def publish(self, event: ev.ServerEvent) -> None:
        for observe in list(self.observers):
            try:
                observe(event)
            except Exception as exc:  # a watcher that stopped reading; the call goes on
                logger.warning("%s: dropping a watcher (%s)", self.ids, exc)
                self.observers.remove(observe)

    async def commands(self) -> AsyncIterator[cmd.ClientCommand]:
        while (command := await self.inbox.get()) is not None:
            yield command
