"""The Helios chunk driver against a plain `HeliosPipeline` call on a tiny local checkpoint.

Exactness is asserted bitwise (`np.array_equal` on the float frames, not allclose): the
driver runs the pipeline's own ops in the pipeline's order on the same CPU build, so any
difference at all means its loop diverged (a wrong history window, a random draw out of
order, a scheduler shared across requests), not rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from tiny_helios import TINY_MAX_SEQUENCE_LENGTH, save_tiny_helios  # noqa: E402

from voxline.engines.models.helios import (  # noqa: E402
    HeliosChunkDriver,
    VideoSpec,
    load_helios,
    validate_spec,
)
from voxline.engines.models.helios.driver import to_uint8  # noqa: E402


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only contend on a shared machine
    yield load_helios(save_tiny_helios(tmp_path_factory.mktemp("helios")))
    torch.set_num_threads(threads)


def spec(**kw) -> VideoSpec:
    base = dict(prompt="dance monkey", width=16, height=16, num_frames=33,
                num_inference_steps=2, guidance_scale=1.0, negative_prompt="negative", seed=7,
                max_sequence_length=TINY_MAX_SEQUENCE_LENGTH)
    return VideoSpec(**{**base, **kw})


def plain_call(pipe, s: VideoSpec) -> np.ndarray:
    return pipe(s.prompt, negative_prompt=s.negative_prompt, height=s.height, width=s.width,
                num_frames=s.num_frames, num_inference_steps=s.num_inference_steps,
                guidance_scale=s.guidance_scale, max_sequence_length=s.max_sequence_length,
                generator=torch.Generator().manual_seed(s.seed), output_type="np").frames[0]


@pytest.mark.parametrize("guidance, num_frames", [(1.0, 65), (5.0, 33)])
def test_chunks_equal_a_plain_pipeline_call(pipe, guidance, num_frames):
    s = spec(guidance_scale=guidance, num_frames=num_frames)
    driver = HeliosChunkDriver(pipe)
    render = driver.begin(s)
    chunks = []
    while not render.finished:
        chunks.append(driver.render_chunk(render))  # one call, one chunk
    assert [len(c) for c in chunks] == ([33, 32] if num_frames == 65 else [33])
    assert np.array_equal(np.concatenate(chunks), plain_call(pipe, s))


def test_interleaved_requests_each_equal_their_own_call(pipe):
    driver = HeliosChunkDriver(pipe)
    a, b = driver.begin(spec(num_frames=65, seed=1)), driver.begin(spec(num_frames=65, seed=2,
                                                                        prompt="a red cat"))
    got: dict[int, list[np.ndarray]] = {1: [], 2: []}
    for _ in range(2):  # a, b, a, b: per-request generator, scheduler and history
        got[1].append(a.next_chunk())
        got[2].append(b.next_chunk())
    assert np.array_equal(np.concatenate(got[1]), to_uint8(plain_call(pipe, a.spec)))
    assert np.array_equal(np.concatenate(got[2]), to_uint8(plain_call(pipe, b.spec)))


def test_prompt_cache_hit_skips_the_encoder_and_gives_identical_frames(pipe):
    calls = []
    hook = pipe.text_encoder.register_forward_hook(lambda *_: calls.append(1))
    try:
        driver = HeliosChunkDriver(pipe)
        first = driver.begin(spec(guidance_scale=5.0)).next_chunk()
        assert len(calls) == 2  # prompt and negative prompt
        again = driver.begin(spec(guidance_scale=5.0)).next_chunk()
        assert len(calls) == 2 and driver.prompt_cache.hits == 1
        assert np.array_equal(first, again)
        driver.begin(spec(guidance_scale=5.0, negative_prompt="blue")).next_chunk()
        assert len(calls) == 4  # the negative prompt is part of the key
    finally:
        hook.remove()


def test_a_finished_render_refuses_another_chunk(pipe):
    render = HeliosChunkDriver(pipe).begin(spec())
    render.next_chunk()
    with pytest.raises(RuntimeError, match="already made"):
        render.next_chunk()


@pytest.mark.parametrize("field, value, message", [
    ("width", 20, r"CreateVideo\.width: 20 is not a positive multiple of 16"),
    ("height", 0, r"CreateVideo\.height: 0 is not"),
    ("num_frames", 66, r"CreateVideo\.num_frames: 66 cannot be made exactly.*use 65 or 97"),
    ("num_frames", 10, r"CreateVideo\.num_frames: 10 .*use 33"),
    ("num_inference_steps", 0, r"CreateVideo\.num_inference_steps: 0 is not within"),
    ("prompt", " ", r"CreateVideo\.prompt: must not be empty"),
])
def test_bad_specs_are_refused_naming_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        validate_spec(spec(**{field: value}))



def test_decode_pieces_stream_the_chunk_a_latent_frame_at_a_time(pipe):
    """A chunk's first piece is one frame (its first latent frame), then four a piece (the
    second chunk's last piece cut to what the video keeps); joined, they are bitwise the
    whole-chunk decode. The chunk counts as made (its latents in the history) at the call, so
    the next chunk's denoise may run before its frames are decoded: the frames are the same."""
    from voxline.engines.models.helios.driver import streams_frames

    assert streams_frames(pipe.vae)
    s = spec(num_frames=65)
    whole = HeliosChunkDriver(pipe).begin(s)
    want = [whole.next_chunk(), whole.next_chunk()]
    driver = HeliosChunkDriver(pipe)
    render = driver.begin(s)
    driver.start_chunk(render)
    first = driver.decode_pieces(render, driver.denoise_chunk(render))
    assert render.chunks_done == 1
    driver.start_chunk(render)  # the second chunk's denoise before the first one's decode
    second = driver.decode_pieces(render, driver.denoise_chunk(render))
    assert render.finished
    got = [list(first), list(second)]
    assert [[len(p) for p in pieces] for pieces in got] == [[1] + [4] * 8, [1] + [4] * 7 + [3]]
    for pieces, chunk in zip(got, want, strict=True):
        assert np.array_equal(to_uint8(np.concatenate(pieces)), chunk)


def test_denoise_next_then_its_pieces_equal_the_whole_chunks_without_autograd(pipe):
    """The video stage's path (`denoise_next` on one thread, `next_piece` on another): the
    same frames as `next_chunk`, and no autograd graph kept on the worker threads (their
    grad mode is their own)."""
    s = spec(num_frames=65)
    want = HeliosChunkDriver(pipe).begin(s)
    chunks = [want.next_chunk(), want.next_chunk()]
    render = HeliosChunkDriver(pipe).begin(s)
    decodes = [render.denoise_next(), render.denoise_next()]
    assert render.finished and not render.history.requires_grad
    for decode, chunk in zip(decodes, chunks, strict=True):
        pieces, last = [], False
        while not last:
            frames, last = decode.next_piece()
            pieces.append(frames)
        assert np.array_equal(np.concatenate(pieces), chunk)
