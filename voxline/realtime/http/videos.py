"""`/v1/videos`: OpenAI's video API shape on the engine's video stage.

- ``POST /v1/videos`` (JSON, or the multipart form the openai SDK sends; fields and their
  checks in `video_requests`): ``prompt``, ``model``, ``seconds``, ``size``,
  ``input_reference``, and vllm-omni's extras ``width``, ``height``, ``fps``,
  ``num_frames``, ``num_inference_steps``, ``guidance_scale``, ``negative_prompt``,
  ``seed`` (plus voxline's ``cache_backend`` / ``cache_threshold``). Answers at once with
  the video object (``queued``); generation runs in the background, one engine stream per
  video, each chunk encoded as it arrives (on a worker thread, so memory stays one chunk).
  A refused request (a 400) keeps nothing: no record, no file.
- ``POST /v1/videos?wait=true``: the synchronous variant for scripts and benchmarks; the
  same request, answered when the video ends: the MP4 itself (``video/mp4``, its id in the
  ``x-video-id`` header; the record stays, as for any video), or the failure as an error
  body (400 for a request the model refused, 500 for a model failure, 503 ``server_busy``
  with ``Retry-After`` when the engine already renders its ``video_streams``; then
  nothing is kept).
- Capacity: the engine renders at most ``video_streams`` videos at once (the sessions'
  real-time ones included); a job created past that stays ``queued`` (progress 0) until
  one ends, then starts in the order the jobs came.
- ``GET /v1/videos/{id}``: the object (``queued`` / ``in_progress`` / ``completed`` /
  ``failed``, ``progress`` 0..100, timestamps, ``expires_at``, ``error``).
  ``GET /v1/videos``: the list, newest first.
- ``GET /v1/videos/{id}/content``: the MP4 (H.264 in fragmented MP4). While the video is
  queued or in progress it streams what exists so far and continues as chunks arrive,
  ending with the video (a player can start before the end); 404 once failed.
- ``DELETE /v1/videos/{id}``: stops a running video (its engine stream closes, so the
  stage drops it at the next chunk boundary) and removes its file from disk.

Retention: at most `MAX_VIDEOS` videos are kept (past that the oldest finished one goes),
and a finished video (and its file) is removed `RETENTION_S` after it ended (its
``expires_at``). The files live in one temporary folder that is removed at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse

from voxline.aio import wait_ended
from voxline.engines import protocol as p
from voxline.realtime.http.audio_requests import (
    AudioAPIError,
    check_request,
    close_quietly,
    open_stream,
    unavailable,
)
from voxline.realtime.http.video_files import LiveFile, Mp4Writer
from voxline.realtime.http.video_requests import VideoRequest, parse_video_request, read_body
from voxline.realtime.ops.owned_ids import not_here_reason, owned_id
from voxline.realtime.state import ServerState, get_state

__all__ = ["Mp4Writer", "VideoRecord", "VideoRequest", "VideoStore", "router", "video_store"]

logger = logging.getLogger(__name__)

router = APIRouter()

MAX_VIDEOS = 32
RETENTION_S = 3600  # a finished video is kept this long after it ended
FINISHED = ("completed", "failed")
# a video slot frees when a video ends (seconds of chunks), not within a reply's 1 s
BUSY_RETRY_AFTER_S = 5


@dataclass(eq=False)
class VideoRecord:
    id: str
    request: VideoRequest
    created_at: int
    status: str = "queued"
    progress: int = 0
    completed_at: int | None = None
    error: str | None = None
    error_code: str | None = None  # the engine's ErrorCode of a failure, if it named one
    path: Path | None = None
    live: LiveFile | None = field(default=None, repr=False)  # the file while it is made
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    sync: bool = False  # ?wait=true: refused when the engine is at video_streams, not queued

    def body(self) -> dict[str, Any]:
        width, height = self.request.dimensions()
        frames = self.request.num_frames
        expires = self.completed_at + RETENTION_S if self.completed_at is not None else None
        return {"id": self.id, "object": "video", "model": self.request.model or "helios",
                "status": self.status, "progress": self.progress,
                "created_at": self.created_at, "completed_at": self.completed_at,
                "expires_at": expires, "size": f"{width}x{height}",
                "seconds": f"{(frames - 1) / self.request.fps:g}",
                "remixed_from_video_id": None,
                "error": ({"code": "video_generation_failed", "message": self.error}
                          if self.error else None)}


class VideoStore:
    """The videos this server keeps (see the module docstring's retention) and their
    files' folder."""

    def __init__(self, max_videos: int = MAX_VIDEOS, retention_s: float = RETENTION_S) -> None:
        self.max_videos = max_videos
        self.retention_s = retention_s
        self._directory: Path | None = None
        self.videos: dict[str, VideoRecord] = {}

    @property
    def directory(self) -> Path:
        """The files' folder, made on first use: a server that renders no video (or is
        killed) leaves nothing in TMPDIR."""
        if self._directory is None:
            self._directory = Path(tempfile.mkdtemp(prefix="voxline-videos-"))
        return self._directory

    def remove_directory(self) -> None:
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)

    def add(self, record: VideoRecord) -> None:
        self.expire(time.time())
        if len(self.videos) >= self.max_videos:
            finished = [r for r in self.videos.values() if r.status in FINISHED]
            if not finished:
                raise AudioAPIError(429, f"{self.max_videos} videos are in progress; try again "
                                    "when one finishes", code="rate_limit_exceeded",
                                    type="rate_limit_error")
            self.remove(finished[0])
        self.videos[record.id] = record

    def expire(self, now: float) -> None:
        """Remove the finished videos older than the retention."""
        for record in list(self.videos.values()):
            if record.completed_at is not None and now - record.completed_at >= self.retention_s:
                self.remove(record)

    def remove(self, record: VideoRecord) -> None:
        self.videos.pop(record.id, None)
        if record.task is not None and not record.task.done():
            record.task.cancel()
        if record.path is not None:
            record.path.unlink(missing_ok=True)

    def close(self) -> None:
        for record in list(self.videos.values()):
            self.remove(record)
        self.remove_directory()


