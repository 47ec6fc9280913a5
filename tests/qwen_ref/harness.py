"""Test-side harness for Qwen3-TTS parity with the official ``qwen-tts`` reference.

Runs in voxline's venv. It holds the test model configurations (written in the
reference's ``config.json`` vocabulary), creates the reference venv through
``scripts/qwen_ref_venv.sh`` and runs ``run_reference.py`` in it, and builds seeded
random voxline models for the tests that need no reference.
"""

from __future__ import annotations

import atexit
import copy
import functools
import json
import math
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from voxline.engines.models.qwen3_tts import (
    ChatTokens,
    Code2WavDecoder,
    Qwen3TTSConfig,
    Talker,
)
from voxline.engines.models.qwen3_tts.config import Code2WavConfig

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
VENV_SCRIPT = REPO / "scripts" / "qwen_ref_venv.sh"
RUNNER = HERE / "run_reference.py"

# --------------------------------------------------------------------------- configs

TINY_CHAT = ChatTokens(im_start=240, im_end=241, assistant=242, user=244, newline=243)


def _talker(**overrides) -> dict:
    base = dict(
        vocab_size=1152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        rope_theta=10000, hidden_act="silu",
        rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3], "interleaved": True},
        num_code_groups=16, text_hidden_size=48, text_vocab_size=256,
        codec_eos_token_id=150, codec_think_id=154, codec_nothink_id=155,
        codec_think_bos_id=156, codec_think_eos_id=157, codec_pad_id=148, codec_bos_id=149,
        spk_id={"vivian": 200, "ryan": 201, "eric": 202},
        spk_is_dialect={"vivian": False, "ryan": False, "eric": "sichuan_dialect"},
        codec_language_id={"chinese": 160, "english": 161, "sichuan_dialect": 162},
        code_predictor_config=dict(
            vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_code_groups=16,
            rms_norm_eps=1e-6, rope_theta=10000, hidden_act="silu",
        ),
    )
    base.update(overrides)
    return base


def _model(talker: dict, **overrides) -> dict:
    base = dict(
        talker_config=talker, tts_model_type="custom_voice", tts_model_size="0b6",
        tokenizer_type="qwen3_tts_tokenizer_12hz", im_start_token_id=240, im_end_token_id=241,
        tts_pad_token_id=250, tts_bos_token_id=251, tts_eos_token_id=252,
    )
    base.update(overrides)
    return base


def _codec(decoder: dict, codebook_size: int) -> dict:
    spf = math.prod(decoder["upsample_rates"]) * math.prod(decoder["upsampling_ratios"])
    return dict(
        # A small Mimi encoder: only saved (the official layout has one), never run here.
        encoder_config=dict(
            hidden_size=32, num_filters=8, num_residual_layers=1, codebook_size=codebook_size,
            codebook_dim=16, num_quantizers=16, vector_quantization_hidden_dimension=16,
            num_semantic_quantizers=1, upsample_groups=32, num_hidden_layers=1,
            intermediate_size=64, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
        ),
        decoder_config=decoder,
        encoder_valid_num_quantizers=16,
        decode_upsample_rate=spf,
        encode_downsample_rate=1920,
    )


TINY_MODEL = _model(_talker())
# Base (voice clone): adds the ECAPA-TDNN speaker encoder; its output is a talker input.
BASE_MODEL = _model(
    _talker(),
    tts_model_type="base",
    speaker_encoder_config=dict(
        mel_dim=128, enc_dim=64, enc_channels=[32, 32, 32, 32, 96],
        enc_kernel_sizes=[5, 3, 3, 3, 1], enc_dilations=[1, 2, 3, 4, 1],
        enc_attention_channels=16, enc_res2net_scale=4, enc_se_channels=16, sample_rate=24000,
    ),
)
TINY_CODEC = _codec(
    dict(
        codebook_size=128, codebook_dim=16, hidden_size=32, latent_dim=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, intermediate_size=64, sliding_window=8,
        num_quantizers=16, upsample_rates=[2, 2], upsampling_ratios=[2], decoder_dim=32,
        rms_norm_eps=1e-5, rope_theta=10000, hidden_act="silu",
    ),
    codebook_size=128,
)

