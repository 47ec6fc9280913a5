"""Warm start: phase lines, the compile cache's folder and integrity checks, and graphs
captured in the background (ordering checked with a fake graph backend on the CPU)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import pytest
import torch

from voxline.engines.stage import StageWorker
from voxline.engines.stage_table import StageSlot
from voxline.kernels import compile_cache
from voxline.kernels.compile_cache import MARKER, open_compile_cache, settings_digest
from voxline.kernels.cuda_graphs import (
    BucketedSteps,
    GraphBackfill,
    StaticStep,
    bucket_for,
    first_keys,
    same_tail,
)
from voxline.logs import PHASE_PREFIX, phase

# ------------------------------------------------------------------------- phase lines


def test_phase_logs_its_name_and_seconds(caplog):
    log = logging.getLogger("test.phase")
    with caplog.at_level(logging.INFO, "test.phase"), phase(log, "load weights"):
        pass
    line = caplog.records[-1].getMessage()
    assert line.startswith(f"{PHASE_PREFIX}load weights: ") and line.endswith(" s")
    float(line.removeprefix(f"{PHASE_PREFIX}load weights: ").removesuffix(" s"))


def test_phase_that_raises_logs_nothing(caplog):
    log = logging.getLogger("test.phase")
    with caplog.at_level(logging.INFO, "test.phase"), pytest.raises(KeyError):
        with phase(log, "boom"):
            raise KeyError("x")
    assert not any(PHASE_PREFIX in r.getMessage() for r in caplog.records)


def test_load_models_logs_every_phase(caplog, tmp_path, monkeypatch):
    """The CPU default's load: each model and the warm-up get a phase line."""
    from voxline.config import load_settings
    from voxline.engines.factory import load_models

    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_FX_GRAPH_CACHE",
                "TORCHINDUCTOR_AUTOGRAD_CACHE"):
        monkeypatch.setenv(var, os.environ.get(var, ""))  # restored after the test
    with caplog.at_level(logging.INFO):
        load_models(load_settings(cache=tmp_path), max_slots=1)
    phases = [r.getMessage().removeprefix(PHASE_PREFIX).split(":")[0] for r in caplog.records
              if r.getMessage().startswith(PHASE_PREFIX)]
    for name in ("VAD load", "ASR load (cpu)", "LLM load (cpu)", "TTS load (cpu)", "warm-up"):
        assert name in phases, phases
    assert "compile" in os.environ["TORCHINDUCTOR_CACHE_DIR"]


# ------------------------------------------------------------------------ compile cache


def test_cache_folder_names_torch_version_gpu_and_digest(tmp_path):
    fields = {"tts_pdl": "auto", "llm_dtype": "bfloat16"}
    cache = open_compile_cache(tmp_path, fields, gpu="NVIDIA H100 80GB HBM3", apply=False)
    name = cache.path.name
    assert cache.path.parent == tmp_path / "compile"
    assert name.startswith(f"torch-{torch.__version__}-NVIDIA_H100_80GB_HBM3-")
    assert name.endswith(settings_digest(fields))
    assert settings_digest(fields) != settings_digest({**fields, "tts_pdl": "off"})
    assert cache.state == "new" and cache.path.is_dir()


