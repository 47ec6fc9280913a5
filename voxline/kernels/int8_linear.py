"""Int8 weights for CPU decoding: ``Int8Linear`` and :func:`quantize_linears`.

Decoding a small LLM on a CPU is memory-bound: every token reads every weight once, so a
float32 SmolLM2-135M step moves ~540 MB. Keeping an int8 copy of each weight (one scale
per output channel) lets a decode step read a quarter of that. The multiply is aten's
weight-only int8 GEMM (``_weight_int8pack_mm``): activations go in as bfloat16 and are
not quantized, so outliers in the activations cost nothing. Dynamic int8 activations
(fbgemm's ``linear_dynamic``) were tried first and dropped: on SmolLM2 their next-token
choice agreed with float32 on only 51 % of positions (KL 1.3); weight-only int8 agrees
on 98 % (KL 0.005).

How many rows a step may have and still read the int8 weights depends on the kernel
aten dispatches to (`int8_max_rows`); larger steps (a long prefill) read a float32 copy.
Measured with torch 2.13 on a 2-core AMD EPYC (1 thread; the 210 linears of a
SmolLM2-135M step, random weights), int8 vs float32 ms:

    rows                 1       9      16      32      64     128      512
    AVX-512 kernels   9/28   20/61   30/78  57/105 148/185 218/335 1005/1274
    AVX2 kernels     14/31   44/62   69/70 117/111 282/191 555/353        -
    (the AVX2 row: the same host under ATEN_CPU_CAPABILITY=avx2)

With AVX-512 int8 wins at every size, so every step reads it and no float32 copy is
kept: a 41-token prompt's prefill went 165 -> 109 ms and its first spoken clause
230 -> 158 ms (median of 10), a pause's 9-token prefill about 3x faster. Teacher-forced
over 126 tokens the next-token choice agrees with float32 on 94 % of positions (KL
0.0046), as decoding from int8 already did. With AVX2 the crossover is about 16 rows.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

__all__ = ["Int8Linear", "int8_max_rows", "quantize_linears"]

AVX2_MAX_ROWS = 16  # where aten's AVX2 int8 kernel stops beating float32 GEMM (above)


def int8_max_rows() -> int | None:
    """Rows up to which a step reads the int8 weights on this CPU (None: every step)."""
    return None if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else AVX2_MAX_ROWS


class Int8Linear(nn.Module):
    """A frozen ``nn.Linear`` that reads int8 per-channel weights (CPU, inference).

    Float32 in, float32 out. Steps of more than ``max_rows`` rows read a float32 copy of
    the weight, which is kept only when ``max_rows`` is set (default: `int8_max_rows`).
    """

    def __init__(self, linear: nn.Linear, max_rows: int | None | Literal["auto"] = "auto") -> None:
        super().__init__()
        weight = linear.weight.detach().to(torch.float32)
        if weight.device.type != "cpu":
            raise ValueError(f"Int8Linear is a CPU kernel; the weight is on {weight.device}")
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.max_rows = int8_max_rows() if max_rows == "auto" else max_rows
        scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
        if self.max_rows is not None:
            self.register_buffer("weight", weight, persistent=False)  # shared, not copied
        self.register_buffer("qweight", torch.round(weight / scales[:, None]).to(torch.int8),
                             persistent=False)
        self.register_buffer("scales", scales.to(torch.bfloat16), persistent=False)
        bias = None if linear.bias is None else linear.bias.detach().to(torch.float32).clone()
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features)
        if self.max_rows is not None and flat.shape[0] > self.max_rows:
            out = torch.nn.functional.linear(flat.to(torch.float32), self.weight, self.bias)
        else:
            xb = flat.to(torch.bfloat16).contiguous()
            out = torch._weight_int8pack_mm(xb, self.qweight, self.scales).to(torch.float32)
            if self.bias is not None:
                out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        rows = "every step" if self.max_rows is None else f"up to {self.max_rows} rows"
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 {rows}"


def quantize_linears(module: nn.Module) -> int:
    """Replace every ``nn.Linear`` under ``module`` by an :class:`Int8Linear`, in place.

    Returns how many were replaced. A float32 weight shared with another module (a tied
    LM head's embedding) stays where it is; only its int8 copy is new.
    """
    replaced = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8Linear(child))
            replaced += 1
        else:
            replaced += quantize_linears(child)
    return replaced
