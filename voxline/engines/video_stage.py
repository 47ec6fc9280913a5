"""The video stage: one chunk of one video per step, videos interleaved round-robin, each
chunk's VAE decode in a second stage beside the next chunk's denoise, a piece at a time.

Two stages (`voxline.engines.stage`), two rows of the stage table, each its own worker:

- `VideoStage` (row "video", the denoise): its queue holds one `VideoJob` per video in
  progress; `schedule` takes the first job that is not too far ahead of its decode
  (skipping cancelled ones), `execute` asks that job's render to denoise its next chunk
  (the first chunk also encodes the prompt; the chunk joins the render's history there, so
  the chunk after it may start at once), and `update` hands the chunk to the decode stage
  and puts an unfinished job back at the tail, so N videos each get one chunk in N steps
  and a long video never starves a short one. A job is out of the queue while its chunk
  runs, so the loop thread and the worker never touch one render at once.
- `VideoDecodeStage` (row "video_decode"): the denoised chunks in the order they were
  made; each plan decodes one piece (the Wan VAE: one latent frame, 1 frame then 4 each)
  of the chunk at the head, so the first frame is out after one decoder call.

Backpressure: a video is denoised at most `VideoModel.decode_ahead` chunks ahead of its
decode (1: chunk n decodes beside chunk n+1's denoise, and chunk n+2 waits for chunk n's
last piece, so memory stays one chunk's latents a video; 0: nothing is denoised while any
chunk decodes, the serial order). First frame first: a video's second chunk starts its
denoise only once the first chunk's first piece is out, so the first frame is not slowed by
the GPU's sharing (on an H100 it came 1.35 s after the request beside the second chunk's
denoise, 0.84 s alone); `first_frame_first=False` drops the hold.

Voice comes first: `voice_low` (injected; the engine's `speech_pacing.VoiceReserve.low`,
the `video_voice_reserve_ms` setting) says some spoken reply still being generated is
short of unplayed audio. While it does, no new denoise chunk starts (a chunk is ~1 s of
GPU time beside the voice; one running goes on, and the decode row is never held: its
frames are due at the player). `has_work` is False meanwhile, so the loop does not spin;
the pressure ends only on an event that steps the loop (audio out, a playout report, a
reply's end), and the next `schedule` starts the chunk. Each video counts its holds and
their time, logged once at its end.

`Videos` is the stages' owner on the loop thread: it admits `CreateVideo` (validated by
the model before anything is queued), holds the engine to `max_videos` rendering at once
(the `video_streams` setting: a request past it is refused `server_busy`, or with
`wait_for_slot` waits, first in first out, until a video ends), steers a video in progress
to a new prompt from its next chunk not yet started (`SteerVideo`: its render keeps its
history), cancels (`CancelVideo`, a closed stream: its queued chunks are dropped, a piece
decoding now is not sent), and routes each decoded piece as a `VideoChunk` (`piece` of
chunk `index` of `total_chunks`, `chunk_done` on the chunk's last piece: progress counts
chunks) and each end as one `VideoDone`, by internal stream id, so nothing of a closed
stream is sent. A plan whose `execute` raised (an out-of-memory included) fails that video
only.

The model is anything with `begin_video(CreateVideo) -> VideoRender` and `decode_ahead`
(the Helios chunk driver, `voxline.engines.models.helios`); this module imports neither
torch nor diffusers.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from voxline.engines import protocol as p
from voxline.engines.stage import RequestRefused, StreamId
from voxline.engines.streams import StreamState

logger = logging.getLogger(__name__)

NO_VIDEO_MODEL = ("CreateVideo: no video model is loaded; start the server with "
                  "--video helios:/path/to/checkpoint (the `video` setting)")


class ChunkDecode(Protocol):
    """One denoised chunk's frames, decoded a piece at a time (the decode stage's worker)."""

    def next_piece(self) -> tuple[np.ndarray, bool]:
        """uint8 (frames, height, width, 3), and whether it is the chunk's last piece."""
        ...

    def close(self) -> None:
        """Drop the pieces not yet decoded (loop thread, the decode worker idle)."""
        ...


