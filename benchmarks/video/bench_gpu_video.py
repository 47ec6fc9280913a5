"""Helios video on one GPU at real shapes: time to first frame, chunk latency, fps, memory,
step caches and torch.compile, guided vs distilled, through voxline's own chunk drivers.

The models are Helios' real shapes with random weights built on the device (nothing is
read or saved): the transformer at its default config (14.3 B parameters, 40 layers),
a UMT5-XXL encoder (24 layers, d_model 4096) and the Wan VAE, all bf16 as
`voxline serve --video` loads them on CUDA (the transformer's fp32 modules kept fp32, as
`from_pretrained` does). Two settings, on the same weights:

- guided: `HeliosPipeline`'s loop (Helios-Base), guidance 5 (two transformer calls a step),
  `--standard-steps` (50) steps. It is measured at `--guided-steps` steps and the chunk's
  denoise time extrapolated linearly per step (said so in the output);
- distilled: `HeliosPyramidPipeline`'s loop (Helios-Distilled: DMD scheduler, 3 stages of
  2 steps, the first chunk amplified to 4 a stage, guidance 1), as its model card runs it,
  measured as is. This is the real-time line.

Sections: text encode (UMT5, 512 tokens); the distilled video chunk by chunk (time to first
frame split into text encode, first chunk denoise, decode and the first frame through a
PyAV H.264 encoder in a thread, as the server encodes; later chunks' latency p50/p99;
generated vs playback fps); the guided setting; CPU encode ms per frame (H.264 and VP8,
PyAV, in a thread); 1, 2 and 4 concurrent distilled requests through `VideoStage`
(round-robin, one chunk a step, as the engine drives it); each step cache backend (none,
first_block_cache, mag_cache calibrated first) at the guided setting; the same again, and
the distilled video, under torch.compile (`compile_repeated_blocks`). Random weights make
data-dependent caches skip differently than trained ones (and decode to noise, the
encoders' worst case). A section that would overrun `--budget-s` is skipped and says so;
the JSON is rewritten after every section.

    python benchmarks/video/bench_gpu_video.py --out results.json            # on the GPU
    .venv/bin/python benchmarks/video/bench_gpu_video.py --tiny              # CPU, tiny checkpoint
"""

from __future__ import annotations

import argparse
import fractions
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from voxline.engines import protocol as p  # noqa: E402
from voxline.engines.models.helios import (  # noqa: E402
    HeliosChunkDriver,
    HeliosPyramidDriver,
    VideoSpec,
    output_frames,
)
from voxline.engines.models.helios.driver import compile_blocks, to_uint8  # noqa: E402
from voxline.engines.models.helios.step_cache import (  # noqa: E402
    CacheBackend,
    CacheChoice,
    MagRatios,
    StepCaches,
)
from voxline.engines.video_stage import VideoJob, VideoStage  # noqa: E402

PLAYBACK_FPS = 24
PROMPTS = ["a train crossing the mountains at sunset", "a red cat over a blue dog",
           "dance monkey dance", "the mountains at sunset"]
UMT5_XXL = dict(d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                relative_attention_num_buckets=32, relative_attention_max_distance=128,
                feed_forward_proj="gated-gelu", vocab_size=256384, pad_token_id=0,
                eos_token_id=1, decoder_start_token_id=0, tie_word_embeddings=False)


# ------------------------------------------------------------------ models


def build_components(device: str, tiny: bool) -> dict[str, Any]:
    """Tokenizer, text encoder, VAE, transformer: the tiny test ones, or real shapes with
    random bf16 weights built directly on `device`."""
    from tiny_helios import _tiny_components, _tiny_tokenizer

    if tiny:
        return _tiny_components()
    from diffusers import AutoencoderKLWan, HeliosTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            transformer = HeliosTransformer3DModel().eval()
            text_encoder = UMT5EncoderModel(UMT5Config(**UMT5_XXL)).eval()
            vae = AutoencoderKLWan().eval()
    finally:
        torch.set_default_dtype(default)
    for model in (transformer, text_encoder, vae):  # whatever a library's init chose
        model.to(torch.bfloat16)
    keep = transformer._keep_in_fp32_modules or []
    for name, param in transformer.named_parameters():  # as from_pretrained keeps them
        if any(k in name.split(".") for k in keep):
            param.data = param.data.float()
    return {"tokenizer": _tiny_tokenizer(), "text_encoder": text_encoder, "vae": vae,
            "transformer": transformer}


