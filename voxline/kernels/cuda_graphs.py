"""CUDA-graph capture and replay of fixed-shape steps, one graph per size bucket.

A :class:`StaticStep` is a function over static input buffers whose results are copied
into static output buffers it owns (allocated outside any graph pool, so replaying one
graph never clobbers another's outputs). Without capture (CPU, or capture off) calling it
runs the same function eagerly over the same padded buffers: the eager twin.
:class:`BucketedSteps` keeps one step per bucket key, created (and captured) on first use
or up front with :meth:`BucketedSteps.prepare`. All graphs share one memory pool.

Each :class:`BucketedSteps` captures on a CUDA stream of its own: cuBLAS keeps one
workspace per (handle, stream) and a captured graph keeps the address of the workspace
of the stream it was captured on, so graphs captured on one (PyTorch's default capture
stream) share a workspace, and replaying two of them at once on different streams (the
talker's steps and code2wav overlapping) would race on it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Generic, TypeVar

import numpy as np
import torch
from torch import Tensor

__all__ = ["BucketedSteps", "PackedInputs", "StageStream", "StaticStep", "bucket_for", "copy_in",
           "ladder_buckets", "pow2_buckets", "set_urgent_streams", "stream_priority", "to_device"]

logger = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
StepFn = Callable[..., dict[str, Tensor]]


def pow2_buckets(lo: int, hi: int) -> list[int]:
    """Powers of two from ``lo`` up to ``hi``, with ``hi`` itself last."""
    out, b = [], max(1, lo)
    while b < hi:
        out.append(b)
        b *= 2
    return [*out, hi]


def ladder_buckets(hi: int, factor: int = 4) -> list[int]:
    """1, factor, factor**2, ... below ``hi``, then ``hi``: fewer buckets than powers of two
    where each one is costly to capture (a compiled step per bucket) and padding is cheap."""
    out, b = [], 1
    while b < hi:
        out.append(b)
        b *= factor
    return [*out, hi]


def bucket_for(n: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket >= ``n``; None when ``n`` is past the largest."""
    for b in sorted(buckets):
        if b >= n:
            return b
    return None


def copy_in(dst: Tensor, src: Tensor) -> None:
    """Copy ``src`` into a step's static input ``dst``. From host memory into a GPU buffer
    the copy goes through a pinned staging copy without waiting: a plain ``copy_`` from
    pageable memory synchronizes the stream, so the host sat idle while the step before
    ran (and gave up the GIL to get it back). The pinned block is kept until the copy has
    run (PyTorch's host allocator records it on the stream)."""
    if dst.is_cuda and src.device.type == "cpu":
        dst.copy_(src.pin_memory(), non_blocking=True)
    else:
        dst.copy_(src)


