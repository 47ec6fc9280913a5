"""TimeStretch (voxline.codecs.tempo): speaking rate changed at the same pitch, streamed."""

from __future__ import annotations

import numpy as np
import pytest

from voxline.codecs.tempo import SPEED_RANGE, TimeStretch, time_stretch

RATE = 24000


def tone(freq: float = 220.0, seconds: float = 1.0) -> np.ndarray:
    return np.sin(2 * np.pi * freq * np.arange(int(RATE * seconds)) / RATE).astype(np.float32)


def peak_hz(x: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum)) * RATE / len(x)


@pytest.mark.parametrize("speed", [0.25, 0.5, 0.8, 1.25, 2.0, 4.0])
def test_duration_divides_by_speed_and_pitch_stays(speed):
    x = tone()
    y = time_stretch(x, RATE, speed)
    assert y.dtype == np.float32 and y.ndim == 1
    assert abs(len(y) - len(x) / speed) <= 0.05 * len(x) / speed
    assert abs(peak_hz(y) - 220.0) < 3.0


@pytest.mark.parametrize("speed", [0.3, 1.5, 3.0])
def test_chunked_input_gives_the_same_samples_as_one_push(speed):
    x = np.random.default_rng(1).standard_normal(RATE).astype(np.float32)
    sizes = np.random.default_rng(2).integers(1, 3000, size=200)
    stretch = TimeStretch(RATE, speed)
    parts, i = [], 0
    for size in sizes:
        if i >= len(x):
            break
        parts.append(stretch.push(x[i:i + size]))
        i += size
    parts.append(stretch.push(x[i:]))
    parts.append(stretch.flush())
    assert np.array_equal(np.concatenate(parts), time_stretch(x, RATE, speed))
    assert sum(len(p) > 0 for p in parts) > 10, "output streams out before the flush"


def test_a_clip_shorter_than_a_window_passes_unstretched():
    x = tone(seconds=0.01)
    assert np.array_equal(time_stretch(x, RATE, 2.0), x)
    assert len(time_stretch(np.zeros(0, np.float32), RATE, 2.0)) == 0


@pytest.mark.parametrize("speed", [0.1, 4.5, 0.0, -1.0])
def test_speed_outside_the_range_is_refused_naming_it(speed):
    with pytest.raises(ValueError, match=rf"speed must be in \[{SPEED_RANGE[0]}, {SPEED_RANGE[1]}\]"):
        TimeStretch(RATE, speed)


def test_push_after_flush_is_an_error():
    stretch = TimeStretch(RATE, 1.5)
    stretch.push(tone())
    stretch.flush()
    assert len(stretch.flush()) == 0
    with pytest.raises(RuntimeError, match="after flush"):
        stretch.push(tone())
