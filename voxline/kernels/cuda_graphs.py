"""CUDA-graph capture and replay of fixed-shape steps, one graph per size bucket.

A :class:`StaticStep` is a function over static input buffers whose results are copied
into static output buffers it owns (allocated outside any graph pool, so replaying one
graph never clobbers another's outputs). Without capture (CPU, or capture off) calling it
runs the same function eagerly over the same padded buffers: the eager twin.
:class:`BucketedSteps` keeps one step per bucket key, created (and captured) on first use
or up front with :meth:`BucketedSteps.prepare`. All graphs share one memory pool.

Background capture (:class:`GraphBackfill`): ``prepare(keys, backfill=...)`` captures
only the buckets that cover the rest (:func:`first_keys`: the smallest, for a lone
first session, and the largest, which every batch fits) and leaves the others to the
backfill, which the stage's own worker thread runs one bucket at a time while the
stage has no plan (:class:`voxline.engines.stage.StageWorker`): a capture never runs
beside a replay of the same steps, their stream or their pool. Until a bucket is
captured, :meth:`BucketedSteps.ready` names the smallest captured bucket that covers
it, and the caller pads up to that one. Captures record in CUDA's thread-local capture
mode, so the other stages' threads may allocate and synchronize meanwhile (a capture
after the engine is ready, in the background or on first use, runs beside them).

Each :class:`BucketedSteps` captures on a CUDA stream of its own: cuBLAS keeps one
workspace per (handle, stream) and a captured graph keeps the address of the workspace
of the stream it was captured on, so graphs captured on one (PyTorch's default capture
stream) share a workspace, and replaying two of them at once on different streams (the
talker's steps and code2wav overlapping) would race on it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from torch import Tensor

from voxline.logs import log_phase

__all__ = ["DEFAULT_RNG_LOCK", "BucketedSteps", "GraphBackfill", "PackedInputs", "StageStream",
           "StaticStep", "bucket_for", "copy_in", "covers", "default_rng_draw", "first_keys",
           "ladder_buckets", "pow2_buckets", "same_tail", "set_urgent_streams",
           "stream_priority", "to_device"]

logger = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
StepFn = Callable[..., dict[str, Tensor]]

# While any thread captures a CUDA graph, PyTorch's default CUDA generator is in capture
# mode, and a draw on it from another thread raises ("Offset increment outside graph
# capture encountered unexpectedly"): an eager draw, or the replay of a graph that draws
# (its replay advances the generator). Graphs are captured in the background while other
# stages serve (`GraphBackfill`), so every capture and every such draw or replay holds
# this lock; it is reentrant, since a draw inside a capture is the capture's own.
DEFAULT_RNG_LOCK = threading.RLock()


@contextlib.contextmanager
def default_rng_draw(device: torch.device | str) -> Iterator[None]:
    """Around a draw on `device`'s default generator: the lock on CUDA, nothing elsewhere."""
    if torch.device(device).type != "cuda":
        yield
        return
    with DEFAULT_RNG_LOCK:
        yield


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
                 packed: PackedInputs | None = None, draws: bool = False) -> None:
        """``packed``: some of the inputs in one buffer (its views join ``inputs``);
        ``draws``: ``fn`` draws on the default generator (its replays take
        `DEFAULT_RNG_LOCK`)."""
        self.fn = fn
        self.draws = draws
        self.inputs = {**inputs, **packed.tensors} if packed is not None else inputs
        self.packed = packed
        self.outputs: dict[str, Tensor] = {}
        self.graph: torch.cuda.CUDAGraph | None = None
        self.seconds = (0.0, 0.0)  # capture's warm-up (and compile) and recording

    def _run(self) -> None:
        results = self.fn(**self.inputs)
        if not self.outputs:
            self.outputs = {k: torch.empty_like(v) for k, v in results.items()}
        for k, v in results.items():
            self.outputs[k].copy_(v)

    @torch.inference_mode()
    def capture(self, pool: tuple[int, int] | None = None, warmup: int = 2,
                stream: torch.cuda.Stream | None = None, mode: str = "thread_local") -> None:
        """Warm up on a side stream (allocator, cuBLAS handles), then record one graph on
        ``stream`` (default: PyTorch's shared capture stream); ``mode`` is CUDA's capture
        mode ("thread_local" while other threads use the GPU)."""
        t0 = time.perf_counter()
        side = stream or torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                self._run()
        torch.cuda.current_stream().wait_stream(side)
        t1 = time.perf_counter()  # the warm-up's host time (a compile's), not its kernels'

        graph = torch.cuda.CUDAGraph()
        with DEFAULT_RNG_LOCK, torch.cuda.graph(graph, pool=pool, stream=stream,
                                                capture_error_mode=mode):  # type: ignore[arg-type]
            self._run()
        self.graph = graph
        # warm-up (a compiled step compiles on its first run of a shape), then recording
        self.seconds = (t1 - t0, time.perf_counter() - t1)

    @torch.inference_mode()
    def __call__(self) -> dict[str, Tensor]:
        """Run once; the returned buffers are overwritten by the next call."""
        if self.graph is None:
            self._run()
        elif self.draws:
            with DEFAULT_RNG_LOCK:
                self.graph.replay()
        else:
            self.graph.replay()
        return self.outputs


