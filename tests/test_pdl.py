"""Programmatic dependent launch of this package's kernels (``voxline.kernels.pdl``).

- on the CPU: a launch never takes PDL, whatever the switch says; the switch reports its
  old value; Inductor's PDL comes on by default only for a supported GPU and never over a
  caller's choice; the Inductor patch makes a generated kernel wait before every first access
  (one piece, on a stand-in kernel object), and adds nothing with Inductor's PDL off;
- on a Hopper GPU (skipped elsewhere): each kernel launched with PDL gives the bits it
  gives without (small-row projections, the fused residual projection, top-k), and a
  captured chain of dependent projections with PDL replays to the eager, PDL-off bits
  again and again (a missing wait would let a projection read its input early).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from voxline.kernels import fused_linear, gemv, pdl, topk

hopper = pytest.mark.skipif(not pdl.supported() if torch.cuda.is_available() else True,
                            reason="needs a CUDA GPU of compute capability 9 or newer")


@pytest.fixture
def pdl_off():
    old = pdl.set_enabled(False)
    yield
    pdl.set_enabled(old)


def test_a_cpu_launch_never_takes_pdl(pdl_off):
    x = torch.zeros(2, 128)
    assert pdl.set_enabled(True) is False
    assert not pdl.active(x)
    assert pdl.set_enabled(False) is True


def test_inductor_pdl_is_on_by_default_on_a_supported_gpu_unless_a_caller_chose(monkeypatch):
    import torch._inductor.config as inductor_config

    if not hasattr(inductor_config.triton, "enable_pdl"):
        pytest.skip("this torch has no Inductor PDL")
    monkeypatch.setattr(inductor_config.triton, "enable_pdl", False)
    monkeypatch.setattr(pdl, "_inductor_chosen", False)
    monkeypatch.setattr(pdl, "supported", lambda index=0: False)
    pdl.use_by_default()
    assert not inductor_config.triton.enable_pdl  # no Hopper GPU: nothing changes
    monkeypatch.setattr(pdl, "supported", lambda index=0: True)
    pdl.use_by_default()
    assert inductor_config.triton.enable_pdl
    pdl.set_inductor(False)  # a caller's choice (the benchmarks' arms) stands
    pdl.use_by_default()
    assert not inductor_config.triton.enable_pdl


class _Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def writeline(self, line: str) -> None:
        self.lines.append(line)


def _kernel(pdl_on: bool) -> SimpleNamespace:
    from torch._inductor.codegen.triton import TritonKernel

    return SimpleNamespace(_enable_pdl_codegen=lambda: pdl_on, inside_reduction=False, body=_Lines(),
                           GDC_WAIT=TritonKernel.GDC_WAIT)


def test_inductor_kernels_wait_before_every_first_access():
    pytest.importorskip("torch._inductor.codegen.triton")
    import torch._inductor.config as inductor_config
    from torch._inductor.codegen.triton import TritonKernel

    if not hasattr(inductor_config.triton, "enable_pdl"):
        pytest.skip("this torch has no Inductor PDL")
    old = pdl.set_inductor(True)
    try:
        assert inductor_config.triton.enable_pdl
        # A load of a buffer the previous kernel did not write: Inductor alone would not wait.
        k, loads = _kernel(True), _Lines()
        TritonKernel._handle_pdl_before_access(k, loads, "buf_two_kernels_back")
        assert loads.lines == [TritonKernel.GDC_WAIT]
        k, loads = _kernel(False), _Lines()
        TritonKernel._handle_pdl_before_access(k, loads, "buf0")
        assert loads.lines == []
    finally:
        pdl.set_inductor(old)
    assert bool(inductor_config.triton.enable_pdl) == old


def _rand(g: torch.Generator, *shape: int, s: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=g, device="cuda") * s).to(torch.bfloat16)


def _both(fn):
    """``fn()`` with PDL off, then on."""
    pdl.set_enabled(False)
    a = fn()
    pdl.set_enabled(True)
    try:
        return a, fn()
    finally:
        pdl.set_enabled(False)


@hopper
@pytest.mark.parametrize("rows", [1, 4, 16, 32])
@pytest.mark.parametrize("n,k", [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (2048, 6144)])
def test_projections_with_pdl_give_the_same_bits(pdl_off, rows, n, k):
    g = torch.Generator(device="cuda").manual_seed(rows * n + k)
    x, w = _rand(g, rows, k), _rand(g, n, k, s=k ** -0.5)
    a, b = _both(lambda: gemv.small_linear(x, w))
    assert torch.equal(a, b)
    if rows <= fused_linear.MAX_ROWS:
        r = _rand(g, rows, n)
        a, b = _both(lambda: fused_linear.linear_residual(x, w, None, r))
        assert torch.equal(a, b)


@hopper
@pytest.mark.parametrize("rows", [1, 32])
def test_topk_with_pdl_gives_the_same_ranking(pdl_off, rows):
    g = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, 2048, generator=g, device="cuda")
    (va, ia), (vb, ib) = _both(lambda: topk.topk_rows(x, 64))
    assert torch.equal(va, vb) and torch.equal(ia, ib)


@hopper
def test_a_captured_chain_with_pdl_replays_to_the_eager_bits(pdl_off):
    g = torch.Generator(device="cuda").manual_seed(7)
    ws = [_rand(g, 1024, 1024, s=0.5 / 32) for _ in range(16)]
    x = _rand(g, 1, 1024)

    def chain() -> torch.Tensor:
        h = x
        for w in ws:  # back to back, each reading the output of the one before it
            h = fused_linear.linear_residual(h, w, None, h)
        return gemv.small_linear(h, ws[0])

    expected = chain()
    pdl.set_enabled(True)
    chain()  # warm-up: compiles the PDL variants outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain()
    for _ in range(20):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)


@hopper
def test_a_pdl_projection_reads_nothing_before_the_wait():
    g = torch.Generator(device="cuda").manual_seed(3)
    x, w = _rand(g, 1, 1024), _rand(g, 2048, 1024)
    out = torch.empty(1, 1, 2048, dtype=torch.float32, device="cuda")
    kernel = gemv._gemv_kernel[(2048 // gemv.BLOCK_N, 1, 1)](
        x, w, out, 1, 2048, x.stride(0), w.stride(0), K_SPLIT=1024, BLOCK_M=gemv.BLOCK_M, BLOCK_N=gemv.BLOCK_N,
        BLOCK_K=gemv.BLOCK_K, PDL=True, num_warps=4, num_stages=3, launch_pdl=True)
    ptx = kernel.asm["ptx"]
    wait, launch = ptx.find("griddepcontrol.wait"), ptx.find("griddepcontrol.launch_dependents")
    reads = [i for i in (ptx.find("ld.global"), ptx.find("cp.async")) if i >= 0]
    assert 0 <= wait < launch and reads and wait < min(reads)
    torch.testing.assert_close(out[0], (x.float() @ w.float().T), rtol=2e-2, atol=2e-2)
