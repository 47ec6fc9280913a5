"""Step caches on the tiny Helios pipeline (CPU): transformer block passes and ms per chunk
for none / first_block_cache / mag_cache at a few thresholds, and how far each strays from
the uncached frames (max abs difference, uint8).

Random weights make data-dependent caches skip differently than trained ones (their
residuals change from step to step in no learned way), so the skip counts here show the
mechanism working, not what a trained Helios skips. MagCache runs on ratios calibrated
from this checkpoint first (the first mag_cache chunk, as the server does).

    .venv/bin/python benchmarks/video/bench_video_step_cache.py [--steps 10] [--size 64]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from tiny_helios import TINY_MAX_SEQUENCE_LENGTH, build_tiny_helios  # noqa: E402

from voxline.engines.models.helios import HeliosChunkDriver, VideoSpec  # noqa: E402
from voxline.engines.models.helios.step_cache import step_caches_for  # noqa: E402

RUNS = [("none", None), ("first_block_cache", 0.05), ("first_block_cache", 0.2),
        ("first_block_cache", 1.0), ("mag_cache", 0.06), ("mag_cache", 0.3),
        ("mag_cache", 1.0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--size", type=int, default=64, help="frame width and height")
    parser.add_argument("--chunks", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pipe = build_tiny_helios()
    driver = HeliosChunkDriver(pipe, max_sequence_length=TINY_MAX_SEQUENCE_LENGTH,
                               step_caches=step_caches_for(pipe.transformer,
                                                           tempfile.mkdtemp(),
                                                           Path(tempfile.mkdtemp())))
    passes = [0]
    pipe.transformer.blocks[-1].ffn.register_forward_hook(
        lambda *_: passes.__setitem__(0, passes[0] + 1))
    frames = args.chunks * 32 + 1

    def run(backend: str, threshold: float | None) -> tuple[np.ndarray, int, float]:
        spec = VideoSpec("dance monkey", args.size, args.size, frames, args.steps, 1.0, seed=3,
                         max_sequence_length=TINY_MAX_SEQUENCE_LENGTH, cache_backend=backend,
                         cache_threshold=threshold)
        render = driver.begin(spec)
        passes[0], chunks, t0 = 0, [], time.perf_counter()
        while not render.finished:
            chunks.append(render.next_chunk())
        ms = (time.perf_counter() - t0) * 1000 / render.total_chunks
        return np.concatenate(chunks), passes[0], ms

    run("mag_cache", 0.0)  # calibrates and stores the ratios (every step computed)
    run("none", None)  # warm-up
    base, _, _ = run("none", None)
    print(f"tiny Helios, {args.size}x{args.size}, {args.steps} steps, {args.chunks} chunks, "
          "guidance 1.0, 1 CPU thread (random weights)")
    print("| backend | threshold | block passes / chunk | ms / chunk | max abs diff |")
    print("|---|---|---|---|---|")
    for backend, threshold in RUNS:
        got, count, ms = run(backend, threshold)
        diff = int(np.abs(got.astype(int) - base.astype(int)).max())
        print(f"| {backend} | {threshold if threshold is not None else ''} | "
              f"{count / args.chunks:.1f} | {ms:.0f} | {diff} |")


if __name__ == "__main__":
    main()
