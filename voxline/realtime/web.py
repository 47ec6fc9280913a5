"""The browser voice-chat page: `GET /` and its script, served from `voxline.web_demo`.

The page is static (no build step). It calls `POST /v1/realtime/calls` (WebRTC) on the
same origin by default, and `WS /v1/realtime` when switched to the WebSocket.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

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


@router.api_route("/web/app.js", methods=["GET", "HEAD"], include_in_schema=False)
async def app_js() -> Response:
    return Response(_asset("app.js"), media_type="text/javascript; charset=utf-8",
                    headers=_HEADERS)
