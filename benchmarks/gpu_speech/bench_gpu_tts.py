"""Qwen3-TTS-12Hz-1.7B speech stage on a GPU: first audio, RTF, audio-s/s per concurrency.

    python benchmarks/gpu_speech/bench_gpu_tts.py --out benchmarks/results/gpu_tts_h200.json

Builds the real-shape model (talker 28 x 2048, code predictor 5 x 1024, the 12 Hz codec
decoder) with RANDOM weights in GPU memory (nothing is downloaded or carried), talker in
bf16 and code2wav in fp32 as ``factory.load_tts`` loads them, and a tiny BPE tokenizer.
Random weights never stop on their own, so every job speaks exactly ``--frames`` frames
(EOS masked until then): the numbers are timings, the audio is noise.

For each mode (``eager``: the plain generator; ``graphs``: GraphedTalkerGenerator and
GraphedCode2Wav with CUDA graphs captured at load; ``compiled``: the same graphs with the
decoder-layer steps compiled per bucket, static shapes) and concurrency ``c``, ``c`` jobs start together and the
stage steps until all finish: first audio = job start to its first audio chunk; RTF =
(finish - start) / audio seconds per job; audio-s/s = all audio / wall time; an underrun
is a chunk arriving after the audio before it has played out (playout starting at the
first chunk). A second, synchronised pass splits a step into its parts. In the same run
the graph path is checked against its eager twin (same padded steps, not captured).

Open loop (``--arrivals 4,8,12,16,24``): instead of bursts, jobs arrive at random
(Poisson, ``--seed``) at each rate in jobs/s for ``--window`` seconds, each a reply of
``--frames`` frames (200 = 16 s), through the engine's own ``TTSStage`` (add, schedule,
execute, update: what the engine's stage worker does) over one stage built once with
``--max-streams`` talker slots of ``--max-len`` positions; every bucket the jobs can reach
is captured at load. Each schedule in ``--schedules`` (``SCHEDULES``: ``fifo`` is the
stage before arrival scheduling, ``playout`` the engine's default now) runs every rate.
Counted the way a client hears it: a job's first audio is its arrival to its first chunk
(the wait for the step in flight included); its playout starts at that chunk; an underrun
is a chunk arriving after the audio before it has played out (playout then resumes at
the chunk). audio-s/s is the audio delivered in the window's second half per second
(steady state; the offered load is rate x reply length); jobs still running
``--drain`` seconds after the window are cut and counted as unfinished.

    python benchmarks/gpu_speech/bench_gpu_tts.py --device cpu --tiny --arrivals 2,4 --frames 20 \
        --window 2 --max-streams 8 --buckets 2,4,8 --out /tmp/open_loop.json   # CPU smoke
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from voxline.bench_arrivals import SCHEDULES, Listener, poisson_arrivals
from voxline.engines.models.qwen3_tts import TalkerSampling, graphed_talker
from voxline.engines.models.qwen3_tts import scheduling as sched
from voxline.engines.models.qwen3_tts.checkpoint import Qwen3TTSModel
from voxline.engines.models.qwen3_tts.code2wav import Code2WavDecoder
from voxline.engines.models.qwen3_tts.config import Code2WavConfig, Qwen3TTSConfig
from voxline.engines.models.qwen3_tts.graphed_talker import GraphedTalkerGenerator
from voxline.engines.models.qwen3_tts.speech_model import Qwen3SpeechModel
from voxline.engines.models.qwen3_tts.talker import Talker
from voxline.engines.models.qwen3_tts.tokenizer import Qwen3TextTokenizer
from voxline.engines.speech_model import SpeechJob
from voxline.engines.tts_stage import SpeechOwner, TTSStage
from voxline.kernels import fused_linear, gemv, pdl, qkv_attention, qkv_decode_attention, topk
from voxline.kernels.cuda_graphs import bucket_for
from voxline.kernels.projection_knobs import knob_switch, set_knobs

TEXT = "A longer sentence about the lazy dog and the brown fox."
SWITCHES = ("qkv", "talker", "linear", "topk", "pdl", "inductor", "none")  # --arms, and the knobs (wN, sN, ...)
FRAME_S = 0.08


# Qwen3-TTS-12Hz-1.7B-CustomVoice shapes; ids 1..5 are the tiny tokenizer's specials.
MODEL = dict(
    tts_model_type="custom_voice", tts_model_size="1b7", tokenizer_type="qwen3_tts_tokenizer_12hz",
    im_start_token_id=1, im_end_token_id=2, tts_pad_token_id=3, tts_bos_token_id=4, tts_eos_token_id=5,
    talker_config=dict(
        vocab_size=3072, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
        rope_theta=1000000, hidden_act="silu",
        rope_scaling={"rope_type": "default", "mrope_section": [24, 20, 20], "interleaved": True},
        num_code_groups=16, text_hidden_size=2048, text_vocab_size=151936,
        codec_eos_token_id=2150, codec_think_id=2154, codec_nothink_id=2155,
        codec_think_bos_id=2156, codec_think_eos_id=2157, codec_pad_id=2148, codec_bos_id=2149,
        spk_id={"serena": 3000}, spk_is_dialect={"serena": False},
        codec_language_id={"chinese": 2055, "english": 2050},
        code_predictor_config=dict(
            vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=5,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128, num_code_groups=16,
            rms_norm_eps=1e-6, rope_theta=1000000, hidden_act="silu",
        ),
    ),
)
CODEC = dict(
    decoder_config=dict(
        codebook_size=2048, codebook_dim=512, hidden_size=512, latent_dim=1024, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=16, head_dim=64, intermediate_size=1024,
        sliding_window=72, num_quantizers=16, upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2],
        decoder_dim=1536, rms_norm_eps=1e-5, rope_theta=10000, hidden_act="silu",
    ),
    decode_upsample_rate=1920,
)
# --tiny: the same layout at toy widths (CPU runs of the open loop; the codec keeps the
# real 1920-sample frame, so playout times are real).
TINY_MODEL = dict(MODEL, talker_config=dict(
    MODEL["talker_config"], vocab_size=3072, hidden_size=64, intermediate_size=128,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3], "interleaved": True},
    text_hidden_size=64, text_vocab_size=320,
    code_predictor_config=dict(MODEL["talker_config"]["code_predictor_config"], hidden_size=32,
                               intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=8)))
TINY_CODEC = dict(CODEC, decoder_config=dict(
    CODEC["decoder_config"], codebook_dim=16, hidden_size=32, latent_dim=32, num_hidden_layers=1,
    num_attention_heads=4, num_key_value_heads=4, head_dim=8, intermediate_size=64,
    sliding_window=8, decoder_dim=32))
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>"]


def build_tokenizer(config: Qwen3TTSConfig) -> Qwen3TextTokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["assistant user\n"] * 50 + [TEXT] * 5, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>", additional_special_tokens=SPECIALS[1:])
    with tempfile.TemporaryDirectory() as d:
        fast.save_pretrained(d)
        return Qwen3TextTokenizer.from_pretrained(d, config)


@torch.no_grad()
def build_model(device: str, tiny: bool = False) -> Qwen3TTSModel:
    """Random weights at the real shapes (talker bf16), or ``tiny`` ones in fp32."""
    config = Qwen3TTSConfig.parse(TINY_MODEL if tiny else MODEL)
    torch.manual_seed(0)
    with torch.device(device):
        talker = Talker(config.talker)
        code2wav = Code2WavDecoder(Code2WavConfig.parse(TINY_CODEC if tiny else CODEC))
    for name, p in talker.named_parameters():  # small random weights keep bf16 finite
        if p.dim() > 1:
            p.normal_(0.0, 0.02 if "embedding" not in name else 0.5)
    dtype = torch.float32 if tiny else torch.bfloat16
    return Qwen3TTSModel(config, talker.to(dtype).eval(), code2wav.float().eval(), None)


def speak(stage: Qwen3SpeechModel, c: int, seed0: int) -> dict:
    t0 = time.perf_counter()
    for i in range(c):
        stage.start(SpeechJob(seed0 + i, TEXT, seed=seed0 + i))
    first: dict[int, float] = {}
    end: dict[int, float] = {}
    played: dict[int, float] = {}  # when each stream's buffered audio runs out
    audio_s: dict[int, float] = {}
    underruns = 0
    steps: list[float] = []
    sr = stage.sample_rate
    while stage.has_work():
        ts = time.perf_counter()
        outs = stage.step()
        now = time.perf_counter()
        steps.append(now - ts)
        for o in outs:
            dur = len(o.audio) / sr
            if dur:
                if o.job_id not in first:
                    first[o.job_id] = now - t0
                    played[o.job_id] = now
                elif now > played[o.job_id] + 1e-4:
                    underruns += 1
                played[o.job_id] = max(played[o.job_id], now) + dur
                audio_s[o.job_id] = audio_s.get(o.job_id, 0.0) + dur
            if o.finished:
                end[o.job_id] = now - t0
    wall = time.perf_counter() - t0
    return dict(first=list(first.values()), rtf=[end[j] / audio_s[j] for j in audio_s],
                audio=sum(audio_s.values()), wall=wall, underruns=underruns, steps=steps)


def measure(stage: Qwen3SpeechModel, c: int, runs: int) -> dict:
    speak(stage, c, 10_000)  # warm-up (allocator, cuDNN autotune, lazy buckets)
    rs = [speak(stage, c, 1000 * (r + 1)) for r in range(runs)]
    first = np.array([x for r in rs for x in r["first"]]) * 1000
    steps = np.array([x for r in rs for x in r["steps"][2:]]) * 1000
    return dict(
        concurrency=c, runs=runs,
        first_audio_ms_p50=round(float(np.percentile(first, 50)), 2),
        first_audio_ms_p95=round(float(np.percentile(first, 95)), 2),
        rtf_mean=round(float(np.mean([x for r in rs for x in r["rtf"]])), 4),
        step_ms_p50=round(float(np.percentile(steps, 50)), 2),
        step_rtf=round(float(np.percentile(steps, 50)) / 1000 / FRAME_S, 4),
        audio_s_per_s=round(sum(r["audio"] for r in rs) / sum(r["wall"] for r in rs), 2),
        underruns=sum(r["underruns"] for r in rs),
    )


def breakdown(stage: Qwen3SpeechModel, c: int) -> dict:
    """Milliseconds per decode step in each part (synchronised around each part)."""
    gen, dec = stage.generator, stage.decoder
    parts: dict[str, list[float]] = {"code_predictor": [], "talker": [], "code2wav": [], "pcm_to_host": []}
    originals = {}

    def timed(obj, name, key):
        fn = getattr(obj, name)
        originals[(obj, name)] = fn

        def wrapper(*a, **k):
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = fn(*a, **k)
            torch.cuda.synchronize()
            parts[key].append((time.perf_counter() - t) * 1000)
            return out

        setattr(obj, name, wrapper)

    talker = gen.talker
    if isinstance(gen, GraphedTalkerGenerator):
        parts["prefill"] = []
        timed(gen, "_complete", "code_predictor")
        timed(gen, "_decode", "talker")
        timed(gen, "_prefill", "prefill")
    else:
        timed(talker, "complete_frames", "code_predictor")
        timed(talker, "forward_batch", "talker")
    if stage.codec is not None:
        timed(stage.codec, "decode", "code2wav")
    else:
        timed(dec, "decode_batch", "code2wav")
    timed(stage.chunks, "to_host", "pcm_to_host")
    r = speak(stage, c, 77)
    for (obj, name) in originals:
        delattr(obj, name)
    out = {k: round(float(np.median(v[2:] if len(v) > 4 else v)), 2) for k, v in parts.items() if v}
    # The first chunk's code2wav call (one frame per stream) is on the first-audio path.
    if parts["code2wav"]:
        out["code2wav_first_chunk"] = round(parts["code2wav"][0], 2)
    out["step"] = round(float(np.median(r["steps"][2:])) * 1000, 2)
    return out


def add_checks(stage: Qwen3SpeechModel) -> None:
    """Fail at the first frame with a code outside the codec's codebooks or a NaN state."""
    gen, step = stage.generator, stage.generator.step
    size = stage.decoder.config.codebook_size

    def checked(streams):
        results = step(streams)
        for r in results:
            if r.frame is not None and not bool(((r.frame >= 0) & (r.frame < size)).all()):
                raise AssertionError(f"stream {r.stream.stream_id} frame {r.stream.frames}: "
                                     f"codes {r.frame.tolist()} (history {r.stream.history[-4:]})")
        for s in streams:
            if s.hidden is not None and not bool(torch.isfinite(s.hidden).all()):
                raise AssertionError(f"stream {s.stream_id}: non-finite hidden at frame {s.frames}")
        return results

    gen.step = checked


