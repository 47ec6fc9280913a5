"""Step caches (diffusers' FirstBlockCache and MagCache hooks) on the tiny Helios pipeline:
a threshold that never skips gives the uncached frames exactly, an aggressive one runs fewer
transformer block passes, requests with different backends interleaved on one transformer
each equal their solo runs, and MagCache's ratios are calibrated, stored and loaded."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from tiny_helios import TINY_MAX_SEQUENCE_LENGTH, build_tiny_helios  # noqa: E402

from voxline.engines.models.helios import HeliosChunkDriver, VideoSpec  # noqa: E402
from voxline.engines.models.helios.step_cache import (  # noqa: E402
    RATIOS_FILE,
    CacheChoice,
    MagRatios,
    StepCaches,
    step_caches_for,
)

STEPS = 6


@pytest.fixture(scope="module")
def pipe():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only contend on a shared machine
    yield build_tiny_helios()
    torch.set_num_threads(threads)


class BlockPasses:
    """Counts full passes through the transformer's blocks: calls of the last block's
    feed-forward, which a skipping cache hook never reaches."""

    def __init__(self, transformer) -> None:
        self.count = 0
        self._handle = transformer.blocks[-1].ffn.register_forward_hook(self._seen)

    def _seen(self, *_args) -> None:
        self.count += 1

    def close(self) -> None:
        self._handle.remove()


def make_driver(pipe, tmp_path, ratios: list[float] | None = None) -> HeliosChunkDriver:
    store = MagRatios([tmp_path / RATIOS_FILE])
    if ratios is not None:
        store.ratios = ratios
    return HeliosChunkDriver(pipe, max_sequence_length=TINY_MAX_SEQUENCE_LENGTH,
                             step_caches=StepCaches(pipe.transformer, CacheChoice(), store))


def spec(backend: str = "", threshold: float | None = None, seed: int = 3,
         frames: int = 65) -> VideoSpec:
    return VideoSpec("dance monkey", width=16, height=16, num_frames=frames,
                     num_inference_steps=STEPS, guidance_scale=1.0, seed=seed,
                     max_sequence_length=TINY_MAX_SEQUENCE_LENGTH, cache_backend=backend,
                     cache_threshold=threshold)


def render_all(driver: HeliosChunkDriver, request: VideoSpec) -> np.ndarray:
    render = driver.begin(request)
    chunks = []
    while not render.finished:
        chunks.append(render.next_chunk())
    return np.concatenate(chunks)


# ratios far from 1: MagCache's error grows fast (it skips little); ratios of 1: it skips
# every step it may (max_skip_steps in a row)
FLAT_RATIOS = [1.0] * STEPS


@pytest.mark.parametrize("backend", ["none", "first_block_cache", "mag_cache"])
def test_a_threshold_that_never_skips_gives_the_uncached_frames_exactly(pipe, tmp_path, backend):
    driver = make_driver(pipe, tmp_path, ratios=[1.0, 1.3, 0.7, 1.3, 0.7, 1.3])
    plain = render_all(driver, spec("none"))
    passes = BlockPasses(pipe.transformer)
    try:
        got = render_all(driver, spec(backend, threshold=0.0))
    finally:
        passes.close()
    assert np.array_equal(got, plain)
    assert passes.count == 2 * STEPS  # two chunks, every step computed


@pytest.mark.parametrize("backend", ["first_block_cache", "mag_cache"])
def test_an_aggressive_threshold_runs_fewer_block_passes_with_the_same_shape(pipe, tmp_path,
                                                                            backend):
    driver = make_driver(pipe, tmp_path, ratios=FLAT_RATIOS)
    passes = BlockPasses(pipe.transformer)
    try:
        got = render_all(driver, spec(backend, threshold=10.0))
    finally:
        passes.close()
    assert got.shape == (65, 16, 16, 3) and got.dtype == np.uint8
    assert passes.count < 2 * STEPS


def test_interleaved_requests_with_different_backends_each_equal_their_solo_runs(pipe,
                                                                                tmp_path):
    driver = make_driver(pipe, tmp_path, ratios=FLAT_RATIOS)
    requests = [spec("first_block_cache", 10.0, seed=1), spec("mag_cache", 10.0, seed=2),
                spec("none", seed=3), spec("mag_cache", 0.5, seed=4)]
    solo = [render_all(driver, r) for r in requests]
    renders = [driver.begin(r) for r in requests]
    chunks: list[list[np.ndarray]] = [[] for _ in requests]
    while not all(r.finished for r in renders):  # one chunk each in turn, as the stage does
        for index, render in enumerate(renders):
            if not render.finished:
                chunks[index].append(render.next_chunk())
    for alone, together in zip(solo, chunks, strict=True):
        assert np.array_equal(alone, np.concatenate(together))


def test_mag_cache_without_ratios_calibrates_stores_and_a_new_server_loads_them(pipe, tmp_path):
    driver = make_driver(pipe, tmp_path)
    plain = render_all(driver, spec("none"))
    assert driver.step_caches.needs_calibration(CacheChoice("mag_cache"))
    got = render_all(driver, spec("mag_cache", threshold=0.0))
    assert np.array_equal(got, plain)  # the calibration chunk computes every step
    stored = json.loads((tmp_path / RATIOS_FILE).read_text())
    assert len(stored["mag_ratios"]) == STEPS and stored["mag_ratios"][0] == 1.0
    assert stored["calibrated_with"]["num_inference_steps"] == STEPS
    assert driver.step_caches.mag_ratios.ratios == stored["mag_ratios"]

    reloaded = step_caches_for(pipe.transformer, tmp_path, tmp_path / "cache")
    assert reloaded.mag_ratios.ratios == stored["mag_ratios"]
    assert not reloaded.needs_calibration(CacheChoice("mag_cache"))


def test_ratios_go_to_the_cache_folder_when_the_checkpoint_folder_takes_no_file(pipe, tmp_path):
    (tmp_path / "not-a-folder").write_text("")
    checkpoint = tmp_path / "not-a-folder" / "ckpt"  # writing under it fails (even as root)
    caches = step_caches_for(pipe.transformer, checkpoint, tmp_path / "cache")
    written = caches.mag_ratios.save([1.0, 0.9], {"num_inference_steps": 2})
    assert written is not None and written.parent.parent == tmp_path / "cache" / "video"
    assert step_caches_for(pipe.transformer, checkpoint,
                           tmp_path / "cache").mag_ratios.ratios == [1.0, 0.9]


@pytest.mark.parametrize("backend, threshold, words", [
    ("teacache", None, ["CreateVideo.cache_backend: 'teacache'", "mag_cache"]),
    ("mag_cache", -1.0, ["CreateVideo.cache_threshold: -1.0 is negative"]),
])
def test_an_unknown_backend_or_negative_threshold_is_refused_naming_the_field(
        pipe, tmp_path, backend, threshold, words):
    driver = make_driver(pipe, tmp_path)
    with pytest.raises(ValueError) as err:
        driver.begin(spec(backend, threshold))
    assert all(w in str(err.value) for w in words)


def test_the_server_default_applies_when_a_request_names_no_backend(pipe, tmp_path):
    caches = step_caches_for(pipe.transformer, tmp_path, tmp_path / "cache",
                             "first_block_cache", 10.0)
    driver = HeliosChunkDriver(pipe, max_sequence_length=TINY_MAX_SEQUENCE_LENGTH,
                               step_caches=caches)
    render = driver.begin(spec(""))
    assert render.cache == CacheChoice("first_block_cache", 10.0)
    assert driver.begin(spec("none")).cache == CacheChoice("none")
