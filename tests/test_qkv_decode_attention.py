"""The talker decode layer's one-kernel attention block (``voxline.kernels.qkv_decode_attention``).

- on the CPU: the operator's reference (its CPU kernel) is the unfused talker step it
  replaces, ``attn_prep`` + the slot cache write ``cache[slot, :, pos] = k`` + ``attend``
  over the gathered rows, across decode steps on permuted slots (with a bias, q/k norms,
  a window, two query positions); which arguments the dispatch refuses; and nothing on
  the CPU path takes the kernel;
- on CUDA (skipped without it): the Triton kernel against that reference and a float32
  one at talker shapes and cache lengths past one key block (outputs and cache writes,
  other slots and positions untouched), its in-place writes under ``torch.compile`` and
  CUDA-graph replay across steps.
"""

from __future__ import annotations

import pytest
import torch
from test_qkv_attention import _inv_freq, _layer, _partials

from voxline.kernels import qkv_decode_attention as qd
from voxline.kernels.attention import attend, position_mask
from voxline.kernels.decoder_step import attn_prep
from voxline.kernels.gemv import small_linear

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _op(parts, prep, pos, slot, inv_freq, ck, cv, length, mask, fn=None):
    _, _, _, qkv_b, q_out, _, qn, kn, qk_eps, dim = prep
    fn = fn or torch.ops.voxline.qkv_rope_decode_attention
    return fn(parts, qkv_b, pos, slot, inv_freq, qn, kn, ck, cv, mask, length, q_out // dim, qk_eps, dim ** -0.5)


@pytest.mark.parametrize(("window", "q_len"), [(None, 1), (3, 1), (None, 2)])
def test_reference_is_the_unfused_talker_step_on_cpu(window, q_len):
    """Decode steps on a 5-slot cache (rows on slots 4, 0, 2): the operator (CPU kernel)
    writes the same cache entries and gives the same attention output as attn_prep, the
    talker's ``cache[slot, :, pos] = k`` and attend over the gathered rows (float32; the
    projection as two partial products, so equal within float32 rounding)."""
    b, hidden, hq, hkv, dim, max_len, length = 3, 256, 4, 2, 64, 16, 12
    prep = _layer(hidden, hq, hkv, dim, bias=True, norms=True)
    inv_freq = _inv_freq(dim)
    g = torch.Generator().manual_seed(1)
    ck = torch.randn(5, hkv, max_len, dim, generator=g)
    cv = torch.randn(5, hkv, max_len, dim, generator=g)
    fused_k, fused_v = ck.clone(), cv.clone()
    slot = torch.tensor([4, 0, 2])
    k_pos = torch.arange(length).expand(b, length)
    for start in ([3, 5, 1], [4, 6, 2], [5, 7, 3]):
        pos = torch.tensor(start)[:, None] + torch.arange(q_len)
        mask = position_mask(pos, k_pos, window=window)
        x = torch.randn(b, q_len, hidden, generator=g)
        q, k, v = attn_prep(x, pos, inv_freq, *prep)
        for t in range(q_len):
            ck[slot, :, pos[:, t]] = k[:, :, t]
            cv[slot, :, pos[:, t]] = v[:, :, t]
        want = attend(q, ck[:, :, :length][slot], cv[:, :, :length][slot], mask)
        want = want.transpose(1, 2).reshape(b * q_len, -1)
        got = _op(_partials(x, prep, 2), prep, pos, slot, inv_freq, fused_k, fused_v, length, mask)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fused_k, ck, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fused_v, cv, atol=1e-5, rtol=1e-5)


