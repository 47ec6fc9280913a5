"""One on-disk home for everything torch.compile, Inductor and Triton write, so a second
start of the same models on the same GPU skips compiling.

The folder is ``<cache>/compile/torch-<version>-<gpu>-<digest>``: the torch version and
the GPU name (compiled kernels are valid for that pair only) and a digest of the
settings that change the generated code (:func:`settings_digest`). Inside it live
Inductor's FX-graph cache and AOTAutograd's cache (``TORCHINDUCTOR_CACHE_DIR``, both
switched on here), the autotuning results beside them, and Triton's kernel cache
(``TRITON_CACHE_DIR``: Inductor's kernels and this package's own Triton kernels).

Those caches are modular and keyed by graph and shapes, so they already give a warm
start everything torch can cache on one machine; torch's "mega-cache"
(``torch.compiler.save_cache_artifacts``) packs the same entries into one blob for
moving them to another machine and would add nothing here. What no cache keeps is
Dynamo's tracing and the CUDA-graph captures: those run again at every start
(the captures largely after the engine is ready, see ``background_graphs``).

Integrity: once an engine has started (and again when its background captures end),
:meth:`CompileCache.mark_good` writes ``voxline-compile-cache.json``: the versions and
the size and CRC-32 of every file then in the folder. The next start
(:func:`open_compile_cache`) checks them; an unreadable marker, another version, or a
file missing, truncated or changed is a corrupt or stale cache: it is removed with a
warning and rebuilt by that start's compiles, never a failed start (a stale or unreadable
whole is removed; a bad entry alone, just that entry). Files added after
the marker (new shapes) are not checked until the next mark. A folder without a marker
(first start, or one that died before it was ready) is used as it is: Inductor and
Triton write their entries atomically.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["MARKER", "CompileCache", "cache_folder_name", "open_compile_cache", "settings_digest"]

logger = logging.getLogger(__name__)

MARKER = "voxline-compile-cache.json"
LAYOUT = 1  # bump when what goes into the folder changes
_CRC_BLOCK = 1 << 20


def settings_digest(fields: Mapping[str, object]) -> str:
    """12 hex digits naming the settings that change generated code (sorted by name)."""
    text = json.dumps({k: str(v) for k, v in sorted(fields.items())}, sort_keys=True)
    return hashlib.sha256(f"{LAYOUT}:{text}".encode()).hexdigest()[:12]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+]+", "_", text).strip("_") or "unknown"


def gpu_name() -> str:
    """The CUDA device's name, or "cpu" on a machine without one."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.cuda.current_device())
    return "cpu"


def cache_folder_name(digest: str, gpu: str | None = None) -> str:
    """``torch-<version>-<gpu>-<digest>``, safe as one path component."""
    return f"torch-{_slug(torch.__version__)}-{_slug(gpu or gpu_name())}-{digest}"


def _versions(gpu: str) -> dict[str, str]:
    try:
        import triton  # type: ignore[import-not-found]

        triton_version = str(triton.__version__)
    except ImportError:
        triton_version = "none"
    return {"layout": str(LAYOUT), "torch": torch.__version__, "triton": triton_version,
            "cuda": str(torch.version.cuda), "gpu": gpu}


def _crc(path: Path) -> int:
    crc = 0
    with path.open("rb") as f:
        while block := f.read(_CRC_BLOCK):
            crc = zlib.crc32(block, crc)
    return crc


def _files(root: Path) -> list[Path]:
    """The cache's entries: not the marker, locks, or writes in progress (temp names)."""
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MARKER
                  and not p.name.endswith((".lock", ".tmp"))
                  and not any(part.startswith("tmp") for part in p.relative_to(root).parts))


@dataclass
class CompileCache:
    """The compile-cache folder of this start; see the module docstring."""

    path: Path
    versions: dict[str, str]
    # "warm" (checked against its marker), "new" (no marker yet), "repaired" (corrupt
    # entries removed), "rebuilt" (stale or unreadable: removed whole)
    state: str

    def mark_good(self) -> int:
        """Record the folder's files (size, CRC-32) as a good cache; returns their count.
        Errors are logged, not raised: a marker not written only costs a check."""
        t0 = time.perf_counter()
        files: dict[str, list[int]] = {}
        try:
            for p in _files(self.path):
                with contextlib.suppress(OSError):  # gone meanwhile (a rename, an eviction)
                    files[str(p.relative_to(self.path))] = [p.stat().st_size, _crc(p)]
            tmp = self.path / f"{MARKER}.tmp"
            tmp.write_text(json.dumps({**self.versions, "files": files}))
            tmp.replace(self.path / MARKER)
        except OSError as exc:
            logger.warning("compile cache %s: marker not written (%s)", self.path, exc)
            return 0
        logger.info("compile cache %s: %d files marked good in %.2f s", self.path, len(files),
                    time.perf_counter() - t0)
        return len(files)


