"""Speculative turns and semantic turn detection in the engine core (hand-built models).

A pause in a turn starts the turn's transcript and reply early; the reply is held
until the caller asks for it (`CreateResponse` with the stream's `auto_response`),
and dropped without a trace when the user goes on speaking.
"""

from __future__ import annotations

import numpy as np
import pytest
from fakes import tone
from test_engine_core import Harness, has

from voxline.engines import end_of_turn
from voxline.engines import protocol as p
from voxline.engines.end_of_turn import Ending
from voxline.engines.turn_detector import TurnDetector, TurnEvent

AUTO = p.ResponseConfig(voice="alloy")
CFG = p.StreamConfig(auto_response=AUTO)
WORDS = ["book a table for", "four people please."]


class BurstASR:
    """Transcribes each burst of tone in the audio as the next phrase of `WORDS`."""

    def __init__(self) -> None:
        self.calls = 0

    def transcribe(self, audio: np.ndarray) -> str:
        self.calls += 1
        frames = audio[: len(audio) // 512 * 512].reshape(-1, 512)
        voiced = np.sqrt((frames**2).mean(axis=1)) > 0.01
        bursts = int(voiced[0]) + int(np.sum(voiced[1:] & ~voiced[:-1])) if len(voiced) else 0
        return " ".join(WORDS[:bursts])


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * 16000), np.float32)


def feed(h: Harness, audio: np.ndarray, sid: str = "s1") -> None:
    """Append `audio` and run the engine until the VAD has framed all of it."""
    h.send(p.AppendAudio(sid, audio.astype("<f4").tobytes()))
    stream = h.core.streams[sid]
    h.run_until(lambda _: h.core.vad.backlog_samples(stream.internal_id) < 512)


def outcomes(h: Harness) -> list[str]:
    return [o.outcome for o in h.of(p.Speculation)]


def speculating(h: Harness, sid: str = "s1"):
    run = h.core.responses.active(h.core.streams[sid])
    return run if run is not None and run.speculative is not None else None


def harness(**kwargs) -> Harness:
    h = Harness(**kwargs)
    h.core.asr.model = BurstASR()
    return h


def test_a_resumed_turn_is_one_item_with_the_whole_transcript_and_one_reply():
    h = harness(stop_after=6)
    h.send(p.OpenStream("s1", CFG))
    feed(h, np.concatenate([silence(0.3), tone(0.6), silence(0.25)]))
    h.run_until(has(p.Speculation, outcome="started"))
    assert not h.of(p.VoiceStopped) and not h.of(p.ReplyTextDelta)
    # the user goes on: the speculation is dropped, the turn continues as one item
    feed(h, np.concatenate([tone(0.5), silence(0.25)]))
    h.run_until(lambda _: outcomes(h) == ["started", "discarded", "started"])
    feed(h, silence(0.55))
    h.run_until(has(p.TranscriptFinal))
    h.send(p.CreateResponse("s1", "r1", "a1", AUTO))
    h.run_until(has(p.ResponseFinished))
    started, = h.of(p.VoiceStarted)
    stopped, = h.of(p.VoiceStopped)
    final, = h.of(p.TranscriptFinal)
    assert started.item_id == stopped.item_id == final.item_id
    assert final.text == "book a table for four people please."
    # the second pause speculated again, and that reply is the one released
    assert outcomes(h) == ["started", "discarded", "started", "committed"]
    done, = h.of(p.ResponseFinished)
    assert done.response_id == "r1" and done.status == p.ResponseStatus.COMPLETED
    assert {o.response_id for o in h.of(p.ReplyTextDelta) + h.of(p.AudioChunk)} == {"r1"}
    items = h.core.streams["s1"].conversation.items
    assert [(i.item_id, i.role) for i in items] == [(final.item_id, "user"), ("a1", "assistant")]
    assert items[0].text == final.text and items[1].text == done.text
    h.close()


def _state(h: Harness):
    stream = h.core.streams["s1"]
    items = [(i.role, i.text, i.tokens) for i in stream.conversation.items]
    slot = stream.slot
    return items, list(slot.tokens), list(h.lm.cache[slot.index])


