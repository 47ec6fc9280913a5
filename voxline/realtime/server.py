"""`voxline serve`: uvicorn + uvloop around the app, with a supervised engine process."""

from __future__ import annotations

import argparse
import logging

import uvicorn

from voxline.config import Settings, load_settings
from voxline.engines.client import EngineClient, InProcessEngineClient
from voxline.engines.factory import DEFAULT_CORE
from voxline.engines.process import MultiprocessEngineClient
from voxline.realtime.app import create_app

logger = logging.getLogger(__name__)


def make_engine(settings: Settings) -> EngineClient:
    kwargs = {"llm_dtype": settings.llm_dtype, "threads": settings.threads,
              "cache": str(settings.cache), "tts": settings.tts,
              "tts_device": settings.tts_device, "tts_speaker": settings.tts_speaker,
              "tts_language": settings.tts_language}
    if settings.engine == "inprocess":
        return InProcessEngineClient(DEFAULT_CORE, kwargs)
    return MultiprocessEngineClient(DEFAULT_CORE, kwargs, start_timeout=600)


def serve(args: argparse.Namespace) -> int:
    settings = load_settings(
        host=args.host, port=args.port, api_key=getattr(args, "api_key", None),
        max_sessions=getattr(args, "max_sessions", None),
        engine=getattr(args, "engine", None),
        output_lead_ms=getattr(args, "output_lead_ms", None),
        tts=getattr(args, "tts", None),
        ice_hosts=getattr(args, "ice_hosts", None),
        ice_servers=getattr(args, "ice_servers", None),
        rtc_ports=getattr(args, "rtc_ports", None),
    )
    app = create_app(settings, make_engine(settings))
    logger.info("voxline listening on http://%s:%d (realtime: ws://%s:%d/v1/realtime)",
                settings.host, settings.port, settings.host, settings.port)
    uvicorn.run(app, host=settings.host, port=settings.port, loop="uvloop",
                ws="websockets-sansio", log_level="info", ws_max_size=settings.max_event_bytes + 1024,
                timeout_graceful_shutdown=5)
    return 0
