"""`WS /v1/realtime`: the OpenAI Realtime WebSocket transport. Holds no conversation logic:
it authenticates, parses frames into client events, renders server events in the
client's dialect, and closes with a code and reason when the session ends."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from voxline.errors import ProtocolError
from voxline.realtime.auth import Access, authenticate, offered_subprotocols
from voxline.realtime.client_secrets import error_response
from voxline.realtime.dialect import detect_dialect
from voxline.realtime.outbox import Outbox, SlowClient, close_after
from voxline.realtime.session_host import SHUTDOWN_REASON, Admission, Refusal, SessionRefused
from voxline.realtime.state import get_state
from voxline.realtime.video_recorder import SessionVideoRecorder
from voxline.realtime.videos_api import video_store
from voxline.realtime.voices import session_voice_check
from voxline.realtime.wire_client import parse_command
from voxline.realtime.wire_server import render_json
from voxline.sessions.commands import ClientCommand
from voxline.sessions.events import ServerEvent
from voxline.sessions.runner import SessionEnded, SessionRunner
from voxline.sessions.settings import SessionSettings

logger = logging.getLogger(__name__)
router = APIRouter()

CLOSE_POLICY = 1008  # bad credentials / abuse
CLOSE_TRY_AGAIN = 1013  # capacity
CLOSE_GOING_AWAY = 1001  # server shutdown


class OpenSessions:
    """The app's open `/v1/realtime` sessions, so that a shutdown can drain them.

    `drain(grace)` refuses new sessions and lets each open one finish the reply it has
    in flight (at most `grace` seconds); then each closes with 1001 and a reason.
    """

    def __init__(self) -> None:
        self.count = 0
        self.deadline = 0.0  # event-loop time at which draining sessions stop waiting
        self._draining: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None

    @property
    def draining(self) -> bool:
        return self._draining is not None and self._draining.is_set()

    def _events(self) -> tuple[asyncio.Event, asyncio.Event]:
        if self._draining is None or self._idle is None:  # made lazily: on the serving loop
            self._draining, self._idle = asyncio.Event(), asyncio.Event()
            self._idle.set()
        return self._draining, self._idle

    async def drain(self, grace: float) -> None:
        draining, idle = self._events()
        self.deadline = asyncio.get_running_loop().time() + grace
        draining.set()
        logger.info("draining %d realtime sessions (grace %.1f s)", self.count, grace)
        with contextlib.suppress(TimeoutError):  # sessions stop waiting at the deadline
            await asyncio.wait_for(idle.wait(), grace + 3.0)

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        """Count a connection as open for the whole block: a drain waits until its close
        frame is out, not just until its session ended."""
        _, idle = self._events()
        self.count += 1
        idle.clear()
        try:
            yield
        finally:
            self.count -= 1
            if self.count == 0:
                idle.set()

    async def serve(self, runner: SessionRunner,
                    incoming: AsyncIterator[ClientCommand | ProtocolError]) -> None:
        """`runner.run(incoming)`, ended by a drain (SessionEnded 1001) once it is idle."""
        draining, _ = self._events()
        loop = asyncio.get_running_loop()
        run = asyncio.ensure_future(runner.run(incoming))
        drain = asyncio.ensure_future(draining.wait())
        try:
            await asyncio.wait({run, drain}, return_when=asyncio.FIRST_COMPLETED)
            # a reply in flight ends (response.done sent) before the session does
            replied = asyncio.ensure_future(runner.wait_no_response())
            await asyncio.wait({run, replied}, timeout=max(0.0, self.deadline - loop.time()),
                               return_when=asyncio.FIRST_COMPLETED)
            replied.cancel()
            if not run.done():
                run.cancel()  # the runner's clean-up still delivers events already queued
                await asyncio.gather(run, return_exceptions=True)
                raise SessionEnded(CLOSE_GOING_AWAY, SHUTDOWN_REASON)
            run.result()
        finally:
            for task in (run, drain):
                task.cancel()
            await asyncio.gather(run, drain, return_exceptions=True)


def open_sessions(app: object) -> OpenSessions:
    """The app's session registry (made on first use)."""
    state = app.state  # type: ignore[attr-defined]
    if getattr(state, "realtime_sessions", None) is None:
        state.realtime_sessions = OpenSessions()
    sessions: OpenSessions = state.realtime_sessions
    return sessions


