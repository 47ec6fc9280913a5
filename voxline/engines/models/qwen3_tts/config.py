"""Typed views of a Qwen3-TTS checkpoint's ``config.json`` files (official layout).

A checkpoint directory holds ``config.json`` (talker, code predictor, speaker encoder,
special ids) and ``speech_tokenizer/config.json`` (the 12 Hz codec). Field names and
defaults follow the reference configuration classes, so a directory written by the
reference's ``save_pretrained`` (or downloaded) parses unchanged. Unknown keys are
ignored; missing required ones raise ``ValueError`` naming the file and field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CodePredictorConfig",
    "Code2WavConfig",
    "Qwen3TTSConfig",
    "SpeakerEncoderConfig",
    "TalkerConfig",
    "load_config",
    "load_code2wav_config",
]

SPEECH_TOKENIZER_DIR = "speech_tokenizer"


def _get(d: dict[str, Any], key: str, default: Any = ..., *, where: str) -> Any:
    if key in d and d[key] is not None:
        return d[key]
    if default is ...:
        raise ValueError(f"{where}: missing required field {key!r}")
    return default


@dataclass(frozen=True)
class RopeConfig:
    """Default (unscaled) RoPE, optionally multimodal (3 position streams)."""

    theta: float
    head_dim: int
    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool = False

    @classmethod
    def parse(cls, d: dict[str, Any], head_dim: int, *, where: str) -> RopeConfig:
        scaling = d.get("rope_scaling") or {}
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"{where}: rope_type {rope_type!r} is not supported")
        section = scaling.get("mrope_section")
        if section is not None and 2 * sum(section) != head_dim:
            raise ValueError(f"{where}: mrope_section {section} does not cover head_dim {head_dim}")
        return cls(
            theta=float(_get(d, "rope_theta", 10000.0, where=where)),
            head_dim=head_dim,
            mrope_section=tuple(section) if section is not None else None,
            mrope_interleaved=bool(scaling.get("interleaved", False)),
        )


@dataclass(frozen=True)
class TransformerConfig:
    """Shape of one Qwen3-style decoder stack (shared by talker and code predictor)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    attention_bias: bool
    rope: RopeConfig
    # Per layer: None = full causal attention, else the sliding window size.
    layer_windows: tuple[int | None, ...]

    @staticmethod
    def _parse_common(
        d: dict[str, Any], *, where: str, head_dim_default: int | None, per_layer_types: bool
    ) -> dict[str, Any]:
        hidden = int(_get(d, "hidden_size", where=where))
        heads = int(_get(d, "num_attention_heads", where=where))
        head_dim = int(d.get("head_dim") or head_dim_default or hidden // heads)
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"{where}: hidden_act {act!r} is not supported")
        layers = int(_get(d, "num_hidden_layers", where=where))
        window = d.get("sliding_window") if d.get("use_sliding_window") else None
        if per_layer_types:
            types = d.get("layer_types") or [
                "sliding_attention" if window is not None and i >= d.get("max_window_layers", 28)
                else "full_attention"
                for i in range(layers)
            ]
        else:  # the talker slides on every layer when it slides at all
            types = ["sliding_attention"] * layers
        return dict(
            hidden_size=hidden,
            intermediate_size=int(_get(d, "intermediate_size", where=where)),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(_get(d, "rms_norm_eps", 1e-6, where=where)),
            attention_bias=bool(d.get("attention_bias", False)),
            rope=RopeConfig.parse(d, head_dim, where=where),
            layer_windows=tuple(
                int(window) if t == "sliding_attention" and window is not None else None
                for t in types
            ),
        )


@dataclass(frozen=True)
class CodePredictorConfig(TransformerConfig):
    """The small AR model that fills codebooks 2..N of each frame."""

    vocab_size: int = 2048
    num_code_groups: int = 16

    @classmethod
    def parse(cls, d: dict[str, Any], *, where: str = "code_predictor_config") -> CodePredictorConfig:
        # The reference's constructor defaults head_dim to 128 (not hidden / heads).
        common = cls._parse_common(d, where=where, head_dim_default=128, per_layer_types=True)
        return cls(
            **common,
            vocab_size=int(_get(d, "vocab_size", 2048, where=where)),
            num_code_groups=int(_get(d, "num_code_groups", 32, where=where)),
        )