def twin_check(model: Qwen3TTSModel, tok: Qwen3TextTokenizer, frames: int) -> dict:
    """Greedy + seeded sampling: captured graphs vs their eager twin vs the plain generator,
    and vs the same graphs decoding every chunk in its step (no code2wav overlap)."""
    res = {}
    for name, sampling in (("greedy", TalkerSampling.greedy(min_frames=frames)),
                           ("sampled", TalkerSampling(min_frames=frames))):
        audio = {}
        for mode in ("graphs", "twin", "plain", "no_overlap"):
            stage = Qwen3SpeechModel(model, tok, max_streams=4, max_len=256, max_frames=frames,
                                     sampling=sampling, graphs=mode != "plain", capture_at_load=False,
                                     overlap_codec=mode != "no_overlap")
            if mode == "twin":
                stage.generator = GraphedTalkerGenerator(model.talker, max_streams=4, max_len=256,
                                                         capture=False)
            outs: dict[int, list[np.ndarray]] = {}
            for i in range(3):
                stage.start(SpeechJob(i, TEXT, seed=5 + i))
            while stage.has_work():
                for o in stage.step():
                    outs.setdefault(o.job_id, []).append(o.audio)
            audio[mode] = np.concatenate([np.concatenate(outs[i]) for i in range(3)])
        res[name] = {
            "graphs_vs_twin_max_abs": float(np.abs(audio["graphs"] - audio["twin"]).max()),
            "graphs_vs_plain_max_abs": float(np.abs(audio["graphs"] - audio["plain"]).max())
            if audio["graphs"].shape == audio["plain"].shape else "length differs",
            "overlap_vs_no_overlap_max_abs": float(np.abs(audio["graphs"] - audio["no_overlap"]).max())
            if audio["graphs"].shape == audio["no_overlap"].shape else "length differs",
        }
    return res


