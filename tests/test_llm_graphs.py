"""Graphed decode of the embedded Llama (:mod:`voxline.engines.models.llama.graphs`).

The static-buffer step runs eagerly on the CPU (its twin): it gives ``forward_batch``'s
logits and tokens for decode batches of mixed lengths on scattered slots, across length
buckets and after a rollback, and its padding rows touch only the scratch slot. On CUDA
(skipped without it) the captured graphs replay the same steps in bfloat16. Imports stay
minimal: the CUDA tests run on a GPU machine without the server's dependencies.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from voxline.engines.models.llama.graphs import GraphedLlamaDecoder
from voxline.engines.models.llama.model import LlamaModel

STREAMS = 6
MAX_LEN = 96
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))]


def config() -> LlamaConfig:
    # head_dim 64 and 2 query heads per key/value head: the Triton decode attention's case.
    return LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                       max_position_embeddings=256, tie_word_embeddings=True,
                       rope_theta=10000.0, rms_norm_eps=1e-5)


def ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def pair(device: str, **buckets) -> tuple[LlamaModel, LlamaModel, GraphedLlamaDecoder]:
    """The same weights twice (default init: peaked logits, stable greedy picks): an eager
    reference and a graphed decoder (captured on CUDA), caches prefilled alike."""
    torch.manual_seed(0)
    src = LlamaModel(config())
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    ref, ours = (LlamaModel.from_state_dict(src.config, src.state_dict(), dtype=dtype, device=device)
                 for _ in range(2))
    ref.allocate_cache(STREAMS, MAX_LEN)
    ours.allocate_cache(STREAMS + 1, MAX_LEN)
    dec = GraphedLlamaDecoder(ours, max_streams=STREAMS, **buckets)
    prompts = {4: ids(13, 1), 0: ids(3, 2), 2: ids(30, 3), 5: ids(8, 4)}
    for m in (ref, ours):
        m.forward_batch(list(prompts), list(prompts.values()))
    return ref, ours, dec


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    if got.dtype == torch.float32 and got.device.type == "cpu" and want.device.type == "cpu":
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    else:  # bfloat16 on the GPU: Triton attention vs SDPA, graph vs eager
        err = (got.float() - want.float()).norm() / want.float().norm()
        assert err < 2e-2, f"relative error {err:.3g}"


def decode_both(ref: LlamaModel, dec: GraphedLlamaDecoder, slots: list[int],
                toks: list[int], steps: int) -> list[list[int]]:
    """Greedy decode ``steps`` steps on both; the picks of each step (the reference's fed)."""
    picks = []
    for _ in range(steps):
        want = ref.forward_batch(slots, [[t] for t in toks])
        got = dec.step(slots, toks)
        close(got, want)
        assert got.argmax(-1).tolist() == want.argmax(-1).tolist()
        toks = want.argmax(-1).tolist()
        picks.append(toks)
    return picks


def same_cache(a: LlamaModel, b: LlamaModel) -> None:
    assert a.cache.lengths == b.cache.lengths[:STREAMS]
    for s in range(STREAMS):
        n = a.cache.lengths[s]
        if n == 0:  # a slot no stream used
            continue
        close(b.cache.k[:, s, :, :n], a.cache.k[:, s, :, :n])
        close(b.cache.v[:, s, :, :n], a.cache.v[:, s, :, :n])


@pytest.mark.parametrize("device", DEVICES)
def test_graphed_decode_gives_forward_batch_logits_and_tokens(device):
    # Small length buckets: the 30-token stream crosses 32 -> 64 during the decode.
    ref, ours, dec = pair(device, length_buckets=[16, 32, 64, MAX_LEN])
    decode_both(ref, dec, [4, 0, 2], ids(3, 9), steps=5)  # 3 rows in a 4-row bucket
    decode_both(ref, dec, [5], [7], steps=2)
    decode_both(ref, dec, [0, 2, 4, 5], ids(4, 10), steps=2)
    same_cache(ref, ours)
    assert dec.graph_steps == 9 and dec.eager_steps == 0
    assert {k[1] for k in dec.steps.steps} >= {32, 64}
    assert all(s.graph is not None for s in dec.steps.steps.values()) == (device == "cuda")


@pytest.mark.parametrize("device", DEVICES)
def test_a_mixed_step_replays_its_decode_rows_and_runs_only_the_prompts_eagerly(device):
    ref, ours, dec = pair(device)
    # Slots 4, 2 decode one token each; 1 (new) and 5 (a follow-up turn) feed prompts.
    slots, toks = [4, 1, 2, 5], [[7], ids(11, 20), [9], ids(5, 21)]
    want = ref.forward_batch(slots, toks)
    got = dec.forward(slots, toks)
    close(got, want)
    assert got.argmax(-1).tolist() == want.argmax(-1).tolist()
    assert dec.graph_steps == 1 and dec.eager_steps == 0  # decode rows: one bucket replay
    decode_both(ref, dec, [1, 4, 5, 2], ids(4, 22), steps=3)  # the caches agree from there
    same_cache(ref, ours)
    close(dec.forward([0], [ids(6, 23)]), ref.forward_batch([0], [ids(6, 23)]))  # prompts only
    assert dec.graph_steps == 4


@pytest.mark.parametrize("device", DEVICES)
def test_padding_rows_write_only_the_scratch_slot(device):
    _, ours, dec = pair(device)
    cache = ours.cache
    cache.k.normal_()
    cache.v.normal_()
    k0, v0 = cache.k.clone(), cache.v.clone()
    pos = cache.lengths[2]
    dec.step([2], [11])  # one real row in a 1-row bucket ...
    dec.step([2, 4, 0], [12, 13, 14])  # ... and three in a 4-row bucket: one padding row
    assert dec.bucket(1, 1)[0] == 1 and dec.bucket(3, 1)[0] == 4
    changed = ((cache.k != k0) | (cache.v != v0)).any(dim=(0, 2, 4))  # [slots, positions]
    real = {(2, pos), (2, pos + 1), (4, cache.lengths[4] - 1), (0, cache.lengths[0] - 1)}
    for s, p in changed.nonzero().tolist():
        assert (s, p) in real or s == dec.scratch, f"slot {s} position {p} was written"
    assert changed[dec.scratch].any()  # the padding rows did run, on the scratch slot


@pytest.mark.parametrize("device", DEVICES)
def test_rollback_then_graphed_decode_equals_eager(device):
    ref, ours, dec = pair(device)
    slots = [2, 4]
    picks = decode_both(ref, dec, slots, [5, 6], steps=4)
    for m in (ref, ours):  # a speculation rejected: drop the last three fed tokens of slot 2
        m.cache.truncate(2, m.cache.lengths[2] - 3)
    decode_both(ref, dec, slots, picks[0], steps=4)
    same_cache(ref, ours)


def test_shapes_past_the_buckets_run_eagerly():
    ref, _, dec = pair("cpu", batch_buckets=[1, 2], length_buckets=[16])
    want = ref.forward_batch([4, 0, 2], [[1], [2], [3]])  # 3 rows: past the largest batch
    torch.testing.assert_close(dec.step([4, 0, 2], [1, 2, 3]), want, atol=1e-4, rtol=1e-4)
    want = ref.forward_batch([2], [[4]])  # 32 positions: past the largest length
    torch.testing.assert_close(dec.step([2], [4]), want, atol=1e-4, rtol=1e-4)
    assert dec.eager_steps == 2 and dec.graph_steps == 0 and not dec.steps.steps


def test_the_scratch_slot_is_required_and_reserved():
    _, ours, _ = pair("cpu")
    with pytest.raises(ValueError, match="needs 8 .*scratch"):
        GraphedLlamaDecoder(ours, max_streams=7)
    dec = GraphedLlamaDecoder(ours, max_streams=STREAMS)
    with pytest.raises(ValueError, match="scratch slot"):
        dec.step([STREAMS], [1])
    with pytest.raises(ValueError, match="token id outside"):
        dec.step([0], [300])
    with pytest.raises(ValueError, match="capture needs the model on CUDA"):
        GraphedLlamaDecoder(ours, max_streams=STREAMS, capture=True)


# -- prefill graphs -------------------------------------------------------------------

PREFILL = {"prefill_buckets": [4, 8, 16], "length_buckets": [16, 32, 64, MAX_LEN]}


@pytest.mark.parametrize("device", DEVICES)
def test_prefill_graphs_give_forward_batch_logits_and_cache(device):
    ref, ours, dec = pair(device, **PREFILL)
    # A new stream (37 tokens: chunks of 16, 16 and 5 crossing length buckets 16 -> 64)
    # and a follow-up turn on slot 5 (8 tokens cached, 3 new: a 4-query bucket).
    for slot, toks in ((1, ids(37, 30)), (5, ids(3, 31))):
        want = ref.forward_batch([slot], [toks])
        got = dec.forward([slot], [toks])
        close(got, want)
        assert got.argmax(-1).tolist() == want.argmax(-1).tolist()
    assert dec.prefill_steps == 4 and dec.graph_steps == 0
    assert {k for k in dec.prefills.steps} == {(16, 16), (16, 32), (8, 64), (4, 16)}
    assert all(s.graph is not None for s in dec.prefills.steps.values()) == (device == "cuda")
    same_cache(ref, ours)
    decode_both(ref, dec, [1, 5], ids(2, 32), steps=3)  # decoding goes on from those caches
    same_cache(ref, ours)


@pytest.mark.parametrize("device", DEVICES)
def test_a_mixed_step_replays_its_prompts_from_prefill_graphs(device):
    ref, ours, dec = pair(device, **PREFILL)
    slots, toks = [4, 1, 2, 5], [[7], ids(11, 20), [9], ids(5, 21)]
    want = ref.forward_batch(slots, toks)
    got = dec.forward(slots, toks)
    close(got, want)
    assert got.argmax(-1).tolist() == want.argmax(-1).tolist()
    assert dec.graph_steps == 1 and dec.prefill_steps == 2  # slot 1: one 16-query chunk
    decode_both(ref, dec, [1, 4, 5, 2], ids(4, 22), steps=3)
    same_cache(ref, ours)


@pytest.mark.parametrize("device", DEVICES)
def test_prefill_padding_queries_write_only_the_scratch_slot(device):
    _, ours, dec = pair(device, **PREFILL)
    cache = ours.cache
    cache.k.normal_()
    cache.v.normal_()
    k0, v0 = cache.k.clone(), cache.v.clone()
    at = cache.lengths[0]
    dec.prefill(0, ids(5, 40))  # 5 real queries in an 8-query bucket
    changed = ((cache.k != k0) | (cache.v != v0)).any(dim=(0, 2, 4))  # [slots, positions]
    for s, p in changed.nonzero().tolist():
        assert s == dec.scratch or (s == 0 and at <= p < at + 5), f"slot {s} position {p}"
    assert changed[0, at:at + 5].all() and changed[dec.scratch].any()
    assert cache.lengths[0] == cache.written[0] == at + 5


def test_prefill_refusals():
    _, ours, _ = pair("cpu")
    with pytest.raises(ValueError, match="prefill buckets must be >= 2"):
        GraphedLlamaDecoder(ours, max_streams=STREAMS, prefill_buckets=[1, 8])
    dec = GraphedLlamaDecoder(ours, max_streams=STREAMS, prefill_buckets=[8])
    with pytest.raises(ValueError, match="scratch slot"):
        dec.prefill(STREAMS, [1, 2])
    with pytest.raises(ValueError, match="exceed max_len"):
        dec.prefill(1, ids(MAX_LEN + 1, 41))
    assert ours.cache.lengths[1] == 0 and dec.prefill_steps == 0  # nothing was fed
    with pytest.raises(RuntimeError, match="runs prompts eagerly"):
        GraphedLlamaDecoder(ours, max_streams=STREAMS).prefill(1, [1, 2])


def test_the_graph_step_functions_need_no_host_value():
    """What CUDA-graph capture needs, checked on the eager twins: no host reads inside."""
    from host_sync import no_host_sync

    _, _, dec = pair("cpu", **PREFILL)
    steps = [dec.steps.get((4, 32)), dec.prefills.get((8, 64))]
    for step in steps:
        with torch.inference_mode(), no_host_sync():  # as StaticStep runs it
            step.fn(**step.inputs)
    with pytest.raises(AssertionError, match="reads a device value"), no_host_sync():
        steps[0].inputs["ints"][0, 0].item()  # the check does catch a host read ...
    with pytest.raises(AssertionError, match="tensor from Python data"), no_host_sync():
        torch.tensor([1, 2])  # ... and a tensor made from Python values


def test_prefill_graphs_that_fail_to_capture_leave_prompts_eager(monkeypatch, caplog):
    ref, _, dec = pair("cpu", **PREFILL)

    def fail(keys, *, progress=True):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(dec.prefills, "prepare", fail)
    with caplog.at_level("WARNING"):
        dec.prepare([(1, 16)])
    assert dec.prefills is None and "prompts run eagerly" in caplog.text
    assert (1, 16) in dec.steps.steps  # the decode graphs are kept
    close(dec.forward([1], [ids(9, 50)]), ref.forward_batch([1], [ids(9, 50)]))
    assert dec.prefill_steps == 0


@pytest.mark.parametrize("device", DEVICES)
def test_each_row_is_picked_inside_the_step_at_its_temperature(device):
    from voxline.engines.models.sampling import pick_rows

    ref, _, dec = pair(device, **PREFILL)
    # three decode rows and a follow-up prompt on slot 5: greedy, sampled, greedy, sampled
    slots, toks, temps = [4, 0, 2, 5], [[7], [3], [9], ids(3, 60)], [0.0, 50.0, 0.0, 30.0]
    torch.manual_seed(123)
    logits, picks = dec.forward_picked(slots, toks, temps)
    close(logits, ref.forward_batch(slots, toks))
    assert picks.shape == (4,) and picks.dtype == torch.long
    assert picks[[0, 2]].tolist() == logits[[0, 2]].argmax(-1).tolist()
    if device == "cpu":  # the same draws again: the decode rows' bucket, then the prompt's
        torch.manual_seed(123)
        noise = torch.empty(4, 300).exponential_()  # decode bucket of 4 (3 rows + padding)
        row1 = ((logits[1] / 50.0).softmax(-1) / noise[1]).argmax().item()
        noise = torch.empty(1, 300).exponential_()  # the prompt's 4-query bucket
        row3 = ((logits[3] / 30.0).softmax(-1) / noise[0]).argmax().item()
        assert picks[[1, 3]].tolist() == [row1, row3]
        assert [row1, row3] != logits[[1, 3]].argmax(-1).tolist()  # these draws are not greedy
    # without temperatures every row is greedy, as `forward` always was
    greedy = dec.forward_picked([4], [[int(picks[0])]])[1]
    assert greedy.tolist() == ref.forward_batch([4], [[int(picks[0])]]).argmax(-1).tolist()
    with pytest.raises(ValueError, match="2 temperatures for 1 rows"):
        dec.forward_picked([4], [[1]], [0.5, 0.5])
    # a replay draws new noise (on a GPU the graph advances the generator): the same
    # inputs at a high temperature do not pick the same four tokens twice
    step = dec.steps.get((4, 64))
    step.inputs["temps"].fill_(50.0)
    first = step()["picks"].clone()
    assert not torch.equal(first, step()["picks"])
    assert torch.equal(pick_rows(logits[[0, 2]], torch.zeros(2, device=device)),
                       logits[[0, 2]].argmax(-1))