async def _client_events(ws: WebSocket, max_bytes: int, left: Callable[[], None]
                         ) -> AsyncIterator[ClientCommand | ProtocolError]:
    """The client's events until it disconnects; then `left()` (before the session's
    clean-up, which waits for the engine to close the stream)."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            left()
            return
        text = message.get("text")
        if text is None:
            yield ProtocolError("binary frames are not supported; send JSON events as text "
                                "frames", code="invalid_request_error")
            continue
        if len(text) > max_bytes:
            yield ProtocolError(f"event is {len(text)} bytes, more than the {max_bytes} allowed",
                                code="invalid_request_error")
            continue
        try:
            yield parse_command(text)
        except ProtocolError as exc:
            yield exc


def refusal_close(refused: SessionRefused) -> tuple[int, str]:
    """The close frame for a session the host did not admit."""
    code = CLOSE_GOING_AWAY if refused.refusal is Refusal.SHUTTING_DOWN else CLOSE_TRY_AGAIN
    return code, refused.reason


@router.websocket("/v1/realtime")
async def realtime(ws: WebSocket) -> None:
    state = get_state(ws)
    settings = state.settings
    offered = offered_subprotocols(ws)
    access = authenticate(ws, settings.api_key, state.client_secrets)
    if not isinstance(access, Access):
        state.host.count_refusal()
        await ws.close(code=CLOSE_POLICY, reason=access)
        return
    sessions = open_sessions(ws.app)
    if sessions.draining:  # HTTP 503, not a close after 101: a balancer retries elsewhere
        state.host.count_refusal()
        await ws.send_denial_response(error_response(503, SHUTDOWN_REASON,
                                                     code="server_shutting_down"))
        return
    await ws.accept(subprotocol="realtime" if "realtime" in offered else None)
    try:
        admission = state.host.admit(draining=sessions.draining)
    except SessionRefused as refused:
        code, reason = refusal_close(refused)
        await ws.close(code=code, reason=reason)
        return
    with admission:  # the slot is released however the session ends
        await _serve(ws, admission, access, sessions)


async def _serve(ws: WebSocket, admission: Admission, access: Access,
                 sessions: OpenSessions) -> None:
    state = get_state(ws)
    settings = state.settings
    dialect = detect_dialect(list(ws.headers.items()))
    session_id = admission.session_id
    # the session echoes the model the client asked for (`?model=`), as OpenAI does
    requested = ws.query_params.get("model")
    initial = access.settings or SessionSettings()  # a client secret's session, if any
    if requested:
        initial = replace(initial, model=requested)
    outbox = Outbox(ws.send_text, settings.send_buffer_kb * 1024)

    recorder = SessionVideoRecorder(video_store(ws.app.state))  # videos: MP4s in /v1/videos

    async def send(event: ServerEvent) -> None:
        await recorder.on_event(event)
        wire = render_json(event, dialect)
        if wire is not None:
            outbox.put(wire)  # never waits on the client; raises SlowClient past the bound

    runner = admission.runner(send, settings=initial,
                              voice_error=session_voice_check(ws.app.state))
    admission.opened()
    logger.info("session %s opened (%s dialect)", session_id, dialect.value)
    with sessions.track():
        code, reason = 1000, ""
        outbox.start()
        try:
            # the slot is freed once the client has gone, not once the engine confirmed the
            # stream's close: a client that reconnects at once is not refused at capacity
            # (the engine keeps streams beyond max_sessions for that overlap)
            await sessions.serve(runner, _client_events(ws, settings.max_event_bytes,
                                                        admission.release))
        except (SessionEnded, SlowClient) as end:
            code, reason = end.code, end.reason
        except WebSocketDisconnect:
            pass
        except Exception:
            logger.exception("session %s failed", session_id)
            state.metrics.inc("voxline_session_errors_total", "sessions ended by a server error")
            code, reason = 1011, "internal server error"
        finally:
            admission.release()  # before the close frame: a reconnect finds the slot free
            await recorder.aclose()
            logger.info("session %s closed%s", session_id, f": {reason}" if reason else "")
        await close_after(ws, outbox, code, reason, state.metrics)