# ------------------------------------------------------------------------------ open loop
# SCHEDULES, poisson_arrivals and Listener: voxline/bench_arrivals.py


def open_loop(tts: TTSStage, rate: float, *, window: float, drain: float, seed: int) -> dict:
    """Poisson arrivals at ``rate`` jobs/s through the engine's TTS stage; per-job listeners,
    the audio delivered over time, step times."""
    arrivals = poisson_arrivals(rate, window, seed)
    listeners: dict[int, Listener] = {}
    delivered: list[tuple[float, float]] = []  # (time, audio seconds)
    steps: list[float] = []
    peak = 0
    owner = SpeechOwner(1, "bench")
    t0, k = time.perf_counter(), 0
    while True:
        now = time.perf_counter() - t0
        while k < len(arrivals) and arrivals[k] <= now:
            job_id = tts.add(owner, TEXT, 1.0, seed * 100_000 + k, None)
            listeners[job_id] = Listener(arrivals[k])
            k += 1
        if now > window + drain:
            break  # cut: the jobs still running count as unfinished
        plan = tts.schedule()
        if plan is None:
            if k == len(arrivals):
                break
            time.sleep(max(0.0, min(arrivals[k] - now, 0.01)))
            continue
        ts = time.perf_counter()
        routed = tts.update(plan, tts.execute(plan))
        end = time.perf_counter()
        steps.append(end - ts)
        peak = max(peak, sum(1 for x in listeners.values() if not x.finished))
        for _, out in routed:
            seconds = len(out.audio) / out.sample_rate
            listeners[out.job_id].chunk(end - t0, seconds)
            if seconds:
                delivered.append((end - t0, seconds))
            listeners[out.job_id].finished |= out.finished
    for job_id, x in listeners.items():
        if not x.finished:
            tts.cancel(job_id)
    while tts.schedule() is not None:  # the stage drops the cut jobs
        pass
    return dict(listeners=list(listeners.values()), delivered=delivered, steps=steps, peak=peak,
                window=window, end=time.perf_counter() - t0)


