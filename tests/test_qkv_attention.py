"""The one-kernel attention block of a decode layer (``voxline.kernels.qkv_attention``).

- on the CPU: the operator's reference (its CPU kernel) is the unfused layer step it
  replaces, ``attn_prep`` + the key/value write + ``attend``, over a predictor-like frame
  (two query positions, then one), split partials, a bias, q/k norms and a window; and
  nothing on the CPU path takes the fused kernel;
- on CUDA (skipped without it): the Triton kernel against that reference and a float32
  one (outputs and the buffer writes, untouched positions left alone), every shape
  condition the predictor meets, and the kernel's in-place writes under ``torch.compile``
  and CUDA-graph replay across sub-steps.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from voxline.kernels import qkv_attention as qa
from voxline.kernels.attention import attend, position_mask
from voxline.kernels.decoder_step import attn_prep

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _layer(hidden: int, hq: int, hkv: int, dim: int, *, bias: bool, norms: bool, device: str = "cpu",
           dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple:
    """attn_prep's weight arguments for random Q/K/V weights."""
    g = torch.Generator(device=device).manual_seed(seed)
    n = (hq + 2 * hkv) * dim

    def rand(*shape: int, s: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device=device, generator=g) * s).to(dtype)

    qn = 1.0 + rand(dim, s=0.1) if norms else None
    kn = 1.0 + rand(dim, s=0.1) if norms else None
    return (1.0 + rand(hidden, s=0.1), 1e-6, rand(n, hidden, s=hidden ** -0.5),
            rand(n, s=0.1) if bias else None, hq * dim, hkv * dim, qn, kn, 1e-6, dim)


def _inv_freq(dim: int, device: str = "cpu") -> torch.Tensor:
    return 1.0 / (1e6 ** (torch.arange(0, dim, 2, device=device).float() / dim))


def _partials(x: torch.Tensor, prep: tuple, split: int) -> torch.Tensor:
    """The QKV projection of ``rms_norm(x)`` as ``split`` float32 partial products over K."""
    from voxline.kernels.layer_ops import rms_norm

    ln_w, eps, w = prep[0], prep[1], prep[2]
    h = rms_norm(x, ln_w, eps).reshape(-1, x.shape[-1]).float()
    k = h.shape[-1] // split
    return torch.stack([F.linear(h[:, i * k:(i + 1) * k], w[:, i * k:(i + 1) * k].float()) for i in range(split)])


def _op(parts, prep, pos, inv_freq, k_buf, v_buf, mask, q_len, fn=None):
    _, _, _, qkv_b, q_out, _, qn, kn, qk_eps, dim = prep
    fn = fn or torch.ops.voxline.qkv_rope_attention
    return fn(parts, qkv_b, pos, inv_freq, qn, kn, k_buf, v_buf, mask, q_len, q_out // dim, qk_eps, dim ** -0.5)


@pytest.mark.parametrize("window", [None, 2])
def test_reference_is_the_unfused_layer_step_on_cpu(window):
    """Over a frame of sub-steps (positions 0-1, then 2, 3, 4): the operator (CPU kernel)
    writes the same keys/values and gives the same attention output as attn_prep, the
    out-of-place index_copy of the predictor and attend (float32; the projection as two
    partial products, so equal within float32 rounding)."""
    b, hidden, hq, hkv, dim, length = 3, 256, 4, 2, 64, 8
    prep = _layer(hidden, hq, hkv, dim, bias=True, norms=True)
    inv_freq = _inv_freq(dim)
    g = torch.Generator().manual_seed(1)
    keys = torch.zeros(b, hkv, length, dim)
    values = torch.zeros(b, hkv, length, dim)
    fused_k, fused_v = keys.clone(), values.clone()
    k_pos = torch.arange(length)[None]
    for positions in ([0, 1], [2], [3], [4]):
        q_pos = torch.tensor(positions)[None]
        pos = q_pos.expand(b, -1)
        mask = position_mask(q_pos, k_pos, window=window)
        x = torch.randn(b, len(positions), hidden, generator=g)
        q, k, v = attn_prep(x, pos, inv_freq, *prep)
        keys = keys.index_copy(2, q_pos[0], k)
        values = values.index_copy(2, q_pos[0], v)
        want = attend(q, keys, values, mask).transpose(1, 2).reshape(b * len(positions), -1)
        got = _op(_partials(x, prep, 2), prep, pos, inv_freq, fused_k, fused_v, mask, len(positions))
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fused_k, keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fused_v, values, atol=1e-5, rtol=1e-5)


def test_the_cpu_path_never_takes_the_kernel():
    prep = _layer(1024, 16, 8, 128, bias=False, norms=True, dtype=torch.bfloat16)
    x = torch.randn(1, 1, 1024).bfloat16()
    buf = torch.zeros(1, 8, 16, 128, dtype=torch.bfloat16)
    mask = position_mask(torch.tensor([[2]]), torch.arange(16)[None])
    assert not qa.fused_available(x, torch.tensor([[2]]), buf, buf.clone(), mask, *prep)


# --------------------------------------------------------------------------- CUDA


