"""A CPU check that a CUDA-graph step function could be captured: it never needs a value
on the host while it runs.

CI has no GPU, so the functions the engine captures run here as eager twins, where a host
read costs nothing and goes unnoticed; under capture it fails (or, worse, bakes one
step's value into every replay). `no_host_sync()` raises on the aten ops that read device
data on the host (`.item()`, `bool(tensor)`, `nonzero`, boolean-mask indexing and the
like) and on tensors built from Python data (a host-to-device copy on a GPU).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_READS = {"item", "_local_scalar_dense", "nonzero", "masked_select", "unique_consecutive", "_unique2",
          "unique_dim", "equal", "is_nonzero"}
_FROM_PYTHON = {torch.tensor, torch.as_tensor}


class _Reads(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in _READS:
            raise AssertionError(f"aten.{name}: reads a device value on the host")
        if name in ("index", "index_put", "index_put_") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool
                for i in (args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ())):
            raise AssertionError(f"aten.{name} with a boolean mask: its size needs a host read")
        return func(*args, **(kwargs or {}))


class _Builds(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _FROM_PYTHON:
            raise AssertionError(f"{func.__name__}(...): a tensor from Python data inside the step")
        return func(*args, **(kwargs or {}))


@contextmanager
def no_host_sync() -> Iterator[None]:
    with _Builds(), _Reads():
        yield
