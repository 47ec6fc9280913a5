"""Step scheduling for arrivals (qwen3_tts/scheduling.py): the policy's decisions on a fake
clock, and the speech model under it on the tiny random checkpoint (the graphed path's
eager twin, with batch buckets): who steps, when first audio and chunks leave, and that
scheduling never changes what a job says (same codes per job as an unscheduled run with
the same seeds). The open-loop benchmark's client accounting is checked here too.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from test_qwen3_tts_stage import TEXTS, audio, make_stage, of, run, write_test_checkpoint

from voxline.bench_arrivals import SCHEDULES as BENCH_SCHEDULES
from voxline.bench_arrivals import Listener, poisson_arrivals
from voxline.engines.models.qwen3_tts import TalkerSampling
from voxline.engines.models.qwen3_tts.scheduling import (
    FIFO,
    PLAYOUT,
    SCHEDULES,
    StepPolicy,
    StepScheduler,
    fit_to_bucket,
)
from voxline.engines.speech_model import SpeechJob

pytestmark = pytest.mark.usefixtures("one_torch_thread")

INF = math.inf


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_test_checkpoint(tmp_path_factory.mktemp("qwen3-arrivals") / "model")


# --------------------------------------------------------------------------- the policy


def test_fit_to_bucket_trims_only_an_overflow_that_is_far_enough_ahead():
    far, near = 5.0, 0.1
    assert fit_to_bucket([far] * 5, [2, 4, 8], min_ahead=0.0) == [0, 1, 2, 3, 4]  # off
    assert fit_to_bucket([far] * 5, None, min_ahead=1.0) == [0, 1, 2, 3, 4]  # no buckets
    assert fit_to_bucket([far] * 4, [2, 4, 8], min_ahead=1.0) == [0, 1, 2, 3]  # fills its bucket
    # 5 streams would replay bucket 8: the furthest ahead waits and bucket 4 replays.
    assert fit_to_bucket([near, far, 2.0, -INF, 3.0], [2, 4, 8], 1.0) == [0, 2, 3, 4]
    # ...unless a stream beyond bucket 4 is itself short of audio.
    assert fit_to_bucket([near, near, near, near, near], [2, 4, 8], 1.0) == [0, 1, 2, 3, 4]
    assert fit_to_bucket([far, 0.5, near, near, near, near], [4, 8], 1.0) == [0, 1, 2, 3, 4, 5]
    # Never emptier than the next smaller bucket, even when everyone is far ahead...
    assert fit_to_bucket([far] * 6, [4, 8], 1.0) == [0, 1, 2, 3]
    # ...and only while the overflow is smaller than the bigger bucket's padding.
    assert fit_to_bucket([far] * 7, [4, 8], 1.0) == [0, 1, 2, 3, 4, 5, 6]
    # Past the largest bucket: the largest bucket's worth, if the rest can wait.
    assert fit_to_bucket([far, near, far, near, near], [4], 1.0) == [0, 1, 3, 4]
    # Below the smallest bucket nothing can be trimmed.
    assert fit_to_bucket([far], [2, 4], 1.0) == [0]
    # Equal buffers: ties go to the earlier stream, deterministically.
    assert fit_to_bucket([far] * 3, [2, 4], 1.0) == [0, 1]


def test_playout_buffer_is_what_a_listener_has_left():
    clock = FakeClock()
    s = StepScheduler(StepPolicy(flush_below_s=0.25), clock)
    assert s.ahead(1, 0.0) == -INF and s.low(1, 0.0)  # no audio yet: most urgent
    s.sent(1, 1.0, now=10.0)
    assert s.ahead(1, 10.5) == pytest.approx(0.5)
    s.sent(1, 0.5, now=10.5)  # queued behind what is still playing
    assert s.ahead(1, 10.5) == pytest.approx(1.0)
    assert not s.low(1, 11.0) and s.low(1, 11.3)
    assert s.ahead(1, 12.0) == pytest.approx(-0.5)  # ran out: the listener waits
    s.sent(1, 0.2, now=12.0)  # playout resumes when the chunk comes
    assert s.ahead(1, 12.0) == pytest.approx(0.2)
    s.sent(1, 0.0, now=12.0)
    assert s.ahead(1, 12.0) == pytest.approx(0.2)
    s.forget(1)
    assert s.ahead(1, 12.0) == -INF
    assert not StepScheduler(FIFO).low(1, 0.0)  # no flush rule: never low


def test_the_scheduler_notes_gaps_in_the_audio_it_sent_and_their_text_waits():
    s = StepScheduler(FIFO)
    assert s.load_note() is None
    s.sent(1, 0.2, now=10.0)  # first audio: nothing ran out before it
    s.sent(1, 0.2, now=10.25)  # 50 ms late: under the threshold
    s.stepped()
    s.waits_for_text(1)
    s.sent(1, 0.2, now=10.7)  # 250 ms late (it ran out at 10.45), after a wait for text
    s.sent(2, 0.1, now=10.0)
    s.sent(2, 0.1, now=10.5)  # 400 ms late, no wait for text
    note = s.load_note()
    assert note == ("2 gaps in sent audio, max 400 ms, 1 after a wait for text, 1 steps apart "
                    "(p50; max 1)")
    assert s.load_note() is None  # reset
    s.waits_for_text(1)
    s.sent(1, 0.1, now=10.95)  # 50 ms late: the wait is cleared with no gap noted
    s.sent(1, 0.1, now=11.3)  # 250 ms late
    assert s.load_note() == ("1 gaps in sent audio, max 250 ms, 0 after a wait for text, 0 steps "
                             "apart (p50; max 0)")


def test_admissions_and_policy_checks():
    assert StepScheduler(FIFO).admissions(5) == 5
    assert StepScheduler(StepPolicy(max_prefills=2)).admissions(5) == 2
    assert StepScheduler(StepPolicy(max_prefills=2)).admissions(1) == 1
    assert StepScheduler(StepPolicy(max_prefills=2)).admissions(0) == 0
    with pytest.raises(ValueError, match="StepPolicy"):
        StepPolicy(fit_ahead_s=-1)
    assert FIFO == StepPolicy() and PLAYOUT.fit_ahead_s > 0 and PLAYOUT.flush_below_s > 0


def test_batch_reads_each_jobs_buffer_on_the_clock():
    clock = FakeClock(0.0)
    s = StepScheduler(StepPolicy(fit_ahead_s=1.0), clock)
    for job_id, seconds in ((1, 3.0), (2, 0.2), (3, 2.0)):
        s.sent(job_id, seconds, now=0.0)
    assert s.batch([1, 2, 3], [2, 4], now=0.0) == [1, 2]  # job 1 (3 s ahead) waits
    assert s.batch([1, 2, 3], [2, 4], now=2.5) == [0, 1, 2]  # job 1 is down to 0.5 s


# --------------------------------------------------------------------------- the speech model


def _stage(model_dir: Path, policy: StepPolicy, clock: FakeClock, **kw):
    args = dict(graphs=True, batch_buckets=[1, 2, 4], initial_chunk_frames=1, chunk_frames=4,
                max_frames=16, schedule=policy, clock=clock)
    args.update(kw)
    return make_stage(model_dir, **args)


def _spy_steps(stage) -> list[list[int]]:
    """The job ids of every generator step, in order."""
    calls: list[list[int]] = []
    step = stage.generator.step

    def spied(streams):
        calls.append([s.stream_id for s in streams])
        return step(streams)

    stage.generator.step = spied
    return calls


def _record_codes(stage) -> dict[int, list[list[int]]]:
    """Every frame's codes per job, as the generator makes them."""
    codes: dict[int, list[list[int]]] = {}
    step = stage.generator.step

    def recorded(streams):
        results = step(streams)
        for r in results:
            if r.frame is not None:
                codes.setdefault(r.stream.stream_id, []).append(r.frame.tolist())
        return results

    stage.generator.step = recorded
    return codes


