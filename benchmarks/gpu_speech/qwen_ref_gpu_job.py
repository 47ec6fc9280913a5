"""The official ``qwen-tts`` side of ``bench_qwen_ref_gpu.py``: build, save, load, time.

Runs under the reference's own packages, never voxline's (``qwen-tts`` pins
transformers 4.57.3): ``bench_qwen_ref_gpu.py`` starts it with a ``PYTHONPATH`` whose
first entry is a wheel target dir (the device) or with the CPU reference venv's python::

    PYTHONPATH=/tmp/ref python benchmarks/gpu_speech/qwen_ref_gpu_job.py JOB.json

JOB.json::

    {"out": DIR, "seed": 0, "device": "cuda", "dtype": "bfloat16",
     "config": {...Qwen3TTSConfig kwargs...}, "tokenizer_config": {...},
     "input_ids": [...], "speaker": "serena", "language": "auto",
     "frames": 50, "runs": 3, "batch": 4, "batch_runs": 1, "budget_s": 90}

It builds the model from the configs with seeded random weights drawn on ``device``
(tests/qwen_ref/run_reference.py's scheme), saves it in the official layout
(DIR/model, DIR/model/speech_tokenizer: talker in ``dtype``, codec in float32), loads it
back with the official ``from_pretrained`` as its README does (``dtype``, ``device_map``,
sdpa attention; the speech tokenizer gets the same ``dtype``), and times greedy
``generate`` on ``input_ids`` plus ``speech_tokenizer.decode`` of its codes: one warm-up,
then ``runs`` timed runs of one job and ``batch_runs`` of ``batch`` identical jobs in one
call; no run (warm-ups too) starts after ``budget_s`` of this part. Every job makes exactly ``frames``
frames: codec EOS is masked for every draw (``min_new_tokens`` = ``max_new_tokens`` =
``frames + 1``; the reference completes all but the last drawn first code). Writes
DIR/result.json (timings, greedy codes, package versions).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "qwen_ref"))
import _compat  # noqa: E402

_compat.install()


def _stub_audio_io() -> None:
    """librosa and soundfile are imported by ``qwen_tts.inference`` (file I/O, the 25 Hz
    tokenizer's mel) but never run here; where they are not installed, stand-ins that
    fail if called."""
    def fail(*_a, **_k):
        raise RuntimeError("librosa is stubbed out for the qwen-tts timing job")

    for name in ("librosa", "soundfile"):
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            sys.modules[name] = _compat._Missing(name)
    if isinstance(sys.modules.get("librosa"), _compat._Missing):
        filters = _compat._Missing("librosa.filters")
        filters.mel = fail  # imported by name at module level
        sys.modules["librosa.filters"] = filters
        sys.modules["librosa"].filters = filters


_stub_audio_io()

import torch  # noqa: E402
import transformers  # noqa: E402
from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model  # noqa: E402
from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration  # noqa: E402
from run_reference import PREPROCESSOR_CONFIG, _fix_speaker_encoder_config, _randomize  # noqa: E402


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def build_and_save(job: dict, model_dir: Path) -> dict:
    """The seeded random checkpoint, written in the official layout; seconds taken."""
    device, seed = job["device"], int(job.get("seed", 0))
    dtype = getattr(torch, job["dtype"])
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.device(device):
        model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**job["config"])).eval()
        tokenizer = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**job["tokenizer_config"])).eval()
    _randomize(model, gen)
    _randomize(tokenizer, gen)
    model.to(dtype)  # published checkpoints are bf16; the codec stays float32
    _sync(device)
    built = time.perf_counter()
    model.save_pretrained(model_dir)
    _fix_speaker_encoder_config(model_dir / "config.json")
    tok_dir = model_dir / "speech_tokenizer"
    tokenizer.save_pretrained(tok_dir)
    (tok_dir / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2))
    saved = time.perf_counter()
    del model, tokenizer
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {"build_s": round(built - t0, 2), "save_s": round(saved - built, 2)}


def load(job: dict, model_dir: Path) -> Qwen3TTSForConditionalGeneration:
    """The official loader with the README's arguments (sdpa: flash-attn is not installed)."""
    kwargs: dict = {"dtype": getattr(torch, job["dtype"]), "attn_implementation": "sdpa"}
    if job["device"] != "cpu":
        if importlib.util.find_spec("accelerate") is None:
            raise RuntimeError("device_map needs accelerate (qwen-tts pins accelerate==1.12.0)")
        kwargs["device_map"] = job["device"]
    return Qwen3TTSForConditionalGeneration.from_pretrained(
        str(model_dir), local_files_only=True, **kwargs).eval()


def force_length(model: Qwen3TTSForConditionalGeneration) -> None:
    """Codec EOS masked for every draw: the talker's HF ``generate`` gets
    ``min_new_tokens = max_new_tokens`` (the reference hard-codes 2)."""
    talker_generate = model.talker.generate

    def generate(*args, **kwargs):
        kwargs["min_new_tokens"] = kwargs["max_new_tokens"]
        return talker_generate(*args, **kwargs)

    model.talker.generate = generate


def speak(model, job: dict, batch: int) -> tuple[dict, list[torch.Tensor]]:
    """One ``generate`` of ``batch`` copies of the text, then the codec decode."""
    device = job["device"]
    ids = torch.tensor([job["input_ids"]], dtype=torch.long, device=device)
    _sync(device)
    t0 = time.perf_counter()
    codes, _ = model.generate(
        input_ids=[ids] * batch, languages=[job["language"]] * batch,
        speakers=[job["speaker"]] * batch, non_streaming_mode=False,
        max_new_tokens=int(job["frames"]) + 1, do_sample=False, subtalker_dosample=False,
        repetition_penalty=1.05,
    )
    _sync(device)
    t1 = time.perf_counter()
    wavs, sr = model.speech_tokenizer.decode([{"audio_codes": c} for c in codes])
    t2 = time.perf_counter()  # decode returns host arrays: the device is done
    frames = [int(c.shape[0]) for c in codes]
    if frames != [int(job["frames"])] * batch:
        raise AssertionError(f"reference made {frames} frames, wanted {job['frames']} each")
    row = {"generate_s": round(t1 - t0, 4), "decode_s": round(t2 - t1, 4), "total_s": round(t2 - t0, 4),
           "audio_s": round(sum(len(w) for w in wavs) / sr / batch, 4)}
    return row, codes


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    out = Path(job["out"])
    model_dir = out / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    if job["device"] == "cpu":
        torch.set_num_threads(int(job.get("threads", 1)))
    meta: dict = {"versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                               "qwen_tts": importlib.metadata.version("qwen-tts"),
                               "transformers_path": str(Path(transformers.__file__).parent)}}
    meta |= build_and_save(job, model_dir)
    print(f"[qwen-tts] built {meta['build_s']} s, saved {meta['save_s']} s", flush=True)
    t0 = time.perf_counter()
    model = load(job, model_dir)
    force_length(model)
    meta["load_s"] = round(time.perf_counter() - t0, 2)
    meta["talker_dtype"] = str(next(model.talker.parameters()).dtype)
    meta["codec_dtype"] = str(next(model.speech_tokenizer.model.parameters()).dtype)
    print(f"[qwen-tts] loaded {meta['load_s']} s ({meta['talker_dtype']} talker, "
          f"{meta['codec_dtype']} codec)", flush=True)

    meta["runs"] = {}
    start = time.perf_counter()
    speak(model, job, 1)  # warm-up (allocator, cuBLAS, lazy kernels)
    plan = [(1, r) for r in range(int(job["runs"]))]
    if int(job.get("batch", 0)) > 1:
        plan += [(int(job["batch"]), -1)] + [(int(job["batch"]), r) for r in range(int(job["batch_runs"]))]
    for c, r in plan:
        if time.perf_counter() - start > float(job["budget_s"]) and meta["runs"].get("1"):
            meta.setdefault("skipped", []).append(f"c={c} run {r}: over budget_s")
            continue
        row, codes = speak(model, job, c)
        if r < 0:  # the batch's own warm-up
            continue
        meta["runs"].setdefault(str(c), []).append(row)
        print(f"[qwen-tts] c={c} run {r}: {row}", flush=True)
        key = f"codes_c{c}"
        if key not in meta:
            meta[key] = [x.tolist() for x in codes]
        (out / "result.json").write_text(json.dumps(meta))  # partial results survive a timeout
    (out / "result.json").write_text(json.dumps(meta))


if __name__ == "__main__":
    main()
