"""Import shims for running the official ``qwen_tts`` package on CPU in its own venv.

``import qwen_tts`` pulls in the 25 Hz tokenizer, whose module imports ``sox``,
``torchaudio`` (its PyPI build links CUDA) and ``onnxruntime`` at import time. The
parity tests only use the 12 Hz tokenizer and the talker, so those modules are replaced
by empty stand-ins that fail loudly if anything actually calls into them.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types


class _Missing(types.ModuleType):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f"{self.__name__}.{name} is stubbed out in the parity venv")


def install() -> None:
    # transformers and torch._dynamo probe for these packages when first imported: let
    # them see the truth before the stand-ins go in.
    import torch._dynamo  # noqa: F401
    import transformers.generation  # noqa: F401

    for name in ("sox", "onnxruntime", "torchaudio", "torchaudio.compliance",
                 "torchaudio.compliance.kaldi"):
        if name not in sys.modules:
            sys.modules[name] = _Missing(name)
    sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]
    sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]
