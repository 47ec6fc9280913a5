"""Real-time pacing of output audio, as a pure state machine (the caller passes `now`).

The client is modelled as a player that starts each frame as soon as it arrives or as
soon as the previous frame ends, whichever is later. The pacer releases a frame only
while the audio already sent but not yet played stays under `lead_ms`, so a cancel can
stop the sound within `lead_ms` and the server always knows what was heard.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from voxline.config import setting_default


@dataclass(frozen=True)
class OutFrame:
    response_id: str
    item_id: str
    payload: bytes  # wire-format audio (PCM16 / G.711), already encoded
    ms: float


class OutputBufferFull(Exception):
    """More audio is queued than `max_queued_ms`: the engine ran too far ahead of playout."""


class OutputPacer:
    def __init__(self, lead_ms: float = setting_default("output_lead_ms"),
                 max_queued_ms: float = 300_000.0) -> None:
        if not 0 < lead_ms <= 1000:
            raise ValueError(f"lead_ms must be in (0, 1000], got {lead_ms}")
        self.lead_ms = lead_ms
        self.max_queued_ms = max_queued_ms  # 5 min of 24 kHz PCM16 is 14 MB per session
        self._queue: deque[OutFrame] = deque()
        self._queued_ms = 0.0
        self._play_end = 0.0  # when everything sent so far will have finished playing (s)
        self.sent_ms: dict[str, float] = {}  # per item: audio sent (and, after an
        # interrupt, minus what never played)
        self._last_item: str | None = None

    def push(self, frame: OutFrame) -> None:
        """Queue a frame; raises OutputBufferFull (and keeps nothing of it) past the bound."""
        if self._queued_ms + frame.ms > self.max_queued_ms:
            raise OutputBufferFull(f"{self._queued_ms / 1000:.0f} s of audio are already "
                                   f"waiting to be played (the limit is "
                                   f"{self.max_queued_ms / 1000:.0f} s)")
        self._queue.append(frame)
        self._queued_ms += frame.ms

    @property
    def queued_ms(self) -> float:
        """Audio queued and not yet sent."""
        return self._queued_ms

    def pending(self, response_id: str | None = None) -> bool:
        return any(response_id is None or f.response_id == response_id for f in self._queue)

    def due(self, now: float) -> list[OutFrame]:
        """Frames to send now (in order)."""
        out: list[OutFrame] = []
        while self._queue and self.buffered_ms(now) < self.lead_ms - 1e-6:
            frame = self._queue.popleft()
            self._queued_ms -= frame.ms
            self._play_end = max(self._play_end, now) + frame.ms / 1000
            self.sent_ms[frame.item_id] = self.sent_ms.get(frame.item_id, 0.0) + frame.ms
            self._last_item = frame.item_id
            out.append(frame)
        return out

    @property
    def play_end(self) -> float:
        """When everything sent so far will have finished playing (the caller's clock, s)."""
        return self._play_end

    def buffered_ms(self, now: float) -> float:
        """Audio sent but not yet played at `now`."""
        return max(0.0, self._play_end - now) * 1000

    def next_deadline(self, now: float) -> float | None:
        """When the next queued frame becomes due (None when nothing is queued)."""
        if not self._queue:
            return None
        return max(now, self._play_end - self.lead_ms / 1000)

    def heard_ms(self, item_id: str, now: float) -> float:
        """How much of `item_id`'s audio has played by `now` (the item sent last)."""
        return max(0.0, self.sent_ms.get(item_id, 0.0) - self.buffered_ms(now))

    def clear(self, now: float) -> None:
        """Drop queued audio; what was sent still plays out (the client clears its own buffer)."""
        self._queue.clear()
        self._queued_ms = 0.0

    def interrupt(self, now: float) -> None:
        """Barge-in: drop queued audio and assume the client stopped playing now.

        Audio sent but not yet played is forgotten, so `heard_ms` stays what was heard.
        """
        self._queue.clear()
        self._queued_ms = 0.0
        if self._last_item is not None:
            self.sent_ms[self._last_item] -= self.buffered_ms(now)
        self._play_end = now
