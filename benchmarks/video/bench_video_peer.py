"""Real-time video through `voxline serve`, measured at a real aiortc peer, and voice beside it.

Peer arms (`--streams 1,2`): for each count, that many WebRTC calls (`/v1/realtime/calls`,
an audio m-line, a recvonly video m-line and the `oai-events` channel) each ask at once for
one video of `--clip-s` seconds (`response.create` with `"video"` in output_modalities) and
time, at the peer, every frame that arrives on the call's video track. A held frame (the
server sends the last picture again when the model is behind) is told from a new one by
its picture (a luma thumbnail, `voxline.bench_video.is_new`). Per clip: first frame from
`response.create`, steady fps of new frames, stalls (new frame i later than the first
frame + i/fps + `--tolerance-ms`), freezes (gaps between new frames over 2 periods),
inter-arrival jitter p99, and from the chunk events on the data channel the frames whose
chunk came after their due time and the generated fps.

Voice beside video (`--voice-videos 0,1,2`): for each count, `voxline bench` (its own
code, as a subprocess: `--voice-sessions` spoken sessions of `--voice-turns` turns,
ramped over `--voice-ramp` s) against the same server while that many peers keep asking
for videos back to back; then one table: p95 speech_stopped -> first audio, underruns,
errors, and the videos' fps and stalls. The server's capacity lines (`video capacity:
video_streams=...` and the voice one) are read from its log into the JSON.

    # CPU smoke, tiny Helios checkpoint (tests/tiny_helios.py), a server started here:
    .venv/bin/python benchmarks/video/bench_video_peer.py --tiny --out /tmp/peer.json
    # against a running server (its log for the capacity line):
    python3 benchmarks/video/bench_video_peer.py --url http://127.0.0.1:8765 \
        --server-log server.log --out peer.json
    # the GPU run: benchmarks/video/gpu_video_peer.sh
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fractions
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from voxline.bench_video import (  # noqa: E402
    DEFAULT_TOLERANCE_S,
    NEW_FRAME_MIN_DIFF,
    chunk_lateness,
    frame_measures,
    is_new,
    new_by_chunks,
    summarize_clips,
)
from voxline.engines.video_frames import chunk_count, output_frames  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks" / "gpu_serving"))
from bench_gpu_serve import wait_ready  # noqa: E402  (one home for the serve-ready wait)

from voxline.realtime.transports.ice import LOOPBACK, restrict_gathering  # noqa: E402

AUDIO_RATE, AUDIO_FRAME = 48000, 960
PROMPTS = ["a train crossing the mountains at sunset", "a red cat over a blue dog",
           "dance monkey dance", "the mountains at sunset"]


def thumbnail(frame: av.VideoFrame, cell: int) -> np.ndarray:
    """The frame's luma averaged over `cell` x `cell` blocks (float32): codec noise averages
    out, a new picture does not."""
    y = frame.to_ndarray(format="gray").astype(np.float32)
    h, w = (y.shape[0] // cell) * cell, (y.shape[1] // cell) * cell
    if h == 0 or w == 0:
        return y
    return y[:h, :w].reshape(h // cell, cell, w // cell, cell).mean(axis=(1, 3))


class Silence(MediaStreamTrack):
    """The peer's microphone: 20 ms of silence in real time (turn detection is off)."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._start: float | None = None
        self._n = 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        wait = self._start + self._n * AUDIO_FRAME / AUDIO_RATE - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, AUDIO_FRAME), np.int16), format="s16",
                                           layout="mono")
        frame.sample_rate, frame.pts = AUDIO_RATE, self._n * AUDIO_FRAME
        frame.time_base = fractions.Fraction(1, AUDIO_RATE)
        self._n += 1
        return frame