def block_noise_gamma(device: str, tiny: bool) -> float:
    """The DMD scheduler's gamma: Helios-Distilled's 1/3 if the device's Cholesky takes its
    near-singular block covariance (CPU LAPACK refuses it), else 1/4."""
    gamma = 1 / 3
    cov = torch.eye(4, device=device) * (1 + gamma) - torch.ones(4, 4, device=device) * gamma
    try:
        torch.linalg.cholesky(cov + torch.eye(4, device=device) * 1e-8)
        return 0.25 if tiny else gamma
    except RuntimeError:
        return 0.25


def build_drivers(args: argparse.Namespace, device: str, caches_dir: Path
                  ) -> tuple[HeliosChunkDriver, HeliosPyramidDriver, dict[str, Any]]:
    """The guided (plain) and distilled (pyramid) drivers over one set of weights."""
    from diffusers import (
        HeliosDMDScheduler,
        HeliosPipeline,
        HeliosPyramidPipeline,
        HeliosScheduler,
    )

    t0 = time.perf_counter()
    parts = build_components(device, args.tiny)
    if args.tiny:
        parts = {k: v.to(device) if hasattr(v, "to") else v for k, v in parts.items()}
    sync(device)
    info = {"build_s": round(time.perf_counter() - t0, 1)}
    info["transformer_params_B"] = round(
        sum(t.numel() for t in parts["transformer"].parameters()) / 1e9, 3)
    info["text_encoder_params_B"] = round(
        sum(t.numel() for t in parts["text_encoder"].parameters()) / 1e9, 3)
    info["dtypes"] = {name: str(next(parts[name].parameters()).dtype)
                      for name in ("transformer", "text_encoder", "vae")}
    gamma = block_noise_gamma(device, args.tiny)
    info["dmd_gamma"] = gamma
    guided = HeliosPipeline(scheduler=HeliosScheduler(stage_range=[0, 1], stages=1,
                                                      use_dynamic_shifting=True), **parts)
    distilled = HeliosPyramidPipeline(
        scheduler=HeliosDMDScheduler(stages=3, gamma=gamma, use_dynamic_shifting=True,
                                     time_shift_type="linear"),
        is_distilled=True, **parts)
    for pipe in (guided, distilled):
        pipe.set_progress_bar_config(disable=True)
    caches = StepCaches(parts["transformer"], CacheChoice(),
                        MagRatios([caches_dir / "voxline_mag_ratios.json"]))
    length = 16 if args.tiny else 512
    return (HeliosChunkDriver(guided, max_sequence_length=length, step_caches=caches),
            HeliosPyramidDriver(distilled, max_sequence_length=length, step_caches=caches),
            info)


# ------------------------------------------------------------------ timing


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def now(device: str) -> float:
    sync(device)
    return time.perf_counter()


