"""Real-time pacing of a reply's 20 ms frames towards a peer that plays them as they come.

A session hands a transport its reply in chunks (each tens of milliseconds of audio, a
little ahead of real time); written as they come, a chunk's frames leave back to back and
reach the peer in bursts. :class:`FramePacer` sends each frame when the peer's playback is
at most `lead` ahead, so frames leave 20 ms apart with a small cushion against the
network's jitter. Messages that are not audio (Twilio's ``mark``) keep their place in the
order and leave as soon as the frames before them have; :meth:`clear` drops everything not
yet sent (a barge-in: the ``clear`` that follows goes out at once).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from voxline.aio import cancel_and_wait

FRAME_S = 0.02
LEAD_S = 0.06  # playback the peer holds ahead: three frames


class FramePacer:
    """Sends queued messages through `send`: frames (``is_frame``) at 20 ms each, the
    rest in order between them."""

    def __init__(self, send: Callable[[str], None], *, lead: float = LEAD_S,
                 clock: Callable[[], float] | None = None) -> None:
        self._send = send
        self._lead = lead
        self._clock = clock or (lambda: asyncio.get_running_loop().time())
        self._queue: deque[tuple[str, bool]] = deque()
        self._played_until = 0.0  # clock time at which the peer has played what was sent
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.failure: Exception | None = None  # what `send` raised from the pacing task

    @property
    def queued(self) -> int:
        return len(self._queue)

    def push(self, message: str, *, is_frame: bool) -> None:
        self._queue.append((message, is_frame))
        self._wake.set()

    def clear(self) -> int:
        """Drop every message not yet sent; returns how many frames were dropped."""
        dropped = sum(1 for _, frame in self._queue if frame)
        self._queue.clear()
        return dropped

    def pump(self) -> float | None:
        """Send what is due now; returns the seconds until the next frame is due, or None
        when the queue is empty."""
        while self._queue:
            message, is_frame = self._queue[0]
            if is_frame:
                now = self._clock()
                ahead = self._played_until - now
                if ahead >= self._lead - 1e-6:
                    return ahead - self._lead + 1e-4
                self._played_until = max(self._played_until, now) + FRAME_S
            self._queue.popleft()
            self._send(message)
        return None

    def flush(self) -> None:
        """Send everything still queued at once (the session is closing)."""
        while self._queue:
            self._send(self._queue.popleft()[0])

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="frame-pacer")

    async def _run(self) -> None:
        while True:
            try:
                wait = self.pump()
            except Exception as exc:  # e.g. the peer stopped reading: the session re-raises
                self.failure = exc
                return
            if wait is None:
                self._wake.clear()
                await self._wake.wait()
            else:
                await asyncio.sleep(wait)

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
