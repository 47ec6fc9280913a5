"""The kernels' shared on/off switch (``voxline.kernels.switch``): it returns the old
value, and a compiled region sees a flip (Dynamo guards on it), which is what the
benchmarks' A/B arms rely on."""

from __future__ import annotations

import torch

from voxline.kernels import fused_linear, gemv, qkv_attention, qkv_decode_attention, topk
from voxline.kernels.switch import KernelSwitch

SWITCH = KernelSwitch()


def _step(x: torch.Tensor) -> torch.Tensor:
    return x + 1 if SWITCH.on else x - 1


def test_set_returns_the_old_value():
    s = KernelSwitch()
    assert s.on and s.set(False) is True and not s.on and s.set(True) is False and s.on


def test_a_compiled_region_sees_a_flip():
    compiled = torch.compile(_step, backend="eager", dynamic=False)
    x = torch.zeros(3)
    try:
        assert torch.equal(compiled(x), x + 1)
        SWITCH.set(False)
        assert torch.equal(compiled(x), x - 1)
        SWITCH.set(True)
        assert torch.equal(compiled(x), x + 1)
    finally:
        SWITCH.set(True)


def test_every_kernel_module_has_its_own_switch():
    modules = (fused_linear, gemv, qkv_attention, qkv_decode_attention, topk)
    assert len({id(m._switch) for m in modules}) == len(modules)
    old = gemv.set_enabled(False)
    try:
        assert old is True and not gemv._switch.on and topk._switch.on
    finally:
        gemv.set_enabled(old)
