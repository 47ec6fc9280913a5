"""What a session keeps about its conversation: item records and the active response."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from voxline.engines import protocol as ep
from voxline.sessions import items as it
from voxline.sessions.audio import OutputEncoder
from voxline.sessions.settings import SessionSettings

logger = logging.getLogger("voxline.sessions.trace")


@dataclass
class ActiveResponse:
    response: it.RealtimeResponse
    item_id: str
    settings: SessionSettings
    started: float
    trigger: float  # end of user speech or response.create: the latency clock's zero
    transcript: str = ""
    encoder: OutputEncoder | None = None
    engine_done: ep.ResponseFinished | None = None
    cancel_reason: it.StatusReason | None = None
    first_audio: float | None = None
    buffer_started: bool = False
    calls: list[str] = field(default_factory=list)  # its function_call items, in order

    @property
    def audio(self) -> bool:
        return self.settings.audio_output


@dataclass
class ItemRecord:
    item: it.MessageItem | it.FunctionCallItem | it.FunctionCallOutputItem
    audio_ms: float = 0.0  # assistant audio sent to the client, less what a truncate cut
    sent_ms: float = 0.0  # all assistant audio ever sent: the bound for a client truncate
    client_truncated: bool = False  # the client cut it: the server does not cut it again
    pending_transcript: bool = False


def log_trace(tracing: str | dict[str, Any] | None, session_id: str, r: ActiveResponse,
              final: it.RealtimeResponse, now: float) -> None:
    """`session.tracing`: each response's outcome and timings, logged under the workflow
    name (voxline keeps traces in its log; nothing is uploaded)."""
    if tracing is None:
        return
    workflow = (tracing.get("workflow_name") if isinstance(tracing, dict) else None) or "voxline"
    first = f"{(r.first_audio - r.trigger) * 1000:.0f} ms" if r.first_audio else "none"
    usage = final.usage
    logger.info("trace %s: session %s response %s %s in %.0f ms, first audio %s, "
                "%d output tokens", workflow, session_id, final.id, final.status,
                (now - r.started) * 1000, first, usage.output_tokens if usage else 0)
