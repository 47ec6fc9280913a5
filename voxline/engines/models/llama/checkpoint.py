"""Loading a Llama checkpoint (default: the shipped SmolLM2) as our :class:`LlamaModel`.

A checkpoint is a local HF-layout directory, a hub id already in the local hub cache,
or ``None`` for the shipped SmolLM2 (converted on first use, :mod:`.smollm2`). The
tokenizer always comes back with a chat template (:func:`.smollm2.fix_tokenizer`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, NamedTuple

import torch

from voxline.engines.checkpoints import checkpoint_dir
from voxline.kernels.int8_linear import int8_max_rows, native_bfloat16
from voxline.logs import timed

from .model import LlamaModel
from .smollm2 import IM_END, SMOLLM2_NAME, ensure_smollm2, fix_tokenizer

logger = logging.getLogger(__name__)

INT8 = "int8"  # load_llm's dtype for int8 weights (float32 activations)


class LoadedLLM(NamedTuple):
    """Our model (eval mode, no cache attached yet), its tokenizer and the HF config."""

    model: LlamaModel
    tokenizer: Any  # a transformers PreTrainedTokenizerBase
    config: Any  # a transformers LlamaConfig


# --------------------------------------------------------------------------- loading


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return value


def resolve_checkpoint(path: str | Path | None, cache: Path | None) -> Path:
    """The local directory `load_llm` reads: for ``path=None`` the shipped SmolLM2's
    converted copy in `cache` (converted now on first use), else the user's checkpoint
    directory or cached hub snapshot (`voxline.engines.checkpoints.checkpoint_dir`).
    Capacity sizing reads configs through `voxline.engines.checkpoints.llm_config`
    instead, which never converts."""
    if path is None:
        return ensure_smollm2(cache)
    return checkpoint_dir(path)


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

    return fix_tokenizer(AutoTokenizer.from_pretrained(resolve_checkpoint(path, cache)))


def load_llm(
    path: str | Path | None = None,
    dtype: torch.dtype | str = torch.float32,
    *,
    device: torch.device | str = "cpu",
    cache: Path | None = None,
    dynamic_prefill: bool = False,
) -> LoadedLLM:
    """Our :class:`LlamaModel` + tokenizer + config; ``path=None`` is the shipped SmolLM2.

    ``path`` may be a local HF-layout directory or a hub id already in the local hub
    cache. ``dtype`` is a torch float dtype, or ``"int8"``: int8 linear weights with
    float32 activations (CPU; see :meth:`LlamaModel.quantize_int8`, which takes
    ``dynamic_prefill``). Raises
    :class:`ModelUnavailableError` when weights cannot be found.
    """
    from transformers import AutoConfig, AutoTokenizer

    int8 = str(dtype) == INT8
    if dynamic_prefill and not int8:
        raise ValueError(f"dynamic int8 prefill needs int8 weights, not {dtype}")
    float_dtype = torch.float32 if int8 else _as_dtype(dtype)
    directory = resolve_checkpoint(path, cache)
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
            model.quantize_int8(dynamic_prefill=dynamic_prefill)
            rows = int8_max_rows()
            logger.info("int8 weights: %s (aten's %s kernels, %s bfloat16)%s",
                        "every step" if rows is None else f"steps of up to {rows} rows, "
                        "float32 above", torch.backends.cpu.get_cpu_capability(),
                        "native" if native_bfloat16() else "no native",
                        "; prefill steps quantize their activations to int8 "
                        "(llm_int8_prefill=dynamic)" if dynamic_prefill else "")
        tokenizer = fix_tokenizer(AutoTokenizer.from_pretrained(directory))
    return LoadedLLM(model, tokenizer, config)


def load_hf_llm(
    path: str | Path | None = None,
    dtype: torch.dtype | str = torch.float32,
    *,
    cache: Path | None = None,
) -> Any:
    """The transformers ``LlamaForCausalLM`` of a checkpoint (reference for parity/benchmarks)."""
    from transformers import AutoModelForCausalLM

    directory = resolve_checkpoint(path, cache)
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
