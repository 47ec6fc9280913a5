"""Helios-Distilled in real time on one GPU: first frame and steady generated fps of one
stream (and two) at 384x640, setting by setting on the same random real-shape weights.

Each arm adds one change to the one before it, so each row says what that change bought:

- `2step`: today's `/v1/videos` default, the model card's 2 steps a pyramid stage, the
  first chunk amplified (twice the steps), PyTorch SDPA, bf16, eager;
- `1step-amp`: Helios's real-time setting, one step a stage, first chunk still amplified;
- `1step`: one step a stage, first chunk not amplified;
- `cudnn-attn`: diffusers' `_native_cudnn` attention backend (cuDNN SDPA);
- `cudnn-bench`: `torch.backends.cudnn.benchmark` on (the Wan VAE's 3-D convolutions);
- `compiled`: the transformer's blocks under torch.compile (`video_compile`);
- `fp8`: the blocks' projections in float8 (`video_weights=fp8`, lossy: the frames' PSNR
  against the bf16 arm on the same seed is printed beside its speed).

Every arm is timed up to three ways (`--paths`): serial (denoise, then decode), pipelined
(this script's own loop: chunk n's VAE decode on a second CUDA stream in a thread while
chunk n+1 denoises) and product (the server's own video stages, `video_stage.VideoStage`
and its decode stage on their worker threads and the driver's streams: what a call gets,
timed when each decoded piece reaches the loop; serial for the cuDNN-attention arm, as the
server runs it). No arm after `cudnn-bench` runs with `torch.backends.cudnn.benchmark` on
(its autotuning held the side stream's decode back until the denoise was done); each row
records the flag. The first frame is timed to the first decoded piece (`decode_pieces`: the Wan
VAE decodes a latent frame at a time, so frame 1 is out after one decoder call), the prompt
already in the prompt cache (cached; the uncached figure adds the text encode, printed).
Steady fps is 32 frames over the median interval between later chunks' last frames.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/video/bench_gpu_video_realtime.py \
        --arms 1step,compiled,fp8 --out $OUT/rt.json
    .venv/bin/python benchmarks/video/bench_gpu_video_realtime.py --tiny --chunks 3  # CPU
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu_video import (  # noqa: E402
    PROMPTS,
    block_noise_gamma,
    build_components,
    ms,
    now,
    percentile,
)

from voxline.engines.models.helios import (  # noqa: E402
    HeliosPyramidDriver,
    VideoSpec,
    output_frames,
    set_attention_backend,
    set_video_weights,
)
from voxline.engines.models.helios.driver import compile_blocks, to_uint8  # noqa: E402
from voxline.kernels.cuda_graphs import (  # noqa: E402
    VIDEO_DECODE_PRIORITY,
    VIDEO_DENOISE_PRIORITY,
)


@dataclass(frozen=True)
class Arm:
    name: str
    steps: int = 6
    amplify: bool = True
    attention: str = "native"
    cudnn_benchmark: bool = False
    compiled: bool = False
    weights: str = "bf16"


def arms() -> list[Arm]:
    base = Arm("2step")
    one_amp = replace(base, name="1step-amp", steps=3)
    one = replace(one_amp, name="1step", amplify=False)
    bench = replace(one, name="cudnn-bench", cudnn_benchmark=True)
    # not on top of cudnn-bench: its autotuning held the side stream's decode back until
    # the main stream's denoise was done (H100: pipelined fell to 12 fps overall)
    compiled = replace(one, name="compiled", compiled=True)
    fp8 = replace(compiled, name="fp8", weights="fp8")
    # last: diffusers' cuDNN backend sets PyTorch's SDPA kernel flags process-wide, so the
    # VAE's attention (head dim 384: math only) fails in a decode thread meanwhile; serial
    cudnn = replace(fp8, name="cudnn-attn", attention="_native_cudnn")
    return [base, one_amp, one, bench, compiled, fp8, cudnn]


def build_driver(device: str, tiny: bool) -> HeliosPyramidDriver:
    from diffusers import HeliosDMDScheduler, HeliosPyramidPipeline

    parts = build_components(device, tiny)
    if tiny:
        parts = {k: v.to(device) if hasattr(v, "to") else v for k, v in parts.items()}
    pipe = HeliosPyramidPipeline(
        scheduler=HeliosDMDScheduler(stages=3, gamma=block_noise_gamma(device, tiny),
                                     use_dynamic_shifting=True, time_shift_type="linear"),
        is_distilled=True, **parts)
    pipe.set_progress_bar_config(disable=True)
    return HeliosPyramidDriver(pipe, max_sequence_length=16 if tiny else 512)


def spec_for(args: argparse.Namespace, arm: Arm, seed: int = 0, prompt: str = PROMPTS[0]
             ) -> VideoSpec:
    return VideoSpec(prompt, args.width, args.height, output_frames(args.chunks), arm.steps,
                     1.0, seed=seed, max_sequence_length=16 if args.tiny else 512)


def serial(driver: HeliosPyramidDriver, spec: VideoSpec, device: str) -> dict[str, Any]:
    """One video, each chunk denoised then decoded; the first frame at the first piece."""
    render = driver.begin(spec)
    ends, denoise, decode, first_frames = [], [], [], None
    t0 = now(device)
    first_frame = None
    while not render.finished:
        c0 = now(device)
        driver.start_chunk(render)
        latents = driver.denoise_chunk(render)
        c1 = now(device)
        pieces = driver.decode_pieces(render, latents)
        head = next(pieces)
        if first_frame is None:
            first_frame = ms(now(device) - t0)
        frames = np.concatenate([head, *pieces])
        c2 = now(device)
        ends.append(c2)
        denoise.append(ms(c1 - c0))
        decode.append(ms(c2 - c1))
        if first_frames is None:
            first_frames = to_uint8(frames)
    return {"first_frame_ms": first_frame, "first_chunk_ms": ms(ends[0] - t0),
            "denoise_ms": denoise, "decode_ms": decode, **steady(ends, t0),
            "_frames": first_frames}


def pipelined(driver: HeliosPyramidDriver, spec: VideoSpec, device: str) -> dict[str, Any]:
    """One video, chunk n's decode on a side stream (a thread) beside chunk n+1's denoise."""
    side = torch.cuda.Stream() if device.startswith("cuda") else None
    pool = ThreadPoolExecutor(1)

    def decode(pieces: Any, ready: Any) -> float:
        if side is None:
            list(pieces)
            return time.perf_counter()
        with torch.cuda.stream(side):
            side.wait_event(ready)
            list(pieces)
            done = torch.cuda.Event()
            done.record(side)
        done.synchronize()
        return time.perf_counter()

    render = driver.begin(spec)
    futures = []
    t0 = now(device)
    while not render.finished:
        driver.start_chunk(render)
        latents = driver.denoise_chunk(render)
        pieces = driver.decode_pieces(render, latents)  # the history grows here, on this stream
        ready = None
        if side is not None:
            ready = torch.cuda.Event()
            ready.record()  # after the VAE's input is made: the side stream waits for it
        futures.append(pool.submit(decode, pieces, ready))
    ends = [f.result() for f in futures]
    pool.shutdown()
    return {"first_chunk_ms": ms(ends[0] - t0), **steady(ends, t0)}


# the product path's variants: (the decode stream's CUDA priority, first frame first)
PRODUCT_PATHS = {"product": (VIDEO_DECODE_PRIORITY, True),  # as the server runs it
                 "product-nohold": (VIDEO_DECODE_PRIORITY, False),
                 "product-flat": (VIDEO_DENOISE_PRIORITY, False)}  # one priority, no hold


def product(driver: HeliosPyramidDriver, spec: VideoSpec, device: str, ahead: int,
            path: str = "product") -> dict[str, Any]:
    """One video through the server's own video stages (`voxline.engines.video_stage`:
    the denoise row and the decode row of the engine's stage table, each its own worker
    thread; on CUDA the driver's denoise and decode streams), `ahead` chunks of backpressure
    (1: pipelined, `video_pipelined_decode=auto`; 0: serial). Times are taken when each
    decoded piece reaches the loop thread, as the server would send it. `path` picks a
    variant (`PRODUCT_PATHS`): the decode stream's priority and the first-frame hold."""
    from voxline.engines.models.helios.driver import VideoStreams
    from voxline.engines.stage import StageWorker
    from voxline.engines.stage_table import StageSlot, StageTable
    from voxline.engines.video_stage import VideoJob, VideoStage

    decode_priority, first_frame_first = PRODUCT_PATHS[path]
    shipped = driver.streams
    driver.streams = VideoStreams(driver.device, decode_priority=decode_priority)
    driver.decode_ahead = ahead
    stage = VideoStage(driver, first_frame_first=first_frame_first)
    woke = threading.Event()
    pieces: list[tuple[float, int, bool, int]] = []  # (clock, chunk, its last piece, frames)
    errors: list[Exception] = []

    def route(_item: Any, out: Any, _seconds: float) -> None:
        pieces.append((time.perf_counter(), out.index, out.last, out.frames.shape[0]))

    def fail(_plan: Any, error: Exception) -> None:
        errors.append(error)

    table = StageTable([
        StageSlot("video", stage, StageWorker(stage, woke.set, "bench-video"),
                  route=lambda *_a: None, fail=fail),
        StageSlot("video_decode", stage.decoder,
                  StageWorker(stage.decoder, woke.set, "bench-video-decode"),
                  route=route, fail=fail)])
    def render(video: VideoSpec) -> float:
        pieces.clear()
        job = VideoJob(0, "v", driver.begin(video))
        stage.add(job)
        start = now(device)
        while job.chunks_decoded < job.render.total_chunks and not errors:
            woke.clear()
            table.step()
            if not table.has_work():
                woke.wait(1.0)
        return start

    try:
        # as the server's start-up warm-up does: the streams' memory pools (the caching
        # allocator keeps blocks per stream) and the workers' first calls, untimed
        render(replace(spec, num_frames=output_frames(2), seed=98))
        t0 = render(spec)
    finally:
        table.close()
        driver.decode_ahead = 1
        driver.streams = shipped
    if errors:
        raise errors[0]
    ends = [t for t, _index, last, _n in pieces if last]
    load = table.load_report(0.0) or ""
    return {"first_frame_ms": ms(pieces[0][0] - t0), "first_chunk_ms": ms(ends[0] - t0),
            "pieces": len(pieces), **steady(ends, t0),
            **played([(t, n) for t, _i, _l, n in pieces]), "stage_load": load}


