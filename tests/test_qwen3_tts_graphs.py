"""The graph-capable Qwen3-TTS path (GraphedTalkerGenerator) against the eager stage.

On the CPU the bucketed steps run eagerly over the same padded static buffers a CUDA
graph would replay, and the layer functions a GPU compiles run uncompiled (their eager
twins), so padding, bucketing, joins and cancels are exercised exactly;
greedy decoding must give the plain stage's audio, and seeded sampling must not depend
on what shares the batch or how it is padded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_qwen3_tts_stage import TEXTS, audio, make_stage, of, run, write_test_checkpoint

from voxline.engines.models.qwen3_tts import TalkerSampling
from voxline.engines.models.qwen3_tts.graphed_code2wav import GraphedCode2Wav
from voxline.engines.models.qwen3_tts.graphed_talker import GraphedTalkerGenerator
from voxline.engines.models.qwen3_tts.talker_steps import layer_args
from voxline.engines.speech_model import SpeechJob
from voxline.kernels.attention import position_mask
from voxline.kernels.compiled import maybe_compile
from voxline.kernels.cuda_graphs import (
    BucketedSteps,
    StaticStep,
    bucket_for,
    ladder_buckets,
    pow2_buckets,
)
from voxline.kernels.decoder_step import attn_mlp, attn_prep
from voxline.kernels.sampling import bits_to_unit, counter_uniform, sample_rows

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_test_checkpoint(tmp_path_factory.mktemp("qwen3-graphs") / "model")


# --------------------------------------------------------------------------- kernels


def test_buckets():
    assert pow2_buckets(1, 24) == [1, 2, 4, 8, 16, 24]
    assert pow2_buckets(64, 64) == [64]
    # the default TTS ladder on CUDA: fewer compiled buckets to capture at start-up
    assert ladder_buckets(64) == [1, 4, 16, 64] and ladder_buckets(96) == [1, 4, 16, 64, 96]
    assert ladder_buckets(8) == [1, 4, 8] and ladder_buckets(1) == [1]
    assert bucket_for(3, [1, 2, 4, 8]) == 4
    assert bucket_for(8, [8, 1]) == 8
    assert bucket_for(9, [1, 2, 4, 8]) is None


def test_static_step_eager_twin_writes_its_own_outputs():
    calls = []

    def fn(x: torch.Tensor) -> dict[str, torch.Tensor]:
        calls.append(1)
        return {"y": x * 2}

    steps = BucketedSteps(lambda b: StaticStep(fn, {"x": torch.zeros(b)}), capture=False, name="t")
    step = steps.get(4)
    assert steps.get(4) is step and len(calls) == 0
    step.inputs["x"].copy_(torch.arange(4.0))
    out = step()
    assert out["y"].tolist() == [0.0, 2.0, 4.0, 6.0]
    step.inputs["x"].fill_(1.0)
    assert step()["y"] is out["y"] and out["y"].tolist() == [2.0] * 4


def test_counter_uniform_depends_only_on_seed_and_counter():
    seed = torch.tensor([7, 7, 8, 2**40 + 7])
    counter = torch.tensor([0, 1, 0, 0])
    u = counter_uniform(seed, counter, 4096)
    assert u.shape == (4, 4096) and float(u.min()) > 0 and float(u.max()) < 1
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2]) and not torch.equal(u[0], u[3])
    assert torch.equal(counter_uniform(seed[:1], counter[:1], 4096)[0], u[0])
    assert abs(float(u.mean()) - 0.5) < 0.01


def test_uniforms_stay_strictly_inside_0_1():
    u = bits_to_unit(torch.tensor([0, 1, 2**31, 2**32 - 2, 2**32 - 1], dtype=torch.int64))
    assert float(u.min()) > 0 and float(u.max()) < 1
    assert bool(torch.isfinite(-torch.log(u)).all()) and bool((-torch.log(u) > 0).all())


def test_masked_ids_are_never_drawn():
    """Seed 10027 at counter 32 drew a suppressed id on an H200 while uniforms could
    round to 1.0; sweep many seeds and counters over a mostly masked vocabulary."""
    n, vocab = 2048, 3072
    logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(1))
    logits[:, 2048:] = float("-inf")
    seed = torch.arange(n, dtype=torch.int64) + 10_000
    for counter in (0, 16, 32):
        picks = sample_rows(logits, *_settings(n, 0.9, k=50), seed, torch.full((n,), counter))
        assert int(picks.max()) < 2048


def _settings(b: int, temp: float, k: int = 0, p: float = 1.0):
    return (torch.full((b,), temp), torch.full((b,), k, dtype=torch.int64), torch.full((b,), p))


def test_sample_rows_greedy_topk_and_batch_independence():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 300, generator=g)
    seed, counter = torch.arange(6, dtype=torch.int64) * 11, torch.zeros(6, dtype=torch.int64)
    assert torch.equal(sample_rows(logits, *_settings(6, 0.0), seed, counter), logits.argmax(-1))
    assert torch.equal(sample_rows(logits, *_settings(6, 0.9, k=1), seed, counter), logits.argmax(-1))
    picks = sample_rows(logits, *_settings(6, 0.9, k=5), seed, counter)
    top5 = logits.topk(5).indices
    assert all(int(picks[i]) in top5[i].tolist() for i in range(6))
    # A row's pick is the same alone and in any batch.
    alone = sample_rows(logits[3:4], *_settings(1, 0.9, k=50), seed[3:4], counter[3:4])
    assert int(alone) == int(sample_rows(logits, *_settings(6, 0.9, k=50), seed, counter)[3])
    # Frequencies follow the softmax (many counters of one row).
    n = 4000
    row = logits[:1, :4].expand(n, 4).contiguous()
    draws = sample_rows(row, *_settings(n, 1.0), torch.full((n,), 5), torch.arange(n))
    freq = torch.bincount(draws, minlength=4).float() / n
    assert torch.allclose(freq, row[0].softmax(-1), atol=0.03)


# --------------------------------------------------------------------------- stage

SCHEDULE = {0: [SpeechJob(1, TEXTS[0]), SpeechJob(2, TEXTS[1])], 3: [SpeechJob(3, TEXTS[2])],
            7: [SpeechJob(4, TEXTS[3])]}


def _jobs(seed: int | None = None) -> dict[int, list[SpeechJob]]:
    return {i: [SpeechJob(j.job_id, j.text, seed=None if seed is None else seed + j.job_id)
                for j in jobs] for i, jobs in SCHEDULE.items()}


def _by_job(outs) -> dict[int, tuple[np.ndarray, list[bool], list[str]]]:
    ids = sorted({o.job_id for _, o in outs})
    return {i: (audio(of(outs, i)), [o.finished for o in of(outs, i)], [o.text for o in of(outs, i)])
            for i in ids}


def _assert_same(a, b) -> None:
    assert a.keys() == b.keys()
    for job_id in a:
        wa, fa, ta = a[job_id]
        wb, fb, tb = b[job_id]
        assert (fa, ta) == (fb, tb), job_id
        assert wa.shape == wb.shape, job_id
        np.testing.assert_allclose(wa, wb, atol=1e-5, err_msg=f"job {job_id}")


@pytest.mark.parametrize("cancel", [False, True])
def test_greedy_graph_path_equals_the_eager_stage(model_dir, cancel):
    """Joins at different steps, a cancel mid-batch: same outputs as the plain generator."""
    cancels = {5: [2]} if cancel else {}
    plain = run(make_stage(model_dir, graphs=False), _jobs(), cancels)
    graphed_stage = make_stage(model_dir, graphs=True)
    assert isinstance(graphed_stage.generator, GraphedTalkerGenerator)
    graphed = run(graphed_stage, _jobs(), cancels)
    _assert_same(_by_job(plain), _by_job(graphed))
    if cancel:
        assert not any(o.finished for o in of(graphed, 2))
    gen = graphed_stage.generator
    assert sorted(gen._free) == list(range(4)) and gen.scratch == 4  # scratch slot never lent


def test_seeded_sampling_ignores_batch_mates_padding_and_cancels(model_dir):
    sampling = TalkerSampling(min_frames=2)
    alone = {}
    for jobs in _jobs(seed=100).values():
        for job in jobs:
            outs = run(make_stage(model_dir, graphs=True, sampling=sampling), {0: [job]})
            alone[job.job_id] = _by_job(outs)[job.job_id]
    together = _by_job(run(make_stage(model_dir, graphs=True, sampling=sampling), _jobs(seed=100)))
    _assert_same(alone, together)
    # Exact shapes (no buckets, no padding) draw the same codes as padded buckets.
    exact = make_stage(model_dir, graphs=True, sampling=sampling)
    exact.generator.batch_buckets = []
    exact.generator.length_buckets = []
    _assert_same(together, _by_job(run(exact, _jobs(seed=100))))
    # A cancelled neighbour changes nothing for the others.
    cancelled = _by_job(run(make_stage(model_dir, graphs=True, sampling=sampling), _jobs(seed=100),
                            {4: [1]}))
    _assert_same({k: v for k, v in together.items() if k != 1},
                 {k: v for k, v in cancelled.items() if k != 1})


def test_padding_rows_write_only_the_scratch_slot(model_dir):
    stage = make_stage(model_dir, graphs=True)
    gen = stage.generator
    assert isinstance(gen, GraphedTalkerGenerator)
    stage.start(SpeechJob(1, TEXTS[0]))
    for _ in range(3):
        stage.step()  # one stream in a batch bucket of 1; then force a padded bucket
    gen.batch_buckets = [4]
    before_k = gen.cache.k.clone()
    stage.step()
    slot = next(iter(stage._jobs.values())).stream.slot
    changed = (gen.cache.k != before_k).flatten(2).any(-1).any(0)  # [slots]
    assert changed[slot] and set(changed.nonzero().flatten().tolist()) <= {slot, gen.scratch}


@pytest.mark.parametrize(("attention", "fuse_predictor"),
                         [("sdpa", False), ("matmul", True), ("sum", True), ("triton", True)])
def test_step_variants_equal_the_eager_stage(model_dir, attention, fuse_predictor):
    """Spelled-out attention and the per-layer (unfused) predictor sub-step are the same
    function as the default steps: greedy audio equals the plain generator's."""
    plain = run(make_stage(model_dir, graphs=False), _jobs())
    stage = make_stage(model_dir, graphs=True)
    stage.generator = GraphedTalkerGenerator(stage.model.talker, max_streams=4, max_len=256, attention=attention,
                                             predictor_attention=attention, fuse_predictor=fuse_predictor)
    _assert_same(_by_job(plain), _by_job(run(stage, _jobs())))


