"""Qwen3-TTS talker + 12 Hz codec decoder: parity with the official reference, streaming.

Parity tests run the official ``qwen-tts`` package in its own venv
(scripts/qwen_ref_venv.sh): it builds the model from the configs below with seeded
random weights, writes the checkpoint with ``save_pretrained`` (official layout), and
runs greedy generation and decoding; voxline loads that directory and must give the
same codec frames token for token and waveforms within 1e-4. They skip only when that
venv cannot be created. The streaming, batching and seeding tests need no reference.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from qwen_ref.harness import (
    MID_CODEC,
    MID_MODEL,
    TINY_CHAT,
    TINY_CODEC,
    TINY_MODEL,
    ReferenceRun,
    local_decoder,
    local_talker,
    random_codes,
    reference_or_skip,
    text_ids,
)
from safetensors.torch import load_file, save_file

from voxline.engines.models.qwen3_tts import (
    FinishReason,
    TalkerGenerator,
    TalkerSampling,
    assistant_ids,
    build_prompt,
    instruct_ids,
    load_code2wav,
    load_config,
    load_talker,
)
from voxline.kernels.attention import attend, attend_matmul, attend_sum, position_mask
from voxline.kernels.decode_attention import attend_decode
from voxline.kernels.snake import (
    snake_beta,
    snake_beta_eager,
    snake_beta_fp32,
    snake_beta_log,
    triton_available,
)

WAV_TOL = 1e-4


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _request(n_text: int, seed: int, language: str, speaker: str | None, *, instruct: int = 0,
             chat=TINY_CHAT) -> dict:
    req = dict(
        input_ids=assistant_ids(text_ids(n_text, seed), chat),
        language=language,
        speaker=speaker,
    )
    if instruct:
        req["instruct_ids"] = instruct_ids(text_ids(instruct, seed + 100), chat)
    return req


# Conditioning paths: a language id; 'auto' switched to the speaker's dialect; an
# instruction with the whole text in the prompt (non-streaming); no speaker at all with
# no repetition penalty; a longer text in a left-padded reference batch.
TINY_REQUESTS = {
    "english_vivian": _request(6, 1, "english", "vivian"),
    "auto_dialect_eric": _request(9, 2, "auto", "eric"),
    "chinese_ryan_instruct": _request(5, 3, "chinese", "ryan", instruct=4),
    "auto_no_speaker": _request(7, 4, "auto", None),
    "english_ryan_long": _request(12, 5, "english", "ryan"),
}
TINY_TASKS = {
    "english_vivian": dict(requests=["english_vivian"]),
    "auto_dialect_eric": dict(requests=["auto_dialect_eric"]),
    "chinese_ryan_instruct": dict(requests=["chinese_ryan_instruct"], non_streaming_mode=True),
    "auto_no_speaker": dict(requests=["auto_no_speaker"], repetition_penalty=1.0),
    "batch": dict(requests=["english_vivian", "auto_dialect_eric", "english_ryan_long"]),
}
TINY_MAX_NEW = 40
TINY_EOS_BIAS = 3.0
TINY_DECODE_FRAMES = (1, 7, 40)  # window is 8 frames

MID_REQUESTS = {
    "english_serena": _request(10, 11, "english", "serena"),
    "auto_dialect_dylan": _request(6, 12, "auto", "dylan"),
}
MID_TASKS = {
    "english_serena": dict(requests=["english_serena"]),
    "batch": dict(requests=["english_serena", "auto_dialect_dylan"]),
}
MID_MAX_NEW = 24
MID_EOS_BIAS = 3.0
MID_DECODE_FRAMES = (80, 3)  # window is 72 frames


def _job(model, codec, requests, tasks, max_new, eos_bias, decode_frames, codebook_size) -> dict:
    job_tasks = []
    for name, t in tasks.items():
        job_tasks.append(dict(
            kind="generate", name=name, requests=[requests[r] for r in t["requests"]],
            max_new_tokens=max_new, non_streaming_mode=t.get("non_streaming_mode", False),
            repetition_penalty=t.get("repetition_penalty", 1.05),
        ))
    job_tasks.append(dict(
        kind="decode", name="decode",
        codes=[random_codes(n, codebook_size, seed=i) for i, n in enumerate(decode_frames)],
    ))
    return dict(seed=0, config=model, tokenizer_config=codec, eos_bias=eos_bias, tasks=job_tasks)


@pytest.fixture(scope="module")
def tiny_ref() -> ReferenceRun:
    return reference_or_skip("tiny", _job(TINY_MODEL, TINY_CODEC, TINY_REQUESTS, TINY_TASKS, TINY_MAX_NEW,
                                   TINY_EOS_BIAS, TINY_DECODE_FRAMES, 128))


@pytest.fixture(scope="module")
def mid_ref() -> ReferenceRun:
    return reference_or_skip("mid", _job(MID_MODEL, MID_CODEC, MID_REQUESTS, MID_TASKS, MID_MAX_NEW,
                                  MID_EOS_BIAS, MID_DECODE_FRAMES, 2048))


class _Loaded:
    def __init__(self, ref: ReferenceRun) -> None:
        self.ref = ref
        self.config = load_config(ref.model_dir)
        self.talker = load_talker(ref.model_dir)
        self.decoder = load_code2wav(ref.model_dir)

    def prompt(self, req: dict, non_streaming: bool = False):
        return build_prompt(
            self.talker, self.config, req["input_ids"], language=req["language"],
            speaker=req["speaker"], instruct=req.get("instruct_ids"), non_streaming=non_streaming,
        )


@pytest.fixture(scope="module")
def tiny(tiny_ref) -> _Loaded:
    return _Loaded(tiny_ref)


@pytest.fixture(scope="module")
def mid(mid_ref) -> _Loaded:
    return _Loaded(mid_ref)


def _assert_same_frames(ours: torch.Tensor, ref: np.ndarray, what: str) -> None:
    ours_np = ours.numpy()
    n = min(len(ours_np), len(ref))
    diff = [i for i in range(n) if not np.array_equal(ours_np[i], ref[i])]
    assert not diff and len(ours_np) == len(ref), (
        f"{what}: {len(ours_np)} frames vs reference {len(ref)}; first differing frame "
        f"{diff[0] if diff else n}: ours {ours_np[diff[0]] if diff else None}, "
        f"reference {ref[diff[0]] if diff else None}"
    )


def _generate(loaded: _Loaded, requests, tasks, task: str, max_new: int) -> list[torch.Tensor]:
    spec = tasks[task]
    gen = TalkerGenerator(loaded.talker, max_streams=4, max_len=256)
    prompts = [loaded.prompt(requests[r], spec.get("non_streaming_mode", False)) for r in spec["requests"]]
    # The reference returns one frame fewer than max_new_tokens when it does not stop:
    # the last drawn first code is never completed.
    params = TalkerSampling.greedy(
        max_frames=max_new - 1, repetition_penalty=spec.get("repetition_penalty", 1.05)
    )
    return gen.generate(prompts, params)


# --------------------------------------------------------------------------- parity


@pytest.mark.parametrize("task", [t for t in TINY_TASKS if t != "batch"])
def test_greedy_frames_match_reference(tiny, task):
    (ours,) = _generate(tiny, TINY_REQUESTS, TINY_TASKS, task, TINY_MAX_NEW)
    _assert_same_frames(ours, tiny.ref.arrays[f"{task}/codes/0"], task)


def test_reference_cases_cover_eos_and_length(tiny_ref):
    frames = [len(tiny_ref.arrays[f"{t}/codes/0"]) for t in TINY_TASKS if t != "batch"]
    assert any(f < TINY_MAX_NEW - 1 for f in frames), f"no case stopped on codec EOS: {frames}"
    assert any(f == TINY_MAX_NEW - 1 for f in frames), f"no case ran to the length limit: {frames}"


def test_batched_generation_matches_reference_and_single_streams(tiny):
    batched = _generate(tiny, TINY_REQUESTS, TINY_TASKS, "batch", TINY_MAX_NEW)
    for i, name in enumerate(TINY_TASKS["batch"]["requests"]):
        _assert_same_frames(batched[i], tiny.ref.arrays[f"batch/codes/{i}"], f"batch[{i}]")
        single = _generate(tiny, TINY_REQUESTS, {"one": dict(requests=[name])}, "one", TINY_MAX_NEW)[0]
        _assert_same_frames(batched[i], single.numpy(), f"batch[{i}] vs alone")


@pytest.mark.parametrize("which", ["tiny", "mid"])
def test_decoder_matches_reference(which, request):
    loaded: _Loaded = request.getfixturevalue(which)
    frames = TINY_DECODE_FRAMES if which == "tiny" else MID_DECODE_FRAMES
    spf = loaded.decoder.samples_per_frame
    for i, n in enumerate(frames):
        codes = torch.tensor(random_codes(n, loaded.decoder.config.codebook_size, seed=i)).T
        full = loaded.decoder.decode_full(codes).numpy()
        ref_full = loaded.ref.arrays[f"decode/full/{i}"]
        ref_wav = loaded.ref.arrays[f"decode/wav/{i}"]
        assert full.shape == ref_full.shape == ref_wav.shape == (n * spf,)
        assert np.abs(full - ref_full).max() <= WAV_TOL
        assert np.abs(full - ref_wav).max() <= WAV_TOL
        assert np.abs(full).max() < 1.0, "waveform saturated: the comparison would be weak"
        state = loaded.decoder.new_state()
        streamed = np.concatenate(
            [loaded.decoder.decode(state, codes[:, s : s + 5]).numpy() for s in range(0, n, 5)]
        )
        assert np.abs(streamed - ref_wav).max() <= WAV_TOL
        if f"decode/batched/{i}" in loaded.ref.arrays:  # reference's padded batch decode
            assert np.abs(full - loaded.ref.arrays[f"decode/batched/{i}"]).max() <= WAV_TOL


def test_mid_size_generation_matches_reference(mid):
    lengths = [len(mid.ref.arrays[f"batch/codes/{i}"]) for i in range(2)]
    assert min(lengths) < MID_MAX_NEW - 1 == max(lengths), f"want one EOS and one length stop: {lengths}"
    (single,) = _generate(mid, MID_REQUESTS, MID_TASKS, "english_serena", MID_MAX_NEW)
    _assert_same_frames(single, mid.ref.arrays["english_serena/codes/0"], "english_serena")
    batched = _generate(mid, MID_REQUESTS, MID_TASKS, "batch", MID_MAX_NEW)
    for i in range(2):
        _assert_same_frames(batched[i], mid.ref.arrays[f"batch/codes/{i}"], f"batch[{i}]")
    assert np.array_equal(batched[0].numpy(), single.numpy())


def test_generated_frames_decode_in_stream(mid):
    frames = _generate(mid, MID_REQUESTS, MID_TASKS, "batch", MID_MAX_NEW)[1]
    full = mid.decoder.decode_full(frames.T)
    state = mid.decoder.new_state()
    parts = [mid.decoder.decode(state, frames[s : s + 4].T) for s in range(0, len(frames), 4)]
    assert torch.cat(parts).shape == full.shape
    assert (torch.cat(parts) - full).abs().max() <= WAV_TOL


def test_loading_is_strict(tiny_ref, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_ref.model_dir, model_dir)
    tensors = load_file(model_dir / "model.safetensors")
    del tensors["talker.model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, model_dir / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing \['model.layers.1.mlp.up_proj.weight'\]"):
        load_talker(model_dir)


# --------------------------------------------------------------------------- streaming


@pytest.mark.parametrize("codec,frames", [(TINY_CODEC, 50), (MID_CODEC, 80)], ids=["tiny", "mid"])
def test_streaming_decode_equals_full_decode(codec, frames):
    decoder = local_decoder(codec, seed=3)
    codes = torch.tensor(random_codes(frames, decoder.config.codebook_size, seed=7)).T
    full = decoder.decode_full(codes)
    assert full.shape == (frames * decoder.samples_per_frame,)
    for chunk in (1, 2, 5, 25):
        state = decoder.new_state()
        parts = [decoder.decode(state, codes[:, s : s + chunk]) for s in range(0, frames, chunk)]
        streamed = torch.cat(parts)
        assert streamed.shape == full.shape
        err = (streamed - full).abs().max().item()
        assert err <= WAV_TOL, f"chunk {chunk}: max abs diff {err}"
        assert int(state.frames) == frames


def test_decode_batch_equals_separate_streams():
    decoder = local_decoder(TINY_CODEC, seed=4)
    lengths = [(3, 4, 4), (12, 4, 2), (5, 1, 4)]  # per stream: warm-up frames, then chunks
    streams = [torch.tensor(random_codes(sum(ls), 128, seed=20 + i)).T for i, ls in enumerate(lengths)]
    solo_states = [decoder.new_state() for _ in streams]
    batch_states = [decoder.new_state() for _ in streams]
    offsets = [0] * len(streams)
    for step in range(3):
        chunks = []
        for i, ls in enumerate(lengths):
            chunks.append(streams[i][:, offsets[i] : offsets[i] + ls[step]])
            offsets[i] += ls[step]
        batched = decoder.decode_batch(batch_states, chunks)
        for i, chunk in enumerate(chunks):
            solo = decoder.decode(solo_states[i], chunk)
            assert (batched[i] - solo).abs().max() <= WAV_TOL, f"step {step} stream {i}"


def test_prime_gives_continuation_of_reference_context():
    decoder = local_decoder(TINY_CODEC, seed=5)
    codes = torch.tensor(random_codes(20, 128, seed=9)).T
    full = decoder.decode_full(codes)
    state = decoder.new_state()
    decoder.prime(state, codes[:, :12])
    tail = decoder.decode(state, codes[:, 12:])
    assert (tail - full[12 * decoder.samples_per_frame :]).abs().max() <= WAV_TOL


# --------------------------------------------------------------------------- sampling


def _tiny_local():
    config, talker = local_talker(TINY_MODEL, seed=1)
    prompts = {
        name: build_prompt(talker, config, req["input_ids"], language=req["language"],
                           speaker=req["speaker"], instruct=req.get("instruct_ids"))
        for name, req in TINY_REQUESTS.items()
    }
    return talker, prompts


def test_seed_determinism_and_batch_independence():
    talker, prompts = _tiny_local()
    gen = TalkerGenerator(talker, max_streams=4, max_len=128)
    p = prompts["english_vivian"]

    def run(seed, others=()):
        params = [TalkerSampling(seed=seed, max_frames=12)] + [
            TalkerSampling(seed=100 + i, max_frames=12) for i in range(len(others))
        ]
        return gen.generate([p, *others], params)[0]

    a = run(1)
    assert a.shape == (12, 16)
    assert torch.equal(a, run(1))
    assert not torch.equal(a, run(2))
    # A seeded stream gives the same frames whatever shares its batch.
    assert torch.equal(a, run(1, others=[prompts["auto_dialect_eric"], prompts["auto_no_speaker"]]))


def test_step_api_emits_frames_then_finishes():
    talker, prompts = _tiny_local()
    gen = TalkerGenerator(talker, max_streams=2, max_len=128)
    s1 = gen.start(prompts["english_vivian"], TalkerSampling.greedy(max_frames=3), "a")
    s2 = gen.start(prompts["auto_no_speaker"], TalkerSampling(seed=0, max_frames=5), "b")
    with pytest.raises(RuntimeError, match="slots"):
        gen.start(prompts["english_vivian"], TalkerSampling.greedy())
    first = gen.step([s1, s2])  # prefill only: no frame yet
    assert [r.frame for r in first] == []
    emitted = {"a": 0, "b": 0}
    while not (s1.finished and s2.finished):
        for r in gen.step([s1, s2]):
            assert r.frame is not None and r.frame.shape == (16,)
            emitted[r.stream.stream_id] += 1
    assert emitted == {"a": 3, "b": 5}
    assert s1.finish == s2.finish == FinishReason.LENGTH
    gen.release(s1)
    gen.release(s2)
    assert gen.start(prompts["english_vivian"], TalkerSampling.greedy()).slot in (0, 1)


class _EosBiasedHead(torch.nn.Module):
    def __init__(self, head: torch.nn.Linear, eos: int) -> None:
        super().__init__()
        self.head = head
        self.bias = torch.zeros(head.out_features)
        self.bias[eos] = 1e3

    @property
    def weight(self) -> torch.Tensor:
        return self.head.weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(h) + self.bias


def test_codec_eos_ends_stream_without_a_frame():
    config, talker = local_talker(TINY_MODEL, seed=1)
    talker.codec_head = _EosBiasedHead(talker.codec_head, config.talker.codec_eos_token_id)
    prompt = build_prompt(talker, config, TINY_REQUESTS["english_vivian"]["input_ids"])
    gen = TalkerGenerator(talker, max_streams=1, max_len=64)
    stream = gen.start(prompt, TalkerSampling.greedy(min_frames=3))
    frames = []
    while not stream.finished:
        frames += [r.frame for r in gen.step([stream]) if r.frame is not None]
    # EOS dominates once allowed: exactly min_frames frames, then the stream ends on EOS.
    assert len(frames) == 3 and stream.finish == FinishReason.EOS


def test_prompt_rejects_unknown_voice_and_language():
    config, talker = local_talker(TINY_MODEL)
    ids = TINY_REQUESTS["english_vivian"]["input_ids"]
    with pytest.raises(ValueError, match="speaker 'nobody' is not supported"):
        build_prompt(talker, config, ids, speaker="nobody")
    with pytest.raises(ValueError, match="language 'klingon' is not supported"):
        build_prompt(talker, config, ids, language="klingon")
    with pytest.raises(ValueError, match="assistant template"):
        build_prompt(talker, config, ids[:5])


# --------------------------------------------------------------------------- kernels


def test_snake_beta_eager_formula():
    x = torch.randn(2, 3, 11)
    alpha, beta = torch.rand(3) + 0.5, torch.rand(3) + 0.5
    want = x + torch.sin(x * alpha[:, None]) ** 2 / (beta[:, None] + 1e-9)
    assert torch.allclose(snake_beta(x, alpha, beta), want, atol=1e-6)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 1e-2), (torch.float16, 1e-3)])
def test_snake_beta_fused_arithmetic_matches_eager_and_keeps_dtype(dtype, tol):
    """What the Triton kernel computes (float32 math, stored in the input dtype; its CPU
    twin) agrees with the eager reference within the dtype's tolerance (relative norm)."""
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(2, 24, 300, generator=g) * 3).to(dtype)[..., 7:290]  # strided rows
    la, lb = (torch.randn(24, generator=g) * 0.5).to(dtype), (torch.randn(24, generator=g) * 0.5).to(dtype)
    got = snake_beta_fp32(x, torch.exp(la), torch.exp(lb))
    want = snake_beta_eager(x, torch.exp(la), torch.exp(lb))
    assert got.dtype == dtype and got.shape == x.shape
    assert float((got.double() - want.double()).norm() / want.double().norm()) < tol
    # Without CUDA the log-scale entry point is the eager reference itself.
    assert torch.equal(snake_beta_log(x, la, lb), want)


