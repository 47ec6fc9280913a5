"""OpenAI's HTTP error body, ``{"error": {"message", "type", "param", "code"}}``, as the
realtime routes answer a request they refuse (credentials, a bad offer, a busy server)."""

from __future__ import annotations

from fastapi.responses import JSONResponse


def error_response(status: int, message: str, *, code: str | None = None,
                   param: str | None = None, type: str = "invalid_request_error") -> JSONResponse:
    """OpenAI's HTTP error shape; a 503 (busy, starting) says when to retry."""
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse({"error": {"message": message, "type": type, "param": param,
                                   "code": code}}, status_code=status, headers=headers)
