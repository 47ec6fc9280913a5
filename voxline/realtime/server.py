"""`voxline serve`: uvicorn + uvloop around the app, with a supervised engine process."""

from __future__ import annotations

import argparse
import logging
import socket
from types import FrameType

import uvicorn

from voxline.config import Settings, load_settings
from voxline.engines.client import EngineClient, InProcessEngineClient
from voxline.engines.factory import DEFAULT_CORE
from voxline.engines.process import MultiprocessEngineClient
from voxline.errors import VoxlineError
from voxline.realtime.app import create_app
from voxline.realtime.websocket import OpenSessions, open_sessions

logger = logging.getLogger(__name__)


def make_engine(settings: Settings) -> EngineClient:
    if settings.remote_llm and not settings.llm_model:
        raise VoxlineError(f"--llm {settings.llm} needs --llm-model (the model name the server "
                           "serves; its /v1/models lists them)")
    kwargs = {"llm_dtype": settings.llm_dtype, "threads": settings.threads,
              "cache": str(settings.cache), "tts": settings.tts,
              "speculate_after_ms": settings.speculate_after_ms,
              "tts_device": settings.tts_device, "tts_speaker": settings.tts_speaker,
              "llm_device": settings.llm_device,
              "llm": settings.llm, "llm_model": settings.llm_model,
              "llm_api_key": settings.llm_api_key, "llm_timeout": settings.llm_timeout,
              "llm_retries": settings.llm_retries,
              "tts_language": settings.tts_language, "tts_max_streams": settings.tts_max_streams,
              "tts_batch_buckets": settings.tts_batch_buckets,
              "tts_first_chunk_frames": settings.tts_first_chunk_frames,
              "tts_chunk_frames": settings.tts_chunk_frames, "max_sessions": settings.max_sessions,
              "max_responses": settings.max_responses}
    if settings.engine == "inprocess":
        return InProcessEngineClient(DEFAULT_CORE, kwargs)
    return MultiprocessEngineClient(DEFAULT_CORE, kwargs, start_timeout=600)


class DrainingServer(uvicorn.Server):
    """uvicorn, but SIGTERM/SIGINT drain: stop accepting, let replies in flight finish
    (up to `grace` s), close sessions with 1001 and a reason, then shut down and exit 0.

    Plain uvicorn closes WebSockets at once (1012) and re-raises the signal at exit.
    """

    def __init__(self, config: uvicorn.Config, sessions: OpenSessions, grace: float) -> None:
        super().__init__(config)
        self._sessions = sessions
        self._grace = grace

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self._captured_signals.clear()  # a drained shutdown is a clean exit, not a death

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # stop accepting before draining
        if not self.force_exit:
            await self._sessions.drain(self._grace)
        await super().shutdown(sockets)


def _device_dtype(device: str | None) -> str | None:
    """``--device cuda`` without ``--llm-dtype``: bfloat16 (the CPU default int8 is CPU-only)."""
    return "bfloat16" if device and device.startswith("cuda") else None


def serve(args: argparse.Namespace) -> int:
    settings = load_settings(
        host=args.host, port=args.port, api_key=getattr(args, "api_key", None),
        max_sessions=getattr(args, "max_sessions", None),
        max_responses=getattr(args, "max_responses", None),
        send_buffer_kb=getattr(args, "send_buffer_kb", None),
        engine=getattr(args, "engine", None),
        output_lead_ms=getattr(args, "output_lead_ms", None),
        tts=getattr(args, "tts", None),
        ice_hosts=getattr(args, "ice_hosts", None),
        ice_servers=getattr(args, "ice_servers", None),
        rtc_ports=getattr(args, "rtc_ports", None),
        shutdown_grace=getattr(args, "shutdown_grace", None),
        speculate_after_ms=getattr(args, "speculate_after_ms", None),
        llm=getattr(args, "llm", None), llm_model=getattr(args, "llm_model", None),
        llm_api_key=getattr(args, "llm_api_key", None),
        llm_timeout=getattr(args, "llm_timeout", None),
        llm_retries=getattr(args, "llm_retries", None),
        llm_dtype=getattr(args, "llm_dtype", None) or _device_dtype(getattr(args, "device", None)),
        llm_device=getattr(args, "device", None),
        tts_device=getattr(args, "device", None),
    )
    app = create_app(settings, make_engine(settings))
    logger.info("voxline listening on http://%s:%d (realtime: ws://%s:%d/v1/realtime)",
                settings.host, settings.port, settings.host, settings.port)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, loop="uvloop",
                            ws="websockets-sansio", log_level="info",
                            ws_max_size=settings.max_event_bytes + 1024,
                            timeout_graceful_shutdown=5)
    server = DrainingServer(config, open_sessions(app), settings.shutdown_grace)
    server.run()
    return 0 if server.started else 1
