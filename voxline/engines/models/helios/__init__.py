"""Helios text-to-video on `diffusers`, driven one 33-frame chunk per call.

`load_helios(dir)` loads a diffusers-layout checkpoint (`HeliosPipeline.from_pretrained`);
`HeliosChunkDriver` wraps the loaded pipeline's components and runs what
`HeliosPipeline.__call__` runs, a chunk at a time (`HeliosPyramidDriver` what
`HeliosPyramidPipeline.__call__` runs, for Helios-Mid and Helios-Distilled; `driver_for(pipe)`
picks the one for the loaded pipeline): `begin(spec)` makes a `HeliosRender`
(all per-request state: generator, scheduler copy, history latents), and each
`render.next_chunk()` denoises, decodes and returns one chunk's frames. Importing this
package imports torch and diffusers; `import voxline` never does.
"""

from .checkpoint import (
    load_helios,
    parse_video_setting,
    set_attention_backend,
    set_video_weights,
)
from .chunks import CHUNK_FRAMES, VideoSpec, chunk_count, output_frames, validate_spec
from .driver import HeliosChunkDriver, HeliosRender
from .prompt_cache import PromptCache, PromptKey
from .pyramid import HeliosPyramidDriver, driver_for, stage_steps

__all__ = [
    "CHUNK_FRAMES",
    "HeliosChunkDriver",
    "HeliosPyramidDriver",
    "HeliosRender",
    "PromptCache",
    "PromptKey",
    "VideoSpec",
    "chunk_count",
    "driver_for",
    "load_helios",
    "output_frames",
    "parse_video_setting",
    "set_attention_backend",
    "set_video_weights",
    "stage_steps",
    "validate_spec",
]
