"""WAV reading (PCM 8/16/24/32, float, G.711, multi-channel, streamed) and writing."""

from __future__ import annotations

import struct
import wave
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from voxline.codecs import g711
from voxline.codecs.pcm import float_to_pcm16
from voxline.codecs.wav import read_wav, wav_bytes, write_wav
from voxline.errors import AudioFormatError


def _riff(fmt_tag: int, channels: int, rate: int, bits: int, payload: bytes, **kw) -> bytes:
    """Hand-built WAV bytes: fmt chunk (optionally EXTENSIBLE) then data."""
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", fmt_tag, channels, rate, rate * block, block, bits)
    if kw.get("extensible"):
        guid_tail = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
        fmt = struct.pack("<HHIIHH", 0xFFFE, channels, rate, rate * block, block, bits)
        fmt += struct.pack("<HHI", 22, bits, 0) + struct.pack("<H", fmt_tag) + guid_tail
    data_size = kw.get("data_size", len(payload))
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    if kw.get("list_chunk"):
        body += b"LIST" + struct.pack("<I", 3) + b"abc\x00"  # odd size -> pad byte
    body += b"data" + struct.pack("<I", data_size) + payload
    return b"RIFF" + struct.pack("<I", len(body)) + body


def _pcm24(samples: np.ndarray) -> bytes:
    return b"".join(int(v).to_bytes(3, "little", signed=True) for v in samples)


RAMP = np.linspace(-0.75, 0.75, 64, dtype=np.float32)


def test_pcm16_mono_via_stdlib_wave_file(tmp_path: Path) -> None:
    path = tmp_path / "a.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(float_to_pcm16(RAMP))
    audio, rate = read_wav(path)
    assert rate == 16000 and audio.dtype == np.float32
    np.testing.assert_allclose(audio, RAMP, atol=1 / 32768)


@pytest.mark.parametrize(
    ("tag", "bits", "encode", "atol"),
    [
        (1, 8, lambda x: (np.rint(x * 127) + 128).astype(np.uint8).tobytes(), 1 / 64),
        (1, 24, lambda x: _pcm24(np.rint(x * 2**23).astype(np.int64)), 1e-6),
        (1, 32, lambda x: np.rint(x * 2**31).astype("<i4").tobytes(), 1e-6),
        (3, 32, lambda x: x.astype("<f4").tobytes(), 0),
        (3, 64, lambda x: x.astype("<f8").tobytes(), 0),
        (7, 8, g711.float_to_ulaw, 0.03),
        (6, 8, g711.float_to_alaw, 0.03),
    ],
)
@pytest.mark.parametrize("extensible", [False, True])
def test_sample_formats(tag: int, bits: int, encode, atol: float, extensible: bool) -> None:
    audio, rate = read_wav(_riff(tag, 1, 8000, bits, encode(RAMP), extensible=extensible))
    assert rate == 8000
    np.testing.assert_allclose(audio, RAMP, atol=atol)


def test_stereo_is_downmixed_by_averaging() -> None:
    left, right = RAMP, np.full_like(RAMP, 0.25)
    interleaved = np.stack([left, right], axis=1).reshape(-1)
    audio, _ = read_wav(_riff(3, 2, 24000, 32, interleaved.astype("<f4").tobytes()))
    np.testing.assert_allclose(audio, (left + right) / 2, atol=1e-7)


def test_skips_unknown_chunks_with_pad_byte() -> None:
    audio, _ = read_wav(_riff(1, 1, 8000, 16, float_to_pcm16(RAMP), list_chunk=True))
    assert len(audio) == len(RAMP)


@pytest.mark.parametrize("declared", [0, 0xFFFFFFFF, 10**6])
def test_streamed_header_reads_data_present(declared: int) -> None:
    payload = float_to_pcm16(RAMP) + b"\x01"  # plus a trailing partial sample
    audio, _ = read_wav(_riff(1, 1, 8000, 16, payload, data_size=declared))
    assert len(audio) == len(RAMP)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"OggS" + bytes(40), "not a WAV file"),
        (b"", "not a WAV file"),
        (_riff(85, 1, 8000, 16, b""), "unsupported WAV format tag 0x0055"),
        (_riff(1, 1, 8000, 12, b""), "12 bits"),
        (b"RIFF\x04\x00\x00\x00WAVE", "no fmt chunk"),
        (_riff(1, 1, 8000, 16, b"")[:36], "no data chunk"),
    ],
)
def test_bad_input_raises_clear_error(data: bytes, message: str) -> None:
    with pytest.raises(AudioFormatError, match=message):
        read_wav(data)


def test_write_wav_is_pcm16_mono(tmp_path: Path) -> None:
    path = tmp_path / "out.wav"
    write_wav(path, RAMP, 22050)
    with wave.open(str(path), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 22050)
    assert path.read_bytes() == wav_bytes(RAMP, 22050)


def test_write_rejects_multichannel() -> None:
    with pytest.raises(AudioFormatError, match="mono"):
        wav_bytes(np.zeros((4, 2), np.float32), 8000)


@given(
    audio=hnp.arrays(
        np.float32, st.integers(0, 400), elements=st.floats(-1, 1, width=32, allow_nan=False)
    ),
    rate=st.sampled_from([8000, 16000, 22050, 24000, 48000]),
)
def test_write_read_round_trip(audio: np.ndarray, rate: int) -> None:
    back, back_rate = read_wav(wav_bytes(audio, rate))
    assert back_rate == rate and back.shape == audio.shape
    if len(audio):
        assert np.max(np.abs(back - audio)) <= 1 / 32768
