"""Ours vs the official ``qwen-tts`` generate on the same weights, same text, same frames.

    python benchmarks/gpu_speech/bench_qwen_ref_gpu.py --ref-path /tmp/ref --out $OUT/qwen_ref_h200.json
    .venv/bin/python benchmarks/gpu_speech/bench_qwen_ref_gpu.py --device cpu --config mid \\
        --ref-python ~/.cache/voxline/qwen-ref-venv/bin/python          # the CPU check

1. The reference side (``qwen_ref_gpu_job.py``) runs in a subprocess under the
   reference's own packages: ``--ref-path`` DIR goes first on its ``PYTHONPATH`` (a wheel
   target dir holding transformers 4.57.3 and qwen-tts) or ``--ref-python`` is a venv's
   python. It builds the Qwen3-TTS-12Hz-1.7B-shaped model (``bench_gpu_tts.py``'s
   MODEL/CODEC; ``--config mid|tiny`` for the test configs) with seeded random weights
   on the device, saves it in the official layout, loads it with the official
   ``from_pretrained`` (talker and codec in ``--dtype``, as its README's
   ``dtype=torch.bfloat16`` does) and times greedy ``generate`` + ``speech_tokenizer.decode``.
2. Our side loads THAT checkpoint with voxline's loader (talker in ``--dtype``, code2wav
   in float32, as ``factory.load_tts`` does) and speaks the same text through
   ``Qwen3SpeechModel`` (``eager``: the plain generator; ``graphs``: CUDA graphs captured
   at load, not compiled), timing first audio and the whole job.

Both sides make exactly ``--frames`` frames per job: codec EOS is masked for every draw
(the reference's ``min_new_tokens`` forced to ``max_new_tokens`` = frames + 1; ours
``min_frames`` = ``max_frames`` = frames). Greedy on both sides, repetition penalty 1.05,
the streaming-text prompt layout (reference ``non_streaming_mode=False``), the same
``input_ids`` (the tiny BPE tokenizer's, wrapped in the assistant template), the same
speaker and language. Each side warms up once per concurrency, then times ``--runs``
single jobs (``--eager-runs`` for ours eagerly) and ``--batch-runs`` batches of
``--batch`` jobs started together (one reference ``generate`` call of the batch). The
reference returns audio only at the end, so its first audio is its total. Our greedy
codes (recorded in the warm-up, untimed) are compared with the reference's: the agreeing
prefix is reported (float32 on the CPU agrees exactly; bf16 kernels drift after a few
frames). Prints one table and writes the JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from bench_gpu_tts import CODEC, FRAME_S, MODEL, TEXT, build_tokenizer, speak  # noqa: E402
from qwen_ref.harness import MID_CODEC, MID_MODEL, TINY_CODEC, TINY_MODEL  # noqa: E402

from voxline.engines.models.qwen3_tts import TalkerSampling  # noqa: E402
from voxline.engines.models.qwen3_tts.checkpoint import Qwen3TTSModel  # noqa: E402
from voxline.engines.models.qwen3_tts.config import Qwen3TTSConfig  # noqa: E402
from voxline.engines.models.qwen3_tts.jobs import FRAMES_BASE, FRAMES_PER_TOKEN  # noqa: E402
from voxline.engines.models.qwen3_tts.speech_model import Qwen3SpeechModel  # noqa: E402

JOB = HERE / "qwen_ref_gpu_job.py"
TEXT_VOCAB = 320  # the tiny BPE tokenizer's vocabulary (bench_gpu_tts.build_tokenizer)


def configs(name: str) -> tuple[dict, dict]:
    """(model, codec) configs in the reference's vocabulary. ``full``: the 1.7B shapes;
    its codec takes the test configs' small Mimi encoder (saved, never run)."""
    if name == "full":
        return copy.deepcopy(MODEL), {**copy.deepcopy(MID_CODEC), **copy.deepcopy(CODEC)}
    model, codec = (MID_MODEL, MID_CODEC) if name == "mid" else (TINY_MODEL, TINY_CODEC)
    model = copy.deepcopy(model)
    model["talker_config"]["text_vocab_size"] = TEXT_VOCAB
    model.update(im_start_token_id=1, im_end_token_id=2, tts_pad_token_id=3, tts_bos_token_id=4,
                 tts_eos_token_id=5)
    return model, copy.deepcopy(codec)


def run_reference(args: argparse.Namespace, job: dict, work: Path) -> dict:
    """The reference job in its own interpreter/packages; its result.json."""
    work.mkdir(parents=True, exist_ok=True)
    job_path = work / "job.json"
    job_path.write_text(json.dumps(job))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    if args.ref_path:
        env["PYTHONPATH"] = str(args.ref_path)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([args.ref_python, str(JOB), str(job_path)], env=env,
                              timeout=args.ref_timeout, stdin=subprocess.DEVNULL)
        error = f"exit status {proc.returncode} (its output is above)" if proc.returncode else None
    except subprocess.TimeoutExpired:
        error = f"timed out after --ref-timeout {args.ref_timeout} s"
    result_path = work / "result.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else {"runs": {}}
    if error:  # ours still runs if the checkpoint was written: the log says how far it got
        print(f"[qwen-tts] reference job failed: {error}", flush=True)
        result["error"] = error
    result["wall_s"] = round(time.perf_counter() - t0, 2)
    return result


