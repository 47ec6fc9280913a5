"""A ``POST /v1/videos`` body: JSON, or the multipart form the openai SDK sends (numbers as
strings), parsed into one `VideoRequest`; every refusal is a 400 naming its field.

- ``seconds`` (OpenAI's field, a string in the SDK: "4", "8", "12") maps to
  ``num_frames = seconds x fps + 1`` (both ends of the clip). Helios makes 32k+1 frames
  (33, 65, 97, ...), so at the default 24 fps 4, 8 and 12 s are exact (97, 193, 289
  frames); a duration that is not is refused with the nearest ones that are.
- ``input_reference`` (an image to start from) must be an image file (checked with
  Pillow); the Helios driver is text-to-video only, so an image is then refused too,
  saying so, rather than being ignored.
"""

from __future__ import annotations

import io
from typing import Annotated, Any, Literal

import anyio
from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from voxline.engines.video_frames import makeable, nearest_counts
from voxline.realtime.http.audio_requests import AudioAPIError, bad

SIZE_MULTIPLE = 16
MAX_SIDE = 4096
MAX_SEED = 2**63 - 1
MAX_REFERENCE_BYTES = 20 << 20
INT_FIELDS = ("width", "height", "fps", "num_frames", "num_inference_steps", "seed",
              "steps_per_stage")
FLOAT_FIELDS = ("guidance_scale", "cache_threshold", "seconds")
NO_IMAGE_TO_VIDEO = ("'input_reference': image-to-video is not supported: the Helios driver "
                     "makes video from the prompt only; send the request without an image")


class VideoRequest(BaseModel):
    """A ``POST /v1/videos`` body; unknown fields are refused."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    prompt: Annotated[str, Field(min_length=1, max_length=4096)]
    model: str | None = None
    size: Annotated[str, Field(pattern=r"^\d+x\d+$")] | None = None
    seconds: Annotated[float, Field(gt=0, le=3600)] | None = None
    width: Annotated[int, Field(ge=SIZE_MULTIPLE, le=MAX_SIDE)] | None = None
    height: Annotated[int, Field(ge=SIZE_MULTIPLE, le=MAX_SIDE)] | None = None
    fps: Annotated[int, Field(ge=1, le=60)] = 24
    num_frames: Annotated[int, Field(ge=1, le=10_000)] = 33
    # None: the video model's recommended setting (Helios: 50 steps, guidance 5.0)
    num_inference_steps: Annotated[int, Field(ge=1, le=200)] | None = None
    guidance_scale: Annotated[float, Field(ge=0, le=100)] | None = None
    negative_prompt: str = ""
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = None
    # voxline's step cache (diffusers' hooks); None: the server's video_cache_backend
    cache_backend: Literal["none", "first_block_cache", "mag_cache"] | None = None
    cache_threshold: Annotated[float, Field(ge=0, le=100)] | None = None
    # steps per pyramid stage; None (and no num_inference_steps): `video_steps_per_stage`
    steps_per_stage: Annotated[int, Field(ge=1, le=50)] | None = None

    def dimensions(self) -> tuple[int, int]:
        """(width, height): explicit fields over ``size``, default 640x384 (Helios')."""
        width, height = 640, 384
        if self.size is not None:
            width, height = (int(v) for v in self.size.split("x"))
        return self.width or width, self.height or height


def parse_video_request(body: object) -> VideoRequest:
    """Validate a decoded body; raises `AudioAPIError` (400) naming the field."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_request")
    if "input_reference" in body:
        raise bad("'input_reference' must be an image file, sent as multipart form data",
                  "input_reference")
    if isinstance(body.get("seconds"), str):  # OpenAI's type for it: "4", "8", "12"
        body = {**body, "seconds": _form_number("seconds", body["seconds"])}
    try:
        req = VideoRequest.model_validate(body)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        name = str(err["loc"][0]) if err["loc"] else None
        code = "unknown_parameter" if err["type"] == "extra_forbidden" else "invalid_value"
        raise bad(f"'{name}': {err['msg']}", name, code) from None
    if req.steps_per_stage is not None and req.num_inference_steps is not None:
        raise bad("'steps_per_stage': it and num_inference_steps both set the steps; send one",
                  "steps_per_stage")
    width, height = req.dimensions()
    for name, value in (("width", width), ("height", height)):
        if value % SIZE_MULTIPLE or not SIZE_MULTIPLE <= value <= MAX_SIDE:
            param = name if getattr(req, name) is not None else "size"
            raise bad(f"'{param}': {name} {value} must be a multiple of {SIZE_MULTIPLE} from "
                      f"{SIZE_MULTIPLE} to {MAX_SIDE} (the model's patch size)", param)
    if req.seconds is not None:
        req = req.model_copy(update={"num_frames": _frames_for_seconds(req)})
    return req


def _frames_for_seconds(req: VideoRequest) -> int:
    assert req.seconds is not None
    frames = round(req.seconds * req.fps) + 1
    if "num_frames" in req.model_fields_set and req.num_frames != frames:
        raise bad(f"'seconds': {req.seconds:g} s at {req.fps} fps is {frames} frames, but "
                  f"num_frames is {req.num_frames}; send one of them", "seconds")
    if not makeable(frames):
        near = " or ".join(f"{(c - 1) / req.fps:.4g}" for c in nearest_counts(frames))
        raise bad(f"'seconds': {req.seconds:g} s at {req.fps} fps is {frames} frames "
                  f"(seconds x fps + 1), but Helios makes 32k+1 frames (33, 65, 97, ...); "
                  f"at {req.fps} fps use seconds {near}, or another fps", "seconds")
    return frames


async def read_body(request: Request) -> object:
    """The JSON body, or a form (the openai SDK's multipart) with its numbers converted."""
    if not request.headers.get("content-type", "").startswith(("multipart/form-data",
                                                               "application/x-www-form")):
        try:
            return await request.json()
        except ValueError:
            raise bad("the request body is not valid JSON", None, "invalid_json") from None
    form = await request.form()
    reference = form.get("input_reference")
    if reference is not None:
        await check_reference(reference)
    body: dict[str, Any] = {}
    for name, value in form.items():
        if not isinstance(value, str):
            raise bad(f"'{name}' must be a form field, not a file", name)
        body[name] = _form_number(name, value)
    return body


async def check_reference(reference: Any) -> None:
    """400 naming ``input_reference``: not an image, or (an image) not supported."""
    if isinstance(reference, str):
        raise bad("'input_reference' must be an image file, not a form field",
                  "input_reference")
    data = await reference.read(MAX_REFERENCE_BYTES + 1)
    if len(data) > MAX_REFERENCE_BYTES:
        raise bad(f"'input_reference' is larger than {MAX_REFERENCE_BYTES >> 20} MiB",
                  "input_reference")
    if not await anyio.to_thread.run_sync(_is_image, data):
        raise bad("'input_reference' is not an image (PNG, JPEG or WebP expected)",
                  "input_reference")
    raise AudioAPIError(400, NO_IMAGE_TO_VIDEO, param="input_reference", code="unsupported")


def _is_image(data: bytes) -> bool:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        return False
    return True


def _form_number(name: str, value: str) -> Any:
    if name not in (*INT_FIELDS, *FLOAT_FIELDS):
        return value
    try:
        return int(value) if name in INT_FIELDS else float(value)
    except ValueError:
        raise bad(f"'{name}' must be a number, got {value!r}", name) from None
