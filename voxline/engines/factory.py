"""Build the engine core from `Settings` where the engine runs: the models and the core
(`make_engine_core`, the core factory `voxline.engines.launch.DEFAULT_CORE` names).

The Settings travel whole: `voxline.engines.launch.make_engine` hands the client
``{"settings": settings.model_dump(mode="json")}`` as the core options, and the core
factory rebuilds them where the core lives (engine thread or child process). No
setting is picked out by name on the way, so a new field reaches the models untouched.
The SDK and `voxline serve` both start their engine here; neither this module nor
anything it imports loads the HTTP server. The loaders run where the engine runs (its
thread or child process); capacity is sized before, in the API process, by
:mod:`voxline.engines.sizing`, which loads no model. Model files below this module get
what they need as arguments (the cache directory, devices, threads) and read no
settings or environment themselves.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from voxline.config import (
    ASRDecoder,
    AutoOff,
    Int8Prefill,
    LLMDtype,
    Settings,
    TTSBackend,
    load_settings,
    setting_default,
    settings_from_dump,
)
from voxline.engines import trace
from voxline.engines.asr_stage import ASRModel
from voxline.engines.core import EngineCore, Models
from voxline.engines.llm_stage import ChatModel
from voxline.engines.model_memory import LLM_POSITIONS, TTS_POSITIONS
from voxline.engines.remote_llm import RemoteChat, RemoteLLMConfig, parse_llm_spec
from voxline.engines.sizing import check_llm_placement, runs_on_gpu
from voxline.engines.speech_model import SentenceSpeechModel, SpeechModel
from voxline.engines.stage_registry import STAGES
from voxline.kernels.compile_cache import CompileCache, open_compile_cache
from voxline.kernels.cuda_graphs import (
    GraphBackfill,
    ladder_buckets,
    set_urgent_streams,
    stream_priority,
)
from voxline.kernels.int8_linear import dynamic_prefill_default
from voxline.logs import phase

logger = logging.getLogger(__name__)


# Python's GIL hand-over interval while GPU model threads share the engine process. Every
# eager torch op releases the GIL and takes it back; while another thread runs Python,
# taking it back waits up to this interval. At CPython's default (5 ms) an eager
# Llama-3.2-1B prompt step on an H200 took 9.2-9.3 s beside one thread spinning in Python
# (16-19 ms alone); at 0.5 ms, 0.8-0.9 s (`benchmarks/gpu_serving/bench_gpu_llm_cold.py`). On this
# 2-core CPU the spoken-turn latency did not separate from its noise either way, so the
# CPU engine keeps CPython's default. Read from the `gil_switch_us` setting's default (its home);
# `benchmarks/gpu_serving/gil_switch.py` runs the stages' host work side by side at other intervals.
GIL_SWITCH_INTERVAL_S: float = setting_default("gil_switch_us") / 1e6


def share_the_gil(interval_s: float = GIL_SWITCH_INTERVAL_S) -> None:
    """Shorten the GIL's switch interval for the model threads (process-wide; the engine
    runs alone in its process, so nothing else there wants CPython's 5 ms)."""
    if sys.getswitchinterval() != interval_s:
        sys.setswitchinterval(interval_s)
        logger.info("GIL switch interval %.0f us (gil_switch_us)", interval_s * 1e6)


def shape_free_attention() -> None:
    """Keep PyTorch's SDPA off cuDNN on a GPU (process-wide; before any graph capture).

    cuDNN's attention builds an execution plan for every new shape: on an H200 an eager
    Llama-3.2-1B prefill of a length not seen before took 57-105 ms, 12-26 ms the next
    time, and a server's prompts (and Moonshine's clips) are a new length nearly every
    time. With cuDNN off (flash or memory-efficient attention, no per-shape plan) a new
    length took 17-32 ms (`benchmarks/gpu_serving/bench_gpu_llm_cold.py`)."""
    if torch.cuda.is_available():
        torch.backends.cuda.enable_cudnn_sdp(False)