class VideoPeer:
    """One call: frames on the video track as (arrival, thumbnail), events as (arrival, event)."""

    def __init__(self, base: str, cell: int) -> None:
        self.base, self.cell = base, cell
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.frames: list[tuple[float, np.ndarray]] = []
        self.events: list[tuple[float, dict]] = []
        self.changed = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        self.channel: Any = None

    async def place(self) -> None:
        self.pc.addTrack(Silence())
        self.pc.addTransceiver("video", direction="recvonly")
        self.channel = self.pc.createDataChannel("oai-events")
        self.channel.on("message", self._on_message)
        self.pc.on("track", self._on_track)
        restrict_gathering(self.pc, [LOOPBACK])
        await self.pc.setLocalDescription(await self.pc.createOffer())
        session = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
        async with httpx.AsyncClient(base_url=self.base, timeout=60) as http:
            r = await http.post("/v1/realtime/calls", files={
                "sdp": (None, self.pc.localDescription.sdp), "session": (None, json.dumps(session))})
        if r.status_code != 201:
            raise RuntimeError(f"call refused: {r.status_code} {r.text[:300]}")
        await self.pc.setRemoteDescription(RTCSessionDescription(r.text, "answer"))
        await self.until(lambda e: e["type"] == "session.created", 60)

    def _on_message(self, message: str) -> None:
        self.events.append((time.monotonic(), json.loads(message)))
        self.changed.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        self.tasks.append(asyncio.create_task(
            self._video(track) if track.kind == "video" else self._drain(track)))

    async def _video(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                self.frames.append((time.monotonic(), thumbnail(frame, self.cell)))
                self.changed.set()

    async def _drain(self, track: MediaStreamTrack) -> None:  # the reply's audio, not kept
        with contextlib.suppress(MediaStreamError):
            while True:
                await track.recv()

    async def until(self, pred: Any, timeout: float, since: int = 0) -> tuple[float, dict]:
        async def wait() -> tuple[float, dict]:
            seen = since
            while True:
                for at, e in self.events[seen:]:
                    if pred(e):
                        return at, e
                seen = len(self.events)
                self.changed.clear()
                await self.changed.wait()
        return await asyncio.wait_for(wait(), timeout)

    async def quiet(self, gap_s: float, timeout: float) -> None:
        """Until no frame has arrived for `gap_s` (the played-out queue is empty)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            last = self.frames[-1][0] if self.frames else 0.0
            if time.monotonic() - last >= gap_s:
                return
            await asyncio.sleep(gap_s / 4)

    async def clip(self, video: dict, modalities: list[str], timeout: float,
                   stop: asyncio.Event | None = None, min_diff: float = NEW_FRAME_MIN_DIFF,
                   tolerance_s: float = DEFAULT_TOLERANCE_S) -> dict[str, Any]:
        """Ask for one video and measure it at the peer. `stop` set: cancel it there and
        measure what came (marked partial)."""
        first_event, first_frame = len(self.events), len(self.frames)
        asked = time.monotonic()
        self.channel.send(json.dumps({"type": "response.create", "response": {
            "output_modalities": modalities, "video": video}}))
        out: dict[str, Any] = {"prompt": video["prompt"]}
        try:
            _, started = await self.until(lambda e: e["type"] in (
                "response.output_video.started", "error"), timeout, first_event)
            if started["type"] == "error":
                err = started["error"]
                await self.until(lambda e: e["type"] == "response.done", timeout, first_event)
                return out | {"error": f"{err.get('code')}: {err.get('message')}"}
            vid = out["video_id"] = started["video_id"]
            done_task = asyncio.ensure_future(self.until(
                lambda e: e["type"] == "response.output_video.done" and e["video_id"] == vid,
                timeout, first_event))
            waits = [done_task] + ([asyncio.ensure_future(stop.wait())] if stop else [])
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if not done_task.done():
                self.channel.send(json.dumps({"type": "response.cancel"}))
                out["partial"] = True
            _, done = await done_task
            for w in waits[1:]:
                w.cancel()
            out["status"] = done.get("status")
            if done.get("error"):
                out["error"] = done["error"]
            if out["status"] == "completed":
                await self.quiet(max(0.5, 4 / video["fps"]), 60)
            await self.until(lambda e: e["type"] == "response.done", timeout, first_event)
        except TimeoutError:
            out["error"] = "timeout"
        frames = self.frames[first_frame:]
        picture, prev = [], None
        for _, thumb in frames:
            picture.append(is_new(prev, thumb, min_diff))
            prev = thumb
        arrivals = [t for t, _ in frames]
        chunks = [(t, int(e.get("frames", 0))) for t, e in self.events[first_event:]
                  if e["type"] == "response.output_video.chunk"]
        fps = video["fps"]
        out["picture"] = frame_measures(arrivals, picture, fps, asked, tolerance_s)
        out["timing"] = frame_measures(arrivals, new_by_chunks(arrivals, chunks), fps, asked,
                                       tolerance_s)
        if frames and chunks:
            out["chunk"] = chunk_lateness(frames[0][0], chunks, fps, tolerance_s)
        return out

    async def close(self) -> None:
        await self.pc.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


# ------------------------------------------------------------------ arms


def video_request(args: argparse.Namespace, k: int) -> dict[str, Any]:
    # the first count Helios makes exactly at or above the clip (its chunks' arithmetic)
    frames = output_frames(chunk_count(round(args.clip_s * args.fps) + 1))
    video = {"prompt": PROMPTS[k % len(PROMPTS)], "width": args.width, "height": args.height,
             "fps": args.fps, "num_frames": frames, "seed": k}
    if args.steps_per_stage:
        video["steps_per_stage"] = args.steps_per_stage
    return video


def summarize(clips: list[dict[str, Any]]) -> dict[str, Any]:
    """An arm's clips that rendered: both readings of new frames, the chunk events' own
    lateness and generated fps."""
    good = [c for c in clips if "timing" in c and c.get("status") in ("completed", "cancelled")]
    gen = [c["chunk"]["generated_fps"] for c in good
           if c.get("chunk") and c["chunk"]["generated_fps"] is not None]
    return {"picture": summarize_clips([c["picture"] for c in good]),
            "timing": summarize_clips([c["timing"] for c in good]),
            "chunk_late_frames": sum(c["chunk"]["late_frames"] for c in good if c.get("chunk")),
            "generated_fps_p50": round(float(np.median(gen)), 2) if gen else None,
            "server_held_frames": sum(c.get("server_held") or 0 for c in good),
            "voice_held_s": round(sum(c.get("voice_held_s") or 0.0 for c in clips), 2),
            "voice_holds": sum(c.get("voice_holds") or 0 for c in clips)}


async def open_peers(base: str, n: int, cell: int) -> list[VideoPeer]:
    peers = [VideoPeer(base, cell) for _ in range(n)]
    placed = await asyncio.gather(*(p.place() for p in peers), return_exceptions=True)
    failed = [x for x in placed if isinstance(x, BaseException)]
    if failed:  # a call refused (max_sessions, say): hang up the others, say why
        await asyncio.gather(*(p.close() for p in peers), return_exceptions=True)
        raise RuntimeError(f"{len(failed)} of {n} calls not placed: {failed[0]!r}")
    return peers


async def peer_arm(base: str, args: argparse.Namespace, streams: int) -> dict[str, Any]:
    """`streams` calls each asking for one clip at once."""
    peers = await open_peers(base, streams, args.cell)
    try:
        clips = await asyncio.gather(*(
            p.clip(video_request(args, k), args.modalities, args.clip_timeout,
                   min_diff=args.new_frame_diff, tolerance_s=args.tolerance_ms / 1e3)
            for k, p in enumerate(peers)))
    finally:
        await asyncio.gather(*(p.close() for p in peers), return_exceptions=True)
    return {"streams": streams, "clips": list(clips), "summary": summarize(clips)}


async def loop_videos(peer: VideoPeer, args: argparse.Namespace, k: int,
                      stop: asyncio.Event) -> list[dict[str, Any]]:
    clips = []
    while not stop.is_set():
        clip = await peer.clip(video_request(args, k + len(clips)), args.modalities,
                               args.clip_timeout, stop, args.new_frame_diff,
                               args.tolerance_ms / 1e3)
        clips.append(clip)
        if clip.get("error") and not clip.get("partial"):
            await asyncio.sleep(1.0)  # refused (server_busy): ask again, not in a hot loop
    return clips


async def voice_arm(base: str, args: argparse.Namespace, videos: int, out_dir: Path
                    ) -> dict[str, Any]:
    """`voxline bench` (a subprocess, its own JSON) while `videos` peers render back to back."""
    peers = await open_peers(base, videos, args.cell) if videos else []
    stop = asyncio.Event()
    loops = [asyncio.create_task(loop_videos(p, args, 100 * (k + 1), stop))
             for k, p in enumerate(peers)]
    if peers:  # the videos are under way before the voice starts
        await asyncio.sleep(args.video_lead_s)
    report = out_dir / f"voice_v{videos}.json"
    cmd = [sys.executable, "-m", "voxline.cli", "bench", "--url", base, "--quiet",
           "--json", str(report), "--input", "audio", "--concurrency", str(args.voice_sessions),
           "--turns", str(args.voice_turns),
           "--requests", str(args.voice_sessions * args.voice_turns),
           "--ramp", str(args.voice_ramp), "--timeout", "120",
           "--max-seconds", str(args.voice_max_s), *args.voice_args.split()]
    if args.audio_dir:
        cmd += ["--audio-dir", args.audio_dir]
    print(f"== voice beside {videos} video(s): {' '.join(cmd[3:])}", flush=True)
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        text, _ = await asyncio.wait_for(proc.communicate(), args.voice_max_s + 180)
    except TimeoutError:
        proc.kill()
        text = b"voxline bench: killed at its time limit"
    print(text.decode(errors="replace")[-2500:], flush=True)
    stop.set()
    clips = [c for task in loops for c in await task]
    await asyncio.gather(*(p.close() for p in peers), return_exceptions=True)
    row: dict[str, Any] = {"videos": videos, "voice_s": round(time.monotonic() - t0, 1),
                           "bench_rc": proc.returncode}
    if report.exists():
        bench = json.loads(report.read_text())
        row["voice"] = voice_summary(bench)
        row["bench_json"] = report.name
    row["clips"] = clips
    row["video"] = summarize(clips)
    row["video_errors"] = [c["error"] for c in clips if c.get("error")]
    return row


def voice_summary(bench: dict[str, Any]) -> dict[str, Any]:
    """The numbers the table shows, from `voxline bench`'s own JSON (its one level)."""
    level = bench["levels"][0]
    eos = level["metrics"]["eos_to_first_audio_s"]
    return {"sessions": level["concurrency"], "turns": level["requests"], "ok": level["ok"],
            "p50_ms": None if eos["p50"] is None else round(eos["p50"] * 1e3),
            "p95_ms": None if eos["p95"] is None else round(eos["p95"] * 1e3),
            "underruns": sum(r["underruns"] for r in level["results"]),
            "turns_underran": sum(1 for r in level["results"] if r["underruns"]),
            "errors": level["errors"], "sessions_held": bench.get("sessions_held")}


# ------------------------------------------------------------------ report


def fmt(v: Any, key: str = "p50") -> str:
    if v is None:
        return "-"
    if isinstance(v, dict):
        return fmt(v.get(key))
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def video_cells(s: dict[str, Any]) -> str:
    """An arm's video summary as table cells; two readings as timing/picture."""
    t, p = s["timing"], s["picture"]

    def two(key: str, stat: str | None = None) -> str:
        return "/".join(fmt(x.get(key), stat) if stat else str(x.get(key, "-")) for x in (t, p))
    return (f"{t.get('clips', 0)} | {fmt(t.get('first_frame_ms'))}/"
            f"{fmt(t.get('first_frame_ms'), 'max')} | {two('steady_fps', 'min')} | "
            f"{fmt(s.get('generated_fps_p50'))} | {two('held_frames')}/"
            f"{s.get('server_held_frames', '-')} | {two('stalls')} | {two('freezes')} | "
            f"{fmt(t.get('worst_gap_ms'), 'max')} | {fmt(t.get('jitter_p99_ms'))}")


VIDEO_HEAD = ("clips | first frame ms p50/max | steady fps min (timing/picture) | generated "
              "fps p50 | held frames timing/picture/server | stalls timing/picture | freezes "
              "timing/picture | worst gap ms | jitter p99 ms")


def tables(result: dict[str, Any]) -> str:
    lines = [f"peer: streams | {VIDEO_HEAD} | errors"]
    for arm in result.get("peer", []):
        errors = [c["error"] for c in arm["clips"] if c.get("error")]
        lines.append(f"  {arm['streams']} | {video_cells(arm['summary'])} | "
                     f"{'; '.join(errors) or '-'}")
    if result.get("voice"):
        lines.append("voice beside video: videos | turns ok/n | speech_stopped->first audio "
                     f"p50/p95 ms | underruns (turns) | voice errors | {VIDEO_HEAD} | "
                     "video errors")
        for row in result["voice"]:
            v = row.get("voice") or {}
            lines.append(
                f"  {row['videos']} | {v.get('ok', '-')}/{v.get('turns', '-')} | "
                f"{fmt(v.get('p50_ms'))}/{fmt(v.get('p95_ms'))} | {v.get('underruns', '-')} "
                f"({v.get('turns_underran', '-')}) | {v.get('errors') or '-'} | "
                f"{video_cells(row['video'])} | {len(row['video_errors'])}")
        for row in result["voice"]:
            s = row["video"]
            lines.append(f"  {row['videos']} videos: denoise waited for the voice "
                         f"{s.get('voice_held_s', '-')} s in {s.get('voice_holds', '-')} "
                         "hold(s) (video_voice_reserve_ms; server log)")
    lines.append("timing: new frames read from the chunk events (the server's playout rule); "
                 "picture: from the frames' pixels; server: held frames the server logged")
    for note in result.get("notes", []):
        lines.append(f"note: {note}")
    for line in result.get("capacity_lines", []):
        lines.append(f"server: {line}")
    return "\n".join(lines)


PLAYED = re.compile(r"video (\S+) played: (\d+) frames sent, (\d+) of them held")
# the engine's line at a video's end when its denoise waited for a reply short of audio
VOICE_HELD = re.compile(r"video (\S+): its denoise waited ([\d.]+) s for the voice in (\d+) hold")


def attach_server_held(result: dict[str, Any], log: Path | None) -> None:
    """Each clip's held frames as the server's track counted them and its denoise's waits
    for the voice (the server's log), then the summaries again."""
    if log is None or not log.exists():
        return
    text = log.read_text(errors="replace")
    held = {m.group(1): int(m.group(3)) for m in PLAYED.finditer(text)}
    voice = {m.group(1): (float(m.group(2)), int(m.group(3))) for m in VOICE_HELD.finditer(text)}

    def attach(clip: dict[str, Any]) -> None:
        video_id = clip.get("video_id", "")
        clip["server_held"] = held.get(video_id)
        clip["voice_held_s"], clip["voice_holds"] = voice.get(video_id, (0.0, 0))

    for arm in result["peer"]:
        for clip in arm["clips"]:
            attach(clip)
        arm["summary"] = summarize(arm["clips"])
    for row in result["voice"]:
        for clip in row["clips"]:
            attach(clip)
        row["video"] = summarize(row["clips"])


CAPACITY = re.compile(r"(video capacity:.*|capacity:.*)")


def capacity_lines(log: Path | None) -> list[str]:
    if log is None or not log.exists():
        return []
    return [m.group(1) for line in log.read_text(errors="replace").splitlines()
            if (m := CAPACITY.search(line))]


# ------------------------------------------------------------------ server


def start_server(args: argparse.Namespace, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "voxline.cli", "serve", "--port", str(args.port),
           "--ice-hosts", "127.0.0.1", "--video", args.video, *args.serve_args.split()]
    print("== serve:", " ".join(cmd[3:]), flush=True)
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)


