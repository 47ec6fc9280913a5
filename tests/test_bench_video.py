"""Peer-side video measures (`voxline.bench_video`) on synthetic arrival times."""

import numpy as np
import pytest

from voxline.bench_video import (
    chunk_lateness,
    frame_measures,
    is_new,
    new_by_chunks,
    summarize_clips,
)

FPS = 24
P = 1 / FPS


def test_a_clip_on_time_has_no_stalls_freezes_or_jitter():
    arrivals = [10.0 + i * P for i in range(48)]
    m = frame_measures(arrivals, [True] * 48, FPS, requested_at=9.5)
    assert m["first_frame_ms"] == 500.0
    assert (m["stalls"], m["freezes"], m["held_frames"]) == (0, 0, 0)
    assert m["steady_fps"] == pytest.approx(24, abs=0.01)
    assert m["jitter_p99_ms"] == pytest.approx(0, abs=0.01)


def test_held_frames_delay_the_new_ones_into_stalls_and_a_freeze():
    # 10 new frames, then 6 held slots (the model behind), then 10 new: the track keeps
    # its rate, the picture stops for 7 periods and every later frame is late
    new = [True] * 10 + [False] * 6 + [True] * 10
    arrivals = [i * P for i in range(len(new))]
    m = frame_measures(arrivals, new, FPS, tolerance_s=0.05)
    assert (m["frames"], m["new_frames"], m["held_frames"]) == (26, 20, 6)
    assert m["stalls"] == 10 and m["freezes"] == 1
    assert m["worst_gap_ms"] == pytest.approx(7 * P * 1e3, abs=0.1)
    assert m["worst_late_ms"] == pytest.approx(6 * P * 1e3, abs=0.1)
    assert m["track_fps"] == pytest.approx(24, abs=0.01)
    assert m["steady_fps"] == pytest.approx(19 / (25 * P), abs=0.01)


def test_jitter_within_tolerance_is_not_a_stall():
    rng = np.random.default_rng(0)
    arrivals = [i * P + rng.uniform(0, 0.02) for i in range(100)]
    m = frame_measures(sorted(arrivals), [True] * 100, FPS, tolerance_s=0.05)
    assert m["stalls"] == 0 and m["freezes"] == 0
    assert 0 < m["jitter_p99_ms"] <= 20 + 1e-6


def test_chunk_events_after_their_frames_due_time_are_late():
    # 33 frames at t=0 play out by 1.375 s; the next 32 come at 2.0 s: 15 due before then
    on_time = chunk_lateness(0.0, [(0.0, 33), (1.0, 32), (2.0, 32)], FPS)
    assert on_time["late_frames"] == 0 and on_time["generated_fps"] == pytest.approx(32)
    behind = chunk_lateness(0.0, [(0.0, 33), (2.0, 32)], FPS, tolerance_s=0.0)
    assert behind["late_frames"] == sum(1 for i in range(33, 65) if i / FPS < 2.0)
    assert behind["worst_late_ms"] == pytest.approx((2.0 - 33 / FPS) * 1e3, abs=0.1)


def test_is_new_tells_a_held_frame_from_a_new_picture():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 255, (24, 40)).astype(np.uint8)
    assert is_new(None, a)
    refined = np.clip(a.astype(int) + rng.integers(-1, 2, a.shape), 0, 255)
    assert not is_new(a, refined)  # the codec re-encoding the held picture
    assert is_new(a, rng.integers(0, 255, a.shape))


def test_an_empty_clip_and_the_arm_summary():
    empty = frame_measures([], [], FPS)
    assert empty["frames"] == 0 and empty["steady_fps"] is None
    clip = frame_measures([i * P for i in range(10)], [True] * 10, FPS, requested_at=-1.0)
    s = summarize_clips([clip, clip])
    assert (s["clips"], s["frames"], s["stalls"]) == (2, 20, 0)
    assert s["first_frame_ms"]["p50"] == 1000.0
    with pytest.raises(ValueError):
        frame_measures([0.0], [], FPS)
    held = frame_measures([i * P for i in range(5)], [False] * 5, FPS)  # a clip cut short:
    assert (held["new_frames"], held["stalls"], held["worst_late_ms"]) == (0, 0, None)


def test_the_chunk_events_tell_which_frames_were_new():
    # 4 frames at 0.0, the next 4 at 0.3: slots every 0.1 s from 0.01 (after the event)
    arrivals = [0.01 + 0.1 * s for s in range(9)]
    new = new_by_chunks(arrivals, [(0.0, 4), (0.3, 4)])
    assert new == [True] * 8 + [False]
    late = new_by_chunks(arrivals, [(0.0, 4), (0.55, 4)])  # slots 4 and 5 held
    assert late == [True] * 4 + [False, False] + [True] * 3
    m = frame_measures(arrivals, late, 10, tolerance_s=0.0)
    assert (m["held_frames"], m["stalls"], m["freezes"]) == (2, 3, 1)


def test_the_track_logs_each_videos_held_frames(caplog):
    import logging

    from voxline.realtime.transports.video_track import VideoPlayout

    p = VideoPlayout()
    p.start("v1", fps=10)
    p.push("v1", np.zeros((2, 2, 2, 3), np.uint8))
    now = 0.0
    for _ in range(5):  # 2 frames, then the second held 3 times
        now = max(now, p.due(now))
        p.take(now)
    with caplog.at_level(logging.INFO, logger="voxline.realtime.transports.video_track"):
        p.end("v1", "cancelled")
    assert "video v1 played: 5 frames sent, 3 of them held" in caplog.text
