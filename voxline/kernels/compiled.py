"""Static-shape ``torch.compile`` of step functions that run inside our own CUDA graphs.

After bucketed CUDA graphs the decoder steps are bound by their count of tiny kernels;
compiling a whole layer step (norms, QKV, RoPE, attention, MLP) fuses the elementwise
work around the matmuls. Each function is compiled once per process (:func:`static`)
with ``dynamic=False``: every bucket's shapes get their own specialisation, and weights
travel as arguments, so one compilation serves every layer of a model. Callers only call
these with the fixed shapes of their buckets (never from variable-length eager code), so
there is no dynamic-shape fallback or recompile storm. On the CPU, or with compile off,
the plain function is the exact eager twin.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch

from . import pdl

__all__ = ["maybe_compile", "static"]

F = TypeVar("F", bound=Callable)

# One specialisation per (batch, length) bucket: 6 batch x 3 length buckets for the talker,
# more under tests; the default limit of 8 would silently fall back to eager.
_RECOMPILE_LIMIT = 128


def _configure() -> None:
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), _RECOMPILE_LIMIT))
    if hasattr(cfg, "accumulated_recompile_limit"):
        cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 4 * _RECOMPILE_LIMIT)
    pdl.use_by_default()  # generated kernels take programmatic dependent launch on Hopper


@functools.cache
def static(fn: F) -> F:
    """``fn`` compiled once per process, static shapes, default mode (no Inductor CUDA
    graphs: the caller captures the whole step in its own graph)."""
    _configure()
    return torch.compile(fn, mode="default", dynamic=False)  # type: ignore[return-value]


def maybe_compile(fn: F, enabled: bool) -> F:
    """The compiled ``fn`` when ``enabled``, else ``fn`` itself (the eager twin)."""
    return static(fn) if enabled else fn
