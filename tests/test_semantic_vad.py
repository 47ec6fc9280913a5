"""Semantic turn detection with an end-of-turn model: the words and the sound combined.

`end_of_turn.decide` is the table; the engine tests run it end to end with a scripted
model (a fixed probability) on the end-of-turn stage's own thread.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from core_driver import CoreDriver
from fakes import CountingLM, EnergyVAD, FixedASR, ToneTTS, tone
from test_speculation import feed, silence

from voxline.engines import end_of_turn as eot
from voxline.engines import protocol as p
from voxline.engines.core import EngineCore, Models
from voxline.engines.end_of_turn import Ending, Sound
from voxline.engines.speech_model import SentenceSpeechModel
from voxline.engines.turn_detector import TurnDetector, TurnEvent


def test_a_wh_question_that_strands_its_preposition_is_left_to_the_sound():
    """ASR drops the question mark of "... what is it famous for?"; the words alone read
    as trailing off, so the turn waited the INCOMPLETE pause (4 s at auto). A wh-clause
    ending on its preposition is NEUTRAL: a finished sound ends it, a mid-phrase one
    still waits long."""
    for text in ("What is the capital of France, and what is it famous for",
                 "Who are you talking to", "where are you from.", "Which one is it for"):
        assert eot.ending(text) == Ending.NEUTRAL, text
        assert eot.decide("auto", eot.ending(text), Sound.CONFIDENT) == eot.AGREED_MS["auto"]
        assert eot.decide("auto", eot.ending(text), Sound.GOING_ON) == eot.SILENCE_MS["auto"][2]
    # not a wh-clause, or a clause not opened by one: trailing off, as before
    for text in ("I would like a table for", "Can you book a table for", "Tell me about",
                 "Where is the station, and I need a ticket for"):
        assert eot.ending(text) == Ending.INCOMPLETE, text
    assert eot.ending("Who is it for?") == Ending.COMPLETE


@pytest.mark.parametrize("eagerness", eot.EAGERNESS)
def test_more_coming_by_either_waits_long_else_a_finished_sound_shortens_the_words(eagerness):
    complete, neutral, incomplete = eot.SILENCE_MS[eagerness]
    agreed, confident = eot.AGREED_MS[eagerness], eot.CONFIDENT_MS[eagerness]
    assert confident <= agreed < complete < neutral < incomplete
    table = {
        # a confidently finished sound shortens the finished verdicts one step more, and
        # only those: words that trail off wait as long as ever
        (Ending.COMPLETE, Sound.CONFIDENT): confident,
        (Ending.NEUTRAL, Sound.CONFIDENT): agreed,
        (Ending.INCOMPLETE, Sound.CONFIDENT): incomplete,
        (None, Sound.CONFIDENT): agreed,
        (Ending.COMPLETE, Sound.FINISHED): agreed,
        (Ending.COMPLETE, Sound.LEANS_FINISHED): agreed,  # agreeing needs less than overruling
        (Ending.COMPLETE, Sound.UNSURE): complete,
        (Ending.COMPLETE, None): complete,
        (Ending.COMPLETE, Sound.GOING_ON): incomplete,  # "to the," written "to that."
        (Ending.NEUTRAL, Sound.FINISHED): complete,
        (Ending.NEUTRAL, Sound.LEANS_FINISHED): neutral,
        (Ending.NEUTRAL, Sound.UNSURE): neutral,
        (Ending.NEUTRAL, None): neutral,
        (Ending.NEUTRAL, Sound.GOING_ON): incomplete,
        (Ending.INCOMPLETE, Sound.FINISHED): incomplete,
        (Ending.INCOMPLETE, Sound.LEANS_FINISHED): incomplete,
        (Ending.INCOMPLETE, None): incomplete,
        (Ending.INCOMPLETE, Sound.GOING_ON): incomplete,
        # no transcript yet: a confident "finished" need not wait for it, a less sure
        # sound waits for it, and with no model the wait is the rules' own
        (None, Sound.FINISHED): complete,
        (None, Sound.LEANS_FINISHED): incomplete,
        (None, Sound.UNSURE): incomplete,
        (None, Sound.GOING_ON): incomplete,
        (None, None): neutral,
        # the model still judging: wait for a witness, unless the words are in
        (None, Sound.AWAITED): incomplete,
        (Ending.COMPLETE, Sound.AWAITED): complete,
        (Ending.NEUTRAL, Sound.AWAITED): neutral,
        (Ending.INCOMPLETE, Sound.AWAITED): incomplete,
    }
    for (words, heard), wait in table.items():
        assert eot.decide(eagerness, words, heard) == wait, (words, heard)


def test_a_trailing_comma_alone_is_overruled_by_a_finished_sound():
    complete, _, incomplete = eot.SILENCE_MS["auto"]
    for text in ("How far is the moon from the earth,", "Well, let me think,", "Milk; eggs:"):
        assert eot.ending(text) == Ending.INCOMPLETE and eot.comma_only(text), text
        assert eot.decide("auto", eot.ending(text), Sound.FINISHED, True) == complete
        for heard in (Sound.LEANS_FINISHED, Sound.UNSURE, Sound.GOING_ON, Sound.AWAITED, None):
            assert eot.decide("auto", eot.ending(text), heard, True) == incomplete, (text, heard)
    # a comma after a connective or a filler is still more to come, and no comma is none
    for text in ("I would like to book a table for,", "So, um,", "Paris is nice", "Is it?", ""):
        assert not eot.comma_only(text), text
    assert eot.decide("auto", Ending.INCOMPLETE, Sound.FINISHED, False) == incomplete


def test_eagerness_sets_how_sure_the_model_must_be():
    assert eot.sound("high", 0.85) == Sound.FINISHED
    assert eot.sound("high", 0.9) == Sound.CONFIDENT
    assert eot.sound("auto", 0.95) == eot.sound("medium", 0.95) == Sound.CONFIDENT
    assert eot.sound("low", 0.97) == Sound.FINISHED
    assert eot.sound("medium", 0.85) == Sound.LEANS_FINISHED
    assert eot.sound("auto", 0.92) == Sound.FINISHED
    assert eot.sound("low", 0.92) == Sound.LEANS_FINISHED
    assert eot.sound("low", 0.6) == Sound.UNSURE
    assert eot.sound("high", 0.45) == Sound.LEANS_FINISHED
    assert eot.sound("medium", 0.5) == Sound.LEANS_FINISHED  # Smart Turn's own threshold
    assert eot.sound("medium", 0.49) == Sound.UNSURE
    assert eot.sound("medium", 0.05) == Sound.GOING_ON
    assert eot.sound("medium", 0.15) == Sound.UNSURE


def _pause(det: TurnDetector) -> float:
    """Speak 640 ms, then stay silent until PAUSED; returns the clock."""
    t = 0.0
    for _ in range(20):
        det.update(1.0, t, 32)
        t += 32
    while det.update(0.0, t, 32) != TurnEvent.PAUSED:
        t += 32
    return t + 32


def test_detector_takes_whichever_verdict_comes_first_and_forgets_both_when_speech_resumes():
    det = TurnDetector(p.TurnParams(eagerness="medium"), pause_ms=160)
    t = _pause(det)
    det.hear(0.92)  # the model answers before the transcript
    assert det.silence_ms == eot.SILENCE_MS["medium"][Ending.COMPLETE]
    det.judge("What time is it?")
    assert det.silence_ms == eot.AGREED_MS["medium"]
    assert det.update(1.0, t, 32) == TurnEvent.RESUMED
    assert (det.words, det.heard) == (None, None)
    assert det.silence_ms == eot.SILENCE_MS["medium"][Ending.NEUTRAL]


def test_complete_words_and_a_sound_leaning_finished_end_the_turn_at_the_agreed_pause():
    """Through the detector: a sound leaning finished (0.6 at medium) waits for the words,
    then agrees with complete ones ("What time is it?": the agreed pause); after words
    with no sign either way it waits as if unheard, and it overrules no trailing comma."""
    for text, wait in (("What time is it?", eot.AGREED_MS["medium"]),
                       ("What time is it", eot.SILENCE_MS["medium"][Ending.NEUTRAL]),
                       ("What time is it,", eot.SILENCE_MS["medium"][Ending.INCOMPLETE])):
        det = TurnDetector(p.TurnParams(eagerness="medium"), pause_ms=160)
        _pause(det)
        det.hear(0.6)
        assert det.heard == Sound.LEANS_FINISHED
        assert det.silence_ms == eot.SILENCE_MS["medium"][Ending.INCOMPLETE]  # the words, first
        det.judge(text)
        assert det.silence_ms == wait, text


@pytest.mark.parametrize("probability, text, wait", [
    (0.97, "What time is it?", eot.CONFIDENT_MS["auto"]),  # confident: shorter still
    (0.92, "What time is it?", eot.AGREED_MS["auto"]),  # finished: as before
    (0.3, "What time is it?", eot.SILENCE_MS["auto"][Ending.COMPLETE]),  # unsure: unchanged
    (0.97, "What time is it", eot.AGREED_MS["auto"]),
    (0.3, "What time is it", eot.SILENCE_MS["auto"][Ending.NEUTRAL]),  # unchanged
    (0.99, "I would like a table for", eot.SILENCE_MS["auto"][Ending.INCOMPLETE]),  # unchanged
    (0.05, "What time is it?", eot.SILENCE_MS["auto"][Ending.INCOMPLETE]),  # going on: unchanged
])
def test_a_confident_sound_shortens_the_complete_waits_and_no_other(probability, text, wait):
    det = TurnDetector(p.TurnParams(eagerness="auto"), pause_ms=160)
    t = _pause(det)
    det.judge(text)
    det.hear(probability)
    assert det.silence_ms == wait
    # the turn ends that long after its voice (on the first 32 ms frame after the one
    # that reported the pause, at the soonest), not sooner
    voice_ms, ended = det.last_voice_ms, None
    while ended is None:
        if det.update(0.0, t, 32) == TurnEvent.STOPPED:
            ended = t + 32
        t += 32
    assert wait <= ended - voice_ms < max(wait, 160 + 32) + 32


def test_a_pause_being_judged_waits_for_a_witness_and_a_failed_verdict_leaves_the_words():
    det = TurnDetector(p.TurnParams(eagerness="auto"), pause_ms=160)
    _pause(det)
    det.expect_sound()
    assert det.silence_ms == eot.SILENCE_MS["auto"][Ending.INCOMPLETE]
    det.sound_failed()
    assert det.heard is None and det.silence_ms == eot.SILENCE_MS["auto"][Ending.NEUTRAL]
    det.judge("What time is it?")
    assert det.silence_ms == eot.SILENCE_MS["auto"][Ending.COMPLETE]


def test_server_vad_ignores_the_model():
    det = TurnDetector(p.TurnParams(silence_duration_ms=500), pause_ms=160)
    _pause(det)
    det.hear(0.99)
    assert det.silence_ms == 500


class FixedTurnModel:
    """An end-of-turn model that always hears `probability`; counts its calls."""

    def __init__(self, probability: float) -> None:
        self.probability_value = probability
        self.calls = 0
        self.threads: set[str] = set()

    def probability(self, audio: np.ndarray) -> float:
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        return self.probability_value


class BrokenTurnModel(FixedTurnModel):
    def probability(self, audio: np.ndarray) -> float:
        super().probability(audio)
        raise RuntimeError("no verdict")


class TurnHarness(CoreDriver):
    def __init__(self, asr_text: str, probability: float | None, broken: bool = False) -> None:
        super().__init__()
        model = BrokenTurnModel if broken else FixedTurnModel
        self.model = model(probability) if probability is not None else None
        models = Models(EnergyVAD(), FixedASR(asr_text), CountingLM(), SentenceSpeechModel(ToneTTS()),
                        stages={"end_of_turn": self.model})
        self.core = EngineCore(models, self.woke.set, speculate_after_ms=0)


@pytest.mark.parametrize("text, probability, pause_s, ends", [
    # words NEUTRAL (500 ms at high); finished-sounding -> COMPLETE (250 ms)
    ("Paris is nice", 0.85, 0.4, True),
    ("Paris is nice", None, 0.4, False),  # no model: the words' 500 ms
    # going on -> INCOMPLETE (2 s): a 1 s pause does not cut the user off
    ("Paris is nice", 0.05, 1.0, False),
    ("Paris is nice", 0.05, 2.2, True),
    # trailing words wait whatever the model hears
    ("I would like to book a table for", 0.99, 1.0, False),
    ("I would like to book a table for,", 0.99, 1.0, False),
    # a trailing comma alone: a finished sound ends the turn at COMPLETE's 250 ms, an
    # unsure one waits INCOMPLETE's 2 s
    ("How far is the moon from the earth,", 0.85, 0.4, True),
    ("How far is the moon from the earth,", 0.5, 1.0, False),
])
def test_semantic_vad_in_the_engine_combines_words_and_sound(text, probability, pause_s, ends):
    h = TurnHarness(text, probability)
    h.send(p.OpenStream("s1", p.StreamConfig(turn_detection=p.TurnParams(eagerness="high"))))
    feed(h, np.concatenate([silence(0.3), tone(0.6), silence(0.2)]))
    stream = h.core.streams["s1"]
    det = stream.input.detector
    h.run_until(lambda _: stream.input.utterance is None or (
        stream.input.utterance.pause_text is not None
        and (probability is None or det.heard is not None)))
    feed(h, silence(pause_s - 0.2))
    assert bool(h.of(p.VoiceStopped)) == ends
    if h.model is not None:
        assert h.model.calls == 1 and all(n.startswith("voxline-eot") for n in h.model.threads)  # off the loop
    h.close()


def test_a_failed_verdict_leaves_the_pause_to_the_words():
    h = TurnHarness("Paris is nice", 0.95, broken=True)  # NEUTRAL: 500 ms at high
    h.send(p.OpenStream("s1", p.StreamConfig(turn_detection=p.TurnParams(eagerness="high"))))
    feed(h, np.concatenate([silence(0.3), tone(0.6), silence(0.2)]))
    stream = h.core.streams["s1"]
    h.run_until(lambda _: h.model.calls == 1 and not h.core.table.has_work())
    assert stream.input.detector.heard is None
    feed(h, silence(0.5))
    assert h.of(p.VoiceStopped)
    h.close()


def test_a_verdict_on_a_pause_that_speech_resumed_is_void():
    h = TurnHarness("Paris is nice", 0.95)
    h.send(p.OpenStream("s1", p.StreamConfig(turn_detection=p.TurnParams(eagerness="high"))))
    feed(h, np.concatenate([silence(0.3), tone(0.6), silence(0.2), tone(0.1)]))
    stream = h.core.streams["s1"]
    h.run_until(lambda _: not h.core.table.has_work())
    assert stream.input.detector.heard is None  # speech resumed: the old pause's verdict is void
    h.close()


def test_server_vad_queues_no_model_work():
    h = TurnHarness("Paris is nice", 0.95)
    h.send(p.OpenStream("s1", p.StreamConfig(turn_detection=p.TurnParams())))
    feed(h, np.concatenate([silence(0.3), tone(0.6), silence(0.8)]))
    h.run_until(lambda outs: any(isinstance(o, p.TranscriptFinal) for o in outs))
    assert h.model.calls == 0
    h.close()


# ------------------------------------------------- defaults: the page, converse, the wire


def test_converse_defaults_to_semantic_vad_and_feeds_past_its_longest_wait():
    from voxline.cli import build_parser
    from voxline.subcommands import CONVERSE_TURN_DETECTION, trailing_silence_s

    args = build_parser().parse_args(["converse", "--input", "q.wav", "--output", "r.wav"])
    td = CONVERSE_TURN_DETECTION[args.turn_detection]
    assert args.turn_detection == "semantic_vad" and td.eagerness == "auto"
    assert trailing_silence_s(td) * 1000 > eot.SILENCE_MS["auto"][Ending.INCOMPLETE]
    server = CONVERSE_TURN_DETECTION["server_vad"]
    assert server.eagerness is None and server.silence_duration_ms == 500


def test_the_page_asks_for_semantic_vad_while_the_wire_default_stays_server_vad():
    from pathlib import Path

    import voxline.web_demo
    from voxline.sessions.settings import TurnDetection

    script = (Path(voxline.web_demo.__file__).parent / "app.js").read_text()
    assert 'turn_detection: pushToTalk() ? null : { type: "semantic_vad", eagerness: "auto" }' in script
    wire = TurnDetection()
    assert (wire.type, wire.silence_duration_ms, wire.threshold, wire.prefix_padding_ms) == \
        ("server_vad", 500, 0.5, 300)
