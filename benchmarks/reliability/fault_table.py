"""The fault table: every fault of the fault suite (SIGTERM/SIGINT/SIGKILL to the engine,
the server, its process group, every process) with idle sessions and with turns in
flight, over a real `voxline serve` (model-free core) on 127.0.0.1. Prints a Markdown
table: what the clients saw, time to the first error and close, /health 503 and
recovery, how the server exited, what was left behind.

    .venv/bin/python benchmarks/reliability/fault_table.py [--json out.json] [--only 'SIGKILL to engine']
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "reliability")]

from faults import FAULTS, run_fault  # noqa: E402


def markdown(rows: list[dict[str, object]]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


async def collect(names: list[str], clients: int) -> list[dict[str, object]]:
    rows = []
    for name in names:
        for load in (False, True):
            out = await run_fault(name, load, n_clients=clients)
            rows.append(out.row())
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--only", action="append", choices=list(FAULTS), default=None,
                        help="run only this fault (repeatable)")
    parser.add_argument("--clients", type=int, default=3, help="sessions open (default: 3)")
    args = parser.parse_args()
    rows = asyncio.run(collect(args.only or list(FAULTS), args.clients))
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