def _first_steps(outs) -> dict[int, int]:
    first: dict[int, int] = {}
    for i, o in outs:
        if len(o.audio):
            first.setdefault(o.job_id, i)
    return first


def test_max_prefills_admits_one_new_stream_per_step(model_dir):
    jobs = {0: [SpeechJob(i, TEXTS[1]) for i in (1, 2, 3)]}
    assert set(_first_steps(run(_stage(model_dir, FIFO, FakeClock()), jobs)).values()) == {1}
    one = _stage(model_dir, StepPolicy(max_prefills=1), FakeClock())
    assert _first_steps(run(one, jobs)) == {1: 1, 2: 2, 3: 3}


def test_first_frame_with_prefill_sends_first_audio_in_the_admission_step(model_dir):
    jobs = {0: [SpeechJob(1, TEXTS[1])], 3: [SpeechJob(2, TEXTS[3])]}
    assert _first_steps(run(_stage(model_dir, FIFO, FakeClock()), jobs)) == {1: 1, 2: 4}
    policy = StepPolicy(first_frame_with_prefill=True)
    assert _first_steps(run(_stage(model_dir, policy, FakeClock()), jobs)) == {1: 0, 2: 3}


def test_far_ahead_streams_wait_rather_than_push_the_batch_into_a_bigger_bucket(model_dir):
    # A frozen clock: every stream keeps all the audio it was sent, so all are far ahead.
    stage = _stage(model_dir, StepPolicy(fit_ahead_s=1e-4), FakeClock(), max_frames=24)
    calls = _spy_steps(stage)
    outs = run(stage, {0: [SpeechJob(i, TEXTS[1]) for i in (1, 2, 3)]})
    running = [c for c in calls[2:] if len(c) > 1]  # after the prefill and the first frames
    assert running and all(len(c) == 2 for c in running), "bucket 2 replays, not bucket 4"
    for job_id in (1, 2, 3):  # nobody starves: each speaks its whole reply
        assert of(outs, job_id)[-1].finished
        assert len(audio(of(outs, job_id))) == 24 * stage.samples_per_frame