def _talker_args(b: int = 2, q_len: int = 1, *, dtype: torch.dtype = torch.bfloat16, hq: int = 16,
                 hkv: int = 8, dim: int = 128, slots: int = 5, max_len: int = 128, length: int = 64) -> dict:
    prep = _layer(256, hq, hkv, dim, bias=False, norms=True, dtype=dtype)
    pos = torch.zeros(b, q_len, dtype=torch.int64)
    return dict(x=torch.zeros(b, q_len, 256, dtype=dtype), pos=pos, slot=torch.arange(b),
                k_cache=torch.zeros(slots, hkv, max_len, dim, dtype=dtype),
                v_cache=torch.zeros(slots, hkv, max_len, dim, dtype=dtype), length=length,
                mask=position_mask(pos, torch.arange(length).expand(b, length)),
                qkv_w=prep[2], q_out=prep[4], kv_out=prep[5], head_dim=dim)


def test_dispatch_serves_talker_shapes_and_refuses_the_rest():
    assert qd.serves(**_talker_args())
    assert qd.serves(**_talker_args(q_len=2, length=128))  # 2 heads x 2 positions: 4 rows
    assert qd.serves(**_talker_args(hq=8, hkv=2, dim=64))
    a = _talker_args()
    refused = {
        "a float mask": dict(mask=a["mask"].float()),
        "no mask": dict(mask=None),
        "a mask of another length": dict(mask=a["mask"][..., :32]),
        "length past the cache": dict(length=256, mask=position_mask(a["pos"], torch.arange(256).expand(2, 256))),
        "length 0": dict(length=0, mask=a["mask"][..., :0]),
        "a cache of another dtype": dict(v_cache=a["v_cache"].float()),
        "a strided cache": dict(k_cache=torch.zeros(5, 8, 128, 256, dtype=torch.bfloat16)[..., ::2]),
        "caches of other shapes": dict(v_cache=a["v_cache"][:4]),
        "slots of another count": dict(slot=torch.arange(3)),
        "float slots": dict(slot=torch.arange(2.0)),
        "positions of another shape": dict(pos=torch.zeros(2, 2, dtype=torch.int64)),
        "a 2-D input": dict(x=a["x"][:, 0]),
    }
    for why, change in refused.items():
        assert not qd.serves(**(a | change)), why
    assert not qd.serves(**_talker_args(q_len=9)), "more than 16 query rows per key/value head"
    assert not qd.serves(**(_talker_args(dim=96) | dict(head_dim=96))), "head dim 96"
    assert not qd.serves(**(a | dict(q_out=a["q_out"] + 128))), "a projection of another width"


def test_the_cpu_path_never_takes_the_kernel():
    a = _talker_args()
    prep = _layer(256, 16, 8, 128, bias=False, norms=True, dtype=torch.bfloat16)
    assert not qd.decode_fused_available(a["x"], a["pos"], a["slot"], a["k_cache"], a["v_cache"],
                                         a["length"], a["mask"], *prep)


def test_switch_returns_the_old_value():
    old = qd.set_enabled(False)
    try:
        assert qd.set_enabled(False) is False
    finally:
        qd.set_enabled(old)


# --------------------------------------------------------------------------- CUDA