def test_open_points_inductor_and_triton_into_the_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/elsewhere")
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    monkeypatch.setenv("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
    cache = open_compile_cache(tmp_path, {}, gpu="cpu")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache.path / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(cache.path / "triton")
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    assert inductor_config.fx_graph_cache and functorch_config.enable_autograd_cache


def _filled(tmp_path):
    cache = open_compile_cache(tmp_path, {"a": 1}, gpu="cpu", apply=False)
    entry = cache.path / "inductor" / "fxgraph" / "ab" / "entry"
    entry.parent.mkdir(parents=True)
    entry.write_bytes(b"compiled graph" * 100)
    other = cache.path / "triton" / "k" / "kernel.cubin"
    other.parent.mkdir(parents=True)
    other.write_bytes(b"cubin" * 50)
    assert cache.mark_good() == 2
    return cache, entry, other


def test_a_marked_cache_opens_warm(tmp_path):
    cache, entry, _ = _filled(tmp_path)
    again = open_compile_cache(tmp_path, {"a": 1}, gpu="cpu", apply=False)
    assert again.path == cache.path and again.state == "warm" and entry.exists()


def test_a_corrupt_entry_is_removed_with_a_warning_and_rebuilt(tmp_path, caplog):
    cache, entry, other = _filled(tmp_path)
    data = bytearray(entry.read_bytes())
    data[10] ^= 0xFF  # same size, other bytes
    entry.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, "voxline.kernels.compile_cache"):
        again = open_compile_cache(tmp_path, {"a": 1}, gpu="cpu", apply=False)
    assert again.state == "repaired"
    assert not entry.exists() and other.exists()  # only the bad entry goes
    assert any("corrupt" in r.getMessage() and "entry" in r.getMessage() for r in caplog.records)
    # the start compiles it again and marks the folder good
    entry.write_bytes(b"compiled graph" * 100)
    again.mark_good()
    assert open_compile_cache(tmp_path, {"a": 1}, gpu="cpu", apply=False).state == "warm"


def test_a_truncated_or_missing_entry_is_caught(tmp_path):
    _, entry, other = _filled(tmp_path)
    entry.write_bytes(b"short")
    other.unlink()
    again = open_compile_cache(tmp_path, {"a": 1}, gpu="cpu", apply=False)
    assert again.state == "repaired" and not entry.exists()


@pytest.mark.parametrize("marker", ["{not json", json.dumps({"files": []}), ""])
def test_an_unreadable_marker_rebuilds_the_whole_cache(tmp_path, caplog, marker):
    cache, entry, other = _filled(tmp_path)
    (cache.path / MARKER).write_text(marker)
    with caplog.at_level(logging.WARNING, "voxline.kernels.compile_cache"):
        again = open_compile_cache(tmp_path, {"a": 1}, gpu="cpu", apply=False)
    assert again.state == "rebuilt" and again.path.is_dir()
    assert not entry.exists() and not other.exists()
    assert any("stale or corrupt" in r.getMessage() for r in caplog.records)


def test_a_cache_of_another_version_is_stale(tmp_path, monkeypatch):
    cache, entry, _ = _filled(tmp_path)
    recorded = json.loads((cache.path / MARKER).read_text())
    (cache.path / MARKER).write_text(json.dumps({**recorded, "triton": "0.0"}))
    again = open_compile_cache(tmp_path, {"a": 1}, gpu="cpu", apply=False)
    assert again.state == "rebuilt" and not entry.exists()


def test_files_added_after_the_mark_are_kept(tmp_path):
    cache, _, _ = _filled(tmp_path)
    (cache.path / "inductor" / "new").write_bytes(b"later shape")
    again = open_compile_cache(tmp_path, {"a": 1}, gpu="cpu", apply=False)
    assert again.state == "warm" and (cache.path / "inductor" / "new").exists()


def test_marking_ignores_locks_and_writes_in_progress(tmp_path):
    cache, _, _ = _filled(tmp_path)
    (cache.path / "inductor" / "x.lock").write_text("")
    tmp = cache.path / "triton" / "tmp.pid_1_abc"
    tmp.mkdir()
    (tmp / "kernel.json").write_text("{}")
    assert cache.mark_good() == 2
    assert compile_cache.check(cache.path, cache.versions) == (None, [])


# --------------------------------------------------------- graphs in the background


