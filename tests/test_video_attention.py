"""`video_attention`: the video transformer's attention backend by diffusers' name; one
diffusers can run here is applied (and gives the same frames as the default), one it
does not know or cannot run is refused at start-up naming the setting."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_helios import TINY_MAX_SEQUENCE_LENGTH, save_tiny_helios

from voxline.config import Settings
from voxline.engines import protocol as p
from voxline.engines.stage_registry import load_video


def first_chunk(model) -> np.ndarray:
    model.max_sequence_length = TINY_MAX_SEQUENCE_LENGTH
    render = model.begin_video(p.CreateVideo("s", "v", "dance monkey", width=64, height=64,
                                             num_frames=33, num_inference_steps=2, seed=3))
    return render.next_chunk()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_helios(tmp_path_factory.mktemp("helios"))


def test_a_backend_diffusers_runs_here_is_applied_with_the_same_frames(checkpoint, tmp_path):
    native = load_video(Settings(video=f"helios:{checkpoint}", cache=tmp_path))
    math = load_video(Settings(video=f"helios:{checkpoint}", cache=tmp_path,
                               video_attention="_native_math"))
    processor = math.pipe.transformer.blocks[0].attn1.processor
    assert getattr(processor, "_attention_backend", None) == "_native_math"
    np.testing.assert_allclose(first_chunk(math).astype(int), first_chunk(native).astype(int),
                               atol=1)  # uint8 frames; SDPA's math kernel rounds differently


@pytest.mark.parametrize("name, message", [
    ("warp_drive", "is not a diffusers attention backend"),
    ("flash", "cannot run here"),  # flash-attn is not installed
    ("_native_cudnn", "cannot run here"),  # known to diffusers, but no cuDNN on a CPU
])
def test_a_backend_diffusers_cannot_run_is_refused_naming_the_setting(checkpoint, tmp_path,
                                                                      name, message):
    with pytest.raises(ValueError, match=f"video_attention='{name}' {message}"):
        load_video(Settings(video=f"helios:{checkpoint}", cache=tmp_path, video_attention=name))