def covers(have: Hashable, want: Hashable) -> bool:
    """Whether bucket ``have`` holds a request for ``want``: every part at least as large
    (ints, or tuples of ints such as (batch, length))."""
    if isinstance(have, tuple) and isinstance(want, tuple):
        return len(have) == len(want) and all(h >= w for h, w in zip(have, want, strict=True))
    return have >= want  # type: ignore[operator]


def same_tail(have: Hashable, want: Hashable) -> bool:
    """:func:`covers` on the first part only, the rest equal: keys whose later parts are
    exact shapes, not bucket bounds (a code2wav chunk's frames, a top-k cap)."""
    assert isinstance(have, tuple) and isinstance(want, tuple)
    return have[0] >= want[0] and have[1:] == want[1:]


def first_keys(keys: Iterable[K], fits: Callable[[K, K], bool] = covers) -> list[K]:
    """The buckets to capture before the engine is ready: those no other bucket covers
    (together they hold every request) and those covering no other (the cheapest, for
    the first lone sessions)."""
    keys = list(dict.fromkeys(keys))
    top = [k for k in keys if not any(o != k and fits(o, k) for o in keys)]
    bottom = [k for k in keys if not any(o != k and fits(k, o) for o in keys)]
    return list(dict.fromkeys([*top, *bottom]))


