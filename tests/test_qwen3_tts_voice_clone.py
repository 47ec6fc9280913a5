"""Qwen3-TTS Base (voice clone): speaker encoder and clone prompts, exact against the
official reference (see tests/test_qwen3_tts.py for how parity runs are set up).

Covered: the log-mel front end and ECAPA-TDNN x-vector, the codec encoder (reference
audio -> codes; transformers' Mimi under the hood), clone prompts (x-vector only, and
in-context with text longer / shorter than the reference, streaming or not), a mixed
batch, and the whole in-context flow from raw reference audio to waveform.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from qwen_ref.harness import (
    BASE_MODEL,
    TINY_CHAT,
    TINY_CODEC,
    ReferenceRun,
    random_codes,
    reference_or_skip,
    text_ids,
)

from voxline.engines.models.qwen3_tts import (
    CodecEncoder,
    Qwen3TTSModel,
    TalkerGenerator,
    TalkerSampling,
    assistant_ids,
    build_prompt,
    mel_spectrogram,
    ref_text_ids,
)

MAX_NEW = 30
TOL = 1e-4


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _audio(n: int, seed: int) -> list[float]:
    t = np.arange(n) / 24000.0
    noise = np.random.default_rng(seed).standard_normal(n)
    wav = 0.3 * np.sin(2 * np.pi * (180 + 40 * seed) * t) + 0.2 * np.sin(2 * np.pi * 1234 * t + seed)
    return (wav + 0.05 * noise).astype(np.float32).tolist()


AUDIO = [_audio(9600, 1), _audio(16800, 2)]


def _xvector(seed: int) -> list[float]:
    return (np.random.default_rng(seed).standard_normal(64) * 0.5).astype(np.float32).tolist()


def _case(text: int, seed: int, *, ref_text: int = 0, ref_frames: int = 0, language="english") -> dict:
    return dict(
        request=dict(input_ids=assistant_ids(text_ids(text, seed), TINY_CHAT), language=language),
        embedding=_xvector(seed),
        ref_ids=ref_text_ids(text_ids(ref_text, seed + 50), TINY_CHAT) if ref_text else None,
        ref_code=random_codes(ref_frames, 128, seed=seed + 70) if ref_frames else None,
    )


# x-vector only; ICL with more text than reference frames (text keeps streaming after
# the prompt), with fewer (padded with tts_pad), and with the whole text in the prompt.
CASES = {
    "xvector": _case(6, 1),
    "icl_long_text": _case(12, 2, ref_text=5, ref_frames=4),
    "icl_short_text": _case(2, 3, ref_text=2, ref_frames=10, language="auto"),
    "icl_non_streaming": _case(4, 4, ref_text=3, ref_frames=6),
}
NON_STREAMING = {"icl_non_streaming"}
BATCH = ["xvector", "icl_long_text", "icl_short_text"]
E2E = dict(
    input_ids=assistant_ids(text_ids(8, 31), TINY_CHAT),
    ref_ids=ref_text_ids(text_ids(6, 32), TINY_CHAT),
    language="english",
)


def _task(name: str, cases: list[str]) -> dict:
    chosen = [CASES[c] for c in cases]
    return dict(
        kind="generate", name=name, requests=[c["request"] for c in chosen], max_new_tokens=MAX_NEW,
        non_streaming_mode=name in NON_STREAMING,
        voice_clone=dict(
            ref_code=[c["ref_code"] for c in chosen],
            ref_spk_embedding=[c["embedding"] for c in chosen],
            x_vector_only_mode=[c["ref_code"] is None for c in chosen],
            icl_mode=[c["ref_code"] is not None for c in chosen],
            ref_ids=[c["ref_ids"] for c in chosen],
        ),
    )


@pytest.fixture(scope="module")
def base() -> tuple[ReferenceRun, Qwen3TTSModel]:
    tasks = [_task(name, [name]) for name in CASES] + [_task("batch", BATCH)]
    tasks.append(dict(kind="speaker_embedding", name="spk", audio=AUDIO))
    tasks.append(dict(kind="encode", name="enc", audio=AUDIO))
    tasks.append(dict(kind="clone_from_audio", name="e2e", audio=AUDIO[1], max_new_tokens=MAX_NEW,
                      **E2E))
    job = dict(seed=0, config=BASE_MODEL, tokenizer_config=TINY_CODEC, tasks=tasks)
    ref = reference_or_skip("base", job)
    return ref, Qwen3TTSModel.from_pretrained(ref.model_dir)


def _prompt(model: Qwen3TTSModel, name: str):
    c = CASES[name]
    return build_prompt(
        model.talker, model.config, c["request"]["input_ids"], language=c["request"]["language"],
        speaker_embedding=torch.tensor(c["embedding"]), ref_ids=c["ref_ids"],
        ref_codes=torch.tensor(c["ref_code"]) if c["ref_code"] is not None else None,
        non_streaming=name in NON_STREAMING,
    )


def _generate(model: Qwen3TTSModel, names: list[str]) -> list[torch.Tensor]:
    gen = TalkerGenerator(model.talker, max_streams=len(names), max_len=128)
    return gen.generate([_prompt(model, n) for n in names], TalkerSampling.greedy(max_frames=MAX_NEW - 1))


def test_mel_front_end_matches_reference(base):
    ref, _ = base
    for i, audio in enumerate(AUDIO):
        ours = mel_spectrogram(torch.tensor(audio))[0].numpy()
        want = ref.arrays[f"spk/mel/{i}"]
        assert ours.shape == want.shape
        assert np.abs(ours - want).max() <= TOL


def test_speaker_embedding_matches_reference(base):
    ref, model = base
    assert model.speaker_encoder is not None
    for i, audio in enumerate(AUDIO):
        ours = model.speaker_encoder.embed(np.asarray(audio)).numpy()
        want = ref.arrays[f"spk/embedding/{i}"]
        assert ours.shape == want.shape == (64,)
        assert np.abs(ours - want).max() <= TOL


@pytest.mark.parametrize("name", list(CASES))
def test_clone_frames_match_reference(base, name):
    ref, model = base
    (ours,) = _generate(model, [name])
    want = ref.arrays[f"{name}/codes/0"]
    assert ours.shape == want.shape and np.array_equal(ours.numpy(), want)


def test_clone_batch_matches_reference(base):
    ref, model = base
    frames = [len(ref.arrays[f"batch/codes/{i}"]) for i in range(len(BATCH))]
    assert len(set(frames)) > 1, f"batch members should stop at different frames: {frames}"
    for i, ours in enumerate(_generate(model, BATCH)):
        want = ref.arrays[f"batch/codes/{i}"]
        assert ours.shape == want.shape and np.array_equal(ours.numpy(), want), BATCH[i]


@pytest.fixture(scope="module")
def codec_encoder(base) -> CodecEncoder:
    return CodecEncoder.from_pretrained(base[0].model_dir)


def test_codec_encoder_matches_reference(base, codec_encoder):
    ref, _ = base
    encoder = codec_encoder
    for i, audio in enumerate(AUDIO):
        ours = encoder.encode(np.asarray(audio)).numpy()
        want = ref.arrays[f"enc/codes/{i}"]
        assert ours.shape == want.shape == (-(-len(audio) // 1920), 16)
        assert np.array_equal(ours, want)


def test_clone_from_reference_audio_end_to_end(base, codec_encoder):
    """Reference clip -> (codes, x-vector) -> ICL prompt -> frames -> primed streaming decode."""
    ref, model = base
    audio = np.asarray(AUDIO[1])
    ref_codes = codec_encoder.encode(audio)
    prompt = build_prompt(
        model.talker, model.config, E2E["input_ids"], language=E2E["language"],
        speaker_embedding=model.speaker_encoder.embed(audio), ref_ids=E2E["ref_ids"], ref_codes=ref_codes,
    )
    gen = TalkerGenerator(model.talker, max_streams=1, max_len=128)
    (frames,) = gen.generate([prompt], TalkerSampling.greedy(max_frames=MAX_NEW - 1))
    want_frames = ref.arrays["e2e/codes/0"]
    assert 4 < len(want_frames) < MAX_NEW - 1, "want a clone that runs a while, then stops on EOS"
    assert np.array_equal(frames.numpy(), want_frames)
    state = model.code2wav.new_state()
    model.code2wav.prime(state, ref_codes.T)
    wav = torch.cat([model.code2wav.decode(state, frames[s : s + 3].T) for s in range(0, len(frames), 3)])
    want = ref.arrays["e2e/wav/0"]
    assert wav.shape == want.shape
    assert np.abs(wav.numpy() - want).max() <= TOL
