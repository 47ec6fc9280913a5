"""Silero VAD adapter: real shipped model on CPU."""

from __future__ import annotations

import numpy as np
import pytest
from speech import espeak, noise

from voxline.engines.models.silero_vad import FRAME, SileroVAD, VADState
from voxline.errors import ModelUnavailableError


@pytest.fixture(scope="module")
def vad() -> SileroVAD:
    return SileroVAD.load()


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return espeak("What is the capital of France? I would like to know, please.")


def frames_of(audio: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n * FRAME, np.float32)
    out[: min(len(audio), n * FRAME)] = audio[: n * FRAME]
    return out.reshape(n, FRAME)


def test_finds_speech(vad: SileroVAD, speech: np.ndarray) -> None:
    probs = vad.speech_probabilities(speech)
    assert len(probs) == -(-len(speech) // FRAME)
    assert (probs > 0.5).mean() > 0.5


@pytest.mark.parametrize(
    "audio", [noise(3.0), np.zeros(48000, np.float32)], ids=["low-noise", "silence"]
)
def test_no_speech_in_noise_or_silence(vad: SileroVAD, audio: np.ndarray) -> None:
    assert (vad.speech_probabilities(audio) < 0.5).all()


def test_batched_equals_per_stream(vad: SileroVAD, speech: np.ndarray) -> None:
    clips = [
        speech,
        espeak("Hello there, how are you today?"),
        noise(2.0),
        np.zeros(8000, np.float32),
    ]
    n = max(len(c) for c in clips) // FRAME + 1
    framed = [frames_of(c, n) for c in clips]
    states = [vad.new_state() for _ in clips]
    batched = np.stack(
        [vad.process(np.stack([f[k] for f in framed]), states) for k in range(n)], axis=1
    )
    single = np.stack([vad.speech_probabilities(f.reshape(-1)) for f in framed])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    assert (batched[0] > 0.5).any() and (batched[3] < 0.5).all()


def test_state_carries_across_calls(vad: SileroVAD, speech: np.ndarray) -> None:
    n = -(-len(speech) // FRAME)
    state = vad.new_state()
    step_by_step = np.array([vad.process(f[None], [state])[0] for f in frames_of(speech, n)])
    np.testing.assert_allclose(step_by_step, vad.speech_probabilities(speech), atol=1e-6)
    # A fresh state is not the carried one: the recurrence is really being used.
    assert np.abs(state.state).sum() > 0
    state.reset()
    assert np.abs(state.state).sum() == 0 and np.abs(state.context).sum() == 0


def test_streams_joining_late_are_independent(vad: SileroVAD, speech: np.ndarray) -> None:
    """A stream that joins a running batch gets the same result as running alone."""
    n = 20
    a, b = frames_of(speech, n), frames_of(speech[FRAME * 7 :], n)
    sa, sb = vad.new_state(), vad.new_state()
    out_b = []
    for k in range(n):
        if k < 5:
            vad.process(a[k][None], [sa])
        else:
            out_b.append(vad.process(np.stack([a[k], b[k - 5]]), [sa, sb])[1])
    alone = vad.speech_probabilities(b[: n - 5].reshape(-1))
    np.testing.assert_allclose(out_b, alone, atol=1e-5)


def test_bad_input_and_missing_file(vad: SileroVAD) -> None:
    with pytest.raises(ValueError, match="512"):
        vad.process(np.zeros((1, 480), np.float32), [VADState()])
    with pytest.raises(ValueError, match="states"):
        vad.process(np.zeros((2, FRAME), np.float32), [VADState()])
    assert vad.process(np.zeros((0, FRAME), np.float32), []).shape == (0,)
    assert vad.speech_probabilities(np.zeros(0, np.float32)).shape == (0,)
    with pytest.raises(ModelUnavailableError, match="nowhere.onnx"):
        SileroVAD.load("/nowhere.onnx")
