"""Speaking-rate change of mono float32 PCM at the same pitch, streamed: FFmpeg's ``atempo``.

:class:`TimeStretch` runs FFmpeg's ``atempo`` filter (WSOLA: overlapping windows placed
where the waveform matches, so pitch and timbre stay) through PyAV, which voxline
already uses for Opus. Feed chunks of any size with :meth:`TimeStretch.push` (it returns
the output that is ready) and call :meth:`TimeStretch.flush` at the end for the rest.
``speed`` 2.0 halves the duration, 0.5 doubles it (as Piper's ``length_scale / speed``
does for its phoneme durations): the output has ``len(input) / speed`` samples, within
about one analysis window. The filter holds back up to about one window of input
(tens of milliseconds) until the next push or the flush.

``atempo`` takes 0.5..100 per instance; speeds below 0.5 chain two equal instances.
The output does not depend on how the input was cut into chunks. A clip too short for
one window (under ~40 ms at 24 kHz), from which the filter would give nothing, comes
back from :meth:`TimeStretch.flush` unstretched rather than lost.
"""

from __future__ import annotations

import math

import av
import numpy as np
from av.audio.frame import AudioFrame
from av.filter import Graph

from voxline.errors import AudioFormatError

__all__ = ["SPEED_RANGE", "TimeStretch", "time_stretch"]

SPEED_RANGE = (0.25, 4.0)  # the range OpenAI's speech endpoints accept
_ATEMPO_MIN = 0.5


class TimeStretch:
    """One stream's streaming time-stretch (see the module docstring)."""

    def __init__(self, sample_rate: int, speed: float) -> None:
        lo, hi = SPEED_RANGE
        if not lo <= speed <= hi:
            raise ValueError(f"speed must be in [{lo}, {hi}], got {speed}")
        if sample_rate <= 0:
            raise AudioFormatError(f"sample_rate must be positive, got {sample_rate}")
        self.sample_rate = sample_rate
        self.speed = speed
        stages = 1 if speed >= _ATEMPO_MIN else 2
        factor = speed if stages == 1 else math.sqrt(speed)
        self._graph = Graph()
        node = self._graph.add_abuffer(format="flt", sample_rate=sample_rate, layout="mono",
                                       time_base=f"1/{sample_rate}")
        self._source = node
        for _ in range(stages):
            tempo = self._graph.add("atempo", f"{factor:.6f}")
            node.link_to(tempo)
            node = tempo
        sink = self._graph.add("abuffersink")
        node.link_to(sink)
        self._graph.configure()
        self._pts = 0
        self._flushed = False
        self._held: list[np.ndarray] | None = []  # the input, until the filter gives output

    def push(self, audio: np.ndarray) -> np.ndarray:
        """Feed mono float32 samples; returns the stretched samples ready so far."""
        if self._flushed:
            raise RuntimeError("TimeStretch.push after flush")
        audio = np.ascontiguousarray(audio, dtype=np.float32)
        if audio.ndim != 1:
            raise AudioFormatError(f"expected mono 1-D float32 audio, got shape {audio.shape}")
        if len(audio) == 0:
            return np.zeros(0, np.float32)
        frame = AudioFrame.from_ndarray(audio[None], format="flt", layout="mono")
        frame.sample_rate = self.sample_rate
        frame.pts = self._pts
        self._pts += len(audio)
        self._graph.push(frame)
        out = self._drain()
        if self._held is not None:
            self._held = None if len(out) else [*self._held, audio]
        return out

    def flush(self) -> np.ndarray:
        """The input is complete: the rest of the output (the stretcher is then spent)."""
        if self._flushed:
            return np.zeros(0, np.float32)
        self._flushed = True
        if self._pts == 0:
            return np.zeros(0, np.float32)
        self._graph.push(None)
        out = self._drain()
        if not len(out) and self._held:
            return np.concatenate(self._held)  # shorter than one window: passes unstretched
        return out

    def _drain(self) -> np.ndarray:
        parts: list[np.ndarray] = []
        while True:
            try:
                frame = self._graph.pull()
            except (av.error.BlockingIOError, av.error.EOFError):
                break
            parts.append(frame.to_ndarray().reshape(-1))
        return np.concatenate(parts).astype(np.float32, copy=False) if parts else np.zeros(0, np.float32)


def time_stretch(audio: np.ndarray, sample_rate: int, speed: float) -> np.ndarray:
    """A whole signal through one :class:`TimeStretch`."""
    stretch = TimeStretch(sample_rate, speed)
    return np.concatenate([stretch.push(audio), stretch.flush()])
