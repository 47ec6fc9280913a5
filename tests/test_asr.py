"""Moonshine base-en adapter: real shipped model on CPU (onnxruntime, no moonshine_cpp import)."""

from __future__ import annotations

import logging
import os
import sys
import time
import wave

import numpy as np
import pytest
from speech import espeak, noise

from voxline.engines.models.moonshine_asr import (
    MoonshineASR,
    MoonshineTokenizer,
    _name_subgraphs,
    cache_entry,
    drop_stale,
    shipped_model_dir,
)
from voxline.errors import ModelUnavailableError


@pytest.fixture(scope="module")
def asr() -> MoonshineASR:
    model = MoonshineASR.load()  # folded fast path, converted once into the settings' cache
    assert model.folded
    return model


def first_step_logits(model: MoonshineASR, hidden: np.ndarray) -> np.ndarray:
    feed = {
        "input_ids": np.array([[1]], np.int64),
        "encoder_hidden_states": hidden,
        "use_cache_branch": np.array([False]),
    }
    for name in model._past_names:
        feed[name] = np.zeros((1, model._heads, 0, model._head_dim), np.float32)
    return model.decoder.run(["logits"], feed)[0]


def test_capital_of_france(asr: MoonshineASR) -> None:
    text = asr.transcribe(espeak("What is the capital of France?")).lower()
    assert "capital" in text and "france" in text


def test_second_sentence_key_words(asr: MoonshineASR) -> None:
    text = asr.transcribe(
        espeak("Please set a timer for ten minutes and turn off the kitchen lights.")
    ).lower()
    for word in ("timer", "minutes", "kitchen", "lights"):
        assert word in text, text


def test_shipped_sample_is_sensible_english(asr: MoonshineASR) -> None:
    path = shipped_model_dir().parent.parent / "test-data" / "beckett.wav"
    with wave.open(str(path), "rb") as w:
        assert w.getframerate() == 16000 and w.getnchannels() == 1
        audio = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    text = asr.transcribe(audio).lower()
    for word in ("ever", "tried", "failed", "try again", "fail better"):
        assert word in text, text


def test_empty_and_very_short_audio(asr: MoonshineASR) -> None:
    assert asr.transcribe(np.zeros(0, np.float32)) == ""
    assert asr.transcribe(np.zeros(400, np.float32)) == ""  # 25 ms
    assert isinstance(asr.transcribe(noise(0.1)), str)  # the shortest clip it decodes
    assert asr.transcribe(np.zeros(16000, np.float32)) == ""  # 1 s of silence


def test_batch_matches_single(asr: MoonshineASR) -> None:
    clips = [espeak("Good morning."), np.zeros(100, np.float32), espeak("Thank you very much.")]
    assert asr.transcribe_batch(clips) == [asr.transcribe(c) for c in clips]
    assert asr.transcribe_batch([]) == []