# Mid-size: the real codebook and control-token layout, the real 1920x vocoder upsampling
# and 72-frame window, a code predictor as wide as the talker (no projection), plain
# (non-interleaved) M-RoPE sections, and decoder head_dim != hidden / heads.
MID_MODEL = _model(
    _talker(
        vocab_size=3072, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, head_dim=32,
        rope_scaling={"rope_type": "default", "mrope_section": [4, 6, 6], "interleaved": False},
        text_hidden_size=128, text_vocab_size=256,
        codec_eos_token_id=2150, codec_think_id=2154, codec_nothink_id=2155,
        codec_think_bos_id=2156, codec_think_eos_id=2157, codec_pad_id=2148, codec_bos_id=2149,
        spk_id={"serena": 3000, "dylan": 3001},
        spk_is_dialect={"serena": False, "dylan": "beijing_dialect"},
        codec_language_id={"chinese": 2055, "english": 2050, "beijing_dialect": 2074},
        code_predictor_config=dict(
            vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
            num_attention_heads=8, num_key_value_heads=2, head_dim=32, num_code_groups=16,
            rms_norm_eps=1e-6, rope_theta=10000, hidden_act="silu",
        ),
    ),
    tts_model_size="1b7",
)
MID_CODEC = _codec(
    dict(
        codebook_size=2048, codebook_dim=64, hidden_size=64, latent_dim=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=128,
        sliding_window=72, num_quantizers=16, upsample_rates=[8, 5, 4, 3],
        upsampling_ratios=[2, 2], decoder_dim=96, rms_norm_eps=1e-5, rope_theta=10000,
        hidden_act="silu",
    ),
    codebook_size=2048,
)


def parse_configs(model: dict, codec: dict) -> tuple[Qwen3TTSConfig, Code2WavConfig]:
    return Qwen3TTSConfig.parse(model), Code2WavConfig.parse(codec)


# --------------------------------------------------------------------------- reference


class ReferenceUnavailable(RuntimeError):
    """The reference venv could not be created (e.g. no registry access)."""


_VENV_FAILURE: list[str] = []


@functools.cache
def _venv_python() -> str | None:
    try:
        proc = subprocess.run(
            ["bash", str(VENV_SCRIPT)], capture_output=True, text=True, timeout=1800,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        _VENV_FAILURE.append(f"{VENV_SCRIPT.name} failed to run: {exc}")
        return None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        _VENV_FAILURE.append(f"{VENV_SCRIPT.name} exited {proc.returncode}: " + " | ".join(tail))
        return None
    return proc.stdout.strip().splitlines()[-1]


def reference_python() -> str:
    """Create (once per process; a failure is not retried) the reference venv's python."""
    python = _venv_python()
    if python is None:
        raise ReferenceUnavailable(_VENV_FAILURE[-1])
    return python


@dataclass
class ReferenceRun:
    out: Path
    arrays: dict[str, np.ndarray]
    meta: dict

    @property
    def model_dir(self) -> Path:
        return self.out / "model"


_WORK = Path(tempfile.mkdtemp(prefix="voxline-qwen-ref-"))
atexit.register(shutil.rmtree, _WORK, ignore_errors=True)


def reference_or_skip(name: str, job: dict) -> ReferenceRun:
    """Run a reference job; skip the calling test if the reference venv cannot be made.

    Under CI (``CI`` set) a missing reference is a failure: CI's set-up builds it.
    """
    import os

    import pytest

    try:
        reference_python()
    except ReferenceUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"qwen-tts reference venv unavailable under CI: {exc}")
        pytest.skip(f"qwen-tts reference venv unavailable: {exc}")
    return run_reference(name, job)


def run_reference(name: str, job: dict, timeout: float = 900) -> ReferenceRun:
    """Run a job in the reference venv (cached by ``name`` for this process)."""
    return _run_cached(name, json.dumps(job, sort_keys=True), timeout)