class VideoRender(Protocol):
    """One video's model state; `denoise_next` is called from the stage's worker only."""

    @property
    def total_chunks(self) -> int: ...

    @property
    def finished(self) -> bool:
        """Every chunk is denoised (its decode may still be running)."""
        ...

    def denoise_next(self) -> ChunkDecode:
        """Denoise the next chunk and count it made; its frames come from the result."""
        ...

    def steer(self, prompt: str, negative_prompt: str | None = None) -> None:
        """The chunks not yet started show `prompt` (loop thread; ValueError naming the
        field if refused)."""
        ...


class VideoModel(Protocol):
    # chunks a video may be denoised ahead of its decode: 1 overlaps chunk n's decode
    # with chunk n+1's denoise; 0 denoises nothing while any chunk decodes
    decode_ahead: int

    def begin_video(self, request: p.CreateVideo) -> VideoRender:
        """A new video's state, no model call; ValueError naming the field if refused."""
        ...


@dataclass(eq=False)
class VideoJob:
    stream_id: StreamId
    video_id: str
    render: VideoRender
    chunks_done: int = 0  # denoised
    chunks_decoded: int = 0
    pieces_decoded: int = 0
    cancelled: bool = False
    waiting: bool = False  # admitted, waiting for a free slot (`wait_for_slot`)
    holds: int = 0  # times its next chunk waited for the voice (`VideoStage.voice_low`)
    held_s: float = 0.0  # their time, the open one excepted
    held_since: float | None = None  # the open hold's start

    def held_seconds(self, now: float) -> float:
        """Time its chunks waited for the voice, the open hold up to `now` included."""
        return self.held_s + (now - self.held_since if self.held_since is not None else 0.0)


@dataclass(eq=False)
class DecodeJob:
    """One chunk of `job` waiting for (or in) its decode."""

    job: VideoJob
    index: int
    decode: ChunkDecode
    piece: int = 0  # pieces sent so far


@dataclass(frozen=True)
class VideoPiece:
    """What one decode plan came to: a piece of chunk `index`, unless it was cancelled."""

    job: VideoJob
    index: int
    piece: int
    frames: np.ndarray | None
    last: bool  # the chunk's last piece


class VideoDecodeStage:
    """The VAE decode of denoised chunks, one piece per plan, one chunk at a time in the
    order they were denoised (the VAE holds one decode's causal cache)."""

    def __init__(self) -> None:
        self._queue: deque[DecodeJob] = deque()

    def add(self, item: DecodeJob) -> None:
        self._queue.append(item)

    def drop(self, job: VideoJob) -> None:
        """Close and forget `job`'s chunks waiting for their decode. The chunk at the head
        may be in the worker now: it is closed when it comes back (`update`) or when next
        scheduled, never from here."""
        for item in [i for i in list(self._queue)[1:] if i.job is job]:
            self._queue.remove(item)
            item.decode.close()

    def failed(self, item: DecodeJob) -> None:
        """`item`'s decode raised (the worker is idle): close it and the job's other chunks."""
        if self._queue and self._queue[0] is item:
            self._queue.popleft()
        item.decode.close()
        self.drop(item.job)

    def decoding(self) -> bool:
        """Chunks wait for (or are in) their decode."""
        return bool(self._queue)

    def has_work(self) -> bool:
        return bool(self._queue)

    def schedule(self) -> DecodeJob | None:
        while self._queue:
            item = self._queue[0]
            if not item.job.cancelled:
                return item
            self._queue.popleft().decode.close()
        return None

    def execute(self, item: DecodeJob) -> tuple[np.ndarray, bool]:
        return item.decode.next_piece()

    def update(self, item: DecodeJob, result: tuple[np.ndarray, bool]) -> VideoPiece:
        frames, last = result
        piece = item.piece
        item.piece += 1
        if last or item.job.cancelled:
            if self._queue and self._queue[0] is item:
                self._queue.popleft()
            item.decode.close()
        item.job.pieces_decoded += 1
        if last:
            item.job.chunks_decoded += 1
        if item.job.cancelled:
            return VideoPiece(item.job, item.index, piece, None, last)
        return VideoPiece(item.job, item.index, piece, frames, last)