def summarize(rate: float, schedule: str, run: dict, reply_s: float) -> dict:
    xs: list[Listener] = run["listeners"]
    window = run["window"]
    cut = run["end"]
    first = np.array([(x.first if x.first is not None else cut - x.arrival) for x in xs]) * 1000
    half = [s for t, s in run["delivered"] if window / 2 <= t < window]
    steps = np.array(run["steps"] or [0.0]) * 1000

    def pct(a: np.ndarray, q: float) -> float:
        return round(float(np.percentile(a, q)), 1) if len(a) else float("nan")

    return dict(
        schedule=schedule, rate_jobs_per_s=rate, jobs=len(xs), window_s=window,
        offered_audio_s_per_s=round(len(xs) * reply_s / window, 1),
        audio_s_per_s=round(sum(half) / (window / 2), 1),
        first_audio_ms_p50=pct(first, 50), first_audio_ms_p95=pct(first, 95),
        first_audio_ms_p99=pct(first, 99), first_audio_ms_max=round(float(first.max()), 1) if len(first) else None,
        underruns=sum(x.underruns for x in xs), jobs_underrun=sum(1 for x in xs if x.underruns),
        longest_underrun_ms=round(max((x.longest_wait for x in xs), default=0.0) * 1000, 1),
        no_audio=sum(1 for x in xs if x.first is None), unfinished=sum(1 for x in xs if not x.finished),
        peak_jobs=run["peak"], step_ms_p50=pct(steps, 50), step_ms_p95=pct(steps, 95),
        step_ms_max=pct(steps, 100), steps=len(run["steps"]),
    )


