"""Input noise reduction (RNNoise, voxline/engines/noise_reduction.py): CPU cost and ASR WER.

1. Cost: 60 s of noisy speech fed to one `NoiseReducer` in 20 ms chunks (what a WebRTC
   call sends); prints p50/p95 ms per chunk and the real-time factor, as CPU time of the
   calling thread (what the reducer costs) and as wall time (what a busy machine adds).
2. Word error: sentences spoken by espeak-ng (Debian's), mixed with white or pink noise at
   each SNR (speech power over the voiced samples), transcribed by the shipped Moonshine
   base-en ASR without noise reduction, with `near_field` and with `far_field`; the denoised
   audio is what the engine hands ASR (streamed through the reducer in 20 ms chunks).

    .venv/bin/python benchmarks/cpu_latency/bench_noise_reduction.py [--snr 5 0] [--sentences 8]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
import time
import wave
from pathlib import Path

import numpy as np

from voxline.codecs.resample import resample
from voxline.engines.noise_reduction import NoiseReducer

RATE = 16_000
CHUNK = 320  # 20 ms
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Please book a table for four people at seven tonight.",
    "What is the weather going to be like in Paris tomorrow?",
    "Turn off the lights in the kitchen and lock the front door.",
    "My flight to Chicago was delayed by almost three hours.",
    "Can you remind me to call my sister on Sunday morning?",
    "The museum opens at nine and closes at five in the evening.",
    "I would like to order a large pizza with mushrooms and olives.",
    "How many kilometres is it from London to Edinburgh by train?",
    "She planted tomatoes, carrots and beans in the garden last spring.",
]


def espeak(text: str) -> np.ndarray:
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise SystemExit("espeak-ng is not installed: apt-get install espeak-ng")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.wav"
        subprocess.run([exe, "-v", "en-us", "-s", "150", "-w", str(path), text], check=True)
        with wave.open(str(path), "rb") as w:
            rate = w.getframerate()
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return resample(pcm.astype(np.float32) / 32768.0, rate, RATE)


def make_noise(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    white = rng.standard_normal(n)
    if kind == "white":
        return white.astype(np.float32)
    spec = np.fft.rfft(white)  # pink: power falling 3 dB per octave
    spec /= np.sqrt(np.maximum(np.arange(len(spec)), 1))
    return np.fft.irfft(spec, n).astype(np.float32)


def mix(speech: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    voiced = speech[np.abs(speech) > 0.01 * np.abs(speech).max()]
    p_speech, p_noise = np.mean(voiced ** 2), np.mean(noise ** 2)
    gain = np.sqrt(p_speech / (p_noise * 10 ** (snr_db / 10)))
    return (speech + gain * noise).astype(np.float32)


def denoise(audio: np.ndarray, kind: str) -> np.ndarray:
    nr = NoiseReducer(kind)  # type: ignore[arg-type]
    padded = np.concatenate([audio, np.zeros(nr.delay_samples, np.float32)])
    out = np.concatenate([nr.process(padded[i:i + CHUNK]) for i in range(0, len(padded), CHUNK)])
    return out[nr.delay_samples:nr.delay_samples + len(audio)]


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


def bench_cost(speech: list[np.ndarray], seconds: float) -> None:
    rng = np.random.default_rng(1)
    clip = np.concatenate(speech)
    clip = np.tile(clip, int(np.ceil(seconds * RATE / len(clip))))[:int(seconds * RATE)]
    audio = mix(clip, make_noise("pink", len(clip), rng), 5)
    for kind in ("near_field", "far_field"):
        nr = NoiseReducer(kind)  # type: ignore[arg-type]
        wall, cpu = [], []
        for i in range(0, len(audio) - CHUNK + 1, CHUNK):
            t, c = time.perf_counter(), time.thread_time()
            nr.process(audio[i:i + CHUNK])
            wall.append(time.perf_counter() - t)
            cpu.append(time.thread_time() - c)
        for name, times in (("cpu", cpu), ("wall", wall)):
            ms = np.array(times) * 1000
            print(f"cost {kind:10s} {name:4s}: {len(ms)} chunks of 20 ms: "
                  f"p50 {np.percentile(ms, 50):.3f} ms, p95 {np.percentile(ms, 95):.3f} ms, "
                  f"RTF {ms.sum() / 1000 / seconds:.4f}", flush=True)


def bench_wer(speech: list[np.ndarray], texts: list[str], snrs: list[float]) -> None:
    from voxline.engines.models.moonshine_asr import MoonshineASR

    asr = MoonshineASR.load()
    ref_words = sum(len(words(t)) for t in texts)

    def wer(clips: list[np.ndarray]) -> float:
        errors = sum(edit_distance(words(t), words(asr.transcribe(c)))
                     for t, c in zip(texts, clips, strict=True))
        return 100 * errors / ref_words

    print(f"WER over {len(texts)} sentences ({ref_words} words), Moonshine base-en:")
    print(f"  clean speech: {wer(speech):.1f} %")
    print(f"  {'noise':6s} {'SNR':>5s} {'off':>7s} {'near_field':>11s} {'far_field':>10s}")
    for kind in ("white", "pink"):
        for snr in snrs:
            rng = np.random.default_rng(int(snr) + 100)
            noisy = [mix(s, make_noise(kind, len(s), rng), snr) for s in speech]
            row = [wer(noisy)] + [wer([denoise(c, k) for c in noisy])
                                  for k in ("near_field", "far_field")]
            print(f"  {kind:6s} {snr:4.0f}dB {row[0]:6.1f}% {row[1]:10.1f}% {row[2]:9.1f}%",
                  flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--snr", type=float, nargs="+", default=[5.0, 0.0])
    ap.add_argument("--sentences", type=int, default=len(SENTENCES))
    ap.add_argument("--cost-seconds", type=float, default=60.0)
    ap.add_argument("--no-wer", action="store_true", help="only the CPU cost")
    args = ap.parse_args()
    texts = SENTENCES[:args.sentences]
    pad = np.zeros(RATE // 4, np.float32)  # a quarter second of room either side
    speech = [np.concatenate([pad, espeak(t), pad]) for t in texts]
    bench_cost(speech, args.cost_seconds)
    if not args.no_wer:
        bench_wer(speech, texts, args.snr)


if __name__ == "__main__":
    main()
