"""Streaming resampler agrees with the one-shot resampler."""

from __future__ import annotations

import numpy as np
import pytest

from voxline.codecs.chunker import frame_samples
from voxline.codecs.resample import Resampler, resample
from voxline.errors import AudioFormatError

RATE_PAIRS = [(24000, 16000), (16000, 24000), (22050, 24000), (8000, 16000), (48000, 16000)]


def _signal(rate: int, seconds: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    noise = np.random.default_rng(rate).standard_normal(len(t))
    return (0.5 * np.sin(2 * np.pi * 440 * t) + 0.05 * noise).astype(np.float32)


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
def test_chunked_stream_equals_one_shot(in_rate: int, out_rate: int) -> None:
    x = _signal(in_rate)
    step = frame_samples(in_rate, 20)
    r = Resampler(in_rate, out_rate)
    parts = [r.process(x[i : i + step]) for i in range(0, len(x), step)]
    streamed = np.concatenate([*parts, r.flush()])
    whole = resample(x, in_rate, out_rate)
    assert streamed.dtype == whole.dtype == np.float32
    assert len(streamed) == len(whole) == round(len(x) * out_rate / in_rate)
    assert np.max(np.abs(streamed - whole)) < 1e-4


def test_flush_resets_for_next_signal() -> None:
    x = _signal(24000, 0.1)
    r = Resampler(24000, 16000)
    first = np.concatenate([r.process(x), r.flush()])
    second = np.concatenate([r.process(x), r.flush()])
    np.testing.assert_array_equal(first, second)


def test_resampled_tone_keeps_its_frequency() -> None:
    x = np.sin(2 * np.pi * 1000 * np.arange(24000) / 24000).astype(np.float32)
    y = resample(x, 24000, 16000)
    spectrum = np.abs(np.fft.rfft(y))
    assert np.argmax(spectrum) * 16000 / len(y) == pytest.approx(1000, abs=2)


def test_equal_rates_pass_through() -> None:
    x = _signal(16000, 0.05)
    r = Resampler(16000, 16000)
    assert r.passthrough
    np.testing.assert_array_equal(r.process(x), x)
    assert len(r.flush()) == 0
    np.testing.assert_array_equal(resample(x, 16000, 16000), x)


def test_invalid_arguments() -> None:
    with pytest.raises(AudioFormatError, match="in_rate"):
        Resampler(0, 16000)
    with pytest.raises(AudioFormatError, match="quality"):
        Resampler(8000, 16000, quality="best")
    with pytest.raises(AudioFormatError, match="mono"):
        resample(np.zeros((10, 2), np.float32), 8000, 16000)
