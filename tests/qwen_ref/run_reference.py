"""Runs the official ``qwen-tts`` reference for the voxline parity tests.

Executed by the reference venv's python (scripts/qwen_ref_venv.sh), never by voxline's:

    python run_reference.py JOB.json

JOB.json::

    {"out": DIR, "seed": 0,
     "config": {...Qwen3TTSConfig kwargs...},
     "tokenizer_config": {...Qwen3TTSTokenizerV2Config kwargs...},
     "eos_bias": 0.0,
     "tasks": [{"kind": "generate", "name": ..., "requests": [...], ...},
               {"kind": "decode", "name": ..., "codes": [[[q0..q15], ...], ...]},
               {"kind": "speaker_embedding" | "encode", "name": ..., "audio": [...]},
               {"kind": "clone_from_audio", "name": ..., "audio": [...], "input_ids": [...],
                "ref_ids": [...], "max_new_tokens": N}]}

It builds the reference model from the configs with seeded random weights (scaled so
logits have O(1) gaps and the waveform is not saturated), writes the checkpoint in the
official layout with ``save_pretrained`` (DIR/model, DIR/model/speech_tokenizer), loads
it back with the official ``from_pretrained``, runs the tasks and writes DIR/result.npz
(arrays keyed ``{task}/{field}/{i}``) and DIR/result.json (timings, shapes).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _compat  # noqa: E402

_compat.install()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model  # noqa: E402
from qwen_tts.core.models import (  # noqa: E402
    Qwen3TTSConfig,
    Qwen3TTSForConditionalGeneration,
)
from torch import nn  # noqa: E402

PREPROCESSOR_CONFIG = {
    "chunk_length_s": None,
    "feature_extractor_type": "EncodecFeatureExtractor",
    "feature_size": 1,
    "overlap": None,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": 24000,
}


# --------------------------------------------------------------------------- weights


def _randomize(model: nn.Module, gen: torch.Generator, *, head_gain: float = 2.0) -> None:
    """Seeded weights with O(1) activations: fan-in scaled, norms near 1. Drawn on the
    generator's device (a CUDA generator builds a full-size model quickly)."""

    def normal(t: torch.Tensor, std: float, mean: float = 0.0) -> None:
        t.copy_(torch.randn(t.shape, generator=gen, device=gen.device) * std + mean)

    with torch.no_grad():
        for name, module in sorted(model.named_modules(), key=lambda kv: kv[0]):
            kind = type(module).__name__
            if isinstance(module, nn.Linear):
                gain = head_gain if name.endswith(("codec_head", "lm_head")) or ".lm_head." in name else 1.0
                normal(module.weight, gain / math.sqrt(module.in_features))
                if module.bias is not None:
                    normal(module.bias, 0.02)
            elif isinstance(module, nn.ConvTranspose1d):
                k, s = module.kernel_size[0], module.stride[0]
                normal(module.weight, 1.0 / math.sqrt(module.in_channels * k / s))
                if module.bias is not None:
                    normal(module.bias, 0.02)
            elif isinstance(module, nn.Conv1d):
                k = module.kernel_size[0]
                normal(module.weight, 1.0 / math.sqrt(module.in_channels // module.groups * k))
                if module.bias is not None:
                    normal(module.bias, 0.02)
            elif isinstance(module, nn.Embedding):
                normal(module.weight, 0.5)
            elif isinstance(module, nn.LayerNorm):
                normal(module.weight, 0.1, 1.0)
                normal(module.bias, 0.02)
            elif kind.endswith("RMSNorm"):
                normal(module.weight, 0.1, 1.0)
            elif kind == "SnakeBeta":
                normal(module.alpha, 0.3)
                normal(module.beta, 0.3)
            elif kind == "EuclideanCodebook":
                normal(module.embedding_sum, 1.0)
                module.cluster_usage.copy_(
                    torch.rand(module.cluster_usage.shape, generator=gen, device=gen.device) * 1.5 + 0.5)
            elif kind.endswith("LayerScale"):
                normal(module.scale, 0.01, 0.1)
            elif kind.endswith("ConvNeXtBlock"):
                normal(module.gamma, 0.01, 0.1)
        # Keep the vocoder's residual stack from growing ~4x per block, so the waveform
        # stays mostly inside the final clamp to [-1, 1].
        for module in model.modules():
            if type(module).__name__.endswith("DecoderResidualUnit"):
                module.conv2.conv.weight.mul_(0.2)
        decoder = getattr(model, "decoder", None)
        if decoder is not None and hasattr(decoder, "decoder"):
            decoder.decoder[-1].conv.weight.mul_(0.1)


# --------------------------------------------------------------------------- build


def _fix_speaker_encoder_config(path: Path) -> None:
    """Make the saved config loadable by the reference itself.

    ``save_pretrained`` writes ``model_type`` into ``speaker_encoder_config``, whose
    constructor takes no ``**kwargs`` and so rejects it on load; the published
    checkpoints carry only the encoder's own fields there.
    """
    import inspect

    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig

    allowed = set(inspect.signature(Qwen3TTSSpeakerEncoderConfig.__init__).parameters) - {"self"}
    config = json.loads(path.read_text())
    config["speaker_encoder_config"] = {
        k: v for k, v in config["speaker_encoder_config"].items() if k in allowed
    }
    path.write_text(json.dumps(config, indent=2, sort_keys=True))


def build_and_save(job: dict, out: Path) -> tuple[Qwen3TTSForConditionalGeneration, Qwen3TTSTokenizerV2Model]:
    seed = int(job.get("seed", 0))
    gen = torch.Generator().manual_seed(seed)
    model_dir = out / "model"
    tok_dir = model_dir / "speech_tokenizer"

    config = Qwen3TTSConfig(**job["config"])
    torch.manual_seed(seed)
    model = Qwen3TTSForConditionalGeneration(config).eval()
    _randomize(model, gen)
    eos_bias = float(job.get("eos_bias", 0.0))
    if eos_bias:
        # Makes the codec EOS reachable within a few dozen greedy steps.
        eos = config.talker_config.codec_eos_token_id
        with torch.no_grad():
            model.talker.codec_head.weight[eos] *= eos_bias
    model.save_pretrained(model_dir)
    _fix_speaker_encoder_config(model_dir / "config.json")

    tok_config = Qwen3TTSTokenizerV2Config(**job["tokenizer_config"])
    tokenizer = Qwen3TTSTokenizerV2Model(tok_config).eval()
    _randomize(tokenizer, gen)
    tokenizer.save_pretrained(tok_dir)
    (tok_dir / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2))

    # Reload through the official entry points, so the tests compare against what a
    # user of the published checkpoint layout gets.
    loaded = Qwen3TTSForConditionalGeneration.from_pretrained(
        str(model_dir), local_files_only=True, dtype=torch.float32
    ).eval()
    return loaded, loaded.speech_tokenizer.model.eval()


# --------------------------------------------------------------------------- tasks


def _generate(model, task: dict, arrays: dict, meta: dict) -> None:
    reqs = task["requests"]
    input_ids = [torch.tensor([r["input_ids"]], dtype=torch.long) for r in reqs]
    instruct_ids = [
        torch.tensor([r["instruct_ids"]], dtype=torch.long) if r.get("instruct_ids") else None
        for r in reqs
    ]
    kwargs = dict(
        input_ids=input_ids,
        instruct_ids=instruct_ids,
        languages=[r.get("language", "auto") for r in reqs],
        speakers=[r.get("speaker") for r in reqs],
        non_streaming_mode=bool(task.get("non_streaming_mode", False)),
        max_new_tokens=int(task["max_new_tokens"]),
        do_sample=False,
        subtalker_dosample=False,
        repetition_penalty=float(task.get("repetition_penalty", 1.05)),
    )
    if task.get("voice_clone"):
        vc = task["voice_clone"]
        kwargs["voice_clone_prompt"] = dict(
            ref_code=[torch.tensor(c, dtype=torch.long) if c is not None else None for c in vc["ref_code"]],
            ref_spk_embedding=[torch.tensor(e, dtype=torch.float32) for e in vc["ref_spk_embedding"]],
            x_vector_only_mode=list(vc["x_vector_only_mode"]),
            icl_mode=list(vc["icl_mode"]),
        )
        kwargs["ref_ids"] = [
            torch.tensor([ids], dtype=torch.long) if ids else None for ids in vc["ref_ids"]
        ]
        kwargs["speakers"] = None
    codes, hiddens = model.generate(**kwargs)
    for i, c in enumerate(codes):
        arrays[f"{task['name']}/codes/{i}"] = c.numpy().astype(np.int64)
    meta[task["name"]] = {"frames": [int(c.shape[0]) for c in codes]}


def _decode(tokenizer, task: dict, arrays: dict, meta: dict) -> None:
    codes = [torch.tensor(c, dtype=torch.long) for c in task["codes"]]
    with torch.inference_mode():
        for i, c in enumerate(codes):
            # The official decode path (chunked_decode; one chunk for <= 300 frames) ...
            wav = tokenizer.decode(c[None], return_dict=True).audio_values[0]
            arrays[f"{task['name']}/wav/{i}"] = wav.float().numpy()
            # ... and the decoder's own full-sequence forward.
            full = tokenizer.decoder(c.T[None])[0, 0]
            arrays[f"{task['name']}/full/{i}"] = full.float().numpy()
        if len(codes) > 1:
            padded = torch.nn.utils.rnn.pad_sequence(codes, batch_first=True, padding_value=-1)
            wavs = tokenizer.decode(padded, return_dict=True).audio_values
            for i, w in enumerate(wavs):
                arrays[f"{task['name']}/batched/{i}"] = w.float().numpy()
    meta[task["name"]] = {"frames": [int(c.shape[0]) for c in codes]}


def _speaker_embedding(model, task: dict, arrays: dict, meta: dict) -> None:
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    for i, audio in enumerate(task["audio"]):
        wav = np.asarray(audio, dtype=np.float32)
        emb = model.extract_speaker_embedding(wav, 24000)
        arrays[f"{task['name']}/embedding/{i}"] = emb.float().numpy()
        # The front end alone, with the arguments extract_speaker_embedding uses.
        mel = mel_spectrogram(
            torch.from_numpy(wav)[None], n_fft=1024, num_mels=128, sampling_rate=24000,
            hop_size=256, win_size=1024, fmin=0, fmax=12000,
        ).transpose(1, 2)
        arrays[f"{task['name']}/mel/{i}"] = mel[0].numpy()
    meta[task["name"]] = {"count": len(task["audio"])}


def _encode(tokenizer, task: dict, arrays: dict, meta: dict) -> None:
    for i, audio in enumerate(task["audio"]):
        x = torch.tensor(audio, dtype=torch.float32)[None]
        with torch.inference_mode():
            codes = tokenizer.encode(x, torch.ones_like(x, dtype=torch.long), return_dict=True).audio_codes[0]
        arrays[f"{task['name']}/codes/{i}"] = codes.numpy().astype(np.int64)
    meta[task["name"]] = {"count": len(task["audio"])}


def _clone_from_audio(model, tokenizer, task: dict, arrays: dict, meta: dict) -> None:
    """The Base model's ``generate_voice_clone`` (ICL) flow, minus text tokenization."""
    audio = np.asarray(task["audio"], dtype=np.float32)
    x = torch.from_numpy(audio)[None]
    with torch.inference_mode():
        ref_code = tokenizer.encode(x, torch.ones_like(x, dtype=torch.long), return_dict=True).audio_codes[0]
    spk = model.extract_speaker_embedding(audio, 24000)
    codes, _ = model.generate(
        input_ids=[torch.tensor([task["input_ids"]])],
        ref_ids=[torch.tensor([task["ref_ids"]])],
        voice_clone_prompt=dict(
            ref_code=[ref_code], ref_spk_embedding=[spk], x_vector_only_mode=[False], icl_mode=[True]
        ),
        languages=[task.get("language", "auto")],
        non_streaming_mode=False,
        max_new_tokens=int(task["max_new_tokens"]),
        do_sample=False,
        subtalker_dosample=False,
    )
    # As generate_voice_clone: decode reference + new frames, cut the reference's share.
    full = torch.cat([ref_code, codes[0]], dim=0)
    with torch.inference_mode():
        wav = tokenizer.decode(full[None], return_dict=True).audio_values[0]
    cut = int(ref_code.shape[0] / max(full.shape[0], 1) * wav.shape[0])
    arrays[f"{task['name']}/codes/0"] = codes[0].numpy().astype(np.int64)
    arrays[f"{task['name']}/wav/0"] = wav[cut:].float().numpy()
    meta[task["name"]] = {"frames": [int(codes[0].shape[0])], "ref_frames": int(ref_code.shape[0])}


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(int(job.get("threads", 1)))
    t0 = time.perf_counter()
    model, tokenizer = build_and_save(job, out)
    meta: dict = {"build_s": time.perf_counter() - t0, "tasks": {}}
    arrays: dict[str, np.ndarray] = {}
    for task in job.get("tasks", []):
        t = time.perf_counter()
        kind = task["kind"]
        if kind == "generate":
            _generate(model, task, arrays, meta["tasks"])
        elif kind == "decode":
            _decode(tokenizer, task, arrays, meta["tasks"])
        elif kind == "speaker_embedding":
            _speaker_embedding(model, task, arrays, meta["tasks"])
        elif kind == "encode":
            _encode(tokenizer, task, arrays, meta["tasks"])
        elif kind == "clone_from_audio":
            _clone_from_audio(model, tokenizer, task, arrays, meta["tasks"])
        else:
            raise ValueError(f"unknown task kind {kind!r}")
        meta["tasks"][task["name"]]["seconds"] = time.perf_counter() - t
    np.savez(out / "result.npz", **arrays)
    (out / "result.json").write_text(json.dumps(meta, indent=2))


if __name__ == "__main__":
    main()
