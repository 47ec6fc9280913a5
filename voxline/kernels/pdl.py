"""Programmatic dependent launch (PDL) for this package's Triton kernels (Hopper and newer).

A captured decode step is a chain of ~1,000 kernels of a few microseconds each. Without
PDL each one starts only once the one before it has drained, and then waits out its own
launch and a DRAM round trip for its first weight bytes: at batch 1 a projection of the
code predictor reads 2-13 MB at 1-3 TB/s of the H200's ~4.8 (round 8's profile). With
PDL a kernel is launched with the programmatic-serialisation attribute, so its programs
may be placed while the previous kernel still runs. Each of our kernels then:

1. prefetches what does not depend on the previous kernel (a projection's weight tile,
   into L2: :func:`prefetch_l2`);
2. waits (``griddepcontrol.wait``, :func:`gdc_wait`) until the previous kernel has
   finished and its writes are visible, before it reads or writes anything else;
3. lets the next kernel be placed (``griddepcontrol.launch_dependents``) and computes.

Every kernel launched with the attribute waits before its first dependent access, so
ordering stays transitive along the chain: a kernel cannot finish before the one ahead
of it has, and the one after it waits for it. Kernels launched without the attribute
(Inductor's, cuBLAS, copies) keep the plain stream order on both sides.

Inductor can emit the same for its generated kernels (``torch._inductor.config.triton.
enable_pdl``). Its kernels wait only before loads of buffers the previous kernel in
their region wrote, so a kernel that reads a buffer written two kernels back, behind a
kernel that never waits (one without loads), could read it early. :func:`set_inductor`
therefore also makes every generated kernel wait before its first access; it reads the
config when a region compiles (callers that A/B it reset Dynamo).

Off by default (:func:`set_enabled`); :func:`active` says whether a launch on a
tensor's device takes it. Off CUDA, before Hopper or with a Triton without the
intrinsics, kernels launch as before.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from .switch import KernelSwitch

try:  # Triton ships with CUDA builds of PyTorch only.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installed torch build
    triton = None

__all__ = ["active", "gdc_launch_dependents", "gdc_wait", "prefetch_l2", "set_enabled", "set_inductor",
           "supported"]

_switch = KernelSwitch()
_switch.on = False
_HAS_GDC = False

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
    def prefetch_l2(ptrs):
        """Ask L2 for the 128-byte lines at ``ptrs`` (one address per line) without
        waiting for them: the kernel's later loads of those lines hit L2."""
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l",
                                  [ptrs.to(tl.int64)], dtype=tl.int32, is_pure=False, pack=1)
else:
    gdc_wait = gdc_launch_dependents = prefetch_l2 = None  # type: ignore[assignment]


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
    import torch._inductor.config as inductor_config  # heavy: only for the callers that A/B it

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
