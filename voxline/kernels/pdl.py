"""Programmatic dependent launch (PDL) for this package's Triton kernels (Hopper and newer).

A captured decode step is a chain of ~1,000 kernels of a few microseconds each. Without
PDL each one starts only once the one before it has drained, and pays its launch and
ramp-up in series: at batch 1 the code predictor's frame read its ~2.4 GB of weights
in ~2.9 ms, ~0.8 TB/s of the H200's ~4.8 (round 8). With PDL a
kernel is launched with the programmatic-serialisation attribute, so its programs may be
placed while the previous kernel still runs. Each of our kernels then starts with
:func:`begin`: it waits (``griddepcontrol.wait``) until the previous kernel has finished and
its writes are visible, before it reads or writes anything, and at once lets the next
kernel be placed (``griddepcontrol.launch_dependents``) while it computes.

Every kernel launched with the attribute waits before its first access, so ordering
stays transitive along the chain: a kernel cannot finish before the one ahead of it has,
and the one after it waits for it. Kernels launched without the attribute (cuBLAS,
copies) keep the plain stream order on both sides. (Prefetching a projection's weight
tile into L2 before the wait was tried and made both steps slower: it competes for DRAM
with the previous projection, which is reading its own weights. Loading it into
registers before the wait gained nothing either (round 11): at 146-224 registers a
thread, the next projection's programs rarely fit beside the running ones.)

Inductor can emit the same for its generated kernels (``torch._inductor.config.triton.
enable_pdl``). Its kernels wait only before loads of buffers the previous kernel in
their region wrote, so a kernel that reads a buffer written two kernels back, behind a
kernel that never waits (one without loads), could read it early. :func:`set_inductor`
therefore also makes every generated kernel wait before its first access; it reads the
config when a region compiles (callers that A/B it reset Dynamo).

On by default where supported: :func:`active` says whether a launch on a tensor's
device takes it (off CUDA, before Hopper or with a Triton without the intrinsics,
kernels launch as before), and :func:`use_by_default` (called by
:func:`~voxline.kernels.compiled.static` before its first compile) switches Inductor's on
unless a caller chose with :func:`set_inductor`. On an H200 (``bench_pdl.py``, stop 40)
both together cut the code predictor's batch-1 frame 2.85 -> 2.52 ms and the talker's
decode step 1.69 -> 1.60 ms, with the same codes and hidden states bit for bit when
Inductor does not benchmark its configurations (``TORCHINDUCTOR_DETERMINISTIC=1``).
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import Tensor

from .switch import KernelSwitch

try:  # Triton ships with CUDA builds of PyTorch only.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installed torch build
    triton = None

__all__ = ["active", "begin", "inductor_enabled", "set_enabled", "set_inductor", "supported", "use_by_default"]

logger = logging.getLogger(__name__)
_switch = KernelSwitch()
_HAS_GDC = False
_inductor_chosen = False  # set_inductor was called: use_by_default leaves Inductor alone

if triton is not None:
    try:  # Triton >= 3.3
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
        _HAS_GDC = True
    except ImportError:  # pragma: no cover - older Triton: never launched with PDL
        @triton.jit
        def gdc_wait():  # type: ignore[no-redef]
            pass

        @triton.jit
        def gdc_launch_dependents():  # type: ignore[no-redef]
            pass

    @triton.jit
    def begin(PDL: tl.constexpr):
        """A kernel's first step when launched with the attribute (``PDL``): wait for the
        previous kernel, then let the next one be placed."""
        if PDL:
            gdc_wait()
            gdc_launch_dependents()

else:
    gdc_wait = gdc_launch_dependents = begin = None  # type: ignore[assignment]


@functools.cache
def supported(index: int = 0) -> bool:
    """Whether PDL can be used on CUDA device ``index``."""
    if not _HAS_GDC or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(index)[0] >= 9


def set_enabled(on: bool) -> bool:
    """Launch this package's kernels with PDL (where :func:`supported`); returns the old
    value. Read at each launch, so a CUDA graph keeps what it recorded."""
    return _switch.set(on)


def active(x: Tensor) -> bool:
    """Whether a launch for ``x`` (its device) takes PDL: switched on, on a Hopper GPU."""
    return _switch.on and x.is_cuda and supported(x.device.index or 0)


def set_inductor(on: bool) -> bool:
    """Inductor's PDL for the kernels it generates from now on, each waiting before its
    first access (see the module docstring); returns the old value. False where this
    torch has no such switch or its code generator is not the one patched here."""
    global _inductor_chosen
    _inductor_chosen = True
    return _set_inductor(on)


def use_by_default() -> None:
    """Inductor's PDL on for a supported GPU, unless :func:`set_inductor` chose already."""
    if not _inductor_chosen and supported():
        _set_inductor(True)
        logger.info("programmatic dependent launch (Hopper GPU): this package's Triton kernels %s, "
                    "Inductor's %s", "on" if _switch.on else "off", "on" if inductor_enabled() else "off")


def inductor_enabled() -> bool:
    """Whether regions compiled from now on get Inductor's PDL."""
    import torch._inductor.config as inductor_config

    return bool(getattr(inductor_config.triton, "enable_pdl", False))


def _set_inductor(on: bool) -> bool:
    import torch._inductor.config as inductor_config  # heavy: only where regions compile

    if not hasattr(inductor_config.triton, "enable_pdl"):
        return False
    old = bool(inductor_config.triton.enable_pdl)
    if on and not _wait_first_access():
        return old
    inductor_config.triton.enable_pdl = bool(on)
    return old


@functools.cache
def _wait_first_access() -> bool:
    """Make Inductor's ``_handle_pdl_before_access`` wait unconditionally (it skips the wait
    when the previous kernel of the region did not write what is read)."""
    from torch._inductor.codegen.triton import TritonKernel

    original = getattr(TritonKernel, "_handle_pdl_before_access", None)
    if original is None or not hasattr(TritonKernel, "GDC_WAIT"):
        return False

    def before_access(self, wait_buffer, *dependencies, consider_reads=False):  # noqa: ANN001, ANN202
        if not self._enable_pdl_codegen():
            return
        if self.inside_reduction and self.range_trees[-1].is_loop:
            wait_buffer = self.body  # hoisted before the loop, as Inductor does
        wait_buffer.writeline(self.GDC_WAIT)

    TritonKernel._handle_pdl_before_access = before_access
    return True
