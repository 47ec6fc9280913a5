"""The units `Responses` composes, each alone: the book's held outputs, playout pacing,
truncation to what was heard. (Speculation, prompts and speech run through the engine in
test_speculation, test_engine_core and test_streaming_speech_responses.)"""

from __future__ import annotations

from voxline.engines import protocol as p
from voxline.engines.conversation import AudioSpan, Conversation
from voxline.engines.input_audio import InputAudio
from voxline.engines.response_run import ResponseBook, ResponseRun, Speculative, new_chunker
from voxline.engines.speech_pacing import PlayoutPacing
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
