"""Qwen3SpeechModel: the Qwen3-TTS talker + code2wav as the engine's speech stage.

The checkpoint here is built in-process from voxline's own modules with seeded RANDOM
weights and written in the official layout, with a tiny byte-level BPE tokenizer: it
exercises streaming, batching, seeding and cancel exactly, but its audio is noise, not
a voice (its config.json is marked so, and the stage logs it). No reference venv needed.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TIME_FACTOR
from fakes import CountingLM, EnergyVAD, FixedASR
from qwen_ref.harness import TINY_CODEC, TINY_MODEL, local_decoder, local_talker
from safetensors.torch import save_file

from voxline.codecs.tempo import time_stretch
from voxline.config import load_settings
from voxline.engines import protocol as p
from voxline.engines.core import EngineCore, Models
from voxline.engines.models.qwen3_tts import TalkerGenerator, TalkerSampling
from voxline.engines.models.qwen3_tts.speech_model import RANDOM_WEIGHTS_KEY, Qwen3SpeechModel
from voxline.engines.speech_model import SpeechJob, SpeechOut
from voxline.errors import ModelUnavailableError

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tts_pad>", "<tts_text_bos>",
            "<tts_text_eod>"]  # ids 0..5
TEXT_VOCAB = 320  # 6 specials + 256 byte symbols + merges
# Scales the codec-EOS row of the head so that, greedy, TEXTS stop after 8, 40+, 40+ and
# 15 frames: some jobs end on codec EOS, others at max_frames.
EOS_GAIN = 1.3
TEXTS = ["Hello there, how are you today?", "The quick brown fox.", "Fine, thank you!",
         "A longer sentence about the lazy dog and the brown fox."]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TEXT_VOCAB, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["assistant user\n"] * 50 + TEXTS * 5, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>", additional_special_tokens=SPECIALS[1:])


def write_test_checkpoint(model_dir: Path, model: dict = TINY_MODEL, codec: dict = TINY_CODEC,
                          seed: int = 2) -> Path:
    """A random-weight checkpoint in the official layout (talker, codec decoder, tokenizer)."""
    model = copy.deepcopy(model)
    model["talker_config"]["text_vocab_size"] = TEXT_VOCAB
    model.update(im_start_token_id=1, im_end_token_id=2, tts_pad_token_id=3, tts_bos_token_id=4,
                 tts_eos_token_id=5)
    model[RANDOM_WEIGHTS_KEY] = True
    config, talker = local_talker(model, seed=seed)
    with torch.no_grad():
        talker.codec_head.weight[config.talker.codec_eos_token_id] *= EOS_GAIN
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(model))
    save_file({f"talker.{k}": v.contiguous() for k, v in talker.state_dict().items()},
              model_dir / "model.safetensors")
    codec_dir = model_dir / "speech_tokenizer"
    codec_dir.mkdir(exist_ok=True)
    (codec_dir / "config.json").write_text(json.dumps(codec))
    decoder = local_decoder(codec, seed=seed + 1)
    save_file({f"decoder.{k}": v.contiguous() for k, v in decoder.state_dict().items()},
              codec_dir / "model.safetensors")
    _tokenizer().save_pretrained(model_dir)
    return model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_test_checkpoint(tmp_path_factory.mktemp("qwen3-stage") / "model")


def make_stage(model_dir: Path, **kwargs) -> Qwen3SpeechModel:
    args = dict(initial_chunk_frames=2, chunk_frames=4, max_streams=4, max_len=256, max_frames=24,
                sampling=TalkerSampling.greedy())
    args.update(kwargs)
    return Qwen3SpeechModel(model_dir, **args)  # type: ignore[arg-type]


def run(stage: Qwen3SpeechModel, schedule: dict[int, list[SpeechJob]] | None = None,
        cancels: dict[int, list[int]] | None = None, max_steps: int = 500) -> list[tuple[int, SpeechOut]]:
    """Step until idle; jobs start / cancel before the step of their index."""
    schedule, cancels = schedule or {}, cancels or {}
    outs: list[tuple[int, SpeechOut]] = []
    for i in range(max_steps):
        for job in schedule.get(i, []):
            stage.start(job)
        for job_id in cancels.get(i, []):
            stage.cancel(job_id)
        if not stage.has_work() and i > max(schedule, default=0):
            return outs
        if stage.has_work():
            outs += [(i, o) for o in stage.step()]
    raise AssertionError("stage did not finish")


def of(outs: list[tuple[int, SpeechOut]], job_id: int) -> list[SpeechOut]:
    return [o for _, o in outs if o.job_id == job_id]


def audio(outs: list[SpeechOut]) -> np.ndarray:
    return np.concatenate([o.audio for o in outs])


# --------------------------------------------------------------------------- streaming


@pytest.mark.parametrize("initial,text", [(1, TEXTS[1]), (2, TEXTS[3])], ids=["length", "eos"])
def test_streamed_chunks_equal_full_decode_of_the_generated_frames(model_dir, initial, text):
    stage = make_stage(model_dir, initial_chunk_frames=initial)
    assert stage.random_weights and stage.sample_rate == 24000
    job = SpeechJob(1, text)
    outs = run(stage, {0: [job]})
    got = [o for _, o in outs]
    spf = stage.samples_per_frame
    assert got[0].text == job.text and all(o.text == "" for o in got[1:])
    assert [o.finished for o in got] == [False] * (len(got) - 1) + [True]
    assert all(o.sample_rate == 24000 and o.audio.dtype == np.float32 for o in got)
    # First audio right after the prefill step and `initial` frame steps.
    assert outs[0][0] == initial
    assert len(got[0].audio) == initial * spf
    assert all(len(o.audio) == 4 * spf for o in got[1:-1])
    assert len(got[-1].audio) <= 4 * spf

    prompt, sampling = stage.prepare(job)  # type: ignore[misc]
    gen = TalkerGenerator(stage.model.talker, max_streams=1, max_len=256)
    (frames,) = gen.generate([prompt], sampling)
    full = stage.decoder.decode_full(frames.T).numpy()
    streamed = audio(got)
    assert (len(frames) == 24) == (text == TEXTS[1]), "one case per way of stopping"
    assert streamed.shape == full.shape == (len(frames) * spf,)
    assert np.abs(streamed - full).max() <= 1e-4
    assert np.abs(full).max() > 1e-3  # not silence: the comparison means something


def test_ramp_grows_chunks_up_to_chunk_frames(model_dir):
    stage = make_stage(model_dir, initial_chunk_frames=1, chunk_frames=4, ramp=True)
    got = of(run(stage, {0: [SpeechJob(1, TEXTS[1])]}), 1)
    frames = [len(o.audio) // stage.samples_per_frame for o in got]
    assert frames[:5] == [1, 1, 2, 4, 4] and sum(frames) == 24


def test_a_failed_step_drops_every_job(model_dir):
    stage = make_stage(model_dir)
    stage.start(SpeechJob(1, TEXTS[0]))
    stage.start(SpeechJob(2, TEXTS[1]))
    stage.step()
    decode_batch = stage.decoder.decode_batch
    stage.decoder.decode_batch = lambda *a: 1 / 0  # type: ignore[method-assign]
    with pytest.raises(ZeroDivisionError):
        for _ in range(5):
            stage.step()
    assert not stage.has_work()
    stage.decoder.decode_batch = decode_batch  # type: ignore[method-assign]
    assert of(run(stage, {0: [SpeechJob(3, TEXTS[0])]}), 3)[-1].finished


def test_jobs_joining_at_different_steps_equal_each_alone(model_dir):
    stage = make_stage(model_dir)
    decode_batches: list[int] = []
    decode = stage.decoder.decode

    def counting_decode(state, codes):
        decode_batches.append(codes.shape[0] if codes.dim() == 3 else 1)
        return decode(state, codes)

    stage.decoder.decode = counting_decode  # type: ignore[method-assign]
    jobs = [SpeechJob(i + 1, TEXTS[k]) for i, k in enumerate((1, 3, 0))]
    # Starts chosen so chunk boundaries line up: code2wav runs some chunks batched.
    together = run(stage, {0: [jobs[0]], 4: [jobs[1]], 8: [jobs[2]]})
    steps = {o.job_id: [] for _, o in together}
    for i, o in together:
        steps[o.job_id].append(i)
    assert steps[1][0] < steps[2][0] < steps[3][0] < min(steps[1][-1], steps[2][-1])
    assert max(decode_batches) == 3
    finished_by = []
    for job in jobs:
        alone = of(run(stage, {0: [job]}), job.job_id)
        batched = of(together, job.job_id)
        assert [len(o.audio) for o in batched] == [len(o.audio) for o in alone]
        assert np.abs(audio(batched) - audio(alone)).max() <= 1e-5
        finished_by.append(len(audio(alone)) // stage.samples_per_frame)
    assert not stage.has_work()
    # The tiny model stops on codec EOS for some texts and at max_frames for others.
    assert len(set(finished_by)) > 1


def test_seeds_are_deterministic_and_independent_of_the_batch(model_dir):
    stage = make_stage(model_dir, sampling=None, temperature=0.9, top_k=50)
    text = TEXTS[3]
    outs = run(stage, {0: [SpeechJob(1, text, seed=7), SpeechJob(2, text, seed=7),
                           SpeechJob(3, text, seed=8)]})
    alone = run(stage, {0: [SpeechJob(4, text, seed=7)]})
    a, b, c, d = audio(of(outs, 1)), audio(of(outs, 2)), audio(of(outs, 3)), audio(of(alone, 4))
    assert np.array_equal(a, b) and len(a) > 0
    assert len(a) == len(d) and np.abs(a - d).max() <= 1e-5
    assert len(a) != len(c) or not np.allclose(a, c)


def test_cancel_stops_a_job_frees_its_slot_and_leaves_others_alone(model_dir):
    stage = make_stage(model_dir, max_streams=2)
    a, b, c = (SpeechJob(i + 1, TEXTS[k]) for i, k in enumerate((1, 3, 0)))
    outs = run(stage, {0: [a, b, c]}, cancels={5: [1]})
    first_c = min(i for i, o in outs if o.job_id == 3)
    assert all(i < 5 for i, o in outs if o.job_id == 1) and of(outs, 1)
    assert not any(o.finished for o in of(outs, 1))
    last_b = max(i for i, o in outs if o.job_id == 2)
    assert 5 < first_c < last_b, "job 3 waits for a free slot, which cancelling job 1 gives it"
    for job in (b, c):
        alone = of(run(stage, {0: [job]}), job.job_id)
        assert np.abs(audio(of(outs, job.job_id)) - audio(alone)).max() <= 1e-5
    stage.cancel(99)  # unknown: no-op


@pytest.mark.parametrize("text", ["", "   \n "])
def test_blank_text_finishes_without_audio(model_dir, text):
    stage = make_stage(model_dir)
    outs = run(stage, {0: [SpeechJob(1, text), SpeechJob(2, TEXTS[2])]})
    (only,) = of(outs, 1)
    assert only.finished and len(only.audio) == 0 and only.text == ""
    assert outs[0][1].job_id == 1 and of(outs, 2)[-1].finished


def test_speed_time_stretches_the_audio(model_dir):
    """Qwen3-TTS has no rate control: speed stretches the PCM (FFmpeg's atempo), streamed
    chunk by chunk, to the same samples as stretching the whole normal-speed audio."""
    # Long enough for the stretcher's window (tiny codec: 8 samples a frame): no codec EOS.
    stage = make_stage(model_dir, max_frames=480, max_len=1024,
                       sampling=TalkerSampling.greedy(min_frames=100_000))
    text = " ".join(TEXTS)
    normal = audio(of(run(stage, {0: [SpeechJob(2, text)]}, max_steps=2000), 2))
    assert len(normal) == 480 * stage.samples_per_frame
    outs = of(run(stage, {0: [SpeechJob(1, text, speed=1.5)]}, max_steps=2000), 1)
    stretched = audio(outs)
    assert outs[-1].finished and sum(len(o.audio) > 0 for o in outs) > 3, "streamed"
    assert np.array_equal(stretched, time_stretch(normal, stage.sample_rate, 1.5))
    assert abs(len(stretched) - len(normal) / 1.5) < 0.1 * len(normal) / 1.5
    assert " ".join(o.text for o in outs if o.text) == text


def test_speed_out_of_range_is_refused_naming_the_field(model_dir):
    stage = make_stage(model_dir)
    with pytest.raises(ValueError, match="speed"):
        stage.start(SpeechJob(1, TEXTS[1], speed=8.0))
    assert not stage.has_work()


def test_missing_tokenizer_is_a_clear_error(model_dir, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).symlink_to(model_dir / name)
    (bare / "speech_tokenizer").symlink_to(model_dir / "speech_tokenizer")
    with pytest.raises(ModelUnavailableError, match="tokenizer"):
        Qwen3SpeechModel(bare)


def test_rejects_unknown_voice(model_dir):
    with pytest.raises(ValueError, match="speaker 'nobody'"):
        make_stage(model_dir, speaker="nobody")
    stage = make_stage(model_dir, language="english")
    assert stage.speaker == "vivian"  # CustomVoice default: the first preset voice


# --------------------------------------------------------------------------- engine


class Harness:
    def __init__(self, stage: Qwen3SpeechModel) -> None:
        self.woke = threading.Event()
        self.stage = stage
        self.core = EngineCore(Models(EnergyVAD(), FixedASR(), CountingLM(), stage), self.woke.set)
        self.outputs: list[p.EngineOutput] = []

    def run_until(self, pred, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout * TIME_FACTOR
        while not pred(self.outputs):
            assert time.monotonic() < deadline, "timed out"
            if not self.core.has_work():
                self.woke.wait(0.05)
                self.woke.clear()
            self.outputs.extend(self.core.step())

    def of(self, cls, response_id: str) -> list:
        return [o for o in self.outputs if isinstance(o, cls) and o.response_id == response_id]


def test_engine_speaks_with_qwen3_and_cancel_stops_chunks(model_dir):
    stage = make_stage(model_dir, max_frames=16)
    h = Harness(stage)
    h.core.add_input(p.OpenStream("s1", p.StreamConfig(turn_detection=None)))
    text = "Hello there, how are you today? Fine, thank you!"
    h.core.add_input(p.Speak("s1", "r1", text))
    h.run_until(lambda outs: any(isinstance(o, p.ResponseFinished) for o in outs))
    chunks = h.of(p.AudioChunk, "r1")
    (done,) = h.of(p.ResponseFinished, "r1")
    assert done.status == p.ResponseStatus.COMPLETED and done.text == text
    assert chunks and all(c.sample_rate == 24000 for c in chunks)
    spf = stage.samples_per_frame
    assert chunks[0].duration_ms == pytest.approx(2 * spf / 24000 * 1000)
    spans = [c.text for c in chunks if c.text]  # one per segment of the text chunker
    assert len(spans) > 1 and " ".join(spans) == text

    h.core.add_input(p.Speak("s1", "r2", "A longer sentence about the lazy dog and the brown fox."))
    h.run_until(lambda outs: len(h.of(p.AudioChunk, "r2")) >= 2)
    h.core.add_input(p.CancelResponse("s1"))
    n = len(h.outputs)
    h.outputs.extend(h.core.step())
    (done,) = h.of(p.ResponseFinished, "r2")
    assert done.status == p.ResponseStatus.CANCELLED
    h.run_until(lambda outs: not h.core.has_work() and not stage.has_work(), timeout=10.0)
    assert not [o for o in h.outputs[n:] if isinstance(o, p.AudioChunk)]
    h.core.close()


def test_factory_builds_the_qwen3_stage_from_settings(model_dir):
    from voxline.engines.factory import load_tts

    settings = load_settings(tts=f"qwen3:{model_dir}")
    stage = load_tts(settings)
    assert isinstance(stage, Qwen3SpeechModel) and stage.random_weights
    assert stage.max_streams == 8
    with pytest.raises(ValueError):
        load_settings(tts="espeak")
    assert load_tts(load_settings(tts=f"qwen3:{model_dir}", tts_max_streams=3)).max_streams == 3
    chunked = load_tts(load_settings(tts=f"qwen3:{model_dir}", tts_first_chunk_frames=2,
                                     tts_chunk_frames=6))
    assert (chunked.initial_chunk_frames, chunked.chunk_frames) == (2, 6)
    with pytest.raises(ValueError, match="tts_chunk_frames"):
        load_settings(tts_chunk_frames=0)
    with pytest.raises(ValueError, match="tts_batch_buckets"):  # graph buckets need CUDA
        load_tts(load_settings(tts=f"qwen3:{model_dir}", tts_batch_buckets="1,2"))
    with pytest.raises(ValueError, match="tts_batch_buckets"):
        load_settings(tts_max_streams=4, tts_batch_buckets="1,8").tts_bucket_list()
    with pytest.raises(ValueError):
        load_settings(tts_batch_buckets="1;8")
    with pytest.raises(ValueError, match="tts_pdl=off needs tts_device=cuda"):  # a CUDA launch attribute
        load_tts(load_settings(tts=f"qwen3:{model_dir}", tts_pdl="off"))
    with pytest.raises(ValueError, match="tts_pdl"):
        load_settings(tts_pdl="on")


def test_a_job_can_pick_another_preset_voice(model_dir):
    stage = make_stage(model_dir)
    text = TEXTS[1]
    outs = run(stage, {0: [SpeechJob(1, text), SpeechJob(2, text, voice="Ryan"),
                           SpeechJob(3, text, voice="alloy")]})
    default, ryan, unknown = audio(of(outs, 1)), audio(of(outs, 2)), audio(of(outs, 3))
    assert stage.voice_of(SpeechJob(9, "x", voice="RYAN")) == "ryan"
    assert np.array_equal(default, unknown)  # unknown names fall back to the stage's voice
    assert len(default) != len(ryan) or not np.allclose(default, ryan)


def test_tts_pdl_off_switches_both_launch_paths_off():
    from voxline.engines.factory import set_tts_pdl
    from voxline.kernels import pdl

    ours, inductor = pdl.set_enabled(True), pdl.inductor_enabled()
    try:
        set_tts_pdl("auto", cuda=True)  # leaves the defaults
        assert pdl._switch.on
        set_tts_pdl("off", cuda=True)
        assert not pdl._switch.on and not pdl.inductor_enabled()
    finally:
        pdl.set_enabled(ours)
        pdl.set_inductor(inductor)

