"""Typed, read-once configuration. Environment variables are read here and nowhere else."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_cache() -> Path:
    return Path.home() / ".cache" / "voxline"


class Settings(BaseSettings):
    """Process-wide settings; `VOXLINE_*` environment variables override defaults."""

    model_config = SettingsConfigDict(env_prefix="VOXLINE_", extra="ignore")

    cache: Path = Field(default_factory=_default_cache, description="converted-weights cache")
    api_key: str | None = Field(default=None, description="require this bearer key if set")
    llm_dtype: str = Field(default="float32", description="float32 or bfloat16 on CPU")
    threads: int = Field(default=0, description="torch/onnxruntime intra-op threads (0 = auto)")


def load_settings(**overrides: object) -> Settings:
    """Read settings once (environment + explicit overrides)."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