@dataclass(frozen=True)
class TalkerConfig(TransformerConfig):
    """The talker: codec-token LM over text + codec embeddings, plus special codec ids."""

    vocab_size: int = 3072
    num_code_groups: int = 16
    text_hidden_size: int = 2048
    text_vocab_size: int = 151936
    codec_eos_token_id: int = 4198
    codec_think_id: int = 4202
    codec_nothink_id: int = 4203
    codec_think_bos_id: int = 4204
    codec_think_eos_id: int = 4205
    codec_pad_id: int = 4196
    codec_bos_id: int = 4197
    spk_id: dict[str, int] = field(default_factory=dict)
    spk_is_dialect: dict[str, str | bool] = field(default_factory=dict)
    codec_language_id: dict[str, int] = field(default_factory=dict)
    code_predictor: CodePredictorConfig | None = None

    @classmethod
    def parse(cls, d: dict[str, Any], *, where: str = "talker_config") -> TalkerConfig:
        common = cls._parse_common(d, where=where, head_dim_default=None, per_layer_types=False)
        ids = {
            k: int(_get(d, k, where=where))
            for k in (
                "codec_eos_token_id", "codec_think_id", "codec_nothink_id",
                "codec_think_bos_id", "codec_think_eos_id", "codec_pad_id", "codec_bos_id",
            )
        }
        return cls(
            **common,
            vocab_size=int(_get(d, "vocab_size", where=where)),
            num_code_groups=int(_get(d, "num_code_groups", 32, where=where)),
            text_hidden_size=int(_get(d, "text_hidden_size", 2048, where=where)),
            text_vocab_size=int(_get(d, "text_vocab_size", where=where)),
            **ids,
            spk_id={str(k).lower(): _scalar_id(v) for k, v in (d.get("spk_id") or {}).items()},
            spk_is_dialect={str(k).lower(): v for k, v in (d.get("spk_is_dialect") or {}).items()},
            codec_language_id={
                str(k).lower(): int(v) for k, v in (d.get("codec_language_id") or {}).items()
            },
            code_predictor=CodePredictorConfig.parse(
                d.get("code_predictor_config") or {}, where=f"{where}.code_predictor_config"
            ),
        )


def _scalar_id(v: Any) -> int:
    # Some exported configs store a speaker id as a one-element list.
    return int(v[0]) if isinstance(v, list | tuple) else int(v)


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    """ECAPA-TDNN x-vector encoder of the Base (voice clone) models."""

    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000

    @classmethod
    def parse(cls, d: dict[str, Any]) -> SpeakerEncoderConfig:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for k in ("enc_channels", "enc_kernel_sizes", "enc_dilations"):
            if k in known:
                known[k] = tuple(known[k])
        return cls(**known)


@dataclass(frozen=True)
class Qwen3TTSConfig:
    """Top-level ``config.json``: model kind, text special ids and the sub-models."""

    talker: TalkerConfig
    speaker_encoder: SpeakerEncoderConfig | None
    tts_model_type: str | None
    tts_model_size: str | None
    tokenizer_type: str | None
    im_start_token_id: int
    im_end_token_id: int
    tts_pad_token_id: int
    tts_bos_token_id: int
    tts_eos_token_id: int

    @classmethod
    def parse(cls, d: dict[str, Any]) -> Qwen3TTSConfig:
        kind = d.get("tts_model_type")
        return cls(
            talker=TalkerConfig.parse(d.get("talker_config") or {}),
            speaker_encoder=(
                SpeakerEncoderConfig.parse(d.get("speaker_encoder_config") or {})
                if kind == "base"
                else None
            ),
            tts_model_type=kind,
            tts_model_size=d.get("tts_model_size"),
            tokenizer_type=d.get("tokenizer_type"),
            im_start_token_id=int(d.get("im_start_token_id", 151644)),
            im_end_token_id=int(d.get("im_end_token_id", 151645)),
            tts_pad_token_id=int(d.get("tts_pad_token_id", 151671)),
            tts_bos_token_id=int(d.get("tts_bos_token_id", 151672)),
            tts_eos_token_id=int(d.get("tts_eos_token_id", 151673)),
        )


