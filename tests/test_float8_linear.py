"""Float8 linear layers (`voxline.kernels.float8_linear`, `video_weights=fp8`) on the CPU:
the rounding bound of the per-row quantisation, `torch._scaled_mm` (the GPU path's call,
which this torch also runs on the CPU) against the eager twin, the error against the bf16
layer, which layers are replaced, and the refusals naming the setting."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from voxline.kernels.float8_linear import (  # noqa: E402
    E4M3_MAX,
    Float8Linear,
    dequantized,
    float8_refusal,
    quantize_rows,
    to_float8,
)


def test_quantize_rows_rounds_each_element_within_e4m3s_half_step():
    torch.manual_seed(1)
    x = torch.randn(64, 256) * torch.logspace(-3, 2, 64).unsqueeze(1)  # rows of every scale
    x[3] = 0.0
    q, scale = quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (64, 1)
    back = q.float() * scale
    # 3 mantissa bits: half a step is 2^-4 of the value; below the normal range (2^-6) the
    # step is 2^-9, so half of it times the row's scale bounds the tiny values
    bound = x.abs() * 2**-4 + scale * 2**-10 + 1e-30
    assert torch.all((back - x).abs() <= bound)
    assert torch.all(back[3] == 0)
    assert torch.allclose(q.float().abs().amax(dim=1)[scale.squeeze(1) > 1e-9],
                          torch.tensor(E4M3_MAX))  # each row's largest value maps to 448


def test_scaled_mm_agrees_with_the_eager_twin_and_stays_near_bf16():
    torch.manual_seed(2)
    linear = torch.nn.Linear(256, 128, bias=True).to(torch.bfloat16)
    layer = Float8Linear(linear)
    x = torch.randn(3, 7, 256, dtype=torch.bfloat16)
    rows = x.reshape(-1, 256)
    q, scale = quantize_rows(rows)
    fast = torch._scaled_mm(q, layer.weight_fp8.t(), scale_a=scale, scale_b=layer.weight_scale,
                            out_dtype=torch.float32)
    twin = dequantized(q, scale, layer.weight_fp8, layer.weight_scale)
    assert torch.allclose(fast, twin, rtol=1e-5, atol=1e-5)
    out = layer(x)
    assert out.shape == (3, 7, 128) and out.dtype == torch.bfloat16
    want = linear(x).float()
    err = (out.float() - want).norm() / want.norm()
    assert 0 < err < 0.08  # lossy, but within float8's rounding of both operands


def test_to_float8_replaces_only_linears_whose_sizes_fit_the_product():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.Linear(48, 10)))
    model.to(torch.bfloat16)
    x = torch.randn(5, 32, dtype=torch.bfloat16)
    want = model(x).float()
    assert to_float8(model) == 2
    assert isinstance(model[0], Float8Linear) and isinstance(model[2][0], Float8Linear)
    assert isinstance(model[2][1], torch.nn.Linear)  # 10 outputs: not a multiple of 16
    got = model(x).float()
    assert (got - want).norm() / want.norm() < 0.1


def test_float8_is_refused_off_cuda_naming_the_setting():
    from voxline.engines.models.helios import set_video_weights

    assert "CUDA GPU" in float8_refusal("cpu")
    block = torch.nn.Module()
    block.blocks = torch.nn.Sequential(torch.nn.Linear(32, 32))
    assert set_video_weights(block, "bf16") == 0
    with pytest.raises(ValueError, match="video_weights=fp8: float8 weights need a CUDA GPU"):
        set_video_weights(block, "fp8")
    with pytest.raises(ValueError, match="video_weights='int4' is not one of bf16, fp8"):
        set_video_weights(block, "int4")
