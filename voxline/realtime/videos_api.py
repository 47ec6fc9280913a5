"""`/v1/videos`: OpenAI's video API shape on the engine's video stage (a first slice).

- ``POST /v1/videos`` (JSON, or the form fields the openai SDK's multipart sends, numbers
  as strings): ``prompt`` (required), ``model`` (any string), ``size``
  (``"WxH"``), and vllm-omni's extras ``width``, ``height``, ``fps``, ``num_frames``,
  ``num_inference_steps``, ``guidance_scale``, ``negative_prompt``, ``seed``; unknown
  fields, sizes not a multiple of 16 and out-of-range numbers are 400s naming the field.
  Answers at once with the video object (``queued``); generation runs in the background,
  one engine stream per video; each chunk is encoded as it arrives (on a worker thread,
  so memory stays one chunk), and the object's ``progress`` follows the chunks.
- ``GET /v1/videos/{id}``: the object (``queued`` / ``in_progress`` / ``completed`` /
  ``failed``, ``progress`` 0..100, timestamps, ``error``). ``GET /v1/videos``: the list,
  newest first. ``GET /v1/videos/{id}/content``: the MP4 once completed (H.264), else 404.
- ``DELETE /v1/videos/{id}``: stops a running video (its engine stream closes, so the
  stage drops it at the next chunk boundary) and removes its file from disk.

Retention: at most `MAX_VIDEOS` videos are kept; past that the oldest finished one (and
its file) goes. Not yet here: ``seconds``, ``input_reference``,
streaming content while in progress, a synchronous variant.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from voxline.engines import protocol as p
from voxline.realtime.audio_http import (
    AudioAPIError,
    bad,
    check_request,
    close_quietly,
    open_stream,
)
from voxline.realtime.owned_ids import not_here_reason, owned_id
from voxline.realtime.state import ServerState, get_state

logger = logging.getLogger(__name__)

router = APIRouter()

MAX_VIDEOS = 32
SIZE_MULTIPLE = 16
MAX_SIDE = 4096
MAX_SEED = 2**63 - 1


class VideoRequest(BaseModel):
    """A ``POST /v1/videos`` JSON body; unknown fields are refused."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    prompt: Annotated[str, Field(min_length=1, max_length=4096)]
    model: str | None = None
    size: Annotated[str, Field(pattern=r"^\d+x\d+$")] | None = None
    width: Annotated[int, Field(ge=SIZE_MULTIPLE, le=MAX_SIDE)] | None = None
    height: Annotated[int, Field(ge=SIZE_MULTIPLE, le=MAX_SIDE)] | None = None
    fps: Annotated[int, Field(ge=1, le=60)] = 24
    num_frames: Annotated[int, Field(ge=1, le=10_000)] = 33
    num_inference_steps: Annotated[int, Field(ge=1, le=200)] = 50
    guidance_scale: Annotated[float, Field(ge=0, le=100)] = 5.0
    negative_prompt: str = ""
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = None
    # voxline's step cache (diffusers' hooks); None: the server's video_cache_backend
    cache_backend: Literal["none", "first_block_cache", "mag_cache"] | None = None
    cache_threshold: Annotated[float, Field(ge=0, le=100)] | None = None

    def dimensions(self) -> tuple[int, int]:
        """(width, height): explicit fields over ``size``, default 640x384 (Helios')."""
        width, height = 640, 384
        if self.size is not None:
            width, height = (int(v) for v in self.size.split("x"))
        return self.width or width, self.height or height


