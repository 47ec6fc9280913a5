"""Loading a Qwen3-TTS checkpoint directory in the official layout.

::

    MODEL_DIR/config.json, model.safetensors (or model.safetensors.index.json + shards)
    MODEL_DIR/speech_tokenizer/config.json, model.safetensors

Talker weights are the ``talker.*`` keys, the speaker encoder's ``speaker_encoder.*``
(Base models), the codec decoder's ``decoder.*`` of the speech tokenizer (its
``encoder.*`` is the audio->codes side, not needed to speak). Loading is strict: a key
the module expects but the file lacks, or an unexpected key under a loaded prefix, is an
error naming them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from .code2wav import Code2WavDecoder
from .config import SPEECH_TOKENIZER_DIR, Qwen3TTSConfig, load_code2wav_config, load_config
from .speaker_encoder import SpeakerEncoder
from .talker import Talker

__all__ = [
    "Qwen3TTSModel",
    "load_code2wav",
    "load_safetensors_dir",
    "load_speaker_encoder",
    "load_talker",
]

# Encoder-side projections stored inside the decoder's quantizer; decoding never uses them.
_UNUSED_DECODER_KEYS = ("quantizer.rvq_first.input_proj.weight", "quantizer.rvq_rest.input_proj.weight")


def load_safetensors_dir(directory: str | Path) -> dict[str, Tensor]:
    """All tensors of ``model.safetensors`` or of the shards its index lists."""
    directory = Path(directory)
    single = directory / "model.safetensors"
    if single.exists():
        return load_file(single)
    index = directory / "model.safetensors.index.json"
    if not index.exists():
        raise FileNotFoundError(f"{directory}: no model.safetensors or model.safetensors.index.json")
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    tensors: dict[str, Tensor] = {}
    for shard in shards:
        tensors.update(load_file(directory / shard))
    return tensors


def _load_into(
    module: nn.Module, tensors: dict[str, Tensor], prefix: str, *, ignore: tuple[str, ...] = (),
    where: str,
) -> None:
    sd = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    for key in ignore:
        sd.pop(key, None)
    expected = set(module.state_dict().keys())
    missing = sorted(expected - sd.keys())
    unexpected = sorted(sd.keys() - expected)
    if missing or unexpected:
        raise ValueError(
            f"{where}: state dict mismatch under {prefix!r}: missing {missing[:10]}"
            f"{'...' if len(missing) > 10 else ''}, unexpected {unexpected[:10]}"
            f"{'...' if len(unexpected) > 10 else ''}"
        )
    module.load_state_dict(sd, strict=True, assign=True)


def load_talker(
    model_dir: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    tensors: dict[str, Tensor] | None = None,
) -> Talker:
    """The talker (with its code predictor) of ``model_dir``."""
    config = load_config(model_dir)
    tensors = load_safetensors_dir(model_dir) if tensors is None else tensors
    with torch.device("meta"):
        talker = Talker(config.talker)
    _load_into(talker, tensors, "talker.", where=str(model_dir))
    return talker.to(device=device, dtype=dtype).eval()


def load_speaker_encoder(
    model_dir: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    tensors: dict[str, Tensor] | None = None,
) -> SpeakerEncoder:
    """The x-vector encoder of a Base (voice clone) checkpoint."""
    config = load_config(model_dir)
    if config.speaker_encoder is None:
        raise ValueError(
            f"{model_dir}: tts_model_type {config.tts_model_type!r} has no speaker encoder "
            "(only 'base' checkpoints clone voices)"
        )
    tensors = load_safetensors_dir(model_dir) if tensors is None else tensors
    with torch.device("meta"):
        encoder = SpeakerEncoder(config.speaker_encoder)
    _load_into(encoder, tensors, "speaker_encoder.", where=str(model_dir))
    return encoder.to(device=device, dtype=dtype).eval()


def load_code2wav(
    path: str | Path, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> Code2WavDecoder:
    """The codec decoder of a model dir (its ``speech_tokenizer/``) or of a codec dir."""
    path = Path(path)
    if (path / SPEECH_TOKENIZER_DIR).is_dir():
        path = path / SPEECH_TOKENIZER_DIR
    config = load_code2wav_config(path)
    tensors = load_safetensors_dir(path)
    with torch.device("meta"):
        decoder = Code2WavDecoder(config)
    _load_into(decoder, tensors, "decoder.", ignore=_UNUSED_DECODER_KEYS, where=str(path))
    return decoder.to(device=device, dtype=dtype).eval()


@dataclass
class Qwen3TTSModel:
    """Everything a checkpoint directory holds that speaking needs."""

    config: Qwen3TTSConfig
    talker: Talker
    code2wav: Code2WavDecoder
    speaker_encoder: SpeakerEncoder | None

    @classmethod
    def from_pretrained(
        cls, model_dir: str | Path, *, dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu", codec_dtype: torch.dtype = torch.float32,
    ) -> Qwen3TTSModel:
        """Load talker (``dtype``), codec decoder (``codec_dtype``) and, for Base models,
        the speaker encoder (float32)."""
        config = load_config(model_dir)
        tensors = load_safetensors_dir(model_dir)
        talker = load_talker(model_dir, dtype=dtype, device=device, tensors=tensors)
        encoder = (
            load_speaker_encoder(model_dir, device=device, tensors=tensors)
            if config.speaker_encoder is not None
            else None
        )
        code2wav = load_code2wav(model_dir, dtype=codec_dtype, device=device)
        return cls(config, talker, code2wav, encoder)
