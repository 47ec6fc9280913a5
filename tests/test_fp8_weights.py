"""Float8 (e4m3) weights with a scale per output row for the decode-row projections
(``voxline.kernels.gemv.quantize_fp8``, ``small_linear(..., scale)``,
``fused_linear.linear_residual(..., scale)``).

- on the CPU: the quantisation's error bound per element, the round trip, and
  ``small_linear``'s fallback (a linear over the dequantised weight);
- on CUDA (skipped without it): both kernels against a float64 product of the dequantised
  weight, at the predictor's and the talker's shapes, with and without a bias; a graph
  replay equal to eager calls.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from voxline.kernels import fused_linear as fl
from voxline.kernels import gemv

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_quantisation_keeps_each_weight_within_half_an_e4m3_step():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 256, generator=g) * torch.logspace(-3, 1, 96)[:, None]  # rows of very different size
    w8, scale = gemv.quantize_fp8(w)
    assert w8.dtype == gemv.FP8 and w8.shape == w.shape and scale.shape == (96,) and scale.dtype == torch.float32
    assert torch.allclose(w8.float().abs().amax(dim=-1), torch.full((96,), gemv.FP8_MAX))  # each row's range used
    back = gemv.dequantize(w8, scale, torch.float32)
    normal = w.abs() >= scale[:, None] * 2.0 ** -6  # e4m3's normal range, 3 mantissa bits
    err = (back - w).abs()
    assert (err[normal] <= w.abs()[normal] * 2.0 ** -4 + 1e-12).all()
    assert (err[~normal] <= scale[:, None].expand_as(w)[~normal] * 2.0 ** -10 + 1e-12).all()  # subnormal step
    assert gemv.dequantize(w, None, torch.float32) is w


def test_a_zero_row_quantises_to_zeros():
    w8, scale = gemv.quantize_fp8(torch.zeros(2, 128))
    assert torch.isfinite(scale).all() and not w8.float().any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_cpu_fallback_is_a_linear_over_the_dequantised_weight(dtype, bias):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 1, 256, generator=g).to(dtype)
    w8, scale = gemv.quantize_fp8(torch.randn(64, 256, generator=g) * 0.05)
    b = torch.randn(64, generator=g).to(dtype) if bias else None
    got = gemv.small_linear(x, w8, b, scale)
    want = F.linear(x, (w8.float() * scale[:, None]).to(dtype), b)
    assert got.shape == (3, 1, 64) and got.dtype == dtype and torch.equal(got, want)
    exact = F.linear(x.double(), w8.double() * scale.double()[:, None], None if b is None else b.double())
    assert _rel(got, exact) <= (1e-6 if dtype == torch.float32 else 1e-2)


# (rows, K, N): predictor QKV / gate-up / down, talker QKV / down, a ragged N.
SHAPES = [(1, 1024, 4096), (16, 1024, 6144), (4, 3072, 1024), (1, 2048, 4096), (3, 6144, 2048), (2, 256, 100)]


@cuda
@pytest.mark.parametrize(("rows", "k", "n"), SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_kernels_equal_the_dequantised_product(rows, k, n, bias):
    g = torch.Generator(device="cuda").manual_seed(rows * 31 + k)
    x = torch.randn(rows, k, device="cuda", generator=g).bfloat16()
    w8, scale = gemv.quantize_fp8(torch.randn(n, k, device="cuda", generator=g) * k ** -0.5)
    b = (torch.randn(n, device="cuda", generator=g) * 0.1).bfloat16() if bias else None
    assert gemv.gemv_available(x, w8)
    exact = F.linear(x.double(), gemv.dequantize(w8, scale, torch.float64),
                     None if b is None else b.double())
    got = gemv.small_linear(x, w8, b, scale)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
    assert _rel(got, exact) <= 4e-3  # one bf16 rounding of the float32 sum
    r = torch.randn(rows, n, device="cuda", generator=g).bfloat16()
    if fl.fused_available(x, w8, r):
        fused = fl.linear_residual(x, w8, b, r, scale)
        assert _rel(fused, r.double() + exact) <= 4e-3
        assert torch.equal(fl.linear_residual(x, w8, b, r, scale), fused)


@cuda
def test_fp8_graph_replays_equal_eager_calls():
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(2, 1024, device="cuda", generator=g).bfloat16()
    w8, scale = gemv.quantize_fp8(torch.randn(3072, 1024, device="cuda", generator=g) * 0.03)
    r = torch.zeros(2, 3072, device="cuda", dtype=torch.bfloat16)

    def step():
        return gemv.small_linear(x, w8, None, scale), fl.linear_residual(x, w8, None, r, scale)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        a_g, b_g = step()
    for seed in range(2):
        x.copy_(torch.randn(2, 1024, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)))
        graph.replay()
        a, b = step()
        assert torch.equal(a_g, a) and torch.equal(b_g, b)


# --------------------------------------------------------------------------- the speech stage


def _dequantise_layers(talker) -> None:
    """Every talker and code-predictor layer's projections replaced by their float8 round
    trip (per output row, as ``layer_args`` quantises them: concatenating rows keeps each
    row's scale)."""
    for layers in (talker.model.layers, talker.code_predictor.model.layers):
        for layer in layers:
            a, mlp = layer.self_attn, layer.mlp
            for lin in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
                w8, scale = gemv.quantize_fp8(lin.weight)
                lin.weight.data.copy_(gemv.dequantize(w8, scale, lin.weight.dtype))


def test_fp8_stage_speaks_as_the_model_with_those_weights(tmp_path):
    """The graphed stage reading float8 weights (its CPU twin) gives the audio of the same
    stage on a model whose weights are the float8 values: the scales and every projection's
    use of them are right. The plain generator refuses the setting."""
    from test_qwen3_tts_graphs import _assert_same, _by_job, _jobs
    from test_qwen3_tts_stage import make_stage, run, write_test_checkpoint

    from voxline.engines.models.qwen3_tts.talker_steps import layer_args

    model_dir = write_test_checkpoint(tmp_path / "model")
    fp8 = make_stage(model_dir, graphs=True, weights="fp8")
    prep, post = fp8.generator._talker_w[0]
    assert prep[2].dtype == gemv.FP8 and prep[-1].dtype == torch.float32
    assert [w.dtype for w in (post[0], post[4], post[6])] == [gemv.FP8] * 3
    assert all(s is not None for s in post[-3:])
    twin = make_stage(model_dir, graphs=True)
    _dequantise_layers(twin.model.talker)
    twin.generator = type(twin.generator)(twin.model.talker, max_streams=4, max_len=256)  # re-reads the weights
    _assert_same(_by_job(run(fp8, _jobs(seed=3))), _by_job(run(twin, _jobs(seed=3))))
    with pytest.raises(ValueError, match="weights='fp8' needs graphs=True"):
        make_stage(model_dir, graphs=False, weights="fp8")
    with pytest.raises(ValueError, match="weights must be one of"):
        layer_args(fp8.model.talker.model.layers[0], "int4")
