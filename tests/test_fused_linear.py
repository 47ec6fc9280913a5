"""A projection that adds its own partials and the residual (``voxline.kernels.fused_linear``).

- on the CPU: nothing takes the fused path (``attn_out_mlp`` is its unfused self, and
  ``fused_available`` refuses);
- on CUDA (skipped without it): against the unfused add and a float64 reference at the
  code predictor's and the talker's shapes, row counts up to its one row block (more
  take the unfused path), with and without a bias; the ticket counters back at zero after each launch; the same
  bits run after run (the split sums add in slice order, whichever program finishes
  last); CUDA-graph replay equal to eager calls; a whole ``attn_out_mlp`` fused against
  unfused, and compiled against eager.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from voxline.kernels import fused_linear as fl
from voxline.kernels.decoder_step import attn_out_mlp
from voxline.kernels.layer_ops import rms_norm, silu_mul

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _rand(g: torch.Generator, *shape: int, s: float = 1.0, dtype=torch.bfloat16, device="cpu") -> torch.Tensor:
    return (torch.randn(*shape, generator=g, device=device) * s).to(dtype)


def _mlp_weights(g, hidden: int, heads_dim: int, inner: int, *, bias: bool, dtype, device):
    """attn_out_mlp's weight arguments (o, norm, gate/up, down) for random weights."""
    return (_rand(g, hidden, heads_dim, s=heads_dim ** -0.5, dtype=dtype, device=device),
            _rand(g, hidden, s=0.1, dtype=dtype, device=device) if bias else None,
            1.0 + _rand(g, hidden, s=0.1, dtype=dtype, device=device), 1e-6,
            _rand(g, 2 * inner, hidden, s=hidden ** -0.5, dtype=dtype, device=device),
            _rand(g, 2 * inner, s=0.1, dtype=dtype, device=device) if bias else None,
            _rand(g, hidden, inner, s=inner ** -0.5, dtype=dtype, device=device), None)


def test_the_cpu_takes_the_unfused_path():
    g = torch.Generator().manual_seed(0)
    x = _rand(g, 2, 1, 256, dtype=torch.float32)
    out = _rand(g, 2, 4, 1, 64, dtype=torch.float32)
    w = _mlp_weights(g, 256, 256, 384, bias=True, dtype=torch.float32, device="cpu")
    o_in = out.transpose(1, 2).reshape(2, 1, -1)
    assert not fl.fused_available(o_in, w[0], x)
    o_w, o_b, ln_w, eps, gu_w, gu_b, down_w, _ = w
    mid = x + F.linear(o_in, o_w, o_b)
    gate, up = F.linear(rms_norm(mid, ln_w, eps), gu_w, gu_b).chunk(2, dim=-1)
    expected = mid + F.linear(silu_mul(gate, up), down_w)
    assert torch.equal(attn_out_mlp(x, out, *w), expected)


def test_counters_are_kept_and_grow_for_a_reused_address():
    w = torch.zeros(1024, 64)
    c = fl._counter(w)
    assert c.numel() == 1024 // fl.gemv.BLOCK_N and not c.any() and fl._counter(w) is c
    key = (str(w.device), w.data_ptr())
    fl._counters[key] = small = torch.zeros(1, dtype=torch.int32)  # a smaller weight's, at this address
    grown = fl._counter(w)
    assert grown.numel() == 1024 // fl.gemv.BLOCK_N and any(t is small for t in fl._retired)  # kept alive
    del fl._counters[key]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# (rows, K, N): the predictor's o (2048 -> 1024) and down (3072 -> 1024), the talker's
# (2048 -> 2048, 6144 -> 2048), and row counts up to the kernel's one row block (16).
SHAPES = [(1, 2048, 1024), (4, 3072, 1024), (16, 1024, 1024), (16, 2048, 2048), (3, 6144, 2048)]


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("rows", "k", "n"), SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_linear_residual_matches_the_unfused_add(dtype, rows, k, n, bias):
    g = torch.Generator(device="cuda").manual_seed(rows * 7 + k)
    x = _rand(g, rows, k, dtype=dtype, device="cuda")
    r = _rand(g, rows, n, dtype=dtype, device="cuda")
    w = _rand(g, n, k, s=k ** -0.5, dtype=dtype, device="cuda")
    b = _rand(g, n, s=0.1, dtype=dtype, device="cuda") if bias else None
    assert fl.fused_available(x, w, r)
    out = fl.linear_residual(x, w, b, r)
    unfused = r + F.linear(x, w, b)
    exact = r.double() + F.linear(x.double(), w.double(), None if b is None else b.double())
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-3
    assert out.dtype == dtype and out.shape == r.shape
    assert _rel(out, exact) <= max(tol / 4, 1.5 * _rel(unfused, exact))
    assert _rel(out, unfused) <= tol
    assert torch.equal(fl.linear_residual(x, w, b, r), out)  # same bits, whoever finishes last
    assert int(fl._counter(w).abs().sum()) == 0


@cuda
def test_more_rows_than_one_block_take_the_unfused_path():
    x = torch.zeros(fl.MAX_ROWS + 1, 1024, dtype=torch.bfloat16, device="cuda")
    w = torch.zeros(1024, 1024, dtype=torch.bfloat16, device="cuda")
    assert fl.fused_available(x[:-1], w, x[:-1]) and not fl.fused_available(x, w, x)
    with pytest.raises(ValueError, match="at most 16 rows"):
        torch.ops.voxline.gemv_residual(x, w, None, x, 2)


@cuda
def test_graph_replays_equal_eager_calls():
    g = torch.Generator(device="cuda").manual_seed(5)
    x = _rand(g, 2, 2048, device="cuda")
    r = _rand(g, 2, 1024, device="cuda")
    w = _rand(g, 1024, 2048, s=2048 ** -0.5, device="cuda")
    w2 = _rand(g, 1024, 1024, s=1024 ** -0.5, device="cuda")

    def step():
        mid = fl.linear_residual(x, w, None, r)
        return mid, fl.linear_residual(mid, w2, None, mid)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up: compiles the kernel and makes the counters
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mid_g, out_g = step()
    for seed in range(3):
        x.copy_(_rand(torch.Generator(device="cuda").manual_seed(seed), 2, 2048, device="cuda"))
        graph.replay()
        mid, out = step()
        assert torch.equal(mid_g, mid) and torch.equal(out_g, out)


@cuda
@pytest.mark.parametrize("rows", [1, 2, 16])
def test_attn_out_mlp_fused_is_close_to_unfused(rows):
    g = torch.Generator(device="cuda").manual_seed(rows)
    w = _mlp_weights(g, 1024, 2048, 3072, bias=False, dtype=torch.bfloat16, device="cuda")
    x = _rand(g, rows, 1, 1024, device="cuda")
    out = _rand(g, rows, 16, 1, 128, device="cuda")
    o_in = out.transpose(1, 2).reshape(rows, 1, -1)
    assert fl.fused_available(o_in, w[0], x)
    fused = attn_out_mlp(x, out, *w)
    old = fl.set_enabled(False)
    try:
        assert not fl.fused_available(o_in, w[0], x)
        unfused = attn_out_mlp(x, out, *w)
    finally:
        fl.set_enabled(old)
    assert fused.shape == unfused.shape == x.shape
    assert _rel(fused, unfused) <= 1e-2
    compiled = torch.compile(attn_out_mlp, dynamic=False)(x, out, *w)
    # The fused launches run as opaque ops inside the compiled region; the norm and SwiGLU
    # between them are compiled, so equal to eager within bf16 rounding.
    assert _rel(compiled, fused) <= 1e-2
