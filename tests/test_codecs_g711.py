"""G.711 μ-law / A-law: bit-exact with CPython's audioop over every input."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis.extra import numpy as hnp

from voxline.codecs import g711
from voxline.codecs.pcm import float_to_pcm16, int16_to_float
from voxline.errors import AudioFormatError

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop  # stdlib until 3.13; the reference implementation

ALL_INT16 = np.arange(-32768, 32768, dtype=np.int16)
ALL_PCM16 = ALL_INT16.astype("<i2").tobytes()
ALL_CODES = bytes(range(256))
MULAW_NEGATIVE_ZERO = 0x7F


def test_ulaw_encode_matches_audioop_for_every_sample() -> None:
    assert g711.ulaw_encode(ALL_INT16) == audioop.lin2ulaw(ALL_PCM16, 2)
    assert g711.ulaw_encode(ALL_PCM16) == audioop.lin2ulaw(ALL_PCM16, 2)


def test_alaw_encode_matches_audioop_for_every_sample() -> None:
    assert g711.alaw_encode(ALL_INT16) == audioop.lin2alaw(ALL_PCM16, 2)
    assert g711.alaw_encode(ALL_PCM16) == audioop.lin2alaw(ALL_PCM16, 2)


def test_ulaw_decode_matches_audioop_for_every_code() -> None:
    assert g711.ulaw_decode_pcm16(ALL_CODES) == audioop.ulaw2lin(ALL_CODES, 2)
    assert g711.ulaw_decode(ALL_CODES).dtype == np.int16


def test_alaw_decode_matches_audioop_for_every_code() -> None:
    assert g711.alaw_decode_pcm16(ALL_CODES) == audioop.alaw2lin(ALL_CODES, 2)
    assert g711.alaw_decode(ALL_CODES).dtype == np.int16


def test_alaw_every_code_survives_decode_encode() -> None:
    assert g711.alaw_encode(g711.alaw_decode(ALL_CODES)) == ALL_CODES


def test_ulaw_every_code_survives_decode_encode_except_negative_zero() -> None:
    again = g711.ulaw_encode(g711.ulaw_decode(ALL_CODES))
    changed = [c for c in range(256) if again[c] != c]
    assert changed == [MULAW_NEGATIVE_ZERO]
    assert again[MULAW_NEGATIVE_ZERO] == 0xFF  # -0 and +0 both decode to 0


@pytest.mark.parametrize(
    ("encode", "decode"),
    [(g711.ulaw_encode, g711.ulaw_decode), (g711.alaw_encode, g711.alaw_decode)],
)
def test_decoded_values_are_fixed_points(encode, decode) -> None:
    once = decode(encode(ALL_INT16))
    np.testing.assert_array_equal(decode(encode(once)), once)


@given(hnp.arrays(np.int16, hnp.array_shapes(max_dims=1, max_side=300)))
def test_float_helpers_agree_with_int_path(samples: np.ndarray) -> None:
    x = int16_to_float(samples)
    assert g711.float_to_ulaw(x) == g711.ulaw_encode(samples)
    assert g711.float_to_alaw(x) == g711.alaw_encode(samples)
    ucodes = g711.ulaw_encode(samples)
    np.testing.assert_array_equal(
        g711.ulaw_to_float(ucodes), int16_to_float(g711.ulaw_decode(ucodes))
    )
    acodes = g711.alaw_encode(samples)
    np.testing.assert_array_equal(
        g711.alaw_to_float(acodes), int16_to_float(g711.alaw_decode(acodes))
    )


def test_float_path_matches_audioop_on_a_tone() -> None:
    x = 0.8 * np.sin(2 * np.pi * 300 * np.arange(8000) / 8000)
    assert g711.float_to_ulaw(x) == audioop.lin2ulaw(float_to_pcm16(x), 2)
    assert g711.float_to_alaw(x) == audioop.lin2alaw(float_to_pcm16(x), 2)


def test_one_byte_per_sample_and_empty_input() -> None:
    assert len(g711.ulaw_encode(np.zeros(160, np.int16))) == 160
    assert g711.alaw_encode(b"") == b""
    assert g711.ulaw_decode(b"").shape == (0,)


def test_wrong_input_types_are_rejected() -> None:
    with pytest.raises(AudioFormatError, match="float_to_ulaw"):
        g711.ulaw_encode(np.zeros(4, np.float32))
    with pytest.raises(AudioFormatError, match="got 3 bytes"):
        g711.alaw_encode(b"\x00\x00\x00")