class FakeGraphs:
    """A fake CUDA-graph backend: records captures and replays, and fails if a capture
    starts while a replay of the same steps runs (or the other way round)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []
        self.replaying = threading.Event()
        self.capturing = threading.Event()
        self.overlaps = 0

    def steps(self, name: str = "steps", **kwargs: object) -> BucketedSteps:
        graphs = self

        class FakeStep(StaticStep):
            def __init__(self, key: object) -> None:
                super().__init__(lambda: {}, {})
                self.key = key

            def capture(self, *args: object, **kw: object) -> None:
                if graphs.replaying.is_set():
                    graphs.overlaps += 1
                graphs.capturing.set()
                time.sleep(0.005)
                graphs.events.append(("capture", self.key))
                self.graph = object()  # type: ignore[assignment]
                graphs.capturing.clear()

            def __call__(self) -> dict:
                if graphs.capturing.is_set():
                    graphs.overlaps += 1
                graphs.replaying.set()
                time.sleep(0.002)
                graphs.events.append(("replay", self.key))
                graphs.replaying.clear()
                return {}

        steps: BucketedSteps = BucketedSteps(FakeStep, capture=False, name=name, **kwargs)
        steps.capture = True
        steps._capture = lambda step: step.capture()  # type: ignore[method-assign]
        return steps


def test_first_keys_are_those_covering_the_rest_and_the_cheapest():
    grid = [(b, n) for b in (1, 4, 16) for n in (64, 128, 256)]
    assert set(first_keys(grid)) == {(16, 256), (1, 64)}
    exact = [(b, t) for b in (1, 4, 16) for t in (1, 2, 4)]
    assert set(first_keys(exact, same_tail)) == {(16, 1), (16, 2), (16, 4), (1, 1), (1, 2), (1, 4)}


def test_prepare_with_a_backfill_captures_the_first_keys_and_pads_up_meanwhile():
    fake = FakeGraphs()
    steps = fake.steps()
    backfill = GraphBackfill("tts")
    grid = [(b, n) for b in (1, 4, 16) for n in (64, 256)]
    steps.prepare(grid, backfill=backfill)
    assert {k for _, k in fake.events} == {(16, 256), (1, 64)}
    assert len(backfill) == 4
    # not captured yet: padded up to the smallest captured bucket that holds it
    assert steps.ready((4, 64)) == (16, 256)
    assert steps.ready((1, 64)) == (1, 64)
    assert steps.ready((4, 256)) == (16, 256)
    assert not backfill.step() or len(backfill) == 3
    first = fake.events[-1][1]
    assert first == (16, 64)  # largest first
    assert steps.ready((4, 64)) == (16, 64)  # a closer fit once it is in
    backfill.run_all()
    assert len(backfill) == 0 and not steps.deferred
    assert steps.ready((4, 64)) == (4, 64)
    assert len([e for e in fake.events if e[0] == "capture"]) == len(grid)


def test_a_key_nothing_captured_covers_is_captured_on_demand():
    fake = FakeGraphs()
    steps = fake.steps(fits=same_tail)
    backfill = GraphBackfill("tts")
    steps.prepare([(1, 1), (2, 1), (4, 1), (2, 2), (4, 2)], backfill=backfill)
    assert {k for _, k in fake.events} == {(4, 1), (4, 2), (1, 1), (2, 2)}
    assert steps.ready((2, 1)) == (4, 1)  # deferred: the frames part must match exactly
    steps.deferred.add((8, 1))  # deferred, and no captured bucket holds it
    assert steps.ready((8, 1)) == (8, 1) and (8, 1) not in steps.deferred
    steps.get((8, 1))
    assert fake.events[-1] == ("capture", (8, 1))
    assert steps.ready((2, 3)) == (2, 3)  # not a bucket at all: get() makes it


def test_background_graphs_off_captures_everything_before_ready():
    fake = FakeGraphs()
    steps = fake.steps()
    grid = [(b, n) for b in (1, 4, 16) for n in (64, 256)]
    steps.prepare(grid)
    assert len(fake.events) == len(grid) and not steps.deferred
    assert steps.ready((4, 64)) == (4, 64)


class ReplayStage:
    """A stage whose plans replay buckets of `steps` (in the bucket `ready` names)."""

    def __init__(self, steps: BucketedSteps, plans: list[tuple[int, int]]) -> None:
        self.steps = steps
        self.plans = list(plans)
        self.ran: list[tuple[tuple[int, int], tuple[int, int]]] = []

    def has_work(self) -> bool:
        return bool(self.plans)

    def schedule(self) -> tuple[int, int] | None:
        return self.plans.pop(0) if self.plans else None

    def execute(self, plan: tuple[int, int]) -> tuple[int, int]:
        bucket = (bucket_for(plan[0], (1, 2, 4, 8, 16)), bucket_for(plan[1], (64, 128, 256)))
        key = self.steps.ready(bucket)
        self.steps.get(key)()
        self.ran.append((plan, key))
        return key

    def update(self, plan: object, result: object) -> object:
        return result


def test_the_worker_captures_between_plans_never_during_one():
    fake = FakeGraphs()
    steps = fake.steps()
    backfill = GraphBackfill("tts")
    grid = [(b, n) for b in (1, 2, 4, 8, 16) for n in (64, 128, 256)]
    steps.prepare(grid, backfill=backfill)
    done = []
    backfill.on_done.append(lambda: done.append(True))
    stage = ReplayStage(steps, [(3, 100), (1, 64), (5, 200), (2, 64)] * 5)
    woke = threading.Event()
    worker = StageWorker(stage, woke.set, "test-worker", backfill=backfill)
    slot = StageSlot("tts", stage, worker, route=lambda *a: None, fail=lambda *a: None)
    deadline = time.monotonic() + 30
    while (stage.has_work() or len(backfill) or not worker.idle or worker.backfill_due()
           or not done) and time.monotonic() < deadline:
        woke.clear()
        slot.collect()
        slot.start()
        if not slot.has_work():
            woke.wait(0.05)
    worker.close()
    assert done and fake.overlaps == 0
    assert not steps.deferred and len(steps.steps) == len(grid)
    for plan, key in stage.ran:  # every plan ran in a bucket that holds it
        assert key[0] >= plan[0] and key[1] >= plan[1]
    # the first plans ran padded up before their own buckets were in
    assert stage.ran[0] == ((3, 100), (16, 256))


def test_a_plan_submitted_during_a_capture_waits_for_it():
    fake = FakeGraphs()
    steps = fake.steps()
    backfill = GraphBackfill("asr")
    steps.prepare([(1, 64), (2, 64), (4, 64)], backfill=backfill)
    stage = ReplayStage(steps, [])
    worker = StageWorker(stage, lambda: None, "test-worker", backfill=backfill)
    assert worker.start_background()
    stage.plans.append((2, 64))
    assert worker.start() == (2, 64)
    while worker.collect() is None:
        time.sleep(0.01)
    worker.close()
    kinds = [e[0] for e in fake.events]
    assert kinds[-2:] == ["capture", "replay"] and fake.overlaps == 0


def test_a_failed_background_capture_stops_the_backfill_with_a_warning(caplog):
    backfill = GraphBackfill("tts")
    fake = FakeGraphs()
    steps = fake.steps()
    steps.prepare([(1, 64), (2, 64), (4, 64)], backfill=backfill)

    def boom(step: StaticStep) -> None:
        raise RuntimeError("capture failed")

    steps._capture = boom  # type: ignore[method-assign]
    worker = StageWorker(ReplayStage(steps, []), lambda: None, "test-worker", backfill=backfill)
    with caplog.at_level(logging.WARNING, "voxline.engines.stage"):
        assert worker.start_background()
        while worker._background is not None and not worker._background.done():
            time.sleep(0.01)
        assert not worker.backfill_due()
    worker.close()
    assert steps.ready((2, 64)) == (4, 64)  # requests keep padding up
    assert any("deferred graph capture failed" in r.getMessage() for r in caplog.records)


def test_an_inline_worker_refuses_a_backfill():
    backfill = GraphBackfill("vad")
    steps = FakeGraphs().steps()
    steps.prepare([(1, 1), (2, 1), (4, 1)], backfill=backfill)
    with pytest.raises(ValueError, match="worker thread"):
        StageWorker(ReplayStage(steps, []), lambda: None, None, backfill=backfill)


def test_background_graphs_off_is_refused_without_a_graphed_model_on_cuda():
    from voxline.config import load_settings
    from voxline.engines.factory import check_background_graphs

    with pytest.raises(ValueError, match="background_graphs=off"):
        check_background_graphs(load_settings(background_graphs="off"))
    check_background_graphs(load_settings())


# --------------------------------------------- the real models, padded up (eager twin)


def test_qwen3_steps_padded_up_to_covering_buckets_speak_the_same(tmp_path, one_torch_thread):
    """Qwen3-TTS with only the covering buckets made (the rest deferred): every step runs
    padded up, and the greedy audio is the plain generator's."""
    from test_qwen3_tts_graphs import _assert_same, _by_job, _jobs
    from test_qwen3_tts_stage import make_stage, run, write_test_checkpoint

    model_dir = write_test_checkpoint(tmp_path / "model")
    plain = run(make_stage(model_dir, graphs=False), _jobs())
    stage = make_stage(model_dir, graphs=True, batch_buckets=[1, 2, 4])
    backfill = GraphBackfill("tts")
    stage.generator.prepare(backfill=backfill)  # on the CPU: eager steps, no capture
    stage.codec.prepare(backfill=backfill)
    made = {name: set(steps.steps) for name, steps in (
        ("decode", stage.generator.decode_steps), ("prefill", stage.generator.prefill_steps),
        ("codec", stage.codec.steps))}
    assert len(backfill) > 0
    padded = run(stage, _jobs())
    _assert_same(_by_job(plain), _by_job(padded))
    # no deferred bucket was made by the requests: they ran in the covering ones
    assert set(stage.generator.decode_steps.steps) == made["decode"]
    assert set(stage.generator.prefill_steps.steps) == made["prefill"]
    assert set(stage.codec.steps.steps) == made["codec"]
    assert stage.generator.decode_steps.deferred  # e.g. batch 2: run padded up to 4


