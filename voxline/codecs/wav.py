"""WAV files: read any common PCM/float/G.711 WAV to float32 mono; write PCM16 mono.

Reading parses RIFF chunks directly, because stdlib ``wave`` (3.11) rejects float
and WAVE_FORMAT_EXTENSIBLE files. Streamed WAVs whose header declares a data
size larger than the file (0, 0xFFFFFFFF, ...) are read up to the end of the data
present; a trailing partial sample frame is dropped.
"""

from __future__ import annotations

import io
import os
import struct
import wave
from dataclasses import dataclass

import numpy as np

from voxline.codecs.g711 import alaw_to_float, ulaw_to_float
from voxline.codecs.pcm import BytesLike, float_to_pcm16
from voxline.errors import AudioFormatError

WAVE_FORMAT_PCM = 0x0001
WAVE_FORMAT_IEEE_FLOAT = 0x0003
WAVE_FORMAT_ALAW = 0x0006
WAVE_FORMAT_MULAW = 0x0007
WAVE_FORMAT_EXTENSIBLE = 0xFFFE

_SUPPORTED = {
    WAVE_FORMAT_PCM: (8, 16, 24, 32),
    WAVE_FORMAT_IEEE_FLOAT: (32, 64),
    WAVE_FORMAT_ALAW: (8,),
    WAVE_FORMAT_MULAW: (8,),
}


@dataclass(frozen=True)
class WavFormat:
    """The fields of a ``fmt `` chunk that decoding needs."""

    format_tag: int
    channels: int
    sample_rate: int
    bits_per_sample: int

    @property
    def block_align(self) -> int:
        return self.channels * (self.bits_per_sample // 8)

    @classmethod
    def parse(cls, body: bytes) -> WavFormat:
        if len(body) < 16:
            raise AudioFormatError(f"WAV fmt chunk is {len(body)} bytes, expected at least 16")
        tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", body)
        if tag == WAVE_FORMAT_EXTENSIBLE:
            if len(body) < 26:
                raise AudioFormatError("WAVE_FORMAT_EXTENSIBLE fmt chunk lacks its sub-format")
            (tag,) = struct.unpack_from("<H", body, 24)
        fmt = cls(tag, channels, rate, bits)
        fmt.validate()
        return fmt

    def validate(self) -> None:
        if self.format_tag not in _SUPPORTED:
            raise AudioFormatError(
                f"unsupported WAV format tag 0x{self.format_tag:04x} "
                "(supported: PCM, IEEE float, A-law, μ-law)"
            )
        if self.bits_per_sample not in _SUPPORTED[self.format_tag]:
            raise AudioFormatError(
                f"unsupported WAV sample width: {self.bits_per_sample} bits "
                f"for format tag 0x{self.format_tag:04x}"
            )
        if self.channels < 1 or self.sample_rate < 1:
            raise AudioFormatError(
                f"invalid WAV header: {self.channels} channels at {self.sample_rate} Hz"
            )


def _chunks(data: bytes):
    """Yield (chunk id, declared size, body offset) for each RIFF sub-chunk."""
    pos = 12
    while pos + 8 <= len(data):
        cid, size = struct.unpack_from("<4sI", data, pos)
        yield cid, size, pos + 8
        pos += 8 + size + (size & 1)


def _parse(data: bytes) -> tuple[WavFormat, bytes]:
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise AudioFormatError(
            f"not a WAV file: expected a RIFF/WAVE header, got {bytes(data[:12])!r}"
        )
    fmt: WavFormat | None = None
    for cid, size, start in _chunks(data):
        if cid == b"fmt ":
            fmt = WavFormat.parse(data[start : start + size])
        elif cid == b"data":
            if fmt is None:
                raise AudioFormatError("WAV data chunk comes before its fmt chunk")
            streamed = size == 0 or start + size > len(data)
            return fmt, data[start:] if streamed else data[start : start + size]
    if fmt is None:
        raise AudioFormatError("WAV file has no fmt chunk")
    raise AudioFormatError("WAV file has no data chunk")


def _samples(fmt: WavFormat, body: bytes) -> np.ndarray:
    """Decode interleaved sample bytes to float32, shape (frames, channels)."""
    usable = len(body) - len(body) % fmt.block_align
    raw = np.frombuffer(body, dtype=np.uint8, count=usable)
    tag, bits = fmt.format_tag, fmt.bits_per_sample
    if tag == WAVE_FORMAT_MULAW:
        x = ulaw_to_float(raw)
    elif tag == WAVE_FORMAT_ALAW:
        x = alaw_to_float(raw)
    elif tag == WAVE_FORMAT_IEEE_FLOAT:
        x = raw.view("<f4" if bits == 32 else "<f8").astype(np.float32)
    elif bits == 8:
        x = (raw.astype(np.float32) - 128.0) / 128.0
    elif bits == 24:
        wide = np.zeros((usable // 3, 4), dtype=np.uint8)
        wide[:, 1:] = raw.reshape(-1, 3)
        x = wide.view("<i4").reshape(-1).astype(np.float32) / np.float32(2.0**31)
    else:
        dtype = "<i2" if bits == 16 else "<i4"
        x = raw.view(dtype).astype(np.float32) / np.float32(2.0 ** (bits - 1))
    return x.reshape(-1, fmt.channels)


def read_wav(source: str | os.PathLike[str] | BytesLike) -> tuple[np.ndarray, int]:
    """Read a WAV file or its bytes -> (float32 mono samples, sample rate).

    Multi-channel audio is downmixed by averaging the channels.
    """
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
    else:
        with open(source, "rb") as f:
            data = f.read()
    fmt, body = _parse(data)
    frames = _samples(fmt, body)
    mono = frames[:, 0] if fmt.channels == 1 else frames.mean(axis=1, dtype=np.float32)
    return np.ascontiguousarray(mono, dtype=np.float32), fmt.sample_rate


def _write(target: str | os.PathLike[str] | io.BytesIO, audio: np.ndarray, rate: int) -> None:
    audio = np.asarray(audio)
    if audio.ndim != 1:
        raise AudioFormatError(f"write_wav takes mono 1-D audio, got shape {audio.shape}")
    if rate <= 0:
        raise AudioFormatError(f"sample rate must be positive, got {rate}")
    with wave.open(target if isinstance(target, io.BytesIO) else os.fspath(target), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(float_to_pcm16(audio))


def write_wav(path: str | os.PathLike[str], audio: np.ndarray, rate: int) -> None:
    """Write float mono audio as a PCM16 mono WAV file (clipped to [-1, 1])."""
    _write(path, audio, rate)


def wav_bytes(audio: np.ndarray, rate: int) -> bytes:
    """The bytes ``write_wav`` would write."""
    buf = io.BytesIO()
    _write(buf, audio, rate)
    return buf.getvalue()
