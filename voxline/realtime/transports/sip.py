"""``voxline serve --sip-port 5060``: phone calls over SIP (UDP and TCP), each a voice
session hosted through the session host like every other transport's.

SIP signalling is aiosipua's (message parsing, transactions, dialogs, 2xx retransmission,
CANCEL, in-dialog checks: a BYE or re-INVITE that matches no dialog gets 481); media is
:mod:`sip_media` (aiortp); the app's call control is :mod:`sip_routes`. This module
decides who is answered and owns each call's life:

- A new INVITE is checked first (:mod:`sip_auth`): outside ``sip_allow`` and without valid
  digest credentials it gets 403 (or a 401 challenge) and a log line; SDP that does not
  parse gets 400; an offer without audio or without PCMU/PCMA gets 488. A second INVITE
  for a call still ringing gets 482 (a retransmission rings again).
- Admission is the session host's, decided before anything is awaited: past
  ``max_sessions`` a call gets 486 Busy Here; while the engine starts or the server
  drains, 503 with Retry-After.
- An admitted call rings (180) and is listed under its OpenAI call id (``rtc_...``). With
  ``sip_webhook_url`` the app decides (accept with a session, reject, or 480 after
  ``sip_accept_timeout``; 503 if the server starts draining) while the caller hears
  ``sip_early_media`` (183 with the SDP answer, :mod:`sip_early_media`); without, it is
  accepted with the default session. Accepted, it gets an RTP port from ``sip_rtp_ports``
  (the early media's, if it had one) and a 200 with the SDP answer.
- ``/refer`` sends a REFER; the transferee's NOTIFYs (or a refusal of the REFER) report
  the outcome to :meth:`SipCall.transfer_progress`.
- A BYE or CANCEL from the caller, ``/hangup``, a caller silent past
  ``sip_media_timeout`` or a 200 never ACKed ends the session and its engine stream; a
  session that ends on the server's side (its time limit, a drain, an error) sends BYE once
  the reply queued on RTP has gone out.
  However it ends, the RTP ports, the session slot and the call's listing are released.
- A re-INVITE (hold, resume, a moved media address) is answered on the same port and law.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

from aiortp import PortAllocator
from aiosipua import (
    IncomingCall,
    SipMessage,
    SipRequest,
    SipResponse,
    SipUAS,
    TcpSipTransport,
    UdpSipTransport,
    parse_sdp,
    serialize_sdp,
)
from aiosipua import transport as aiosipua_transport

from voxline.aio import wait_ended
from voxline.config import Settings
from voxline.realtime.http.voices import session_voice_check
from voxline.realtime.session_host import Refusal, SessionEnd, SessionRefused
from voxline.realtime.state import ServerState
from voxline.realtime.transports import sip_webhook
from voxline.realtime.transports.sip_auth import CallerCheck, Verdict
from voxline.realtime.transports.sip_call import Accept, Decision, Reject, SipCall
from voxline.realtime.transports.sip_early_media import (
    EarlyMedia,
    encode_frames,
    load_early_media,
)
from voxline.realtime.transports.sip_media import (
    MediaPlan,
    MediaRefused,
    RtpBridge,
    RtpLeg,
    answer_offer,
)
from voxline.sessions import events as ev
from voxline.sessions.settings import AudioFormat, SessionSettings, Transcription

logger = logging.getLogger(__name__)

FLUSH_S = 10.0  # at most this long for the queued reply to go out before the server's BYE
RETRY_AFTER_S = 5  # 503's Retry-After while the engine starts or the server drains
USER_AGENT = "voxline"


def port_range(spec: str) -> tuple[int, int]:
    low, _, high = spec.partition("-")
    return int(low), int(high)


class _UdpProtocol(aiosipua_transport._UdpProtocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # aiosipua asserts an asyncio.DatagramTransport; uvloop's UDP transport is not one
        self._owner._udp_transport = transport  # type: ignore[assignment]


class UdpTransport(UdpSipTransport):
    """aiosipua's UDP transport, also under uvloop (``voxline serve``'s loop)."""

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: _UdpProtocol(self),
                                                           local_addr=self.local_addr)
        self._udp_transport = transport


class SipServer:
    """The SIP user agent server of one voxline server: UDP and TCP on one port."""

    def __init__(self, app_state: Any) -> None:
        self.app_state = app_state  # the app's state: the voice check reads it
        state: ServerState = app_state.voxline
        self.state = state
        settings: Settings = state.settings
        self.settings = settings
        self.callers = CallerCheck(settings.sip_allow, settings.sip_digest_user,
                                   settings.sip_digest_password, settings.sip_digest_realm)
        self.ports = PortAllocator(port_range(settings.sip_rtp_ports))
        self.bind_host = settings.host
        self.media_host = settings.sip_media_host or (
            settings.host if settings.host not in ("0.0.0.0", "::") else "127.0.0.1")
        self.early_audio = load_early_media(settings.sip_early_media)
        self.calls: dict[str, SipCall] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self._uas: list[SipUAS] = []

    @property
    def rtp_ports_in_use(self) -> int:
        return len(self.ports._allocated)

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()  # the server's loop (a drain runs on it)
        port = self.settings.sip_port
        assert port is not None
        for transport in (UdpTransport(local_addr=(self.bind_host, port)),
                          TcpSipTransport(local_addr=(self.bind_host, port))):
            uas = SipUAS(transport, user_agent=USER_AGENT)
            uas.on_invite = self._on_invite
            uas.on_reinvite = self._on_reinvite
            uas.on_bye = self._on_bye
            uas.on_cancel = self._on_cancel
            uas.on_ack_timeout = self._on_ack_timeout
            uas.on_transfer_progress = self._on_transfer_progress
            await uas.start()
            transport.on_message = self._guard(uas)
            self._uas.append(uas)
        logger.info("SIP listening on %s:%d (UDP, TCP); RTP ports %s; answering %s%s",
                    self.bind_host, port, self.settings.sip_rtp_ports,
                    self.settings.sip_allow or "no address",
                    " and digest-authenticated callers" if self.callers.auth else "")
        if not self.settings.sip_allow.replace("127.0.0.1", "").replace("::1", "").strip(", ") \
                and self.callers.auth is None:
            logger.warning("SIP answers only this machine: set --sip-allow to a trunk's "
                           "addresses, or --sip-digest-user, to take its calls")
        if self.settings.sip_webhook_url and not self.settings.sip_webhook_secret:
            logger.warning("SIP webhooks go out unsigned: set VOXLINE_SIP_WEBHOOK_SECRET")

    async def close(self) -> None:
        """Hang up every call, wait for their sessions to end, stop listening."""
        for call in list(self.calls.values()):
            call.hangup()
        await wait_ended(*(c.task for c in self.calls.values()))
        for uas in self._uas:
            await uas.stop()

    # -- admission ------------------------------------------------------------------

    def _guard(self, uas: SipUAS):  # noqa: ANN202 - aiosipua's callback type
        """The transport's message callback: refuse unknown sources and bad SDP before
        aiosipua builds a dialog, then hand the message on."""
        deliver = uas._on_message

        def on_message(msg: SipMessage, addr: tuple[str, int]) -> None:
            ringing = self.calls.get(msg.call_id or "") if isinstance(msg, SipRequest) else None
            if ringing is not None and msg.method.upper() == "INVITE" \
                    and not ringing.invite._answered:
                self._repeated_invite(uas, ringing, msg)
                return
            if isinstance(msg, SipRequest) and msg.method.upper() == "INVITE" \
                    and msg.call_id not in self.calls:  # a new call, not a re-INVITE
                verdict = self.callers.verdict(msg, addr[0])
                if verdict is Verdict.CHALLENGE:
                    uas._send_error(msg, 401, "Unauthorized", extra_headers={
                        "WWW-Authenticate": self.callers.challenge()})
                    return
                if verdict is Verdict.FORBIDDEN:
                    logger.warning("SIP INVITE from %s:%d refused (403): not in sip_allow%s",
                                   addr[0], addr[1], " and no valid digest credentials"
                                   if self.callers.auth is not None else "")
                    self.state.host.count_refusal()
                    uas._send_error(msg, 403, "Forbidden")
                    return
                if msg.body and msg.content_type == "application/sdp":
                    try:
                        parse_sdp(msg.text)
                    except Exception as exc:  # aiosipua raises several types
                        logger.warning("SIP INVITE %s from %s: bad SDP (%s)", msg.call_id,
                                       addr[0], exc)
                        uas._send_error(msg, 400, "Bad SDP")
                        return
            elif isinstance(msg, SipResponse) and uas.uac is None:
                cseq = msg.cseq
                call = self.calls.get(msg.call_id or "")
                if call is not None and cseq is not None and cseq.method.upper() == "REFER" \
                        and msg.status_code >= 300:  # the caller refused the transfer
                    call.transfer_progress(msg.status_code, msg.reason_phrase)
                return
            deliver(msg, addr)

        return on_message

    def _repeated_invite(self, uas: SipUAS, call: SipCall, msg: SipRequest) -> None:
        """An INVITE for a call still ringing: a retransmission (the same transaction) is
        answered by the provisional responses already sent; another transaction is a
        merged request (RFC 3261 §8.2.2.2): 482."""
        if msg.headers.get_first("via") == call.invite.invite.headers.get_first("via"):
            logger.debug("%s: INVITE retransmitted while ringing", call.ids)
            call.progress()
            return
        logger.warning("%s: a second INVITE for Call-ID %s refused (482)", call.ids,
                       msg.call_id)
        uas._send_error(msg, 482, "Loop Detected")

    def _on_invite(self, invite: IncomingCall) -> None:
        call_id = invite.call_id
        try:
            answer_offer(invite.sdp_offer, self.media_host, 0)  # refused before admission
        except MediaRefused as exc:
            logger.warning("SIP call %s from %s refused (488): %s", call_id,
                           invite.source_addr[0], exc)
            invite.reject(488, "Not Acceptable Here")
            return
        try:
            admission = self.state.host.admit(prefix=f"rtc_{self.state.server_id}")
        except SessionRefused as refused:
            logger.warning("SIP call %s refused: %s", call_id, refused.reason)
            if refused.refusal is Refusal.AT_LIMIT:
                invite.reject(486, "Busy Here")
            else:
                invite._send_response(503, "Service Unavailable",
                                      extra_headers={"Retry-After": str(RETRY_AFTER_S)})
                invite.dialog.terminate()
            return
        call = SipCall(invite, admission)
        self.calls[call_id] = call
        self.state.calls[call.id] = call  # /v1/realtime/calls/{id}/... find it there
        invite.ringing()
        call.task = asyncio.create_task(self._run(call), name=f"sip-{call.id}")

    def _on_reinvite(self, invite: IncomingCall) -> None:
        call = self.calls.get(invite.call_id)
        if call is None or call.leg is None:
            invite._send_response(481, "Call/Transaction Does Not Exist")
            return
        try:
            plan = answer_offer(invite.sdp_offer, self.media_host, call.leg.port)
        except MediaRefused as exc:
            logger.warning("%s: re-INVITE refused (488): %s", call.ids, exc)
            invite._send_response(488, "Not Acceptable Here")
            return
        if call.plan is not None and plan.payload_type != call.plan.payload_type:
            invite._send_response(488, "Not Acceptable Here")  # the law is the session's
            return
        call.plan = plan
        call.leg.update(plan)
        logger.info("%s: re-INVITE, %s", call.ids, "on hold" if plan.on_hold else "media on")
        invite.accept(plan.answer)

    def _on_bye(self, invite: IncomingCall, request: SipRequest) -> None:
        call = self.calls.get(invite.call_id)
        if call is not None:
            logger.info("%s: the caller hung up", call.ids)
            call.end()

    def _on_ack_timeout(self, invite: IncomingCall) -> None:
        call = self.calls.get(invite.call_id)
        if call is not None:
            logger.warning("%s: the caller never ACKed the 200 OK; ending the call", call.ids)
            call.end()

    def _on_transfer_progress(self, call_id: str, status: int, reason: str) -> None:
        call = self.calls.get(call_id)
        if call is not None:
            call.transfer_progress(status, reason)

    def _on_cancel(self, request: SipRequest, addr: tuple[str, int]) -> None:
        call = self.calls.get(request.call_id or "")
        if call is not None:
            logger.info("%s: the caller cancelled", call.ids)
            call.end()

    # -- one call -------------------------------------------------------------------

    async def _run(self, call: SipCall) -> None:
        try:
            with call.admission:  # the slot is released however the call ends
                try:
                    if self.settings.sip_webhook_url and self.early_audio is not None:
                        await self._early_media(call)
                    decision = await self._decide(call)
                    call.decide(decision)  # settled: caller frames reach the session now
                    if call.early is not None:
                        await call.early.stop()
                    if isinstance(decision, Reject):
                        self._reject(call, decision)
                        return
                    if call.leg is None:
                        call.leg = await RtpLeg.open(self.ports)
                    await self._answer_and_serve(call, decision.settings)
                finally:
                    if call.early is not None:
                        await call.early.stop()
                    if call.leg is not None:
                        await call.leg.close()
        except Exception:
            logger.exception("%s failed", call.ids)
            if not call.invite._answered:
                call.invite.reject(500, "Server Internal Error")
        finally:
            if call.silence is not None:
                call.silence.cancel()
            self.calls.pop(call.sip_call_id, None)
            self.state.calls.pop(call.id, None)
            call.done.set()
            logger.info("%s: released", call.ids)

    def _reject(self, call: SipCall, decision: Reject) -> None:
        if not decision.status:
            return
        logger.info("%s: rejected (%d)", call.ids, decision.status)
        if decision.retry_after is None:
            call.invite.reject(decision.status, decision.reason)
            return
        call.invite._send_response(decision.status, decision.reason or "Service Unavailable",
                                   extra_headers={"Retry-After": str(decision.retry_after)})
        call.invite.dialog.terminate()

    async def _decide(self, call: SipCall) -> Decision:
        """The app's answer through the webhook, or the default session without one."""
        url = self.settings.sip_webhook_url
        if url is None:
            return Accept(None)
        event = sip_webhook.incoming_call_event(call.id, call.sip_headers())
        delivery = asyncio.create_task(sip_webhook.deliver(
            url, self.settings.sip_webhook_secret, event,
            timeout=self.settings.sip_webhook_timeout, retries=self.settings.sip_webhook_retries))
        delivery.add_done_callback(lambda task: self._undelivered(call, task))
        draining = asyncio.create_task(self.state.host.wait_draining())
        try:
            await asyncio.wait({draining, call.decision}, timeout=self.settings.sip_accept_timeout,
                               return_when=asyncio.FIRST_COMPLETED)
            if call.decision.done():
                return call.decision.result()
            if draining.done():
                logger.info("%s: the server drains; a ringing call is refused (503)", call.ids)
                call.decide(Reject(503, retry_after=RETRY_AFTER_S))
            else:
                logger.warning("%s: not accepted within %.0f s: rejected (480)", call.ids,
                               self.settings.sip_accept_timeout)
                call.decide(Reject(480))
            return call.decision.result()
        finally:
            draining.cancel()
            if not delivery.done():
                delivery.cancel()

    def _undelivered(self, call: SipCall, delivery: asyncio.Task[bool]) -> None:
        if delivery.cancelled() or delivery.exception() is not None or delivery.result():
            return
        if call.decide(Reject(480)):
            logger.warning("%s: the webhook was not delivered: rejected (480)", call.ids)

    async def _open_media(self, call: SipCall) -> MediaPlan:
        """The call's RTP leg, started on the SDP answer to its offer."""
        if call.leg is None:
            call.leg = await RtpLeg.open(self.ports)
        if call.plan is None or call.leg.session is None:
            call.plan = answer_offer(call.invite.sdp_offer, self.media_host, call.leg.port)
            await call.leg.start(self.bind_host, call.plan, call.frame,
                                 lambda d, _ms: call.digit(d), call.comfort_noise)
        return call.plan

    async def _early_media(self, call: SipCall) -> None:
        """183 Session Progress with the SDP answer, then ``sip_early_media``'s audio on
        the call's RTP until the app decides."""
        assert self.early_audio is not None
        plan = await self._open_media(call)
        if not call.ringing:  # decided (or cancelled) while the media opened
            return
        leg = call.leg
        assert leg is not None
        call.early_answer = serialize_sdp(plan.answer)
        call.progress()
        call.early = EarlyMedia(encode_frames(self.early_audio, plan.law, opus=plan.opus), leg.send,
                                lambda: leg.queued_frames, leg.drop_queued)
        call.early.start()
        logger.info("%s: early media (%s) on RTP %d -> %s:%d", call.ids,
                    self.settings.sip_early_media, leg.port, *plan.remote)

    async def _answer_and_serve(self, call: SipCall, chosen: SessionSettings | None) -> None:
        plan = await self._open_media(call)
        assert call.leg is not None
        if call.ended:  # hung up while the media opened
            return
        call.invite.accept(plan.answer)
        call.heard_at = asyncio.get_running_loop().time()  # the media timeout starts now
        logger.info("%s from %s answered: %s, RTP %d <-> %s:%d", call.ids,
                    call.invite.caller, plan.codec_name,
                    call.leg.port, *plan.remote)
        bridge = RtpBridge(call.ids, call.leg.wire)
        leg = call.leg

        async def send(event: ev.ServerEvent) -> None:
            call.publish(event)
            frames, drop, commands = bridge.on_event(event, leg.queued_frames)
            if drop:
                leg.drop_queued()
            leg.send(frames)
            for command in commands:
                await call.inbox.put(command)

        async def close(end: SessionEnd) -> None:
            if not call.ended:  # the server ends it: the reply queued is heard, then BYE
                await leg.flush(FLUSH_S)
            reason = call.end_reason or end.reason
            if call.invite.hangup() is not None:
                logger.info("%s: hung up (BYE)%s", call.ids, f": {reason}" if reason else "")

        fmt = AudioFormat.of(plan.law)  # the call's law, whatever the app's config said
        if chosen is not None:
            settings = replace(chosen, input_format=fmt, output_format=fmt)
        else:
            settings = SessionSettings(input_format=fmt, output_format=fmt,
                                       transcription=Transcription())
            if self.settings.sip_instructions is not None:
                settings = replace(settings, instructions=self.settings.sip_instructions)
        runner = call.admission.runner(send, settings=settings, transport_reports_playout=True,
                                       voice_error=session_voice_check(self.app_state))
        watchdog = asyncio.create_task(self._watch_media(call), name=f"sip-media-{call.id}")

        async def stop_watchdog() -> None:
            watchdog.cancel()
            await asyncio.gather(watchdog, return_exceptions=True)

        await self.state.host.serve(call.admission, runner, call.commands(), close=close,
                                    cleanup=stop_watchdog)

    async def _watch_media(self, call: SipCall) -> None:
        """End a call whose caller sent no RTP for ``sip_media_timeout`` seconds while not
        on hold: a caller that vanished without a BYE."""
        timeout = self.settings.sip_media_timeout
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(timeout / 4, 5.0))
            held = call.leg is not None and call.leg.on_hold
            if held:
                call.heard_at = loop.time()
            elif loop.time() - call.heard_at > timeout:
                logger.warning("%s: no RTP from the caller for %.0f s; hanging up", call.ids,
                               timeout)
                call.end()
                return