@dataclass(frozen=True)
class Code2WavConfig:
    """The 12 Hz codec's decoder (``speech_tokenizer/config.json``, ``decoder_config``)."""

    codebook_size: int
    codebook_dim: int
    num_quantizers: int
    hidden_size: int
    latent_dim: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    attention_bias: bool
    rms_norm_eps: float
    rope_theta: float
    sliding_window: int
    upsample_rates: tuple[int, ...]
    upsampling_ratios: tuple[int, ...]
    decoder_dim: int
    output_sample_rate: int = 24000

    @property
    def samples_per_frame(self) -> int:
        n = 1
        for r in (*self.upsample_rates, *self.upsampling_ratios):
            n *= r
        return n

    @classmethod
    def parse(cls, d: dict[str, Any], *, where: str = "speech_tokenizer/config.json") -> Code2WavConfig:
        dec = d.get("decoder_config") or {}
        w = f"{where}: decoder_config"
        hidden = int(_get(dec, "hidden_size", 1024, where=w))
        heads = int(_get(dec, "num_attention_heads", 16, where=w))
        act = dec.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"{w}: hidden_act {act!r} is not supported")
        scaling = dec.get("rope_scaling")
        if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
            raise ValueError(f"{w}: rope_scaling {scaling} is not supported")
        cfg = cls(
            codebook_size=int(_get(dec, "codebook_size", 2048, where=w)),
            codebook_dim=int(_get(dec, "codebook_dim", where=w)),
            num_quantizers=int(_get(dec, "num_quantizers", 16, where=w)),
            hidden_size=hidden,
            latent_dim=int(_get(dec, "latent_dim", 1024, where=w)),
            intermediate_size=int(_get(dec, "intermediate_size", 3072, where=w)),
            num_hidden_layers=int(_get(dec, "num_hidden_layers", 8, where=w)),
            num_attention_heads=heads,
            num_key_value_heads=int(_get(dec, "num_key_value_heads", 16, where=w)),
            head_dim=int(dec.get("head_dim") or hidden // heads),
            attention_bias=bool(dec.get("attention_bias", False)),
            rms_norm_eps=float(_get(dec, "rms_norm_eps", 1e-5, where=w)),
            rope_theta=float(_get(dec, "rope_theta", 10000.0, where=w)),
            sliding_window=int(_get(dec, "sliding_window", 72, where=w)),
            upsample_rates=tuple(int(r) for r in _get(dec, "upsample_rates", (8, 5, 4, 3), where=w)),
            upsampling_ratios=tuple(int(r) for r in _get(dec, "upsampling_ratios", (2, 2), where=w)),
            decoder_dim=int(_get(dec, "decoder_dim", 1536, where=w)),
            output_sample_rate=int(d.get("output_sample_rate", 24000)),
        )
        rate = d.get("decode_upsample_rate")
        if rate is not None and int(rate) != cfg.samples_per_frame:
            raise ValueError(
                f"{where}: decode_upsample_rate {rate} != product of upsampling factors "
                f"{cfg.samples_per_frame}"
            )
        return cfg


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: not found (expected the official checkpoint layout)") from None


def load_config(model_dir: str | Path) -> Qwen3TTSConfig:
    """Parse ``MODEL_DIR/config.json``."""
    return Qwen3TTSConfig.parse(_read_json(Path(model_dir) / "config.json"))


def load_code2wav_config(path: str | Path) -> Code2WavConfig:
    """Parse a codec config: a model dir (uses its ``speech_tokenizer/``) or the codec dir."""
    path = Path(path)
    if (path / SPEECH_TOKENIZER_DIR / "config.json").exists():
        path = path / SPEECH_TOKENIZER_DIR
    return Code2WavConfig.parse(_read_json(path / "config.json"), where=str(path / "config.json"))
