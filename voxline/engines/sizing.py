"""Capacity sizing for the API process: how many sessions, replies and speech streams the
engine's devices hold, decided before the engine starts.

`sized_for_device(settings)` is the API process's whole use of it: on a GPU the capacity
fields the user left unset are sized to the device (:mod:`voxline.engines.capacity`), so
that the session host admits what the engine will hold; on the CPU the Settings come
back unchanged. Footprints come from the checkpoints' configs and headers
(:mod:`voxline.engines.model_memory`, :mod:`voxline.engines.checkpoints`): nothing here
loads a model or converts the shipped GGUF, and torch is imported only to probe a CUDA
device, so sizing on the CPU imports no torch at all. The engine process builds the
models (:mod:`voxline.engines.factory`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from voxline.config import LLMDtype, Settings, TTSBackend
from voxline.engines.capacity import (
    CAPACITY_FIELDS,
    DeviceBudget,
    Footprint,
    find_latency_row,
    load_table,
    plan_capacity,
    plan_video_streams,
)
from voxline.engines.checkpoints import llm_config
from voxline.engines.model_memory import bf16_weights_footprint, llm_footprint, qwen3_tts_footprint
from voxline.engines.stage_registry import STAGES
from voxline.errors import VoxlineError

logger = logging.getLogger(__name__)

# Moonshine base on a GPU: 61.5 M float32 parameters (246 MB), the decoder graphs' K/V
# buffers for 64 rows (1.5 GiB, `StaticDecoder.nbytes`) and the encoder's batch.
MOONSHINE_GPU_BYTES = 2 << 30


def sized_video_streams(settings: Settings) -> Settings:
    """With a video model: ``video_streams`` (unless set) from the GPU the model loads on
    (`plan_video_streams`), logged in one line beside the voice capacity line. torch is
    imported only here, with a video model (which needs it anyway), to name the GPU."""
    if not settings.video:
        return settings
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    explicit = settings.video_streams if "video_streams" in settings.model_fields_set else None
    streams, why = plan_video_streams(gpu, explicit, load_table().video_rows,
                                      settings.video_realtime_steps_per_stage)
    logger.info("video capacity: video_streams=%d (%s); real-time videos at %d step(s) a "
                "pyramid stage (video_realtime_steps_per_stage), /v1/videos at %s", streams,
                why, settings.video_realtime_steps_per_stage,
                settings.video_steps_per_stage or "the checkpoint's recommended steps")
    return settings.model_copy(update={"video_streams": streams})


def runs_on_gpu(settings: Settings) -> bool:
    """Whether any embedded model of `settings` runs on a CUDA device."""
    return any(d.startswith("cuda") for d in (settings.llm_device, settings.asr_device,
                                               settings.tts_device))


def sized_for_device(settings: Settings) -> Settings:
    """`settings` with the capacity fields the user left unset (``max_sessions``,
    ``max_responses``, ``tts_max_streams``) sized to the GPU the models run on, and the
    set ones checked (:mod:`voxline.engines.capacity`); logs the choice in one line.
    Unchanged when no stage runs on a GPU: the CPU keeps the field defaults. The API
    process calls it once, before the engine starts, so that the session host admits
    what the engine holds; explicit means in ``settings.model_fields_set`` (a flag or an
    environment variable), so call it on Settings read from flags or the environment,
    not on a dump."""
    if "gil_switch_us" in settings.model_fields_set and not runs_on_gpu(settings):
        # The engine process sees a dump, so it can refuse only a non-default value.
        raise VoxlineError(f"gil_switch_us={settings.gil_switch_us} applies with a model on a GPU "
                           "(llm_device, asr_device or tts_device=cuda); the CPU engine keeps "
                           "CPython's switch interval")
    settings = sized_video_streams(settings)
    footprints, params = gpu_footprints(settings)
    if not footprints:
        return settings
    from voxline.kernels.cuda_graphs import ladder_buckets, pow2_buckets

    devices = [probe_device(device, footprint) for device, footprint in footprints.items()]
    table = load_table()
    asr = "cuda" if settings.asr_device.startswith("cuda") else "cpu"
    rows = [find_latency_row(table.rows, name, tts_params=params["tts"], llm_params=params["llm"],
                             asr_device=asr)
            for name in sorted({d.name for d in devices})]
    latency = (None if any(r is None for r in rows)
               else min((r for r in rows if r is not None), key=lambda r: r.sessions))
    explicit = {f: getattr(settings, f) for f in CAPACITY_FIELDS if f in settings.model_fields_set}
    defaults = {f: Settings.model_fields[f].default for f in CAPACITY_FIELDS}
    capacity = plan_capacity(devices, explicit=explicit, defaults=defaults, latency=latency,
                             working_fraction=table.working_fraction)
    sized = settings.model_copy(update={k: v for k, v in capacity.values().items()
                                        if k not in explicit})
    try:
        tts_buckets = sized.tts_bucket_list()  # explicit buckets lie within the streams chosen
    except ValueError as exc:
        raise VoxlineError(str(exc)) from None
    buckets = (f"LLM {_csv(pow2_buckets(1, sized.max_sessions))}, TTS "
               f"{_csv(tts_buckets or ladder_buckets(sized.tts_max_streams))}")
    logger.info("%s; CUDA-graph batch buckets: %s", capacity.log_line(), buckets)
    return sized


def _csv(sizes: list[int]) -> str:
    return ",".join(map(str, sizes))


def check_llm_placement(settings: Settings) -> None:
    """Refuse an embedded-LLM device the engine could not load on (no torch needed):
    a GPU for a remote reply model, or int8 weights (CPU-only) on a GPU. Whether the GPU
    exists is `cuda_device`'s check."""
    device = settings.llm_device
    if device == "cpu":
        return
    if settings.remote_llm:
        raise ValueError(f"llm_device={device} applies to the embedded LLM; the reply model "
                         f"is remote (llm={settings.llm})")
    if settings.llm_dtype == LLMDtype.INT8:
        raise ValueError(f"llm_dtype=int8 runs on the CPU only; with llm_device={device} use "
                         "llm_dtype=bfloat16 (or float32)")