class CountingBackfill:
    """A model's deferred captures as the engine sees them: units and the threads they ran on."""

    def __init__(self, units: int) -> None:
        self.left = units
        self.threads: list[str] = []

    def __len__(self) -> int:
        return self.left

    def step(self) -> bool:
        self.threads.append(threading.current_thread().name)
        self.left -= 1
        return self.left > 0


def test_the_engine_core_runs_each_stage_backfill_on_its_worker_thread():
    from core_driver import CoreDriver
    from fakes import CountingLM, EnergyVAD, FixedASR, ToneTTS

    from voxline.engines.core import EngineCore, Models
    from voxline.engines.speech_model import SentenceSpeechModel

    tts, asr = CountingBackfill(3), CountingBackfill(2)
    driver = CoreDriver()
    driver.core = EngineCore(Models(EnergyVAD(), FixedASR("hi"), CountingLM(),
                                    SentenceSpeechModel(ToneTTS()),
                                    backfills={"tts": tts, "asr": asr}), driver.woke.set)
    try:
        driver.run_until(lambda _: not len(tts) and not len(asr))
    finally:
        driver.close()
    assert tts.threads and all(t.startswith("voxline-tts") for t in tts.threads)
    assert asr.threads and all(t.startswith("voxline-asr") for t in asr.threads)
    assert len(tts.threads) == 3 and len(asr.threads) == 2