def test_unknown_attention_and_bad_buckets_are_refused(model_dir):
    stage = make_stage(model_dir, graphs=False)
    with pytest.raises(ValueError, match="attention"):
        GraphedTalkerGenerator(stage.model.talker, max_streams=4, max_len=64, attention="flash")
    with pytest.raises(ValueError, match="batch_buckets"):
        make_stage(model_dir, graphs=True, batch_buckets=[1, 8])
    with pytest.raises(ValueError, match="batch_buckets"):
        make_stage(model_dir, graphs=False, batch_buckets=[1, 2])


def test_batch_buckets_setting_reaches_talker_and_codec(model_dir):
    stage = make_stage(model_dir, graphs=True, batch_buckets=[1, 3])
    assert stage.generator.batch_buckets == [1, 3] and stage.codec.batch_buckets == [1, 3]
    assert stage.codec.compile_frames == {4}  # only the steady chunk length would compile
    _assert_same(_by_job(run(make_stage(model_dir, graphs=False), _jobs())), _by_job(run(stage, _jobs())))


# --------------------------------------------------------------------------- layer functions


def test_compile_off_is_the_plain_function():
    assert maybe_compile(attn_prep, False) is attn_prep


def test_compiled_regions_trace_as_single_graphs(model_dir, monkeypatch):
    """Each region a GPU compiles (predictor sub-step, talker decode layer, code2wav chunk)
    traces into one Dynamo graph: a graph break would split the captured step into more
    kernels (Dynamo's eager backend on the CPU, fullgraph=True fails on any break)."""
    import voxline.engines.models.qwen3_tts.graphed_code2wav as code2wav_mod
    import voxline.engines.models.qwen3_tts.graphed_talker as talker_mod

    def full(fn, enabled):
        return torch.compile(fn, backend="eager", dynamic=False, fullgraph=True) if enabled else fn

    monkeypatch.setattr(talker_mod, "maybe_compile", full)
    monkeypatch.setattr(code2wav_mod, "maybe_compile", full)
    stage = make_stage(model_dir, graphs=True)
    torch._dynamo.reset()
    try:
        gen = GraphedTalkerGenerator(stage.model.talker, max_streams=4, max_len=256, capture=False, compile=True)
        gen.frame_steps.get((2, gen.predictor_top_k_cap))()
        gen.decode_steps.get((2, 64))()
        codec = GraphedCode2Wav(stage.decoder, max_streams=4, max_frames=4, capture=False, compile=True)
        codec.steps.get((2, 4))()
    finally:
        torch._dynamo.reset()


