"""Qwen3-TTS speech stage: per-step time by batch size, and device-vs-CPU agreement.

    .venv/bin/python benchmarks/gpu_speech/bench_qwen3_stage.py --model-dir DIR [--device cuda]

DIR is a Qwen3-TTS checkpoint in the official layout (a real one, or the random-weight
test checkpoint that `--make-test-checkpoint DIR [--mid]` writes). With a non-CPU
device, the same greedy job also runs on the CPU and the largest audio difference is
printed (eager on both: this is the correctness baseline for future CUDA graphs).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from voxline.engines.models.qwen3_tts import TalkerSampling
from voxline.engines.models.qwen3_tts.speech_model import Qwen3SpeechModel
from voxline.engines.speech_model import SpeechJob

TEXT = "A longer sentence about the lazy dog and the brown fox."


def speak(stage: Qwen3SpeechModel, jobs: list[SpeechJob]) -> tuple[dict[int, np.ndarray], list[float]]:
    for job in jobs:
        stage.start(job)
    audio: dict[int, list[np.ndarray]] = {j.job_id: [] for j in jobs}
    steps: list[float] = []
    while stage.has_work():
        if stage.model.talker.codec_head.weight.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = stage.step()
        steps.append(time.perf_counter() - t0)
        for out in outs:
            audio[out.job_id].append(out.audio)
    return {k: np.concatenate(v) if v else np.zeros(0) for k, v in audio.items()}, steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--make-test-checkpoint", type=Path, help="write the random test checkpoint here")
    ap.add_argument("--mid", action="store_true", help="with --make-test-checkpoint: the mid-size config")
    args = ap.parse_args(argv)
    if args.make_test_checkpoint:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
        from qwen_ref.harness import MID_CODEC, MID_MODEL, TINY_CODEC, TINY_MODEL
        from test_qwen3_tts_stage import write_test_checkpoint

        model, codec = (MID_MODEL, MID_CODEC) if args.mid else (TINY_MODEL, TINY_CODEC)
        write_test_checkpoint(args.make_test_checkpoint, model, codec)
        print(f"wrote {args.make_test_checkpoint}")
        return 0
    greedy = TalkerSampling.greedy()
    stage = Qwen3SpeechModel(args.model_dir, device=args.device, sampling=greedy, max_streams=16)
    print(f"device {args.device}; torch {torch.__version__}; threads {torch.get_num_threads()}")
    speak(stage, [SpeechJob(0, TEXT)])  # warm-up
    for b in [int(x) for x in args.batches.split(",")]:
        _, steps = speak(stage, [SpeechJob(i, TEXT) for i in range(1, b + 1)])
        ms = np.array(steps[2:]) * 1000  # skip the prefill steps
        print(f"batch {b:2d}: step p50 {np.percentile(ms, 50):7.2f} ms  p95 {np.percentile(ms, 95):7.2f} ms"
              f"  per frame {np.percentile(ms, 50) / b:6.2f} ms  ({len(steps)} steps)")
    if args.device != "cpu":
        dev_audio, _ = speak(stage, [SpeechJob(1, TEXT)])
        cpu = Qwen3SpeechModel(args.model_dir, device="cpu", sampling=greedy)
        cpu_audio, _ = speak(cpu, [SpeechJob(1, TEXT)])
        a, c = dev_audio[1], cpu_audio[1]
        n = min(len(a), len(c))
        print(f"{args.device} vs cpu (greedy, fp32): lengths {len(a)} / {len(c)}, "
              f"max abs diff over the common part {np.abs(a[:n] - c[:n]).max():.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