def build_open_loop_stage(model: Qwen3TTSModel, tok: Qwen3TextTokenizer, args: argparse.Namespace,
                          buckets: list[int] | None) -> Qwen3SpeechModel:
    """One graphed stage (captured and compiled on CUDA; the eager twin on the CPU) with
    every bucket these jobs can reach made at load."""
    cuda = torch.device(args.device).type == "cuda"
    stage = Qwen3SpeechModel(model, tok, max_streams=args.max_streams, max_len=args.max_len,
                             max_frames=args.frames, sampling=TalkerSampling(min_frames=args.frames),
                             graphs=True, capture_at_load=False, compile=cuda and "compiled" in args.modes,
                             batch_buckets=buckets)
    gen = stage.generator
    if isinstance(gen, GraphedTalkerGenerator) and gen.capture:
        prompt, _ = stage.prepare(SpeechJob(0, TEXT))  # type: ignore[misc]
        gen.prepare(max_length=bucket_for(prompt.embeds.shape[0] + args.frames + 1, gen.length_buckets))
    if stage.codec is not None and stage.codec.capture:
        stage.codec.prepare()
    return stage


def warm_up(tts: TTSStage, n: int, steps: int = 24) -> None:
    """Allocator, autotuning and first-use costs before anything is timed."""
    owner = SpeechOwner(0, "warm-up")
    ids = [tts.add(owner, TEXT, 1.0, 7 + i, None) for i in range(n)]
    for _ in range(steps):
        plan = tts.schedule()
        if plan is None:
            break
        tts.update(plan, tts.execute(plan))
    for job_id in ids:
        tts.cancel(job_id)
    while tts.schedule() is not None:
        pass


def run_open_loop(model: Qwen3TTSModel, tok: Qwen3TextTokenizer, args: argparse.Namespace,
                  buckets: list[int] | None, report: dict, t_start: float) -> None:
    t0 = time.perf_counter()
    stage = build_open_loop_stage(model, tok, args, buckets)
    report["load_s"] = {"open_loop": round(time.perf_counter() - t0, 2)}
    report["overlap_codec"] = stage.overlap_codec
    report["batch_buckets"] = getattr(stage.generator, "batch_buckets", None)
    print(f"open-loop stage ready in {report['load_s']['open_loop']:.1f} s", flush=True)
    tts = TTSStage(stage)
    warm_up(tts, min(8, args.max_streams))
    # Each rate under every schedule (a run cut by the deadline still has pairs), then extras.
    runs = [(name, float(rate)) for rate in args.arrivals.split(",") for name in args.schedules.split(",")]
    runs += [(name, float(rate)) for name, rate in (x.split("@") for x in args.extra.split(",") if x)]
    rows = report.setdefault("open_loop", [])
    for name, rate in runs:
        if args.deadline and time.perf_counter() - t_start > args.deadline:
            report.setdefault("cut_by_deadline", []).append(f"{name}@{rate:g}")
            print(f"deadline: skipping {name} at {rate:g} jobs/s", flush=True)
            continue
        ramp, policy = SCHEDULES[name]
        stage.chunks.ramp = ramp
        stage.scheduler = sched.StepScheduler(policy)
        run = open_loop(tts, rate, window=args.window, drain=args.drain, seed=args.seed)
        rows.append(summarize(rate, name, run, args.frames * FRAME_S))
        print(rows[-1], flush=True)
        save(report, args.out)
    print_open_loop(sorted(rows, key=lambda r: (r["rate_jobs_per_s"], r["schedule"])))


