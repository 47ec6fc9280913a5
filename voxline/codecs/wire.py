"""Wire sample encodings (PCM16 LE, G.711 μ-law / A-law) <-> float32, by name."""

from __future__ import annotations

from typing import Literal

import numpy as np

from voxline.codecs.g711 import alaw_to_float, float_to_alaw, float_to_ulaw, ulaw_to_float
from voxline.codecs.pcm import float_to_pcm16, pcm16_to_float

Encoding = Literal["pcm16", "ulaw", "alaw"]

BYTES_PER_SAMPLE: dict[str, int] = {"pcm16": 2, "ulaw": 1, "alaw": 1}


def decode_samples(data: bytes, encoding: Encoding) -> np.ndarray:
    """Wire bytes -> float32 in [-1, 1]. PCM16 with an odd byte count raises AudioFormatError."""
    if encoding == "pcm16":
        return pcm16_to_float(data)
    if encoding == "ulaw":
        return ulaw_to_float(data)
    if encoding == "alaw":
        return alaw_to_float(data)
    raise ValueError(f"unknown encoding {encoding!r}")


def encode_samples(audio: np.ndarray, encoding: Encoding) -> bytes:
    """float32 -> wire bytes (clipped to [-1, 1])."""
    if encoding == "pcm16":
        return float_to_pcm16(audio)
    if encoding == "ulaw":
        return float_to_ulaw(audio)
    if encoding == "alaw":
        return float_to_alaw(audio)
    raise ValueError(f"unknown encoding {encoding!r}")