def model_threads(settings: Settings) -> int:
    """Intra-op threads of the LLM and ASR: `settings.threads`, else half the cores.

    Half, so LLM decoding and TTS run side by side instead of oversubscribing every core
    (measured: 2 torch threads on a busy 2-core machine decode ~5x slower than 1).
    """
    return settings.threads or max(1, (os.cpu_count() or 2) // 2)


# Settings that change the code torch.compile and Triton generate: their values name the
# compile cache's folder (`voxline.kernels.compile_cache`), so changing one starts a new
# cache instead of mixing kernels. Shapes (buckets, sessions) need not: they are in every
# cache entry's own key.
COMPILE_CACHE_FIELDS = ("tts_device", "tts_pdl", "llm_device", "llm_dtype", "asr_device")


def persistent_compile_cache(settings: Settings) -> CompileCache:
    """The compile cache of this start under ``settings.cache``: torch.compile's
    Inductor/AOTAutograd caches and Triton's, checked (a corrupt or stale one is rebuilt
    with a warning) and made the folder they write to (see
    :mod:`voxline.kernels.compile_cache`). Inductor's default is under /tmp, which a
    reboot or a fresh container empties: on an H200 a cold start compiled every bucket
    again (~290 s), a warm one took 94 s."""
    return open_compile_cache(settings.cache, {name: getattr(settings, name)
                                               for name in COMPILE_CACHE_FIELDS})


def graph_backfill(settings: Settings, name: str, device: str) -> GraphBackfill | None:
    """A backfill for the graphs of the model of stage `name` on `device` when
    ``background_graphs`` is auto and the device is CUDA; None: capture all at load."""
    if settings.background_graphs == AutoOff.OFF or not device.startswith("cuda"):
        return None
    return GraphBackfill(name)


def check_background_graphs(settings: Settings) -> None:
    """``background_graphs=off`` is refused where no graphed model runs on CUDA."""
    if settings.background_graphs == AutoOff.OFF and not (
            settings.tts_device.startswith("cuda") or settings.asr_device.startswith("cuda")):
        raise ValueError(f"background_graphs=off applies to Qwen3-TTS or Moonshine on CUDA; "
                         f"with tts_device={settings.tts_device} and asr_device="
                         f"{settings.asr_device} no graphs are captured")


def _mark_in_background(cache: CompileCache) -> None:
    """Record the compile cache as good without holding up the caller (the CRCs of a
    cache's files take a while; the marker is replaced atomically)."""
    threading.Thread(target=cache.mark_good, name="voxline-compile-cache", daemon=True).start()


def load_models(settings: Settings | None = None, *, llm_path: str | None = None,
                max_slots: int = 8, max_len: int = LLM_POSITIONS) -> Models:
    """Load VAD, ASR, LLM and TTS (shipped weights unless `llm_path` names a checkpoint),
    and the model of each registered stage its settings turn on (`stage_registry.STAGES`)."""
    from voxline.engines.models.silero_vad import SileroVAD

    settings = settings or load_settings()
    threads = model_threads(settings)
    torch.set_num_threads(threads)
    if runs_on_gpu(settings):
        share_the_gil(settings.gil_switch_us / 1e6)
        shape_free_attention()
    elif settings.gil_switch_us != round(GIL_SWITCH_INTERVAL_S * 1e6):
        # (by value: the engine process gets every setting in a dump, all of them "set")
        raise ValueError(f"gil_switch_us={settings.gil_switch_us} applies with a model on a "
                         "GPU (llm_device, asr_device or tts_device=cuda); the CPU engine "
                         "keeps CPython's switch interval")
    set_stream_priority(settings)
    check_background_graphs(settings)
    cache = persistent_compile_cache(settings)
    if settings.trace:
        trace.enable()
    t0 = time.perf_counter()
    backfills: dict[str, GraphBackfill] = {}
    with phase(logger, "VAD load"):
        vad = SileroVAD.load(threads=1)
    with phase(logger, f"ASR load ({settings.asr_device})"):
        asr = load_asr(settings, threads, backfills)
    with phase(logger, "LLM load" + ("" if settings.remote_llm else f" ({settings.llm_device})")):
        llm = load_reply_model(settings, llm_path, max_slots, max_len)
    with phase(logger, f"TTS load ({settings.tts_device})"):
        tts = load_tts(settings, backfills)
    stages = {}
    for reg in STAGES:
        with phase(logger, f"{reg.name} load"):
            model = reg.load(settings)
        if model is not None:
            stages[reg.name] = model
    logger.info("all models loaded in %.2f s", time.perf_counter() - t0)
    models = Models(vad=vad, asr=asr, llm=llm, tts=tts, stages=stages,
                    backfills={k: v for k, v in backfills.items() if len(v)})
    with phase(logger, "warm-up"):
        warm_up(models)
    _mark_in_background(cache)
    for backfill in models.backfills.values():  # their compiles join the cache too
        backfill.on_done.append(lambda: _mark_in_background(cache))
        logger.info("%s: %d graph buckets left for after ready (background_graphs=auto)",
                    backfill.name, len(backfill))
    return models


def warm_up(models: Models) -> None:
    """Run each model once so the first user turn does not pay for lazy initialisation."""
    import numpy as np

    from voxline.engines.speech_model import SpeechJob

    t0 = time.perf_counter()
    models.vad.process(np.zeros((1, 512), np.float32), [models.vad.new_state()])
    models.asr.transcribe((np.random.default_rng(0).standard_normal(16000) * 0.01).astype(np.float32))
    for reg in STAGES:
        if reg.name in models.stages:
            reg.warm_up(models.stages[reg.name])
    slot = models.llm.alloc_slot() if not isinstance(models.llm, RemoteChat) else None
    if slot is not None:
        models.llm.forward([slot], [models.llm.render_message("user", "Hello.")])
        models.llm.free_slot(slot)
    models.tts.start(SpeechJob(-1, "Hello."))
    while models.tts.has_work():
        models.tts.step()
    logger.info("models warmed up in %.2f s", time.perf_counter() - t0)


def set_stream_priority(settings: Settings) -> None:
    """Apply ``gpu_stream_priority`` before the ASR and the LLM make their streams: 'off'
    gives them the speech steps' priority; refused where neither runs on CUDA."""
    urgent_on_gpu = [f"{field}={device}" for field, device in
                     (("asr_device", settings.asr_device),
                      ("llm_device", "remote" if settings.remote_llm else settings.llm_device))
                     if device.startswith("cuda")]
    if settings.gpu_stream_priority == AutoOff.OFF and not urgent_on_gpu:
        raise ValueError(f"gpu_stream_priority=off applies to the ASR and the embedded LLM on "
                         f"CUDA; with asr_device={settings.asr_device} and llm={settings.llm} "
                         f"on llm_device={settings.llm_device} neither runs there")
    set_urgent_streams(settings.gpu_stream_priority == AutoOff.AUTO)
    if urgent_on_gpu:
        logger.info("CUDA stream priority of the ASR and the LLM (%s): %d, speech steps %d",
                    ", ".join(urgent_on_gpu), stream_priority(urgent=True),
                    stream_priority(urgent=False))


def load_reply_model(settings: Settings, llm_path: str | None, max_slots: int,
                     max_len: int) -> ChatModel:
    """The embedded SmolLM2 (or `llm_path`), or a remote server when `settings.llm` says so."""
    if settings.llm_prefill_graphs == AutoOff.OFF and (settings.remote_llm
                                                 or not settings.llm_device.startswith("cuda")):
        raise ValueError(f"llm_prefill_graphs=off applies to the embedded LLM on CUDA; with "
                         f"llm={settings.llm} and llm_device={settings.llm_device} no prompt "
                         "runs from a CUDA graph")
    dynamic = dynamic_prefill(settings)  # refuses the setting where nothing is int8
    if settings.remote_llm:
        config = RemoteLLMConfig(parse_llm_spec(settings.llm), settings.llm_model or "",
                                 settings.llm_api_key, settings.llm_timeout, settings.llm_retries)
        remote = RemoteChat(config)
        logger.info("reply model: %s at %s (%s)", config.model, config.url, remote.check())
        return remote  # type: ignore[return-value]
    from voxline.engines.models.llama.chat import ChatLLM
    from voxline.engines.models.llama.checkpoint import load_llm

    device = llm_device(settings)
    path = llm_path or settings.llm_checkpoint
    return ChatLLM(load_llm(path, settings.llm_dtype, device=device, cache=settings.cache,
                            dynamic_prefill=dynamic),
                   max_slots=max_slots, max_len=max_len,
                   prefill_graphs=settings.llm_prefill_graphs == AutoOff.AUTO)


def dynamic_prefill(settings: Settings) -> bool:
    """``settings.llm_int8_prefill`` resolved for this CPU; a choice other than auto is
    refused where the embedded LLM has no int8 weights."""
    choice = settings.llm_int8_prefill
    if settings.llm_dtype != LLMDtype.INT8 or settings.remote_llm:
        if choice != Int8Prefill.AUTO:
            raise ValueError(f"llm_int8_prefill={choice} applies to the embedded LLM with "
                             f"llm_dtype=int8; with llm={settings.llm} and "
                             f"llm_dtype={settings.llm_dtype} there are no int8 weights")
        return False
    if choice == Int8Prefill.AUTO:
        return dynamic_prefill_default()
    return choice == Int8Prefill.DYNAMIC


def llm_device(settings: Settings) -> str:
    """``settings.llm_device``, checked: a GPU must exist, and int8 weights are CPU-only."""
    device = settings.llm_device
    if device == "cpu":
        return device
    if settings.remote_llm:
        check_llm_placement(settings)
    if not torch.cuda.is_available():
        raise ValueError(f"llm_device={device}, but this machine has no CUDA GPU (torch "
                         f"{torch.__version__}); use llm_device=cpu")
    check_llm_placement(settings)
    return device


def load_asr(settings: Settings, threads: int,
             backfills: dict[str, GraphBackfill] | None = None) -> ASRModel:
    """The ASR `settings.asr` names on `asr_device`: the shipped Moonshine (onnxruntime on
    the CPU; torch on a GPU) or a Whisper checkpoint; on a GPU batched up to one job per
    session."""
    checkpoint = settings.whisper_checkpoint
    gpu = settings.asr_device.startswith("cuda")
    if (gpu or checkpoint is not None) and settings.asr_decoder != ASRDecoder.AUTO:
        raise ValueError(f"asr_decoder={settings.asr_decoder} applies to Moonshine on the CPU "
                         f"(onnxruntime); with asr={settings.asr} on asr_device="
                         f"{settings.asr_device} leave it at auto")
    if gpu and settings.asr_workers != 1:
        raise ValueError(f"asr_workers={settings.asr_workers} applies to Moonshine on the CPU; "
                         f"on asr_device={settings.asr_device} the ASR batches every session's "
                         "jobs (use asr_workers=1, or asr_device=cpu for the CPU ASR)")
    if gpu and not torch.cuda.is_available():
        raise ValueError(f"asr_device={settings.asr_device}, but this machine has no CUDA GPU "
                         f"(torch {torch.__version__}); use asr_device=cpu")
    if checkpoint is None and gpu:
        from voxline.engines.models.moonshine_torch import MoonshineTorchASR

        backfill = graph_backfill(settings, "asr", settings.asr_device)
        if backfill is not None and backfills is not None:
            backfills["asr"] = backfill
        return MoonshineTorchASR.load(settings.asr_device, max_batch=settings.max_sessions,
                                      cache_dir=settings.cache,
                                      backfill=backfill if backfills is not None else None)
    if checkpoint is None:
        from voxline.engines.models.moonshine_asr import MoonshineASR

        workers = settings.asr_workers
        int8 = settings.asr_decoder != ASRDecoder.FLOAT32
        if workers == 1:
            return MoonshineASR.load(threads=threads, cache_dir=settings.cache,
                                     int8_decoder=int8)
        from voxline.engines.models.asr_pool import ConcurrentASR

        return ConcurrentASR(MoonshineASR.load(threads=max(1, threads // workers),
                                               cache_dir=settings.cache, int8_decoder=int8),
                             workers)
    if settings.asr_workers != 1:
        raise ValueError(f"asr_workers={settings.asr_workers} applies to Moonshine; a Whisper "
                         "ASR batches every session's jobs on its device (use asr_workers=1)")
    from voxline.engines.models.whisper_asr import WhisperASR

    return WhisperASR.load(checkpoint, settings.asr_device, max_batch=settings.max_sessions)


def set_tts_pdl(mode: AutoOff, cuda: bool) -> None:
    """Apply ``tts_pdl`` before the speech steps compile and capture: 'off' turns
    programmatic dependent launch off for this package's kernels and Inductor's (both are
    process-wide: the engine process's other compiled regions follow); 'auto' leaves the
    default (on where :func:`voxline.kernels.pdl.supported`)."""
    if mode == AutoOff.AUTO:
        return
    if not cuda:
        raise ValueError(f"tts_pdl={mode} needs tts_device=cuda (a CUDA launch attribute)")
    from voxline.kernels import pdl

    pdl.set_enabled(False)
    pdl.set_inductor(False)
    logger.info("Qwen3-TTS: programmatic dependent launch off (tts_pdl=off)")


def load_tts(settings: Settings,
             backfills: dict[str, GraphBackfill] | None = None) -> SpeechModel:
    """The speech stage `settings.tts` names: Piper (shipped) or a Qwen3-TTS checkpoint."""
    backend = settings.tts_backend
    if backend.kind is TTSBackend.QWEN3:
        from voxline.engines.models.qwen3_tts.scheduling import SCHEDULES
        from voxline.engines.models.qwen3_tts.speech_model import Qwen3SpeechModel

        model_dir = backend.target
        ramp, schedule = SCHEDULES[settings.tts_schedule]
        t0 = time.perf_counter()
        cuda = settings.tts_device.startswith("cuda")
        buckets = settings.tts_bucket_list()
        if buckets is not None and not cuda:
            raise ValueError("tts_batch_buckets needs tts_device=cuda (CUDA graphs)")
        if buckets is None and cuda:
            buckets = ladder_buckets(settings.tts_max_streams)
        set_tts_pdl(settings.tts_pdl, cuda)
        backfill = graph_backfill(settings, "tts", settings.tts_device)
        if backfill is not None and backfills is not None:
            backfills["tts"] = backfill
        stage = Qwen3SpeechModel(model_dir, device=settings.tts_device,
                                 dtype=torch.bfloat16 if cuda else torch.float32,
                                 speaker=settings.tts_speaker, language=settings.tts_language,
                                 max_streams=settings.tts_max_streams, batch_buckets=buckets,
                                 max_len=TTS_POSITIONS,
                                 initial_chunk_frames=settings.tts_first_chunk_frames,
                                 chunk_frames=settings.tts_chunk_frames,
                                 ramp=ramp, schedule=schedule,
                                 max_frames=settings.tts_max_frames,
                                 backfill=backfill if backfills is not None else None)
        logger.info("Qwen3-TTS %s (voice %s) loaded on %s in %.2f s%s", model_dir, stage.speaker,
                    settings.tts_device, time.perf_counter() - t0,
                    " -- RANDOM-WEIGHT TEST CHECKPOINT, not a voice" if stage.random_weights else "")
        return stage
    from voxline.engines.models.piper_tts import PiperTTS

    return SentenceSpeechModel(PiperTTS.load(threads=1))


# Engine streams beside the sessions': /v1/audio/speech, transcription, voice and video
# requests each hold one while they run.
REQUEST_STREAMS = 64
def make_engine_core(wake: Callable[[], None], settings: Mapping[str, Any] | None = None, *,
                     llm_path: str | None = None, max_streams: int | None = None,
                     **fields: object) -> EngineCore:
    """Core factory for engine clients (`DEFAULT_CORE`): models and core from Settings.

    `settings` is a ``Settings.model_dump(mode="json")`` (what `make_engine` sends); without
    it the environment is read. `max_streams` (engine streams open at once) defaults to
    ``max_sessions`` plus `REQUEST_STREAMS`. `fields` override Settings fields by name (tests and
    benchmarks: ``{"speculate_after_ms": 0}``); an unknown name is an error.
    """
    resolved = settings_from_dump(settings, **fields)
    # one KV-cache slot per conversation: the server admits at most max_sessions of them
    models = load_models(resolved, llm_path=llm_path, max_slots=resolved.max_sessions)
    if max_streams is None:  # every admitted session, and the HTTP requests beside them
        max_streams = resolved.max_sessions + REQUEST_STREAMS
    return EngineCore.from_settings(models, wake, resolved, max_streams=max_streams)
