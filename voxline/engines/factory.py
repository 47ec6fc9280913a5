"""Build the default engine: the four shipped models, loaded with timing logs."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import torch

from voxline.config import Settings, load_settings
from voxline.engines.core import EngineCore, Models

logger = logging.getLogger(__name__)


def load_models(settings: Settings | None = None, *, llm_path: str | None = None,
                max_slots: int = 8, max_len: int = 2048) -> Models:
    """Load VAD, ASR, LLM and TTS (shipped weights unless `llm_path` names a checkpoint)."""
    from voxline.engines.models.chat_llm import ChatLLM
    from voxline.engines.models.moonshine_asr import MoonshineASR
    from voxline.engines.models.piper_tts import PiperTTS
    from voxline.engines.models.silero_vad import SileroVAD
    from voxline.engines.models.smollm2 import load_llm
    from voxline.engines.speech_stage import SentenceSpeechStage

    settings = settings or load_settings()
    threads = settings.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    vad = SileroVAD.load(threads=1)
    asr = MoonshineASR.load(threads=threads)
    llm = ChatLLM(load_llm(llm_path, settings.llm_dtype, cache=settings.cache),
                  max_slots=max_slots, max_len=max_len)
    tts = SentenceSpeechStage(PiperTTS.load(threads=1))
    logger.info("all models loaded in %.2f s", time.perf_counter() - t0)
    return Models(vad=vad, asr=asr, llm=llm, tts=tts)


def make_engine_core(wake: Callable[[], None], **kwargs: object) -> EngineCore:
    """Core factory for engine clients (`"voxline.engines.factory:make_engine_core"`)."""
    llm_path = kwargs.pop("llm_path", None)
    max_streams = int(kwargs.pop("max_streams", 64))  # type: ignore[arg-type]
    settings = load_settings(**kwargs)
    models = load_models(settings, llm_path=llm_path)  # type: ignore[arg-type]
    return EngineCore(models, wake, max_streams=max_streams)


DEFAULT_CORE = "voxline.engines.factory:make_engine_core"
