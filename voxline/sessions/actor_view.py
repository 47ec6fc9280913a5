"""The session actor's face to its helpers (function calls, MCP tools, show_video).

Helpers are parts of one actor, split out by concern; they read its item list and
settings and write its event and command outboxes through this Protocol only, never
through the actor's private methods. `SessionActor` implements it (it imports the
helpers, so they cannot import it back).
"""

from __future__ import annotations

from typing import Protocol

from voxline.engines import protocol as ep
from voxline.sessions import events as ev
from voxline.sessions.records import ActiveResponse, ItemRecord
from voxline.sessions.settings import SessionSettings


class ActorView(Protocol):
    """What a helper may use of its actor."""

    stream_id: str
    settings: SessionSettings
    items: dict[str, ItemRecord]
    order: list[str]  # item ids in conversation order
    commands: list[ep.EngineInput]  # engine inputs, sent by the runner
    events: list[ev.ServerEvent]  # server events, sent by the transport
    response: ActiveResponse | None  # the reply in progress

    def emit(self, event: ev.ServerEvent) -> None:
        """Queue `event` for the client."""

    def send_error(self, message: str, *, code: str, event_id: str | None = None,
                   param: str | None = None, type: str = "invalid_request_error") -> None:
        """Queue an ``error`` event."""

    def add_record(self, record: ItemRecord, previous_item_id: str | None = None) -> None:
        """Add an item after `previous_item_id` (None: at the end)."""

    def previous_item(self, item_id: str) -> str | None:
        """The item before `item_id` in conversation order."""

    def engine_stream_config(self) -> ep.StreamConfig:
        """The engine stream's config from the settings and tools now."""