class VideoStage:
    """Stage interface over a `VideoModel`'s denoise; see the module docstring."""

    def __init__(self, model: VideoModel, first_frame_first: bool = True,
                 voice_low: Callable[[], bool] = lambda: False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.model = model
        self.first_frame_first = first_frame_first
        self.voice_low = voice_low
        self.clock = clock
        self.decoder = VideoDecodeStage()
        self._queue: deque[VideoJob] = deque()

    def add(self, job: VideoJob) -> None:
        self._queue.append(job)

    def remove(self, job: VideoJob) -> bool:
        """Take a queued job out (and its chunks waiting to decode); False if it is not
        queued (its chunk is running)."""
        self.decoder.drop(job)
        if job in self._queue:
            self._queue.remove(job)
            return True
        return False

    def _ready(self, job: VideoJob) -> bool:
        ahead = self.model.decode_ahead
        if ahead <= 0 and self.decoder.decoding():
            return False
        if self.first_frame_first and job.chunks_done and not job.pieces_decoded:
            return False
        return job.chunks_done - job.chunks_decoded <= ahead

    def has_work(self) -> bool:
        return (any(not job.cancelled and self._ready(job) for job in self._queue)
                and not self.voice_low())

    def schedule(self) -> VideoJob | None:
        """The first ready job, unless the voice is low: then the ready jobs are held."""
        for job in [j for j in self._queue if j.cancelled]:
            self._queue.remove(job)
        ready = [job for job in self._queue if self._ready(job)]
        if not ready:
            return None
        now = self.clock()
        if self.voice_low():
            for job in ready:
                if job.held_since is None:
                    job.held_since = now
                    job.holds += 1
            return None
        for job in self._queue:  # the pressure is over: every open hold ends
            if job.held_since is not None:
                job.held_s += now - job.held_since
                job.held_since = None
        self._queue.remove(ready[0])
        return ready[0]

    def execute(self, job: VideoJob) -> ChunkDecode:
        return job.render.denoise_next()

    def update(self, job: VideoJob, decode: ChunkDecode) -> None:
        if job.cancelled:
            decode.close()
            return
        self.decoder.add(DecodeJob(job, job.chunks_done, decode))
        job.chunks_done += 1
        if not job.render.finished:
            self._queue.append(job)


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
        if job.holds and self.stage is not None:
            logger.info("video %s: its denoise waited %.2f s for the voice in %d hold(s) (a "
                        "spoken reply short of video_voice_reserve_ms of unplayed audio)",
                        job.video_id, job.held_seconds(self.stage.clock()), job.holds)
        if job.waiting:
            self._waiting.remove(job)
            return
        while self._waiting and self.in_progress() < self.max_videos:
            ready = self._waiting.popleft()
            ready.waiting = False
            assert self.stage is not None
            self.stage.add(ready)

    # ------------------------------------------------------------------ stage callbacks

    def denoised(self, job: VideoJob, _out: None, seconds: float) -> None:
        """A chunk's denoise is done; its frames come from the decode stage."""

    def route(self, item: DecodeJob, out: VideoPiece, seconds: float) -> None:
        job = item.job
        stream = self._live(job.stream_id)
        if out.frames is None or stream is None or job.cancelled:
            return
        frames = np.ascontiguousarray(out.frames, dtype=np.uint8)
        final = out.last and out.index == job.render.total_chunks - 1
        self._emit(p.VideoChunk(stream.external_id, job.video_id, frames.tobytes(),
                                num_frames=frames.shape[0], height=frames.shape[1],
                                width=frames.shape[2], index=out.index,
                                total_chunks=job.render.total_chunks, final=final,
                                piece=out.piece, chunk_done=out.last))
        if final:
            self._finish(job, p.ResponseStatus.COMPLETED)

    def fail_decode(self, item: DecodeJob, error: Exception) -> None:
        """A piece's decode raised: that video fails."""
        if self.stage is not None:
            self.stage.decoder.failed(item)
        self.fail(item.job, error, item.index)

    def fail(self, job: VideoJob, error: Exception, chunk: int | None = None) -> None:
        """A chunk's denoise (or, `chunk` given, its decode) raised (out of memory, a model
        error): that video fails."""
        if job.cancelled:
            return
        self._stop(job)
        chunk = job.chunks_done if chunk is None else chunk
        self._finish(job, p.ResponseStatus.FAILED,
                     f"video {job.video_id!r} failed at chunk {chunk}: {error}")

    def _finish(self, job: VideoJob, status: p.ResponseStatus, error: str = "") -> None:
        self._release(job)
        stream = self._live(job.stream_id)
        if stream is None:
            return
        if error:
            self._emit(p.StreamError(stream.external_id, error, p.ErrorCode.ENGINE_ERROR))
        self._emit(p.VideoDone(stream.external_id, job.video_id, status, error))
