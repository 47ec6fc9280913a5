"""Ids that name the server owning them, so a balancer can route requests for them.

A WebRTC call (``rtc_<server_id>_<hex>``) and a video (``video_<server_id>_<hex>``) live in
one server's memory; HAProxy sends ``/v1/realtime/calls/rtc_a_...`` and ``/v1/videos/video_a_...``
to server ``a`` by the id's second field (deploy/haproxy.cfg). Server ids hold no ``_``.
"""

from __future__ import annotations

import uuid


def owned_id(kind: str, server_id: str) -> str:
    """A fresh id of `kind` (``rtc``, ``video``) owned by `server_id`."""
    return f"{kind}_{server_id}_{uuid.uuid4().hex}"


def id_owner(some_id: str) -> str | None:
    """The server named in an owned id; None for ids of another shape."""
    parts = some_id.split("_")
    return parts[1] if len(parts) >= 3 and parts[1] else None


def not_here_reason(some_id: str, server_id: str, route: str) -> str | None:
    """Why an id is unknown here when it names another server (a balancer that does not
    route by the id); None when it is this server's (or not an owned id)."""
    owner = id_owner(some_id)
    if owner is None or owner == server_id:
        return None
    return (f"on this server ({server_id}): it belongs to server {owner}; route "
            f"{route} to that server")
