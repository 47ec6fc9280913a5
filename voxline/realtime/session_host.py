"""One session host for every transport: admission, construction, counting, draining and
the serve shell that runs a session to its end.

The WebSocket, Twilio and WebRTC transports and the embedded SDK all host their sessions
here, so the rules live once; a transport only parses and renders its wire:

- :meth:`SessionHost.admit` decides synchronously, before the transport awaits anything
  (reading an SDP offer, answering it), whether a session may open. On yes it holds a
  slot at once, so concurrent connects or offers can never pass ``max_sessions``; on no
  it raises :class:`SessionRefused` with a :class:`Refusal` (why, and the reason text the
  transport puts in its close frame or HTTP error: :func:`refusal_close`) and counts it.
- The returned :class:`Admission` names the session (its id and the engine stream id) and
  builds its actor and runner with the host's limits. It is a context manager: leaving
  the block releases the slot however it is left (an exception, a bad offer refused after
  admission, a disconnect), unless the transport :meth:`Admission.detach`-ed it to hold
  it longer (a WebRTC call outlives its HTTP request). Release is idempotent.
- :meth:`SessionHost.serve` runs an admitted session: the runner until the client leaves,
  the session ends or a drain ends it; then the slot is released (before the peer hears
  the end: a client that reconnects at once finds it free), the transport cleans up and
  closes with a :class:`SessionEnd` (code and reason). A server error is logged, counted
  and ends the session with 1011.
- :meth:`SessionHost.drain` (SIGTERM) refuses new sessions and lets each open one finish
  the reply it has in flight (at most `grace` seconds); then each closes with 1001. It
  waits until every served session has closed towards its peer.
- The host keeps one registry of sessions: each admission from admit until its session
  is closed. :attr:`SessionHost.active` (the sessions ``/health`` reports) counts those
  still holding a slot; the ``voxline_sessions_total`` / ``voxline_sessions_refused_total``
  / ``voxline_session_errors_total`` metrics are counted here too.

Transport-neutral: no FastAPI, Starlette, uvicorn or aiortc here (the SDK imports it).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from voxline.aio import cancel_and_wait
from voxline.engines import protocol as p
from voxline.engines.client import EngineClient
from voxline.errors import ProtocolError
from voxline.sessions import events as ev
from voxline.sessions.actor import SessionActor
from voxline.sessions.capabilities import MOONSHINE, TranscriptionSupport
from voxline.sessions.commands import ClientCommand
from voxline.sessions.ids import new_id
from voxline.sessions.images import ImageLimits
from voxline.sessions.playout_lead import PlayoutReports
from voxline.sessions.runner import SessionEnded, SessionRunner
from voxline.sessions.settings import AudioFormat, SessionSettings
from voxline.sessions.voices import register_voice

if TYPE_CHECKING:
    from voxline.config import Settings
    from voxline.realtime.ops.metrics import Metrics

logger = logging.getLogger(__name__)

SHUTDOWN_REASON = "server is shutting down"
NOT_READY_REASON = "engine is not ready, try again shortly"
INTERNAL_ERROR_REASON = "internal server error"
DEFAULT_MAX_EVENT_BYTES = 15 * 1024 * 1024
DRAIN_SLACK_S = 3.0  # past the grace: sessions closing their connection, then stop waiting

# How a session ends, as WebSocket close codes (RFC 6455); every transport reports these.
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001  # server shutdown
CLOSE_POLICY = 1008  # bad credentials / abuse / a client that stopped reading
CLOSE_INTERNAL_ERROR = 1011
CLOSE_TRY_AGAIN = 1013  # capacity

Incoming = ClientCommand | ProtocolError


class Refusal(enum.Enum):
    """Why a session was not admitted; each transport maps it to its own wire shape."""

    SHUTTING_DOWN = "shutting_down"  # the server is draining
    AT_LIMIT = "at_limit"  # max_sessions are open
    ENGINE_NOT_READY = "engine_not_ready"  # starting or restarting


class SessionRefused(Exception):
    """A session was not admitted: `refusal` says why, `reason` is the text to show."""

    def __init__(self, refusal: Refusal, reason: str) -> None:
        super().__init__(reason)
        self.refusal = refusal
        self.reason = reason


def refusal_close(refused: SessionRefused) -> SessionEnd:
    """The close of a session the host did not admit: 1001 while draining, else 1013."""
    code = CLOSE_GOING_AWAY if refused.refusal is Refusal.SHUTTING_DOWN else CLOSE_TRY_AGAIN
    return SessionEnd(code, refused.reason)


@dataclass(frozen=True)
class SessionEnd:
    """How a session ended: the close code and reason its transport tells the peer."""

    code: int = CLOSE_NORMAL
    reason: str = ""


@dataclass(frozen=True)
class SessionLimits:
    """What every session on a host is built with (from `Settings` on a server)."""

    max_sessions: int | None = None  # None: no limit (the embedded SDK)
    lead_ms: float = 200.0
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    max_session_seconds: float = 1800.0
    tools_supported: bool = False
    show_video_tool: bool = False  # a tool-calling model and a video model: show_video offered
    images: ImageLimits | None = None  # None: input_image is refused (a text-only model)
    transcription: TranscriptionSupport = MOONSHINE  # the ASR's language / prompt support
    server_id: str | None = None  # named in a session's video ids (None: plain video_...)

    @classmethod
    def from_settings(cls, settings: Settings) -> SessionLimits:
        return cls(max_sessions=settings.max_sessions, lead_ms=settings.output_lead_ms,
                   max_event_bytes=settings.max_event_bytes,
                   max_session_seconds=settings.max_session_seconds,
                   tools_supported=settings.remote_llm, images=image_limits(settings),
                   show_video_tool=settings.remote_llm and bool(settings.video),
                   transcription=transcription_support(settings))


def transcription_support(settings: Settings) -> TranscriptionSupport:
    """What `settings`' ASR takes: Moonshine English only, no prompt; a Whisper checkpoint
    the languages its generation config names, and a prompt (reads that one JSON file)."""
    checkpoint = settings.whisper_checkpoint
    if checkpoint is None:
        return MOONSHINE
    from voxline.engines.models.whisper_asr import checkpoint_languages

    return TranscriptionSupport(f"Whisper ({checkpoint})", checkpoint_languages(checkpoint),
                                prompt=True)


def image_limits(settings: Settings) -> ImageLimits | None:
    """The image bounds of `settings`' sessions; None when the reply model reads no images
    (the embedded one)."""
    if not settings.remote_llm:
        return None
    return ImageLimits(settings.max_image_bytes, settings.max_session_images)


def stream_id_for(session_id: str) -> str:
    """The engine stream id of a session: named after it (logs tie the two together), with
    a random tail of its own."""
    return f"{session_id}-{uuid.uuid4().hex[:6]}"


class SessionHost:
    """Admits, builds, counts, serves and drains the sessions of one server (or SDK engine)."""

    def __init__(self, engine: EngineClient, limits: SessionLimits | None = None, *,
                 metrics: Metrics | None = None) -> None:
        self.engine = engine
        self.limits = limits or SessionLimits()
        self.metrics = metrics
        self._sessions: set[Admission] = set()  # admitted, not yet closed towards the peer
        self._drain_deadline = 0.0  # event-loop time at which draining sessions stop waiting
        self._draining: asyncio.Event | None = None  # made lazily: on the serving loop
        self._idle: asyncio.Event | None = None  # set while no session is registered

    # -- counting -------------------------------------------------------------------

    @property
    def active(self) -> int:
        """Sessions holding a slot: open, or admitted and still connecting."""
        return sum(1 for admission in self._sessions if not admission.released)

    @property
    def idle(self) -> bool:
        """No session is registered: every admitted one was released and has closed."""
        return not self._sessions

    @property
    def draining(self) -> bool:
        return self._draining is not None and self._draining.is_set()

    def admit(self, *, prefix: str = "sess") -> Admission:
        """Hold a slot for a new session, or raise SessionRefused (and count it).

        Synchronous on purpose: call it before the transport's first await for the session,
        so that the check and the count are one step."""
        refusal = self._refusal()
        if refusal is not None:
            self.count_refusal()
            raise SessionRefused(*refusal)
        admission = Admission(self, new_id(prefix))
        self._sessions.add(admission)
        if self._idle is not None:
            self._idle.clear()
        return admission

    def _refusal(self) -> tuple[Refusal, str] | None:
        limit = self.limits.max_sessions
        if self.draining:
            return Refusal.SHUTTING_DOWN, SHUTDOWN_REASON
        if limit is not None and self.active >= limit:
            return Refusal.AT_LIMIT, f"server is at its limit of {limit} sessions"
        if not self.engine.ready:
            return Refusal.ENGINE_NOT_READY, NOT_READY_REASON
        return None

    def count_refusal(self) -> None:
        """Count a session refused before admission (bad credentials, a refused admit)."""
        self._inc("voxline_sessions_refused_total", "sessions refused")

    def _inc(self, name: str, help_text: str) -> None:
        if self.metrics is not None:
            self.metrics.inc(name, help_text)

    def _forget(self, admission: Admission) -> None:
        self._sessions.discard(admission)
        if not self._sessions and self._idle is not None:
            self._idle.set()

    # -- engine work beside the sessions ---------------------------------------------

    async def register_voice(self, reference: p.VoiceReference) -> None:
        """Register (or, with empty audio, unregister) a named voice with the engine's
        speech stage, as sessions do their engine work (`sessions.voices`)."""
        await register_voice(self.engine, reference)

    # -- draining -------------------------------------------------------------------

    def _events(self) -> tuple[asyncio.Event, asyncio.Event]:
        if self._draining is None or self._idle is None:
            self._draining, self._idle = asyncio.Event(), asyncio.Event()
            if not self._sessions:
                self._idle.set()
        return self._draining, self._idle

    async def wait_draining(self) -> None:
        """Return once a drain has begun (for transports holding a peer that is not yet
        a session, e.g. a ringing phone call)."""
        draining, _ = self._events()
        await draining.wait()

    async def drain(self, grace: float) -> None:
        """Refuse new sessions; let open ones finish their reply in flight (`grace` s at
        most), then close them with 1001; return once they have closed (or shortly after
        the grace)."""
        draining, idle = self._events()
        self._drain_deadline = asyncio.get_running_loop().time() + grace
        draining.set()
        logger.info("draining %d realtime sessions (grace %.1f s)", len(self._sessions), grace)
        with contextlib.suppress(TimeoutError):  # sessions stop waiting at the deadline
            await asyncio.wait_for(idle.wait(), grace + DRAIN_SLACK_S)

    # -- serving --------------------------------------------------------------------

    async def serve(self, admission: Admission, runner: SessionRunner,
                    incoming: AsyncIterator[Incoming], *,
                    close: Callable[[SessionEnd], Awaitable[None]],
                    cleanup: Callable[[], Awaitable[None]] | None = None,
                    peer_gone: Callable[[Exception], bool] | None = None) -> SessionEnd:
        """Run an admitted session to its end and close it; returns how it ended.

        `incoming` is the client's parsed events (it ends when the client leaves). Once the
        session is over the slot is released, `cleanup` stops the transport's own tasks
        (also on cancellation), and `close(end)` tells the peer (not on cancellation). An
        exception for which `peer_gone` is true is the peer leaving mid-send, not a server
        error. The session stays registered (a drain waits for it) until `close` returns."""
        admission.serving = True
        admission.opened()
        end = SessionEnd()
        try:
            try:
                await self._run(runner, incoming)
            except SessionEnded as ended:  # also SlowClient: the peer stopped reading
                end = SessionEnd(ended.code, ended.reason)
            except Exception as exc:
                end = self._failed(admission, exc, peer_gone)
            finally:
                admission.release()  # before the close: a reconnect finds the slot free
                if cleanup is not None:
                    await cleanup()
                logger.info("session %s closed%s", admission.session_id,
                            f": {end.reason}" if end.reason else "")
            await close(end)
        finally:
            admission.serving = False
            self._forget(admission)
        return end

    def _failed(self, admission: Admission, exc: Exception,
                peer_gone: Callable[[Exception], bool] | None) -> SessionEnd:
        if peer_gone is not None and peer_gone(exc):
            logger.info("session %s: the peer left mid-send (%s)", admission.session_id,
                        type(exc).__name__)
            return SessionEnd()
        logger.error("session %s failed", admission.session_id, exc_info=exc)
        self._inc("voxline_session_errors_total", "sessions ended by a server error")
        return SessionEnd(CLOSE_INTERNAL_ERROR, INTERNAL_ERROR_REASON)

    async def _run(self, runner: SessionRunner, incoming: AsyncIterator[Incoming]) -> None:
        """`runner.run(incoming)`, ended by a drain (SessionEnded 1001) once no reply is in
        flight or the drain's deadline passed."""
        draining, _ = self._events()
        loop = asyncio.get_running_loop()
        run = asyncio.ensure_future(runner.run(incoming))
        drain = asyncio.ensure_future(draining.wait())
        try:
            await asyncio.wait({run, drain}, return_when=asyncio.FIRST_COMPLETED)
            # a reply in flight ends (response.done sent) before the session does
            replied = asyncio.ensure_future(runner.wait_no_response())
            await asyncio.wait({run, replied},
                               timeout=max(0.0, self._drain_deadline - loop.time()),
                               return_when=asyncio.FIRST_COMPLETED)
            replied.cancel()
            if not run.done():
                # the runner's clean-up still delivers events already queued
                await cancel_and_wait(run)
                raise SessionEnded(CLOSE_GOING_AWAY, SHUTDOWN_REASON)
            run.result()
        finally:
            await cancel_and_wait(run, drain)


