"""Backend choices are enums: plain choices as enum fields (flags list their values), a
backend with a target (``kind:target``) read through its `Settings` accessor."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from voxline.config import (
    ASRBackend,
    AutoOff,
    BackendChoice,
    EngineKind,
    LLMBackend,
    Settings,
    TTSBackend,
    VideoBackend,
    field_choices,
    settings_from_dump,
)


def test_backends_with_a_target_read_as_kind_and_target() -> None:
    s = Settings(tts="qwen3:/ckpt/tts", asr="whisper:/ckpt/asr",
                 llm="openai:http://127.0.0.1:8080/v1", video="helios-pyramid:/ckpt/v")
    assert s.tts_backend == BackendChoice(TTSBackend.QWEN3, "/ckpt/tts")
    assert s.asr_backend == BackendChoice(ASRBackend.WHISPER, "/ckpt/asr")
    assert s.llm_backend == BackendChoice(LLMBackend.OPENAI, "http://127.0.0.1:8080/v1")
    assert s.video_backend == BackendChoice(VideoBackend.HELIOS_PYRAMID, "/ckpt/v")
    assert s.remote_llm and s.whisper_checkpoint == "/ckpt/asr"
    shipped = Settings()
    assert (shipped.tts_backend.kind, shipped.asr_backend.kind, shipped.llm_backend.kind) == (
        TTSBackend.PIPER, ASRBackend.MOONSHINE, LLMBackend.EMBEDDED)
    assert shipped.video_backend is None and not shipped.remote_llm


def test_plain_choices_are_enums_that_travel_as_their_text() -> None:
    s = Settings(engine="inprocess", gpu_stream_priority="off")
    assert s.engine is EngineKind.INPROCESS and s.gpu_stream_priority is AutoOff.OFF
    dump = s.model_dump(mode="json")
    assert dump["engine"] == "inprocess" and settings_from_dump(dump) == s
    assert field_choices("engine") == ["process", "inprocess"]
    assert field_choices("llm_dtype") == ["int8", "float32", "bfloat16"]
    with pytest.raises(ValidationError):
        Settings(engine="threads")
