"""Step caches on the Helios transformer, with diffusers' own hooks, chosen per request.

A request names a `CacheChoice` (`cache_backend` none / first_block_cache / mag_cache and a
threshold; unset: the server's `video_cache_backend`). The hooks are diffusers':
`FirstBlockCacheConfig` and `MagCacheConfig` through `transformer.enable_cache`, removed with
`disable_cache`. They live on the one shared transformer, so `StepCaches.prepare(choice,
steps)` runs before every chunk (on the video worker, the only thread that calls the model):

- the hooks on the transformer are switched only when the chunk's choice differs from the
  one applied (a different backend, threshold or step count);
- every hook's state is reset (`HookRegistry.reset_stateful_hooks`) before every chunk, so
  a chunk starts from the same state whichever request ran before it. Each chunk is its own
  denoising loop (fresh noise, a new history), so nothing useful carries across chunks;
  MagCache itself resets its step counter at the end of each loop. This is what makes
  interleaved requests with different backends each equal their solo runs (tested).

MagCache skips by checkpoint-specific magnitude ratios. `MagRatios` keeps them in a JSON
file (`voxline_mag_ratios.json` beside the checkpoint, or in the cache folder when the
checkpoint's folder is read-only); without one, the first mag_cache chunk is a calibration
run: it computes every step (frames exact), records per step the mean over tokens of
|residual_t| / |residual_t-1| (the residual is the blocks' output minus input, MagCache's
own calibration formula) with torch forward hooks, and stores them. Ratios calibrated at
one step count serve any other (`MagCacheConfig` interpolates them).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch
from diffusers.hooks import FirstBlockCacheConfig, HookRegistry, MagCacheConfig
from diffusers.hooks._helpers import TransformerBlockMetadata, TransformerBlockRegistry
from diffusers.models.transformers.transformer_helios import HeliosTransformerBlock

logger = logging.getLogger(__name__)

RATIOS_FILE = "voxline_mag_ratios.json"


class CacheBackend(StrEnum):
    NONE = "none"
    FIRST_BLOCK_CACHE = "first_block_cache"
    MAG_CACHE = "mag_cache"


# diffusers' own defaults for each backend's threshold
DEFAULT_THRESHOLDS = {CacheBackend.FIRST_BLOCK_CACHE: 0.05, CacheBackend.MAG_CACHE: 0.06}


@dataclass(frozen=True)
class CacheChoice:
    """A request's step cache; `threshold` None: the backend's default."""

    backend: CacheBackend = CacheBackend.NONE
    threshold: float | None = None

    @property
    def resolved_threshold(self) -> float:
        if self.threshold is not None:
            return self.threshold
        return DEFAULT_THRESHOLDS.get(self.backend, 0.0)


def parse_choice(backend: str, threshold: float | None, default: CacheChoice,
                 event: str = "CreateVideo") -> CacheChoice:
    """The request's choice (`backend` "" takes `default`); ValueError naming the field."""
    if not backend:
        if threshold is None:
            return default
        return CacheChoice(default.backend, threshold)
    try:
        chosen = CacheBackend(backend)
    except ValueError:
        names = ", ".join(b.value for b in CacheBackend)
        raise ValueError(f"{event}.cache_backend: {backend!r} is not one of {names}") from None
    if threshold is not None and threshold < 0:
        raise ValueError(f"{event}.cache_threshold: {threshold} is negative")
    return CacheChoice(chosen, threshold)


def register_helios_blocks() -> None:
    """Tell diffusers' hook registry how a Helios block returns (one hidden-states tensor);
    diffusers 0.42 registers Wan's blocks but not Helios', which its cache hooks need."""
    try:
        TransformerBlockRegistry.get(HeliosTransformerBlock)
    except ValueError:
        TransformerBlockRegistry.register(HeliosTransformerBlock, TransformerBlockMetadata(
            return_hidden_states_index=0, return_encoder_hidden_states_index=None))


