"""Moonshine base-en through torch (the GPU ASR's eager twin, run here on the CPU): the
shipped weights read out of the ORT files must give onnxruntime's results."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch
from speech import espeak

from voxline.config import Settings
from voxline.engines.asr_stage import ASRJob, ASRStage, BatchASRModel
from voxline.engines.factory import load_asr
from voxline.engines.models import moonshine_torch
from voxline.engines.models.moonshine_asr import BOS_ID, EOS_ID, MoonshineASR, token_budget
from voxline.engines.models.moonshine_decoder import StaticDecoder
from voxline.engines.models.moonshine_encoder import conv_counts, samples_for
from voxline.engines.models.moonshine_torch import (
    MoonshineTorchASR,
    build_model,
    shipped_state_dict,
)
from voxline.engines.models.whisper_asr import TranscriptionOptions
from voxline.engines.sizing import gpu_footprints

DEFAULT = TranscriptionOptions()


@pytest.fixture(scope="module")
def state() -> dict[str, torch.Tensor]:
    return shipped_state_dict()


@pytest.fixture(scope="module")
def asr(state: dict[str, torch.Tensor]) -> MoonshineTorchASR:
    from voxline.engines.models.moonshine_asr import MoonshineTokenizer, shipped_model_dir

    tokenizer = MoonshineTokenizer.from_file(shipped_model_dir() / "tokenizer.bin")
    return MoonshineTorchASR(build_model(state), tokenizer, max_batch=4)


@pytest.fixture(scope="module")
def reference() -> MoonshineASR:
    return MoonshineASR.load()


@pytest.fixture(scope="module")
def clips() -> list[np.ndarray]:
    return [espeak("What is the capital of France?"),
            espeak("Please set a timer for ten minutes and turn off the kitchen lights."),
            espeak("Good morning.")]


def test_it_is_a_batched_model_for_the_stage(asr: MoonshineTorchASR) -> None:
    assert isinstance(asr, BatchASRModel) and ASRStage(asr).max_batch() == 4


def test_encoder_and_logits_match_onnxruntime(asr: MoonshineTorchASR, reference: MoonshineASR,
                                              clips: list[np.ndarray]) -> None:
    """Same encoder states and teacher-forced logits as the ORT graphs, to float rounding."""
    for clip in clips[:2]:
        ours = asr.encode(clip)
        theirs = reference.encode(clip)
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours.numpy(), theirs, atol=1e-4)
        ids = [BOS_ID, *reference.decode(theirs, reference.max_tokens(len(clip)))]
        logits = asr.logits_of(ours, ids).numpy()
        feed = {"input_ids": np.array([ids], np.int64), "encoder_hidden_states": theirs,
                "use_cache_branch": np.array([False])}
        for name in reference._past_names:
            feed[name] = np.zeros((1, reference._heads, 0, reference._head_dim), np.float32)
        (ort_logits,) = reference.decoder.run(["logits"], feed)
        np.testing.assert_allclose(logits, ort_logits[0], atol=2e-3)
        assert (logits.argmax(-1) == ort_logits[0].argmax(-1)).all()


def test_a_batch_encodes_each_clip_as_alone(asr: MoonshineTorchASR,
                                            clips: list[np.ndarray]) -> None:
    """Padded clips with the GroupNorm and attention masked get their own states."""
    states, frames = asr.encode_many(clips)
    assert states.shape[0] == 3 and states.shape[1] == max(frames)
    for clip, state, n in zip(clips, states, frames, strict=True):
        alone = asr.encode(clip)[0]
        assert alone.shape[0] == n
        torch.testing.assert_close(state[:n], alone, atol=1e-4, rtol=0)


def test_a_frame_buckets_samples_are_the_fewest_that_give_its_frames() -> None:
    for frames in (1, 64, 128, 512, 768):
        assert conv_counts(samples_for(frames))[1] == frames
        assert conv_counts(samples_for(frames) - 1)[1] == frames - 1


def test_the_bucketed_encoder_gives_encode_manys_states(asr: MoonshineTorchASR,
                                                        clips: list[np.ndarray]) -> None:
    """The static-buffer encoder (a graph per bucket on a GPU; here its eager twin) pads
    rows and samples to a bucket; each clip's own frames are encode_many's."""
    want, frames = asr.encode_many(clips)
    assert asr.encoder.keys() == [(r, f) for r in (1, 2, 4) for f in (64, 128, 256, 384, 512)]
    for batch in (clips, clips[1:2]):  # 3 rows in a 4-row bucket (one padding row); 1 row
        got, got_frames = asr.encoder.run(batch)
        idx = [i for i, c in enumerate(clips) if any(c is b for b in batch)]
        assert got_frames == [frames[i] for i in idx]
        assert got.shape[0] == len(batch) and got.shape[1] in asr.encoder.frame_buckets
        assert got.shape[1] >= max(got_frames) and torch.isfinite(got).all()
        for row, i in zip(got, idx, strict=True):
            torch.testing.assert_close(row[:frames[i]], want[i, :frames[i]], atol=1e-4, rtol=0)
    assert asr.encoder.fits(4, samples_for(512)) and not asr.encoder.fits(5, 16000)
    assert not asr.encoder.fits(1, samples_for(512) + 1)
    with pytest.raises(ValueError, match="past the encoder's buckets"):
        asr.encoder.run([np.zeros(samples_for(512) + 1, np.float32)])


def test_batched_transcripts_are_onnxruntimes(asr: MoonshineTorchASR, reference: MoonshineASR,
                                              clips: list[np.ndarray]) -> None:
    """Clips of different lengths decoded in one batch give each clip's own transcript,
    the ORT model's, in order; a clip under 0.1 s is ""."""
    batch = [clips[0], np.zeros(400, np.float32), clips[1], clips[2]]
    texts = asr.transcribe_many(batch, [DEFAULT] * len(batch))
    assert texts == [reference.transcribe(c) for c in batch]
    assert "capital" in texts[0].lower() and "kitchen" in texts[2].lower() and texts[1] == ""
    assert [asr.transcribe(c) for c in batch] == texts
    assert asr.transcribe_many([], []) == []


