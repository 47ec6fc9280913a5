"""Qwen3-TTS: a reply spoken clause by clause (a talker prompt per clause) vs as one
talker stream fed as the LLM writes (streaming text input), on the same text, in one run.

    .venv/bin/python benchmarks/gpu_speech/bench_qwen3_reply_stream.py [--model-dir DIR] [--runs 7]

The LLM is simulated: the reply's text arrives at ``--llm-tokens-per-s`` (about 4
characters a token) and is cut into segments by the engine's own text chunker, exactly
as a reply's are. Both modes run on the same stage, interleaved run by run:

- clause by clause (before issue 16): one speech job per segment, the next starting when
  the last has finished, each a fresh talker prefill and a fresh decoder state;
- one stream: one job opened with the first segment (``more_text``), later segments
  appended as they arrive, ``end_text`` when the LLM is done.

Printed per mode, p50 over the runs: first audio (reply start -> first chunk), last audio,
talker prefills, stage step time, and playback stall (how long a listener playing the chunks as they come
would wait after the first audio; playback time counts 80 ms per frame, the real 12 Hz
codec's, whatever the checkpoint's codec). Without ``--model-dir`` the random-weight tiny
test checkpoint is written to a temporary directory (noise, not speech: only the timing
means something; its streams never stop on codec EOS and are cut at
``--frames-per-token`` frames per text token, a speaking rate). Greedy decoding.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from voxline.engines.models.qwen3_tts import TalkerSampling
from voxline.engines.models.qwen3_tts import jobs as jobs_module
from voxline.engines.models.qwen3_tts.speech_model import Qwen3SpeechModel
from voxline.engines.responses import new_chunker
from voxline.engines.speech_model import SpeechJob

TEXT = ("Sure, here is the plan. We meet at nine at the station, take the early train, "
        "and walk along the cliffs until lunch.")
FRAME_S = 0.08  # one frame of the real 12 Hz codec


@dataclass
class Result:
    first_audio: float = float("nan")
    last_audio: float = 0.0
    stall: float = 0.0
    prefills: int = 0
    frames: int = 0
    step_ms: float = 0.0  # p50 time of a stage step that made a frame
    steps: list[float] = field(default_factory=list)
    chunks: list[tuple[float, float]] = field(default_factory=list)  # (time, seconds)

    def add(self, t: float, frames: int) -> None:
        if frames:
            self.chunks.append((t, frames * FRAME_S))
            self.frames += frames

    def finish(self) -> Result:
        self.step_ms = statistics.median(self.steps) * 1000 if self.steps else float("nan")
        if self.chunks:
            self.first_audio = self.chunks[0][0]
            self.last_audio = self.chunks[-1][0]
            playing_until = self.first_audio
            for t, seconds in self.chunks:
                self.stall += max(0.0, t - playing_until)
                playing_until = max(playing_until, t) + seconds
        return self


def segment_arrivals(text: str, tokens_per_s: float) -> list[tuple[float, str]]:
    """(seconds after the reply starts, segment) as the chunker closes them."""
    chunker = new_chunker()
    out: list[tuple[float, str]] = []
    step = 4  # characters per simulated LLM token
    for i in range(0, len(text), step):
        t = (i // step + 1) / tokens_per_s
        out += [(t, s) for s in chunker.push(text[i:i + step])]
    end = (len(text) // step + 1) / tokens_per_s
    return out + [(end, s) for s in chunker.flush()]


def run_reply(stage: Qwen3SpeechModel, arrivals: list[tuple[float, str]], stream: bool,
              job_base: int) -> Result:
    res = Result()
    starts = stage.generator.start

    def counting_start(*args, **kwargs):
        res.prefills += 1
        return starts(*args, **kwargs)

    stage.generator.start = counting_start  # type: ignore[method-assign]
    spf = stage.samples_per_frame
    waiting = list(arrivals)  # segments the simulated LLM has not written yet
    queue: list[str] = []  # written, not yet handed to the stage
    llm_end = arrivals[-1][0]
    job_id, next_id, text_ended = None, job_base, False
    t0 = time.perf_counter()
    try:
        while waiting or queue or stage.has_work() or (stream and not text_ended):
            now = time.perf_counter() - t0
            queue += [s for t, s in waiting if t <= now]
            waiting = [(t, s) for t, s in waiting if t > now]
            if stream:
                if job_id is None and queue:
                    job_id = next_id
                    stage.start(SpeechJob(job_id, queue.pop(0), more_text=True))
                while job_id is not None and queue:
                    stage.append_text(job_id, queue.pop(0))
                if job_id is not None and not waiting and not text_ended and now >= llm_end:
                    stage.end_text(job_id)
                    text_ended = True
            elif job_id is None and queue:
                job_id = next_id
                next_id += 1
                stage.start(SpeechJob(job_id, queue.pop(0)))
            if stage.has_work():
                t1 = time.perf_counter()
                outs = stage.step()
                res.steps.append(time.perf_counter() - t1)
                for out in outs:
                    res.add(time.perf_counter() - t0, len(out.audio) // spf)
                    if out.finished:
                        job_id = None
            else:
                time.sleep(0.001)
    finally:
        stage.generator.start = starts  # type: ignore[method-assign]
    return res.finish()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, help="a Qwen3-TTS checkpoint (default: the tiny test one)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--llm-tokens-per-s", type=float, default=30.0)
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--frames-per-token", type=int, default=3,
                    help="random-weight checkpoints: frames per text token of each talker stream")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir
        if model_dir is None:
            sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
            from test_qwen3_tts_stage import write_test_checkpoint

            model_dir = write_test_checkpoint(Path(tmp) / "tiny")
        sampling = TalkerSampling.greedy()
        stage = Qwen3SpeechModel(model_dir, device=args.device, sampling=sampling,
                                 max_len=1024, max_frames=900)
        if stage.random_weights:
            # Random weights never stop like speech: no codec EOS, and every talker stream
            # cut at a speaking rate (frames per text token), so both modes make as much audio.
            stage.sampling = TalkerSampling.greedy(min_frames=1_000_000)
            jobs_module.FRAMES_BASE, jobs_module.FRAMES_PER_TOKEN = 0, args.frames_per_token
        arrivals = segment_arrivals(args.text, args.llm_tokens_per_s)
        print(f"device {args.device}; torch {torch.__version__}; threads {torch.get_num_threads()}; "
              f"{len(arrivals)} segments over {arrivals[-1][0]:.2f} s of simulated LLM output")
        run_reply(stage, arrivals, True, 10_000)  # warm-up
        run_reply(stage, arrivals, False, 20_000)
        results: dict[str, list[Result]] = {"clause by clause": [], "one stream": []}
        for r in range(args.runs):
            results["clause by clause"].append(run_reply(stage, arrivals, False, 100 * r))
            results["one stream"].append(run_reply(stage, arrivals, True, 100 * r + 99))

    def p50(mode: str, attr: str) -> float:
        return statistics.median(getattr(x, attr) for x in results[mode])

    for mode in results:
        print(f"{mode:>16}: first audio p50 {p50(mode, 'first_audio') * 1000:7.1f} ms   "
              f"last audio p50 {p50(mode, 'last_audio'):6.2f} s   playback stall p50 "
              f"{p50(mode, 'stall') * 1000:7.1f} ms   prefills {p50(mode, 'prefills'):.0f}   "
              f"frames {p50(mode, 'frames'):.0f}   step p50 {p50(mode, 'step_ms'):5.1f} ms")
    old, new = "clause by clause", "one stream"
    print(f"one stream / clause by clause: first audio x{p50(new, 'first_audio') / p50(old, 'first_audio'):.2f}"
          f", prefills x{p50(new, 'prefills') / p50(old, 'prefills'):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