def to_device(values: object, dtype: torch.dtype, device: torch.device | str) -> Tensor:
    """A tensor of Python ``values`` (a number or nested lists) on ``device``; onto a GPU
    without waiting for the
    stream (``torch.tensor(values, device=...)`` copies from pageable memory, which waits
    for every kernel queued before it)."""
    host = torch.tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class PackedInputs:
    """A step's small inputs (settings, ids, positions) packed in one device buffer, so
    one copy fills them all: the host writes them into numpy views of one byte buffer
    (no torch call) and :meth:`send` copies it over (:func:`copy_in`: three torch calls,
    each giving up the GIL the engine's other threads want, where a tensor per input
    cost three each). ``layout`` names each input's ``(shape, dtype)``; :attr:`tensors`
    are the device views a :class:`StaticStep` takes as inputs."""

    def __init__(self, layout: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
                 device: torch.device | str) -> None:
        self.spans: dict[str, tuple[int, tuple[int, ...], torch.dtype]] = {}
        size = 0
        for name, (shape, dtype) in layout.items():
            size = -(-size // 8) * 8  # each input starts 8-byte aligned
            self.spans[name] = (size, shape, dtype)
            size += int(np.prod(shape)) * dtype.itemsize
        self.nbytes = size
        self.raw = torch.zeros(size, dtype=torch.uint8, device=device)
        self.tensors = self._views(self.raw)

    def _views(self, raw: Tensor) -> dict[str, Tensor]:
        return {name: raw[at:at + int(np.prod(shape)) * dtype.itemsize].view(dtype).view(shape)
                for name, (at, shape, dtype) in self.spans.items()}

    def host(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """A zeroed host buffer and numpy views of its inputs, to fill and :meth:`send`."""
        raw = np.zeros(self.nbytes, dtype=np.uint8)
        views = {name: raw[at:at + int(np.prod(shape)) * dtype.itemsize].view(_NUMPY[dtype])
                 .reshape(shape) for name, (at, shape, dtype) in self.spans.items()}
        return raw, views

    def send(self, raw: np.ndarray) -> None:
        """Copy a filled host buffer into the device buffer (without waiting on a GPU)."""
        copy_in(self.raw, torch.from_numpy(raw))


_NUMPY = {torch.int64: np.int64, torch.int32: np.int32, torch.float32: np.float32,
          torch.float64: np.float64, torch.bool: np.bool_, torch.uint8: np.uint8}


class StaticStep:
    """``fn(**inputs)`` over static buffers; a CUDA-graph replay once captured."""

    def __init__(self, fn: StepFn, inputs: dict[str, Tensor],
                 packed: PackedInputs | None = None) -> None:
        """``packed``: some of the inputs in one buffer (its views join ``inputs``)."""
        self.fn = fn
        self.inputs = {**inputs, **packed.tensors} if packed is not None else inputs
        self.packed = packed
        self.outputs: dict[str, Tensor] = {}
        self.graph: torch.cuda.CUDAGraph | None = None

    def _run(self) -> None:
        results = self.fn(**self.inputs)
        if not self.outputs:
            self.outputs = {k: torch.empty_like(v) for k, v in results.items()}
        for k, v in results.items():
            self.outputs[k].copy_(v)

    @torch.inference_mode()
    def capture(self, pool: tuple[int, int] | None = None, warmup: int = 2,
                stream: torch.cuda.Stream | None = None) -> None:
        """Warm up on a side stream (allocator, cuBLAS handles), then record one graph on
        ``stream`` (default: PyTorch's shared capture stream)."""
        side = stream or torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                self._run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            self._run()
        self.graph = graph

    @torch.inference_mode()
    def __call__(self) -> dict[str, Tensor]:
        """Run once; the returned buffers are overwritten by the next call."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self._run()
        return self.outputs


class BucketedSteps(Generic[K]):
    """One :class:`StaticStep` per bucket key, made by ``make(key)``; captured when
    ``capture`` is set (the step's initial inputs must be safe to run: padding only)."""

    def __init__(self, make: Callable[[K], StaticStep], *, capture: bool, name: str) -> None:
        self.make = make
        self.capture = capture
        self.name = name
        self.steps: dict[K, StaticStep] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.capture_stream = torch.cuda.Stream() if capture else None  # see the module docstring

    def get(self, key: K) -> StaticStep:
        step = self.steps.get(key)
        if step is None:
            step = self.make(key)
            if self.capture:
                step.capture(self.pool, stream=self.capture_stream)
            self.steps[key] = step
        return step

    def prepare(self, keys: Iterable[K], *, progress: bool = True) -> None:
        """Create (and capture) the given buckets now, largest first, logging progress
        (each bucket at INFO, or at DEBUG when the caller logs the whole instead)."""
        keys = sorted(keys, reverse=True)  # type: ignore[type-var]
        level = logging.INFO if progress else logging.DEBUG
        t0 = time.perf_counter()
        for i, key in enumerate(keys, 1):
            self.get(key)
            logger.log(level, "%s: bucket %s ready (%d/%d, %.1f s)", self.name, key, i,
                       len(keys), time.perf_counter() - t0)


# CUDA stream priorities: a lower number is served sooner. When multiprocessors free up,
# the GPU starts the waiting blocks of an urgent stream's kernels before a normal one's
# (running blocks are never preempted). The stages a reply's first words wait on (ASR,
# LLM) are urgent; the speech steps, whose audio sits in a playout buffer, are not.
URGENT_PRIORITY = -1
NORMAL_PRIORITY = 0
_urgent_streams = True


def set_urgent_streams(enabled: bool) -> None:
    """Give the urgent stages' streams their priority (the default) or not (process-wide;
    takes effect for streams made afterwards)."""
    global _urgent_streams
    _urgent_streams = enabled


def stream_priority(urgent: bool) -> int:
    """The CUDA priority a stage's stream is made with."""
    return URGENT_PRIORITY if urgent and _urgent_streams else NORMAL_PRIORITY


class StageStream:
    """A stage's own CUDA stream, so stages sharing one GPU queue their kernels apart;
    ``urgent`` stages' streams have a higher priority (:func:`stream_priority`).

    Threads that never pick a stream all queue on the device's default stream, one FIFO:
    the LLM's eager prompt kernels waited behind every Qwen3-TTS step queued before them
    (and the TTS behind the LLM), which is how an H200 at 40 % busy gave LLM plans of
    200-360 ms. :meth:`run` orders the stage's work after what the engine loop queued on
    the default stream (cache copies, text embeddings), and returns once the stage's
    work is done, so whatever the loop reads next is complete. Off CUDA it just calls."""

    def __init__(self, device: torch.device | str | None, *, urgent: bool = False) -> None:
        dev = torch.device(device) if device is not None else None
        self.priority = stream_priority(urgent)
        self.stream = (torch.cuda.Stream(dev, priority=self.priority)
                       if dev is not None and dev.type == "cuda" else None)

    def run(self, fn: Callable[..., T], *args: object) -> T:
        if self.stream is None:
            return fn(*args)
        self.stream.wait_stream(torch.cuda.default_stream(self.stream.device))
        with torch.cuda.stream(self.stream):
            out = fn(*args)
        self.stream.synchronize()
        return out

