"""Playout reports: tell the engine how much of the running reply its listener has heard.

The engine generates a spoken reply only a bounded lead ahead of playout (its
`generation_lead_s` setting), and it learns playout from these reports
(`PlayoutProgress`); the session, which paces the audio, is the one that knows it.

Contract (`report`, called on every tick with the actor's running response): the first
report of a response (what was heard so far, 0 at its first tick) opts it into the
engine's flow control; after that a report goes out each time the heard position (the
pacer's `heard_ms`) has moved `REPORT_EVERY_MS` past the last one. Nothing is reported
for a text-only or cancelled response. A report is never ahead of what was heard, so the
engine's view of playout lags the truth by less than one step: that can only hold
generation back a little more, never let it run further ahead of the listener. Off
(`enabled` False: the default of a bare actor) it reports nothing. Pure: no clock or
I/O; the caller passes `now`.
"""

from __future__ import annotations

from voxline.engines import protocol as ep
from voxline.sessions.pacing import OutputPacer
from voxline.sessions.records import ActiveResponse

# Four reports a second while a reply plays: cheap on the engine channel, and the engine
# resumes a held reply within a quarter second of playout catching up.
REPORT_EVERY_MS = 250.0


class PlayoutReports:
    """The `PlayoutProgress` reports of one session's running response."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._response: str | None = None  # the response last reported on
        self._reported_ms = 0.0

    @classmethod
    def off(cls) -> PlayoutReports:
        return cls(enabled=False)

    def report(self, stream_id: str, r: ActiveResponse | None, pacer: OutputPacer,
               now: float) -> list[ep.PlayoutProgress]:
        """The report due at `now` for the running response `r` (none, or one)."""
        if not self.enabled or r is None or not r.audio or r.cancel_reason is not None:
            return []
        heard = pacer.heard_ms(r.item_id, now)
        rid = r.response.id
        if rid == self._response and heard < self._reported_ms + REPORT_EVERY_MS:
            return []
        self._response, self._reported_ms = rid, heard
        return [ep.PlayoutProgress(stream_id, rid, heard)]
