"""Flow control of spoken replies: generate a bounded lead ahead of what the listener heard.

A response whose caller reports its playout (`PlayoutProgress`, the `generation_lead_s`
setting as `lead_ms`) is generated only a bounded lead ahead of what its listener has
heard. While its generated audio is `lead_ms` or more ahead of the last reported
`played_ms`, the response is *held*: its LLM request sits out of the batch (`paused`)
and it starts no TTS segment (a streaming job is fed no more text); the next report
that brings it under the lead releases it. A segment starts only under the lead, so
generated audio never passes played + lead + one segment, a barge-in discards at most
that, and the cycles go to other streams meanwhile. A response never reported on is not
held. (A remote reply model streams its text at the server's pace regardless: its deltas
share one bounded queue, so only its speech is held.)
"""

from __future__ import annotations

from voxline.engines.response_run import ResponseRun


class PlayoutPacing:
    """Holds and releases runs by their unplayed audio; `lead_ms` None: never holds."""

    def __init__(self, lead_ms: float | None = None) -> None:
        self.lead_ms = lead_ms

    def reported(self, run: ResponseRun, played_ms: float) -> None:
        """The listener has heard `played_ms` of `run`'s audio (reports only move on)."""
        run.played_ms = max(run.played_ms or 0.0, played_ms)
        self.pace(run)

    def pace(self, run: ResponseRun) -> None:
        """Hold `run` while its unplayed audio reaches the lead; release it once under."""
        run.held = (self.lead_ms is not None and run.played_ms is not None
                    and run.audio_ms - run.played_ms >= self.lead_ms)
        if run.request is not None:
            run.request.paused = run.held
