"""Round-4 pieces of the Qwen3-TTS GPU path, each against the function it replaces.

- code2wav overlapped with the next talker step (``overlap_codec``): the same chunks,
  audio and texts per job as decoding in the step that made the frames; first chunks
  still leave in that step, later ones one step later; joins, streamed text and cancels;
- the code predictor's top-k sampling (``max_top_k``): the same picks as the full sort;
- the small-row linear kernel: ``F.linear`` off CUDA (the CPU twin is bit-identical),
  and on CUDA within bf16 rounding of a float64 reference (skipped without CUDA).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_qwen3_tts_graphs import _assert_same, _by_job, _jobs
from test_qwen3_tts_stage import TEXTS, make_stage, of, run, write_test_checkpoint

from voxline.engines.models.qwen3_tts import TalkerSampling
from voxline.engines.models.qwen3_tts.graphed_talker import GraphedTalkerGenerator
from voxline.engines.speech_model import SpeechJob
from voxline.kernels import gemv
from voxline.kernels.sampling import sample_rows

pytestmark = pytest.mark.usefixtures("one_torch_thread")

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_test_checkpoint(tmp_path_factory.mktemp("qwen3-gpu-path") / "model")


def _steps(outs, job_id: int) -> list[int]:
    return [i for i, o in outs if o.job_id == job_id]


def _merged_end(outs, job_id: int) -> list:
    """A job's outputs with an empty finishing output folded into the chunk before it:
    when the talker stops on codec EOS right after a chunk was due, the overlapped stage
    marks that (deferred) chunk finished instead of sending an empty output after it."""
    got = [(i, o) for i, o in outs if o.job_id == job_id]
    if len(got) > 1 and got[-1][1].finished and len(got[-1][1].audio) == 0:
        (i, last), (_, end) = got[-2], got[-1]
        got[-2:] = [(i, type(last)(job_id, last.audio, last.sample_rate,
                                   " ".join(t for t in (last.text, end.text) if t), True))]
    return got


def _assert_same_speech(plain, over) -> None:
    """Same jobs, chunks (lengths and audio), texts and finish; first audio in the same
    step and every later output at most one step later."""
    ids = {o.job_id for _, o in plain}
    assert ids == {o.job_id for _, o in over}
    for job_id in ids:
        a, b = _merged_end(plain, job_id), _merged_end(over, job_id)
        assert [len(o.audio) for _, o in a] == [len(o.audio) for _, o in b], job_id
        assert [(o.text, o.finished) for _, o in a] == [(o.text, o.finished) for _, o in b], job_id
        for (_, x), (_, y) in zip(a, b, strict=True):
            np.testing.assert_allclose(x.audio, y.audio, atol=1e-5, err_msg=f"job {job_id}")
        assert a[0][0] == b[0][0], "first audio leaves in the step that made its frame"
        assert all(0 <= j - i <= 1 for (i, _), (j, _) in zip(a, b, strict=True)), job_id


# --------------------------------------------------------------------------- overlap


@pytest.mark.parametrize("cancel", [False, True])
def test_overlapped_code2wav_gives_the_same_chunks(model_dir, cancel):
    """Joins at different steps (one stream padded into a bucket), codec EOS and the frame
    limit, a cancel: per job the same chunks, audio, texts and finish as in-step decoding;
    first audio in the same step, every later chunk at most one step later."""
    cancels = {6: [2]} if cancel else {}
    kw = dict(graphs=True, initial_chunk_frames=1)
    plain = run(make_stage(model_dir, overlap_codec=False, **kw), _jobs(), cancels)
    stage = make_stage(model_dir, overlap_codec=True, **kw)
    assert stage.overlap_codec and stage.codec is not None
    over = run(stage, _jobs(), cancels)
    if cancel:  # the cancelled job gets a prefix of its chunks (deferred ones are dropped)
        a, b = of(plain, 2), of(over, 2)
        assert 0 < len(b) <= len(a) and not any(o.finished for o in b)
        for x, y in zip(a, b, strict=False):
            np.testing.assert_array_equal(x.audio, y.audio)
        plain = [(i, o) for i, o in plain if o.job_id != 2]
        over = [(i, o) for i, o in over if o.job_id != 2]
    _assert_same_speech(plain, over)
    assert any(j == i + 1 for job_id in {o.job_id for _, o in plain}
               for (i, _), (j, _) in zip(_merged_end(plain, job_id), _merged_end(over, job_id),
                                         strict=True)), "later chunks did move"
    assert sorted(stage.codec._free) == sorted(range(stage.codec.scratch))  # every slot back


def test_overlapped_code2wav_with_streamed_text(model_dir):
    """A job fed text while it speaks (waits for text, then resumes): same audio and texts."""
    results = []
    for overlap in (False, True):
        stage = make_stage(model_dir, graphs=True, overlap_codec=overlap)
        stage.start(SpeechJob(1, "Hello there,", more_text=True))
        stage.start(SpeechJob(2, TEXTS[1]))
        outs = []
        for i in range(400):
            if i == 6:
                stage.append_text(1, "how are you today?")
            if i == 30:
                stage.end_text(1)
            if i > 30 and not stage.has_work():
                break
            if stage.has_work():
                outs += [(i, o) for o in stage.step()]
        results.append(outs)
    # Text arriving between steps may cut the chunks differently (a stream waiting for
    # text decodes what it has); the speech and its texts are the same.
    a, b = (_by_job(r) for r in results)
    assert a.keys() == b.keys()
    for job_id in a:
        np.testing.assert_allclose(a[job_id][0], b[job_id][0], atol=1e-5)
        assert [f for f in a[job_id][1] if f] == [f for f in b[job_id][1] if f] == [True]
        assert " ".join(t for t in a[job_id][2] if t) == " ".join(t for t in b[job_id][2] if t)
    assert of(results[1], 1)[-1].finished and len(_by_job(results[1])[1][0]) > 0


def test_a_failed_overlapped_step_drops_every_job(model_dir):
    stage = make_stage(model_dir, graphs=True, overlap_codec=True)
    stage.start(SpeechJob(1, TEXTS[0]))
    stage.start(SpeechJob(2, TEXTS[1]))
    for _ in range(4):
        stage.step()
    step = stage.generator.step
    stage.generator.step = lambda streams: 1 / 0  # type: ignore[method-assign]
    with pytest.raises(ZeroDivisionError):
        stage.step()  # fails after this step's chunks were handed to code2wav
    assert not stage.has_work() and not stage._jobs
    stage.generator.step = step  # type: ignore[method-assign]
    assert sorted(stage.codec._free) == sorted(range(stage.codec.scratch))
    assert of(run(stage, {0: [SpeechJob(3, TEXTS[0])]}), 3)[-1].finished


# --------------------------------------------------------------------------- top-k sampling


def _rows(b: int, vocab: int, k: list[int], temp: list[float], p: list[float], seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, vocab, generator=g) * 3, torch.tensor(temp), torch.tensor(k),
            torch.tensor(p), torch.arange(b, dtype=torch.int64) * 7 + 3)


def test_topk_ranking_picks_what_the_full_sort_picks():
    b, vocab = 8, 2048
    logits, temp, k, p, seed = _rows(b, vocab, [50, 1, 64, 10, 50, 33, 2, 50],
                                     [0.9, 0.9, 1.3, 0.0, 0.7, 1.0, 0.9, 0.9],
                                     [1.0, 1.0, 1.0, 1.0, 0.8, 0.3, 1.0, 0.95])
    for counter in range(0, 400, 16):
        c = torch.full((b,), counter)
        full = sample_rows(logits, temp, k, p, seed, c)
        assert torch.equal(sample_rows(logits, temp, k, p, seed, c, max_top_k=64), full)
    # Padding rows (greedy) keep the greedy pick whatever their top-k.
    k[3] = 0
    assert int(sample_rows(logits, temp, k, p, seed, c, max_top_k=64)[3]) == int(logits[3].argmax())


def test_predictor_top_k_cap_gives_the_same_audio(model_dir):
    sampling = TalkerSampling(min_frames=2)
    sorted_all = make_stage(model_dir, graphs=True, sampling=sampling)
    sorted_all.generator = GraphedTalkerGenerator(sorted_all.model.talker, max_streams=4, max_len=256,
                                                  predictor_top_k_cap=0)
    capped = make_stage(model_dir, graphs=True, sampling=sampling)
    assert capped.generator.predictor_top_k_cap == 64
    got = run(capped, _jobs(seed=5))
    assert set(capped.generator.frame_steps.steps) <= {(b, 64) for b in capped.generator.batch_buckets}
    _assert_same(_by_job(run(sorted_all, _jobs(seed=5))), _by_job(got))
    assert set(sorted_all.generator.frame_steps.steps) <= {(b, 0) for b in (1, 2, 4)}


def test_a_top_k_past_the_cap_sorts_the_whole_vocabulary(model_dir):
    stage = make_stage(model_dir, graphs=True, sampling=None, temperature=0.9, top_k=0)
    assert stage.generator.predictor_top_k_cap == 0
    run(stage, {0: [SpeechJob(1, TEXTS[0], seed=1)]})
    assert {cap for _, cap in stage.generator.frame_steps.steps} == {0}


# --------------------------------------------------------------------------- small linear


def test_small_linear_is_f_linear_off_cuda():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 256, generator=g).bfloat16()
    w = torch.randn(96, 256, generator=g).bfloat16()
    b = torch.randn(96, generator=g).bfloat16()
    assert not gemv.gemv_available(x, w)
    assert torch.equal(gemv.small_linear(x, w, b), F.linear(x, w, b))


def test_split_fills_the_chip_with_whole_blocks():
    for n, k in ((6144, 1024), (4096, 1024), (1024, 2048), (1024, 3072), (2048, 1024), (12288, 2048),
                 (2048, 6144)):
        split = gemv.split_for(n, k)
        programs = -(-n // gemv.BLOCK_N) * split
        assert k % (split * gemv.BLOCK_K) == 0 and split & (split - 1) == 0
        assert programs <= gemv.TARGET_PROGRAMS or split == 1
        assert programs * 2 > gemv.TARGET_PROGRAMS or k % (2 * split * gemv.BLOCK_K), (n, k, split)


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 2, 10, 17, 64])
def test_small_linear_matches_a_float64_reference_on_cuda(dtype, rows):
    g = torch.Generator(device="cuda").manual_seed(rows)
    for n, k in ((6144, 1024), (1024, 3072), (100, 256)):
        x = torch.randn(rows, k, device="cuda", generator=g).to(dtype)
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.05).to(dtype)
        b = torch.randn(n, device="cuda", generator=g).to(dtype)
        assert gemv.gemv_available(x, w)
        got = gemv.small_linear(x, w, b)
        ref = F.linear(x.double(), w.double(), b.double())
        assert got.dtype == dtype and got.shape == (rows, n)
        rel = float((got.double() - ref).norm() / ref.norm())
        base = float((F.linear(x, w, b).double() - ref).norm() / ref.norm())  # cuBLAS
        assert rel < 1e-2 and rel <= 2 * base + 1e-4, (n, k, rel, base)


@cuda
def test_overlapped_code2wav_gives_the_same_audio_on_cuda(tmp_path):
    """The CUDA streams for real: bf16 talker, graphs captured, codec on its own stream."""
    model_dir = write_test_checkpoint(tmp_path / "model")
    kw = dict(graphs=True, device="cuda", dtype=torch.bfloat16, initial_chunk_frames=1, compile=False)
    a = run(make_stage(model_dir, overlap_codec=False, **kw), _jobs())
    b = run(make_stage(model_dir, overlap_codec=True, **kw), _jobs())
    _assert_same_speech(a, b)
