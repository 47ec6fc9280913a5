"""Write a measured `sessions_held` into the capacity table `voxline serve` sizes a GPU by.

    python benchmarks/gpu_serving/record_capacity.py OUT/audio_sweep.json --tts CKPT/tts --llm CKPT/llm \
        [--gpu "NVIDIA H200"] [--source benchmarks/results/serve_h200_sweep.json]

Reads `sessions_held` from a `voxline bench` JSON (spoken turns; the bar: p95
speech_stopped -> first audio <= 250 ms, zero underruns), counts the parameters of the
models that served it exactly as start-up does (voxline.engines.model_memory), and puts
the row into voxline/engines/capacity_table.json in place of any row for the same GPU and
models (voxline/engines/capacity_record.py does it; this is its command line). Run it on
the machine that ran the benchmark (the GPU's name comes from torch unless --gpu names it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from voxline.engines.capacity import TABLE_PATH
from voxline.engines.capacity_record import measured_row, record_row
from voxline.errors import VoxlineError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench_json", type=Path, help="a voxline bench --json report")
    ap.add_argument("--tts", type=Path, default=None, help="the Qwen3-TTS checkpoint served")
    ap.add_argument("--llm", type=Path, default=None,
                    help="the embedded Llama checkpoint served (none: remote or CPU)")
    ap.add_argument("--gpu", default=None, help="GPU name (default: torch.cuda's)")
    ap.add_argument("--asr-device", choices=("cpu", "cuda"), default="cpu",
                    help="where the served ASR ran (a row counts for servers with the same)")
    ap.add_argument("--models", default="", help="what was measured, in words")
    ap.add_argument("--source", default=None, help="the result file to cite")
    ap.add_argument("--table", type=Path, default=TABLE_PATH)
    args = ap.parse_args(argv)

    try:
        row = measured_row(args.bench_json, tts=args.tts, llm=args.llm, gpu=args.gpu,
                           asr_device=args.asr_device, models=args.models, source=args.source)
    except VoxlineError as exc:
        raise SystemExit(str(exc)) from None
    record_row(row, args.table)
    print(f"{args.table}: {row}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
