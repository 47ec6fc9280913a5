"""Helios chunk geometry and request validation (pure arithmetic, no model).

The frame-count arithmetic lives in `voxline.engines.video_frames` (torch-free, so the
HTTP edge checks it too): only 33, 65, 97, ... frames come out as asked; any other count
is refused with the two nearest ones named, rather than returning a different number.
"""

from __future__ import annotations

from dataclasses import dataclass

from voxline.engines.video_frames import (  # noqa: F401 (the package's names)
    CHUNK_FRAMES,
    LATENT_FRAMES_PER_CHUNK,
    MAX_CHUNKS,
    VAE_TEMPORAL,
    chunk_count,
    chunk_frame_counts,
    nearest_counts,
    output_frames,
)

SIZE_MULTIPLE = 16  # VAE 8x spatial times the transformer's 2x2 patch
MAX_STEPS = 200


@dataclass(frozen=True)
class VideoSpec:
    """What one video request asks of the model (`seed` None: a fresh random one)."""

    prompt: str
    width: int = 640
    height: int = 384
    num_frames: int = CHUNK_FRAMES
    num_inference_steps: int = 50
    guidance_scale: float = 5.0
    negative_prompt: str = ""
    seed: int | None = None
    max_sequence_length: int = 512
    cache_backend: str = ""  # "" the server's default; none / first_block_cache / mag_cache
    cache_threshold: float | None = None  # None: the backend's default
    # a distilled checkpoint's first chunk at twice the steps, as its model card runs it
    # (False: as many as later chunks; a real-time video's default, its first frame sooner)
    amplify_first_chunk: bool = True


def validate_spec(spec: VideoSpec, event: str = "CreateVideo") -> None:
    """Raise ValueError naming `event.field` for a request the model cannot make as asked."""
    if not spec.prompt.strip():
        raise ValueError(f"{event}.prompt: must not be empty")
    for name in ("width", "height"):
        value = getattr(spec, name)
        if value < SIZE_MULTIPLE or value % SIZE_MULTIPLE:
            raise ValueError(f"{event}.{name}: {value} is not a positive multiple of "
                             f"{SIZE_MULTIPLE} (Helios' VAE and patch size)")
    chunks = chunk_count(spec.num_frames)
    if chunks > MAX_CHUNKS:
        raise ValueError(f"{event}.num_frames: {spec.num_frames} is more than "
                         f"{output_frames(MAX_CHUNKS)} ({MAX_CHUNKS} chunks)")
    if spec.num_frames != output_frames(chunks):
        raise ValueError(f"{event}.num_frames: {spec.num_frames} cannot be made exactly: Helios "
                         f"makes {CHUNK_FRAMES}-frame chunks and cuts the video to 4k+1 frames; "
                         f"use {' or '.join(map(str, nearest_counts(spec.num_frames)))}")
    if not 1 <= spec.num_inference_steps <= MAX_STEPS:
        raise ValueError(f"{event}.num_inference_steps: {spec.num_inference_steps} is not "
                         f"within 1..{MAX_STEPS}")
    if spec.guidance_scale < 0:
        raise ValueError(f"{event}.guidance_scale: {spec.guidance_scale} is negative")
    if spec.max_sequence_length < 1:
        raise ValueError(f"{event}.max_sequence_length: must be at least 1")
