"""Moonshine base-en on a GPU (torch, batched) against onnxruntime on one CPU thread.

    python benchmarks/gpu_speech/bench_gpu_asr.py --audio-dir /tmp/q --batches 1,8,32,64 \
        --out /tmp/asr.json

The shipped weights in both (see `moonshine_torch`). Every WAV in ``--audio-dir`` is a
clip (resampled to 16 kHz); a batch of ``n`` cycles through them. For each batch size the
GPU transcribes the batch ``--repeats`` times (after one warm-up call): p50/p95 ms per
call and ms per clip. onnxruntime transcribes each clip alone on one thread (how an
``asr_workers`` worker runs, without draft reuse: every call a new utterance). Transcripts
are compared clip by clip; a mismatch is printed (cuDNN may convolve in TF32 on a GPU).
Each batch size is timed twice, interleaved call by call: the encoder replayed from its
graph (the engine's path, `moonshine_encoder`) and run eagerly (`encode_many`, as before
those graphs); the last rows repeat batch 1 beside a thread spinning in Python at the
engine's GIL switch interval (the other stages' host work).

    python benchmarks/gpu_speech/bench_gpu_asr.py --device cpu --audio-dir DIR --batches 1,2   # smoke
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import wave
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from voxline.engines.factory import GIL_SWITCH_INTERVAL_S  # noqa: E402
from voxline.engines.models.moonshine_asr import MoonshineASR  # noqa: E402
from voxline.engines.models.moonshine_torch import MoonshineTorchASR  # noqa: E402
from voxline.engines.models.whisper_asr import TranscriptionOptions  # noqa: E402


def read_clip(path: Path) -> np.ndarray:
    import soxr

    with wave.open(str(path), "rb") as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    return soxr.resample(pcm, rate, 16000).astype(np.float32) if rate != 16000 else pcm


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--audio-dir", required=True, help="directory of WAV clips")
    ap.add_argument("--batches", default="1,8,32,64", help="batch sizes, comma-separated")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per batch size")
    ap.add_argument("--device", default="cuda", help="torch device of the batched model")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    clips = [read_clip(p) for p in sorted(Path(args.audio_dir).glob("*.wav"))]
    if not clips:
        ap.error(f"--audio-dir {args.audio_dir}: no .wav files")
    sizes = [int(b) for b in args.batches.split(",")]

    cpu = MoonshineASR.load(threads=1)
    reference, cpu_ms = [], []
    for clip in clips:
        cpu.transcribe(clip)  # warm-up; drafts are keyed by the clip, so drop them
        cpu._drafts.clear()
        t0 = time.perf_counter()
        reference.append(cpu.transcribe(clip))
        cpu_ms.append((time.perf_counter() - t0) * 1000)
        cpu._drafts.clear()
    print(f"onnxruntime, 1 thread: {np.mean(cpu_ms):.0f} ms per clip "
          f"({', '.join(f'{m:.0f}' for m in cpu_ms)}); clips "
          f"{', '.join(f'{len(c) / 16000:.1f}' for c in clips)} s")

    gpu = MoonshineTorchASR.load(args.device, max_batch=max(sizes))
    mismatches = [(i, t, r) for i, (t, r) in enumerate(zip(gpu.transcribe_many(
        clips, [TranscriptionOptions()] * len(clips)), reference, strict=True)) if t != r]
    for i, ours, theirs in mismatches:
        print(f"clip {i}: torch {ours!r} vs onnxruntime {theirs!r}")
    if gpu.encoder is None:
        raise SystemExit("the encoder's graphs failed to capture (the log says why)")
    graphs_fit = gpu.encoder.fits

    def timed(batch: list[np.ndarray], encoder: str) -> float:
        gpu.encoder.fits = graphs_fit if encoder == "graphs" else (lambda *a: False)
        try:
            t0 = time.perf_counter()
            gpu.transcribe_many(batch, [TranscriptionOptions()] * len(batch))
            return (time.perf_counter() - t0) * 1000
        finally:
            gpu.encoder.fits = graphs_fit

    def level(n: int, label: str) -> None:
        batch = [clips[i % len(clips)] for i in range(n)]
        times: dict[str, list[float]] = {"graphs": [], "eager": []}
        for rep in range(args.repeats + 1):  # the first call of each arm warms it up
            for encoder, ts in times.items():
                ms = timed(batch, encoder)
                if rep:
                    ts.append(ms)
        for encoder, ts in times.items():
            row = {"batch": n, "encoder": encoder, "when": label,
                   "p50_ms": round(percentile(ts, 50), 1), "p95_ms": round(percentile(ts, 95), 1),
                   "ms_per_clip": round(percentile(ts, 50) / n, 2)}
            rows.append(row)
            print(f"batch {n:3d}, encoder {encoder:6s} {label}: {row['p50_ms']:7.1f} / "
                  f"{row['p95_ms']:7.1f} ms p50/p95 per call, {row['ms_per_clip']:6.2f} ms per clip")

    rows: list[dict[str, object]] = []
    for n in sizes:
        level(n, "alone")
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin, daemon=True)
    default = sys.getswitchinterval()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    spinner.start()
    try:
        level(1, "beside a busy thread")
    finally:
        stop.set()
        spinner.join()
        sys.setswitchinterval(default)
    result = {"device": args.device, "cpu_ms_per_clip": [round(m, 1) for m in cpu_ms],
              "transcripts_differ": len(mismatches), "batches": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
