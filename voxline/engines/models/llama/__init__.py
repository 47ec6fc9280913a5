"""The embedded LLM: a plain PyTorch Llama with a slot KV cache, its CUDA-graph decode,
the chat model the engine's LLM stage drives, and checkpoint loading (any Llama
checkpoint; by default the shipped SmolLM2).

- :mod:`.model`: :class:`LlamaModel` (transformers' parameter names, batched steps over
  cache slots);
- :mod:`.graphs`: :class:`GraphedLlamaDecoder` (decode steps as CUDA graphs, eager twin);
- :mod:`.chat`: :class:`ChatLLM` (slots, prefix sharing, chat template, sampling);
- :mod:`.checkpoint`: :func:`load_llm` and the transformers reference loaders;
- :mod:`.smollm2`: locating and converting the shipped SmolLM2 GGUF.

The cache (:mod:`..kv_cache`), sampling (:mod:`..sampling`) and layers (:mod:`..layers`)
are shared with Qwen3-TTS.
"""

from .chat import ChatLLM
from .checkpoint import (
    LoadedLLM,
    load_hf_llm,
    load_hf_smollm2,
    load_llm,
    load_tokenizer,
    stop_token_ids,
)
from .graphs import GraphedLlamaDecoder
from .model import LlamaModel

__all__ = [
    "ChatLLM",
    "GraphedLlamaDecoder",
    "LlamaModel",
    "LoadedLLM",
    "load_hf_llm",
    "load_hf_smollm2",
    "load_llm",
    "load_tokenizer",
    "stop_token_ids",
]