def record_codes(stage: Qwen3SpeechModel) -> tuple[dict, callable]:
    """Frames each talker stream emits, by stream id (copied to the host: untimed runs
    only); and the call that stops recording."""
    frames: dict = {}
    step = stage.generator.step

    def recording(streams):
        results = step(streams)
        for r in results:
            if r.frame is not None:
                frames.setdefault(r.stream.stream_id, []).append(r.frame.tolist())
        return results

    stage.generator.step = recording
    return frames, lambda: delattr(stage.generator, "step")


def agreement(ours: list, ref: list | None) -> dict:
    """Leading frames equal in every code group, and in the first (talker) code."""
    if ref is None:
        return {"frames": [len(ours), None]}
    n = min(len(ours), len(ref))
    full = next((i for i in range(n) if ours[i] != ref[i]), n)
    first = next((i for i in range(n) if ours[i][0] != ref[i][0]), n)
    return {"frames": [len(ours), len(ref)], "equal_prefix": full, "first_code_prefix": first}


def time_ours(model: Qwen3TTSModel, tok, args: argparse.Namespace, mode: str, spk: str, lang: str,
              max_len: int, ref_codes: list) -> dict:
    f = args.frames
    conc = sorted({1, args.batch} if args.batch > 1 else {1})
    t0 = time.perf_counter()
    stage = Qwen3SpeechModel(
        model, tok, max_streams=max(conc), max_len=max_len, max_frames=f, speaker=spk, language=lang,
        sampling=TalkerSampling.greedy(min_frames=f), graphs=mode != "eager", compile=mode == "compiled",
        capture_at_load=True, batch_buckets=conc if mode != "eager" else None,
        overlap_codec=None if mode != "eager" else False)  # as bench_gpu_tts.py's modes
    res: dict = {"load_s": round(time.perf_counter() - t0, 2), "runs": {}}
    print(f"[ours {mode}] stage ready in {res['load_s']} s", flush=True)
    runs = args.runs if mode != "eager" else min(args.runs, args.eager_runs)
    start = time.perf_counter()
    for c in conc:
        if c > 1 and time.perf_counter() - start > args.budget_s:
            res.setdefault("skipped", []).append(f"c={c}: over --budget-s")
            continue
        frames, stop = record_codes(stage)
        speak(stage, c, 10_000 * c)  # warm-up, codes recorded
        stop()
        codes = [frames[10_000 * c + i] for i in range(c)]
        res.setdefault("codes_vs_reference", {})[str(c)] = [agreement(x, ref_codes) for x in codes]
        for r in range(runs if c == 1 else args.batch_runs):
            if time.perf_counter() - start > args.budget_s and res["runs"].get("1"):
                res.setdefault("skipped", []).append(f"c={c} run {r}: over --budget-s")
                continue
            out = speak(stage, c, 1000 * (r + 1) + 100 * c)
            audio = out["audio"] / c
            row = {"first_audio_s": round(float(np.mean(out["first"])), 4),
                   "total_s": round(float(np.mean(out["rtf"])) * audio, 4), "audio_s": round(audio, 4),
                   "underruns": out["underruns"]}
            res["runs"].setdefault(str(c), []).append(row)
            print(f"[ours {mode}] c={c} run {r}: {row}", flush=True)
    print(f"[ours {mode}] codes vs reference: {res['codes_vs_reference']}", flush=True)
    del stage
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return res


def _median(rows: list[dict], key: str) -> float:
    return float(np.median([r[key] for r in rows]))


def table(report: dict) -> list[dict]:
    """One row per (side, concurrency): medians over the timed runs."""
    ref = report["reference"]["runs"]
    rows = []
    for c in sorted({*ref, *(c for res in report["ours"].values() for c in res["runs"])}, key=int):
        total = _median(ref[c], "total_s") if c in ref else None
        if total is not None:
            rows.append({"side": "qwen-tts", "c": int(c), "first_audio_s": total, "total_s": total,
                         "generate_s": _median(ref[c], "generate_s"), "decode_s": _median(ref[c], "decode_s"),
                         "rtf": round(total / _median(ref[c], "audio_s"), 4), "ratio_ref_over_ours": None,
                         "first_audio_ratio": None})
        for mode, res in report["ours"].items():
            if c not in res["runs"]:
                continue
            ours, first = _median(res["runs"][c], "total_s"), _median(res["runs"][c], "first_audio_s")
            rows.append({"side": f"voxline {mode}", "c": int(c), "first_audio_s": first, "total_s": ours,
                         "rtf": round(ours / _median(res["runs"][c], "audio_s"), 4),
                         "ratio_ref_over_ours": round(total / ours, 2) if total else None,
                         "first_audio_ratio": round(total / first, 1) if total else None})
    return rows


