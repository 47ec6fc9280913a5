"""Smart Turn v3.2, the end-of-turn model shipped in pipecat-ai's wheel, on synthesised speech.

Utterances are spoken by the shipped Piper voice (seeded, so the same samples every run)
and heard as the engine hears a pause: the turn so far plus ~190 ms of silence.
"""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest
import soxr

from voxline.engines import end_of_turn as eot
from voxline.engines.end_of_turn import Ending, Sound
from voxline.engines.models import smart_turn
from voxline.engines.models.piper_tts import PiperTTS
from voxline.engines.models.smart_turn import SmartTurn
from voxline.errors import ModelUnavailableError

PAUSE = np.zeros(int(0.19 * 16000), np.float32)


@pytest.fixture(scope="module")
def model() -> SmartTurn:
    return SmartTurn.load()


@pytest.fixture(scope="module")
def tts() -> PiperTTS:
    return PiperTTS.load()


def spoken(tts: PiperTTS, text: str) -> np.ndarray:
    """`text` in the shipped voice at 16 kHz, trailing silence trimmed, then the pause."""
    audio = soxr.resample(tts.synthesize_all(text, seed=1), tts.sample_rate, 16000)
    voiced = np.nonzero(np.abs(audio) > 0.02)[0]
    return np.concatenate([audio[: voiced[-1] + 1].astype(np.float32), PAUSE])


FINISHED = (Sound.FINISHED, Sound.CONFIDENT)


@pytest.mark.parametrize("text, heard, words", [
    ("Can you tell me a joke?", FINISHED, Ending.COMPLETE),  # a complete question
    ("and then I went to the", (Sound.GOING_ON,), Ending.INCOMPLETE),  # trailing off
])
def test_model_hears_a_finished_question_and_a_trailing_clause(model, tts, text, heard, words):
    prob = model.probability(spoken(tts, text))
    sound = eot.sound("medium", prob)
    assert sound in heard, prob
    wait = eot.decide("medium", eot.ending(text), sound)
    if words == Ending.COMPLETE:  # (near 0.95: which band rounds differently across hosts)
        assert wait == (eot.CONFIDENT_MS if sound == Sound.CONFIDENT else eot.AGREED_MS)["medium"]
    else:
        assert wait == eot.SILENCE_MS["medium"][words]


def test_a_confidently_finished_question_ends_sooner_and_a_trailing_clause_waits_as_before(
        model, tts):
    """The confident band shortens only the finished verdicts: a question the model is
    sure of (0.99) ends at the confident pause, where a clause that trails off in words or
    sound still waits the incomplete one."""
    text = "Remind me to call my mother tomorrow."
    prob = model.probability(spoken(tts, text))
    assert eot.sound("auto", prob) == Sound.CONFIDENT, prob
    assert eot.decide("auto", eot.ending(text), Sound.CONFIDENT) == eot.CONFIDENT_MS["auto"]
    assert eot.CONFIDENT_MS["auto"] < eot.AGREED_MS["auto"]
    for text in ("and then I went to the", "So I was thinking that,"):
        heard = eot.sound("auto", model.probability(spoken(tts, text)))
        assert heard not in FINISHED
        assert eot.decide("auto", eot.ending(text), heard, eot.comma_only(text)) == \
            eot.SILENCE_MS["auto"][Ending.INCOMPLETE]


def test_a_pause_inside_a_clause_is_not_heard_as_finished_and_waits(model, tts):
    text = "Can you tell me the way to the"
    prob = model.probability(spoken(tts, text))
    assert eot.sound("medium", prob) not in FINISHED, prob
    assert eot.decide("medium", eot.ending(text), eot.sound("medium", prob)) == \
        eot.SILENCE_MS["medium"][Ending.INCOMPLETE]


def test_words_that_trail_off_wait_even_when_the_clause_sounds_finished(model, tts):
    # Piper closes each fragment like a sentence: on AVX-512 hosts the model hears this
    # one as finished (0.93), on AVX2 ones not (its int8 kernels round differently).
    # The connective decides either way.
    text = "I would like to book a table for,"
    heard = eot.sound("medium", model.probability(spoken(tts, text)))
    assert eot.decide("medium", eot.ending(text), heard, eot.comma_only(text)) == \
        eot.SILENCE_MS["medium"][Ending.INCOMPLETE]


def test_decisions_are_deterministic_across_calls_and_loads(model, tts):
    clips = [spoken(tts, t) for t in ("Can you tell me a joke?", "and then I went to the")]
    first = [model.probability(c) for c in clips]
    again = [model.probability(c) for c in clips]
    reloaded = SmartTurn.load()
    assert first == again == [reloaded.probability(c) for c in clips]


@pytest.mark.parametrize("seconds", [0.05, 3.0, 12.0])  # padded, padded, cut to the last 8 s
def test_vectorised_features_equal_the_whisper_feature_extractor(model, seconds):
    audio = (np.random.default_rng(0).standard_normal(int(seconds * 16000)) * 0.1).astype(np.float32)
    fast = model.input_features(audio)
    assert fast.shape == (1, smart_turn.MEL_BINS, smart_turn.FRAMES)
    np.testing.assert_allclose(fast, model.reference_features(audio), atol=1e-5)


def test_the_window_keeps_the_end_of_the_turn():
    audio = np.arange(9 * 16000, dtype=np.float32)
    assert smart_turn.window(audio)[-1] == audio[-1] and len(smart_turn.window(audio)) == 8 * 16000
    short = smart_turn.window(np.ones(100, np.float32))
    assert short[-100:].all() and not short[:-100].any()  # zero-padded at the start


def test_a_missing_package_names_it_and_how_to_install_it(monkeypatch):
    def missing(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(smart_turn.importlib.metadata, "distribution", missing)
    with pytest.raises(ModelUnavailableError) as err:
        SmartTurn.load()
    assert "Smart Turn" in str(err.value) and "'pipecat-ai'" in str(err.value)
    assert "pip install --no-deps" in str(err.value)


def test_a_missing_file_in_the_package_names_the_path(monkeypatch, tmp_path):
    class Dist:
        def locate_file(self, name: str):
            return tmp_path / name

    monkeypatch.setattr(smart_turn.importlib.metadata, "distribution", lambda name: Dist())
    with pytest.raises(ModelUnavailableError, match="smart-turn-v3.2-cpu.onnx"):
        SmartTurn.load()


def test_pipecat_runtime_is_never_imported(model):
    import sys

    assert not any(name == "pipecat" or name.startswith("pipecat.") for name in sys.modules)
