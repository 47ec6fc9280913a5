"""G.711 μ-law (PCMU) and A-law (PCMA), vectorised with lookup tables.

Bit-exact with CPython's ``audioop`` (``lin2ulaw``/``ulaw2lin``/``lin2alaw``/
``alaw2lin`` at width 2): μ-law keeps the top 14 bits of a sample, A-law the top
13. Every code decodes to a value that encodes back to the same code, except
μ-law's negative zero 0x7F, which decodes to 0 and re-encodes as 0xFF.
"""

from __future__ import annotations

import numpy as np

from voxline.codecs.pcm import (
    BytesLike,
    float_to_int16,
    int16_to_pcm16,
    pcm16_to_int16,
)
from voxline.errors import AudioFormatError

_ULAW_BIAS = 0x84
_ULAW_CLIP = 8159  # largest 14-bit magnitude before the bias pushes it out of range
_ULAW_SEG_END = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
_ALAW_SEG_END = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])


def _ulaw_encode_table() -> np.ndarray:
    """uint8[65536]: μ-law code for each int16 sample, indexed by its uint16 bit pattern."""
    pcm = np.arange(65536, dtype=np.uint16).view(np.int16).astype(np.int32) >> 2
    mask = np.where(pcm < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(pcm), _ULAW_CLIP) + (_ULAW_BIAS >> 2)
    seg = np.searchsorted(_ULAW_SEG_END, mag, side="left")
    code = (seg << 4) | ((mag >> (np.minimum(seg, 7) + 1)) & 0xF)
    code = np.where(seg >= 8, 0x7F, code)
    return (code ^ mask).astype(np.uint8)


def _ulaw_decode_table() -> np.ndarray:
    """int16[256]: linear sample for each μ-law code."""
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + _ULAW_BIAS) << ((u & 0x70) >> 4)
    return np.where(u & 0x80, _ULAW_BIAS - t, t - _ULAW_BIAS).astype(np.int16)


def _alaw_encode_table() -> np.ndarray:
    """uint8[65536]: A-law code for each int16 sample, indexed by its uint16 bit pattern."""
    pcm = np.arange(65536, dtype=np.uint16).view(np.int16).astype(np.int32) >> 3
    mask = np.where(pcm >= 0, 0xD5, 0x55)
    mag = np.where(pcm >= 0, pcm, -pcm - 1)
    seg = np.searchsorted(_ALAW_SEG_END, mag, side="left")
    shift = np.where(seg < 2, 1, np.minimum(seg, 7))
    code = (seg << 4) | ((mag >> shift) & 0x0F)
    code = np.where(seg >= 8, 0x7F, code)
    return (code ^ mask).astype(np.uint8)


def _alaw_decode_table() -> np.ndarray:
    """int16[256]: linear sample for each A-law code."""
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a & 0x70) >> 4
    t = (a & 0x0F) << 4
    t = np.where(seg == 0, t + 8, (t + 0x108) << np.maximum(seg - 1, 0))
    return np.where(a & 0x80, t, -t).astype(np.int16)


_ULAW_ENC = _ulaw_encode_table()
_ULAW_DEC = _ulaw_decode_table()
_ALAW_ENC = _alaw_encode_table()
_ALAW_DEC = _alaw_decode_table()
_ULAW_DEC_F32 = _ULAW_DEC.astype(np.float32) / np.float32(32768.0)
_ALAW_DEC_F32 = _ALAW_DEC.astype(np.float32) / np.float32(32768.0)


def _as_int16(samples: np.ndarray | BytesLike) -> np.ndarray:
    if isinstance(samples, bytes | bytearray | memoryview):
        return pcm16_to_int16(samples)
    samples = np.asarray(samples)
    if samples.dtype != np.int16:
        raise AudioFormatError(
            f"G.711 encoding takes int16 samples or PCM16 bytes, got dtype {samples.dtype}"
            " (use float_to_ulaw/float_to_alaw for float audio)"
        )
    return samples


def _codes(data: BytesLike) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)


def ulaw_encode(samples: np.ndarray | BytesLike) -> bytes:
    """int16 samples (or PCM16 LE bytes) -> one μ-law byte per sample."""
    return _ULAW_ENC[_as_int16(samples).view(np.uint16)].tobytes()


def ulaw_decode(data: BytesLike) -> np.ndarray:
    """μ-law bytes -> int16 samples."""
    return _ULAW_DEC[_codes(data)]


def ulaw_decode_pcm16(data: BytesLike) -> bytes:
    """μ-law bytes -> PCM16 LE bytes (twice as long)."""
    return int16_to_pcm16(ulaw_decode(data))


def float_to_ulaw(x: np.ndarray) -> bytes:
    """float audio in [-1, 1] -> μ-law bytes (clipped like ``float_to_pcm16``)."""
    return _ULAW_ENC[float_to_int16(x).view(np.uint16)].tobytes()


def ulaw_to_float(data: BytesLike) -> np.ndarray:
    """μ-law bytes -> float32 samples on the PCM16 scale (``s / 32768``)."""
    return _ULAW_DEC_F32[_codes(data)]


def alaw_encode(samples: np.ndarray | BytesLike) -> bytes:
    """int16 samples (or PCM16 LE bytes) -> one A-law byte per sample."""
    return _ALAW_ENC[_as_int16(samples).view(np.uint16)].tobytes()


def alaw_decode(data: BytesLike) -> np.ndarray:
    """A-law bytes -> int16 samples."""
    return _ALAW_DEC[_codes(data)]


def alaw_decode_pcm16(data: BytesLike) -> bytes:
    """A-law bytes -> PCM16 LE bytes (twice as long)."""
    return int16_to_pcm16(alaw_decode(data))


def float_to_alaw(x: np.ndarray) -> bytes:
    """float audio in [-1, 1] -> A-law bytes (clipped like ``float_to_pcm16``)."""
    return _ALAW_ENC[float_to_int16(x).view(np.uint16)].tobytes()


def alaw_to_float(data: BytesLike) -> np.ndarray:
    """A-law bytes -> float32 samples on the PCM16 scale (``s / 32768``)."""
    return _ALAW_DEC_F32[_codes(data)]