def print_table(rows: list[dict]) -> None:
    """ref/ours: the reference's total over ours (total, and first audio)."""
    print(f"{'side':16s} {'c':>2s} {'first audio s':>13s} {'total s/job':>11s} {'RTF':>7s} "
          f"{'ref/ours':>8s} {'first':>7s}")
    for r in rows:
        ratio = f"{r['ratio_ref_over_ours']:8.2f}" if r["ratio_ref_over_ours"] else f"{'-':>8s}"
        first = f"{r['first_audio_ratio']:7.1f}" if r["first_audio_ratio"] else f"{'-':>7s}"
        print(f"{r['side']:16s} {r['c']:2d} {r['first_audio_s']:13.3f} {r['total_s']:11.3f} "
              f"{r['rtf']:7.3f} {ratio} {first}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--config", choices=("full", "mid", "tiny"), default="full")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"),
                    help="talker dtype on both sides (default: bfloat16 on CUDA, float32 on CPU)")
    ap.add_argument("--frames", type=int, default=50, help="frames per job (80 ms each)")
    ap.add_argument("--runs", type=int, default=3, help="timed single-job runs per side")
    ap.add_argument("--eager-runs", type=int, default=2, help="at most this many for ours eagerly")
    ap.add_argument("--batch", type=int, default=4, help="jobs started together (<= 1: none)")
    ap.add_argument("--batch-runs", type=int, default=1)
    ap.add_argument("--modes", default="eager,graphs", help="ours: eager, graphs, compiled")
    ap.add_argument("--budget-s", type=float, default=90.0,
                    help="per side and mode: no new timed run starts after this many seconds")
    ap.add_argument("--ref-path", type=Path, help="first on the reference's PYTHONPATH (wheel target dir)")
    ap.add_argument("--ref-python", default=sys.executable, help="the reference's interpreter")
    ap.add_argument("--ref-timeout", type=float, default=420.0)
    ap.add_argument("--work", type=Path, help="checkpoint and job files (default: a temp dir)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(1)
    model_cfg, codec_cfg = configs(args.config)
    config = Qwen3TTSConfig.parse(model_cfg)
    tok = build_tokenizer(config)
    ids = tok.assistant_ids(TEXT)
    n_text = len(ids) - 8  # the template's 8 ids around the text
    if FRAMES_BASE + FRAMES_PER_TOKEN * n_text < args.frames:
        raise SystemExit(f"--frames {args.frames}: our stage caps a {n_text}-token text at "
                         f"{FRAMES_BASE + FRAMES_PER_TOKEN * n_text} frames")
    spk, lang = next(iter(config.talker.spk_id)), "auto"
    work = args.work or Path(tempfile.mkdtemp(prefix="voxline-qwen-ref-gpu-"))
    job = dict(out=str(work), seed=0, device=args.device, dtype=args.dtype, config=model_cfg,
               tokenizer_config=codec_cfg, input_ids=ids, speaker=spk, language=lang,
               frames=args.frames, runs=args.runs, batch=args.batch, batch_runs=args.batch_runs,
               budget_s=args.budget_s)
    report: dict = dict(
        command=" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if argv is None else str(argv),
        device=torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor(),
        torch=torch.__version__, python=platform.python_version(), date=time.strftime("%Y-%m-%d %H:%M:%S"),
        config=args.config, dtype=args.dtype, frames=args.frames, audio_s_per_job=args.frames * FRAME_S,
        text=TEXT, input_ids=len(ids), speaker=spk, language=lang,
        setup="greedy, repetition penalty 1.05, EOS masked for every draw, streaming-text prompt; "
              "reference: official from_pretrained (sdpa attention, codec in the same dtype), "
              "generate + speech_tokenizer.decode, first audio = total; ours: Qwen3SpeechModel, "
              "code2wav float32, chunks of 1 then 4 frames",
    )
    t0 = time.perf_counter()
    report["reference"] = run_reference(args, job, work)
    ref_codes = report["reference"]["codes_c1"][0] if "codes_c1" in report["reference"] else None
    if not (work / "model" / "speech_tokenizer" / "model.safetensors").exists():
        raise SystemExit("the reference job wrote no checkpoint: nothing to compare")
    t1 = time.perf_counter()
    model = Qwen3TTSModel.from_pretrained(work / "model", dtype=getattr(torch, args.dtype), device=args.device)
    report["ours_load_s"] = round(time.perf_counter() - t1, 2)
    print(f"[ours] checkpoint loaded in {report['ours_load_s']} s (reference side took "
          f"{t1 - t0:.1f} s)", flush=True)
    max_len = max(128, 1 << (len(ids) + args.frames + 16 - 1).bit_length())
    report["ours"] = {}
    for mode in args.modes.split(","):
        report["ours"][mode] = time_ours(model, tok, args, mode, spk, lang, max_len, ref_codes)
        if args.out:  # partial results survive a time limit
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=1))
    report["table"] = table(report)
    print_table(report["table"])
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
