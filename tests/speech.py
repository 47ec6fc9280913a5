"""Spoken test fixtures made on demand with Debian's espeak-ng (no binaries committed)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import wave
from pathlib import Path

import numpy as np
import soxr

_CACHE = Path(os.environ.get("VOXLINE_TEST_AUDIO", Path(tempfile.gettempdir()) / "voxline-test-audio"))


def espeak_wav(text: str, *, voice: str = "en-us", speed: int = 150) -> Path:
    """Speak `text` to a WAV file (espeak-ng's native 22 050 Hz mono PCM16); cached by text."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise RuntimeError("espeak-ng is not installed: apt-get install espeak-ng")
    _CACHE.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha1(f"{voice}|{speed}|{text}".encode()).hexdigest()[:16]
    path = _CACHE / f"{key}.wav"
    if not path.exists():
        tmp = path.with_suffix(".tmp.wav")
        subprocess.run([exe, "-v", voice, "-s", str(speed), "-w", str(tmp), text], check=True)
        tmp.replace(path)
    return path


def espeak(text: str, rate: int = 16000, **kw: object) -> np.ndarray:
    """Speak `text` and return float32 mono samples at `rate`."""
    path = espeak_wav(text, **kw)  # type: ignore[arg-type]
    with wave.open(str(path), "rb") as w:
        src_rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    audio = pcm.astype(np.float32) / 32768.0
    if src_rate != rate:
        audio = soxr.resample(audio, src_rate, rate).astype(np.float32)
    return audio


def noise(seconds: float, rate: int = 16000, level: float = 0.01, seed: int = 0) -> np.ndarray:
    """Low-level white noise (no speech)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(seconds * rate)) * level).astype(np.float32)