def timed_chunk(driver: HeliosChunkDriver, render: Any, device: str
                ) -> tuple[np.ndarray, dict[str, float]]:
    """`render.next_chunk()`'s work with its phases timed apart (a sync between them)."""
    encodes = render.embeds is None
    with torch.no_grad():
        t0 = now(device)
        driver.start_chunk(render)
        t1 = now(device)
        latents = driver.denoise_chunk(render)
        t2 = now(device)
        frames = driver.finish_chunk(render, latents)
        t3 = now(device)
    frames = to_uint8(frames)
    t4 = time.perf_counter()
    return frames, {"text_encode_ms": ms(t1 - t0) if encodes else 0.0,
                    "denoise_ms": ms(t2 - t1), "decode_ms": ms(t3 - t2 + t4 - t3),
                    "chunk_ms": ms(t4 - t0), "frames": int(frames.shape[0])}


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def spec_for(args: argparse.Namespace, setting: str, chunks: int, seed: int = 0,
             prompt: str = PROMPTS[0], steps: int | None = None, **kw: Any) -> VideoSpec:
    guided = setting == "guided"
    return VideoSpec(prompt, args.width, args.height, output_frames(chunks),
                     steps or (args.guided_steps if guided else args.distilled_steps),
                     5.0 if guided else 1.0, negative_prompt="blurry" if guided else "",
                     seed=seed, max_sequence_length=16 if args.tiny else 512, **kw)


def percentile(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 1) if values else float("nan")


# ------------------------------------------------------------------ encoders


def make_encoder(codec: str, width: int, height: int) -> Any:
    """A PyAV encoder set up as aiortc's (H.264 baseline zerolatency; VP8 realtime)."""
    import av

    ctx = av.CodecContext.create("libx264" if codec == "H264" else "libvpx", "w")
    ctx.width, ctx.height, ctx.pix_fmt = width, height, "yuv420p"
    ctx.bit_rate = 1_000_000
    ctx.framerate = fractions.Fraction(PLAYBACK_FPS, 1)
    ctx.time_base = fractions.Fraction(1, PLAYBACK_FPS)
    if codec == "H264":
        ctx.options = {"level": "31", "tune": "zerolatency"}
        ctx.profile = "Baseline"
    else:
        ctx.qmin, ctx.qmax = 2, 56
        ctx.options = {"cpu-used": "-6", "deadline": "realtime", "lag-in-frames": "0"}
    return ctx


def encode_frames(codec: str, frames: np.ndarray) -> list[float]:
    """Thread CPU ms per frame of encoding `frames` (run inside the worker thread)."""
    import av

    ctx = make_encoder(codec, frames.shape[2], frames.shape[1])
    costs = []
    for i, image in enumerate(frames):
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
        frame.pts = i
        c0 = time.thread_time()
        ctx.encode(frame.reformat(format="yuv420p"))
        costs.append((time.thread_time() - c0) * 1000)
    return costs


def first_frame_ms(pool: ThreadPoolExecutor, frames: np.ndarray) -> float:
    """Wall ms to the first frame's H.264 packet through the encoder thread."""
    t0 = time.perf_counter()
    pool.submit(encode_frames, "H264", frames[:1]).result()
    return ms(time.perf_counter() - t0)