@pytest.mark.skipif(not (torch.cuda.is_available() and triton_available()), reason="needs CUDA and Triton")
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 1e-2), (torch.float16, 1e-3)])
def test_snake_beta_triton_kernel_matches_eager(dtype, tol):
    x = (torch.randn(3, 40, 1100, device="cuda") * 3).to(dtype)[..., 3:1050]
    la, lb = (torch.randn(40, device="cuda") * 0.5).to(dtype), (torch.randn(40, device="cuda") * 0.5).to(dtype)
    got = snake_beta_log(x, la, lb)
    want = snake_beta_eager(x, torch.exp(la), torch.exp(lb))
    assert got.dtype == dtype
    assert float((got.double() - want.double()).norm() / want.double().norm()) < tol


def test_decode_attention_reads_the_named_cache_rows():
    """attend_decode over cache rows ``slot``, first ``length`` positions == attend over the
    gathered rows (on the CPU its fallback; on CUDA bf16 the Triton kernel, checked on the
    device by benchmarks/gpu_speech/profile_gpu_tts.py)."""
    g = torch.Generator().manual_seed(6)
    ck, cv = torch.randn(5, 2, 12, 16, generator=g), torch.randn(5, 2, 12, 16, generator=g)
    q = torch.randn(3, 4, 1, 16, generator=g)
    slot = torch.tensor([4, 0, 2])
    mask = position_mask(torch.tensor([[7], [3], [8]]), torch.arange(9).expand(3, 9))
    want = attend(q, ck[:, :, :9][slot], cv[:, :, :9][slot], mask)
    torch.testing.assert_close(attend_decode(q, ck, cv, mask, slot=slot, length=9), want)


