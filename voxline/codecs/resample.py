"""Sample-rate conversion with soxr: a stateful per-stream resampler and a one-shot helper.

Feeding a signal through one ``Resampler`` in chunks of any size and then calling
``flush()`` yields the same samples as ``resample()`` on the whole signal.
"""

from __future__ import annotations

import numpy as np
import soxr

from voxline.errors import AudioFormatError

QUALITIES = ("QQ", "LQ", "MQ", "HQ", "VHQ")


def _check_rates(in_rate: int, out_rate: int) -> None:
    for name, rate in (("in_rate", in_rate), ("out_rate", out_rate)):
        if rate <= 0:
            raise AudioFormatError(f"{name} must be a positive sample rate, got {rate}")


def _mono_float32(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 1:
        raise AudioFormatError(f"expected mono 1-D float32 audio, got shape {x.shape}")
    return x


class Resampler:
    """Streaming mono float32 resampler for one stream; keeps filter state between chunks.

    Output lags input by the filter delay; ``flush()`` drains it and leaves the
    resampler ready for a fresh signal. With equal rates audio passes through.
    """

    def __init__(self, in_rate: int, out_rate: int, quality: str = "HQ") -> None:
        _check_rates(in_rate, out_rate)
        if quality not in QUALITIES:
            raise AudioFormatError(f"quality must be one of {QUALITIES}, got {quality!r}")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self.quality = quality
        self._stream: soxr.ResampleStream | None = None
        if in_rate != out_rate:
            self._stream = soxr.ResampleStream(in_rate, out_rate, 1, "float32", quality)

    @property
    def passthrough(self) -> bool:
        return self._stream is None

    def process(self, x: np.ndarray, last: bool = False) -> np.ndarray:
        """Resample the next chunk; ``last=True`` also drains and resets (as ``flush``)."""
        x = _mono_float32(x)
        if self._stream is None:
            return x
        out = self._stream.resample_chunk(x, last=last)
        if last:
            self._stream.clear()
        return out

    def flush(self) -> np.ndarray:
        """Return the samples still held in the filter and reset for a new signal."""
        return self.process(np.zeros(0, dtype=np.float32), last=True)

    def reset(self) -> None:
        """Drop buffered state without emitting it (e.g. on barge-in)."""
        if self._stream is not None:
            self._stream.clear()


def resample(x: np.ndarray, in_rate: int, out_rate: int, quality: str = "HQ") -> np.ndarray:
    """Resample a whole mono float32 signal; output length is ``round(len * out/in)``."""
    _check_rates(in_rate, out_rate)
    x = _mono_float32(x)
    if in_rate == out_rate:
        return x
    return soxr.resample(x, in_rate, out_rate, quality)
