"""The video stage: one chunk of one video per step, videos interleaved round-robin.

Stage interface (`voxline.engines.stage`): the queue holds one `VideoJob` per video in
progress; `schedule` takes the job at its head (skipping cancelled ones), `execute` asks
that job's render for its next chunk (the first chunk also encodes the prompt), and
`update` puts an unfinished job back at the tail, so N videos each get one chunk in N
steps and a long video never starves a short one. A job is out of the queue while its
chunk runs, so the loop thread and the worker never touch one render at once.

`Videos` is the stage's owner on the loop thread: it admits `CreateVideo` (validated by
the model before anything is queued), holds the engine to `max_videos` rendering at once
(the `video_streams` setting: a request past it is refused `server_busy`, or with
`wait_for_slot` waits, first in first out, until a video ends), steers a video in progress
to a new prompt from its next chunk (`SteerVideo`: its render keeps its history),
cancels between chunks (`CancelVideo`, a closed stream), and routes each chunk as a
`VideoChunk` (progress: `index` of `total_chunks`) and each end as one `VideoDone`, by
internal stream id, so nothing of a closed stream is sent. A plan whose `execute` raised
(an out-of-memory included) fails that video only.

The model is anything with `begin_video(CreateVideo) -> VideoRender` (the Helios chunk driver,
`voxline.engines.models.helios`); this module imports neither torch nor diffusers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from voxline.engines import protocol as p
from voxline.engines.stage import RequestRefused, StreamId
from voxline.engines.streams import StreamState

NO_VIDEO_MODEL = ("CreateVideo: no video model is loaded; start the server with "
                  "--video helios:/path/to/checkpoint (the `video` setting)")


class VideoRender(Protocol):
    """One video's model state; `next_chunk` is called from the stage's worker only."""

    @property
    def total_chunks(self) -> int: ...

    @property
    def finished(self) -> bool: ...

    def next_chunk(self) -> np.ndarray: ...  # uint8 (frames, height, width, 3)

    def steer(self, prompt: str, negative_prompt: str | None = None) -> None:
        """The chunks not yet started show `prompt` (loop thread; ValueError naming the
        field if refused)."""
        ...


class VideoModel(Protocol):
    def begin_video(self, request: p.CreateVideo) -> VideoRender:
        """A new video's state, no model call; ValueError naming the field if refused."""
        ...


@dataclass(eq=False)
class VideoJob:
    stream_id: StreamId
    video_id: str
    render: VideoRender
    chunks_done: int = 0
    cancelled: bool = False
    waiting: bool = False  # admitted, waiting for a free slot (`wait_for_slot`)


@dataclass(frozen=True)
class VideoOut:
    """What one chunk's plan came to: its frames, unless the job was cancelled meanwhile."""

    job: VideoJob
    frames: np.ndarray | None


class VideoStage:
    """Stage interface over a `VideoModel`; see the module docstring for the order."""

    def __init__(self, model: VideoModel) -> None:
        self.model = model
        self._queue: deque[VideoJob] = deque()

    def add(self, job: VideoJob) -> None:
        self._queue.append(job)

    def remove(self, job: VideoJob) -> bool:
        """Take a queued job out; False if it is not queued (its chunk is running)."""
        if job in self._queue:
            self._queue.remove(job)
            return True
        return False

    def has_work(self) -> bool:
        return bool(self._queue)

    def schedule(self) -> VideoJob | None:
        while self._queue:
            job = self._queue.popleft()
            if not job.cancelled:
                return job
        return None

    def execute(self, job: VideoJob) -> np.ndarray:
        return job.render.next_chunk()

    def update(self, job: VideoJob, frames: np.ndarray) -> VideoOut:
        if job.cancelled:
            return VideoOut(job, None)
        job.chunks_done += 1
        if not job.render.finished:
            self._queue.append(job)
        return VideoOut(job, frames)


