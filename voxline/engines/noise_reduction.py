"""Input noise reduction: RNNoise on a stream's 16 kHz input, before VAD and ASR.

The denoiser is RNNoise (Xiph's recurrent denoiser; its weights are compiled into the C
library that the ``pyrnnoise`` wheel ships, so nothing is fetched at run time). Only the
wheel's ctypes binding (``pyrnnoise.rnnoise.lib``) is used, on our own buffers.

Contract of :class:`NoiseReducer` (one per stream, stateful, loop thread only):

- ``process(x)`` takes any number of 16 kHz float32 samples and returns exactly as many:
  the denoised signal, ``delay_samples`` late (352, 22 ms: RNNoise's own 10 ms frame of
  delay, plus ``latency_samples`` held so any chunk size returns as many samples as it
  took); the first ones are silence. Feeding
  a signal in chunks of any size gives the same output as feeding it whole.
- RNNoise runs at 48 kHz on 10 ms frames: the input is resampled up and back with soxr's
  quick (cubic) streaming filter, whose delay is a few samples; a higher-quality filter
  would hold back 40-70 ms, all of it added to turn detection.
- ``reset()`` forgets the noise estimate and the held samples (a cleared buffer).

Profiles (OpenAI's ``noise_reduction.type``), as the least gain RNNoise may apply:

- ``near_field`` (headset, phone held to the ear): speech is loud and close, so the noise
  between words may go entirely: RNNoise's own gain, no floor.
- ``far_field`` (laptop, conference room): speech arrives quieter and reverberant, and a
  full-strength RNNoise can eat into it (its gain dips on quiet words and reverberant
  tails), so the gain never drops below ``FAR_FIELD_FLOOR`` (-12 dB): the noise is still
  cut by up to 12 dB but the quiet speech under it survives.

Cost and effect on ASR: ``benchmarks/cpu_latency/bench_noise_reduction.py`` (numbers in docs/realtime.md).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Literal

import numpy as np

from voxline.codecs.resample import Resampler
from voxline.engines.protocol import INPUT_RATE

DENOISE_RATE = 48_000  # RNNoise's only rate
DENOISE_FRAME = 480  # 10 ms at 48 kHz
FAR_FIELD_FLOOR = 10 ** (-12 / 20)  # -12 dB
RESAMPLE_QUALITY = "QQ"  # a few samples of delay (see the module docstring)
# Held back so every call can return as many samples as it took: RNNoise's 10 ms frame
# (up to 480 samples wait at 48 kHz for the frame to fill) plus the resamplers' delay.
LATENCY_SAMPLES = DENOISE_FRAME * INPUT_RATE // DENOISE_RATE + 16  # 176 (11 ms)
_PCM_SCALE = 32768.0  # RNNoise works on int16-scaled floats

NoiseReductionType = Literal["near_field", "far_field"]


@dataclass(frozen=True)
class Profile:
    floor: float  # least gain applied: output = floor * input + (1 - floor) * denoised


PROFILES: dict[str, Profile] = {
    "near_field": Profile(floor=0.0),
    "far_field": Profile(floor=FAR_FIELD_FLOOR),
}


def _rnnoise():  # the wheel's ctypes binding, imported when a stream first needs it
    from pyrnnoise import rnnoise

    if rnnoise.FRAME_SIZE != DENOISE_FRAME or rnnoise.SAMPLE_RATE != DENOISE_RATE:
        raise RuntimeError(f"pyrnnoise: expected {DENOISE_FRAME}-sample frames at "
                           f"{DENOISE_RATE} Hz, got {rnnoise.FRAME_SIZE} at {rnnoise.SAMPLE_RATE}")
    return rnnoise.lib


class NoiseReducer:
    """One stream's denoiser (see the module docstring for the contract)."""

    def __init__(self, kind: NoiseReductionType = "near_field") -> None:
        if kind not in PROFILES:
            raise ValueError(f"noise_reduction.type must be one of {sorted(PROFILES)}, "
                             f"got {kind!r}")
        self.kind = kind
        self.profile = PROFILES[kind]
        self.latency_samples = LATENCY_SAMPLES
        self.delay_samples = LATENCY_SAMPLES + DENOISE_FRAME * INPUT_RATE // DENOISE_RATE + 16
        self._lib = _rnnoise()
        self._state = self._lib.rnnoise_create(None)
        self._frame = np.zeros(DENOISE_FRAME, np.float32)  # ctypes-visible in/out buffer
        self._ptr = self._frame.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        self._fresh()

    def _fresh(self) -> None:
        self._up = Resampler(INPUT_RATE, DENOISE_RATE, RESAMPLE_QUALITY)
        self._down = Resampler(DENOISE_RATE, INPUT_RATE, RESAMPLE_QUALITY)
        self._pending48 = np.zeros(0, np.float32)  # upsampled input short of a frame
        self._dry = np.zeros(DENOISE_FRAME, np.float32)  # the last frame in, as RNNoise's out
        self._out = np.zeros(self.latency_samples, np.float32)  # denoised, not yet returned
        self.last_speech_prob = 0.0

    def reset(self) -> None:
        self._lib.rnnoise_destroy(self._state)
        self._state = self._lib.rnnoise_create(None)
        self._fresh()

    def close(self) -> None:
        if getattr(self, "_state", None) is not None:  # (None too if __init__ raised)
            self._lib.rnnoise_destroy(self._state)
            self._state = None

    def __del__(self) -> None:
        self.close()

    def process(self, x: np.ndarray) -> np.ndarray:
        """Denoise the next chunk; returns ``len(x)`` samples (``latency_samples`` late)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if not len(x):
            return x
        up = self._up.process(x)
        buf = np.concatenate([self._pending48, up]) if len(self._pending48) else up
        n = len(buf) // DENOISE_FRAME * DENOISE_FRAME
        done = np.empty(n, np.float32)
        floor = self.profile.floor
        for i in range(0, n, DENOISE_FRAME):
            frame = buf[i:i + DENOISE_FRAME]
            np.multiply(frame, _PCM_SCALE, out=self._frame)
            self.last_speech_prob = self._lib.rnnoise_process_frame(self._state, self._ptr,
                                                                    self._ptr)
            wet = self._frame / _PCM_SCALE
            if floor:  # RNNoise's output is one frame late: mix the frame before in
                wet = floor * self._dry + (1 - floor) * wet
                self._dry = frame.copy()
            done[i:i + DENOISE_FRAME] = wet
        self._pending48 = buf[n:].copy()
        out = np.concatenate([self._out, self._down.process(done)])
        if len(out) < len(x):  # never past the latency bound; pad rather than fail
            out = np.concatenate([np.zeros(len(x) - len(out), np.float32), out])
        self._out = out[len(x):]
        return out[:len(x)]
