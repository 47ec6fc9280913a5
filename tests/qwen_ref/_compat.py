"""Import shims for running the official ``qwen_tts`` package on CPU in its own venv.

``import qwen_tts`` pulls in the 25 Hz tokenizer, whose module imports ``sox``,
``torchaudio`` (its PyPI build links CUDA) and ``onnxruntime`` at import time. The
parity tests only use the 12 Hz tokenizer and the talker, so those modules are replaced
by empty stand-ins that fail loudly if anything actually calls into them.
"""

from __future__ import annotations

import sys
import types


class _Missing(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f"{self.__name__}.{name} is stubbed out in the parity venv")


def install() -> None:
    # transformers probes for torchaudio when it is first imported: let it see the truth.
    import transformers  # noqa: F401

    for name in ("sox", "onnxruntime", "torchaudio", "torchaudio.compliance",
                 "torchaudio.compliance.kaldi"):
        if name not in sys.modules:
            sys.modules[name] = _Missing(name)
    sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]
    sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]
