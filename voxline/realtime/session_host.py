"""One session host for every transport: admission, construction, counting, release.

The WebSocket, Twilio and WebRTC transports and the embedded SDK all host their sessions
here, so the rules live once:

- :meth:`SessionHost.admit` decides synchronously, before the transport awaits anything
  (reading an SDP offer, answering it), whether a session may open. On yes it holds a
  slot at once, so concurrent connects or offers can never pass ``max_sessions``; on no
  it raises :class:`SessionRefused` with a :class:`Refusal` (why, and the reason text the
  transport puts in its close frame or HTTP error) and counts the refusal.
- The returned :class:`Admission` names the session (its id and the engine stream id) and
  builds its actor and runner with the host's limits. It is a context manager: leaving
  the block releases the slot however it is left (an exception, a bad offer refused after
  admission, a disconnect), unless the transport :meth:`Admission.detach`-ed it to hold
  it longer (a WebRTC call outlives its HTTP request); then the transport calls
  :meth:`Admission.release` itself. Release is idempotent.
- The host owns the counters: :attr:`SessionHost.active` (slots held, the sessions
  ``/health`` reports) and the ``voxline_sessions_total`` / ``voxline_sessions_refused_total``
  metrics.

Transport-neutral: no FastAPI, Starlette, uvicorn or aiortc here (the SDK imports it).
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from voxline.engines.client import EngineClient
from voxline.sessions import events as ev
from voxline.sessions.actor import SessionActor
from voxline.sessions.capabilities import MOONSHINE, TranscriptionSupport
from voxline.sessions.ids import new_id
from voxline.sessions.images import ImageLimits
from voxline.sessions.playout_lead import PlayoutReports
from voxline.sessions.runner import SessionRunner
from voxline.sessions.settings import AudioFormat, SessionSettings

if TYPE_CHECKING:
    from voxline.config import Settings
    from voxline.realtime.metrics import Metrics

logger = logging.getLogger(__name__)

SHUTDOWN_REASON = "server is shutting down"
NOT_READY_REASON = "engine is not ready, try again shortly"
DEFAULT_MAX_EVENT_BYTES = 15 * 1024 * 1024


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
    """Admits, builds and counts the sessions of one server (or one SDK engine)."""

    def __init__(self, engine: EngineClient, limits: SessionLimits | None = None, *,
                 metrics: Metrics | None = None) -> None:
        self.engine = engine
        self.limits = limits or SessionLimits()
        self.metrics = metrics
        self.active = 0  # slots held: admitted sessions not yet released

    def admit(self, *, prefix: str = "sess", draining: bool = False) -> Admission:
        """Hold a slot for a new session, or raise SessionRefused (and count it).

        Synchronous on purpose: call it before the transport's first await for the session,
        so that the check and the count are one step."""
        refusal = self._refusal(draining)
        if refusal is not None:
            self.count_refusal()
            raise SessionRefused(*refusal)
        self.active += 1
        return Admission(self, new_id(prefix))

    def _refusal(self, draining: bool) -> tuple[Refusal, str] | None:
        limit = self.limits.max_sessions
        if draining:
            return Refusal.SHUTTING_DOWN, SHUTDOWN_REASON
        if limit is not None and self.active >= limit:
            return Refusal.AT_LIMIT, f"server is at its limit of {limit} sessions"
        if not self.engine.ready:
            return Refusal.ENGINE_NOT_READY, NOT_READY_REASON
        return None

    def count_refusal(self) -> None:
        """Count a session refused before admission (bad credentials, a refused admit)."""
        if self.metrics is not None:
            self.metrics.inc("voxline_sessions_refused_total", "sessions refused")

    def _opened(self) -> None:
        if self.metrics is not None:
            self.metrics.inc("voxline_sessions_total", "realtime sessions opened")

    def _release(self) -> None:
        self.active -= 1


class Admission:
    """One admitted session's slot, its names, and the builder of its actor and runner."""

    def __init__(self, host: SessionHost, session_id: str) -> None:
        self.host = host
        self.session_id = session_id
        self.stream_id = stream_id_for(session_id)
        self.released = False
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
            self.host._opened()

    def detach(self) -> Admission:
        """Keep the slot past the ``with`` block; the caller then calls `release`."""
        self._detached = True
        return self

    def release(self) -> None:
        """Give the slot back (idempotent)."""
        if not self.released:
            self.released = True
            self.host._release()

    def __enter__(self) -> Admission:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._detached:
            self.release()