def test_layer_functions_equal_the_decoder_layer(model_dir):
    """attn_prep + cache write + attn_mlp (the compiled unit on a GPU) == DecoderLayer."""
    talker = make_stage(model_dir).model.talker
    cfg = talker.config
    g = torch.Generator().manual_seed(3)
    for layer in (talker.model.layers[0], talker.code_predictor.model.layers[-1]):
        width = layer.input_layernorm.weight.shape[0]
        past = torch.randn(2, layer.self_attn.num_kv_heads, 3, layer.self_attn.head_dim, generator=g)
        x = torch.randn(2, 2, width, generator=g)
        pos = torch.tensor([[3, 4], [3, 4]])
        k_pos = torch.arange(5).expand(2, 5)
        mask = position_mask(pos, k_pos)
        rope = talker.rope if width == cfg.hidden_size else talker.code_predictor.rope
        cos, sin = rope(pos, x.dtype)

        def kv(_: int, k: torch.Tensor, v: torch.Tensor, past: torch.Tensor = past) -> tuple:
            return torch.cat((past, k), dim=2), torch.cat((past, v), dim=2)

        with torch.inference_mode():
            want = layer(x, cos, sin, mask, kv)
            prep_w, post_w = layer_args(layer)
            q, k, v = attn_prep(x, pos, rope.inv_freq, *prep_w)
            got = attn_mlp(x, q, torch.cat((past, k), 2), torch.cat((past, v), 2), mask, *post_w)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- code2wav


