"""PCM16 <-> float conversion and base64 audio."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from voxline.codecs.pcm import (
    b64decode_audio,
    b64encode_audio,
    float_to_int16,
    float_to_pcm16,
    pcm16_to_float,
    pcm16_to_int16,
)
from voxline.errors import AudioFormatError

unit_floats = hnp.arrays(
    np.float32,
    st.integers(0, 512),
    elements=st.floats(-1.0, 1.0, width=32, allow_nan=False),
)


def test_pcm16_is_little_endian_and_scaled_by_32768() -> None:
    data = bytes([0x00, 0x80, 0xFF, 0x7F, 0x00, 0x40, 0xFF, 0xFF])
    np.testing.assert_array_equal(pcm16_to_int16(data), [-32768, 32767, 16384, -1])
    np.testing.assert_array_equal(pcm16_to_float(data), [-1.0, 32767 / 32768, 0.5, -1 / 32768])
    assert pcm16_to_float(data).dtype == np.float32


def test_float_to_pcm16_clips_and_rounds() -> None:
    x = np.array([-2.0, -1.0, 1.0, 3.0, 0.4 / 32768, 0.6 / 32768, -0.6 / 32768], np.float32)
    np.testing.assert_array_equal(
        np.frombuffer(float_to_pcm16(x), "<i2"), [-32768, -32768, 32767, 32767, 0, 1, -1]
    )


def test_non_finite_floats_map_to_defined_samples() -> None:
    x = np.array([np.nan, np.inf, -np.inf], np.float32)
    np.testing.assert_array_equal(float_to_int16(x), [0, 32767, -32768])


def test_odd_byte_count_names_the_count() -> None:
    with pytest.raises(AudioFormatError, match="got 3 bytes"):
        pcm16_to_float(b"\x00\x01\x02")


def test_empty_input() -> None:
    assert pcm16_to_float(b"").shape == (0,)
    assert float_to_pcm16(np.zeros(0, np.float32)) == b""


@given(unit_floats)
def test_float_pcm16_round_trip_within_one_lsb(x: np.ndarray) -> None:
    y = pcm16_to_float(float_to_pcm16(x))
    assert y.shape == x.shape
    if len(x):
        assert np.max(np.abs(y - x)) <= 1 / 32768


@given(st.binary(max_size=256).filter(lambda b: len(b) % 2 == 0))
def test_pcm16_bytes_round_trip_exactly(data: bytes) -> None:
    assert float_to_pcm16(pcm16_to_float(data)) == data


@given(st.binary(max_size=256))
def test_base64_round_trip(data: bytes) -> None:
    text = b64encode_audio(data)
    assert isinstance(text, str)
    assert b64decode_audio(text) == data


@pytest.mark.parametrize("bad", ["abc", "!!!!", "AAA=A===", "AA\nAA"])
def test_invalid_base64_raises_audio_format_error(bad: str) -> None:
    with pytest.raises(AudioFormatError, match="not valid base64"):
        b64decode_audio(bad)