def _in_other_thread(fn) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()

    def run() -> None:
        fn()
        done.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, done


def test_a_drawing_graphs_replay_waits_for_a_capture_in_another_thread():
    """A background capture puts the default CUDA generator in capture mode; a graph that
    draws on it (the LLM's pick_rows) must not replay meanwhile, one that does not may."""
    from types import SimpleNamespace

    from voxline.kernels.cuda_graphs import DEFAULT_RNG_LOCK, StaticStep, default_rng_draw

    replays: list[str] = []
    drawing = StaticStep(lambda: {}, {}, draws=True)
    drawing.graph = SimpleNamespace(replay=lambda: replays.append("drawing"))
    plain = StaticStep(lambda: {}, {})
    plain.graph = SimpleNamespace(replay=lambda: replays.append("plain"))

    def cpu_draw() -> None:
        with default_rng_draw("cpu"):  # off CUDA there is no capture to wait for
            replays.append("cpu draw")

    with DEFAULT_RNG_LOCK:  # a capture in progress in this thread
        waiting, replayed = _in_other_thread(drawing)
        for fn in (plain, cpu_draw):
            thread, done = _in_other_thread(fn)
            assert done.wait(30)
        assert not replayed.is_set() and replays == ["plain", "cpu draw"]
        with default_rng_draw("cuda"):  # reentrant: a draw inside the capture's own thread
            pass
    waiting.join(30)
    assert replays == ["plain", "cpu draw", "drawing"]