def stop_server(server: subprocess.Popen) -> None:
    os.killpg(server.pid, signal.SIGINT)
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)


# ------------------------------------------------------------------ main


def build_helios(directory: Path, tiny: bool) -> Path:
    """A Helios-Distilled-layout checkpoint that `--video helios:DIR` loads: the video
    benchmark's components (`bench_gpu_video.build_components`: real shapes with random
    bf16 weights built on the GPU, or the tests' tiny ones) under `HeliosPyramidPipeline`
    with the DMD scheduler, written by `save_pretrained`."""
    import torch
    from bench_gpu_video import block_noise_gamma, build_components
    from diffusers import HeliosDMDScheduler, HeliosPyramidPipeline

    device = "cpu" if tiny else "cuda"
    t0 = time.perf_counter()
    parts = build_components(device, tiny)
    pipe = HeliosPyramidPipeline(
        scheduler=HeliosDMDScheduler(stages=3, gamma=block_noise_gamma(device, tiny),
                                     use_dynamic_shifting=True, time_shift_type="linear"),
        is_distilled=True, **parts)
    built = time.perf_counter() - t0
    pipe.save_pretrained(str(directory))
    size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
    print(f"Helios checkpoint: built in {built:.1f} s, saved {size / 2**30:.1f} GiB to "
          f"{directory} in {time.perf_counter() - t0 - built:.1f} s", flush=True)
    del pipe, parts
    if not tiny:
        torch.cuda.empty_cache()
    return directory