def _case(b: int, q_len: int, dtype: torch.dtype, *, hq: int = 16, hkv: int = 8, dim: int = 128,
          hidden: int = 2048, length: int = 128, max_len: int = 256, slots: int = 40, bias: bool = False,
          norms: bool = True, window: int | None = None, seed: int = 0):
    """Real talker shapes by default; rows on random distinct slots at their own positions
    (the new ones the last of each row's first ``length``), the cache random."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    prep = _layer(hidden, hq, hkv, dim, bias=bias, norms=norms, device="cuda", dtype=dtype, seed=seed)
    x = torch.randn(b, q_len, hidden, device="cuda", generator=g).to(dtype)
    slot = torch.randperm(slots, device="cuda", generator=g)[:b]
    first = torch.randint(0, length - q_len + 1, (b, 1), device="cuda", generator=g)
    pos = first + torch.arange(q_len, device="cuda")
    mask = position_mask(pos, torch.arange(length, device="cuda").expand(b, length), window=window)
    ck = torch.randn(slots, hkv, max_len, dim, device="cuda", generator=g).to(dtype)
    cv = torch.randn(slots, hkv, max_len, dim, device="cuda", generator=g).to(dtype)
    return prep, x, pos, slot, mask, ck, cv, _inv_freq(dim, "cuda")


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).norm() / ref.double().norm())


_CUDA_CASES = [  # (dtype, batch, length, variant): every talker bucket shape, then the variants
    *[(torch.bfloat16, b, n, "talker") for b in (1, 4, 33) for n in (64, 128)],
    (torch.bfloat16, 1, 200, "talker"), (torch.bfloat16, 2, 1024, "talker"), (torch.float16, 4, 128, "talker"),
    *[(torch.bfloat16, 4, n, v) for n in (64, 200) for v in ("bias_no_norm", "window", "group4_dim64", "two_queries")],
    (torch.float16, 2, 200, "two_queries"),
]


@cuda
@pytest.mark.parametrize(("dtype", "b", "length", "variant"), _CUDA_CASES)
def test_kernel_matches_the_reference_on_cuda(dtype, b, length, variant):
    kw = {"talker": {}, "bias_no_norm": dict(bias=True, norms=False), "window": dict(window=40),
          "group4_dim64": dict(hq=8, hkv=2, dim=64, hidden=512), "two_queries": {}}[variant]
    q_len = 2 if variant == "two_queries" else 1
    prep, x, pos, slot, mask, ck, cv, inv_freq = _case(b, q_len, dtype, length=length,
                                                        max_len=max(256, length), seed=b + length, **kw)
    assert qd.decode_fused_available(x, pos, slot, ck, cv, length, mask, *prep)
    parts = _partials(x, prep, 2)
    k_ref, v_ref, k_got, v_got = ck.clone(), cv.clone(), ck.clone(), cv.clone()
    k32, v32 = ck.float(), cv.float()
    got = _op(parts, prep, pos, slot, inv_freq, k_got, v_got, length, mask)
    ref = _op(parts, prep, pos, slot, inv_freq, k_ref, v_ref, length, mask, fn=qd._qkv_rope_decode_attention_reference)
    prep32 = tuple(t.float() if isinstance(t, torch.Tensor) else t for t in prep)
    f32 = _op(parts, prep32, pos, slot, inv_freq, k32, v32, length, mask, fn=qd._qkv_rope_decode_attention_reference)
    assert got.dtype == dtype and got.shape == (b * q_len, prep[4])
    base = _rel(ref, f32)
    assert _rel(got, f32) < 1e-2 and _rel(got, f32) <= 2 * base + 1e-3, (_rel(got, f32), base)
    written = torch.zeros(ck.shape[0], 1, ck.shape[2], 1, dtype=torch.bool, device="cuda")
    written[slot[:, None], 0, pos] = True
    for new, want, old in ((k_got, k32, ck), (v_got, v32, cv)):
        assert torch.equal(torch.where(written, old, new), old), "only the rows' slots and positions change"
        assert _rel(new.masked_select(written), want.masked_select(written)) < 1e-2


def _two_steps(prep, slot, inv_freq, parts_of):
    """Two decode steps of three rows (positions p, then p + 1 of the same slots) on one
    cache, each projection through ``parts_of``, the second's output through a linear."""
    ln_w, eps, qkv_w, qkv_b, q_out, _, qn, kn, qk_eps, dim = prep
    length = 128
    pos1 = torch.tensor([[10], [40], [100]], device="cuda")
    pos2 = pos1 + 1
    k_pos = torch.arange(length, device="cuda").expand(3, length)
    m1, m2 = position_mask(pos1, k_pos), position_mask(pos2, k_pos)

    def run(x1, x2, ck, cv):
        a = qd.qkv_decode_attention(parts_of(x1, ln_w, eps, qkv_w), pos1, slot, inv_freq, ck, cv, length, m1,
                                    qkv_b, q_out, qn, kn, qk_eps, dim)
        b = qd.qkv_decode_attention(parts_of(x2, ln_w, eps, qkv_w), pos2, slot, inv_freq, ck, cv, length, m2,
                                    qkv_b, q_out, qn, kn, qk_eps, dim)
        return a, small_linear(b.transpose(1, 2).reshape(3, 1, -1), qkv_w[:2048])

    return run, (pos1, pos2)


