"""`voxline serve --device cuda` end to end on one GPU, driven by `voxline bench`.

    python benchmarks/gpu_serving/bench_gpu_serve.py build /tmp/ckpt      # random real-shape checkpoints
    python benchmarks/gpu_serving/bench_gpu_serve.py run /tmp/ckpt --out OUT --audio-dir WAVS

``build`` writes two RANDOM-weight checkpoints (nothing is downloaded or carried): a
Qwen3-TTS-12Hz-1.7B-shaped one in the official layout (the shapes of
``bench_gpu_tts.MODEL``/``CODEC``, marked random so the server logs it) and a
Llama-3.2-1B-shaped LLM (``bench_gpu_llm.SHAPES["1b"]``) with a locally built tokenizer of
the same 128256-entry vocabulary: byte-level symbols, ChatML specials and made-up words,
so any token the random model samples decodes to speakable text.

``run`` starts ``voxline serve --device cuda`` on 127.0.0.1 with those checkpoints (the
capacity flags are whatever ``--serve-args`` adds), waits for ``/health``, runs ``voxline
bench`` for each sweep (spoken turns over /v1/realtime with server VAD, then text turns),
samples ``nvidia-smi`` all along, and leaves under ``--out``: the server log, the bench
JSONs and tables, and ``gpu.csv``. Random weights never say EOS, so replies are capped by
``max_output_tokens`` (LLM, default 50 tokens, a voice assistant's answer) and
``--tts-max-frames`` (speech, default 188 frames: 15 s): the numbers are timings. On
``--barge-in-fraction`` of the spoken turns (default 0.2) the client talks over the reply
1 s after its first audio, as a user does; the bench JSON counts them and times the reply's
audio stopping.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from voxline.bench_arms import compare_arms, merge, parse_arms

HERE = Path(__file__).resolve().parent


# --------------------------------------------------------------------------- build


def build_tts(out: Path) -> Path:
    """Qwen3-TTS-1.7B-shaped random checkpoint, official layout (talker bf16, codec fp32)."""
    import torch
    from bench_gpu_tts import CODEC, MODEL, SPECIALS, TEXT
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from voxline.engines.models.qwen3_tts.code2wav import Code2WavDecoder
    from voxline.engines.models.qwen3_tts.config import Code2WavConfig, Qwen3TTSConfig
    from voxline.engines.models.qwen3_tts.talker import Talker

    config = Qwen3TTSConfig.parse(MODEL)
    torch.manual_seed(0)
    with torch.device("cuda"):
        talker = Talker(config.talker)
        decoder = Code2WavDecoder(Code2WavConfig.parse(CODEC))
    with torch.no_grad():
        for name, p in talker.named_parameters():  # small random weights keep bf16 finite
            if p.dim() > 1:
                p.normal_(0.0, 0.02 if "embedding" not in name else 0.5)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({**MODEL, "voxline_random_weights": True}))
    save_file({f"talker.{k}": v.to(torch.bfloat16).contiguous().cpu()
               for k, v in talker.state_dict().items()}, out / "model.safetensors")
    codec_dir = out / "speech_tokenizer"
    codec_dir.mkdir(exist_ok=True)
    (codec_dir / "config.json").write_text(json.dumps(CODEC))
    save_file({f"decoder.{k}": v.float().contiguous().cpu() for k, v in decoder.state_dict().items()},
              codec_dir / "model.safetensors")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["assistant user\n"] * 50 + [TEXT] * 5, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                            additional_special_tokens=SPECIALS[1:]).save_pretrained(out)
    return out


def build_llm(out: Path, shape: str = "1b") -> Path:
    """A Llama-family random checkpoint (HF layout, bf16 safetensors) + its tokenizer."""
    import torch
    from bench_gpu_llm import SHAPES
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(HERE.parents[1] / "tests"))
    from random_tokenizer import chat_tokenizer

    tokenizer = chat_tokenizer(SHAPES[shape]["vocab_size"])
    config = LlamaConfig(**SHAPES[shape], bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


# whisper-large-v3-turbo's shapes (32 encoder layers, 4 decoder layers, 128 mel bins).
WHISPER_TURBO = dict(num_mel_bins=128, d_model=1280, encoder_layers=32, decoder_layers=4,
                     encoder_attention_heads=20, decoder_attention_heads=20, encoder_ffn_dim=5120,
                     decoder_ffn_dim=5120, max_target_positions=448)


def build_asr(out: Path) -> Path:
    """A whisper-large-v3-turbo-shaped random checkpoint for ``asr=whisper:DIR``, built by
    the tests' tiny-Whisper builder at real shapes (its tokenizer: bytes and a few words)."""
    sys.path.insert(0, str(HERE.parents[1] / "tests"))
    from tiny_whisper import build_tiny_whisper

    return build_tiny_whisper(out, config=WHISPER_TURBO)