async def run_arms(base: str, args: argparse.Namespace, out_dir: Path, result: dict[str, Any],
                   save: Any) -> None:
    deadline = args.started + args.budget_s
    if args.warmup_s > 0:  # the first video compiles (video_compile): not a measured clip
        print("== warm-up clip", flush=True)
        try:
            warm = await peer_arm(base, argparse.Namespace(**{**vars(args),
                                                              "clip_s": args.warmup_s}), 1)
            result["warmup"] = warm["clips"]
        except (RuntimeError, OSError, TimeoutError, httpx.HTTPError) as exc:
            result["notes"].append(f"warm-up clip failed: {exc!r}")
        save()
    for n in [int(x) for x in args.streams.split(",") if x.strip()]:
        estimate = args.clip_s * n * args.slowdown + 30
        if time.monotonic() + estimate > deadline:
            result["notes"].append(f"peer arm {n} stream(s) skipped: about {estimate:.0f} s "
                                   "left the budget")
            continue
        print(f"== peer arm: {n} stream(s)", flush=True)
        try:
            result["peer"].append(await peer_arm(base, args, n))
        except (RuntimeError, OSError, TimeoutError, httpx.HTTPError) as exc:
            result["notes"].append(f"peer arm {n} stream(s) failed: {exc!r}")
            print(f"== failed: {exc!r}", flush=True)
            continue
        save()
        print(tables({"peer": result["peer"][-1:]}).split("\ntiming:")[0], flush=True)
    for n in [int(x) for x in args.voice_videos.split(",") if x.strip()]:
        estimate = args.voice_estimate_s + args.video_lead_s * (n > 0)
        if time.monotonic() + estimate > deadline:
            result["notes"].append(f"voice arm beside {n} video(s) skipped: about "
                                   f"{estimate:.0f} s left the budget")
            continue
        try:
            result["voice"].append(await voice_arm(base, args, n, out_dir))
        except (RuntimeError, OSError, TimeoutError, httpx.HTTPError) as exc:
            result["notes"].append(f"voice arm beside {n} video(s) failed: {exc!r}")
            print(f"== failed: {exc!r}", flush=True)
        save()


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-helios", metavar="DIR", help="only write the random Helios "
                    "checkpoint (real shapes on the GPU; --tiny: the tests' tiny one) to DIR")
    ap.add_argument("--url", help="a running server (else one is started here)")
    ap.add_argument("--server-log", help="with --url: its log, for the capacity lines")
    ap.add_argument("--video", help="the started server's --video (e.g. helios:DIR)")
    ap.add_argument("--serve-args", default="", help="more `voxline serve` flags")
    ap.add_argument("--port", type=int, default=8766)
    ap.add_argument("--ready-timeout", type=float, default=480)
    ap.add_argument("--tiny", action="store_true", help="CPU smoke: the tests' tiny Helios "
                    "pyramid checkpoint, 64x64, short clips, 2 voice sessions of 1 turn")
    ap.add_argument("--out", required=True, help="result JSON (voxline bench's beside it)")
    ap.add_argument("--streams", default="1,2", help="peer arms: simultaneous streams")
    ap.add_argument("--clip-s", type=float, default=20.0, help="seconds of video a clip")
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=384)
    ap.add_argument("--fps", type=int, default=24)
    ap.add_argument("--steps-per-stage", type=int, default=None,
                    help="response.video.steps_per_stage (default: the server's real-time steps)")
    ap.add_argument("--modalities", default="video",
                    help="comma-separated output_modalities of the video request (video: a "
                         "text reply and the video; audio,video: a spoken one)")
    ap.add_argument("--tolerance-ms", type=float, default=DEFAULT_TOLERANCE_S * 1e3)
    ap.add_argument("--new-frame-diff", type=float, default=NEW_FRAME_MIN_DIFF,
                    help="mean |luma difference| of thumbnails above which a frame is new")
    ap.add_argument("--cell", type=int, default=8, help="thumbnail block size, pixels")
    ap.add_argument("--clip-timeout", type=float, default=300)
    ap.add_argument("--voice-videos", default="0,1,2",
                    help="voice arms: videos rendering beside voxline bench ('' skips)")
    ap.add_argument("--voice-sessions", type=int, default=32)
    ap.add_argument("--voice-turns", type=int, default=3)
    ap.add_argument("--voice-ramp", type=float, default=10.0)
    ap.add_argument("--voice-max-s", type=float, default=150.0,
                    help="voxline bench --max-seconds: no new conversation after this")
    ap.add_argument("--voice-args", default="--max-output-tokens 50",
                    help="more voxline bench flags")
    ap.add_argument("--audio-dir", default=None, help="voxline bench --audio-dir")
    ap.add_argument("--video-lead-s", type=float, default=3.0,
                    help="seconds the videos run before the voice bench starts")
    ap.add_argument("--budget-s", type=float, default=1e9,
                    help="arms that would end past this many seconds from the script's start "
                         "are skipped, noted")
    ap.add_argument("--warmup-s", type=float, default=2.0,
                    help="a clip this long first, not measured (the compile); 0: none")
    ap.add_argument("--slowdown", type=float, default=1.5,
                    help="budget estimate: a clip of N streams takes clip_s x N x this")
    ap.add_argument("--voice-estimate-s", type=float, default=75.0,
                    help="budget estimate of one voice arm, seconds")
    args = ap.parse_args(argv)
    args.started = started
    sys.path.insert(0, str(ROOT / "benchmarks" / "video"))
    sys.path.insert(0, str(ROOT / "tests"))
    if args.build_helios:
        build_helios(Path(args.build_helios), args.tiny)
        return 0
    args.modalities = [m.strip() for m in args.modalities.split(",") if m.strip()]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"args": dict(vars(args)), "peer": [],
                              "voice": [], "notes": [], "capacity_lines": []}

    def save() -> None:
        out.write_text(json.dumps(result, indent=1, default=str))

    with tempfile.TemporaryDirectory(prefix="voxline-peer-") as tmp:
        server, log = None, Path(args.server_log) if args.server_log else None
        if args.tiny:
            args.video = args.video or f"helios:{build_helios(Path(tmp) / 'helios', True)}"
            # two videos at once (the CPU's default is 1); small, short, few sessions
            args.serve_args = args.serve_args or "--video-streams 2"
            args.width = args.height = 64
            args.fps, args.clip_s = 16, min(args.clip_s, 4.0)
            args.voice_sessions, args.voice_turns, args.voice_ramp = 2, 1, 0.0
            args.voice_args = "--max-output-tokens 8"
        result["args"] = dict(vars(args))
        base = args.url
        try:
            if base is None:
                if not args.video:
                    ap.error("--video (or --tiny, or --url) is needed")
                log = out.parent / (out.stem + "_server.log")
                server = start_server(args, log)
                base = f"http://127.0.0.1:{args.port}"
                result["ready_s"] = round(wait_ready(base, server, args.ready_timeout, log), 1)
                print(f"== ready after {result['ready_s']} s", flush=True)
            else:  # a server started beside this script may still be loading
                result["ready_s"] = round(wait_ready(base, None, args.ready_timeout, log), 1)
            result["capacity_lines"] = capacity_lines(log)
            save()
            asyncio.run(run_arms(base.rstrip("/"), args, out.parent, result, save))
        finally:
            if server is not None:
                stop_server(server)
            result["capacity_lines"] = capacity_lines(log)
            attach_server_held(result, log)
            save()
    print(tables(result), flush=True)
    print(f"wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
