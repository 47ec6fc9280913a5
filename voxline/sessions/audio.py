"""A session's audio edges: wire input -> engine input, engine output -> paced wire frames."""

from __future__ import annotations

import numpy as np

from voxline.codecs.chunker import FrameChunker
from voxline.codecs.resample import Resampler
from voxline.codecs.wire import BYTES_PER_SAMPLE, Encoding, decode_samples, encode_samples
from voxline.engines.protocol import INPUT_RATE
from voxline.errors import AudioFormatError


class InputConverter:
    """Wire audio (any supported encoding/rate) -> float32 at the engine's 16 kHz."""

    def __init__(self, encoding: Encoding, rate: int) -> None:
        self.encoding = encoding
        self.rate = rate
        self._resampler = Resampler(rate, INPUT_RATE)
        self.received_ms = 0.0  # wire audio accepted so far

    def convert(self, data: bytes) -> np.ndarray:
        """Decode and resample one append; raises AudioFormatError with nothing consumed."""
        width = BYTES_PER_SAMPLE[self.encoding]
        if len(data) % width:
            raise AudioFormatError(
                f"{self.encoding} audio must be a whole number of {width}-byte samples, "
                f"got {len(data)} bytes")
        audio = decode_samples(data, self.encoding)
        self.received_ms += len(audio) * 1000 / self.rate
        return self._resampler.process(audio)


class OutputEncoder:
    """Engine audio (float32, any rate) -> wire frames of `frame_ms` in the output format."""

    def __init__(self, encoding: Encoding, rate: int, frame_ms: int = 40) -> None:
        self.encoding = encoding
        self.rate = rate
        self.frame_ms = frame_ms
        self._chunker = FrameChunker(rate * frame_ms // 1000)
        self._resampler: Resampler | None = None
        self._src_rate = 0

    def push(self, audio: np.ndarray, sample_rate: int) -> list[tuple[bytes, float]]:
        """Whole frames ready to send, as (wire bytes, milliseconds)."""
        if self._resampler is None or sample_rate != self._src_rate:
            self._resampler = Resampler(sample_rate, self.rate)
            self._src_rate = sample_rate
        return self._encode(self._chunker.feed(self._resampler.process(audio)))

    def flush(self) -> list[tuple[bytes, float]]:
        """The rest of the audio (end of a response), without padding."""
        frames = []
        if self._resampler is not None:
            frames = self._chunker.feed(self._resampler.flush())
        tail = self._chunker.flush(pad=False)
        if tail is not None and len(tail):
            frames.append(tail)
        return self._encode(frames)

    def _encode(self, frames: list[np.ndarray]) -> list[tuple[bytes, float]]:
        return [(encode_samples(f, self.encoding), len(f) * 1000 / self.rate) for f in frames]