def test_a_draft_changes_nothing_but_the_number_of_decoder_steps(asr: MoonshineASR) -> None:
    """Drafted decoding checks the draft in one pass and keeps what greedy decoding agrees
    with: a right, a partly right and a wrong draft all give the plain result."""
    audio = np.concatenate([espeak("I would like to book a table for four people tonight."),
                            np.zeros(8000, np.float32)])
    hidden = asr.encode(audio)
    budget = asr.max_tokens(len(audio))
    plain = asr.decode(hidden, budget)
    partial = asr.decode(asr.encode(audio[: len(audio) * 2 // 3]), budget)
    assert partial != plain  # an earlier take differs in its tail
    for draft in (plain, partial, plain[:3] + [7, 8, 9], [5] * 40, []):
        assert asr.decode(hidden, budget, draft) == plain


def test_a_growing_utterance_is_drafted_by_its_previous_take(asr: MoonshineASR) -> None:
    audio = espeak("What is the largest planet in our solar system?")
    first = asr.transcribe(audio[: len(audio) // 2])
    key = audio[:1600].tobytes()
    assert asr.tokenizer.decode(asr._drafts[key]) == first  # kept for the next take
    plain = asr.tokenizer.decode(asr.decode(asr.encode(audio), asr.max_tokens(len(audio))))
    assert asr.transcribe(audio) == plain and "planet" in plain.lower()


def test_rejects_bad_input(asr: MoonshineASR) -> None:
    with pytest.raises(ValueError, match="1-D"):
        asr.transcribe(np.zeros((2, 16000), np.float32))
    with pytest.raises(ValueError, match="at most 64 s"):
        asr.transcribe(np.zeros(65 * 16000, np.float32))


def test_tokenizer_format(tmp_path) -> None:
    # Entry lengths: 1-byte form below 128, two-byte form (second * 128 + first - 128) above.
    long_piece = "\u2581" + "x" * 200
    blob = bytearray()
    for piece in [b"<s>", "\u2581Hi".encode(), b"\xc3", b"\xa9", long_piece.encode(), b"</s>"]:
        n = len(piece)
        blob += bytes([n]) if n < 128 else bytes([n % 128 + 128, n // 128])
        blob += piece
    (tmp_path / "tokenizer.bin").write_bytes(bytes(blob))
    tok = MoonshineTokenizer.from_file(tmp_path / "tokenizer.bin")
    assert len(tok) == 6 and tok.pieces[4] == long_piece.encode()
    assert tok.decode([0, 1, 2, 3, 5]) == "Hi\u00e9"  # specials dropped, byte fallback joined
    assert tok.decode([1, 4]) == "Hi " + "x" * 200


def test_shipped_tokenizer_ids(asr: MoonshineASR) -> None:
    tok = asr.tokenizer
    assert tok.pieces[:3] == [b"<unk>", b"<s>", b"</s>"]
    assert tok.pieces[3 + ord("A")] == b"A"  # byte-fallback block starts at id 3


@pytest.fixture(scope="module")
def plain() -> MoonshineASR:
    model = MoonshineASR.load(fold_weights=False)
    assert not model.folded
    return model


def assert_same_model(folded: MoonshineASR, plain: MoonshineASR) -> None:
    clip = espeak("I would like to book a table for four people tonight.")
    hidden = plain.encode(clip)
    np.testing.assert_allclose(folded.encode(clip), hidden, atol=1e-3)
    ref = first_step_logits(plain, hidden)
    np.testing.assert_allclose(
        first_step_logits(folded, hidden), ref, atol=1e-3 * np.abs(ref).max()
    )
    assert folded.decode(hidden, 40) == plain.decode(hidden, 40)


def test_folded_fast_path_equals_shipped_files(asr: MoonshineASR, plain: MoonshineASR) -> None:
    assert_same_model(asr, plain)


def test_fresh_fold_equals_shipped_files(tmp_path, plain: MoonshineASR) -> None:
    # The settings' cache is usually warm; fold from scratch so the conversion itself runs.
    fresh = MoonshineASR.load(cache_dir=tmp_path)
    assert fresh.folded and len(list((tmp_path / "moonshine").glob("*.folded-*.ort"))) == 2
    assert_same_model(fresh, plain)


def test_a_cached_conversion_is_named_by_contents_and_one_is_kept(tmp_path) -> None:
    """Two installs of the same files (other paths, other mtimes) share one cached copy;
    another converter version gets its own, and making it removes day-old copies of the
    same file."""
    a, b = tmp_path / "a" / "model.ort", tmp_path / "b" / "model.ort"
    for path in (a, b):
        path.parent.mkdir()
        path.write_bytes(b"the same weights")
    cache = tmp_path / "cache"
    entry = cache_entry([a], cache, "model.folded", "ort 1", ".ort")
    assert entry == cache_entry([b], cache, "model.folded", "ort 1", ".ort")
    newer = cache_entry([a], cache, "model.folded", "ort 2", ".ort")
    assert newer != entry and newer.name.startswith("model.folded-")
    cache.mkdir()
    other = cache / "encoder.folded-0000000000000000.ort"
    young = cache / "model.folded-ffffffffffffffff.ort"
    for path in (entry, newer, other, young):
        path.write_bytes(b"x")
    day_old = time.time() - 2 * 86400
    for path in (entry, other):
        os.utime(path, (day_old, day_old))
    drop_stale(newer, "model.folded", ".ort")  # a young copy may be another process's
    assert sorted(p.name for p in cache.iterdir()) == sorted([newer.name, other.name, young.name])


def test_name_subgraphs_names_only_unnamed_graphs() -> None:
    import onnx
    from onnx import TensorProto, helper

    def branch(name: str, value: float) -> onnx.GraphProto:
        const = helper.make_node("Constant", [], ["out"], value_float=value)
        out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [])
        return helper.make_graph([const], name, [], [out])

    inner = helper.make_node(
        "If", ["c"], ["out"], then_branch=branch("", 1.0), else_branch=branch("kept", 2.0)
    )
    c = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [])
    outer_then = helper.make_graph([inner], "", [], [out])
    outer = helper.make_node(
        "If", ["c"], ["y"], then_branch=outer_then, else_branch=branch("", 3.0)
    )
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    model = helper.make_model(helper.make_graph([outer], "", [c], [y]))

    named = onnx.load_from_string(_name_subgraphs(model.SerializeToString()))
    outer_else, outer_then = named.graph.node[0].attribute  # make_node sorts by name
    inner_else, inner_then = outer_then.g.node[0].attribute
    # Innermost first, in node and attribute order; a named graph keeps its name.
    graphs = [outer_else.g, inner_else.g, inner_then.g, outer_then.g, named.graph]
    names = ["subgraph_1", "kept", "subgraph_2", "subgraph_3", "subgraph_4"]
    assert [g.name for g in graphs] == names
    for graph in graphs:  # and nothing else changes
        if graph.name.startswith("subgraph_"):
            graph.name = ""
    assert named == model


def test_folding_failure_falls_back_to_shipped_files(tmp_path, caplog) -> None:
    not_a_dir = tmp_path / "cache"
    not_a_dir.write_text("a file where the cache directory should be")
    with caplog.at_level(logging.WARNING):
        model = MoonshineASR.load(cache_dir=not_a_dir)
    assert not model.folded
    assert "weight folding failed" in caplog.text


def test_missing_files_are_named(tmp_path) -> None:
    with pytest.raises(ModelUnavailableError, match="encoder_model.ort"):
        MoonshineASR.load(str(tmp_path))


def test_native_runtime_never_imported(asr: MoonshineASR) -> None:
    assert "moonshine_cpp" not in sys.modules


# -- the int8 decoder (asr_decoder=int8, the CPU default) -----------------------------------


def test_quantize_matmuls_rewrites_constant_weights_in_subgraphs_and_keeps_the_rest() -> None:
    """A weight of the enclosing graph used inside an If branch, a branch's own weight, a
    small weight and a MatMul of two activations: only the two large constants become
    int8, the float copies no longer used are dropped, and the result stays close."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from voxline.engines.models.moonshine_asr import quantize_matmuls

    rng = np.random.default_rng(0)
    outer_w = rng.standard_normal((64, 1024)).astype(np.float32)
    branch_w = rng.standard_normal((64, 1024)).astype(np.float32)
    small_w = rng.standard_normal((64, 8)).astype(np.float32)

    def branch(name: str, weight: str, local: list) -> onnx.GraphProto:
        mm = helper.make_node("MatMul", ["x", weight], [f"{name}_y"])
        out = helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)
        return helper.make_graph([mm], name, [], [out], initializer=local)

    then_g = branch("then", "outer_w", [])
    else_g = branch("else", "branch_w", [numpy_helper.from_array(branch_w, "branch_w")])
    nodes = [
        helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
        helper.make_node("MatMul", ["x", "small_w"], ["s"]),
        helper.make_node("MatMul", ["x", "xt"], ["g"]),
    ]
    inputs = [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64]),
              helper.make_tensor_value_info("xt", TensorProto.FLOAT, [64, 1])]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "ysg"]
    graph = helper.make_graph(nodes, "top", inputs, outputs, initializer=[
        numpy_helper.from_array(outer_w, "outer_w"), numpy_helper.from_array(small_w, "small_w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    assert quantize_matmuls(model) == 2
    ops = [n.op_type for n in model.graph.node] + [
        n.op_type for a in model.graph.node[0].attribute for n in a.g.node]
    assert ops.count("DynamicQuantizeMatMul") == 2 and ops.count("MatMul") == 2
    names = {i.name for i in model.graph.initializer}
    assert "outer_w" not in names and "small_w" in names and "outer_w.int8" in names
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((1, 64)).astype(np.float32)
    for cond, w in ((True, outer_w), (False, branch_w)):
        y, s, _ = session.run(None, {"c": np.array(cond), "x": x, "xt": x.T.copy()})
        exact = x @ w
        assert np.abs(y - exact).max() < 0.05 * np.abs(exact).max()
        np.testing.assert_allclose(s, x @ small_w, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def int8_asr() -> MoonshineASR:
    model = MoonshineASR.load(int8_decoder=True)  # converted once into the settings' cache
    assert model.folded and model.int8_decoder
    return model


def test_int8_decoder_hears_the_same_words(int8_asr: MoonshineASR, asr: MoonshineASR) -> None:
    for sentence in ("What is the capital of France?",
                     "Please set a timer for ten minutes and turn off the kitchen lights.",
                     "I would like to book a table for four people tonight."):
        clip = espeak(sentence)
        text = int8_asr.transcribe(clip)
        assert text == asr.transcribe(clip), sentence
    hidden = asr.encode(espeak("How many legs does a spider have?"))
    ref, got = first_step_logits(asr, hidden), first_step_logits(int8_asr, hidden)
    assert got.argmax() == ref.argmax()
    assert np.corrcoef(got.ravel(), ref.ravel())[0, 1] > 0.99


def test_int8_decoder_conversion_is_cached_and_its_failure_falls_back(tmp_path, monkeypatch,
                                                                       caplog) -> None:
    from voxline.engines.models import moonshine_asr

    fresh = MoonshineASR.load(cache_dir=tmp_path, int8_decoder=True)
    assert fresh.int8_decoder
    made = sorted(p.name.split("-")[0] for p in (tmp_path / "moonshine").iterdir())
    assert made == ["decoder_model_merged.int8", "encoder_model.folded"]  # no float decoder
    text = fresh.transcribe(espeak("Turn off the kitchen lights.")).lower()
    assert "kitchen" in text and "lights" in text

    def broken(src, cache_dir):
        raise RuntimeError("no room")

    monkeypatch.setattr(moonshine_asr, "int8_copy", broken)
    with caplog.at_level(logging.WARNING):
        fallback = MoonshineASR.load(cache_dir=tmp_path, int8_decoder=True)
    assert fallback.folded and not fallback.int8_decoder
    assert "int8 decoder conversion failed (no room)" in caplog.text


def test_asr_decoder_setting_picks_the_decoder_and_is_refused_off_the_cpu_moonshine() -> None:
    from voxline.config import load_settings
    from voxline.engines.factory import load_asr

    assert load_asr(load_settings(), threads=1).int8_decoder  # auto
    assert not load_asr(load_settings(asr_decoder="float32"), threads=1).int8_decoder
    for kwargs in ({"asr_decoder": "int8", "asr_device": "cuda"},
                   {"asr_decoder": "float32", "asr": "whisper:/nowhere"}):
        with pytest.raises(ValueError, match="asr_decoder=.* applies to Moonshine on the CPU"):
            load_asr(load_settings(**kwargs), threads=1)
