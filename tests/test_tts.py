"""Piper TTS adapter with the shipped en_US-joe-medium voice (real model, CPU)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import soxr

from voxline.engines.models.piper_tts import PiperTTS, SpeechChunk, _seedable_graph
from voxline.errors import ModelUnavailableError

SENTENCE = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def tts() -> PiperTTS:
    return PiperTTS.load()


def rms(audio: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(audio, dtype=np.float64))))


def test_one_sentence(tts: PiperTTS) -> None:
    chunks = list(tts.synthesize(SENTENCE, seed=0))
    assert len(chunks) == 1
    chunk = chunks[0]
    assert isinstance(chunk, SpeechChunk)
    assert tts.sample_rate == chunk.sample_rate == 22050
    assert chunk.text == SENTENCE
    assert chunk.audio.dtype == np.float32 and chunk.audio.ndim == 1
    assert 0.5 < chunk.duration_s < 6.0
    assert float(np.max(np.abs(chunk.audio))) <= 1.0
    assert rms(chunk.audio) > 0.02  # speech, not silence


def test_two_sentences_two_chunks(tts: PiperTTS) -> None:
    chunks = list(tts.synthesize("Hello Mr. Smith. How are you today?", seed=0))
    assert [c.text for c in chunks] == ["Hello Mr. Smith.", "How are you today?"]
    for c in chunks:
        assert 0.3 < c.duration_s < 5.0 and rms(c.audio) > 0.02


def test_speed_two_is_much_shorter(tts: PiperTTS) -> None:
    normal = tts.synthesize_all(SENTENCE, seed=3)
    fast = tts.synthesize_all(SENTENCE, speed=2.0, seed=3)
    slow = tts.synthesize_all(SENTENCE, speed=0.5, seed=3)
    # Durations scale by 1/speed, but each phoneme rounds up to a whole frame, so 2x speed
    # gives ~0.6x the duration, not exactly 0.5x.
    assert 0.4 < len(fast) / len(normal) < 0.7
    assert 1.6 < len(slow) / len(normal) < 2.4


def test_same_seed_same_samples(tts: PiperTTS) -> None:
    a = tts.synthesize_all(SENTENCE, seed=7)
    b = tts.synthesize_all(SENTENCE, seed=7)
    assert np.array_equal(a, b)
    c = tts.synthesize_all(SENTENCE, seed=8)
    assert not (len(a) == len(c) and np.array_equal(a, c))


def test_seed_is_kept_across_loads(tts: PiperTTS) -> None:
    other = PiperTTS.load(str(tts.model_path))
    assert np.array_equal(
        other.synthesize_all(SENTENCE, seed=11), tts.synthesize_all(SENTENCE, seed=11)
    )


def test_noise_buffer_retry_does_not_change_audio(
    tts: PiperTTS, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = tts.synthesize_all(SENTENCE, seed=5)
    monkeypatch.setattr("voxline.engines.models.piper_tts._FRAMES_PER_ID", 0.01)
    assert np.array_equal(tts.synthesize_all(SENTENCE, seed=5), expected)


def test_seedable_graph_reads_noise_from_inputs(tts: PiperTTS) -> None:
    import onnx

    original = onnx.load_from_string(tts.model_path.read_bytes())
    data, names = _seedable_graph(tts.model_path.read_bytes())
    rewritten = onnx.load_from_string(data)
    onnx.checker.check_model(rewritten)
    assert names == ["noise_0", "noise_1"]
    assert [i.name for i in rewritten.graph.input][-2:] == names
    assert {i.name for i in tts._session.get_inputs()} >= set(names)
    assert "RandomNormalLike" not in {n.op_type for n in rewritten.graph.node}
    # Every other node is kept as it was, in order.
    kept = [n.SerializeToString() for n in original.graph.node if n.op_type != "RandomNormalLike"]
    ours = [n.SerializeToString() for n in rewritten.graph.node if "/voxline_noise_" not in n.name]
    assert ours == kept


def test_seedable_graph_leaves_other_noise_alone() -> None:
    from onnx import TensorProto, helper

    def model(**attrs: float) -> bytes:
        node = helper.make_node("RandomNormalLike", ["x"], ["y"], name="rn", **attrs)
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
        return helper.make_model(helper.make_graph([node], "g", [x], [y])).SerializeToString()

    assert _seedable_graph(model(mean=1.0)) == (model(mean=1.0), [])  # not N(0, 1): unseeded
    assert _seedable_graph(model(scale=1.0))[1] == ["noise_0"]


@pytest.mark.parametrize("text", ["", "   ", "\n\t", "...", "?!", "-- ** #"])
def test_nothing_to_say_yields_nothing(tts: PiperTTS, text: str) -> None:
    assert list(tts.synthesize(text)) == []
    assert tts.synthesize_all(text).shape == (0,)


def test_bad_speed(tts: PiperTTS) -> None:
    with pytest.raises(ValueError, match="speed"):
        list(tts.synthesize(SENTENCE, speed=0))


def test_missing_voice_file(tmp_path: object) -> None:
    with pytest.raises(ModelUnavailableError, match="nope.onnx"):
        PiperTTS.load(f"{tmp_path}/nope.onnx")


@pytest.mark.skipif(
    importlib.util.find_spec("voxline.engines.models.moonshine_asr") is None,
    reason="Moonshine ASR adapter not written yet",
)
def test_round_trip_through_asr(tts: PiperTTS) -> None:
    from voxline.engines.models.moonshine_asr import MoonshineASR

    asr = MoonshineASR.load()
    text = "Please set a timer for ten minutes and turn off the kitchen lights."
    audio = tts.synthesize_all(text, seed=0)
    heard = asr.transcribe(soxr.resample(audio, tts.sample_rate, 16000).astype(np.float32)).lower()
    for word in ("timer", "minutes", "kitchen", "lights"):  # "ten" may come back as "10"
        assert word in heard, heard