def played(pieces: list[tuple[float, int]], fps: float = 24.0) -> dict[str, Any]:
    """The pieces (arrival, frames) played at `fps` from the first frame, as a player with
    no buffer would: a piece out after its first frame was due is a stall (the picture
    holds the last frame until it comes, and the clock moves on from there)."""
    clock, shown, stalls, frozen = pieces[0][0], 0, 0, 0.0
    for t, frames in pieces:
        due = clock + shown / fps
        if t > due:
            stalls, frozen, clock = stalls + 1, frozen + t - due, clock + t - due
        shown += frames
    return {"stalls_played": stalls, "frozen_ms": ms(frozen)}


def steady(ends: list[float], start: float | None = None) -> dict[str, Any]:
    """Chunk intervals, steady fps (32-frame chunks after the first, over the time from the
    first chunk's end to the last's) and, played at 24 fps from the first chunk's end,
    the chunks that came after their first frame was due (stalls)."""
    gaps = [ms(b - a) for a, b in zip(ends, ends[1:], strict=False)]
    out: dict[str, Any] = {"later_chunk_ms_p50": percentile(gaps, 50),
                           "later_chunk_ms_max": max(gaps or [0])}
    if gaps:
        out["steady_fps"] = round(32 * len(gaps) / (ends[-1] - ends[0]), 2)
        out["stalls_at_24fps"] = sum(1 for k, end in enumerate(ends[1:], 1)
                                     if end > ends[0] + (33 + 32 * (k - 1)) / 24)
    if start is not None:
        out["overall_fps"] = round((33 + 32 * (len(ends) - 1)) / (ends[-1] - start), 2)
    return out


