"""The checkpoint's text tokenizer: text -> talker input ids.

An official Qwen3-TTS directory ships a Qwen2 byte-level BPE tokenizer (``vocab.json``,
``merges.txt``, ``tokenizer_config.json``; or a ``tokenizer.json``) next to
``config.json``; it is loaded with ``transformers.AutoTokenizer``. The reference wraps
the text as ``<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n`` and
tokenizes that string. Here the text is tokenized on its own, with special-token strings
in it read as plain text (so text cannot inject control tokens), and wrapped with the
chat ids (:func:`~.prompt.assistant_ids`): the byte-level pre-tokenizer never merges
across the ``\\n`` before the text or the special token after it, so for any text that
does not itself start with a newline the ids are the reference's.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from voxline.errors import ModelUnavailableError

from .config import Qwen3TTSConfig, load_config
from .prompt import ChatTokens, assistant_ids

__all__ = ["Qwen3TextTokenizer"]

_MODEL = "Qwen3-TTS text tokenizer"
_FILES = ("tokenizer.json", "vocab.json", "tokenizer_config.json")


class Qwen3TextTokenizer:
    """Text -> the talker's ``input_ids`` (the assistant template around the text)."""

    def __init__(self, tokenizer: Any, config: Qwen3TTSConfig, *, where: str = "") -> None:
        """``tokenizer``: a ``transformers`` tokenizer; validated against ``config``."""
        self.tokenizer = tokenizer
        self.text_vocab_size = config.talker.text_vocab_size
        where = where or "tokenizer"
        vocab = tokenizer.get_vocab()

        def special(name: str, expected: int) -> int:
            if name not in vocab:
                raise ModelUnavailableError(_MODEL, f"special token {name!r} in {where}")
            if vocab[name] != expected:
                raise ValueError(f"{where}: {name} is id {vocab[name]}, config.json says {expected}")
            return vocab[name]

        def single(text: str) -> int:
            ids = self._encode(text)
            if len(ids) != 1:
                raise ValueError(f"{where}: {text!r} must be one token, got {ids}")
            return ids[0]

        self.chat = ChatTokens(
            im_start=special("<|im_start|>", config.im_start_token_id),
            im_end=special("<|im_end|>", config.im_end_token_id),
            assistant=single("assistant"),
            user=single("user"),
            newline=single("\n"),
        )
        top = max(vocab.values())
        if top >= self.text_vocab_size:
            raise ValueError(
                f"{where}: tokenizer ids reach {top}, beyond the talker's text vocabulary "
                f"({self.text_vocab_size})"
            )

    @classmethod
    def from_pretrained(
        cls, model_dir: str | Path, config: Qwen3TTSConfig | None = None
    ) -> Qwen3TextTokenizer:
        """Load the tokenizer shipped in ``model_dir``; :class:`ModelUnavailableError` if
        the directory has none (or ``transformers`` is missing)."""
        model_dir = Path(model_dir)
        if not any((model_dir / f).exists() for f in _FILES):
            raise ModelUnavailableError(
                _MODEL, f"tokenizer files in {model_dir} (one of {', '.join(_FILES)})",
                "the official checkpoint ships a Qwen2 BPE tokenizer next to config.json",
            )
        try:
            from transformers import AutoTokenizer
            from transformers.utils import logging as hf_logging
        except ImportError as exc:
            raise ModelUnavailableError(_MODEL, "the transformers package", str(exc)) from exc
        config = config or load_config(model_dir)
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # AutoTokenizer complains about model_type qwen3_tts
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        except (OSError, ValueError) as exc:
            raise ModelUnavailableError(_MODEL, f"a loadable tokenizer in {model_dir}", str(exc)) from exc
        finally:
            hf_logging.set_verbosity(verbosity)
        logging.getLogger(__name__).debug("loaded %s from %s", type(tokenizer).__name__, model_dir)
        return cls(tokenizer, config, where=str(model_dir))

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))

    def text_ids(self, text: str) -> list[int]:
        """The text's own ids (no template); ``[]`` for blank text."""
        return self._encode(text) if text.strip() else []

    def assistant_ids(self, text: str) -> list[int] | None:
        """Talker ``input_ids`` for ``text``, or None when it has nothing to speak."""
        ids = self.text_ids(text)
        return assistant_ids(ids, self.chat) if ids else None
