"""Int8 weights for CPU decoding: ``Int8Linear`` and :func:`quantize_linears`.

Decoding a small LLM on a CPU is memory-bound: every token reads every weight once, so a
float32 SmolLM2-135M step moves ~540 MB. Keeping an int8 copy of each weight (one scale
per output channel) lets a decode step read a quarter of that. The multiply is aten's
weight-only int8 GEMM (``_weight_int8pack_mm``): activations go in as bfloat16 and are
not quantized, so outliers in the activations cost nothing. Dynamic int8 activations
(fbgemm's ``linear_dynamic``) were tried first and dropped: on SmolLM2 their next-token
choice agreed with float32 on only 51 % of positions (KL 1.3); weight-only int8 agrees
on 98 % (KL 0.005).

Steps with many rows (a prefill) keep the float32 weights: there the int8 kernel is
slower than float32 GEMM, and prefill is compute-bound anyway. Measured on this 2-core
AMD EPYC (1 thread, SmolLM2-135M, `benchmarks/bench_llm_runtimes.py`): one decoded token
116 -> 63 ms at batch 1, 213 -> 129 ms at batch 8; prefill unchanged.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["INT8_MAX_ROWS", "Int8Linear", "quantize_linears"]

# Rows (batch x new tokens) up to which a step reads the int8 weights; above, float32.
INT8_MAX_ROWS = 8


class Int8Linear(nn.Module):
    """A frozen ``nn.Linear`` that decodes from int8 per-channel weights (CPU, inference).

    Float32 in, float32 out. The float32 weights are kept for large steps (prefill).
    """

    def __init__(self, linear: nn.Linear, max_rows: int = INT8_MAX_ROWS) -> None:
        super().__init__()
        weight = linear.weight.detach().to(torch.float32)
        if weight.device.type != "cpu":
            raise ValueError(f"Int8Linear is a CPU kernel; the weight is on {weight.device}")
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.max_rows = max_rows
        scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
        self.register_buffer("weight", weight, persistent=False)  # shared, not copied
        self.register_buffer("qweight", torch.round(weight / scales[:, None]).to(torch.int8),
                             persistent=False)
        self.register_buffer("scales", scales.to(torch.bfloat16), persistent=False)
        bias = None if linear.bias is None else linear.bias.detach().to(torch.float32).clone()
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] > self.max_rows:
            out = torch.nn.functional.linear(flat.to(torch.float32), self.weight, self.bias)
        else:
            xb = flat.to(torch.bfloat16).contiguous()
            out = torch._weight_int8pack_mm(xb, self.qweight, self.scales).to(torch.float32)
            if self.bias is not None:
                out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"int8 up to {self.max_rows} rows")


def quantize_linears(module: nn.Module) -> int:
    """Replace every ``nn.Linear`` under ``module`` by an :class:`Int8Linear`, in place.

    Returns how many were replaced. A float32 weight shared with another module (a tied
    LM head) stays shared; only its int8 copy is new.
    """
    replaced = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8Linear(child))
            replaced += 1
        else:
            replaced += quantize_linears(child)
    return replaced