def _dropped_turn(speculate: bool):
    """An earlier exchange, then a turn that pauses (long enough to speculate) and goes on."""
    h = harness(stop_after=6, step_seconds=0.01, speculate_after_ms=160 if speculate else 0)
    h.send(p.OpenStream("s1", CFG), p.AddItem("s1", "u0", "user", "an earlier question"),
           p.CreateResponse("s1", "r0", "a0", AUTO))
    h.run_until(has(p.ResponseFinished, response_id="r0"))
    feed(h, np.concatenate([silence(0.3), tone(0.6), silence(0.25)]))
    if speculate:
        h.run_until(lambda _: (run := speculating(h)) is not None
                    and len(run.request.generated) >= 2)
    feed(h, tone(0.3))  # the user goes on speaking
    h.run_until(lambda _: not h.core.llm.has_work() and h.core._llm_worker.idle)
    state = _state(h)
    assert outcomes(h) == (["started", "discarded"] if speculate else [])
    h.close()
    return state


def test_a_dropped_speculation_leaves_cache_and_conversation_as_if_it_never_ran():
    dropped = _dropped_turn(speculate=True)
    assert dropped == _dropped_turn(speculate=False)
    items, slot_tokens, cache = dropped
    assert [role for role, _, _ in items] == ["user", "assistant"]
    assert cache == slot_tokens  # the cache holds exactly what the slot says it does


def test_held_output_is_never_sent_before_the_turn_ends_and_then_goes_out_at_once():
    h = harness(stop_after=6)
    h.send(p.OpenStream("s1", CFG))
    feed(h, np.concatenate([silence(0.3), tone(0.6), silence(0.25)]))
    # the speculation runs the LLM to its end and speaks its first segment, all held
    h.run_until(lambda _: (run := speculating(h)) is not None and run.llm_done and run.spans
                and run.tts_job is None)
    feed(h, silence(0.4))
    h.run_until(has(p.TranscriptFinal))
    assert not [o for o in h.outputs if isinstance(o, p.ReplyTextDelta | p.AudioChunk | p.ResponseFinished)]
    h.send(p.CreateResponse("s1", "r1", "a1", AUTO))
    released = h.core.step()
    kinds = [type(o).__name__ for o in released]
    assert kinds[0] == "Speculation" and released[0].outcome == "committed"
    assert "ReplyTextDelta" in kinds and "AudioChunk" in kinds  # released at once, not regenerated
    h.outputs.extend(released)
    h.run_until(has(p.ResponseFinished))
    assert {o.response_id for o in h.of(p.ReplyTextDelta) + h.of(p.AudioChunk)} == {"r1"}
    done, = h.of(p.ResponseFinished)
    assert done.text == "".join(o.text for o in h.of(p.ReplyTextDelta)).strip()
    spoken = " ".join(o.text for o in h.of(p.AudioChunk))
    assert spoken.split() == done.text.split()  # every word spoken once, in order
    h.close()


def test_a_different_response_discards_the_speculation_and_runs_as_asked():
    h = harness(stop_after=4)
    h.send(p.OpenStream("s1", CFG))
    feed(h, np.concatenate([silence(0.3), tone(0.6), silence(0.25)]))
    h.run_until(has(p.Speculation, outcome="started"))
    feed(h, silence(0.4))
    h.run_until(has(p.TranscriptFinal))
    other = p.ResponseConfig(instructions="Answer in French.", voice="alloy")
    h.send(p.CreateResponse("s1", "r1", "a1", other))
    h.run_until(has(p.ResponseFinished))
    assert outcomes(h) == ["started", "discarded"]
    done, = h.of(p.ResponseFinished)
    assert done.status == p.ResponseStatus.COMPLETED and done.output_tokens == 4
    roles = [i.role for i in h.core.streams["s1"].conversation.items]
    assert roles == ["user", "assistant"]  # the user item stayed: it is the turn's own
    h.close()


def test_barge_in_on_a_reply_released_from_a_speculation():
    h = harness(stop_after=400, step_seconds=0.005)
    h.send(p.OpenStream("s1", CFG))
    feed(h, np.concatenate([silence(0.3), tone(0.6), silence(0.25)]))
    h.run_until(has(p.Speculation, outcome="started"))
    feed(h, silence(0.4))
    h.run_until(has(p.TranscriptFinal))
    h.send(p.CreateResponse("s1", "r1", "a1", AUTO))
    h.run_until(has(p.AudioChunk))
    assert outcomes(h) == ["started", "committed"]
    feed(h, tone(0.3))  # the user speaks over the reply; the session cancels it
    h.run_until(lambda outs: len([o for o in outs if isinstance(o, p.VoiceStarted)]) == 2)
    h.send(p.CancelResponse("s1"))
    h.outputs.extend(h.core.step())
    done, = h.of(p.ResponseFinished)
    assert done.status == p.ResponseStatus.CANCELLED
    n = len(h.outputs)
    feed(h, silence(0.3))
    assert not [o for o in h.outputs[n:] if getattr(o, "response_id", None) == "r1"]
    h.close()


