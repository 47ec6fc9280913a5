"""The units `Responses` composes, each alone: the book's held outputs, playout pacing,
truncation to what was heard. (Speculation, prompts and speech run through the engine in
test_speculation, test_engine_core and test_streaming_speech_responses.)"""

from __future__ import annotations

import pytest

from voxline.engines import protocol as p
from voxline.engines.conversation import AudioSpan, Conversation
from voxline.engines.input_audio import InputAudio
from voxline.engines.response_run import ResponseBook, ResponseRun, Speculative, new_chunker
from voxline.engines.speech_pacing import PlayoutPacing, VoiceReserve
from voxline.engines.streams import StreamState
from voxline.engines.truncation import truncate_to_heard


def _stream() -> StreamState:
    conversation = Conversation(lambda role, text, *a, **k: [ord(c) for c in text])
    return StreamState(1, "s1", p.StreamConfig(), conversation, InputAudio(None))


def _run() -> ResponseRun:
    return ResponseRun("r1", "i1", p.ResponseConfig(), None, new_chunker(), 1.0)


def test_the_book_holds_a_speculative_runs_outputs_and_emits_the_rest() -> None:
    out: list[p.EngineOutput] = []
    book = ResponseBook(out.append, lambda sid: None)
    run = _run()
    run.speculative = Speculative(user_item="u1", slot_tokens=0)
    delta = p.ReplyTextDelta("s1", "r1", "hi")
    book.send(run, delta)
    assert out == [] and run.speculative.held == [delta]
    run.speculative = None
    book.send(run, delta)
    book.error(_stream(), "no", p.ErrorCode.INVALID_VALUE)
    assert out[0] == delta and isinstance(out[1], p.StreamError)


def test_pacing_holds_a_run_at_the_lead_and_releases_it_under() -> None:
    pacing, run = PlayoutPacing(lead_ms=1000), _run()
    run.audio_ms = 1500
    pacing.pace(run)
    assert not run.held  # never reported on: never held
    pacing.reported(run, 400)
    assert run.held  # 1100 ms unplayed
    pacing.reported(run, 100)  # reports only move on
    assert run.played_ms == 400 and run.held
    pacing.reported(run, 600)
    assert not run.held
    off = PlayoutPacing(None)
    off.reported(run, 0)
    assert not run.held


def test_truncation_keeps_what_was_heard_and_refuses_a_users_item() -> None:
    out: list[p.EngineOutput] = []
    book, stream = ResponseBook(out.append, lambda sid: None), _stream()
    spans = [AudioSpan(0, 500, "Hello there."), AudioSpan(500, 1000, "How are you?")]
    stream.conversation.add_generated("a1", [], [1, 2], "Hello there. How are you?", [], spans)
    stream.conversation.add("u1", "user", "hi")
    changed: list[StreamState] = []
    truncate_to_heard(stream, p.TruncateItem("s1", "a1", 500), book, changed.append)
    assert out[-1] == p.TruncationApplied("s1", "a1", 500, "Hello there.")
    assert changed == [stream] and stream.conversation.find("a1").text == "Hello there."
    truncate_to_heard(stream, p.TruncateItem("s1", "u1", 10), book, changed.append)
    assert isinstance(out[-1], p.StreamError) and "user message" in out[-1].message
    truncate_to_heard(stream, p.TruncateItem("s1", "gone", 10), book, changed.append)
    assert out[-1] == p.TruncationApplied("s1", "gone", 0, "")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_playout_clock_runs_in_real_time_restarts_after_a_gap_and_follows_reports() -> None:
    clock = Clock()
    pacing, run = PlayoutPacing(clock=clock), _run()
    assert pacing.unplayed_ms(run, 0.0) is None  # no audio out yet
    run.audio_ms = 300
    pacing.sent(run, 300)
    clock.now = 0.1
    assert pacing.unplayed_ms(run, clock.now) == pytest.approx(200)
    run.audio_ms += 400
    pacing.sent(run, 400)
    assert pacing.unplayed_ms(run, clock.now) == pytest.approx(600)
    clock.now = 2.0  # ran dry at 0.7 s: the listener resumes with the next chunk
    assert pacing.unplayed_ms(run, clock.now) == pytest.approx(-1300)
    run.audio_ms += 250
    pacing.sent(run, 250)
    assert pacing.unplayed_ms(run, clock.now) == pytest.approx(250)
    pacing.reported(run, 250)  # the client is behind the clock: what it heard counts
    assert pacing.unplayed_ms(run, clock.now) == pytest.approx(700)
    speculative = _run()
    speculative.speculative = Speculative(user_item=None, slot_tokens=0)
    speculative.audio_ms = 500
    pacing.sent(speculative, 500)
    assert pacing.unplayed_ms(speculative, clock.now) is None  # held, not sent
    speculative.speculative = None
    pacing.committed(speculative)
    assert pacing.unplayed_ms(speculative, clock.now) == pytest.approx(500)


def test_voice_is_low_while_a_sent_reply_is_under_the_reserve_and_not_otherwise() -> None:
    clock = Clock()
    pacing = PlayoutPacing(lead_ms=5000, clock=clock)
    runs = {1: _run(), 2: _run()}
    reserve = VoiceReserve(runs, pacing, reserve_ms=500)
    assert not reserve.low()  # replies with no audio yet: no listener is waiting
    runs[1].audio_ms = 800
    pacing.sent(runs[1], 800)
    assert not reserve.low()
    clock.now = 0.4  # 400 ms left
    assert reserve.low()
    runs[2].audio_ms = 100
    pacing.sent(runs[2], 100)
    runs[1].audio_ms += 300
    pacing.sent(runs[1], 300)
    assert reserve.low()  # any reply short is enough
    del runs[2]  # that reply ended (or was cancelled)
    assert not reserve.low()
    runs[1].audio_ms = 6000
    pacing.reported(runs[1], 900)  # a generation lead ahead: held by flow control
    clock.now = 10.0  # no report for a long time: its clock ran out, but it is held
    assert runs[1].held and not reserve.low()
    pacing.reported(runs[1], 5800)
    assert not runs[1].held and reserve.low()
    runs[1].speculative = Speculative(user_item=None, slot_tokens=0)
    assert not reserve.low()  # a speculation's audio has not left
    runs[1].speculative = None
    assert not VoiceReserve(runs, pacing, reserve_ms=0).low()  # 0: off
    with pytest.raises(ValueError, match="video_voice_reserve_ms"):
        VoiceReserve(runs, pacing, reserve_ms=-1)