def test_graphed_code2wav_equals_decode_batch_with_padding_and_slot_reuse(model_dir):
    dec = make_stage(model_dir).decoder
    q = dec.config.num_quantizers
    g = torch.Generator().manual_seed(4)
    codes = [torch.randint(0, dec.config.codebook_size, (q, 7), generator=g) for _ in range(3)]
    chunks = [(0, 1), (1, 4), (4, 7)]  # first chunk, a full one, the remainder
    codec = GraphedCode2Wav(dec, max_streams=4, max_frames=4, batch_buckets=[4])
    states = [dec.new_state() for _ in codes]
    slots = [codec.open() for _ in codes]
    for a, b in chunks:
        want = dec.decode_batch(states, [c[:, a:b] for c in codes])
        got = codec.decode(slots, [c[:, a:b] for c in codes])  # 3 streams padded to 4
        for w, o in zip(want, got, strict=True):
            torch.testing.assert_close(o, w, atol=1e-5, rtol=1e-5)
    # Mixed chunk lengths in one call, and a released slot that a new stream reuses fresh.
    codec.release(slots[1])
    while (reused := codec.open()) != slots[1]:  # the released slot comes back last
        pass
    fresh = dec.decode(dec.new_state(), codes[1][:, :2])
    more = dec.decode_batch([states[0]], [codes[0][:, :3]])[0]
    got = codec.decode([reused, slots[0]], [codes[1][:, :2], codes[0][:, :3]])
    torch.testing.assert_close(got[0], fresh, atol=1e-5, rtol=1e-5)  # the old state was reset
    torch.testing.assert_close(got[1], more, atol=1e-5, rtol=1e-5)


def test_prefill_graph_equals_eager_prefill(model_dir):
    """Padded prompt buckets (graph path) and exact eager prefill give the same audio."""
    bucketed = _by_job(run(make_stage(model_dir, graphs=True), _jobs()))
    exact = make_stage(model_dir, graphs=True)
    exact.generator.prefill_buckets = []
    _assert_same(bucketed, _by_job(run(exact, _jobs())))


def test_the_graph_step_functions_need_no_host_value(model_dir):
    """What CUDA-graph capture needs, checked on the eager twins: no host reads inside the
    talker's frame, decode and prefill steps or code2wav's."""
    from host_sync import no_host_sync

    stage = make_stage(model_dir, graphs=True)
    run(stage, _jobs())  # every kind of step made, with real inputs last
    gen = stage.generator
    groups = [gen.frame_steps, gen.decode_steps, gen.prefill_steps, stage.chunks.codec.steps]
    steps = [s for group in groups for s in group.steps.values()]
    assert len(steps) >= 4
    for step in steps:
        with torch.inference_mode(), no_host_sync():  # as StaticStep runs it
            step.fn(**step.inputs)