def _store(request: Request) -> VideoStore:
    return video_store(request.app.state)


def video_store(app_state: Any) -> VideoStore:
    """The app's videos (made on first use); a Realtime session's recorder adds to it."""
    store = getattr(app_state, "videos", None)
    if store is None:
        store = app_state.videos = VideoStore()
    return store


async def close_videos(app_state: Any) -> None:
    """At shutdown: stop every video and remove the folder with their files."""
    store = getattr(app_state, "videos", None)
    if store is None:
        return
    tasks = [r.task for r in store.videos.values()]
    store.close()
    await wait_ended(*tasks)
    store.remove_directory()  # and a file a cancelled task left


def _find(request: Request, video_id: str) -> VideoRecord:
    store = _store(request)
    store.expire(time.time())
    record = store.videos.get(video_id)
    if record is None:
        elsewhere = not_here_reason(video_id, get_state(request).server_id,
                                    "/v1/videos/video_<server_id>_...")
        raise AudioAPIError(404, f"no video with id {video_id!r}"
                            + (f" {elsewhere}" if elsewhere else ""), param="video_id",
                            code="not_found")
    return record


# ------------------------------------------------------------------------------ routes


@router.post("/v1/videos")
async def create_video(request: Request, wait: bool = False) -> Response:
    try:
        state = check_request(request)
        req = parse_video_request(await read_body(request))
        # the id names this server (video_<server_id>_...): a balancer routes by it
        record = VideoRecord(owned_id("video", get_state(request).server_id), req,
                             int(time.time()), sync=wait)
        store = _store(request)
        store.add(record)
    except AudioAPIError as exc:
        return exc.response()
    record.live = LiveFile(Mp4Writer(store.directory / f"{record.id}.mp4", req.fps))
    record.task = asyncio.create_task(_generate(state, store, record))
    if not wait:
        return JSONResponse(record.body())
    await asyncio.wait([record.task])  # a disconnect cancels this wait, not the video
    return _sync_answer(store, record)


def _sync_answer(store: VideoStore, record: VideoRecord) -> Response:
    if record.status == "completed" and record.path is not None:
        return FileResponse(record.path, media_type="video/mp4", filename=f"{record.id}.mp4",
                            headers={"x-video-id": record.id})
    if record.error_code == p.ErrorCode.SERVER_BUSY:  # nothing was made: nothing is kept
        store.remove(record)
        busy = unavailable(f"video {record.id!r} not started: {record.error}",
                           code="server_busy").response()
        busy.headers["Retry-After"] = str(BUSY_RETRY_AFTER_S)
        return busy
    refused = record.error_code == p.ErrorCode.INVALID_VALUE
    return AudioAPIError(400 if refused else 500,
                         f"video {record.id!r} {record.status}: {record.error}",
                         code="video_generation_failed",
                         type="invalid_request_error" if refused else "server_error").response()