class Videos:
    """The video stage's admission, capacity, steering, cancels and routing (loop thread
    only)."""

    def __init__(self, stage: VideoStage | None, emit: Callable[[p.EngineOutput], None],
                 live: Callable[[StreamId], StreamState | None], max_videos: int = 4) -> None:
        self.stage = stage
        self._emit = emit
        self._live = live
        self.max_videos = max_videos
        self._jobs: dict[tuple[StreamId, str], VideoJob] = {}  # rendering or waiting
        self._waiting: deque[VideoJob] = deque()

    def create(self, stream: StreamState, msg: p.CreateVideo) -> None:
        key = (stream.internal_id, msg.video_id)
        if key in self._jobs:  # no VideoDone: that would end the running video for the caller
            self._emit(p.StreamError(stream.external_id, f"CreateVideo.video_id: "
                                     f"{msg.video_id!r} is already in progress on this stream",
                                     p.ErrorCode.INVALID_VALUE, param="video_id"))
            return
        try:
            render = self._admit(msg)
        except RequestRefused as exc:
            self._emit(p.StreamError(stream.external_id, str(exc), exc.code))
            self._emit(p.VideoDone(stream.external_id, msg.video_id, p.ResponseStatus.FAILED,
                                   str(exc)))
            return
        job = VideoJob(stream.internal_id, msg.video_id, render)
        if self.in_progress() >= self.max_videos:
            job.waiting = True
            self._waiting.append(job)
        self._jobs[key] = job
        if job.waiting:
            return
        assert self.stage is not None
        self.stage.add(job)

    def _admit(self, msg: p.CreateVideo) -> VideoRender:
        if self.stage is None:
            raise RequestRefused(NO_VIDEO_MODEL, p.ErrorCode.INVALID_VALUE)
        try:
            render = self.stage.model.begin_video(msg)
        except ValueError as exc:
            raise RequestRefused(str(exc), p.ErrorCode.INVALID_VALUE) from exc
        if self.in_progress() >= self.max_videos and not msg.wait_for_slot:
            raise RequestRefused(f"CreateVideo: the engine is rendering its limit of "
                                 f"{self.max_videos} video(s) at once (the video_streams "
                                 "setting); try again when one ends", p.ErrorCode.SERVER_BUSY)
        return render

    def in_progress(self) -> int:
        """Videos rendering now (not those waiting for a slot)."""
        return len(self._jobs) - len(self._waiting)

    def waiting(self) -> int:
        return len(self._waiting)

    def steer(self, stream: StreamState, msg: p.SteerVideo) -> None:
        """`msg`'s prompt from the video's next chunk on; a refusal is a `StreamError`
        naming the field, and the video goes on."""
        job = self._jobs.get((stream.internal_id, msg.video_id))
        try:
            if job is None or job.cancelled:
                raise ValueError(f"SteerVideo.video_id: {msg.video_id!r} is not in progress on "
                                 "this stream")
            job.render.steer(msg.prompt, msg.negative_prompt)
        except ValueError as exc:
            field = str(exc).partition(":")[0].rpartition(".")[2] or None
            self._emit(p.StreamError(stream.external_id, str(exc), p.ErrorCode.INVALID_VALUE,
                                     param=field))

    def cancel(self, stream: StreamState, video_id: str) -> None:
        """Stop the video at its next chunk boundary; unknown ids are ignored (already done)."""
        job = self._jobs.get((stream.internal_id, video_id))
        if job is not None:
            self._stop(job)
            self._finish(job, p.ResponseStatus.CANCELLED)

    def closed(self, stream: StreamState) -> None:
        """A closed stream's videos stop; nothing more of them is sent."""
        for job in [j for j in self._jobs.values() if j.stream_id == stream.internal_id]:
            self._stop(job)
            self._release(job)

    def _stop(self, job: VideoJob) -> None:
        job.cancelled = True
        if self.stage is not None:
            self.stage.remove(job)

    def _release(self, job: VideoJob) -> None:
        """`job` holds no slot any more: the first waiting video (if any) takes it."""
        if self._jobs.pop((job.stream_id, job.video_id), None) is None:
            return
        if job.waiting:
            self._waiting.remove(job)
            return
        while self._waiting and self.in_progress() < self.max_videos:
            ready = self._waiting.popleft()
            ready.waiting = False
            assert self.stage is not None
            self.stage.add(ready)

    # ------------------------------------------------------------------ stage callbacks

    def route(self, job: VideoJob, out: VideoOut, seconds: float) -> None:
        stream = self._live(job.stream_id)
        if out.frames is None or stream is None or job.cancelled:
            return
        frames = np.ascontiguousarray(out.frames, dtype=np.uint8)
        final = job.render.finished
        self._emit(p.VideoChunk(stream.external_id, job.video_id, frames.tobytes(),
                                num_frames=frames.shape[0], height=frames.shape[1],
                                width=frames.shape[2], index=job.chunks_done - 1,
                                total_chunks=job.render.total_chunks, final=final))
        if final:
            self._finish(job, p.ResponseStatus.COMPLETED)

    def fail(self, job: VideoJob, error: Exception) -> None:
        """The chunk's `execute` raised (out of memory, a model error): that video fails."""
        if job.cancelled:
            return
        job.cancelled = True
        self._finish(job, p.ResponseStatus.FAILED,
                     f"video {job.video_id!r} failed at chunk {job.chunks_done}: {error}")

    def _finish(self, job: VideoJob, status: p.ResponseStatus, error: str = "") -> None:
        self._release(job)
        stream = self._live(job.stream_id)
        if stream is None:
            return
        if error:
            self._emit(p.StreamError(stream.external_id, error, p.ErrorCode.ENGINE_ERROR))
        self._emit(p.VideoDone(stream.external_id, job.video_id, status, error))
