"""`voxline bench` pieces added for GPU serving runs: sessions_held (the largest level
meeting the latency bar with no underruns or errors), a reply cut at max_output_tokens
counting as finished, and the session.update body."""

from voxline.bench import sessions_held
from voxline.bench_turns import capped, session_config


def level(c: int, p95: float | None, underruns: int = 0, ok: int | None = None) -> dict:
    return {"concurrency": c, "requests": c, "ok": c if ok is None else ok,
            "metrics": {"eos_to_first_audio_s": {"p95": p95}},
            "results": [{"underruns": underruns}] + [{"underruns": 0}] * (c - 1)}


def test_sessions_held_is_the_largest_level_meeting_the_bar():
    levels = [level(1, 0.01), level(8, 0.22), level(32, 0.2, underruns=1), level(64, 3.5)]
    assert sessions_held(levels) == 8


def test_sessions_held_needs_every_request_ok_and_a_measured_p95():
    assert sessions_held([level(4, 0.1, ok=3), level(8, None)]) is None
    assert sessions_held([{"concurrency": None, "requests": 4, "ok": 4, "results": [],
                           "metrics": {"eos_to_first_audio_s": {"p95": 0.1}}}]) is None


def test_a_reply_cut_at_max_output_tokens_is_finished():
    assert capped({"status": "incomplete", "status_details": {"reason": "max_output_tokens"}})
    assert not capped({"status": "incomplete", "status_details": {"reason": "content_filter"}})
    assert not capped({"status": "cancelled"})


def test_session_config_caps_the_reply_only_when_asked():
    assert "max_output_tokens" not in session_config(None, None)
    body = session_config({"type": "server_vad"}, 12)
    assert body["max_output_tokens"] == 12
    assert body["audio"]["input"]["turn_detection"] == {"type": "server_vad"}