def test_a_batch_past_the_buckets_decodes_the_same(asr: MoonshineTorchASR,
                                                   clips: list[np.ndarray]) -> None:
    """More rows, frames or tokens than the largest bucket: buffers of the batch's own size,
    the same tokens as the bucketed decoder (whose buckets pad rows and frames)."""
    small = StaticDecoder(asr.model.model.decoder, asr.model.proj_out, rows=2, frames=(64,),
                          positions=16, capture=False)
    assert small.keys() == [(1, 64), (2, 64)]
    states, frames = asr.encode_many(clips)
    valid = asr._valid(frames, states.shape[1])
    budgets = [token_budget(len(c)) for c in clips]
    assert not small.fits(3, states.shape[1], max(budgets) + 1)
    ours = small.decode(states, valid, budgets, bos=BOS_ID, eos=EOS_ID)
    assert ours == asr.decoder.decode(states, valid, budgets, bos=BOS_ID, eos=EOS_ID)
    assert [asr.tokenizer.decode(t) for t in ours] == asr.transcribe_many(clips, [DEFAULT] * 3)
    short = [[t[:2] for t in ours]]  # a budget of 2 tokens cuts every row there
    assert small.decode(states, valid, [2, 2, 2], bos=BOS_ID, eos=EOS_ID) == short[0]


def test_the_stage_runs_a_plan_through_it(asr: MoonshineTorchASR, clips: list[np.ndarray]) -> None:
    stage = ASRStage(asr)
    for i, clip in enumerate(clips):
        stage.add(ASRJob(stream_id=i, item_id=f"item_{i}", audio=clip, final=True))
    plan = stage.schedule()
    assert plan is not None and len(plan) == 3
    texts = stage.update(plan, stage.execute(plan))
    assert "france" in texts[0].lower() and "kitchen" in texts[1].lower()


def test_options_it_cannot_honour_are_refused(asr: MoonshineTorchASR,
                                              clips: list[np.ndarray]) -> None:
    with pytest.raises(ValueError, match="'fr'.*English only"):
        asr.transcribe_many([clips[2]], [TranscriptionOptions(language="fr")])
    with pytest.raises(ValueError, match="no transcription prompt"):
        asr.transcribe_many([clips[2]], [TranscriptionOptions(prompt="hello")])
    with pytest.raises(ValueError, match="2 clips but 1 options"):
        asr.transcribe_many(clips[:2], [DEFAULT])
    with pytest.raises(ValueError, match="1-D"):
        asr.transcribe(np.zeros((2, 16000), np.float32))
    assert asr.transcribe_many([clips[2]], [TranscriptionOptions(language="en")]) != [""]


