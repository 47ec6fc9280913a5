"""Opus packets, Ogg Opus and FLAC files through PyAV."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from voxline.codecs.opus import (
    OpusDecoder,
    OpusEncoder,
    decode_audio_file,
    encode_flac,
    encode_ogg_opus,
)
from voxline.codecs.pcm import float_to_pcm16
from voxline.errors import AudioFormatError

RATE = 48000
FRAME = 960  # 20 ms at 48 kHz


def _sine(rate: int = RATE, seconds: float = 1.0, hz: float = 440.0) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * hz * np.arange(int(rate * seconds)) / rate)).astype(np.float32)


def _snr_db(ref: np.ndarray, out: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref**2) / np.sum((ref - out) ** 2)))


def _encode_frames(enc: OpusEncoder, x: np.ndarray, step: int) -> list[bytes]:
    packets: list[bytes] = []
    for i in range(0, len(x), step):
        packets += enc.encode(x[i : i + step])
    return packets


def test_one_second_sine_round_trip() -> None:
    x = _sine()
    enc, dec = OpusEncoder(rate=RATE, bitrate=32000), OpusDecoder()
    packets = _encode_frames(enc, x, FRAME)
    assert len(packets) == len(x) // FRAME  # one packet per 20 ms frame, no lag in packets
    tail = enc.flush()
    assert len(tail) >= 1  # the look-ahead still held by the codec
    y = np.concatenate([dec.decode(p) for p in packets + tail])
    assert y.dtype == np.float32 and y.ndim == 1
    assert enc.pre_skip == 312
    aligned = y[enc.pre_skip : enc.pre_skip + len(x)]
    assert len(aligned) == len(x)
    assert np.corrcoef(x, aligned)[0, 1] > 0.999
    assert _snr_db(x[FRAME:], aligned[FRAME:]) > 25


def test_voip_mode_round_trip_up_to_its_filter_phase() -> None:
    x = _sine()
    enc, dec = OpusEncoder(application="voip"), OpusDecoder()
    y = np.concatenate([dec.decode(p) for p in enc.encode(x) + enc.flush()])
    n = len(x) - 4 * FRAME
    best = max(
        np.corrcoef(x[FRAME : FRAME + n], y[lag + FRAME : lag + FRAME + n])[0, 1]
        for lag in range(enc.pre_skip - 8, enc.pre_skip + 9)
    )
    assert best > 0.99


def test_odd_sized_input_is_buffered_into_frames() -> None:
    x = _sine(seconds=0.2)
    enc = OpusEncoder()
    packets = _encode_frames(enc, x, 333)
    assert len(packets) == len(x) // FRAME
    assert len(enc.flush()) >= 1


def test_int16_and_pcm16_bytes_input() -> None:
    x = _sine(seconds=0.1)
    pcm = float_to_pcm16(x)
    assert len(OpusEncoder().encode(pcm)) == 5
    assert len(OpusEncoder().encode(np.frombuffer(pcm, "<i2").astype(np.int16))) == 5


def test_encoder_is_reusable_after_flush() -> None:
    x = _sine(seconds=0.1)
    enc = OpusEncoder()
    first = enc.encode(x) + enc.flush()
    second = enc.encode(x) + enc.flush()
    assert first == second


@pytest.mark.parametrize("rate", [8000, 16000, 24000])
def test_narrower_encode_rates(rate: int) -> None:
    enc = OpusEncoder(rate=rate)
    assert enc.frame_samples == rate // 50
    assert len(enc.encode(_sine(rate, 0.2))) == 10


def test_decoder_resamples_to_requested_rate() -> None:
    x = _sine()
    enc, dec = OpusEncoder(), OpusDecoder(rate=16000)
    packets = enc.encode(x) + enc.flush()
    y = np.concatenate([dec.decode(p) for p in packets] + [dec.flush()])
    assert len(y) == FRAME * len(packets) // 3  # every decoded 48 kHz sample, at a third
    spectrum = np.abs(np.fft.rfft(y))
    assert np.argmax(spectrum) * 16000 / len(y) == pytest.approx(440, abs=2)


def test_stereo_round_trip() -> None:
    x = _sine(seconds=0.5)
    stereo = np.stack([x, -x], axis=1)
    enc, dec = OpusEncoder(channels=2, bitrate=64000), OpusDecoder(channels=2)
    y = np.concatenate([dec.decode(p) for p in enc.encode(stereo) + enc.flush()])
    y = np.concatenate([y, dec.flush()])
    assert y.shape[1] == 2
    aligned = y[enc.pre_skip : enc.pre_skip + len(x)]
    assert np.corrcoef(stereo[:, 0], aligned[:, 0])[0, 1] > 0.99
    assert np.corrcoef(stereo[:, 1], aligned[:, 1])[0, 1] > 0.99


def test_bad_arguments_and_packets() -> None:
    with pytest.raises(AudioFormatError, match="22050"):
        OpusEncoder(rate=22050)
    with pytest.raises(AudioFormatError, match="channels"):
        OpusEncoder(channels=3)
    with pytest.raises(AudioFormatError, match="shaped"):
        OpusEncoder().encode(np.zeros((960, 2), np.float32))
    with pytest.raises(AudioFormatError, match="empty Opus packet"):
        OpusDecoder().decode(b"")
    with pytest.raises(AudioFormatError, match="invalid Opus packet"):
        OpusDecoder().decode(b"\xff\xff\xff")


@pytest.mark.parametrize("rate", [48000, 24000, 22050])
def test_ogg_opus_file_round_trip_keeps_length(rate: int) -> None:
    x = _sine(rate, 0.5)[:-37]  # not a whole number of frames
    data = encode_ogg_opus(x, rate)
    assert data[:4] == b"OggS" and b"OpusHead" in data[:100]
    y, out_rate = decode_audio_file(data, rate=rate)
    assert out_rate == rate
    assert abs(len(y) - len(x)) <= 1  # pre-skip and end trimming honoured
    n = min(len(x), len(y))
    assert np.corrcoef(x[:n], y[:n])[0, 1] > 0.999


def test_ogg_opus_decodes_natively_at_48k() -> None:
    y, rate = decode_audio_file(encode_ogg_opus(_sine(24000, 0.2), 24000))
    assert rate == 48000 and len(y) == 9600


def test_flac_is_lossless_on_pcm16_grid() -> None:
    x = _sine(22050, 0.3)
    data = encode_flac(x, 22050)
    assert data[:4] == b"fLaC"
    y, rate = decode_audio_file(data)
    assert rate == 22050
    np.testing.assert_array_equal(float_to_pcm16(y), float_to_pcm16(x))


def test_decode_audio_file_scales_int32_and_downmixes(tmp_path: Path) -> None:
    x = _sine(16000, 0.1)
    pcm32 = np.rint(np.stack([x, x / 2], axis=1) * 2.0**31).astype("<i4")
    path = tmp_path / "s32.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(4)
        w.setframerate(16000)
        w.writeframes(pcm32.tobytes())
    y, rate = decode_audio_file(path.read_bytes())
    assert rate == 16000
    np.testing.assert_allclose(y, 0.75 * x, atol=1e-6)


def test_decode_audio_file_rejects_garbage() -> None:
    with pytest.raises(AudioFormatError, match="cannot decode audio file"):
        decode_audio_file(b"definitely not audio" * 8)
