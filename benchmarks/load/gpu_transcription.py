"""Live transcription streams on one GPU: `voxline serve` with its ASR on the GPU, ramped
with bench_transcription.py (many client processes) until delta p95 passes the budget.

    python benchmarks/load/gpu_transcription.py build /tmp/ckpt            # random real shapes
    python benchmarks/load/gpu_transcription.py run /tmp/ckpt --out OUT --audio-dir WAVS \\
        [--asr whisper|moonshine] [--levels 64,128,256,384] [--procs 8]
    python benchmarks/load/gpu_transcription.py run --tiny --out /tmp/t   # CPU smoke run

``build`` writes RANDOM-weight checkpoints (nothing downloaded or carried): a
whisper-large-v3-turbo-shaped ASR (``bench_gpu_serve.build_asr``) and the
Qwen3-TTS-shaped speech model the server loads beside it (``bench_gpu_serve.build_tts``;
a transcription session never speaks, but `voxline serve` starts every stage). Random
Whisper weights transcribe garbage until their token budget (10 tokens per audio second):
the timings are a real model's work at real shapes, the transcripts are noise.

``run`` starts ``voxline serve`` on 127.0.0.1 with ``--asr whisper:CKPT/asr`` (or the
shipped Moonshine through torch, ``--asr moonshine``; its files must be installed) on
``--asr-device cuda``, the reply model pointed at a closed local port (``--llm
openai:...``: a transcription session never asks it, and no LLM cache is sized) and
``--max-sessions`` at the largest level; waits for ``/health``; runs bench_transcription.py
over ``--levels`` with ``--stop-over-budget``; samples ``nvidia-smi``. Files under OUT:
``server.log``, ``transcription.json`` (the levels), ``bench.txt`` (its table), ``gpu.csv``.

``--tiny`` is the same path on this machine's CPU: the shipped ASR and speech model
(Moonshine on onnxruntime, Piper), 2 sessions in 2 client processes, 1 turn each.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GPU_SERVING = ROOT / "benchmarks" / "gpu_serving"


def build(out: Path) -> None:
    sys.path[:0] = [str(GPU_SERVING), str(ROOT / "benchmarks" / "gpu_speech")]
    from bench_gpu_serve import build_asr, build_tts

    t0 = time.perf_counter()
    build_tts(out / "tts")
    print(f"TTS checkpoint in {time.perf_counter() - t0:.1f} s", flush=True)
    build_asr(out / "asr")
    print(f"built {out} in {time.perf_counter() - t0:.1f} s", flush=True)


def serve_command(args: argparse.Namespace) -> list[str]:
    top = max(int(x) for x in args.levels.split(","))
    # no reply is ever asked of a transcription session: a remote reply model at a closed
    # port loads nothing and sizes no LLM cache
    cmd = [sys.executable, "-m", "voxline.cli", "serve", "--port", str(args.port),
           "--llm", "openai:http://127.0.0.1:9/v1", "--llm-model", "unused",
           "--max-sessions", str(top),
           "--max-responses", "8"]
    if args.tiny:  # the CPU default's ASR and speech model
        return [*cmd, *args.serve_args.split()]
    asr = f"whisper:{args.ckpt}/asr" if args.asr == "whisper" else "moonshine"
    return [*cmd, "--asr", asr, "--asr-device", "cuda", "--tts", f"qwen3:{args.ckpt}/tts",
            "--tts-device", "cuda", "--tts-max-streams", "8", *args.serve_args.split()]


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{args.port}"
    serve = serve_command(args)
    print("== serve:", " ".join(serve[3:]), flush=True)
    gpu = None
    if not args.tiny:
        gpu = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,utilization.gpu,"
                                "memory.used,memory.total", "--format=csv", "-l", "1"],
                               stdout=open(out / "gpu.csv", "w"), stderr=subprocess.DEVNULL)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(serve, stdout=open(out / "server.log", "w"),
                              stderr=subprocess.STDOUT, env=env, start_new_session=True)
    rc = 1
    try:
        sys.path.insert(0, str(GPU_SERVING))
        from bench_gpu_serve import wait_ready  # one home for the serve-ready wait

        print(f"== ready after {wait_ready(url, server, args.ready_timeout):.1f} s", flush=True)
        bench = [sys.executable, str(HERE / "bench_transcription.py"), "--url", url,
                 "--sessions", args.levels, "--turns", str(args.turns), "--procs",
                 str(args.procs), "--ramp-s", str(args.ramp_s), "--budget-ms",
                 str(args.budget_ms), "--timeout", str(args.timeout), "--stop-over-budget",
                 "--json", str(out / "transcription.json")]
        if args.audio_dir:
            bench += ["--audio-dir", args.audio_dir]
        if args.logprobs:
            bench.append("--logprobs")
        with open(out / "bench.txt", "w") as log:
            proc = subprocess.Popen(bench, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
            assert proc.stdout is not None
            for line in proc.stdout:  # to the device's output as it comes, and to a file
                print(line, end="", flush=True)
                log.write(line)
            rc = proc.wait()
    except RuntimeError as exc:
        print(f"== {exc}", flush=True)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
        if gpu is not None:
            gpu.terminate()
        log_lines = (out / "server.log").read_text(errors="replace").splitlines()
        keep = [ln for ln in log_lines if any(k in ln.lower() for k in (
            "capacity", "loaded", "whisper", "moonshine", "error", "traceback", "refus"))]
        print("== server log (loads, capacity, errors; last lines):")
        print("\n".join(keep[-40:] + ["..."] + log_lines[-12:]), flush=True)
    return rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write the random ASR and TTS checkpoints under DIR")
    b.add_argument("dir")
    r = sub.add_parser("run", help="serve with the ASR on the GPU and ramp transcription streams")
    r.add_argument("ckpt", nargs="?", default="/tmp/ckpt")
    r.add_argument("--out", required=True)
    r.add_argument("--tiny", action="store_true",
                   help="the CPU smoke run: shipped models, 2 sessions, 2 client processes")
    r.add_argument("--asr", choices=["whisper", "moonshine"], default="whisper")
    r.add_argument("--levels", default="64,128,256,384", help="sessions at once, ramped")
    r.add_argument("--turns", type=int, default=2, help="questions each session speaks")
    r.add_argument("--procs", type=int, default=8, help="client processes")
    r.add_argument("--ramp-s", type=float, default=2.0,
                   help="each level's session starts spread over this many seconds")
    r.add_argument("--budget-ms", type=float, default=500.0, help="first-delta p95 budget")
    r.add_argument("--timeout", type=float, default=90.0, help="seconds per session")
    r.add_argument("--audio-dir", default=None, help="question WAVs (default: espeak-ng)")
    r.add_argument("--logprobs", action="store_true", help="sessions include logprobs")
    r.add_argument("--port", type=int, default=8766)
    r.add_argument("--serve-args", default="", help="more `voxline serve` flags")
    r.add_argument("--ready-timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    if args.cmd == "build":
        build(Path(args.dir))
        return 0
    if args.tiny:
        args.levels, args.turns, args.procs, args.ramp_s = "2", 1, 2, 0.0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