class BucketedSteps(Generic[K]):
    """One :class:`StaticStep` per bucket key, made by ``make(key)``; captured when
    ``capture`` is set (the step's initial inputs must be safe to run: padding only).
    ``fits(have, want)``: whether bucket ``have`` holds a request for ``want``
    (default :func:`covers`), for padding up while buckets are captured in the background."""

    def __init__(self, make: Callable[[K], StaticStep], *, capture: bool, name: str,
                 fits: Callable[[K, K], bool] = covers) -> None:
        self.make = make
        self.capture = capture
        self.name = name
        self.fits = fits
        self.steps: dict[K, StaticStep] = {}
        self.deferred: set[K] = set()  # left to a GraphBackfill, not captured yet
        self.pool: tuple[int, int] | None = None  # made at the first capture
        self.capture_stream: torch.cuda.Stream | None = None  # see the module docstring

    def _capture(self, step: StaticStep) -> None:
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
            self.capture_stream = torch.cuda.Stream()
        step.capture(self.pool, stream=self.capture_stream)

    def ready(self, key: K) -> K:
        """The bucket to run a request for ``key`` in: ``key`` unless it is deferred and
        not captured yet, then the smallest captured bucket that holds it (none: ``key``,
        captured now by :meth:`get`)."""
        if key in self.steps or key not in self.deferred:
            return key
        held = [k for k in self.steps if self.fits(k, key)]
        if held:
            return min(held)  # type: ignore[type-var]
        self.deferred.discard(key)
        return key

    def get(self, key: K) -> StaticStep:
        step = self.steps.get(key)
        if step is None:
            step = self.make(key)
            if self.capture:
                self._capture(step)
            self.steps[key] = step
            self.deferred.discard(key)
        return step

    def prepare(self, keys: Iterable[K], *, progress: bool = True,
                backfill: GraphBackfill | None = None) -> None:
        """Create (and capture) the given buckets now, largest first, logging progress
        (each bucket at INFO, or at DEBUG when the caller logs the whole instead). With a
        ``backfill``, only the :func:`first_keys` now; the rest join the backfill."""
        keys = sorted(keys, reverse=True)  # type: ignore[type-var]
        if backfill is not None:
            now = set(first_keys(keys, self.fits))
            later = [k for k in keys if k not in now and k not in self.steps]
            keys = [k for k in keys if k in now]
            self.deferred.update(later)
            backfill.add(self, later)
        level = logging.INFO if progress else logging.DEBUG
        t0 = time.perf_counter()
        warm = record = 0.0
        for i, key in enumerate(keys, 1):
            new = key not in self.steps
            step = self.get(key)
            if new:
                warm, record = warm + step.seconds[0], record + step.seconds[1]
            logger.log(level, "%s: bucket %s ready (%d/%d, %.1f s)", self.name, key, i,
                       len(keys), time.perf_counter() - t0)
        if self.capture and keys:
            log_phase(logger, f"{self.name}: compile and warm-up ({len(keys)} buckets)", warm)
            log_phase(logger, f"{self.name}: graph capture ({len(keys)} buckets)", record)


class GraphBackfill:
    """The buckets a model's :meth:`BucketedSteps.prepare` left for after the engine is
    ready, captured one per :meth:`step` on the thread that replays them (the stage's
    worker, between plans; see the module docstring), in the order they were added
    (each ``prepare`` adds its own largest first)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: deque[tuple[BucketedSteps[Any], Hashable]] = deque()
        self.total = 0
        self.seconds = 0.0
        self.on_done: list[Callable[[], None]] = []  # run once, when the last bucket is in
        self.done = False

    def add(self, steps: BucketedSteps[Any], keys: Iterable[Hashable]) -> None:
        for key in keys:
            self._queue.append((steps, key))
            self.total += 1

    def __len__(self) -> int:
        return len(self._queue)

    def step(self) -> bool:
        """Capture the next deferred bucket (one a request already captured is skipped);
        True while more remain. Logs each bucket, and the whole when the last is in."""
        while self._queue:
            steps, key = self._queue.popleft()
            if key in steps.steps:
                continue
            t0 = time.perf_counter()
            steps.get(key)
            took = time.perf_counter() - t0
            self.seconds += took
            logger.info("%s: %s bucket %s captured in the background (%.2f s; %d left)",
                        self.name, steps.name, key, took, len(self._queue))
            break
        if self._queue:
            return True
        self.finish_log()
        return False

    def finish_log(self) -> None:
        """The phase line of the whole, and the ``on_done`` callbacks (once)."""
        if self._queue or self.done:
            return
        self.done = True
        if self.total:
            log_phase(logger, f"{self.name} graphs in the background ({self.total})",
                      self.seconds)
        for callback in self.on_done:
            callback()

    def run_all(self) -> None:
        """Capture every deferred bucket now (no background)."""
        while self.step():
            pass


# CUDA stream priorities: a lower number is served sooner. When multiprocessors free up,
# the GPU starts the waiting blocks of a higher-priority stream's kernels first (running
# blocks are never preempted). PyTorch keeps four levels, 0 to -3, one for each kind of
# work by how soon a user notices it waiting: the stages a reply's first words wait on (ASR,
# LLM) are urgent; the speech steps, whose audio sits in a playout buffer, come next; then a
# video's VAE decode (frames due at the player now); last the denoise of its next chunk.
URGENT_PRIORITY = -3
NORMAL_PRIORITY = -2
VIDEO_DECODE_PRIORITY = -1
VIDEO_DENOISE_PRIORITY = 0
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