def _captured(run, static: list[torch.Tensor]):
    for _ in range(2):
        run(*[t.clone() for t in static])  # compile and warm up off the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(*static)
    return graph, out


@cuda
def test_kernel_writes_hold_across_compiled_and_captured_steps():
    """The projection compiled, the kernel between, replayed as a CUDA graph: the second
    step sees the first's in-place cache writes, as eager."""
    dtype = torch.bfloat16
    prep, _, _, slot, _, ck0, cv0, inv_freq = _case(3, 1, dtype, seed=5)
    g = torch.Generator(device="cuda").manual_seed(7)
    run, positions = _two_steps(prep, slot, inv_freq, torch.compile(qd.qkv_partials, dynamic=False))
    eager, _ = _two_steps(prep, slot, inv_freq, qd.qkv_partials)
    written = torch.zeros(ck0.shape[0], 1, ck0.shape[2], 1, dtype=torch.bool, device="cuda")
    for pos in positions:
        written[slot, 0, pos[:, 0]] = True

    def fresh():
        return [torch.randn(3, 1, 2048, device="cuda", generator=g).to(dtype) for _ in range(2)]

    static = [*fresh(), ck0.clone(), cv0.clone()]
    graph, out = _captured(run, static)
    for _ in range(2):
        x1, x2 = fresh()
        ck, cv = ck0.clone(), cv0.clone()
        want = eager(x1, x2, ck, cv)
        for s, t in zip(static, (x1, x2, ck0, cv0), strict=True):
            s.copy_(t)
        graph.replay()
        for a, b in zip(out, want, strict=True):
            assert _rel(a, b) < 1e-2
        for got, want, old in ((static[2], ck, ck0), (static[3], cv, cv0)):
            # compiled and eager norms round apart now and then: close, not equal
            assert _rel(got.masked_select(written), want.masked_select(written)) < 1e-2
            assert torch.equal(torch.where(written, old, got), old), "only the rows' slots and positions change"


