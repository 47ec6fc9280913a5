"""Projections with the norm / SwiGLU in their prologue (``voxline.kernels.prologue_gemv``).

- on the CPU: each operator's reference (its CPU kernel) is the unfused arithmetic it
  replaces (the residual add of summed partials, ``rms_norm``, ``small_linear``; the
  gate/up sum, ``silu_mul``), the fake kernels agree with them (``opcheck``), and nothing
  on the CPU path takes the kernels;
- on CUDA (skipped without it): the Triton kernels against those references and float32
  (every output element written, the residual too), a whole predictor layer through
  ``_prologue_layer`` (SwiGLU prologue alone, and all prologues) against the unfused
  layer, and a compiled, graph-captured sub-step with the prologues on against off.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from voxline.engines.models.qwen3_tts import talker_steps
from voxline.kernels import prologue_gemv as pg
from voxline.kernels.attention import attend, position_mask
from voxline.kernels.layer_ops import rms_norm, silu_mul

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(autouse=True)
def _prologues_on():
    """The module is off by default (slower in round 6); these tests check it switched on."""
    old = pg.set_enabled(True)
    yield old
    pg.set_enabled(old)


def _rand(*shape: int, g: torch.Generator, s: float = 1.0, device: str = "cpu",
          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.randn(*shape, device=device, generator=g) * s).to(dtype)


def _unfused_norm(x, add, ln_w, eps, w):
    res = x if add is None else x + add.sum(0).to(x.dtype)
    return F.linear(rms_norm(res, ln_w, eps).float(), w.float()), res


@pytest.mark.parametrize("with_add", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_reference_is_the_unfused_arithmetic_on_cpu(with_add, dtype):
    g = torch.Generator().manual_seed(0)
    m, k, n = 3, 256, 96
    x = _rand(m, k, g=g, dtype=dtype)
    add = _rand(4, m, k, g=g) if with_add else None
    ln_w = 1.0 + _rand(k, g=g, s=0.1, dtype=dtype)
    w = _rand(n, k, g=g, s=k ** -0.5, dtype=dtype)
    parts, res = pg._norm_gemv_partials_reference(x, add, ln_w, 1e-6, w, 2)
    want, want_res = _unfused_norm(x, add, ln_w, 1e-6, w)
    assert parts.shape == (2, m, n) and parts.dtype == torch.float32
    torch.testing.assert_close(parts.sum(0), want, atol=1e-4, rtol=1e-4)
    assert torch.equal(res, want_res) and res.data_ptr() != x.data_ptr()


def test_swiglu_reference_is_the_unfused_arithmetic_on_cpu():
    g = torch.Generator().manual_seed(1)
    m, k, n = 2, 256, 64
    gu = _rand(2, m, 2 * k, g=g)
    w = _rand(n, k, g=g, s=k ** -0.5, dtype=torch.bfloat16)
    parts = pg._swiglu_gemv_partials_reference(gu, w, 2)
    gate, up = gu.sum(0).to(torch.bfloat16).chunk(2, dim=-1)
    want = F.linear(silu_mul(gate, up).float(), w.float())
    torch.testing.assert_close(parts.sum(0), want, atol=1e-4, rtol=1e-4)


def test_fake_kernels_match_the_references():
    g = torch.Generator().manual_seed(2)
    x = _rand(2, 256, g=g, dtype=torch.bfloat16)
    ln_w = _rand(256, g=g, dtype=torch.bfloat16)
    w = _rand(64, 256, g=g, dtype=torch.bfloat16)
    torch.library.opcheck(torch.ops.voxline.norm_gemv_partials, (x, _rand(2, 2, 256, g=g), ln_w, 1e-6, w, 2))
    torch.library.opcheck(torch.ops.voxline.norm_gemv_partials, (x, None, ln_w, 1e-6, w, 1))
    torch.library.opcheck(torch.ops.voxline.swiglu_gemv_partials, (_rand(1, 2, 512, g=g), w, 2))


def _layer(hidden: int, hq: int, hkv: int, dim: int, inter: int, *, device: str, dtype: torch.dtype,
           seed: int = 0) -> tuple[tuple, tuple]:
    """Random (prep_w, post_w) as ``talker_steps.layer_args`` gives them (no biases, q/k norms)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def r(*shape: int, s: float = 1.0) -> torch.Tensor:
        return _rand(*shape, g=g, s=s, device=device, dtype=dtype)

    prep = (1.0 + r(hidden, s=0.1), 1e-6, r((hq + 2 * hkv) * dim, hidden, s=hidden ** -0.5), None,
            hq * dim, hkv * dim, 1.0 + r(dim, s=0.1), 1.0 + r(dim, s=0.1), 1e-6, dim)
    post = (r(hidden, hq * dim, s=(hq * dim) ** -0.5), None, 1.0 + r(hidden, s=0.1), 1e-6,
            r(2 * inter, hidden, s=hidden ** -0.5), None, r(hidden, inter, s=inter ** -0.5), None)
    return prep, post


