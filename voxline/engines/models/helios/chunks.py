"""Helios chunk geometry and request validation (pure arithmetic, no model).

One chunk is 9 latent frames, which the Wan VAE (4x temporal) decodes to 33 video frames.
`HeliosPipeline` rounds `num_frames` up to whole chunks and then cuts the whole video to
4k+1 frames, so only the counts `output_frames(n)` (33, 65, 97, 129, ...) come out as
asked; any other count is refused with the two nearest ones named, rather than returning
a different number of frames than the caller asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

LATENT_FRAMES_PER_CHUNK = 9
VAE_TEMPORAL = 4
CHUNK_FRAMES = (LATENT_FRAMES_PER_CHUNK - 1) * VAE_TEMPORAL + 1  # 33
SIZE_MULTIPLE = 16  # VAE 8x spatial times the transformer's 2x2 patch
MAX_CHUNKS = 64
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


def output_frames(chunks: int) -> int:
    """Frames `HeliosPipeline` returns for `chunks` chunks: 33n cut to 4k+1."""
    made = chunks * CHUNK_FRAMES
    return (made - 1) // VAE_TEMPORAL * VAE_TEMPORAL + 1


def chunk_count(num_frames: int) -> int:
    """Chunks the pipeline runs for `num_frames` (at least one)."""
    return max(1, -(-num_frames // CHUNK_FRAMES))


def chunk_frame_counts(num_frames: int) -> list[int]:
    """Frames each chunk contributes: all 33, the last one cut so the total is 4k+1."""
    chunks = chunk_count(num_frames)
    counts = [CHUNK_FRAMES] * chunks
    counts[-1] -= chunks * CHUNK_FRAMES - output_frames(chunks)
    return counts


def _nearest_counts(num_frames: int) -> str:
    """The makeable frame counts either side of `num_frames`, as a phrase."""
    counts = [output_frames(n) for n in range(1, MAX_CHUNKS + 1)]
    lower = [c for c in counts if c < num_frames]
    upper = [c for c in counts if c > num_frames]
    return " or ".join(str(c) for c in (lower[-1:] + upper[:1]))


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
                         f"use {_nearest_counts(spec.num_frames)}")
    if not 1 <= spec.num_inference_steps <= MAX_STEPS:
        raise ValueError(f"{event}.num_inference_steps: {spec.num_inference_steps} is not "
                         f"within 1..{MAX_STEPS}")
    if spec.guidance_scale < 0:
        raise ValueError(f"{event}.guidance_scale: {spec.guidance_scale} is negative")
    if spec.max_sequence_length < 1:
        raise ValueError(f"{event}.max_sequence_length: must be at least 1")