def _case(b: int, q_len: int, dtype: torch.dtype, *, hq: int = 16, hkv: int = 8, dim: int = 128,
          length: int = 16, hidden: int = 1024, bias: bool = False, norms: bool = True,
          window: int | None = None, seed: int = 0):
    """Real predictor shapes by default; every row at its own positions (the kernel reads
    them per row), buffers holding earlier sub-steps' keys/values at random."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    prep = _layer(hidden, hq, hkv, dim, bias=bias, norms=norms, device="cuda", dtype=dtype, seed=seed)
    x = torch.randn(b, q_len, hidden, device="cuda", generator=g).to(dtype)
    first = torch.randint(0, length - q_len + 1, (b, 1), device="cuda", generator=g)
    pos = first + torch.arange(q_len, device="cuda")
    mask = position_mask(pos, torch.arange(length, device="cuda").expand(b, length), window=window)
    k_buf = torch.randn(b, hkv, length, dim, device="cuda", generator=g).to(dtype)
    v_buf = torch.randn(b, hkv, length, dim, device="cuda", generator=g).to(dtype)
    return prep, x, pos, mask, k_buf, v_buf, _inv_freq(dim, "cuda")


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).norm() / ref.double().norm())


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("b", "q_len"), [(1, 1), (1, 2), (4, 1), (5, 2), (32, 2), (64, 1)])
@pytest.mark.parametrize("variant", ["predictor", "bias_no_norm", "window", "group4_dim64"])
def test_kernel_matches_the_reference_on_cuda(dtype, b, q_len, variant):
    kw = {"predictor": {}, "bias_no_norm": dict(bias=True, norms=False), "window": dict(window=3),
          "group4_dim64": dict(hq=8, hkv=2, dim=64, hidden=512, length=12)}[variant]
    prep, x, pos, mask, k_buf, v_buf, inv_freq = _case(b, q_len, dtype, seed=b * 10 + q_len, **kw)
    assert qa.fused_available(x, pos, k_buf, v_buf, mask, *prep)
    parts = _partials(x, prep, 2)
    k_ref, v_ref = k_buf.clone(), v_buf.clone()
    k32, v32 = k_buf.float(), v_buf.float()
    k_got, v_got = k_buf.clone(), v_buf.clone()
    got = _op(parts, prep, pos, inv_freq, k_got, v_got, mask, q_len)
    ref = _op(parts, prep, pos, inv_freq, k_ref, v_ref, mask, q_len, fn=qa._qkv_rope_attention_reference)
    prep32 = tuple(t.float() if isinstance(t, torch.Tensor) else t for t in prep)
    f32 = _op(parts, prep32, pos, inv_freq, k32, v32, mask, q_len, fn=qa._qkv_rope_attention_reference)
    assert got.dtype == dtype and got.shape == (b * q_len, prep[4])
    base = _rel(ref, f32)
    assert _rel(got, f32) < 1e-2 and _rel(got, f32) <= 2 * base + 1e-3, (_rel(got, f32), base)
    written = torch.zeros(b, 1, k_buf.shape[2], 1, dtype=torch.bool, device="cuda")
    written.scatter_(2, pos[:, None, :, None], True)
    for new, want, old in ((k_got, k32, k_buf), (v_got, v32, v_buf)):
        assert torch.equal(torch.where(written, old, new), old), "only the rows' positions change"
        assert _rel(new.masked_select(written), want.masked_select(written)) < 1e-2


@cuda
def test_kernel_writes_hold_across_compiled_and_captured_substeps():
    """Two sub-steps on one pair of buffers (positions 0-1, then 2), compiled as one region
    and replayed as a CUDA graph: the second sees the first's in-place writes, as eager."""
    dtype = torch.bfloat16
    prep, _, _, _, _, _, inv_freq = _case(2, 2, dtype)
    g = torch.Generator(device="cuda").manual_seed(7)
    length = 16
    k_pos = torch.arange(length, device="cuda")[None]
    p1, p2 = torch.tensor([[0, 1]], device="cuda"), torch.tensor([[2]], device="cuda")
    m1, m2 = position_mask(p1, k_pos), position_mask(p2, k_pos)

    def two_steps(x1, x2, k_buf, v_buf):
        a = qa.qkv_attention(x1, p1.expand(2, -1), inv_freq, k_buf, v_buf, m1, *prep)
        b = qa.qkv_attention(x2, p2.expand(2, -1), inv_freq, k_buf, v_buf, m2, *prep)
        return a, b

    def fresh():
        x1 = torch.randn(2, 2, 1024, device="cuda", generator=g).to(dtype)
        x2 = torch.randn(2, 1, 1024, device="cuda", generator=g).to(dtype)
        return x1, x2, torch.zeros(2, 8, length, 128, device="cuda", dtype=dtype), \
            torch.zeros(2, 8, length, 128, device="cuda", dtype=dtype)

    compiled = torch.compile(two_steps, dynamic=False)
    x1, x2, k_buf, v_buf = fresh()
    want = two_steps(x1, x2, k_buf.clone(), v_buf.clone())
    static = [x1.clone(), x2.clone(), k_buf.clone(), v_buf.clone()]
    for _ in range(2):
        compiled(*[t.clone() for t in static])  # compile and warm up off the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled(*static)
    for _ in range(2):
        x1, x2, k_buf, v_buf = fresh()
        want = two_steps(x1, x2, k_buf.clone(), v_buf.clone())
        for s, t in zip(static, (x1, x2, k_buf, v_buf), strict=True):
            s.copy_(t)
        graph.replay()
        for a, b in zip(out, want, strict=True):
            assert _rel(a, b) < 1e-2
        assert static[2][:, :, 3:].abs().max() == 0 and static[2][:, :, :3].abs().amax(-1).min() > 0
