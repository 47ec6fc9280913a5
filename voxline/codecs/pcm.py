"""PCM16 little-endian bytes <-> numpy samples, and base64 audio for JSON wire formats.

Scale convention: int16 ``s`` maps to float ``s / 32768`` (so floats lie in
[-1, 1 - 1/32768]); floats map back by ``round(x * 32768)`` clipped to int16.
A float -> PCM16 -> float round trip is exact to within 1/32768.
"""

from __future__ import annotations

import base64
import binascii

import numpy as np

from voxline.errors import AudioFormatError

PCM16_SCALE = 32768.0
_PCM16_LE = np.dtype("<i2")

BytesLike = bytes | bytearray | memoryview


def pcm16_to_int16(data: BytesLike) -> np.ndarray:
    """Interpret PCM16 LE bytes as native int16 samples (a copy, writable)."""
    if len(data) % 2:
        raise AudioFormatError(
            f"PCM16 audio must have an even number of bytes (2 per sample), got {len(data)} bytes"
        )
    return np.frombuffer(data, dtype=_PCM16_LE).astype(np.int16)


def int16_to_pcm16(samples: np.ndarray) -> bytes:
    """Serialise int16 samples as PCM16 LE bytes."""
    return np.asarray(samples).astype(_PCM16_LE, copy=False).tobytes()


def int16_to_float(samples: np.ndarray) -> np.ndarray:
    """int16 samples -> float32 in [-1, 1)."""
    return np.asarray(samples, dtype=np.int16).astype(np.float32) / np.float32(PCM16_SCALE)


def float_to_int16(x: np.ndarray) -> np.ndarray:
    """float samples -> int16, clipping to [-1, 1] and rounding to nearest.

    NaN becomes 0 and +-inf become full scale, so a misbehaving model cannot
    produce undefined integer output.
    """
    x = np.nan_to_num(np.asarray(x, dtype=np.float32), nan=0.0, posinf=1.0, neginf=-1.0)
    scaled = np.rint(np.clip(x, -1.0, 1.0) * np.float32(PCM16_SCALE))
    return np.clip(scaled, -32768, 32767).astype(np.int16)


def pcm16_to_float(data: BytesLike) -> np.ndarray:
    """PCM16 LE bytes -> float32 samples in [-1, 1). Odd byte counts raise AudioFormatError."""
    return int16_to_float(pcm16_to_int16(data))


def float_to_pcm16(x: np.ndarray) -> bytes:
    """float samples -> PCM16 LE bytes (clipped to [-1, 1], rounded)."""
    return int16_to_pcm16(float_to_int16(x))


def b64encode_audio(data: BytesLike) -> str:
    """Audio bytes -> standard base64 text (as used by Realtime and Twilio JSON events)."""
    return base64.b64encode(data).decode("ascii")


def b64decode_audio(text: str | bytes) -> bytes:
    """Standard base64 text -> audio bytes; anything that is not strict base64 raises."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AudioFormatError(
            f"audio is not valid base64 ({len(text)} characters): {exc}"
        ) from exc