@cuda
def test_graphed_talker_decode_takes_the_kernel_as_closely_as_the_unfused_step(monkeypatch):
    """A GraphedTalkerGenerator at head dim 64 in bf16 (4 rows on slots 3, 0, 2, 1 of a
    random cache, length bucket 128): its decode step calls the kernel once per layer;
    the captured step equals its eager twin bit for bit; with the kernel switched off the
    step runs the unfused path; the kernel's hidden state and cache writes are as close to
    the same step in float32 as the unfused path's, and every other cache entry is kept."""
    import copy

    from qwen_ref.harness import _model, _talker, local_talker

    from voxline.engines.models.qwen3_tts import graphed_talker as gt

    mrope = {"rope_type": "default", "mrope_section": [8, 12, 12], "interleaved": True}
    _, talker32 = local_talker(_model(_talker(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                                              num_key_value_heads=2, head_dim=64, rope_scaling=mrope)), seed=3)
    talker32 = talker32.to("cuda")
    talker = copy.deepcopy(talker32).to(torch.bfloat16)
    calls = []
    real = gt.qkv_decode_attention
    monkeypatch.setattr(gt, "qkv_decode_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    length, layers = 128, len(talker.windows)
    gen = gt.GraphedTalkerGenerator(talker, max_streams=4, max_len=length, batch_buckets=[4],
                                    length_buckets=[length], prefill_buckets=[], compile=False)
    gen32 = gt.GraphedTalkerGenerator(talker32, max_streams=4, max_len=length, batch_buckets=[4],
                                      length_buckets=[length], prefill_buckets=[], capture=False, compile=False)
    g = torch.Generator(device="cuda").manual_seed(11)
    k0 = torch.randn(gen.cache.k.shape, device="cuda", generator=g).bfloat16()
    v0 = torch.randn(gen.cache.v.shape, device="cuda", generator=g).bfloat16()
    x = torch.randn(4, 256, device="cuda", generator=g)
    slot = torch.tensor([3, 0, 2, 1])
    pos = torch.tensor([5, 40, 100, 127])
    ints = torch.stack([slot, pos, torch.zeros(4, dtype=torch.int64), torch.arange(4) + 7,
                        torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64)]).cuda()
    floats = torch.tensor([[0.0] * 4, [1.0] * 4, [1.0] * 4], device="cuda")

    def run(generator, fn, dtype):
        generator.cache.k.copy_(k0)
        generator.cache.v.copy_(v0)
        generator.seen.zero_()
        with torch.inference_mode():
            out = fn(x.to(dtype), ints, floats)
        return out["hidden"].clone(), generator.cache.k.clone(), generator.cache.v.clone()

    assert qd.set_enabled(True)
    try:
        step = gen.decode_steps.get((4, length))  # captured with the kernel on
        assert len(calls) == 3 * layers  # two warm-ups and the capture

        def replay(a, ints_, floats_):
            step.inputs["x"].copy_(a)
            step.inputs["ints"].copy_(ints_)
            step.inputs["floats"].copy_(floats_)
            return step()

        graphed = run(gen, replay, torch.bfloat16)
        eager = run(gen, gen._decode_fn(length), torch.bfloat16)
        assert len(calls) == 4 * layers
        for a, b in zip(graphed, eager, strict=True):
            assert torch.equal(a, b), "the captured step is its eager twin"
        qd.set_enabled(False)
        unfused = run(gen, gen._decode_fn(length), torch.bfloat16)
        assert len(calls) == 4 * layers, "switched off, the step takes the unfused path"
    finally:
        qd.set_enabled(True)
    f32 = run(gen32, gen32._decode_fn(length), torch.float32)
    written = torch.zeros(k0.shape[1], 1, length, 1, dtype=torch.bool, device="cuda")
    written[slot, 0, pos] = True
    written = written.expand(layers, -1, -1, -1, -1)
    base = _rel(unfused[0], f32[0])
    assert _rel(eager[0], f32[0]) <= 2 * base + 1e-3, (_rel(eager[0], f32[0]), base)
    for i, (buf0, want) in enumerate(((k0, f32[1]), (v0, f32[2])), start=1):
        got, ref = eager[i], unfused[i]
        assert torch.equal(torch.where(written, buf0, got), buf0), "only the rows' slots and positions change"
        base = _rel(ref.masked_select(written), want.masked_select(written))
        assert _rel(got.masked_select(written), want.masked_select(written)) <= 2 * base + 1e-3


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("q_len, length", [(1, 150), (2, 64), (1, 7)])
def test_attend_decode_kernel_reads_the_named_rows_as_attend_does(dtype, q_len, length):
    """``attend_decode``'s kernel (the streaming softmax it shares with the fused block,
    `decode_attention.stream_attend`) over cache rows ``slot`` and their first ``length``
    positions, across key blocks, against ``attend`` over the gathered rows in float32."""
    from voxline.kernels.decode_attention import attend_decode

    g = torch.Generator(device="cuda").manual_seed(3)
    ck = torch.randn(6, 2, 192, 64, device="cuda", generator=g).to(dtype)
    cv = torch.randn(6, 2, 192, 64, device="cuda", generator=g).to(dtype)
    q = torch.randn(3, 8, q_len, 64, device="cuda", generator=g).to(dtype)
    slot = torch.tensor([5, 0, 2], device="cuda")
    q_pos = torch.tensor([[length - q_len + t for t in range(q_len)]] * 3, device="cuda")
    mask = position_mask(q_pos, torch.arange(length, device="cuda").expand(3, length))
    got = attend_decode(q, ck, cv, mask, slot=slot, length=length)
    want = attend(q.float(), ck[:, :, :length][slot].float(), cv[:, :, :length][slot].float(), mask)
    err = float((got.float() - want).norm() / want.norm())
    assert err < (1e-2 if dtype == torch.bfloat16 else 2e-3), err
