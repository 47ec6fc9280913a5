"""Reading a Starlette test WebSocket's server events until one of a kind arrives."""

from __future__ import annotations


def until(ws, kind: str, seen: list[dict], *, errors_ok: bool = False) -> dict:
    """Events into `seen` until one of type `kind` (returned); an `error` fails the test
    unless `errors_ok`."""
    while True:
        event = ws.receive_json()
        seen.append(event)
        assert errors_ok or event["type"] != "error", event
        if event["type"] == kind:
            return event
