"""How long a full garbage collection stops a voxline process, before and after
`gc.freeze` takes the start-up heap out of the collector's reach.

Both processes of `voxline serve` freeze once start-up is done
(`voxline.logs.freeze_startup_objects`). This measures what that buys, side by side in
one run, for the two heaps: the API process (the server's imports and app) and the
engine process (the shipped models loaded and warmed up, as `voxline serve` loads them).
A full collection holds the GIL, so every thread of the process waits for it: a pause
longer than the 200 ms of audio a session keeps ahead of playout is a gap the listener
hears, and one in the engine stalls every stage's next plan.

    .venv/bin/python benchmarks/cpu_latency/bench_gc_pauses.py [--repeats 5] [--api-only]
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def full_collections(repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        gc.collect()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def row(label: str, before: list[float], after: list[float]) -> str:
    return (f"| {label} | {len(gc.get_objects()) + gc.get_freeze_count()} | "
            f"{statistics.median(before):.0f} / {max(before):.0f} ms "
            f"| {statistics.median(after):.2f} / {max(after):.2f} ms |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="full collections timed each way")
    ap.add_argument("--api-only", action="store_true", help="skip loading the engine's models")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print("| heap | tracked objects | full collection p50 / max, as loaded "
          "| after gc.freeze p50 / max |")
    print("|---|---|---|---|")
    import voxline.realtime.server  # noqa: F401  (what the API process imports)
    from voxline.config import load_settings
    from voxline.engines.client import InProcessEngineClient  # noqa: F401
    from voxline.engines.launch import make_engine
    from voxline.realtime.app import create_app

    settings = load_settings()
    create_app(settings, make_engine(settings))
    before = full_collections(args.repeats)
    gc.freeze()
    print(row("API process (imports + app)", before, full_collections(args.repeats)), flush=True)
    gc.unfreeze()
    if args.api_only:
        return 0
    from voxline.engines.factory import load_models

    t0 = time.perf_counter()
    models = load_models(settings)
    load_s = time.perf_counter() - t0
    before = full_collections(args.repeats)
    gc.freeze()
    print(row(f"+ the shipped models, loaded in {load_s:.0f} s (the engine's heap)", before,
              full_collections(args.repeats)), flush=True)
    del models
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
