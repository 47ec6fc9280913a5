"""The call's video track: plays the session's video chunks at the model's frame rate.

The session decides what is shown (`sessions.video_responses`: a response's video starts,
its chunks arrive as `events.VideoChunk` with their pixels, it ends completed, cancelled or
failed); this module only plays it, in two parts:

- `VideoPlayout` (sans I/O, `now` passed in): a bounded jitter queue of frames that absorbs
  a chunk arriving at once (33 frames in one burst), and the media clock. Frame ``n`` of a
  video is due at its start + ``n / fps`` and carries pts = start pts + ``n * 90000 / fps``
  on the 90 kHz RTP video clock (time base 1/90000), not aiortc's default 30 fps clock.
  Underrun (the model is slower than playback): the last frame is held and sent again, so
  the clock and the step stay exact. Overflow (the model is more than `max_buffered_s`
  ahead of playback): the oldest queued frames are dropped, counted and logged once per
  video, so the picture stays live and memory bounded. A completed video plays out what
  is queued, then the track goes quiet (no frames until the next video); a cancelled or
  failed one stops at once. A new video replaces whatever was playing. A new video's
  first pts continues from the wall time since the track's first frame, so pts is
  monotonic across videos.
- `GeneratedVideoTrack`: the aiortc `VideoStreamTrack` around it; aiortc encodes each frame
  (VP8 or H.264, as negotiated) on its executor thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import logging
import time
from collections import deque
from dataclasses import dataclass

import av
import numpy as np
from aiortc import RTCPeerConnection, VideoStreamTrack
from aiortc.mediastreams import MediaStreamError

from voxline.sessions import events as ev

logger = logging.getLogger(__name__)

VIDEO_CLOCK = 90_000  # RTP video clock rate (Hz)
VIDEO_TIME_BASE = fractions.Fraction(1, VIDEO_CLOCK)
MAX_BUFFERED_S = 6.0  # the jitter queue's bound, in seconds of playback


@dataclass(frozen=True)
class PlayedFrame:
    pixels: np.ndarray  # uint8 (height, width, 3) RGB
    pts: int  # on VIDEO_CLOCK
    held: bool  # the previous frame again (underrun)


class VideoPlayout:
    """The jitter queue and the media clock of one video track (see the module doc)."""

    def __init__(self, max_buffered_s: float = MAX_BUFFERED_S) -> None:
        self.max_buffered_s = max_buffered_s
        self.video_id: str | None = None
        self.fps = 24
        self.dropped = 0  # frames dropped on overflow, over the track's life
        self._queue: deque[np.ndarray] = deque()
        self._ending = False  # completed: play out the queue, then go quiet
        self._start: float | None = None  # when the current video's frame 0 played
        self._start_pts = 0
        self._sent = 0  # frames of the current video played (held ones included)
        self._held = 0  # of those, the last frame sent again (underrun)
        self._last: np.ndarray | None = None
        self._next_pts = 0  # the least pts the next frame may carry
        self._origin: float | None = None  # when the track's first frame played

    @property
    def queued(self) -> int:
        return len(self._queue)

    def start(self, video_id: str, fps: int) -> None:
        """A new video: it replaces whatever was queued or playing."""
        self._reset()
        self.video_id, self.fps = video_id, fps

    def push(self, video_id: str, frames: np.ndarray) -> None:
        """Queue a chunk's frames (uint8 (n, h, w, 3)); another video's are ignored."""
        if video_id != self.video_id or self._ending:
            return
        self._queue.extend(frames)
        limit = max(1, int(self.max_buffered_s * self.fps))
        over = len(self._queue) - limit
        if over > 0:
            for _ in range(over):
                self._queue.popleft()
            if self.dropped == 0 or over == len(frames):
                logger.warning("video %s: generated %d frames beyond the %.0f s jitter queue "
                               "ahead of playback; the oldest were dropped", video_id, over,
                               self.max_buffered_s)
            self.dropped += over

    def end(self, video_id: str, status: str) -> None:
        """The video ended: completed plays out the queue; anything else stops now."""
        if video_id != self.video_id:
            return
        if status == "completed":
            self._ending = True
        else:
            self._reset()

    def due(self, now: float) -> float | None:
        """When the next frame is due; None while there is nothing to play."""
        if self.video_id is None:
            return None
        if self._start is None:
            return now if self._queue else None
        if self._ending and not self._queue:
            self._reset()
            return None
        return self._start + self._sent / self.fps

    def take(self, now: float) -> PlayedFrame:
        """The frame due now (call when `due` says so): queued, or the last one held."""
        if self._origin is None:
            self._origin = now
        if self._start is None:
            self._start = now
            self._start_pts = max(self._next_pts, round((now - self._origin) * VIDEO_CLOCK))
        held = not self._queue
        self._held += held
        if not held:
            self._last = self._queue.popleft()
        assert self._last is not None, "take() before any frame was due"
        pts = self._start_pts + round(self._sent * VIDEO_CLOCK / self.fps)
        self._sent += 1
        self._next_pts = pts + 1
        return PlayedFrame(self._last, pts, held)

    def _reset(self) -> None:
        if self.video_id is not None and self._sent:  # read by benchmarks/video/bench_video_peer.py
            logger.info("video %s played: %d frames sent, %d of them held", self.video_id,
                        self._sent, self._held)
        self._held = 0
        self.video_id = None
        self._queue.clear()
        self._ending = False
        self._start = None
        self._sent = 0
        self._last = None


class GeneratedVideoTrack(VideoStreamTrack):
    """The call's outgoing video: `on_event` takes the session's video events, `recv` (aiortc's
    sender) gets each frame when it is due; it waits, sending nothing, while no video plays."""

    kind = "video"

    def __init__(self, max_buffered_s: float = MAX_BUFFERED_S) -> None:
        super().__init__()
        self.playout = VideoPlayout(max_buffered_s)
        self._wake = asyncio.Event()

    def on_event(self, event: ev.ServerEvent) -> None:
        """Play what a session event says; events that are not about video are ignored."""
        match event:
            case ev.VideoStarted():
                self.playout.start(event.video_id, event.fps)
            case ev.VideoFrames():
                frames = np.frombuffer(event.pixels, np.uint8).reshape(
                    event.frames, event.height, event.width, 3)
                self.playout.push(event.video_id, frames)
            case ev.VideoDone():
                self.playout.end(event.video_id, event.status)
            case _:
                return
        self._wake.set()

    async def recv(self) -> av.VideoFrame:
        while True:
            if self.readyState != "live":
                raise MediaStreamError
            now = time.monotonic()
            due = self.playout.due(now)
            if due is not None and due <= now:
                return _video_frame(self.playout.take(now))
            self._wake.clear()  # a new chunk, a cancel or a stop wakes the wait early
            timeout = None if due is None else due - now
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def stop(self) -> None:
        super().stop()
        self._wake.set()


def _video_frame(played: PlayedFrame) -> av.VideoFrame:
    frame = av.VideoFrame.from_ndarray(played.pixels, format="rgb24")
    frame.pts = played.pts
    frame.time_base = VIDEO_TIME_BASE
    return frame


def add_video_track(pc: RTCPeerConnection, track: GeneratedVideoTrack) -> bool:
    """Send `track` on the offer's video section (call after setRemoteDescription); False
    (no track added) when the offer has none, so the answer has no video either. The answer's
    direction is aiortc's: sendonly to a recvonly offer, sendrecv to sendrecv."""
    if not any(t.kind == "video" for t in pc.getTransceivers()):
        return False
    pc.addTrack(track)
    return True
