"""Flow control of spoken replies: generate a bounded lead ahead of what the listener heard,
and tell the video stage when a reply is short of unplayed audio.

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

Playout clock (`PlayoutPacing.unplayed_ms`): each run keeps the time its sent audio runs
out (`ResponseRun.playout_until`, on `clock`) for a listener who plays in real time from
the moment each chunk leaves the engine, waits when the audio runs out and resumes with
the next chunk (a speculation's audio leaves when it is committed). A playout report
re-anchors that time to what the listener actually heard (`now + audio - played`), so a
client that buffers or starts late is seen as it is; a report lags the listener by up to
the session's report interval (250 ms), which the reserve below absorbs. A run never
reported on runs on the clock alone: its lead is the audio sent minus the wall time it
has been playing, gaps excepted.

Voice pressure (`VoiceReserve.low`, the `video_voice_reserve_ms` setting): some spoken
reply still being generated (a running, committed response with audio out) has less than
the reserve of unplayed audio, so its listener is about to hear a gap unless its next
audio comes soon. The video stage starts no new denoise chunk meanwhile. Not counted: a
reply before its first audio (its listener hears no gap yet; the first audio's latency
is the CUDA stream priorities' business, and counting it would hold video through every
reply's start under steady voice load), a speculation, and a reply held by the flow
control above (it is a generation lead ahead). Time alone only shrinks a lead, so a
pressure always ends on an event that steps the engine loop: audio out, a playout
report, or the reply's end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from voxline.engines.response_run import ResponseRun


class PlayoutPacing:
    """Holds and releases runs by their unplayed audio; `lead_ms` None: never holds.
    Keeps each run's playout clock on `clock` (seconds)."""

    def __init__(self, lead_ms: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lead_ms = lead_ms
        self.clock = clock

    def reported(self, run: ResponseRun, played_ms: float) -> None:
        """The listener has heard `played_ms` of `run`'s audio (reports only move on)."""
        run.played_ms = max(run.played_ms or 0.0, played_ms)
        if run.audio_ms:
            run.playout_until = self.clock() + max(0.0, run.audio_ms - run.played_ms) / 1000
        self.pace(run)

    def sent(self, run: ResponseRun, ms: float) -> None:
        """`ms` more of `run`'s audio was made (and sent, unless the run is speculative)."""
        if run.speculative is None and ms > 0:
            now = self.clock()
            until = run.playout_until
            run.playout_until = (now if until is None else max(now, until)) + ms / 1000
        self.pace(run)

    def committed(self, run: ResponseRun) -> None:
        """A speculation was committed: the audio it held leaves now."""
        self.sent(run, run.audio_ms)

    def unplayed_ms(self, run: ResponseRun, now: float) -> float | None:
        """Audio of `run` sent and not yet played at `now` (negative: the listener has
        waited that long); None before its first audio left."""
        until = run.playout_until
        return None if until is None else (until - now) * 1000

    def pace(self, run: ResponseRun) -> None:
        """Hold `run` while its unplayed audio reaches the lead; release it once under."""
        run.held = (self.lead_ms is not None and run.played_ms is not None
                    and run.audio_ms - run.played_ms >= self.lead_ms)
        if run.request is not None:
            run.request.paused = run.held


class VoiceReserve:
    """The voice-pressure signal over the running `runs` (by stream); `reserve_ms` 0: off."""

    def __init__(self, runs: Mapping[int, ResponseRun], pacing: PlayoutPacing,
                 reserve_ms: float = 0.0) -> None:
        if reserve_ms < 0:
            raise ValueError(f"video_voice_reserve_ms: must be >= 0, got {reserve_ms}")
        self.runs = runs
        self.pacing = pacing
        self.reserve_ms = reserve_ms

    def short(self, run: ResponseRun, now: float) -> bool:
        """`run` counts (see the module docstring) and is under the reserve at `now`."""
        if run.held or run.speculative is not None:
            return False
        unplayed = self.pacing.unplayed_ms(run, now)
        return unplayed is not None and unplayed < self.reserve_ms

    def low(self) -> bool:
        """Some spoken reply still being generated is short of unplayed audio now."""
        if not self.reserve_ms or not self.runs:
            return False
        now = self.pacing.clock()
        return any(self.short(run, now) for run in self.runs.values())
