"""Voice-clone references for Qwen3-TTS Base checkpoints: normalise once, encode once.

A reference clip is normalised a single time (mono, 24 kHz -- the rate both the codec
encoder and the speaker encoder take -- and scaled down only if it clips, as the
reference package feeds float audio in [-1, 1] to both), then encoded into what the talker
prompt needs: the x-vector (speaker encoder) and, with a transcript, the codec codes and
the transcript's ids for in-context cloning. :class:`ReferenceCache` keeps encoded
references in LRU order by content, plus a registry of named ones, so a repeated voice
runs neither encoder again.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from torch import Tensor

from voxline.codecs import resample

__all__ = [
    "MAX_REFERENCE_SECONDS",
    "MIN_REFERENCE_SECONDS",
    "REFERENCE_RATE",
    "EncodedReference",
    "ReferenceCache",
    "normalize_reference",
    "reference_key",
]

REFERENCE_RATE = 24000
# The official guidance is a 3-20 s clip; shorter gives a poor x-vector, longer only
# lengthens every prompt (ICL puts all reference frames into it).
MIN_REFERENCE_SECONDS = 1.0
MAX_REFERENCE_SECONDS = 30.0


def normalize_reference(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """``audio`` ([n] or [n, channels]) as mono float32 at 24 kHz, peak at most 1."""
    x = np.asarray(audio, dtype=np.float32)
    if x.ndim == 2:
        x = x.mean(axis=1, dtype=np.float32)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"expected non-empty mono or [samples, channels] audio, got {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("the reference audio has NaN or infinite samples")
    if sample_rate != REFERENCE_RATE:
        x = resample(x, sample_rate, REFERENCE_RATE)
    peak = float(np.abs(x).max())
    if peak > 1.0:  # clipped input: the encoders were trained on [-1, 1]
        x = x / peak
    return np.array(x, dtype=np.float32)  # own, writable copy (torch wants one)


def check_duration(audio: np.ndarray, sample_rate: int = REFERENCE_RATE) -> float:
    """The clip's length in seconds; ValueError outside the supported range."""
    seconds = len(audio) / sample_rate
    if seconds < MIN_REFERENCE_SECONDS:
        raise ValueError(f"the reference audio is {seconds:.2f} s; at least "
                         f"{MIN_REFERENCE_SECONDS:g} s is needed")
    if seconds > MAX_REFERENCE_SECONDS:
        raise ValueError(f"the reference audio is {seconds:.2f} s; at most "
                         f"{MAX_REFERENCE_SECONDS:g} s is supported")
    return seconds


def reference_key(audio: bytes, sample_rate: int, text: str | None) -> str:
    """Content key of a reference: same samples, rate and transcript -> same encoding."""
    h = hashlib.sha256()
    h.update(sample_rate.to_bytes(4, "little"))
    h.update(b"\0" if text is None else b"\1" + text.encode())
    h.update(audio)
    return h.hexdigest()


@dataclass(frozen=True)
class EncodedReference:
    """What a cloned voice adds to every talker prompt."""

    speaker_embedding: Tensor  # [D] x-vector
    ref_ids: list[int] | None  # transcript ids (ref_text_ids); None: x-vector only
    ref_codes: Tensor | None  # [T, G] codec codes of the clip (ICL), also primed into code2wav


class ReferenceCache:
    """Encoded references: an LRU by content key, and named (registered) voices that are
    never evicted. Touched only from the speech model's own thread (the TTS worker)."""

    def __init__(self, capacity: int = 16) -> None:
        self.capacity = capacity
        self._lru: OrderedDict[str, EncodedReference] = OrderedDict()
        self._named: dict[str, EncodedReference] = {}

    def get(self, key: str) -> EncodedReference | None:
        hit = self._lru.get(key)
        if hit is not None:
            self._lru.move_to_end(key)
        return hit

    def put(self, key: str, encoded: EncodedReference) -> None:
        self._lru[key] = encoded
        self._lru.move_to_end(key)
        while len(self._lru) > self.capacity:
            self._lru.popitem(last=False)

    def named(self, name: str) -> EncodedReference | None:
        return self._named.get(name.lower())

    def set_named(self, name: str, encoded: EncodedReference) -> None:
        self._named[name.lower()] = encoded

    def drop_named(self, name: str) -> bool:
        return self._named.pop(name.lower(), None) is not None

    def names(self) -> list[str]:
        return sorted(self._named)

    def __len__(self) -> int:
        return len(self._lru)
