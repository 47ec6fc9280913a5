"""What the HTTP app's routes share: the server state and its FastAPI accessor."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import Any

from voxline.config import Settings
from voxline.engines.client import EngineClient
from voxline.realtime.auth.access import ClientSecrets
from voxline.realtime.auth.signed_tokens import SigningKeys
from voxline.realtime.ops.metrics import Metrics
from voxline.realtime.session_host import SessionHost, SessionLimits


@dataclass
class ServerState:
    settings: Settings
    engine: EngineClient
    metrics: Metrics = field(default_factory=Metrics)
    started: float = field(default_factory=time.time)
    client_secrets: ClientSecrets = field(init=False)  # signed with client_secret_keys
    server_id: str = field(init=False)  # in the ids of calls, so a balancer can route them
    calls: dict[str, Any] = field(default_factory=dict)  # WebRTC calls by id (webrtc.Call)

    def __post_init__(self) -> None:
        self.server_id = self.settings.server_id or os.urandom(4).hex()
        keys = self.settings.client_secret_keys
        self.client_secrets = ClientSecrets(SigningKeys.parse(keys) if keys else None)
        # every transport admits, builds and counts its sessions here
        limits = replace(SessionLimits.from_settings(self.settings), server_id=self.server_id)
        self.host = SessionHost(self.engine, limits, metrics=self.metrics)

    @property
    def sessions(self) -> int:
        """Sessions holding a slot: open, or admitted and still connecting."""
        return self.host.active


def get_state(request_or_ws: object) -> ServerState:
    """The state of the app serving a request or WebSocket (set by ``create_app``)."""
    return request_or_ws.app.state.voxline  # type: ignore[attr-defined]
