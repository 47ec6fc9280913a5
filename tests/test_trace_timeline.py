"""`trace.timeline`: the turn milestones read back from trace lines."""

from __future__ import annotations

from voxline.engines.trace import timeline


def test_turns_count_whether_their_audio_came_before_or_after_the_stop():
    lines = [
        "t=1000.0 stream=1 speech_ended",
        "t=1010.0 stream=1 asr_start kind=partial",  # partials are not milestones
        "t=1030.0 stream=1 asr_start kind=take",
        "t=1100.0 stream=1 asr_landed model_ms=70 kind=take",
        "t=1300.0 stream=1 first_delta prompt=40 cached=30 tokens=1 llm_ms=120",
        "t=1400.0 stream=1 first_audio held=True step_ms=30",  # ready before the stop
        "t=1440.0 stream=1 turn_stopped",
        "t=2000.0 stream=2 speech_ended",
        "t=2440.0 stream=2 turn_stopped",
        "t=2600.0 stream=2 first_audio held=False step_ms=50",  # 160 ms after the stop
        "t=3000.0 stream=3 speech_ended",  # never spoke: not counted
        "not a trace line",
    ]
    out = timeline(lines)
    assert out.splitlines()[0].startswith("trace: median of 2 turns")
    assert "asr_start                30   (p95 30, n=1)" in out
    assert "turn_stopped            440" in out
    assert "first_audio - turn_stopped     60   (p95 150; 1 of 2 ready by the stop)" in out
    assert "first_delta.llm_ms      120" in out
    assert "first_audio.step_ms      40" in out  # the TTS step that made the first audio
    assert timeline(["t=1.0 stream=1 speech_ended"]) == "trace: no turn reached its first audio"
