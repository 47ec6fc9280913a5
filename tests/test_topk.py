"""The ``k`` best of each row in one Triton program (``voxline.kernels.topk``).

- on the CPU: ``topk_rows`` is ``torch.topk`` (and the kernel is never offered);
- on CUDA (skipped without it): values and indices equal ``torch.topk``'s at the code
  predictor's shape and others, equal values ranked lower index first, rows of -inf,
  negative zero, under CUDA-graph replay; and ``sample_rows`` picks the same ids with the
  kernel on and off.
"""

from __future__ import annotations

import pytest
import torch

from voxline.kernels import topk as tk
from voxline.kernels.sampling import sample_rows

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_the_cpu_uses_torch_topk():
    x = torch.randn(3, 2048, generator=torch.Generator().manual_seed(0))
    assert not tk.topk_available(x, 64)
    values, indices = tk.topk_rows(x, 64)
    ref = x.topk(64, dim=-1)
    assert torch.equal(values, ref.values) and torch.equal(indices, ref.indices)


@pytest.mark.parametrize(("n", "k", "ok"), [(2048, 64, True), (2048, 2048, True), (3072, 64, False),
                                            (2048, 50, False), (16384, 64, False)])
def test_only_powers_of_two_are_offered(n, k, ok):
    x = torch.empty(2, n, device="cuda" if torch.cuda.is_available() else "meta")
    assert tk.topk_available(x, k) == (ok and x.is_cuda)


@cuda
@pytest.mark.parametrize(("b", "n", "k"), [(1, 2048, 64), (16, 2048, 64), (65, 2048, 64), (4, 1024, 32),
                                            (2, 4096, 128), (3, 64, 64), (5, 8192, 16)])
def test_equals_torch_topk(b, n, k):
    g = torch.Generator(device="cuda").manual_seed(b * n + k)
    x = torch.randn(b, n, device="cuda", generator=g) * 4
    assert tk.topk_available(x, k)
    values, indices = tk.topk_rows(x, k)
    ref = x.topk(k, dim=-1)
    assert torch.equal(values, ref.values) and torch.equal(indices, ref.indices)


@cuda
def test_ties_rank_lower_index_first_and_infinities_sort_last():
    x = torch.tensor([[1.0, -2.0, 1.0, -1e30, float("-inf"), 0.5, 1.0, -0.5]], device="cuda")
    values, indices = tk.topk_rows(x, 4)
    assert values.tolist() == [[1.0, 1.0, 1.0, 0.5]] and indices.tolist() == [[0, 2, 6, 5]]
    x = torch.full((2, 8), float("-inf"), device="cuda")
    x[0, 3] = -5.0
    values, indices = tk.topk_rows(x, 2)
    assert values[0, 0].item() == -5.0 and indices[0, 0].item() == 3 and torch.isinf(values[1]).all()
    assert sorted(indices[1].tolist()) == indices[1].tolist()  # lower index first among equals


@cuda
def test_graph_replay_ranks_new_inputs():
    x = torch.randn(8, 2048, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tk.topk_rows(x, 64)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        values, indices = tk.topk_rows(x, 64)
    for seed in range(3):
        x.copy_(torch.randn(8, 2048, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)))
        graph.replay()
        ref = x.topk(64, dim=-1)
        assert torch.equal(values, ref.values) and torch.equal(indices, ref.indices)


@cuda
def test_sample_rows_picks_the_same_with_the_kernel_on_and_off():
    g = torch.Generator(device="cuda").manual_seed(7)
    b = 32
    logits = torch.randn(b, 2048, device="cuda", generator=g) * 3
    temperature = torch.where(torch.arange(b, device="cuda") % 4 == 0, 0.0, 0.9)
    top_k = torch.full((b,), 50, device="cuda")
    top_p = torch.where(torch.arange(b, device="cuda") % 3 == 0, 0.8, 1.0)
    seed = torch.arange(b, device="cuda") * 7919
    counter = torch.arange(b, device="cuda")
    on = sample_rows(logits, temperature, top_k, top_p, seed, counter, max_top_k=64)
    old = tk.set_enabled(False)
    try:
        off = sample_rows(logits, temperature, top_k, top_p, seed, counter, max_top_k=64)
    finally:
        tk.set_enabled(old)
    full = sample_rows(logits, temperature, top_k, top_p, seed, counter)
    assert torch.equal(on, off) and torch.equal(on, full)