def test_no_speculation_without_an_auto_response_or_when_turned_off():
    for cfg, kwargs in ((p.StreamConfig(), {}), (CFG, {"speculate_after_ms": 0})):
        h = harness(stop_after=4, **kwargs)
        h.send(p.OpenStream("s1", cfg))
        feed(h, np.concatenate([silence(0.3), tone(0.6), silence(0.8)]))
        h.run_until(has(p.TranscriptFinal))
        assert not h.of(p.Speculation) and h.core.responses.active(h.core.streams["s1"]) is None
        h.close()


# ------------------------------------------------------------------------ semantic VAD


@pytest.mark.parametrize("text, expected", [
    ("What is the capital of France?", Ending.COMPLETE),
    ("I'd like a coffee.", Ending.COMPLETE),
    ("I would like to book a table for", Ending.INCOMPLETE),
    ("I would like to book a table for.", Ending.INCOMPLETE),  # ASR periods lie after "for"
    ("Tell me about cats and", Ending.INCOMPLETE),
    ("So, um", Ending.INCOMPLETE),
    ("Well, let me think,", Ending.INCOMPLETE),
    ("Paris is nice", Ending.NEUTRAL),
    ("", Ending.NEUTRAL),
])
def test_semantic_endings_of_scripted_transcripts(text, expected):
    assert end_of_turn.ending(text) == expected


@pytest.mark.parametrize("eagerness", end_of_turn.EAGERNESS)
def test_semantic_turn_detector_waits_by_the_words(eagerness):
    complete, neutral, incomplete = end_of_turn.SILENCE_MS[eagerness]
    assert complete < neutral < incomplete
    assert incomplete == {"low": 8000, "medium": 4000, "auto": 4000, "high": 2000}[eagerness]

    def stop_after_silence(transcript: str | None) -> float:
        det = TurnDetector(p.TurnParams(eagerness=eagerness), pause_ms=160)
        t = 0.0
        for _ in range(20):  # 640 ms of speech
            det.update(1.0, t, 32)
            t += 32
        while True:
            event = det.update(0.0, t, 32)
            t += 32
            if event == TurnEvent.PAUSED and transcript is not None:
                det.judge(transcript)
            if event == TurnEvent.STOPPED:
                return t - det.last_voice_ms

    assert complete <= stop_after_silence("What time is it?") < complete + 32
    assert incomplete <= stop_after_silence("I want to go to") < incomplete + 32
    assert neutral <= stop_after_silence(None) < neutral + 32


def test_server_vad_keeps_its_exact_silence_window_whatever_the_words():
    det = TurnDetector(p.TurnParams(silence_duration_ms=500), pause_ms=160)
    t = 0.0
    for _ in range(20):
        det.update(1.0, t, 32)
        t += 32
    events = []
    while not events or events[-1] != TurnEvent.STOPPED:
        event = det.update(0.0, t, 32)
        t += 32
        if event == TurnEvent.PAUSED:
            det.judge("and")  # ignored: server VAD does not read the words
        if event is not None:
            events.append(event)
    assert events == [TurnEvent.PAUSED, TurnEvent.STOPPED]
    assert 500 <= t - det.last_voice_ms < 532


@pytest.mark.parametrize("text, pause_s, ends", [
    ("What is the capital of France?", 0.4, True),
    ("I would like to book a table for", 1.0, False),
    ("I would like to book a table for", 2.2, True),
])
def test_semantic_vad_in_the_engine_holds_a_trailing_clause_and_ends_a_question(
        text, pause_s, ends):
    """eagerness high: a question ends after 250 ms of silence; "... a table for" waits
    its 2 s, so a 1 s pause does not cut the user off."""
    h = Harness(asr_text=text, speculate_after_ms=0)
    h.send(p.OpenStream("s1", p.StreamConfig(turn_detection=p.TurnParams(eagerness="high"))))
    feed(h, np.concatenate([silence(0.3), tone(0.6), silence(0.2)]))
    stream = h.core.streams["s1"]
    h.run_until(lambda _: stream.input.utterance is None
                or stream.input.utterance.pause_text is not None)
    feed(h, silence(pause_s - 0.2))
    assert bool(h.of(p.VoiceStopped)) == ends
    h.close()
