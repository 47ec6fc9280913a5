"""What each model puts on its device, read from its checkpoint's configs (no weights read).

Each function returns the :class:`~voxline.engines.capacity.Footprint` of one model as
the factory loads it on a GPU, and its parameter count (the latency table's key):

- the embedded Llama: parameters from ``config.json`` (the layout of
  :class:`~voxline.engines.models.llama.model.LlamaModel`) x the ``llm_dtype``'s bytes; a
  session's KV slot is layers x 2 x kv_heads x head_dim x bytes x positions; one slot
  more is the CUDA graphs' scratch slot;
- Qwen3-TTS: the talker (bf16) and code2wav (fp32) built on the meta device from the
  checkpoint's configs and counted; a stream holds one talker KV slot of the same shape
  and two code2wav state slots (:class:`~voxline.engines.models.qwen3_tts.graphed_code2wav.
  GraphedCode2Wav`: a finished job keeps its slot while a new one starts); one of each
  more is scratch;
- Whisper and Helios: their safetensors' element counts (headers only) x 2 bytes (bf16).

Nothing here touches CUDA: it runs in the API process before the engine starts; torch
is imported only to build Qwen3-TTS on the meta device.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxline.engines.capacity import Footprint

if TYPE_CHECKING:
    import torch

LLM_POSITIONS = 2048  # KV positions of a conversation's LLM slot (its context window)
TTS_POSITIONS = 2048  # of a talker stream (prompt + codec frames)
CODE2WAV_SLOTS_PER_STREAM = 2
BF16 = 2
FLOAT32 = 4


def llama_params(config: dict[str, Any]) -> int:
    """Parameters of :class:`LlamaModel` for a Llama ``config.json`` (tied LM head once)."""
    hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    vocab, inter = int(config["vocab_size"]), int(config["intermediate_size"])
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    if config.get("attention_bias"):
        attention += heads * head_dim + 2 * kv_heads * head_dim + hidden
    per_layer = attention + 3 * hidden * inter + 2 * hidden  # q/k/v/o, gate/up/down, 2 norms
    head = 0 if config.get("tie_word_embeddings") else vocab * hidden
    return vocab * hidden + layers * per_layer + hidden + head


def llama_kv_slot_bytes(config: dict[str, Any], positions: int, dtype_bytes: int) -> int:
    """One stream's K and V over `positions` in every layer."""
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    return 2 * int(config["num_hidden_layers"]) * kv_heads * head_dim * dtype_bytes * positions


def llm_positions(config: dict[str, Any]) -> int:
    """The slot length `ChatLLM` allocates: LLM_POSITIONS, or the model's limit if shorter."""
    return min(LLM_POSITIONS, int(config.get("max_position_embeddings") or LLM_POSITIONS))


def llm_footprint(checkpoint: Path | dict[str, Any], dtype: str) -> tuple[Footprint, int]:
    """The embedded LLM in `dtype` (bfloat16 or float32): its checkpoint directory, or
    that directory's ``config.json`` already read (`voxline.engines.checkpoints.llm_config`)."""
    config = (checkpoint if isinstance(checkpoint, dict)
              else json.loads((checkpoint / "config.json").read_text()))
    nbytes = BF16 if dtype == "bfloat16" else FLOAT32
    params = llama_params(config)
    positions = llm_positions(config)
    slot = llama_kv_slot_bytes(config, positions, nbytes)
    return Footprint(weights=params * nbytes, scratch=slot, per_session=slot,
                     parts=(f"LLM {positions} positions",)), params


def _numel(module: torch.nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def qwen3_tts_footprint(model_dir: Path) -> tuple[Footprint, int]:
    """Qwen3-TTS at `model_dir` as the factory loads it on CUDA (talker bf16, codec fp32)."""
    import torch

    from voxline.engines.models.qwen3_tts.code2wav import Code2WavDecoder
    from voxline.engines.models.qwen3_tts.config import load_code2wav_config, load_config
    from voxline.engines.models.qwen3_tts.speaker_encoder import SpeakerEncoder
    from voxline.engines.models.qwen3_tts.talker import Talker

    config = load_config(model_dir)
    with torch.device("meta"):  # shapes only: nothing is allocated
        talker = Talker(config.talker)
        decoder = Code2WavDecoder(load_code2wav_config(model_dir))
        state = decoder.new_state(1)
        speaker = (SpeakerEncoder(config.speaker_encoder)
                   if config.speaker_encoder is not None else None)
    t = config.talker
    talker_slot = 2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * BF16 * TTS_POSITIONS
    codec_slot = sum(x.numel() * x.element_size()
                     for x in (*state.tails, *state.keys, *state.values, state.key_pos,
                               state.frames))
    talker_params = _numel(talker) + _numel(speaker)
    codec_params = _numel(decoder)
    footprint = Footprint(weights=talker_params * BF16 + codec_params * FLOAT32,
                          scratch=talker_slot + codec_slot,
                          per_stream=talker_slot + CODE2WAV_SLOTS_PER_STREAM * codec_slot,
                          parts=(f"TTS {TTS_POSITIONS} positions",))
    return footprint, talker_params + codec_params


def _tensor_shapes(directory: Path) -> Iterator[tuple[str, list[int]]]:
    """(name, shape) of every tensor in the ``*.safetensors`` under `directory`, read from
    the headers."""
    for file in sorted(directory.rglob("*.safetensors")):
        with file.open("rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size))
        yield from ((name, t["shape"]) for name, t in header.items() if name != "__metadata__")


def safetensors_params(directory: Path) -> int:
    """Elements in every ``*.safetensors`` under `directory`, read from the headers."""
    return sum(math.prod(shape) for _name, shape in _tensor_shapes(directory))


def block_projection_params(directory: Path) -> int:
    """Elements of the 2-D `blocks.*` weights (the block linears) under `directory`: what
    `video_weights=fp8` stores in one byte instead of two."""
    return sum(math.prod(shape) for name, shape in _tensor_shapes(directory)
               if name.startswith("blocks.") and name.endswith(".weight") and len(shape) == 2)


def bf16_weights_footprint(directory: Path, part: str) -> Footprint:
    """A model loaded in bf16 whose per-session memory is working memory (Whisper, Helios)."""
    return Footprint(weights=safetensors_params(directory) * BF16, parts=(part,))