@router.get("/v1/videos")
async def list_videos(request: Request) -> Response:
    store = _store(request)
    store.expire(time.time())
    records = sorted(store.videos.values(), key=lambda r: r.created_at, reverse=True)
    data = [r.body() for r in records]
    return JSONResponse({"object": "list", "data": data, "has_more": False,
                         "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None})


@router.get("/v1/videos/{video_id}")
async def get_video(request: Request, video_id: str) -> Response:
    try:
        return JSONResponse(_find(request, video_id).body())
    except AudioAPIError as exc:
        return exc.response()


@router.get("/v1/videos/{video_id}/content")
async def video_content(request: Request, video_id: str) -> Response:
    try:
        record = _find(request, video_id)
        if record.status == "completed" and record.path is not None:
            return FileResponse(record.path, media_type="video/mp4",
                                filename=f"{video_id}.mp4")
        if record.status in FINISHED or record.live is None:
            raise AudioAPIError(404, f"video {video_id!r} is {record.status}; its content "
                                "exists once it is completed", param="video_id",
                                code="video_not_ready")
    except AudioAPIError as exc:
        return exc.response()
    return StreamingResponse(record.live.follow(), media_type="video/mp4",
                             headers={"x-video-status": record.status})


@router.delete("/v1/videos/{video_id}")
async def delete_video(request: Request, video_id: str) -> Response:
    try:
        record = _find(request, video_id)
    except AudioAPIError as exc:
        return exc.response()
    _store(request).remove(record)
    return JSONResponse({"id": video_id, "object": "video.deleted", "deleted": True})


# -------------------------------------------------------------------------- generation


async def _generate(state: ServerState, store: VideoStore, record: VideoRecord) -> None:
    """Run one video on its own engine stream; each chunk is encoded as it arrives (on a
    worker thread) into a partial file, renamed into place once the video completed."""
    handle = None
    req = record.request
    assert record.live is not None
    writer = record.live.writer
    try:
        handle = await open_stream(state, "video")
        width, height = req.dimensions()
        handle.send(p.CreateVideo(handle.stream_id, record.id, req.prompt, width=width,
                                  height=height, num_frames=req.num_frames,
                                  num_inference_steps=req.num_inference_steps,
                                  guidance_scale=req.guidance_scale,
                                  negative_prompt=req.negative_prompt, seed=req.seed,
                                  cache_backend=req.cache_backend or "",
                                  cache_threshold=req.cache_threshold,
                                  steps_per_stage=req.steps_per_stage,
                                  wait_for_slot=not record.sync))
        done = await _encode_chunks(handle, record, writer)
        if done is None or done.status != p.ResponseStatus.COMPLETED:
            record.error = record.error or (done.error if done else "the engine stream ended")
            record.status = "failed"
            return
        await asyncio.to_thread(writer.finish)
        if record.id in store.videos:  # not deleted meanwhile
            record.path = writer.path
            record.status, record.progress = "completed", 100
    except AudioAPIError as exc:
        record.status, record.error = "failed", exc.message
    except Exception as exc:  # a failed video must not go unreported
        logger.exception("video %s failed", record.id)
        record.status, record.error = "failed", f"{type(exc).__name__}: {exc}"
    finally:
        if record.status in FINISHED:
            record.completed_at = int(time.time())
        with anyio.CancelScope(shield=True):
            if record.path is None:  # failed, cancelled or deleted: nothing stays on disk
                await asyncio.to_thread(writer.discard)
            await close_quietly(handle)
        record.live.ended()


async def _encode_chunks(handle: Any, record: VideoRecord,
                         writer: Mp4Writer) -> p.VideoDone | None:
    assert record.live is not None
    async for out in handle:
        match out:
            case p.VideoChunk():
                record.status = "in_progress"
                frames = np.frombuffer(out.frames, np.uint8).reshape(
                    out.num_frames, out.height, out.width, 3)
                await asyncio.to_thread(writer.add, frames)
                record.live.grew()
                done = out.index + (1 if out.chunk_done else 0)  # progress counts chunks
                record.progress = min(99, 100 * done // out.total_chunks)
            case p.StreamError():
                record.error, record.error_code = out.message, out.code
            case p.VideoDone():
                return out
    return None
