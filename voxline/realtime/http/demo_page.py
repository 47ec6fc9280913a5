"""The browser voice-chat page: `GET /` and its scripts, served from `voxline.web_demo`.

The page is static (no build step). It calls `POST /v1/realtime/calls` (WebRTC) on the
same origin by default, and `WS /v1/realtime` when switched to the WebSocket.
`GET /web/features.json` tells it what this server makes beyond voice (``video``: a video
model is loaded, so the page offers a video track and shows its video panel).
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from voxline.realtime.state import get_state

router = APIRouter()

_PACKAGE = "voxline.web_demo"
# Browsers must see edits at once after an upgrade; the files are tiny.
_HEADERS = {"Cache-Control": "no-cache"}


def _asset(name: str) -> bytes:
    return files(_PACKAGE).joinpath(name).read_bytes()


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def index() -> Response:
    return Response(_asset("index.html"), media_type="text/html; charset=utf-8",
                    headers=_HEADERS)


@router.get("/web/features.json", include_in_schema=False)
async def features(request: Request) -> JSONResponse:
    return JSONResponse({"video": bool(get_state(request).settings.video)}, headers=_HEADERS)


SCRIPTS = ("app.js", "video.js", "worklets.js")  # worklets.js: the AudioWorklet processors


@router.api_route("/web/{name}", methods=["GET", "HEAD"], include_in_schema=False)
async def script(name: str) -> Response:
    if name not in SCRIPTS:
        return Response(status_code=404)
    return Response(_asset(name), media_type="text/javascript; charset=utf-8",
                    headers=_HEADERS)