class Admission:
    """One admitted session's slot, its names, and the builder of its actor and runner."""

    def __init__(self, host: SessionHost, session_id: str) -> None:
        self.host = host
        self.session_id = session_id
        self.stream_id = stream_id_for(session_id)
        self.released = False  # the slot was given back
        self.serving = False  # in `SessionHost.serve`: registered until it returns
        self._detached = False
        self._opened = False

    def runner(self, send: Callable[[ev.ServerEvent], Awaitable[None]], *,
               settings: SessionSettings | None = None, media_format: AudioFormat | None = None,
               transport_reports_playout: bool = False,
               voice_error: Callable[[str], str | None] | None = None) -> SessionRunner:
        """The session's actor under a runner that sends its events through `send`."""
        limits = self.host.limits
        actor = SessionActor(self.session_id, self.stream_id,
                             settings=settings or SessionSettings(), lead_ms=limits.lead_ms,
                             max_event_bytes=limits.max_event_bytes, media_format=media_format,
                             transport_reports_playout=transport_reports_playout,
                             tools_supported=limits.tools_supported, voice_error=voice_error,
                             show_video_tool=limits.show_video_tool,
                             images=limits.images, playout=PlayoutReports(),
                             transcription=limits.transcription)
        if limits.server_id is not None:
            actor.video.id_prefix = f"video_{limits.server_id}"
        metrics = self.host.metrics
        return SessionRunner(actor, self.host.engine, send,
                             max_seconds=limits.max_session_seconds,
                             observe=metrics.observe if metrics is not None else None)

    def opened(self) -> None:
        """The session is live (counted in ``voxline_sessions_total``); once."""
        if not self._opened and not self.released:
            self._opened = True
            self.host._inc("voxline_sessions_total", "realtime sessions opened")

    def detach(self) -> Admission:
        """Keep the slot past the ``with`` block; `serve` (or the caller) releases it."""
        self._detached = True
        return self

    def release(self) -> None:
        """Give the slot back (idempotent). A session being served stays registered until
        its close is out."""
        if not self.released:
            self.released = True
            if not self.serving:
                self.host._forget(self)

    def __enter__(self) -> Admission:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._detached:
            self.release()