def print_open_loop(rows: list[dict]) -> None:
    print(f"{'schedule':24s} {'jobs/s':>6s} {'offered':>8s} {'audio-s/s':>9s} {'first p50':>9s} "
          f"{'p95':>7s} {'p99':>7s} {'underruns':>9s} {'jobs underrun':>13s} {'unfinished':>10s} "
          f"{'peak':>5s} {'step p50':>8s}")
    for r in rows:
        print(f"{r['schedule']:24s} {r['rate_jobs_per_s']:6.0f} {r['offered_audio_s_per_s']:8.1f} "
              f"{r['audio_s_per_s']:9.1f} {r['first_audio_ms_p50']:9.1f} {r['first_audio_ms_p95']:7.1f} "
              f"{r['first_audio_ms_p99']:7.1f} {r['underruns']:9d} {r['jobs_underrun']:6d}/{r['jobs']:<6d} "
              f"{r['unfinished']:10d} {r['peak_jobs']:5d} {r['step_ms_p50']:8.1f}")


def compile_stats() -> dict:
    """Dynamo's own counters: graphs compiled, recompiles, breaks and failures."""
    from torch._dynamo.utils import counters

    return {group: dict(counters[group]) for group in ("stats", "graph_break", "recompiles")
            if counters[group]} | {"unimplemented_or_failed": dict(counters["unimplemented"])}


