"""Cut a stream of arbitrary-length sample arrays into fixed-size frames."""

from __future__ import annotations

import numpy as np

from voxline.errors import AudioFormatError


def frame_samples(rate: int, ms: float) -> int:
    """Samples in ``ms`` milliseconds at ``rate``; must be a whole, positive number."""
    exact = rate * ms / 1000
    samples = round(exact)
    if samples <= 0 or abs(exact - samples) > 1e-9:
        raise AudioFormatError(
            f"{ms} ms at {rate} Hz is {exact} samples; frames need a whole positive count"
        )
    return samples


class FrameChunker:
    """Accumulates 1-D samples and hands out whole frames of ``frame_samples`` each.

    Invariant: concatenating every frame returned so far, then ``pending`` samples,
    gives exactly the concatenated input. Frames are independent arrays.
    """

    def __init__(self, frame_samples: int, dtype: np.dtype | type = np.float32) -> None:
        if frame_samples <= 0:
            raise AudioFormatError(f"frame_samples must be positive, got {frame_samples}")
        self.frame_samples = frame_samples
        self.dtype = np.dtype(dtype)
        self._rest = np.zeros(0, dtype=self.dtype)

    @property
    def pending(self) -> int:
        """Samples buffered towards the next frame (always < frame_samples)."""
        return len(self._rest)

    def feed(self, x: np.ndarray) -> list[np.ndarray]:
        """Append samples; return every frame completed by them (possibly none)."""
        x = np.asarray(x, dtype=self.dtype)
        if x.ndim != 1:
            raise AudioFormatError(f"expected 1-D samples, got shape {x.shape}")
        buf = np.concatenate((self._rest, x)) if len(self._rest) else x
        n_frames = len(buf) // self.frame_samples
        cut = n_frames * self.frame_samples
        frames = [f.copy() for f in np.split(buf[:cut], n_frames)] if n_frames else []
        self._rest = buf[cut:].copy()
        return frames

    def flush(self, pad: bool = True) -> np.ndarray | None:
        """Return the buffered partial frame (zero-padded to full size if ``pad``), or None."""
        rest, self._rest = self._rest, np.zeros(0, dtype=self.dtype)
        if not len(rest):
            return None
        if pad:
            rest = np.concatenate((rest, np.zeros(self.frame_samples - len(rest), self.dtype)))
        return rest

    def reset(self) -> None:
        """Discard buffered samples."""
        self._rest = np.zeros(0, dtype=self.dtype)