class MagRatios:
    """MagCache ratios of one checkpoint: read from and written to the first writable of
    `paths` (beside the checkpoint, then the cache folder)."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.ratios: list[float] | None = None
        for path in paths:
            if path.is_file():
                self.ratios = self._read(path)
                logger.info("MagCache ratios loaded from %s", path)
                break

    @staticmethod
    def _read(path: Path) -> list[float]:
        data = json.loads(path.read_text())
        ratios = data.get("mag_ratios") if isinstance(data, dict) else None
        if not isinstance(ratios, list) or not ratios or not all(
                isinstance(r, (int, float)) for r in ratios):
            raise ValueError(f"video: {path} has no 'mag_ratios' list of numbers")
        return [float(r) for r in ratios]

    def save(self, ratios: list[float], calibrated_with: dict[str, Any]) -> Path | None:
        """Keep `ratios` in memory and in the first folder that takes the file."""
        self.ratios = ratios
        body = json.dumps({"mag_ratios": ratios, "calibrated_with": calibrated_with}, indent=1)
        for path in self.paths:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                partial = path.with_name(f"{path.name}.{os.getpid()}.part")
                partial.write_text(body)
                partial.replace(path)
            except OSError as exc:
                logger.debug("MagCache ratios not written to %s: %s", path, exc)
                continue
            logger.info("MagCache ratios calibrated and stored in %s", path)
            return path
        logger.warning("MagCache ratios calibrated but no folder of %s took them", self.paths)
        return None


class ResidualRecorder:
    """MagCache's calibration measure over one denoising loop, from torch forward hooks on
    the first block's input and the last block's output (cond calls only)."""

    def __init__(self) -> None:
        self.ratios: list[float] = []
        self._previous: torch.Tensor | None = None
        self._input: torch.Tensor | None = None
        self.active = False

    @contextmanager
    def attached(self, blocks: torch.nn.ModuleList) -> Iterator[ResidualRecorder]:
        first = blocks[0].register_forward_pre_hook(self._on_input)
        last = blocks[-1].register_forward_hook(self._on_output)
        try:
            yield self
        finally:
            first.remove()
            last.remove()

    def _on_input(self, _module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if self.active:
            self._input = args[0]

    def _on_output(self, _module: torch.nn.Module, _args: Any, output: torch.Tensor) -> None:
        if not self.active or self._input is None:
            return
        residual = (output - self._input).float()
        if self._previous is None:
            self.ratios.append(1.0)
        else:
            ratio = torch.linalg.norm(residual, dim=-1) / (
                torch.linalg.norm(self._previous, dim=-1) + 1e-8)
            self.ratios.append(ratio.mean().item())
        self._previous = residual


class StepCaches:
    """The diffusers cache hooks on one transformer (one `StepCaches` per transformer);
    see the module docstring."""

    def __init__(self, transformer: torch.nn.Module, default: CacheChoice,
                 mag_ratios: MagRatios | None = None) -> None:
        register_helios_blocks()
        self.transformer = transformer
        self.default = default
        self.mag_ratios = mag_ratios if mag_ratios is not None else MagRatios([])
        self._applied: tuple[CacheChoice, int] | None = None  # None: no hooks on

    def needs_calibration(self, choice: CacheChoice) -> bool:
        return choice.backend == CacheBackend.MAG_CACHE and self.mag_ratios.ratios is None

    def prepare(self, choice: CacheChoice, steps: int) -> None:
        """Put `choice`'s hooks on the transformer (switching only if they differ) and reset
        their state, before a chunk of `steps` denoising steps."""
        backend = choice.backend
        if backend == CacheBackend.NONE or self.needs_calibration(choice):
            self._remove()
            return
        key = (choice, steps)
        if self._applied != key or not self.transformer.is_cache_enabled:
            self._remove()
            self.transformer.enable_cache(self._config(choice, steps))
            self._applied = key
        HookRegistry.check_if_exists_or_initialize(self.transformer).reset_stateful_hooks()

    def _config(self, choice: CacheChoice, steps: int) -> Any:
        if choice.backend == CacheBackend.FIRST_BLOCK_CACHE:
            return FirstBlockCacheConfig(threshold=choice.resolved_threshold)
        return MagCacheConfig(threshold=choice.resolved_threshold, num_inference_steps=steps,
                              mag_ratios=list(self.mag_ratios.ratios or []))

    def _remove(self) -> None:
        if self.transformer.is_cache_enabled:  # ours, or left by an earlier owner's
            self.transformer.disable_cache()
        self._applied = None

    @contextmanager
    def calibrating(self) -> Iterator[ResidualRecorder]:
        """Record MagCache ratios over the chunk run inside (no hooks skip meanwhile)."""
        self._remove()
        recorder = ResidualRecorder()
        with recorder.attached(self.transformer.blocks):
            yield recorder


def step_caches_for(transformer: torch.nn.Module, checkpoint: str | Path, cache_dir: Path,
                    backend: str = "none", threshold: float | None = None) -> StepCaches:
    """The server's step caches: its default choice (the `video_cache_backend` and
    `video_cache_threshold` settings) and the checkpoint's MagCache ratio files."""
    root = Path(checkpoint)
    resolved = str(root.resolve())
    digest = hashlib.sha1(resolved.encode()).hexdigest()[:10]  # same-named checkpoints differ
    folder = cache_dir / "video" / f"{root.resolve().name or 'checkpoint'}-{digest}"
    ratios = MagRatios([root / RATIOS_FILE, folder / RATIOS_FILE])
    return StepCaches(transformer, parse_choice(backend, threshold, CacheChoice(),
                                                "video_cache_backend"), ratios)
