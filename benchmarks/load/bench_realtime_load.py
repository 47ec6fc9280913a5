"""Load benchmark: a live voxline server (shipped models, loopback) driven by `voxline bench`
at concurrency 1 and 2 with a few spoken realtime turns; prints the bench table.

    .venv/bin/python benchmarks/load/bench_realtime_load.py [--requests 3] [--mode realtime]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from live_server import live_server  # noqa: E402

from voxline.cli import main  # noqa: E402


def run() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3, help="requests per level")
    parser.add_argument("--mode", choices=["realtime", "speech"], default="realtime")
    parser.add_argument("--json", default=None, help="also write the report here")
    args = parser.parse_args()
    with live_server() as url:  # always 127.0.0.1
        extra = ["--json", args.json] if args.json else []
        return main(["bench", "--url", url, "--mode", args.mode, "--concurrency", "1,2",
                     "--requests", str(args.requests), "--timeout", "120", *extra])


if __name__ == "__main__":
    sys.exit(run())