def parse_video_request(body: object) -> VideoRequest:
    """Validate a decoded JSON body; raises `AudioAPIError` (400) naming the field."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_request")
    try:
        req = VideoRequest.model_validate(body)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        name = str(err["loc"][0]) if err["loc"] else None
        code = "unknown_parameter" if err["type"] == "extra_forbidden" else "invalid_value"
        raise bad(f"'{name}': {err['msg']}", name, code) from None
    width, height = req.dimensions()
    for name, value in (("width", width), ("height", height)):
        if value % SIZE_MULTIPLE or not SIZE_MULTIPLE <= value <= MAX_SIDE:
            param = name if getattr(req, name) is not None else "size"
            raise bad(f"'{param}': {name} {value} must be a multiple of {SIZE_MULTIPLE} from "
                      f"{SIZE_MULTIPLE} to {MAX_SIDE} (the model's patch size)", param)
    return req


@dataclass(eq=False)
class VideoRecord:
    id: str
    request: VideoRequest
    created_at: int
    status: str = "queued"
    progress: int = 0
    completed_at: int | None = None
    error: str | None = None
    path: Path | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def body(self) -> dict[str, Any]:
        width, height = self.request.dimensions()
        frames = self.request.num_frames
        return {"id": self.id, "object": "video", "model": self.request.model or "helios",
                "status": self.status, "progress": self.progress,
                "created_at": self.created_at, "completed_at": self.completed_at,
                "expires_at": None, "size": f"{width}x{height}",
                "seconds": f"{frames / self.request.fps:g}", "remixed_from_video_id": None,
                "error": ({"code": "video_generation_failed", "message": self.error}
                          if self.error else None)}


class VideoStore:
    """The videos this server keeps (bounded by `MAX_VIDEOS`) and their files' folder."""

    def __init__(self, max_videos: int = MAX_VIDEOS) -> None:
        self.max_videos = max_videos
        self.directory = Path(tempfile.mkdtemp(prefix="voxline-videos-"))
        self.videos: dict[str, VideoRecord] = {}

    def add(self, record: VideoRecord) -> None:
        if len(self.videos) >= self.max_videos:
            finished = [r for r in self.videos.values() if r.status in ("completed", "failed")]
            if not finished:
                raise AudioAPIError(429, f"{self.max_videos} videos are in progress; try again "
                                    "when one finishes", code="rate_limit_exceeded",
                                    type="rate_limit_error")
            self.remove(finished[0])
        self.videos[record.id] = record

    def remove(self, record: VideoRecord) -> None:
        self.videos.pop(record.id, None)
        if record.task is not None and not record.task.done():
            record.task.cancel()
        if record.path is not None:
            record.path.unlink(missing_ok=True)

    def close(self) -> None:
        for record in list(self.videos.values()):
            self.remove(record)
        shutil.rmtree(self.directory, ignore_errors=True)


def _store(request: Request) -> VideoStore:
    return video_store(request.app.state)


def video_store(app_state: Any) -> VideoStore:
    """The app's videos (made on first use); a Realtime session's recorder adds to it."""
    store = getattr(app_state, "videos", None)
    if store is None:
        store = app_state.videos = VideoStore()
    return store


def _find(request: Request, video_id: str) -> VideoRecord:
    record = _store(request).videos.get(video_id)
    if record is None:
        elsewhere = not_here_reason(video_id, get_state(request).server_id,
                                    "/v1/videos/video_<server_id>_...")
        raise AudioAPIError(404, f"no video with id {video_id!r}"
                            + (f" {elsewhere}" if elsewhere else ""), param="video_id",
                            code="not_found")
    return record


INT_FIELDS = ("width", "height", "fps", "num_frames", "num_inference_steps", "seed")
FLOAT_FIELDS = ("guidance_scale", "cache_threshold")


async def _body(request: Request) -> object:
    """The JSON body, or a form (the openai SDK's multipart) with its numbers converted."""
    if not request.headers.get("content-type", "").startswith(("multipart/form-data",
                                                               "application/x-www-form")):
        try:
            return await request.json()
        except ValueError:
            raise bad("the request body is not valid JSON", None, "invalid_json") from None
    form = await request.form()
    if "input_reference" in form:
        raise bad("'input_reference' (image-to-video) is not supported yet", "input_reference",
                  "unsupported")
    body: dict[str, Any] = {}
    for name, value in form.items():
        if not isinstance(value, str):
            raise bad(f"'{name}' must be a form field, not a file", name)
        body[name] = _form_number(name, value)
    return body


def _form_number(name: str, value: str) -> Any:
    if name not in (*INT_FIELDS, *FLOAT_FIELDS):
        return value
    try:
        return int(value) if name in INT_FIELDS else float(value)
    except ValueError:
        raise bad(f"'{name}' must be a number, got {value!r}", name) from None