def test_off_by_default(_prologues_on):
    """The state before the fixture switched it on: off, norm prologues off, loop unrolled
    (every test restores what it switches)."""
    assert _prologues_on is False and not pg.norm_enabled() and pg.UNROLL_MAIN_LOOP


def test_the_cpu_path_never_takes_the_kernels():
    prep, post = _layer(1024, 16, 8, 128, 3072, device="cpu", dtype=torch.bfloat16)
    x = torch.randn(1, 1, 1024).bfloat16()
    assert not pg.layer_available(x, None, prep, post)
    assert not pg.norm_available(x, None, prep[0], prep[2])
    assert not pg.swiglu_available(torch.zeros(1, 1, 6144), post[6])


# --------------------------------------------------------------------------- CUDA


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).norm() / ref.double().norm())


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize(("k", "n", "add_split"), [(1024, 4096, 8), (1024, 6144, 8), (1024, 2048, 0),
                                                   (512, 96, 2)])
def test_norm_kernel_matches_the_reference_on_cuda(dtype, m, k, n, add_split):
    g = torch.Generator(device="cuda").manual_seed(m * 100 + n)
    x = _rand(m, k, g=g, device="cuda", dtype=dtype)
    add = _rand(add_split, m, k, g=g, s=0.5, device="cuda") if add_split else None
    ln_w = 1.0 + _rand(k, g=g, s=0.1, device="cuda", dtype=dtype)
    w = _rand(n, k, g=g, s=k ** -0.5, device="cuda", dtype=dtype)
    assert pg.norm_available(x, add, ln_w, w)
    parts, res = pg.norm_linear(x, add, ln_w, 1e-6, w)
    ref, ref_res = pg._norm_gemv_partials_reference(x, add, ln_w, 1e-6, w, parts.shape[0])
    f32, _ = _unfused_norm(x.float(), add, ln_w.float(), 1e-6, w.float())
    assert torch.isfinite(parts).all() and torch.isfinite(res.float()).all()
    # x + round(sum(add)), rounded, as unfused: equal but where the float32 partials'
    # summation order (the reference's torch.sum) flips a rounding
    assert float((res != ref_res).float().mean()) < 2e-3 and _rel(res, ref_res) < 1e-3
    base = _rel(ref.sum(0), f32)
    got = _rel(parts.sum(0), f32)
    assert got < 1e-2 and got <= 1.5 * base + 1e-4, (got, base)
    assert _rel(parts.sum(0), ref.sum(0)) < 2e-3


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("gu_split", [1, 2])
def test_swiglu_kernel_matches_the_reference_on_cuda(dtype, m, gu_split):
    g = torch.Generator(device="cuda").manual_seed(m + gu_split)
    k, n = 3072, 1024
    gu = _rand(gu_split, m, 2 * k, g=g, device="cuda")
    w = _rand(n, k, g=g, s=k ** -0.5, device="cuda", dtype=dtype)
    assert pg.swiglu_available(gu, w)
    parts = pg.swiglu_linear(gu, w)
    ref = pg._swiglu_gemv_partials_reference(gu, w, parts.shape[0])
    gate, up = gu.sum(0).chunk(2, dim=-1)
    f32 = F.linear(F.silu(gate) * up, w.float())
    assert torch.isfinite(parts).all()
    base, got = _rel(ref.sum(0), f32), _rel(parts.sum(0), f32)
    assert got < 1e-2 and got <= 1.5 * base + 1e-4, (got, base)
    assert _rel(parts.sum(0), ref.sum(0)) < 2e-3


def _inv_freq(dim: int) -> torch.Tensor:
    return 1.0 / (1e6 ** (torch.arange(0, dim, 2, device="cuda").float() / dim))