def test_nobody_waits_a_step_while_a_job_waits_for_a_talker_slot(model_dir):
    """Trimming holds slots longer: with a job queued for a slot every stream steps."""
    def calls(n_jobs: int) -> list[list[int]]:
        stage = _stage(model_dir, StepPolicy(fit_ahead_s=1e-4), FakeClock(), max_frames=24,
                       max_streams=3, batch_buckets=[1, 2])
        calls = _spy_steps(stage)
        run(stage, {0: [SpeechJob(i, TEXTS[1]) for i in range(1, n_jobs + 1)]})
        return calls

    alone = calls(3)
    assert any(len(c) == 2 for c in alone[2:]), "no job waiting: bucket 2 replays"
    queued = calls(4)
    admitted = queued.index(next(c for c in queued if 4 in c))
    assert admitted > 3 and all(len(c) == 3 for c in queued[2:admitted]), "job 4 waited: no trims"


def test_a_stream_low_on_audio_has_its_frames_decoded_at_once(model_dir):
    stage = _stage(model_dir, StepPolicy(flush_below_s=1e3), FakeClock())  # always low
    got = of(run(stage, {0: [SpeechJob(1, TEXTS[1])]}), 1)
    assert [len(o.audio) // stage.samples_per_frame for o in got] == [1] * 16
    fifo = of(run(_stage(model_dir, FIFO, FakeClock()), {0: [SpeechJob(1, TEXTS[1])]}), 1)
    assert [len(o.audio) // stage.samples_per_frame for o in fifo] == [1, 4, 4, 4, 3]
    np.testing.assert_allclose(audio(got), audio(fifo), atol=1e-4)


def test_with_overlap_a_low_stream_gets_each_chunk_in_the_step_that_made_it(model_dir):
    """Overlapped code2wav decodes later chunks at the next step's start, so a stream's
    second chunk would leave two steps after its first, with 80 ms of audio to cover
    them: a stream short of audio has its chunk decoded right after its frame's step."""
    low = run(_stage(model_dir, StepPolicy(flush_below_s=1e3), FakeClock(), overlap_codec=True),
              {0: [SpeechJob(1, TEXTS[1])]})
    steps = [i for i, o in low if o.job_id == 1 and len(o.audio)]
    assert steps == list(range(steps[0], steps[0] + len(steps)))  # a chunk every step
    fifo = run(_stage(model_dir, FIFO, FakeClock(), overlap_codec=True), {0: [SpeechJob(1, TEXTS[1])]})
    first, second = [i for i, o in fifo if len(o.audio)][:2]
    assert second - first > 1  # not low: the next chunk waits for its next step's start
    np.testing.assert_allclose(audio(of(low, 1)), audio(of(fifo, 1)), atol=1e-4)


class _StepClock(FakeClock):
    """Moves on a fixed amount per reading: buffers drain as steps go by."""

    def __init__(self, dt: float) -> None:
        super().__init__()
        self.dt = dt

    def __call__(self) -> float:
        self.now += self.dt
        return self.now


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_scheduling_never_changes_what_a_job_says(model_dir, sampled):
    """Joins at different steps, more jobs than slots, codec EOS and the frame limit: under
    every policy knob at once, each job has the same codes (and audio) as under FIFO."""
    kw = dict(max_frames=24, max_streams=4)
    if sampled:
        kw.update(sampling=None, temperature=0.9, top_k=50)
    jobs = {0: [SpeechJob(1, TEXTS[1], seed=11), SpeechJob(2, TEXTS[3], seed=12),
                SpeechJob(3, TEXTS[0], seed=13)],
            2: [SpeechJob(4, TEXTS[2], seed=14)], 3: [SpeechJob(5, TEXTS[1], seed=15)]}
    runs = {}
    for name, policy, clock, ramp in (
        ("fifo", FIFO, FakeClock(), False),
        ("all", StepPolicy(max_prefills=1, fit_ahead_s=2e-4, flush_below_s=5e-4,
                           first_frame_with_prefill=True), _StepClock(1e-4), True),
    ):
        stage = _stage(model_dir, policy, clock, ramp=ramp, **kw)
        calls = _spy_steps(stage)
        codes = _record_codes(stage)
        outs = run(stage, jobs)
        runs[name] = (codes, outs, calls, stage)
    (fifo_codes, fifo_outs, fifo_calls, _), (codes, outs, calls, stage) = runs["fifo"], runs["all"]
    assert fifo_codes == codes and set(codes) == {1, 2, 3, 4, 5}
    assert len({len(c) for c in codes.values()}) > 1, "jobs of different lengths"
    for job_id in codes:
        np.testing.assert_allclose(audio(of(outs, job_id)), audio(of(fifo_outs, job_id)), atol=1e-4)
        assert of(outs, job_id)[-1].finished
    # The schedule did move things: chunk sizes, steps, who stepped together.
    sizes = {tuple(len(o.audio) for o in of(o_, 1)) for o_ in (outs, fifo_outs)}
    assert len(sizes) == 2 and fifo_calls != calls
    assert not stage.has_work() and stage.scheduler._until == {}


def test_streamed_text_says_the_same_under_the_playout_schedule(model_dir):
    """One reply fed clause by clause (its stream waits for text between them), beside a
    plain job: the same codes and audio under every knob as under FIFO."""
    feeds = {2: "the quick brown fox", 6: "jumps over the lazy dog.", 9: None}
    results = []
    for policy, clock, ramp in ((FIFO, FakeClock(), False),
                                (StepPolicy(max_prefills=1, fit_ahead_s=2e-4, flush_below_s=5e-4,
                                            first_frame_with_prefill=True), _StepClock(1e-4), True)):
        stage = _stage(model_dir, policy, clock, ramp=ramp, max_frames=120, max_len=512,
                       sampling=TalkerSampling.greedy(min_frames=30))
        codes = _record_codes(stage)
        stage.start(SpeechJob(1, "Hello there,", more_text=True))
        stage.start(SpeechJob(2, TEXTS[3]))
        outs = []
        for i in range(400):
            text = feeds.get(i, "")
            if text is None:
                stage.end_text(1)
            elif text:
                stage.append_text(1, text)
            if i > max(feeds) and not stage.has_work():
                break
            if stage.has_work():
                outs += [(i, o) for o in stage.step()]
        results.append((codes, outs))
    (a, outs_a), (b, outs_b) = results
    assert a == b and set(a) == {1, 2}
    for job_id in (1, 2):
        np.testing.assert_allclose(audio(of(outs_b, job_id)), audio(of(outs_a, job_id)), atol=1e-4)
        assert of(outs_b, job_id)[-1].finished
        assert " ".join(o.text for o in of(outs_b, job_id) if o.text) == \
            " ".join(o.text for o in of(outs_a, job_id) if o.text)


def test_the_engine_stage_runs_the_schedule_its_setting_names(model_dir):
    from voxline.config import load_settings
    from voxline.engines.factory import load_tts

    stage = load_tts(load_settings(tts=f"qwen3:{model_dir}"))
    assert stage.scheduler.policy == PLAYOUT and stage.ramp  # type: ignore[attr-defined]
    fifo = load_tts(load_settings(tts=f"qwen3:{model_dir}", tts_schedule="fifo"))
    assert fifo.scheduler.policy == FIFO and not fifo.ramp  # type: ignore[attr-defined]
    assert SCHEDULES == {"playout": (True, PLAYOUT), "fifo": (False, FIFO)}
    with pytest.raises(ValueError, match="tts_schedule"):
        load_settings(tts_schedule="lifo")


# --------------------------------------------------------------------------- the benchmark


def test_open_loop_listener_counts_underruns_as_a_client_hears_them():
    x = Listener(arrival=1.0)
    x.chunk(1.05, 0.08)  # first audio 50 ms after arrival; playout starts now
    x.chunk(1.10, 0.08)  # in time (plays until 1.13, then to 1.21)
    x.chunk(1.25, 0.32)  # 40 ms late: an underrun, playout resumes at 1.25
    x.chunk(1.50, 0.32)  # in time (until 1.57)
    assert x.first == pytest.approx(0.05)
    assert x.underruns == 1 and x.longest_wait == pytest.approx(0.04)
    assert x.until == pytest.approx(1.89)
    times = poisson_arrivals(10.0, 5.0, seed=3)
    assert times == poisson_arrivals(10.0, 5.0, seed=3) and all(0 <= t < 5 for t in times)
    assert 25 < len(times) < 80 and times == sorted(times)
    assert set(BENCH_SCHEDULES) >= {"fifo", "playout"}
    assert BENCH_SCHEDULES["playout"] == (True, PLAYOUT)
    assert dataclasses.asdict(BENCH_SCHEDULES["fifo"][1]) == dataclasses.asdict(FIFO)


@pytest.mark.slow
def test_open_loop_benchmark_runs_on_the_cpu(tmp_path):
    """The script end to end, run as a user runs it (a subprocess, not an import)."""
    import json
    import os
    import subprocess

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "open_loop.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "gpu_speech" / "bench_gpu_tts.py"),
         "--device", "cpu", "--tiny", "--arrivals", "3", "--frames", "8", "--window", "1",
         "--drain", "30", "--max-streams", "4", "--buckets", "2,4", "--max-len", "128",
         "--out", str(out)], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = report["open_loop"]
    assert [r["schedule"] for r in rows] == ["fifo", "playout"]
    for r in rows:
        assert r["jobs"] >= 1 and r["unfinished"] == 0 and r["no_audio"] == 0
        assert r["first_audio_ms_p50"] > 0 and r["first_audio_ms_p99"] >= r["first_audio_ms_p50"]