# ------------------------------------------------------------------------------ routes


@router.post("/v1/videos")
async def create_video(request: Request) -> Response:
    try:
        state = check_request(request)
        req = parse_video_request(await _body(request))
        # the id names this server (video_<server_id>_...): a balancer routes by it
        record = VideoRecord(owned_id("video", get_state(request).server_id), req,
                             int(time.time()))
        store = _store(request)
        store.add(record)
    except AudioAPIError as exc:
        return exc.response()
    record.task = asyncio.create_task(_generate(state, store, record))
    return JSONResponse(record.body())


@router.get("/v1/videos")
async def list_videos(request: Request) -> Response:
    records = sorted(_store(request).videos.values(), key=lambda r: r.created_at, reverse=True)
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
        if record.status != "completed" or record.path is None:
            raise AudioAPIError(404, f"video {video_id!r} is {record.status}; its content "
                                "exists once it is completed", param="video_id",
                                code="video_not_ready")
    except AudioAPIError as exc:
        return exc.response()
    return FileResponse(record.path, media_type="video/mp4", filename=f"{video_id}.mp4")


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
    writer = Mp4Writer(store.directory / f"{record.id}.mp4", req.fps)
    try:
        handle = await open_stream(state, "video")
        width, height = req.dimensions()
        handle.send(p.CreateVideo(handle.stream_id, record.id, req.prompt, width=width,
                                  height=height, num_frames=req.num_frames,
                                  num_inference_steps=req.num_inference_steps,
                                  guidance_scale=req.guidance_scale,
                                  negative_prompt=req.negative_prompt, seed=req.seed,
                                  cache_backend=req.cache_backend or "",
                                  cache_threshold=req.cache_threshold))
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
        if record.status in ("completed", "failed"):
            record.completed_at = int(time.time())
        with anyio.CancelScope(shield=True):
            if record.path is None:  # failed, cancelled or deleted: nothing stays on disk
                await asyncio.to_thread(writer.discard)
            await close_quietly(handle)


async def _encode_chunks(handle: Any, record: VideoRecord,
                         writer: Mp4Writer) -> p.VideoDone | None:
    async for out in handle:
        match out:
            case p.VideoChunk():
                record.status = "in_progress"
                frames = np.frombuffer(out.frames, np.uint8).reshape(
                    out.num_frames, out.height, out.width, 3)
                await asyncio.to_thread(writer.add, frames)
                record.progress = min(99, 100 * (out.index + 1) // out.total_chunks)
            case p.StreamError():
                record.error = out.message
            case p.VideoDone():
                return out
    return None


class Mp4Writer:
    """H.264 (yuv420p) in MP4, written chunk by chunk to `path` + ``.part``; `finish`
    renames it to `path`, `discard` removes whatever was written. Thread-safe: the calls
    run on worker threads and `discard` may follow a cancelled `add`."""

    def __init__(self, path: Path, fps: int) -> None:
        self.path = path
        self.partial = path.with_name(path.name + ".part")
        self.fps = fps
        self._lock = threading.Lock()
        self._container: Any = None
        self._stream: Any = None

    def add(self, frames: np.ndarray) -> None:
        """Encode RGB frames, uint8 (F, H, W, 3)."""
        import av

        with self._lock:
            if self._container is None:
                self._container = av.open(str(self.partial), "w", format="mp4")
                self._stream = self._container.add_stream("libx264", rate=self.fps)
                self._stream.width, self._stream.height = frames.shape[2], frames.shape[1]
                self._stream.pix_fmt = "yuv420p"
            for frame in frames:
                packets = self._stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24"))
                self._container.mux(packets)

    def finish(self) -> None:
        with self._lock:
            if self._container is None:
                raise RuntimeError(f"video {self.path.stem}: no frames were encoded")
            self._container.mux(self._stream.encode(None))
            self._container.close()
            self._container = None
            self.partial.replace(self.path)

    def discard(self) -> None:
        with self._lock:
            if self._container is not None:
                self._container.close()
                self._container = None
            self.partial.unlink(missing_ok=True)
            self.path.unlink(missing_ok=True)