@cuda
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize(("b", "q_len"), [(1, 1), (1, 2), (4, 1)])
def test_prologue_layer_matches_the_unfused_layer_on_cuda(b, q_len, norm):
    """A predictor-shape layer through the five launches against the unfused functions in
    bf16 (the prologues off) and in float32; the keys/values written alike."""
    dtype = torch.bfloat16
    prep, post = _layer(1024, 16, 8, 128, 3072, device="cuda", dtype=dtype, seed=b)
    g = torch.Generator(device="cuda").manual_seed(3)
    x = _rand(b, q_len, 1024, g=g, device="cuda", dtype=dtype)
    pending = _rand(8, b * q_len, 1024, g=g, s=0.3, device="cuda")
    pos = torch.arange(q_len, device="cuda").expand(b, -1) + (2 if q_len == 1 else 0)
    mask = position_mask(pos[:1], torch.arange(16, device="cuda")[None])
    k0 = _rand(b, 8, 16, 128, g=g, device="cuda", dtype=dtype)
    v0 = _rand(b, 8, 16, 128, g=g, device="cuda", dtype=dtype)
    old_norm = pg.set_norm_enabled(norm)
    try:
        assert pg.layer_available(x, pending, prep, post)
    finally:
        pg.set_norm_enabled(old_norm)
    kf, vf = k0.clone(), v0.clone()
    h, down = talker_steps._prologue_layer(x, pending, pos, _inv_freq(128), kf, vf, mask, prep, post, norm=norm)
    got = talker_steps._add_pending(h, down)

    def unfused(x, k_buf, v_buf, prep, post, pending):
        from voxline.kernels.decoder_step import attn_out_mlp
        from voxline.kernels.qkv_attention import qkv_attention
        h = talker_steps._add_pending(x, pending)
        out = qkv_attention(h, pos, _inv_freq(128), k_buf, v_buf, mask, *prep)
        heads = out.view(b, q_len, -1, 128).transpose(1, 2)
        return attn_out_mlp(h, heads, *post)

    old = pg.set_enabled(False)
    try:
        ku, vu = k0.clone(), v0.clone()
        want = unfused(x, ku, vu, prep, post, pending)
        f32 = [t.float() if isinstance(t, torch.Tensor) else t for t in (*prep, *post)]
        k32, v32 = k0.float(), v0.float()
        from voxline.kernels import qkv_attention as qa
        qa_old = qa.set_enabled(False)  # float32 takes the unfused path anyway; explicit
        try:
            from voxline.kernels.decoder_step import attn_mlp, attn_prep
            h32 = x.float() + pending.sum(0).view(b, q_len, -1)
            q, k, v = attn_prep(h32, pos, _inv_freq(128), *f32[:10])
            k32.index_copy_(2, pos[0], k)
            v32.index_copy_(2, pos[0], v)
            ref32 = attn_mlp(h32, q, k32, v32, mask, *f32[10:])
        finally:
            qa.set_enabled(qa_old)
    finally:
        pg.set_enabled(old)
    base = _rel(want, ref32)
    assert _rel(got, ref32) <= 1.5 * base + 1e-4, (_rel(got, ref32), base)
    assert _rel(got, want) < 1e-2
    assert _rel(kf, ku) < 1e-2 and _rel(vf, vu) < 1e-2


@cuda
@pytest.mark.parametrize("norm", [False, True])
def test_compiled_and_captured_substep_on_matches_off(norm):
    """predictor_substep over two layers, compiled and replayed as a CUDA graph, greedy
    head: the prologues on and off pick (almost always) the same codes."""
    dtype = torch.bfloat16
    b, hidden, vocab = 1, 1024, 2048
    layers = [_layer(hidden, 16, 8, 128, 3072, device="cuda", dtype=dtype, seed=s) for s in (5, 6)]
    g = torch.Generator(device="cuda").manual_seed(9)
    norm_w = 1.0 + _rand(hidden, g=g, s=0.1, device="cuda", dtype=dtype)
    lm_w = _rand(vocab, hidden, g=g, s=hidden ** -0.5, device="cuda", dtype=dtype)
    table = _rand(vocab, 64, g=g, device="cuda", dtype=dtype)
    next_table = _rand(vocab, hidden, g=g, device="cuda", dtype=dtype)
    ints = torch.zeros(b, dtype=torch.long, device="cuda")
    head = (norm_w, 1e-6, lm_w, table, next_table, torch.zeros(b, device="cuda"), ints + 50,
            torch.ones(b, device="cuda"), ints, ints, 0)
    k_pos = torch.arange(16, device="cuda")[None]
    pos = torch.tensor([[3]], device="cuda")
    mask = position_mask(pos, k_pos)

    def step(x, k0, v0, k1, v1):
        code, emb, nxt, _, _ = talker_steps.predictor_substep(
            x, pos, pos[0], _inv_freq(128), [k0, k1], [v0, v1], [mask, mask], layers, head, attend)
        return code, nxt

    codes = {}
    old_norm = pg.set_norm_enabled(norm)
    for on in (False, True):
        pg.set_enabled(on)
        try:
            torch._dynamo.reset()
            compiled = torch.compile(step, dynamic=False)
            static = [_rand(b, 1, hidden, g=torch.Generator(device="cuda").manual_seed(0), device="cuda",
                            dtype=dtype)] + [torch.zeros(b, 8, 16, 128, device="cuda", dtype=dtype) for _ in range(4)]
            for _ in range(2):
                compiled(*[t.clone() for t in static])
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = compiled(*static)
            picks = []
            gx = torch.Generator(device="cuda").manual_seed(11)
            for _ in range(20):
                static[0].copy_(_rand(b, 1, hidden, g=gx, device="cuda", dtype=dtype))
                for t in static[1:]:
                    t.copy_(_rand(*t.shape, g=gx, device="cuda", dtype=dtype))
                graph.replay()
                picks.append(out[0].clone())
            codes[on] = torch.cat(picks)
        finally:
            pg.set_enabled(True)
    pg.set_norm_enabled(old_norm)
    assert float((codes[True] == codes[False]).float().mean()) >= 0.9, (codes[True], codes[False])