def gpu_footprints(settings: Settings) -> tuple[dict[str, Footprint], dict[str, int]]:
    """What each CUDA device `settings` uses will hold (none: nothing on a GPU), and the
    parameters of the TTS and LLM there (the latency table's key; 0 when not there)."""
    on: dict[str, Footprint] = {}
    params = {"tts": 0, "llm": 0}

    def add(field: str, device: str, footprint: Footprint) -> None:
        key = cuda_device(field, device)
        on[key] = on.get(key, Footprint()) + footprint

    if not settings.remote_llm and settings.llm_device.startswith("cuda"):
        check_llm_placement(settings)
        cuda_device("llm_device", settings.llm_device)  # a GPU, before reading the checkpoint
        footprint, params["llm"] = llm_footprint(llm_config(settings.llm_checkpoint,
                                                            settings.cache), settings.llm_dtype)
        add("llm_device", settings.llm_device, footprint)
    tts = settings.tts_backend
    if tts.kind is TTSBackend.QWEN3 and settings.tts_device.startswith("cuda"):
        footprint, params["tts"] = qwen3_tts_footprint(Path(tts.target))
        add("tts_device", settings.tts_device, footprint)
    checkpoint = settings.whisper_checkpoint
    if checkpoint is not None and settings.asr_device.startswith("cuda"):
        add("asr_device", settings.asr_device, bf16_weights_footprint(Path(checkpoint), "ASR"))
    elif settings.asr_device.startswith("cuda"):
        add("asr_device", settings.asr_device,
            Footprint(weights=MOONSHINE_GPU_BYTES, parts=("ASR",)))
    for reg in STAGES:
        placed = reg.footprint(settings, bool(on))
        if placed is not None:
            add(reg.name, *placed)
    return on, params


def cuda_device(field: str, device: str) -> str:
    """``cuda`` or ``cuda:N`` as ``cuda:N``, checked: the GPU exists."""
    import torch

    if not torch.cuda.is_available():
        raise VoxlineError(f"{field}={device}, but this machine has no CUDA GPU "
                           f"(torch {torch.__version__}); use {field}=cpu")
    index = int(device.partition(":")[2] or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise VoxlineError(f"{field}={device}, but this machine has {count} CUDA GPU(s)")
    return f"cuda:{index}"


def probe_device(device: str, footprint: Footprint) -> DeviceBudget:
    """`device`'s name and memory now (``torch.cuda.mem_get_info``: free, total)."""
    import torch

    free, total = torch.cuda.mem_get_info(torch.device(device))
    return DeviceBudget(device, torch.cuda.get_device_name(torch.device(device)), total, free,
                        footprint)