def save(report: dict, out: Path | None) -> None:
    report["compile_stats"] = compile_stats()
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1, default=str))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--concurrency", default="1,4,10,32")
    ap.add_argument("--modes", default="compiled,graphs,eager")
    ap.add_argument("--frames", type=int, help="frames per job (80 ms each; default 50, "
                    "200 with --arrivals)")
    ap.add_argument("--eager-concurrency", default="1,10,32", help="concurrencies measured eagerly")
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--attention", choices=sorted(graphed_talker.ATTENTION), default=graphed_talker.DEFAULT_ATTENTION,
                    help="attention in the graphed talker decode steps")
    ap.add_argument("--predictor-attention", choices=sorted(graphed_talker.ATTENTION),
                    default=graphed_talker.DEFAULT_PREDICTOR_ATTENTION, help="attention in the code predictor's steps")
    ap.add_argument("--buckets", help="graph batch buckets, e.g. 1,4,10,32 (default: powers of two)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--no-twin", action="store_true", help="skip the graphs-vs-eager-twin check")
    ap.add_argument("--no-overlap", action="store_true",
                    help="decode every chunk in the step that made its frames (round-3 behaviour)")
    ap.add_argument("--no-gemv", action="store_true", help="cuBLAS for the decode projections "
                    "instead of the small-row linear kernel (round-3 behaviour)")
    ap.add_argument("--qkv-attention", choices=("on", "off", "ab"),
                    help="the code predictor's one-kernel attention block (voxline.kernels."
                         "qkv_attention): on (default), off, or ab (each mode twice, off then on)")
    ap.add_argument("--arms", help="A/B arms in one process (instead of --qkv-attention): each a "
                    "'+'-joined set of the switches that are on, of qkv (the predictor's one-kernel "
                    "attention block), talker (the talker's, voxline.kernels.qkv_decode_attention) and "
                    "linear (projections with their norm and epilogue, voxline.kernels.fused_linear), "
                    "topk (voxline.kernels.topk), pdl (programmatic dependent launch of those kernels, "
                    "voxline.kernels.pdl), inductor (PDL for Inductor's kernels) and the projections' knobs "
                    "(wN warps, sN pipeline stages, nN/kN tile, pN the K slices' program target; "
                    "voxline.kernels.gemv.configure; shipped values when absent), "
                    "or none; e.g. qkv+talker,qkv+talker+linear; results keyed '<mode>/<arm>'")
    ap.add_argument("--check", action="store_true", help="validate every frame's codes (slow)")
    ap.add_argument("--tiny", action="store_true", help="a toy-width model (CPU runs; timings mean nothing)")
    ap.add_argument("--arrivals", help="open loop: Poisson arrival rates in jobs/s, e.g. 4,8,12,16,24")
    ap.add_argument("--schedules", default="fifo,playout", help=f"open loop: of {', '.join(SCHEDULES)}")
    ap.add_argument("--extra", default="", help="open loop: more runs after those, as "
                    "SCHEDULE@RATE,... (e.g. ramp@16)")
    ap.add_argument("--window", type=float, default=8.0, help="open loop: seconds of arrivals per run")
    ap.add_argument("--drain", type=float, default=6.0,
                    help="open loop: seconds after the window before running jobs are cut")
    ap.add_argument("--seed", type=int, default=0, help="open loop: arrival times and job seeds")
    ap.add_argument("--max-streams", type=int, default=96, help="open loop: talker slots")
    ap.add_argument("--deadline", type=float, default=0.0,
                    help="open loop: start no run after this many seconds (0: none)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    if args.frames is None:
        args.frames = 200 if args.arrivals else 50
    extra = [x.split("@")[0] for x in args.extra.split(",") if x]
    for name in (args.schedules.split(",") + extra if args.arrivals else []):
        if name not in SCHEDULES:
            ap.error(f"--schedules: unknown schedule {name!r} (known: {', '.join(SCHEDULES)})")
    if args.arms and args.qkv_attention is not None:
        ap.error("--arms and --qkv-attention both pick the A/B arms: give one")
    if args.arms and args.arrivals:
        ap.error("--arms: the open loop (--arrivals) runs one arm, the switches' defaults")
    args.qkv_attention = args.qkv_attention or "on"
    for arm in args.arms.split(",") if args.arms else []:
        if not {s for s in arm.split("+") if knob_switch(s) is None} <= set(SWITCHES):
            ap.error(f"--arms: unknown switch in {arm!r} (known: {', '.join(SWITCHES)})")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("voxline.kernels.cuda_graphs").setLevel(logging.INFO)  # capture progress
    # A compile failure falls back to eager (counted below) instead of killing the run.
    torch._dynamo.config.suppress_errors = True
    conc = [int(x) for x in args.concurrency.split(",")]
    gemv.set_enabled(not args.no_gemv)
    qkv_attention.set_enabled(args.qkv_attention != "off")
    graphed_talker.DEFAULT_ATTENTION = args.attention  # every generator this run builds
    graphed_talker.DEFAULT_PREDICTOR_ATTENTION = args.predictor_attention
    buckets = [int(x) for x in args.buckets.split(",")] if args.buckets else None
    if torch.device(args.device).type == "cpu":
        torch.set_num_threads(1)  # threads fighting over a few cores make steps erratic
    t_load = time.perf_counter()
    model = build_model(args.device, tiny=args.tiny)
    tok = build_tokenizer(model.config)
    print(f"model built in {time.perf_counter() - t_load:.1f} s", flush=True)
    report: dict = dict(
        command=" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if argv is None else str(argv),
        gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
        torch=torch.__version__, cuda=torch.version.cuda,
        python=platform.python_version(), date=time.strftime("%Y-%m-%d %H:%M:%S"),
        shapes="tiny random (toy widths, fp32)" if args.tiny else
               "Qwen3-TTS-12Hz-1.7B: talker 28x2048 bf16, code predictor 5x1024 bf16, "
               "12 Hz code2wav fp32; random weights",
        frames_per_job=args.frames, batch_buckets=buckets or "powers of two", attention=args.attention,
        predictor_attention=args.predictor_attention, chunking="initial_chunk_frames=1, chunk_frames=4",
        overlap_codec=not args.no_overlap, small_row_linear_kernel=not args.no_gemv,
        fused_qkv_attention="per arm" if args.arms else args.qkv_attention,
        predictor_top_k_cap=graphed_talker.PREDICTOR_TOP_K_CAP,
        sampling="published settings (temperature 0.9, top-k 50), seeded; EOS masked",
        qwen_tts_reference="not run: the qwen-tts package is not installable on the device machine",
        results={}, breakdown={},
    )
    if args.arrivals:
        report.update(mode="open loop", device=args.device, max_streams=args.max_streams,
                      max_len=args.max_len, window_s=args.window, drain_s=args.drain, seed=args.seed,
                      text=TEXT, compiled=torch.device(args.device).type == "cuda" and "compiled" in args.modes,
                      schedules={n: dict(ramp=SCHEDULES[n][0], **dataclasses.asdict(SCHEDULES[n][1]))
                                 for n in args.schedules.split(",") + extra})
        for key in ("results", "breakdown", "predictor_top_k_cap", "qwen_tts_reference"):
            report.pop(key)
        run_open_loop(model, tok, args, buckets, report, t_start)
        save(report, args.out)
        return 0
    if not args.no_twin:
        report["twin_check"] = twin_check(model, tok, 12)
        print("twin check", report["twin_check"], flush=True)
    sampling = TalkerSampling(min_frames=args.frames)
    # (label suffix, switches on): A/B arms all run in this process.
    if args.arms:
        arms = [(a, set(a.split("+")) - {"none"}) for a in args.arms.split(",")]
    elif args.qkv_attention == "ab":
        arms = [("qkv_off", {"talker", "linear", "topk"}), ("qkv_on", {"qkv", "talker", "linear", "topk"})]
    else:
        arms = [("", {"talker", "linear", "topk"} | ({"qkv"} if args.qkv_attention == "on" else set()))]
    report["arms"] = {name: sorted(on) for name, on in arms}
    if any("pdl" in on or "inductor" in on for _, on in arms):
        report["pdl_supported"] = pdl.supported() if torch.cuda.is_available() else False
    for mode, (arm, on) in ((m, a) for m in args.modes.split(",") for a in arms):
        label = f"{mode}/{arm}" if arm else mode
        qkv_attention.set_enabled("qkv" in on)
        qkv_decode_attention.set_enabled("talker" in on)
        fused_linear.set_enabled("linear" in on)
        topk.set_enabled("topk" in on)
        pdl.set_enabled("pdl" in on)
        set_knobs(on)
        if pdl.set_inductor("inductor" in on) != ("inductor" in on):
            torch._dynamo.reset()  # Inductor reads its PDL switch when a region compiles
        t0 = time.perf_counter()
        stage = Qwen3SpeechModel(model, tok, max_streams=max(conc), max_len=args.max_len,
                                 max_frames=args.frames, sampling=sampling, graphs=mode != "eager",
                                 capture_at_load=mode in ("graphs", "compiled"),
                                 compile=mode == "compiled", batch_buckets=buckets,
                                 overlap_codec=not args.no_overlap and mode != "eager")
        if mode in ("fused", "twin"):  # fused: compiled norms/MLPs inside the graphs
            stage.generator = GraphedTalkerGenerator(model.talker, max_streams=max(conc),
                                                     max_len=args.max_len, fuse=mode == "fused",
                                                     capture=mode == "fused", compile=False)
            if mode == "fused":
                stage.generator.prepare()
        load = time.perf_counter() - t0
        print(f"{label}: stage ready in {load:.1f} s", flush=True)
        report.setdefault("load_s", {})[label] = round(load, 2)
        cs = conc if mode != "eager" else [c for c in conc if str(c) in args.eager_concurrency.split(",")]
        if args.check:
            add_checks(stage)
        for c in cs:
            row = measure(stage, c, runs=5 if c == 1 else (2 if mode != "eager" else 1))
            report["results"].setdefault(label, []).append(row)
            report["breakdown"].setdefault(label, {})[str(c)] = breakdown(stage, c)
            print(label, row, report["breakdown"][label][str(c)], flush=True)
            save(report, args.out)  # partial results survive a time limit
        del stage
        torch.cuda.empty_cache()
    save(report, args.out)
    print(f"{'mode':18s} {'c':>3s} {'first p50':>10s} {'p95':>8s} {'RTF':>7s} {'step RTF':>9s} "
          f"{'audio-s/s':>10s} {'underruns':>9s}")
    for mode, rows in report["results"].items():
        for r in rows:
            print(f"{mode:18s} {r['concurrency']:3d} {r['first_audio_ms_p50']:10.1f} "
                  f"{r['first_audio_ms_p95']:8.1f} {r['rtf_mean']:7.3f} {r['step_rtf']:9.3f} "
                  f"{r['audio_s_per_s']:10.1f} {r['underruns']:9d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
