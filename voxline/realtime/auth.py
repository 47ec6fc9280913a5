"""API-key checks, one home for HTTP and WebSocket: constant-time comparison.

A client presents the key as ``Authorization: Bearer KEY`` or, from a browser (which
cannot set headers on a WebSocket), as the subprotocol ``openai-insecure-api-key.KEY``.
"""

from __future__ import annotations

import hmac

from starlette.requests import HTTPConnection

KEY_SUBPROTOCOL = "openai-insecure-api-key."


def offered_subprotocols(conn: HTTPConnection) -> list[str]:
    raw = conn.headers.get("sec-websocket-protocol", "")
    return [p.strip() for p in raw.split(",") if p.strip()]


def presented_keys(conn: HTTPConnection) -> list[str]:
    keys = []
    scheme, _, token = conn.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        keys.append(token.strip())
    keys += [p[len(KEY_SUBPROTOCOL):] for p in offered_subprotocols(conn)
             if p.startswith(KEY_SUBPROTOCOL)]
    return keys


def authorized(conn: HTTPConnection, api_key: str | None) -> bool:
    """True when no key is configured or the connection presents it."""
    if not api_key:
        return True
    want = api_key.encode()
    # compare with every candidate, so timing does not tell which one was close
    matches = [hmac.compare_digest(key.encode(), want) for key in presented_keys(conn)]
    return any(matches)
