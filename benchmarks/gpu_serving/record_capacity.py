"""Write a measured `sessions_held` into the capacity table `voxline serve` sizes a GPU by.

    python benchmarks/gpu_serving/record_capacity.py OUT/audio_sweep.json --tts CKPT/tts --llm CKPT/llm \
        [--gpu "NVIDIA H200"] [--source benchmarks/results/serve_h200_sweep.json]

Reads `sessions_held` from a `voxline bench` JSON (spoken turns; the bar: p95
speech_stopped -> first audio <= 250 ms, zero underruns), counts the parameters of the
models that served it exactly as start-up does (voxline.engines.model_memory), and puts
the row into voxline/engines/capacity_table.json in place of any row for the same GPU and
models. Run it on the machine that ran the benchmark (the GPU's name comes from torch
unless --gpu names it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from voxline.engines.capacity import TABLE_PATH, LatencyRow, with_row
from voxline.engines.model_memory import llama_params, qwen3_tts_footprint


def main() -> int:
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
    args = ap.parse_args()

    report = json.loads(args.bench_json.read_text())
    held = report.get("sessions_held")
    if not held:
        raise SystemExit(f"{args.bench_json}: no sessions_held (no level met the bar)")
    gpu = args.gpu
    if gpu is None:
        import torch

        gpu = torch.cuda.get_device_name()
    tts = qwen3_tts_footprint(args.tts)[1] if args.tts else 0
    llm = llama_params(json.loads((args.llm / "config.json").read_text())) if args.llm else 0
    row = LatencyRow(gpu, int(held), tts_params=tts, llm_params=llm, asr_device=args.asr_device,
                     models=args.models,
                     source=args.source or str(args.bench_json))
    data = json.loads(args.table.read_text()) if args.table.exists() else {}
    args.table.write_text(json.dumps(with_row(data, row), indent=2) + "\n")
    print(f"{args.table}: {row}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