@pytest.mark.parametrize("attend_fn", [attend_matmul, attend_sum])
def test_spelled_out_attention_equals_sdpa(attend_fn):
    g = torch.Generator().manual_seed(5)
    q = torch.randn(3, 8, 2, 16, generator=g)
    k, v = torch.randn(3, 4, 9, 16, generator=g), torch.randn(3, 4, 9, 16, generator=g)
    k_pos = torch.arange(9).expand(3, 9)
    mask = position_mask(torch.tensor([[5, 6]] * 3), k_pos, window=4, k_valid=k_pos != 2)
    torch.testing.assert_close(attend_fn(q, k, v, mask), attend(q, k, v, mask), atol=1e-5, rtol=1e-5)


def test_position_mask_is_bottom_right_aligned_with_window():
    q = torch.tensor([[5, 6]])
    k = torch.tensor([[2, 3, 4, 5, 6]])
    mask = position_mask(q, k, window=3)[0, 0]
    assert mask.tolist() == [[False, True, True, True, False], [False, False, True, True, True]]
    valid = torch.tensor([[False, True, True, True, True]])
    assert position_mask(q, k, k_valid=valid)[0, 0, 0].tolist() == [False, True, True, True, False]


def test_bfloat16_runs_end_to_end():
    config, talker = local_talker(TINY_MODEL, seed=1)
    talker = talker.to(torch.bfloat16)
    req = TINY_REQUESTS["english_vivian"]
    prompt = build_prompt(talker, config, req["input_ids"], language="english", speaker="vivian")
    gen = TalkerGenerator(talker, max_streams=1, max_len=64)
    (frames,) = gen.generate([prompt], TalkerSampling.greedy(max_frames=4, min_frames=4))
    assert frames.shape == (4, 16) and int(frames.max()) < 128
    decoder = local_decoder(TINY_CODEC, seed=3)
    ref = decoder.decode_full(frames.T)
    wav = decoder.to(torch.bfloat16).decode_full(frames.T)
    assert wav.dtype == torch.bfloat16 and torch.isfinite(wav.float()).all()
    assert (wav.float() - ref).abs().max() < 0.1