def test_every_parameter_is_read_from_the_files(state: dict[str, torch.Tensor]) -> None:
    assert len(state) > 100 and "model.decoder.layers.7.mlp.fc1.weight" in state
    assert state["model.decoder.layers.0.self_attn.q_proj.weight"].shape == (416, 416)
    partial = dict(state)
    del partial["model.encoder.layers.3.self_attn.o_proj.weight"]
    with pytest.raises(ValueError, match="missing.*layers.3.self_attn.o_proj"):
        build_model(partial)


def test_the_weights_are_read_once_into_the_cache(tmp_path, monkeypatch,
                                                  state: dict[str, torch.Tensor]) -> None:
    fresh = shipped_state_dict(cache_dir=tmp_path)
    [entry] = (tmp_path / "moonshine").glob("base-en.torch-*.safetensors")
    assert fresh.keys() == state.keys()
    assert all(torch.equal(fresh[k], state[k]) for k in state)

    def no_reading(*_: object) -> None:
        raise AssertionError("read the ORT files again")

    monkeypatch.setattr(moonshine_torch, "ort_to_onnx", no_reading)
    cached = shipped_state_dict(cache_dir=tmp_path)
    assert all(torch.equal(cached[k], state[k]) for k in state)
    stale = entry.with_name("base-en.torch-0123456789abcdef.safetensors")
    stale.write_bytes(b"an older install's copy")
    os.utime(stale, (time.time() - 2 * 86400,) * 2)
    entry.unlink()
    monkeypatch.undo()
    shipped_state_dict(cache_dir=tmp_path)  # read again, the stale copy removed
    assert [p.name for p in (tmp_path / "moonshine").iterdir()] == [entry.name]


def test_a_gpu_asr_without_a_gpu_or_with_workers_is_refused() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="asr_device=cuda, but this machine has no CUDA GPU"):
        load_asr(Settings(asr_device="cuda"), threads=1)
    with pytest.raises(ValueError, match="asr_workers=4 applies to Moonshine on the CPU"):
        load_asr(Settings(asr_device="cuda", asr_workers=4), threads=1)


def test_its_memory_is_counted_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    on, _ = gpu_footprints(Settings(asr_device="cuda"))
    assert on["cuda:0"].parts == ("ASR",) and on["cuda:0"].weights > 61_000_000 * 4


def test_the_graph_step_functions_need_no_host_value(asr: MoonshineTorchASR,
                                                     clips: list[np.ndarray]) -> None:
    """What CUDA-graph capture needs, checked on the eager twins: no host reads inside
    the encoder's or the decoder's step (the clips' counts and tokens are device values)."""
    from host_sync import no_host_sync

    asr.encoder.run(clips)  # real inputs in the static buffers
    for step in (asr.encoder.steps.get((4, 128)), asr.decoder.steps.get((4, 128))):
        with torch.inference_mode(), no_host_sync():  # as StaticStep runs it
            step.fn(**step.inputs)


def test_encoder_graphs_that_fail_to_capture_leave_the_encoder_eager(
        state: dict[str, torch.Tensor], clips: list[np.ndarray], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from voxline.engines.models.moonshine_asr import MoonshineTokenizer, shipped_model_dir
    from voxline.kernels.cuda_graphs import BucketedSteps

    tokenizer = MoonshineTokenizer.from_file(shipped_model_dir() / "tokenizer.bin")
    asr = MoonshineTorchASR(build_model(state), tokenizer, max_batch=2)
    want = asr.transcribe_many(clips[:2], [DEFAULT] * 2)

    def fail(self, keys, **options):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(BucketedSteps, "prepare", fail)
    with caplog.at_level("WARNING"):
        asr.prepare_encoder()
    assert asr.encoder is None and "runs eagerly" in caplog.text
    assert asr.transcribe_many(clips[:2], [DEFAULT] * 2) == want


def test_scored_tokens_match_onnxruntime(asr: MoonshineTorchASR, reference: MoonshineASR,
                                         clips: list[np.ndarray]) -> None:
    """Token log-probabilities from the static decoder's steps (the batched torch path)
    agree with onnxruntime's, token for token."""
    ours = asr.transcribe_many_scored(clips, [DEFAULT] * len(clips))
    for clip, scored in zip(clips, ours, strict=True):
        want = reference.transcribe_scored(clip)
        assert scored.text == want.text
        assert [t.token for t in scored.tokens] == [t.token for t in want.tokens]
        assert [t.logprob for t in scored.tokens] == pytest.approx(
            [t.logprob for t in want.tokens], abs=2e-3)
