"""A WebSocket session's videos, recorded into `/v1/videos` (no media tracks there).

Over ``/v1/realtime`` the frames of a response's video are not sent inline: the session's
video events (`sessions.events.VideoStarted` / `VideoChunk` / `VideoDone`) go on the wire
without pixels, and this recorder encodes the pixels into the server's `/v1/videos` store
under the event's ``video_id`` (`http.videos.VideoStore`: the same retention, the same MP4
writer, `GET /v1/videos/{video_id}` and ``/content``). Encoding runs on a worker thread
behind a bounded queue of decoded pieces, so the session's writer never waits for it, except at
the video's end: the ``response.output_video.done`` event goes out once the MP4 is
complete, so its id is fetchable when the client reads it. A piece that finds the queue
full fails that video ("the encoder fell behind"); a cancelled or failed video, or one
the session left unfinished, leaves no file.
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np

from voxline.aio import cancel_and_wait
from voxline.realtime.http.audio_requests import AudioAPIError
from voxline.realtime.http.videos import Mp4Writer, VideoRecord, VideoRequest, VideoStore
from voxline.sessions import events as ev

logger = logging.getLogger(__name__)

QUEUED_PIECES = 72  # decoded pieces waiting for the encoder, per session (8 Helios chunks)


class _Recording:
    def __init__(self, store: VideoStore, event: ev.VideoStarted) -> None:
        request = VideoRequest(prompt=event.prompt, width=event.width, height=event.height,
                               fps=event.fps, num_frames=event.num_frames)
        self.record = VideoRecord(event.video_id, request, int(time.time()), "in_progress")
        self.writer = Mp4Writer(store.directory / f"{event.video_id}.mp4", event.fps)
        self.chunks: asyncio.Queue[np.ndarray | None] = asyncio.Queue(QUEUED_PIECES)
        self.task: asyncio.Task[None] | None = None

    async def encode(self) -> None:
        """Worker: encode queued chunks until the end marker; then the file is complete."""
        while (frames := await self.chunks.get()) is not None:
            await asyncio.to_thread(self.writer.add, frames)
        await asyncio.to_thread(self.writer.finish)


class SessionVideoRecorder:
    """Records one session's videos into `store` as their events pass (see the module doc)."""

    def __init__(self, store: VideoStore) -> None:
        self.store = store
        self._active: dict[str, _Recording] = {}

    async def on_event(self, event: ev.ServerEvent) -> None:
        match event:
            case ev.VideoStarted():
                self._start(event)
            case ev.VideoFrames():
                self._frames(event)
            case ev.VideoChunk():
                self._progress(event)
            case ev.VideoDone():
                await self._done(event)

    def _start(self, event: ev.VideoStarted) -> None:
        rec = _Recording(self.store, event)
        try:
            self.store.add(rec.record)
        except AudioAPIError as exc:
            logger.warning("video %s not recorded: %s", event.video_id, exc.message)
            return
        rec.task = rec.record.task = asyncio.create_task(rec.encode(), name="video-record")
        self._active[event.video_id] = rec

    def _frames(self, event: ev.VideoFrames) -> None:
        rec = self._active.get(event.video_id)
        if rec is None:
            return
        frames = np.frombuffer(event.pixels, np.uint8).reshape(
            event.frames, event.height, event.width, 3)
        try:
            rec.chunks.put_nowait(frames)
        except asyncio.QueueFull:
            self._fail(rec, f"the MP4 encoder fell behind by {QUEUED_PIECES} decoded pieces")

    def _progress(self, event: ev.VideoChunk) -> None:
        rec = self._active.get(event.video_id)
        if rec is not None:
            rec.record.progress = min(99, 100 * (event.index + 1) // max(1, event.total))

    async def _done(self, event: ev.VideoDone) -> None:
        rec = self._active.pop(event.video_id, None)
        if rec is None:
            return
        if event.status != "completed":
            self._fail(rec, event.error or f"the video was {event.status}")
            return
        await rec.chunks.put(None)
        try:
            assert rec.task is not None
            await rec.task
        except Exception as exc:  # an encoder error fails the video, not the session
            logger.exception("video %s: encoding failed", event.video_id)
            self._fail(rec, f"encoding failed: {type(exc).__name__}: {exc}")
            return
        record = rec.record
        if record.id in self.store.videos:  # not deleted meanwhile
            record.path = rec.writer.path
            record.status, record.progress = "completed", 100
            record.completed_at = int(time.time())

    def _fail(self, rec: _Recording, error: str) -> None:
        self._active.pop(rec.record.id, None)
        if rec.task is not None:
            rec.task.cancel()
        rec.record.status, rec.record.error = "failed", error
        rec.record.completed_at = int(time.time())
        # off the loop: the writer's lock may be held by a chunk being encoded
        asyncio.get_running_loop().run_in_executor(None, rec.writer.discard)

    async def aclose(self) -> None:
        """The session ended: videos it left unfinished fail and leave no file."""
        for rec in list(self._active.values()):
            self._fail(rec, "the session ended before the video did")
            await cancel_and_wait(rec.task)
