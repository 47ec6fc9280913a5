"""Float8 linear layers: e4m3 weights with a scale per output row, activations quantised
per row on the fly, one `torch._scaled_mm` per call (Hopper's and Ada's float8 tensor cores).

A lossy speed-up, off unless asked for (`video_weights=fp8`): a weight row `w` is stored as
`q(w / s_w) * s_w` with `s_w = amax(|w|) / 448`, and each activation row likewise, so the
product is that of the two rounded matrices, accumulated in float32 and rounded once to the
layer's dtype. The eager twin (`dequantized`) computes the same product from the same
float8 values in float32; on CPU the layer runs it, and a test checks that the two agree.
The weights take half the memory of bf16 ones (the bf16 copy is dropped).
"""

from __future__ import annotations

import torch
from torch import nn

E4M3_MAX = 448.0  # the largest finite float8 e4m3fn value
MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (8.9) and Hopper (9.0) on


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` (rows, k) as float8 e4m3 rows and a float32 scale per row, (rows, 1): the row's
    largest magnitude maps to 448 (an all-zero row keeps scale 1e-12 / 448, and zeros)."""
    amax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
    scale = amax / E4M3_MAX
    q = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def float8_refusal(device: torch.device | str) -> str | None:
    """Why float8 layers cannot run on `device` (None: they can)."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"float8 weights need a CUDA GPU (the model is on {device.type})"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < MIN_CAPABILITY:
        return (f"float8 weights need compute capability 8.9 or newer; "
                f"{torch.cuda.get_device_name(device)} is {major}.{minor}")
    return None


class Float8Linear(nn.Module):
    """`nn.Linear`'s product with float8 weights and activations (see the module docstring)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach()
        q, scale = quantize_rows(weight)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.out_dtype = weight.dtype
        self.register_buffer("weight_fp8", q)  # (out, in), row-major: its .t() is column-major
        self.register_buffer("weight_scale", scale.t().contiguous())  # (1, out)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(),
                                                                 requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        q, scale = quantize_rows(rows)
        if rows.is_cuda:
            out = torch._scaled_mm(q, self.weight_fp8.t(), scale_a=scale,
                                   scale_b=self.weight_scale, out_dtype=self.out_dtype)
        else:
            out = dequantized(q, scale, self.weight_fp8, self.weight_scale).to(self.out_dtype)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, float8 e4m3"


def dequantized(q: torch.Tensor, scale: torch.Tensor, weight_fp8: torch.Tensor,
                weight_scale: torch.Tensor) -> torch.Tensor:
    """The eager twin: the float8 product in float32 from the stored values and scales."""
    return (q.float() * scale) @ (weight_fp8.float() * weight_scale.t()).t()


def to_float8(module: nn.Module, *, multiple: int = 16) -> int:
    """Replace every `nn.Linear` under `module` whose sizes are multiples of `multiple`
    (the float8 product's shape rule) by a `Float8Linear`; how many were replaced."""
    swapped = 0
    for name, child in list(module.named_children()):
        if (isinstance(child, nn.Linear) and child.in_features % multiple == 0
                and child.out_features % multiple == 0):
            setattr(module, name, Float8Linear(child))
            swapped += 1
        else:
            swapped += to_float8(child, multiple=multiple)
    return swapped