def check(path: Path, versions: Mapping[str, str]) -> tuple[str | None, list[str]]:
    """What is wrong with the marked cache at `path`: a problem with the whole of it
    (unreadable marker, other versions), else the entries missing, truncated or changed
    since the mark, each with its reason (nothing wrong, or no marker: ``(None, [])``)."""
    marker = path / MARKER
    if not marker.exists():
        return None, []
    try:
        recorded = json.loads(marker.read_text())
        files = recorded["files"]
        if not isinstance(files, dict):
            raise TypeError("files is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its marker is unreadable ({type(exc).__name__}: {exc})", []
    for key, value in versions.items():
        if recorded.get(key) != value:
            return f"it was written by {key} {recorded.get(key)}, this start runs {value}", []
    bad = []
    for name, entry in files.items():
        p = path / name
        try:
            size, crc = entry
            if p.stat().st_size != size:
                bad.append(f"{name}: {p.stat().st_size} bytes, {size} when marked")
            elif _crc(p) != crc:
                bad.append(f"{name}: changed since it was marked (CRC-32)")
        except (OSError, TypeError, ValueError) as exc:
            bad.append(f"{name}: unreadable ({type(exc).__name__})")
    return None, bad


def _point_torch_at(path: Path) -> None:
    """Inductor, AOTAutograd and Triton caches into `path` (env for spawned compile
    workers; config for this process, whose Inductor may have read the env already)."""
    inductor, triton_dir = path / "inductor", path / "triton"
    for var, value in (("TORCHINDUCTOR_CACHE_DIR", inductor), ("TRITON_CACHE_DIR", triton_dir)):
        old = os.environ.get(var)
        if old is not None and old != str(value):
            logger.info("compile cache: %s=%s replaced by %s", var, old, value)
        os.environ[var] = str(value)
    os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "1"
    os.environ["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "1"
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    if hasattr(inductor_config, "autotune_local_cache"):
        inductor_config.autotune_local_cache = True
    functorch_config.enable_autograd_cache = True
    try:  # Triton >= 3.4 reads its cache folder through knobs, once
        import triton  # type: ignore[import-not-found]

        knobs = getattr(triton, "knobs", None)
        if knobs is not None and hasattr(knobs, "cache"):
            knobs.cache.dir = str(triton_dir)
    except Exception as exc:  # the environment variable above still applies
        logger.debug("triton.knobs.cache.dir not set: %s", exc)


def _remove_tree(path: Path) -> None:
    aside = path.with_name(f"{path.name}.bad-{os.getpid()}")
    try:
        path.rename(aside)
    except OSError:
        aside = path
    shutil.rmtree(aside, ignore_errors=True)


def open_compile_cache(root: Path, fields: Mapping[str, object], *,
                       gpu: str | None = None, apply: bool = True) -> CompileCache:
    """This start's compile cache under ``root/compile``: checked against its marker
    (a corrupt or stale one is removed with a warning), created, and (``apply``) made
    the folder torch.compile, Inductor and Triton write to."""
    gpu = gpu or gpu_name()
    versions = _versions(gpu)
    path = root / "compile" / cache_folder_name(settings_digest(fields), gpu)
    state = "new"
    if (path / MARKER).exists():
        t0 = time.perf_counter()
        problem, bad = check(path, versions)
        if problem is not None:
            logger.warning("compile cache %s is stale or corrupt (%s): removing it, this start "
                           "compiles again", path, problem)
            _remove_tree(path)
            state = "rebuilt"
        elif bad:
            logger.warning("compile cache %s: %d corrupt entries removed, compiled again by this "
                           "start (%s)", path, len(bad), "; ".join(bad[:3]))
            for entry in bad:
                with contextlib.suppress(OSError):
                    (path / entry.split(": ")[0]).unlink()
            with contextlib.suppress(OSError):
                (path / MARKER).unlink()
            state = "repaired"
        else:
            state = "warm"
        logger.info("compile cache %s: checked in %.2f s", path, time.perf_counter() - t0)
    path.mkdir(parents=True, exist_ok=True)
    if apply:
        _point_torch_at(path)
    logger.info("torch.compile cache: %s (%s)", path, state)
    return CompileCache(path, versions, state)