def measure_encode(pool: ThreadPoolExecutor, frames: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {"frames": int(frames.shape[0]),
                           "size": f"{frames.shape[2]}x{frames.shape[1]}"}
    for codec in ("H264", "VP8"):
        costs = pool.submit(encode_frames, codec, frames).result()[3:]  # past warm-up
        out[f"{codec}_cpu_ms_per_frame_p50"] = percentile(costs, 50)
        out[f"{codec}_cpu_ms_per_frame_p90"] = percentile(costs, 90)
    return out


# ------------------------------------------------------------------ sections


def measure_text(driver: HeliosChunkDriver, args: argparse.Namespace,
                 device: str) -> dict[str, Any]:
    """UMT5 time for one prompt (distilled) and prompt + negative (guided), and a cache hit."""
    out: dict[str, Any] = {}
    for setting in ("distilled", "guided"):
        times = []
        for i in range(4):
            driver.prompt_cache.clear()
            spec = spec_for(args, setting, 1, prompt=PROMPTS[i % len(PROMPTS)])
            t0 = now(device)
            with torch.no_grad():
                driver.encode(spec)
            times.append(ms(now(device) - t0))
        out[f"{setting}_ms"] = percentile(times[1:], 50)  # the first is warm-up
    t0 = now(device)
    driver.encode(spec)
    out["cache_hit_ms"] = ms(now(device) - t0)
    return out


def run_video(driver: HeliosChunkDriver, spec: VideoSpec, device: str,
              pool: ThreadPoolExecutor | None = None) -> tuple[list[dict], np.ndarray]:
    """One video chunk by chunk; per-chunk phases, and the first chunk's frames. With
    `pool`, the first chunk's first frame goes through the H.264 encoder thread."""
    render = driver.begin(spec)
    chunks, first = [], None
    while not render.finished:
        frames, phases = timed_chunk(driver, render, device)
        if first is None:
            first = frames
            if pool is not None:
                phases["first_frame_encode_ms"] = first_frame_ms(pool, frames)
        chunks.append(phases)
    assert first is not None
    return chunks, first


def summarize_video(chunks: list[dict], note: str = "") -> dict[str, Any]:
    first = chunks[0]
    later = [c["chunk_ms"] for c in chunks[1:]]
    ttff = (first["text_encode_ms"] + first["denoise_ms"] + first["decode_ms"]
            + first.get("first_frame_encode_ms", 0.0))
    frames = sum(c["frames"] for c in chunks)
    total_s = sum(c["chunk_ms"] for c in chunks) / 1000
    steady = [c["frames"] / (c["chunk_ms"] / 1000) for c in chunks[1:]]
    out = {"ttff_ms": round(ttff, 1), "first_chunk": first,
           "later_chunk_ms_p50": percentile(later, 50), "later_chunk_ms_p99": percentile(later, 99),
           "later_chunks": len(later), "generated_fps_overall": round(frames / total_s, 2),
           "generated_fps_steady": round(float(np.median(steady)), 2) if steady else None,
           "playback_fps": PLAYBACK_FPS, "chunks": chunks}
    if note:
        out["note"] = note
    return out


def measure_guided(driver: HeliosChunkDriver, args: argparse.Namespace,
                   device: str) -> dict[str, Any]:
    """The guided setting at `--guided-steps`, extrapolated per step to `--standard-steps`."""
    chunks, _ = run_video(driver, spec_for(args, "guided", 1, prompt=PROMPTS[1]), device)
    chunk = chunks[0]
    per_step = chunk["denoise_ms"] / args.guided_steps
    denoise = per_step * args.standard_steps
    chunk_ms = denoise + chunk["decode_ms"]
    return {"measured_steps": args.guided_steps, "measured_chunk": chunk,
            "denoise_ms_per_step": round(per_step, 1),
            "extrapolated_steps": args.standard_steps,
            "extrapolated_chunk_ms": round(chunk_ms, 1),
            "extrapolated_ttff_ms": round(chunk["text_encode_ms"] + chunk_ms, 1),
            "extrapolated_generated_fps": round(32 / (chunk_ms / 1000), 3),
            "playback_fps": PLAYBACK_FPS,
            "note": f"measured at {args.guided_steps} steps (guidance 5: two transformer "
                    f"calls a step), denoise extrapolated linearly to {args.standard_steps}"}


def measure_concurrency(driver: HeliosPyramidDriver, args: argparse.Namespace, count: int,
                        device: str) -> dict[str, Any]:
    """`count` distilled requests through `VideoStage`: one chunk a step, round-robin."""
    stage = VideoStage(driver)
    length = 16 if args.tiny else 512
    driver.max_sequence_length = length
    for i in range(count):
        msg = p.CreateVideo(f"s{i}", f"v{i}", PROMPTS[i % len(PROMPTS)] + f" {i}",
                            width=args.width, height=args.height,
                            num_frames=output_frames(args.conc_chunks),
                            num_inference_steps=args.distilled_steps, guidance_scale=1.0, seed=i)
        stage.add(VideoJob(msg.stream_id, msg.video_id, driver.begin_video(msg)))
    ends: dict[str, list[float]] = {}
    frames = 0
    t0 = now(device)
    while stage.has_work():
        job = stage.schedule()
        assert job is not None
        out = stage.update(job, stage.execute(job))  # next_chunk: frames on the host
        frames += 0 if out.frames is None else out.frames.shape[0]
        ends.setdefault(job.video_id, []).append(time.perf_counter() - t0)
    wall = time.perf_counter() - t0
    firsts = [e[0] * 1000 for e in ends.values()]
    gaps = [(b - a) * 1000 for e in ends.values()
            for a, b in zip(e, e[1:], strict=False)]
    return {"requests": count, "chunks_each": args.conc_chunks, "wall_s": round(wall, 2),
            "frames": frames, "fps_per_gpu": round(frames / wall, 2),
            "fps_per_stream": round(frames / wall / count, 2),
            "first_chunk_ms_p50": percentile(firsts, 50), "first_chunk_ms_max":
            percentile(firsts, 100), "chunk_gap_ms_max": percentile(gaps, 100),
            "playback_needs_gap_ms": round(32 / PLAYBACK_FPS * 1000, 1)}


def count_passes(driver: HeliosChunkDriver) -> tuple[list[int], Any]:
    """A counter of full transformer passes (the last block's FFN runs only on a pass the
    step cache did not skip); returns (counter, hook handle)."""
    passes = [0]
    hook = driver.pipe.transformer.blocks[-1].ffn.register_forward_hook(
        lambda *_: passes.__setitem__(0, passes[0] + 1))
    return passes, hook


CACHE_RUNS = (("none", None), ("first_block_cache", None), ("mag_cache", None))


def measure_caches(driver: HeliosChunkDriver, args: argparse.Namespace, device: str,
                   count: bool, backends: tuple[str, ...] = ("none", "first_block_cache",
                                                              "mag_cache")) -> dict[str, Any]:
    """One guided chunk at `--cache-steps` per step cache backend (diffusers' defaults)."""
    out: dict[str, Any] = {}
    passes, hook = count_passes(driver) if count else ([0], None)
    try:
        if driver.step_caches.mag_ratios.ratios is None:  # the server's calibration chunk
            t0 = now(device)
            run_video(driver, spec_for(args, "guided", 1, steps=args.cache_steps,
                                       cache_backend="mag_cache"), device)
            out["mag_cache_calibration_ms"] = ms(now(device) - t0)
        for backend, threshold in [r for r in CACHE_RUNS if r[0] in backends]:
            spec = spec_for(args, "guided", 1, steps=args.cache_steps, prompt=PROMPTS[1],
                            cache_backend=backend, cache_threshold=threshold)
            passes[0] = 0
            chunks, _ = run_video(driver, spec, device)
            row = {"threshold": CacheChoice(CacheBackend(backend), threshold)
                   .resolved_threshold,
                   "chunk_ms": chunks[0]["chunk_ms"], "denoise_ms": chunks[0]["denoise_ms"]}
            if count:
                row["transformer_passes"] = passes[0]
                row["passes_uncached"] = 2 * args.cache_steps
            out[backend] = row
    finally:
        if hook is not None:
            hook.remove()
        driver.step_caches.prepare(CacheChoice(), 1)  # hooks off
    out["steps"] = args.cache_steps
    out["note"] = ("guidance 5, one chunk; random weights make data-dependent caches skip "
                   "differently than trained ones")
    if not count:
        out["dynamo"] = dynamo_stats()
    return out


def dynamo_stats() -> dict[str, int]:
    """torch._dynamo's running totals (graphs compiled, frames captured)."""
    from torch._dynamo.utils import counters

    return {k: int(v) for k, v in counters["stats"].items()}


def compile_transformer(driver: HeliosChunkDriver) -> None:
    """What `video_compile` does (`compile_blocks`), on the drivers' shared transformer;
    the bench still runs first_block_cache under it, which the server refuses."""
    compile_blocks(driver.pipe.transformer)


# ------------------------------------------------------------------ the run


class Run:
    """The results so far, rewritten to `--out` after every section, and the time budget."""

    def __init__(self, args: argparse.Namespace, device: str) -> None:
        self.args, self.device = args, device
        self.t0 = time.perf_counter()
        self.results: dict[str, Any] = {"config": {k: v for k, v in vars(args).items()},
                                        "device": device, "torch": torch.__version__,
                                        "sections": {}, "skipped": {}, "errors": {}}
        if device.startswith("cuda"):
            self.results["gpu"] = torch.cuda.get_device_name()

    def left_s(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.t0)

    def section(self, name: str, estimate_s: float, fn: Any, *fn_args: Any) -> Any:
        """Run `fn` unless `estimate_s` overruns the budget; record its result or error."""
        if estimate_s > self.left_s():
            self.results["skipped"][name] = (f"needs ~{estimate_s:.0f} s, "
                                             f"{self.left_s():.0f} s of the budget left")
            self.save()
            return None
        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        try:
            out = fn(*fn_args)
        except Exception as exc:  # a section's failure (OOM, compile) is a result too
            self.results["errors"][name] = f"{type(exc).__name__}: {exc}"[:2000]
            self.save()
            if self.device.startswith("cuda"):
                torch.cuda.empty_cache()
            return None
        if isinstance(out, dict):
            out["section_s"] = round(time.perf_counter() - t0, 1)
            if self.device.startswith("cuda"):
                out["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
            kept = {k: v for k, v in out.items() if not k.startswith("_")}  # not JSON
        self.results["sections"][name] = kept if isinstance(out, dict) else out
        print(f"[{time.perf_counter() - self.t0:6.1f} s] {name}: "
              f"{json.dumps(self.results['sections'][name])[:400]}", flush=True)
        self.save()
        return out

    def save(self) -> None:
        self.results["elapsed_s"] = round(time.perf_counter() - self.t0, 1)
        if self.args.out:
            Path(self.args.out).write_text(json.dumps(self.results, indent=1))


def run_all(args: argparse.Namespace, device: str, caches_dir: Path) -> Run:
    run = Run(args, device)
    guided, distilled, info = build_drivers(args, device, caches_dir)
    run.results["models"] = info
    pool = ThreadPoolExecutor(1, thread_name_prefix="encode")
    pool.submit(encode_frames, "H264", np.zeros((1, 64, 64, 3), np.uint8)).result()  # as a
    # running server: PyAV loaded and its thread started (each video's encoder is new)
    run.section("text_encode", 5, measure_text, guided, args, device)
    warm = spec_for(args, "distilled", 1, steps=3, prompt=PROMPTS[2])  # CUDA/cuBLAS warm-up
    run.section("warmup", 30, lambda: {"chunks": run_video(distilled, warm, device)[0]})
    video = run.section("distilled", 60, lambda: distilled_video(distilled, args, device, pool))
    if video is None:
        return run
    first_s = video["first_chunk"]["chunk_ms"] / 1000
    later_s = video["later_chunk_ms_p50"] / 1000 if video["later_chunks"] else first_s / 2
    forward_s = later_s / args.distilled_steps  # about one full-resolution transformer call
    run.section("encode_cpu", 20, measure_encode, pool, video["_frames"])
    run.section("guided", 2 * args.guided_steps * forward_s + 5, measure_guided, guided, args,
                device)
    run.section("caches_eager", 4 * (2 * args.cache_steps * forward_s + 2), measure_caches,
                guided, args, device, True)
    for count in args.concurrency:
        cost = count * (first_s + (args.conc_chunks - 1) * later_s) + 5
        run.section(f"concurrency_{count}", cost, measure_concurrency, distilled, args, count,
                    device)
    if "on" in args.compile:
        compiled_sections(run, guided, distilled, forward_s, pool)
    pool.shutdown()
    return run


def distilled_video(driver: HeliosPyramidDriver, args: argparse.Namespace, device: str,
                    pool: ThreadPoolExecutor) -> dict[str, Any]:
    driver.prompt_cache.clear()  # a new prompt: its first chunk encodes it
    chunks, first = run_video(driver, spec_for(args, "distilled", args.chunks), device, pool)
    out = summarize_video(chunks, note=f"Helios-Distilled's setting: {args.distilled_steps} "
                          "steps over 3 pyramid stages, first chunk amplified, guidance 1")
    out["_frames"] = first
    return out


def compiled_sections(run: Run, guided: HeliosChunkDriver, distilled: HeliosPyramidDriver,
                      forward_s: float, pool: ThreadPoolExecutor) -> None:
    """torch.compile on: compile time (the first call per shape), then the caches and the
    distilled video again."""
    args, device = run.args, run.device
    if run.left_s() < args.compile_reserve_s:
        run.results["skipped"]["compile"] = (f"{run.left_s():.0f} s left, compile needs "
                                             f"~{args.compile_reserve_s:.0f} s")
        run.save()
        return

    def warm() -> dict[str, Any]:
        compile_transformer(guided)
        t0 = now(device)
        run_video(guided, spec_for(args, "guided", 1, steps=1), device)
        guided_s = now(device) - t0
        t0 = now(device)
        run_video(distilled, spec_for(args, "distilled", 2, steps=3, prompt=PROMPTS[2]), device)
        return {"first_guided_chunk_s": round(guided_s, 1),
                "first_distilled_video_s": round(now(device) - t0, 1),
                "dynamo": dynamo_stats(),
                "note": "compile_repeated_blocks (regional), default mode; these first calls "
                        "include compiling each new shape"}

    if run.section("compile_warmup", 60, warm) is None:
        return
    run.section("distilled_compiled", args.chunks * forward_s * 2 * args.distilled_steps + 10,
                distilled_video, distilled, args, device, pool)
    run.section("caches_compiled", 2 * (2 * args.cache_steps * forward_s + 2), measure_caches,
                guided, args, device, False, ("none", "mag_cache"))
    # last, since it may recompile per block (its hooks' Python branches: the tiny CPU run
    # took 60 s for 2 blocks); the JSON so far is saved if the command's limit stops it
    run.section("first_block_cache_compiled", args.fbc_compiled_reserve_s, measure_caches,
                guided, args, device, False, ("first_block_cache",))


# ------------------------------------------------------------------ report


def table(results: dict[str, Any]) -> str:
    """The markdown summary of a run's JSON (what benchmarks/README.md shows)."""
    sec = results["sections"]
    lines = ["| measure | value |", "|---|---|"]

    def row(name: str, value: Any) -> None:
        lines.append(f"| {name} | {value} |")

    if "text_encode" in sec:
        t = sec["text_encode"]
        row("text encode (UMT5, 512 tokens): prompt / + negative / cache hit",
            f"{t['distilled_ms']} / {t['guided_ms']} / {t['cache_hit_ms']} ms")
    for name, label in (("distilled", "distilled (eager)"),
                        ("distilled_compiled", "distilled (compiled)")):
        if name not in sec:
            continue
        v, f = sec[name], sec[name]["first_chunk"]
        row(f"{label}: time to first frame", f"{v['ttff_ms']} ms = text {f['text_encode_ms']} "
            f"+ denoise {f['denoise_ms']} + decode {f['decode_ms']} + first H.264 frame "
            f"{f.get('first_frame_encode_ms', '-')}")
        row(f"{label}: later chunk latency p50 / p99 ({v['later_chunks']} chunks)",
            f"{v['later_chunk_ms_p50']} / {v['later_chunk_ms_p99']} ms")
        row(f"{label}: generated fps steady / overall vs playback",
            f"{v['generated_fps_steady']} / {v['generated_fps_overall']} vs {v['playback_fps']}")
    if "guided" in sec:
        g = sec["guided"]
        row(f"guided, {g['extrapolated_steps']} steps (extrapolated from "
            f"{g['measured_steps']}): chunk / TTFF / fps",
            f"{g['extrapolated_chunk_ms']} ms / {g['extrapolated_ttff_ms']} ms / "
            f"{g['extrapolated_generated_fps']}")
    for key in [k for k in sec if k.startswith("concurrency_")]:
        c = sec[key]
        row(f"{c['requests']} concurrent distilled requests ({c['chunks_each']} chunks each)",
            f"{c['fps_per_gpu']} fps/GPU, {c['fps_per_stream']} fps/stream, worst chunk gap "
            f"{c['chunk_gap_ms_max']} ms (playback needs <= {c['playback_needs_gap_ms']})")
    for key, label in (("caches_eager", "eager"), ("caches_compiled", "compiled"),
                       ("first_block_cache_compiled", "compiled")):
        if key not in sec:
            continue
        c = sec[key]
        for backend, _ in CACHE_RUNS:
            if backend in c:
                b = c[backend]
                passes = (f", {b['transformer_passes']}/{b['passes_uncached']} passes"
                          if "transformer_passes" in b else "")
                row(f"guided chunk, {c['steps']} steps, {backend} {b['threshold']} ({label}; "
                    "random weights skip unlike trained ones)", f"{b['chunk_ms']} ms{passes}")
    if "encode_cpu" in sec:
        e = sec["encode_cpu"]
        row(f"CPU encode per {e['size']} frame, p50 (PyAV, a thread)",
            f"H.264 {e['H264_cpu_ms_per_frame_p50']} ms, VP8 {e['VP8_cpu_ms_per_frame_p50']} ms")
    if "compile_warmup" in sec:
        w = sec["compile_warmup"]
        row("torch.compile first calls (compiling)", f"guided chunk {w['first_guided_chunk_s']} "
            f"s, distilled 2-chunk video {w['first_distilled_video_s']} s")
    peaks = [v["peak_gib"] for v in sec.values() if isinstance(v, dict) and "peak_gib" in v]
    if peaks:
        row("peak GPU memory, any section", f"{max(peaks)} GiB")
    for name, why in results.get("skipped", {}).items():
        row(f"skipped: {name}", why)
    for name, why in results.get("errors", {}).items():
        row(f"error: {name}", why[:200].replace("|", "/").replace("\n", " "))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny test checkpoint on CPU")
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--height", type=int, default=None)
    parser.add_argument("--chunks", type=int, default=3, help="chunks of the distilled video")
    parser.add_argument("--distilled-steps", type=int, default=6,
                        help="total over the 3 stages (the card's 2 a stage)")
    parser.add_argument("--guided-steps", type=int, default=3, help="measured guided steps")
    parser.add_argument("--standard-steps", type=int, default=50,
                        help="guided steps extrapolated to")
    parser.add_argument("--cache-steps", type=int, default=6, help="guided steps per cache run")
    parser.add_argument("--concurrency", default="1,2,4")
    parser.add_argument("--conc-chunks", type=int, default=2)
    parser.add_argument("--compile", default="off,on", help="off,on or off")
    parser.add_argument("--compile-reserve-s", type=float, default=120.0,
                        help="skip compile unless this much budget is left")
    parser.add_argument("--fbc-compiled-reserve-s", type=float, default=90.0,
                        help="run first_block_cache under compile only with this much left")
    parser.add_argument("--budget-s", type=float, default=300.0,
                        help="no section starts that would end past this")
    parser.add_argument("--out", default="", help="JSON results path")
    args = parser.parse_args(argv)
    args.width = args.width or (64 if args.tiny else 640)
    args.height = args.height or (64 if args.tiny else 384)
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    args.compile = args.compile.split(",")
    return args


def main(argv: list[str] | None = None) -> None:
    import tempfile

    args = parse_args(argv)
    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    if device == "cpu":
        torch.set_num_threads(1)
    run = run_all(args, device, Path(tempfile.mkdtemp()))
    run.save()
    print(table(run.results))


if __name__ == "__main__":
    main()
