"""The 12 Hz codec's encoder (24 kHz waveform -> codes), for voice-clone references.

The speech tokenizer's encoder is a Mimi encoder (SEANet + transformer + split RVQ),
which transformers ships as ``MimiModel``; this wraps it, loads the checkpoint's
``encoder.*`` keys (original flat Mimi layout, renamed for transformers 5's nested one),
keeps the first ``encoder_valid_num_quantizers`` codebooks and trims the frames to the
audio length, as the reference's ``Qwen3TTSTokenizerV2Model.encode`` does. Only the
one-off reference clip of a Base-model voice goes through it, never the live path.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .checkpoint import load_safetensors_dir
from .config import SPEECH_TOKENIZER_DIR

__all__ = ["CodecEncoder"]

# transformers 5 nests the encoder halves; checkpoints keep Mimi's original flat names.
_NESTED_RENAMES = (
    (re.compile(r"^encoder\.layers\."), "encoder.encoder_seanet.layers."),
    (re.compile(r"^encoder_transformer\."), "encoder.encoder_transformer."),
    (re.compile(r"^downsample\."), "encoder.downsample."),
)


class CodecEncoder:
    """``encode(wav_24k) -> codes [frames, num_quantizers]`` (long)."""

    def __init__(self, mimi: torch.nn.Module, num_quantizers: int, downsample_rate: int,
                 sample_rate: int) -> None:
        self.mimi = mimi.eval()
        self.num_quantizers = num_quantizers
        self.downsample_rate = downsample_rate
        self.sample_rate = sample_rate

    @classmethod
    def from_pretrained(cls, path: str | Path, *, device: torch.device | str = "cpu") -> CodecEncoder:
        """From a model dir (its ``speech_tokenizer/``) or a codec dir."""
        from transformers import MimiConfig, MimiModel

        path = Path(path)
        if (path / SPEECH_TOKENIZER_DIR).is_dir():
            path = path / SPEECH_TOKENIZER_DIR
        cfg = json.loads((path / "config.json").read_text())
        mimi_cfg = {k: v for k, v in cfg.get("encoder_config", {}).items() if k != "model_type"}
        config = MimiConfig(**mimi_cfg)
        try:  # transformers 5: encoding needs no decoder half
            config.decoder_config = None
        except (AttributeError, ValueError):
            pass
        mimi = MimiModel(config)
        expected = set(mimi.state_dict())
        nested = "downsample.conv.weight" not in expected
        sd = {}
        for key, value in load_safetensors_dir(path).items():
            if not key.startswith("encoder."):
                continue
            key = key[len("encoder.") :]
            if nested:
                for pattern, repl in _NESTED_RENAMES:
                    key = pattern.sub(repl, key)
            sd[key] = value
        missing = sorted(k for k in expected - sd.keys() if not k.startswith(("decoder", "upsample")))
        unexpected = sorted(sd.keys() - expected)
        if missing or unexpected:
            raise ValueError(
                f"{path}: codec encoder state dict mismatch: missing {missing[:10]}, "
                f"unexpected {unexpected[:10]}"
            )
        mimi.load_state_dict(sd, strict=False)
        return cls(
            mimi.to(device),
            num_quantizers=int(cfg.get("encoder_valid_num_quantizers", 16)),
            downsample_rate=int(cfg.get("encode_downsample_rate", 1920)),
            sample_rate=int(cfg.get("input_sample_rate", 24000)),
        )

    @torch.inference_mode()
    def encode(self, wav: Tensor | np.ndarray, sr: int = 24000) -> Tensor:
        """Mono waveform at the codec rate -> codes ``[ceil(len / 1920), Q]`` on CPU."""
        if sr != self.sample_rate:
            raise ValueError(f"the codec encoder takes {self.sample_rate} Hz audio, got {sr} Hz")
        x = torch.as_tensor(np.asarray(wav, dtype=np.float32) if not isinstance(wav, Tensor) else wav)
        if x.dim() != 1 or x.numel() == 0:
            raise ValueError(f"expected a non-empty mono waveform, got shape {tuple(x.shape)}")
        param = next(self.mimi.parameters())
        x = x.to(device=param.device, dtype=param.dtype)[None, None]
        codes = self.mimi.encode(x, num_quantizers=self.num_quantizers).audio_codes
        frames = math.ceil(x.shape[-1] / self.downsample_rate)
        return codes[0, : self.num_quantizers, :frames].T.cpu()