def check(ckpt: Path, slots: int, streams: int) -> None:
    """Load the LLM and TTS as the server's engine does (factory, same Settings) and run one
    reply and one speech job: GPU-path errors and memory, without the server around them."""
    import torch

    from voxline.config import Settings, device_fields
    from voxline.engines.factory import load_reply_model, load_tts
    from voxline.engines.speech_model import SpeechJob

    settings = Settings(**device_fields("cuda"), tts=f"qwen3:{ckpt}/tts",
                        llm_checkpoint=str(ckpt / "llm"), max_sessions=slots,
                        tts_max_streams=streams, tts_max_frames=75)
    t0 = time.perf_counter()
    llm = load_reply_model(settings, None, slots, 2048)
    print(f"LLM loaded + graphs in {time.perf_counter() - t0:.1f} s, "
          f"{torch.cuda.memory_allocated() / 2**30:.2f} GiB allocated", flush=True)
    slot = llm.alloc_slot()
    logits = llm.forward([slot], [llm.render_message("user", "Hello there.")])
    print("LLM forward:", tuple(logits.shape), flush=True)
    t0 = time.perf_counter()
    tts = load_tts(settings)
    print(f"TTS loaded in {time.perf_counter() - t0:.1f} s, "
          f"{torch.cuda.memory_allocated() / 2**30:.2f} GiB allocated, "
          f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB peak", flush=True)
    t0, chunks = time.perf_counter(), 0
    tts.start(SpeechJob(1, "Hello there, how are you today?"))
    while tts.has_work():
        chunks += len(tts.step())
    print(f"TTS job: {chunks} outputs in {time.perf_counter() - t0:.2f} s; "
          f"free/total {[round(x / 2**30, 1) for x in torch.cuda.mem_get_info()]} GiB", flush=True)


# --------------------------------------------------------------------------- run


def wait_ready(url: str, server: subprocess.Popen | None, limit_s: float,
               log: Path | None = None) -> float:
    """Seconds until /health answers 200 (`server` None: one started elsewhere); raises,
    with the log's tail, if the server exits, its log says it failed, or `limit_s` passes."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit_s:
        text = log.read_text(errors="replace") if log is not None and log.exists() else ""
        if server is not None and server.poll() is not None:
            raise RuntimeError(f"voxline serve exited with {server.returncode} before ready; "
                               f"log tail:\n{text[-3000:]}")
        if "engine failed to start" in text or "voxline serve: error:" in text:
            raise RuntimeError("voxline serve failed to start; log tail:\n" + text[-3000:])
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"voxline serve not ready after {limit_s:.0f} s")


class CpuSampler(threading.Thread):
    """Machine-wide CPU busy fraction (all cores, from /proc/stat) once a second, so each
    bench level can report the CPU it cost next to the GPU's utilisation."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float]] = []  # (monotonic time, busy 0..1)
        self._stop = threading.Event()

    @staticmethod
    def _times() -> tuple[int, int]:
        vals = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = vals[3] + vals[4]  # idle + iowait
        return sum(vals) - idle, sum(vals)

    def run(self) -> None:
        busy0, total0 = self._times()
        while not self._stop.wait(1.0):
            busy, total = self._times()
            if total > total0:
                self.samples.append((time.monotonic(), (busy - busy0) / (total - total0)))
            busy0, total0 = busy, total

    def mean(self, t0: float, t1: float) -> float | None:
        window = [b for t, b in self.samples if t0 <= t <= t1]
        return round(100 * sum(window) / len(window), 1) if window else None

    def stop(self) -> None:
        self._stop.set()


def gpu_util_mean(csv: Path, t0_wall: float, t1_wall: float) -> float | None:
    """Mean utilization.gpu over [t0, t1] (wall clock) from nvidia-smi's 1 s CSV."""
    from datetime import datetime
    vals = []
    for line in csv.read_text(errors="replace").splitlines()[1:]:
        parts = [x.strip() for x in line.split(",")]
        try:
            ts = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            if t0_wall <= ts <= t1_wall:
                vals.append(float(parts[1].split()[0]))
        except (ValueError, IndexError):
            continue
    return round(sum(vals) / len(vals), 1) if vals else None


def annotate_utilisation(report: Path, cpu: CpuSampler, gpu_csv: Path,
                         mono: tuple[float, float], wall: tuple[float, float]) -> None:
    """Add the level's mean CPU busy % (all cores) and GPU utilisation % to its bench JSON."""
    if not report.exists():
        return
    data = json.loads(report.read_text())
    extra = {"cpu_busy_pct": cpu.mean(*mono), "gpu_util_pct": gpu_util_mean(gpu_csv, *wall),
             "cpu_cores": os.cpu_count()}
    for level in data.get("levels", []):
        level.update(extra)
    report.write_text(json.dumps(data, indent=1))
    print(f"   utilisation: CPU {extra['cpu_busy_pct']}% of {extra['cpu_cores']} cores, "
          f"GPU {extra['gpu_util_pct']}%", flush=True)


def level_trace(server_log: Path, t0_wall: float, t1_wall: float) -> str | None:
    """The turn milestones (``VOXLINE_TRACE=1``) the server logged over [t0, t1] (wall
    clock), as bench_pipeline's median timeline; None when it logged none."""
    from datetime import datetime

    from voxline.engines.trace import timeline

    lines = []
    for line in server_log.read_text(errors="replace").splitlines():
        stamp, sep, message = line.partition(" DEBUG voxline.trace[")
        if not sep:
            continue
        try:
            at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        if t0_wall <= at <= t1_wall:
            lines.append(message.partition("]: ")[2])
    return timeline(lines) if lines else None


PROFILE_RATE = 50  # py-spy samples per second


def summarize_profile(raw: Path, out: Path, rate: float, top: int = 30) -> None:
    """py-spy's raw stacks (``--subprocesses --threads``) as a short text: per process and
    thread, its samples (as cores busy: samples / rate / seconds) and its heaviest frames,
    inclusive and own; the raw file is too big to bring back from the device."""
    import re
    from collections import Counter, defaultdict

    records, pending = [], ""
    for line in raw.read_text(errors="replace").splitlines():
        pending = f"{pending}\\n{line}" if pending else line
        if (m := re.search(r" (\d+)$", pending)) is not None:
            records.append((pending[:m.start()], int(m.group(1))))
            pending = ""
    groups: dict[str, tuple[Counter, Counter]] = defaultdict(lambda: (Counter(), Counter()))
    totals: Counter = Counter()
    for stack, n in records:
        frames = stack.split(";")
        procs = [f for f in frames if f.startswith("process ")]
        thread = next((f for f in frames if f.startswith("thread ")), "thread ?")
        code = [f for f in frames if not f.startswith(("process ", "thread "))]
        pid = procs[-1].split(":", 1)[0] if procs else "process ?"
        key = f"{pid} {re.sub(r'[(][0-9]+[)]', '', thread).strip()}"
        totals[key] += n
        incl, own = groups[key]
        for f in set(code):
            incl[f] += n
        if code:
            own[code[-1]] += n
    lines = [f"py-spy at {rate:g} Hz, {sum(totals.values())} samples"]
    for key, n in totals.most_common():
        incl, own = groups[key]
        lines.append(f"\n## {key}: {n} samples ({n / rate:.1f} s on CPU)")
        lines += [f"  {100 * c / n:5.1f}%  {f[:160]}" for f, c in incl.most_common(top)]
        lines.append("  -- own:")
        lines += [f"  {100 * c / n:5.1f}%  {f[:160]}" for f, c in own.most_common(top // 2)]
    out.write_text("\n".join(lines) + "\n")


def run_bench(url: str, name: str, out: Path, extra: list[str], timeout_s: float) -> int:
    cmd = [sys.executable, "-m", "voxline.cli", "bench", "--url", url, "--quiet",
           "--json", str(out / f"{name}.json"), *extra]
    print(f"== {name}: {' '.join(cmd[3:])}", flush=True)
    with open(out / f"{name}.txt", "w") as log:
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = -9
    print((out / f"{name}.txt").read_text()[-3000:], flush=True)
    return rc


def run(args: argparse.Namespace) -> int:
    """One server and its sweeps into OUT, or with ``--arms`` one per arm, in the order
    given (alternate them, a1;b1;a2;b2, so drift between runs does not pose as a gain)."""
    out = Path(args.out)
    arms = parse_arms(args.arms)
    if not arms:
        return serve_and_bench(args, out, args.serve_args)
    rc = 0
    for name, flags in arms:
        print(f"== arm {name}: {flags or '(no extra flags)'}", flush=True)
        rc |= serve_and_bench(args, out / name, f"{args.serve_args} {flags}")
    compare_arms(out, arms)
    return rc


def serve_and_bench(args: argparse.Namespace, out: Path, serve_args: str) -> int:
    out.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{args.port}"
    serve = [sys.executable, "-m", "voxline.cli", "serve", "--device", "cuda",
             "--tts", f"qwen3:{args.ckpt}/tts", "--llm-checkpoint", f"{args.ckpt}/llm",
             "--port", str(args.port), "--tts-max-frames", str(args.tts_max_frames),
             *serve_args.split()]
    print("== serve:", " ".join(serve[3:]), flush=True)
    if args.profile:  # py-spy samples the server and its engine child (as its descendants)
        serve = [args.profile, "record", "--subprocesses", "--threads", "--nonblocking",
                 "--rate", str(PROFILE_RATE), "--format", "raw", "-o", str(out / "pyspy.raw"), "--", *serve]
    gpu = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,utilization.gpu,memory.used,"
                            "memory.total", "--format=csv", "-l", "1"],
                           stdout=open(out / "gpu.csv", "w"), stderr=subprocess.DEVNULL)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(serve, stdout=open(out / "server.log", "w"), stderr=subprocess.STDOUT,
                              env=env, start_new_session=True)
    cpu = CpuSampler()
    cpu.start()
    rc = 1
    try:
        ready_s = wait_ready(url, server, args.ready_timeout, out / "server.log")
        print(f"== ready after {ready_s:.1f} s", flush=True)
        common = ["--max-output-tokens", str(args.max_output_tokens), "--timeout", "120",
                  "--ramp", str(args.ramp)]
        rc = 0
        runs: dict[str, int] = {}  # a level given again runs again: its own files
        for sweep in args.sweeps.split(";"):
            inp, _, levels = sweep.partition("=")
            for c in (int(x) for x in levels.split(",")):
                base = f"{inp}_c{c}"
                runs[base] = runs.get(base, 0) + 1
                name = base if runs[base] == 1 else f"{base}_run{runs[base]}"
                sessions = max(args.min_requests, args.rounds * c)
                extra = [*common, "--input", inp, "--concurrency", str(c), "--turns",
                         str(args.turns), "--requests", str(sessions * args.turns)]
                if inp == "audio":  # a barge-in is spoken: text turns have none
                    extra += ["--barge-in-fraction", str(args.barge_in_fraction)]
                if inp == "audio" and args.audio_dir:
                    extra += ["--audio-dir", args.audio_dir]
                mono0, wall0 = time.monotonic(), time.time()
                rc |= run_bench(url, name, out, extra, args.bench_timeout)
                annotate_utilisation(out / f"{name}.json", cpu, out / "gpu.csv",
                                     (mono0, time.monotonic()), (wall0, time.time()))
                if (timeline := level_trace(out / "server.log", wall0, time.time())) is not None:
                    (out / f"{name}_trace.txt").write_text(timeline + "\n")
                    print(timeline, flush=True)
        merge(out, args.sweeps)
    except RuntimeError as exc:
        print(f"== {exc}", flush=True)
    finally:
        # SIGINT to the whole group: the server shuts down gracefully, py-spy (if any)
        # stops sampling and writes its file.
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        gpu.terminate()
        cpu.stop()
        if args.profile and (out / "pyspy.raw").exists():
            time.sleep(2.0)  # py-spy writes its file as it exits
            summarize_profile(out / "pyspy.raw", out / "pyspy_summary.txt", PROFILE_RATE)
            (out / "pyspy.raw").unlink()
        log = (out / "server.log").read_text(errors="replace").splitlines()
        print("== server log (capacity, errors, last lines):")
        keep = [ln for ln in log if any(k in ln.lower() for k in
                                        ("capacity", "loaded", "warmed", "error", "traceback",
                                         "stage load"))]
        print("\n".join(keep[-60:] + ["..."] + log[-15:]), flush=True)
    return rc


def main(argv: list[str] | None = None) -> int:
    sys.path[:0] = [str(HERE), str(HERE.parent / "gpu_speech")]  # bench_gpu_llm, bench_gpu_tts
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write the random TTS and LLM checkpoints under DIR")
    b.add_argument("dir")
    b.add_argument("--llm-shape", default="1b", choices=["1b", "smollm2"])
    b.add_argument("--asr", action="store_true", help="also a whisper-large-v3-turbo-shaped "
                   "ASR checkpoint under DIR/asr (for --serve-args '--asr whisper:DIR/asr')")
    k = sub.add_parser("check", help="load DIR's models as the engine does, one job each")
    k.add_argument("dir")
    k.add_argument("--slots", type=int, default=64)
    k.add_argument("--streams", type=int, default=64)
    r = sub.add_parser("run", help="serve from DIR's checkpoints and bench it")
    r.add_argument("ckpt")
    r.add_argument("--out", required=True)
    r.add_argument("--port", type=int, default=8765)
    r.add_argument("--audio-dir", default=None)
    r.add_argument("--serve-args", default="", help="more `voxline serve` flags, space-separated")
    r.add_argument("--arms", default="", help="';'-separated NAME=FLAGS: one server per arm, "
                   "in order, with --serve-args plus FLAGS, its files in OUT/NAME; then a "
                   "side-by-side table (OUT/arms.json). E.g. 'on1=;off1=--gpu-stream-priority "
                   "off;on2=;off2=--gpu-stream-priority off'")
    r.add_argument("--sweeps", default="audio=1,8,32,64;text=1,8,32,64",
                   help="';'-separated INPUT=LEVELS (INPUT audio or text); one bench per level (a "
                        "level given again runs again on the same server, its files suffixed _runN)")
    r.add_argument("--min-requests", type=int, default=4,
                   help="requests per level: max(this, concurrency)")
    r.add_argument("--max-output-tokens", type=int, default=50,
                   help="each reply's LLM tokens (random weights never stop earlier; "
                        "default: %(default)s, a voice assistant's answer)")
    r.add_argument("--barge-in-fraction", type=float, default=0.2,
                   help="voxline bench --barge-in-fraction for the spoken sweeps: the "
                        "turns on which the user talks over the reply (default: %(default)s)")
    r.add_argument("--ramp", type=float, default=0.0, help="voxline bench --ramp: sessions "
                   "start spread over this many seconds (0: all at once)")
    r.add_argument("--rounds", type=int, default=1, help="requests per level: this many per "
                   "session slot (with --min-requests as the floor)")
    r.add_argument("--turns", type=int, default=1, help="voxline bench --turns: questions per "
                   "session (a conversation), the next once the reply has played out")
    r.add_argument("--tts-max-frames", type=int, default=188,
                   help="voxline serve --tts-max-frames: the speech cap of a talker stream, "
                        "80 ms frames (default: %(default)s, 15 s, room for a 50-token reply)")
    r.add_argument("--ready-timeout", type=float, default=480,
                   help="seconds to wait for /health (a cold compile of every bucket is slow)")
    r.add_argument("--bench-timeout", type=float, default=240)
    r.add_argument("--profile", metavar="PY_SPY", help="record the server under this py-spy "
                   "binary; OUT/pyspy_summary.txt has each process and thread's CPU and heaviest frames")
    args = parser.parse_args(argv)
    if args.cmd == "build":
        t0 = time.perf_counter()
        build_tts(Path(args.dir) / "tts")
        build_llm(Path(args.dir) / "llm", args.llm_shape)
        if args.asr:
            build_asr(Path(args.dir) / "asr")
        print(f"built {args.dir} in {time.perf_counter() - t0:.1f} s")
        return 0
    if args.cmd == "check":
        check(Path(args.dir), args.slots, args.streams)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