def two_streams(driver: HeliosPyramidDriver, args: argparse.Namespace, arm: Arm,
                device: str) -> dict[str, Any]:
    """Two videos, chunks alternating (the stage's round-robin), serial decode."""
    renders = [driver.begin(spec_for(args, arm, seed=i, prompt=PROMPTS[i])) for i in (0, 1)]
    for r in renders:
        driver.encode(r.spec)
    ends: dict[int, list[float]] = {0: [], 1: []}
    t0 = now(device)
    while not all(r.finished for r in renders):
        for i, r in enumerate(renders):
            if not r.finished:
                r.next_chunk()
                ends[i].append(now(device))
    per_stream = [steady(e)["steady_fps"] for e in ends.values()]
    gaps = [g for e in ends.values() for g in np.diff(e)]
    return {"fps_per_stream": per_stream, "fps_per_gpu": round(sum(per_stream), 2),
            "worst_gap_ms": ms(max(gaps)), "total_s": round(now(device) - t0, 1)}


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return round(10 * np.log10(255.0**2 / mse), 2) if mse else float("inf")


def configure(driver: HeliosPyramidDriver, arm: Arm, state: dict[str, Any]) -> dict[str, Any]:
    """Apply the arm's settings that differ from the model's current ones; what it cost."""
    transformer, info = driver.pipe.transformer, {}
    driver.amplify_first_chunk = arm.amplify
    torch.backends.cudnn.benchmark = arm.cudnn_benchmark
    if arm.attention != state.get("attention", "native"):
        try:
            set_attention_backend(transformer, arm.attention)
            state["attention"] = arm.attention
        except ValueError as exc:
            info["attention_refused"] = str(exc)
    if arm.weights != state.get("weights", "bf16"):
        try:
            info["float8_layers"] = set_video_weights(transformer, arm.weights)
            state["weights"] = arm.weights
        except ValueError as exc:
            info["weights_refused"] = str(exc)
    if arm.compiled and not state.get("compiled"):
        compile_blocks(transformer)
        state["compiled"] = True
    return info


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    out: dict[str, Any] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                           "torch": torch.__version__, "size": f"{args.width}x{args.height}",
                           "chunks": args.chunks, "arms": {}}
    t0 = time.perf_counter()
    driver = build_driver(device, args.tiny)
    out["build_s"] = round(time.perf_counter() - t0, 1)
    spec0 = spec_for(args, arms()[0])
    c0 = now(device)
    driver.encode(spec0)
    out["text_encode_uncached_ms"] = ms(now(device) - c0)
    paths = set(args.paths.split(","))
    state: dict[str, Any] = {}
    frames: dict[str, np.ndarray] = {}
    wanted = args.arms.split(",") if args.arms else [a.name for a in arms()]
    prev: Arm | None = None
    for arm in arms():
        if arm.name not in wanted:
            continue
        if time.perf_counter() - t0 > args.budget_s:
            out["arms"][arm.name] = {"skipped": "over --budget-s"}
            continue
        if arm.attention != "native" and prev is not None:  # two streams before the switch
            with torch.no_grad():
                out["two_streams"] = {"arm": prev.name, **two_streams(driver, args, prev, device)}
        prev = arm
        row: dict[str, Any] = {"arm": asdict(arm), **configure(driver, arm, state)}
        if arm.compiled or arm.weights != "bf16":  # compile the chunk shapes before timing
            w0 = now(device)
            driver.begin(spec_for(args, arm, seed=99)).next_chunk()
            row["warm_s"] = round(now(device) - w0, 1)
        with torch.no_grad():
            s = serial(driver, spec_for(args, arm), device)  # every path runs the serial one
            frames[arm.name] = s.pop("_frames")
            row["serial"] = s
            row["cudnn_benchmark"] = torch.backends.cudnn.benchmark
            native = arm.attention == "native"
            if "pipelined" in paths:
                row["pipelined"] = (pipelined(driver, spec_for(args, arm), device) if native
                                    else {"skipped": "SDPA kernel flags are process-wide"})
            for path in PRODUCT_PATHS:  # the server's stages; serial where the server is
                if path in paths:
                    row[path] = product(driver, spec_for(args, arm), device,
                                        ahead=1 if native else 0, path=path)
        if device == "cuda":
            row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
        out["arms"][arm.name] = row
        piped, prod = row.get("pipelined", {}), row.get("product", {})
        print(f"{arm.name:12s} first frame {s['first_frame_ms']:8.1f} ms  serial "
              f"{s['steady_fps']} fps ({s['overall_fps']} overall, {s['stalls_at_24fps']} stalls)  "
              f"pipelined {piped.get('steady_fps')} fps ({piped.get('overall_fps')} overall, "
              f"{piped.get('stalls_at_24fps')} stalls)  product first frame "
              f"{prod.get('first_frame_ms')} ms, {prod.get('steady_fps')} fps "
              f"({prod.get('overall_fps')} overall, {prod.get('stalls_played')} stalls played, "
              f"{prod.get('frozen_ms')} ms frozen)  "
              f"denoise {s['denoise_ms']}  decode {s['decode_ms']}", flush=True)
        for path in [p for p in PRODUCT_PATHS if p != "product" and p in row]:
            v = row[path]
            print(f"{'':12s} {path}: first frame {v['first_frame_ms']} ms, "
                  f"{v['steady_fps']} fps ({v['overall_fps']} overall, {v['stalls_played']} "
                  f"stalls played, {v['frozen_ms']} ms frozen)", flush=True)
        write(args, out)
    if "fp8" in frames and "compiled" in frames:
        out["fp8_psnr_db_vs_bf16"] = psnr(frames["fp8"], frames["compiled"])
    if "compiled" in frames and "cudnn-bench" in frames:  # compile's own rounding
        out["compiled_psnr_db_vs_eager"] = psnr(frames["compiled"], frames["cudnn-bench"])
    last = [a for a in arms() if a.name in out["arms"] and "serial" in out["arms"][a.name]
            and a.attention == "native"]
    if last and "two_streams" not in out and time.perf_counter() - t0 < args.budget_s:
        with torch.no_grad():
            out["two_streams"] = {"arm": last[-1].name,
                                  **two_streams(driver, args, last[-1], device)}
    out["total_s"] = round(time.perf_counter() - t0, 1)
    write(args, out)
    return out


def write(args: argparse.Namespace, out: dict[str, Any]) -> None:
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="the tiny test checkpoint on CPU")
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--height", type=int, default=None)
    parser.add_argument("--chunks", type=int, default=5, help="chunks of each arm's video")
    parser.add_argument("--arms", default="", help="comma-separated arm names (default all): "
                        + ",".join(a.name for a in arms()))
    parser.add_argument("--paths", default="pipelined,product,product-flat",
                        help="besides serial, which paths each arm times: pipelined (this "
                        "script's side-stream thread), product (the server's video stages), "
                        "product-nohold (no first-frame hold), product-flat (the decode at "
                        "the denoise's priority, no hold)")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="stop starting arms after this many seconds")
    parser.add_argument("--out", default="", help="JSON results path")
    args = parser.parse_args()
    args.width = args.width or (64 if args.tiny else 640)
    args.height = args.height or (64 if args.tiny else 384)
    out = run(args)
    print(json.dumps({k: v for k, v in out.items() if k != "arms"}, indent=1))


if __name__ == "__main__":
    main()
