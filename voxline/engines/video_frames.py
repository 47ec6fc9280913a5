"""Frame counts Helios makes (pure arithmetic: no torch, so the HTTP edge can check too).

One chunk is 9 latent frames, which the Wan VAE (4x temporal) decodes to 33 video frames.
`HeliosPipeline` rounds `num_frames` up to whole chunks and then cuts the whole video to
4k+1 frames, so only the counts `output_frames(n)` (33, 65, 97, 129, ...: 32n+1) come out
as asked; any other count is refused with the nearest ones named.
"""

from __future__ import annotations

LATENT_FRAMES_PER_CHUNK = 9
VAE_TEMPORAL = 4
CHUNK_FRAMES = (LATENT_FRAMES_PER_CHUNK - 1) * VAE_TEMPORAL + 1  # 33
MAX_CHUNKS = 64


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


def makeable(num_frames: int) -> bool:
    """Whether the model returns exactly `num_frames` frames."""
    chunks = chunk_count(num_frames)
    return chunks <= MAX_CHUNKS and num_frames == output_frames(chunks)


def nearest_counts(num_frames: int) -> list[int]:
    """The makeable frame counts either side of `num_frames` (one or two)."""
    counts = [output_frames(n) for n in range(1, MAX_CHUNKS + 1)]
    lower = [c for c in counts if c < num_frames]
    upper = [c for c in counts if c > num_frames]
    return lower[-1:] + upper[:1]
