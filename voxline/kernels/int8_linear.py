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

That AVX-512 kernel converts its activations to bfloat16, which costs little on a CPU that
multiplies bfloat16 natively (AVX-512 BF16 or AMX, as on that EPYC) and a lot on one that
does not: on a 2-core Intel Xeon with AVX-512 VNNI but no BF16 it was slower than float32
in the same step (`benchmarks/cpu_latency/bench_int8_kernels.py`). There, steps of several
tokens (a prefill) take the *dynamic* path instead (``dynamic_prefill``): each token's
activations are quantized to int8 with their own scale and multiplied int8 by int8
(aten's ``_int_mm``, VNNI), int32 sums scaled back to float32. Each row still depends only
on itself. Single-token decode steps stay weight-only: quantizing their activations too
costs the next-token choice more (greedy replies kept their float32 tokens for 10.9 of 30
on average, against 15.2 weight-only and 14.0 with dynamic prefill only).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

__all__ = ["Int8Linear", "dynamic_prefill_default", "int8_max_rows", "native_bfloat16",
           "quantize_linears"]

AVX2_MAX_ROWS = 16  # where aten's AVX2 int8 kernel stops beating float32 GEMM (above)


def int8_max_rows() -> int | None:
    """Rows up to which a step reads the int8 weights on this CPU (None: every step)."""
    return None if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else AVX2_MAX_ROWS


def native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX tiles)."""
    cpu = torch.cpu
    return bool(getattr(cpu, "_is_avx512_bf16_supported", lambda: False)()
                or getattr(cpu, "_is_amx_tile_supported", lambda: False)())


def dynamic_prefill_default() -> bool:
    """Whether multi-token steps should quantize their activations on this CPU: AVX-512
    kernels with no native bfloat16, where that was measured faster (above)."""
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512") and not native_bfloat16()


class Int8Linear(nn.Module):
    """A frozen ``nn.Linear`` that reads int8 per-channel weights (CPU, inference).

    Float32 in, float32 out. Steps of more than ``max_rows`` rows read a float32 copy of
    the weight, which is kept only when ``max_rows`` is set (default: `int8_max_rows`).
    With ``dynamic_prefill``, an input of several tokens per sequence (``[B, T, in]`` with
    T > 1, a prefill) quantizes its activations per token and multiplies int8 by int8.
    """

    def __init__(self, linear: nn.Linear, max_rows: int | None | Literal["auto"] = "auto", *,
                 dynamic_prefill: bool = False) -> None:
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
        # aten's CPU `_int_mm` gets a single-column product wrong (torch 2.13): no Llama
        # linear has one input feature, but such a layer keeps the weight-only path
        self.dynamic_prefill = dynamic_prefill and self.in_features > 1
        if dynamic_prefill:  # the dynamic path scales by the exact float32 steps
            self.register_buffer("scales32", scales, persistent=False)
        bias = None if linear.bias is None else linear.bias.detach().to(torch.float32).clone()
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.dynamic_prefill and x.dim() == 3 and x.shape[1] > 1:
            return self._dynamic(x)
        flat = x.reshape(-1, self.in_features)
        if self.max_rows is not None and flat.shape[0] > self.max_rows:
            out = torch.nn.functional.linear(flat.to(torch.float32), self.weight, self.bias)
        else:
            xb = flat.to(torch.bfloat16).contiguous()
            out = torch._weight_int8pack_mm(xb, self.qweight, self.scales).to(torch.float32)
            if self.bias is not None:
                out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def _dynamic(self, x: Tensor) -> Tensor:
        """int8 activations (one scale per token) x int8 weights, int32 sums."""
        flat = x.reshape(-1, self.in_features).to(torch.float32)
        step = flat.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0
        sums = torch._int_mm(torch.round(flat / step).to(torch.int8), self.qweight.t())
        out = sums.to(torch.float32) * step * self.scales32
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        rows = "every step" if self.max_rows is None else f"up to {self.max_rows} rows"
        dynamic = ", dynamic int8 prefill" if self.dynamic_prefill else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"int8 {rows}{dynamic}")


def quantize_linears(module: nn.Module, *, dynamic_prefill: bool = False) -> int:
    """Replace every ``nn.Linear`` under ``module`` by an :class:`Int8Linear`, in place.

    Returns how many were replaced. A float32 weight shared with another module (a tied
    LM head's embedding) stays where it is; only its int8 copy is new.
    """
    replaced = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8Linear(child, dynamic_prefill=dynamic_prefill))
            replaced += 1
        else:
            replaced += quantize_linears(child, dynamic_prefill=dynamic_prefill)
    return replaced
