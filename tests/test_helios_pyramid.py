"""The Helios pyramid chunk driver against a plain `HeliosPyramidPipeline` call, on tiny
local checkpoints of the three variants (distilled: DMD scheduler, guidance 1.0, the first
chunk amplified; mid: CFG-Zero*; base: plain guidance), loaded through the real path.

Exactness is asserted bitwise (`np.array_equal` on the float frames), as for the plain
driver: the driver runs the pipeline's ops in the pipeline's order on the same CPU build,
so any difference means its loop diverged (a stage's schedule, the block noise drawn out
of order, a first chunk not amplified), not rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from tiny_helios import TINY_MAX_SEQUENCE_LENGTH, save_tiny_helios  # noqa: E402

from voxline.engines import protocol as p  # noqa: E402
from voxline.engines.models.helios import (  # noqa: E402
    HeliosChunkDriver,
    HeliosPyramidDriver,
    VideoSpec,
    driver_for,
    load_helios,
    stage_steps,
)
from voxline.engines.models.helios.driver import to_uint8  # noqa: E402
from voxline.engines.models.helios.step_cache import CacheBackend, CacheChoice, StepCaches  # noqa: E402


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only contend on a shared machine
    yield {variant: save_tiny_helios(tmp_path_factory.mktemp(variant), pyramid=variant)
           for variant in ("distilled", "mid", "base")}
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pipes(checkpoints):
    return {variant: load_helios(path) for variant, path in checkpoints.items()}


def spec(**kw) -> VideoSpec:
    base = dict(prompt="dance monkey", width=64, height=64, num_frames=65,
                num_inference_steps=6, guidance_scale=1.0, negative_prompt="negative", seed=7,
                max_sequence_length=TINY_MAX_SEQUENCE_LENGTH)
    return VideoSpec(**{**base, **kw})


def plain_call(pipe, s: VideoSpec, amplify: bool) -> np.ndarray:
    return pipe(s.prompt, negative_prompt=s.negative_prompt, height=s.height, width=s.width,
                num_frames=s.num_frames, guidance_scale=s.guidance_scale,
                pyramid_num_inference_steps_list=stage_steps(s.num_inference_steps, 3),
                is_amplify_first_chunk=amplify, max_sequence_length=s.max_sequence_length,
                generator=torch.Generator().manual_seed(s.seed), output_type="np").frames[0]


def driver(pipe, **kw) -> HeliosPyramidDriver:
    made = driver_for(pipe, max_sequence_length=TINY_MAX_SEQUENCE_LENGTH, **kw)
    assert isinstance(made, HeliosPyramidDriver)
    return made


@pytest.mark.parametrize("variant, changes", [
    ("distilled", {}),  # the card's setting: 2 steps a stage, guidance 1, chunk 0 amplified
    ("mid", {"guidance_scale": 5.0, "width": 128, "height": 128, "num_frames": 33}),
    ("base", {"guidance_scale": 5.0, "num_inference_steps": 5, "num_frames": 33}),  # [2, 2, 1]
])
def test_chunks_equal_a_plain_pyramid_pipeline_call(pipes, variant, changes):
    s = spec(**changes)
    d = driver(pipes[variant])
    assert (d.stages, d.distilled, d.cfg_zero_star) == (3, variant == "distilled",
                                                        variant == "mid")
    render = d.begin(s)
    chunks = []
    while not render.finished:
        chunks.append(d.render_chunk(render))  # one call, one chunk
    assert [len(c) for c in chunks] == ([33, 32] if s.num_frames == 65 else [33])
    assert np.array_equal(np.concatenate(chunks),
                          plain_call(pipes[variant], s, amplify=variant == "distilled"))


def test_interleaved_pyramid_requests_each_equal_their_own_call(pipes):
    d = driver(pipes["distilled"])
    a, b = d.begin(spec(seed=1)), d.begin(spec(seed=2, prompt="a red cat"))
    got: dict[int, list[np.ndarray]] = {1: [], 2: []}
    for _ in range(2):  # a, b, a, b: per-request scheduler stages, generator, history
        got[1].append(a.next_chunk())
        got[2].append(b.next_chunk())
    for key, render in ((1, a), (2, b)):
        ref = to_uint8(plain_call(pipes["distilled"], render.spec, amplify=True))
        assert np.array_equal(np.concatenate(got[key]), ref)


def test_the_video_setting_picks_the_pyramid_driver_from_the_checkpoint(checkpoints, pipes,
                                                                        tmp_path):
    from voxline.config import Settings
    from voxline.engines.stage_registry import load_video

    model = load_video(Settings(video=f"helios:{checkpoints['distilled']}", cache=tmp_path))
    assert isinstance(model, HeliosPyramidDriver) and model.distilled
    model.max_sequence_length = TINY_MAX_SEQUENCE_LENGTH
    render = model.begin_video(p.CreateVideo("s", "v", "dance monkey", width=64, height=64,
                                             num_frames=33, num_inference_steps=6,
                                             guidance_scale=1.0, seed=3))
    frames = render.next_chunk()
    ref = plain_call(pipes["distilled"], spec(num_frames=33, seed=3, negative_prompt=""),
                     amplify=True)
    assert np.array_equal(frames, to_uint8(ref))


def test_helios_pyramid_forces_the_pyramid_sampler_on_a_plain_checkpoint(tmp_path):
    from voxline.config import Settings
    from voxline.engines.stage_registry import load_video

    plain = save_tiny_helios(tmp_path / "plain")
    assert type(load_video(Settings(video=f"helios:{plain}", cache=tmp_path))) is \
        HeliosChunkDriver
    forced = load_video(Settings(video=f"helios-pyramid:{plain}", cache=tmp_path))
    assert isinstance(forced, HeliosPyramidDriver) and forced.stages == 1


def test_first_block_cache_runs_per_stage_and_is_exact_at_threshold_zero(pipes):
    pipe = pipes["base"]
    d = driver(pipe, step_caches=StepCaches(pipe.transformer, CacheChoice()))
    s = spec(num_frames=33, guidance_scale=5.0)
    plain = d.begin(s).next_chunk()
    cached = d.begin(spec(num_frames=33, guidance_scale=5.0, cache_backend="first_block_cache",
                          cache_threshold=0.0)).next_chunk()
    assert np.array_equal(cached, plain)  # the stage's token count changes: state is reset
    d.step_caches.prepare(CacheChoice(), 1)  # hooks off for the module's other tests


@pytest.mark.parametrize("changes, message", [
    ({"num_inference_steps": 2}, "CreateVideo.num_inference_steps: 2 is fewer than"),
    ({"width": 96}, "CreateVideo.width: 96 is not a multiple of 64"),
    ({"height": 32}, "CreateVideo.height: 32 is not a multiple of 64"),
    ({"cache_backend": "mag_cache"}, "CreateVideo.cache_backend: mag_cache does not run"),
])
def test_pyramid_refusals_name_the_field(pipes, changes, message):
    with pytest.raises(ValueError, match=message):
        driver(pipes["distilled"]).begin(spec(**changes))


def test_a_mag_cache_server_default_is_refused_at_load(pipes):
    caches = StepCaches(pipes["distilled"].transformer, CacheChoice(CacheBackend.MAG_CACHE))
    with pytest.raises(ValueError, match="video_cache_backend: mag_cache"):
        driver(pipes["distilled"], step_caches=caches)


def test_stage_steps_split_evenly_from_the_first_stage():
    assert stage_steps(6, 3) == [2, 2, 2]
    assert stage_steps(60, 3) == [20, 20, 20]
    assert stage_steps(50, 3) == [17, 17, 16]
    assert stage_steps(4, 1) == [4]


# ------------------------------------------------------------------ video_compile


def test_video_compile_compiles_the_blocks_and_refuses_first_block_cache(checkpoints,
                                                                         tmp_path):
    from voxline.config import Settings
    from voxline.engines.stage_registry import load_video

    model = load_video(Settings(video=f"helios:{checkpoints['distilled']}", cache=tmp_path,
                                video_compile=True))  # a fresh pipeline: compiling mutates it
    assert model.compiled
    assert all(block._compiled_call_impl is not None for block in model.pipe.transformer.blocks)
    with pytest.raises(ValueError, match="CreateVideo.cache_backend: first_block_cache does "
                                         "not run with video_compile"):
        model.begin(spec(cache_backend="first_block_cache"))
    with pytest.raises(ValueError, match="video_cache_backend: first_block_cache"):
        load_video(Settings(video=f"helios:{checkpoints['distilled']}", cache=tmp_path,
                            video_compile=True, video_cache_backend="first_block_cache"))


@pytest.mark.slow
def test_a_compiled_chunk_is_close_to_the_eager_one(checkpoints):
    # allclose, not bitwise: inductor fuses the blocks' ops and rounds differently
    eager = driver(load_helios(checkpoints["distilled"]))
    compiled = driver(load_helios(checkpoints["distilled"]), compile=True)
    s = spec(num_frames=33)
    a = eager.render_chunk(eager.begin(s))
    b = compiled.render_chunk(compiled.begin(s))
    assert np.allclose(a, b, atol=2e-3)


def test_a_request_naming_no_steps_or_guidance_runs_the_checkpoints_recommended(pipes,
                                                                                tmp_path):
    from voxline.config import Settings
    from voxline.engines.stage_registry import load_video

    plain = load_video(Settings(video=f"helios:{save_tiny_helios(tmp_path / 'plain')}",
                                cache=tmp_path))
    for d, want in ((driver(pipes["distilled"]), (6, 1.0)), (driver(pipes["base"]), (60, 5.0)),
                    (plain, (50, 5.0))):
        render = d.begin_video(p.CreateVideo("s", "v", "dance monkey", width=64, height=64,
                                             num_frames=33, seed=3))
        assert (render.spec.num_inference_steps, render.spec.guidance_scale) == want
    named = driver(pipes["distilled"]).begin_video(p.CreateVideo(
        "s", "v", "x", width=64, height=64, num_frames=33, num_inference_steps=3,
        guidance_scale=2.0, seed=3))
    assert (named.spec.num_inference_steps, named.spec.guidance_scale) == (3, 2.0)


# ------------------------------------------------------- per-path steps and steering


def realtime_msg(**kw) -> p.CreateVideo:
    base = dict(width=64, height=64, num_frames=33, guidance_scale=1.0, seed=3, realtime=True)
    return p.CreateVideo("s", "v", kw.pop("prompt", "dance monkey"), **{**base, **kw})


def test_real_time_videos_run_one_step_a_stage_and_v1_videos_the_recommended(pipes):
    d = driver(pipes["distilled"])
    render = d.begin_video(realtime_msg())
    assert render.spec.num_inference_steps == 3  # Helios' real-time [1, 1, 1]
    # bitwise a plain call with pyramid_num_inference_steps_list=[1, 1, 1], the first
    # chunk not amplified (video_realtime_amplify_first_chunk off); /v1/videos amplifies
    assert stage_steps(3, 3) == [1, 1, 1]
    three = spec(num_frames=33, seed=3, num_inference_steps=3, negative_prompt="")
    assert np.array_equal(render.next_chunk(),
                          to_uint8(plain_call(pipes["distilled"], three, amplify=False)))
    assert d.begin_video(realtime_msg(realtime=False, num_inference_steps=3)).spec \
        .amplify_first_chunk
    amplified = driver(pipes["distilled"], realtime_amplify_first_chunk=True)
    assert np.array_equal(amplified.begin_video(realtime_msg()).next_chunk(),
                          to_uint8(plain_call(pipes["distilled"], three, amplify=True)))
    steps = {name: d.begin_video(realtime_msg(**changes)).spec.num_inference_steps
             for name, changes in {"batch": {"realtime": False},
                                   "two_a_stage": {"steps_per_stage": 2},
                                   "named": {"num_inference_steps": 4}}.items()}
    assert steps == {"batch": 6, "two_a_stage": 6, "named": 4}
    mid = driver(pipes["mid"])
    assert mid.begin_video(realtime_msg()).spec.num_inference_steps == 3
    assert mid.begin_video(realtime_msg(realtime=False)).spec.num_inference_steps == 60
    tuned = driver(pipes["distilled"], realtime_steps_per_stage=2, steps_per_stage=4)
    assert tuned.begin_video(realtime_msg()).spec.num_inference_steps == 6
    assert tuned.begin_video(realtime_msg(realtime=False)).spec.num_inference_steps == 12


def test_step_fields_and_settings_a_sampler_cannot_run_are_refused_by_name(pipes, tmp_path):
    from voxline.config import Settings
    from voxline.engines.stage_registry import load_video

    with pytest.raises(ValueError, match=r"^CreateVideo\.steps_per_stage: send it or "):
        driver(pipes["distilled"]).begin_video(realtime_msg(steps_per_stage=1,
                                                            num_inference_steps=3))
    plain_dir = save_tiny_helios(tmp_path / "plain")
    plain = load_video(Settings(video=f"helios:{plain_dir}", cache=tmp_path))
    assert type(plain) is HeliosChunkDriver
    # the standard sampler's real-time videos run its recommended steps ...
    assert plain.begin_video(realtime_msg(width=16, height=16)).spec.num_inference_steps == 50
    # ... and a per-stage request or setting it cannot run is refused naming it
    with pytest.raises(ValueError, match=r"^CreateVideo\.steps_per_stage: the checkpoint runs "
                                         "Helios' standard sampler"):
        plain.begin_video(realtime_msg(width=16, height=16, steps_per_stage=2))
    for field in ("video_realtime_steps_per_stage", "video_steps_per_stage"):
        with pytest.raises(ValueError, match=rf"^{field}=2: the checkpoint runs Helios' "
                                             "standard sampler"):
            load_video(Settings(video=f"helios:{plain_dir}", cache=tmp_path, **{field: 2}))


def test_steering_makes_the_next_chunk_read_the_new_prompt_over_the_kept_history(pipes):
    from dataclasses import replace

    from voxline.engines.models.helios.driver import HISTORY_SIZES

    pipe = pipes["distilled"]
    d = driver(pipe)
    render = d.begin_video(realtime_msg(num_frames=97))  # three chunks
    seen: list[tuple[int, dict]] = []  # (chunk, the transformer call's tensors)

    def record(_module, _args, kwargs):
        seen.append((render.chunks_done, {k: kwargs[k].clone() for k in (
            "encoder_hidden_states", "latents_history_short", "latents_history_mid",
            "latents_history_long")}))

    hook = pipe.transformer.register_forward_pre_hook(record, with_kwargs=True)
    try:
        first = render.next_chunk()
        history, prefix = render.history.clone(), render.first_latent.clone()
        render.steer("a red cat")
        second = render.next_chunk()
    finally:
        hook.remove()
    old = d.encode(replace(render.spec, prompt="dance monkey"))[0]
    new = d.encode(render.spec)[0]
    assert render.spec.prompt == "a red cat" and not torch.equal(old, new)
    for chunk, want in ((0, old), (1, new)):
        calls = [c for k, c in seen if k == chunk]
        assert calls and all(torch.equal(c["encoder_hidden_states"], want) for c in calls)
    # the history is the first chunk's, not reset: the prefix and every window carry on
    assert history.abs().sum() > 0
    long, mid, one = history.split(HISTORY_SIZES, dim=2)
    dtype = pipe.transformer.dtype
    after = next(c for k, c in seen if k == 1)
    assert torch.equal(after["latents_history_long"], long.to(dtype))
    assert torch.equal(after["latents_history_mid"], mid.to(dtype))
    assert torch.equal(after["latents_history_short"], torch.cat([prefix, one], 2).to(dtype))
    assert torch.equal(render.first_latent, prefix)
    # it morphs: not the new prompt's video started afresh, and the video goes on
    fresh = d.begin_video(realtime_msg(prompt="a red cat", num_frames=97))
    assert not np.array_equal(second, fresh.next_chunk())
    assert first.shape == second.shape and (render.chunks_done, render.finished) == (2, False)
    with pytest.raises(ValueError, match=r"^SteerVideo\.prompt: must not be empty"):
        render.steer("  ")
