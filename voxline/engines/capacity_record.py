"""A measured row for the capacity table (``capacity_table.json``, which ``voxline serve``
sizes a GPU by): ``sessions_held`` from a ``voxline bench`` JSON (spoken turns; the bar: p95
speech_stopped -> first audio <= 250 ms, zero underruns), the parameters of the models that
served it counted exactly as start-up counts them (``model_memory``), put into the table in
place of any row for the same GPU and models. The CLI over it is
``benchmarks/gpu_serving/record_capacity.py``."""

from __future__ import annotations

import json
from pathlib import Path

from voxline.engines.capacity import TABLE_PATH, LatencyRow, with_row
from voxline.engines.model_memory import llama_params, qwen3_tts_footprint
from voxline.errors import VoxlineError


def measured_row(bench_json: Path, *, tts: Path | None = None, llm: Path | None = None,
                 gpu: str | None = None, asr_device: str = "cpu", models: str = "",
                 source: str | None = None) -> LatencyRow:
    """The row a bench report measured. ``tts``/``llm``: the checkpoints served (None: not
    embedded); ``gpu``: the device's name (None: torch.cuda's); ``source``: the result
    file to cite (None: ``bench_json``). Raises VoxlineError when no level met the bar."""
    report = json.loads(bench_json.read_text())
    held = report.get("sessions_held")
    if not held:
        raise VoxlineError(f"{bench_json}: no sessions_held (no level met the bar)")
    if gpu is None:
        import torch

        gpu = torch.cuda.get_device_name()
    tts_params = qwen3_tts_footprint(tts)[1] if tts else 0
    llm_params = llama_params(json.loads((llm / "config.json").read_text())) if llm else 0
    return LatencyRow(gpu, int(held), tts_params=tts_params, llm_params=llm_params,
                      asr_device=asr_device, models=models, source=source or str(bench_json))


def record_row(row: LatencyRow, table: Path = TABLE_PATH) -> None:
    """Write ``row`` into the table at ``table`` (created when missing)."""
    data = json.loads(table.read_text()) if table.exists() else {}
    table.write_text(json.dumps(with_row(data, row), indent=2) + "\n")