@functools.cache
def _run_cached(name: str, job_json: str, timeout: float) -> ReferenceRun:
    python = reference_python()
    out = _WORK / name
    job = json.loads(job_json)
    job["out"] = str(out)
    out.mkdir(parents=True, exist_ok=True)
    job_path = out / "job.json"
    job_path.write_text(json.dumps(job))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [python, str(RUNNER), str(job_path)], capture_output=True, text=True, timeout=timeout,
        env=env, stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"reference job {name!r} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    with np.load(out / "result.npz") as data:
        arrays = {k: data[k] for k in data.files}
    return ReferenceRun(out, arrays, json.loads((out / "result.json").read_text()))


# --------------------------------------------------------------------------- local models


def randomize_(module: nn.Module, seed: int, *, head_gain: float = 2.0) -> None:
    """Seeded O(1)-scale weights for reference-free tests (same scheme as the reference job)."""
    gen = torch.Generator().manual_seed(seed)

    def normal(t: torch.Tensor, std: float, mean: float = 0.0) -> None:
        t.copy_(torch.randn(t.shape, generator=gen) * std + mean)

    with torch.no_grad():
        for name, m in sorted(module.named_modules(), key=lambda kv: kv[0]):
            kind = type(m).__name__
            if isinstance(m, nn.Linear):
                gain = head_gain if name.endswith("codec_head") or ".lm_head." in name else 1.0
                normal(m.weight, gain / math.sqrt(m.in_features))
                if m.bias is not None:
                    normal(m.bias, 0.02)
            elif isinstance(m, nn.ConvTranspose1d):
                normal(m.weight, 1.0 / math.sqrt(m.in_channels * m.kernel_size[0] / m.stride[0]))
                normal(m.bias, 0.02)
            elif isinstance(m, nn.Conv1d):
                normal(m.weight, 1.0 / math.sqrt(m.in_channels // m.groups * m.kernel_size[0]))
                if m.bias is not None:
                    normal(m.bias, 0.02)
            elif isinstance(m, nn.Embedding):
                normal(m.weight, 0.5)
            elif isinstance(m, nn.LayerNorm):
                normal(m.weight, 0.1, 1.0)
                normal(m.bias, 0.02)
            elif kind == "RMSNorm":
                normal(m.weight, 0.1, 1.0)
            elif kind == "SnakeBeta":
                normal(m.alpha, 0.3)
                normal(m.beta, 0.3)
            elif kind == "_Codebook":
                normal(m.embedding_sum, 1.0)
                m.cluster_usage.copy_(torch.rand(m.cluster_usage.shape, generator=gen) * 1.5 + 0.5)
            elif kind == "_LayerScale":
                normal(m.scale, 0.01, 0.1)
            elif kind == "ConvNeXtBlock":
                normal(m.gamma, 0.01, 0.1)
        # As in the reference job: keep the vocoder inside its final clamp.
        for m in module.modules():
            if type(m).__name__ == "ResidualUnit":
                m.conv2.conv.weight.mul_(0.2)
        if isinstance(module, Code2WavDecoder):
            module.decoder[-1].conv.weight.mul_(0.1)


def local_talker(model: dict, seed: int = 0) -> tuple[Qwen3TTSConfig, Talker]:
    config = Qwen3TTSConfig.parse(copy.deepcopy(model))
    talker = Talker(config.talker)
    randomize_(talker, seed)
    return config, talker.eval()


def local_decoder(codec: dict, seed: int = 0) -> Code2WavDecoder:
    decoder = Code2WavDecoder(Code2WavConfig.parse(copy.deepcopy(codec)))
    randomize_(decoder, seed)
    return decoder.eval()


def random_codes(frames: int, codebook_size: int, seed: int, groups: int = 16) -> list[list[int]]:
    """``[frames][groups]`` codes, as the reference's decode expects (time-major)."""
    gen = np.random.default_rng(seed)
    return gen.integers(0, codebook_size, size=(frames, groups)).tolist()


def text_ids(n: int, seed: int, vocab: int = 240) -> list[int]:
    gen = np.random.default_rng(seed)
    return gen.integers(0, vocab, size=n).tolist()
