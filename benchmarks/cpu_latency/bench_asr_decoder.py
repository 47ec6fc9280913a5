"""Moonshine's decoder on this CPU: float32 (folded weights) against int8 (``asr_decoder``).

The shipped Moonshine base-en loaded twice in one process, sharing one encoder: the
decoder as folded float32 weights, and as the int8 copy (`quantize_matmuls`: int8 weights
with one scale per output column, activations quantized per step). The questions of
``bench_pipeline.py`` (complete ones and ones pausing mid-sentence) are spoken in each
``--voice``; for every clip, interleaved:

- the greedy decode of the whole clip with each decoder, ``--reps`` times: median ms per
  decoded token (the steps after the encoder; a clip's time over its tokens plus </s>);
- the word error rate of each transcript against the text that was spoken (lower case,
  punctuation dropped), and how many int8 transcripts equal float32's exactly.

    .venv/bin/python benchmarks/cpu_latency/bench_asr_decoder.py
        [--voice piper,espeak,espeak:en-us+f3,espeak:en-gb-x-rp] [--reps 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_pipeline as bench  # noqa: E402
from bench_noise_reduction import edit_distance, words  # noqa: E402

from voxline.engines.models.moonshine_asr import MoonshineASR  # noqa: E402


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--voice", default="piper,espeak,espeak:en-us+f3,espeak:en-gb-x-rp",
                    help="comma-separated voices, as bench_pipeline.py's --voice")
    ap.add_argument("--reps", type=int, default=3, help="decodes per clip and decoder")
    ap.add_argument("--threads", type=int, default=1,
                    help="onnxruntime intra-op threads (the engine's on two cores: 1)")
    args = ap.parse_args(argv)
    voices = [v.strip() for v in args.voice.split(",") if v.strip()]
    decoders = {
        "float32": MoonshineASR.load(threads=args.threads),
        "int8": MoonshineASR.load(threads=args.threads, int8_decoder=True),
    }
    if not decoders["int8"].int8_decoder:
        print("the int8 decoder could not be made (see the warning above)")
        return 1
    encoder = decoders["float32"]
    per_token: dict[str, list[float]] = {name: [] for name in decoders}
    errors = dict.fromkeys(decoders, 0)
    reference_words = 0
    identical = clips = 0
    for voice in voices:
        _, spoken = bench.make_clips(len(bench.QUESTIONS) + len(bench.PAUSED), voice)
        for clip in spoken:
            audio = np.asarray(clip.speech, np.float32)
            hidden = encoder.encode(audio)
            texts = {}
            for name, model in decoders.items():
                times = []
                for _ in range(args.reps):
                    t0 = time.perf_counter()
                    ids = model.decode(hidden, model.max_tokens(len(audio)))
                    times.append(time.perf_counter() - t0)
                per_token[name].append(statistics.median(times) * 1000 / (len(ids) + 1))
                texts[name] = model.tokenizer.decode(ids)
                errors[name] += edit_distance(words(clip.text), words(texts[name]))
            reference_words += len(words(clip.text))
            identical += texts["int8"] == texts["float32"]
            clips += 1
            if texts["int8"] != texts["float32"]:
                print(f"  differs ({voice}): float32 {texts['float32']!r}\n"
                      f"                     int8    {texts['int8']!r}")
    print(f"\n{clips} clips ({', '.join(voices)}), {args.threads} thread(s), one encoder; "
          "ms per decoded token p50 / p95, word error rate against the spoken text")
    for name in decoders:
        print(f"  {name:<8} {pct(per_token[name], 50):5.1f} / {pct(per_token[name], 95):5.1f} ms"
              f"   WER {errors[name] / reference_words:6.1%} ({errors[name]}/{reference_words})")
    ratio = pct(per_token["float32"], 50) / pct(per_token["int8"], 50)
    print(f"  float32 / int8 per token: {ratio:.2f}x; int8 transcripts equal to float32's: "
          f"{identical}/{clips}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
