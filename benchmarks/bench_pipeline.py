"""Voice-to-voice latency: end of the user's speech -> first reply audio chunk, p50/p95.

Spoken questions (2-4 s of speech each, made with Debian's espeak-ng or the shipped
Piper voice) are fed to the full engine (VAD -> ASR -> LLM -> text chunker -> TTS) at
real time in 20 ms chunks, the way a microphone would: 0.5 s of silence, the speech,
then silence until the reply is over. Every utterance gets a fresh stream (a new
conversation: system prompt + one user turn, nothing cached). The client sends
`CreateResponse` as soon as `SpeechStopped` arrives (the engine holds it until the
final transcript is in). Two latencies are reported per utterance:

- from end of speech audio: wall time from sending the 20 ms chunk holding the last
  speech sample (the speech is aligned to end on a chunk boundary) to the first
  `AudioChunk`. This is what a user hears; it includes the VAD's 500 ms silence window.
- from VAD speech_stopped: wall time from the `SpeechStopped` event to the first
  `AudioChunk` (what `voxline converse` prints).

Both engine clients are started up front and the utterances are interleaved between
them (alternating which goes first), so they see the same machine load:

- inprocess: `InProcessEngineClient` (engine loop on a thread of this process);
- process: `MultiprocessEngineClient` (engine in a child process, ZeroMQ + msgspec).

By default the reply is cancelled once its first audio chunk arrives (the rest of the
reply does not affect the measurement and would make the run much longer); the
benchmark still waits for the `ResponseDone` before the next utterance, so replies never
overlap. ``--full-replies`` lets every reply run to its end instead.

    .venv/bin/python benchmarks/bench_pipeline.py [--utterances 10] [--mode inprocess,process]
                                                  [--voice espeak|piper] [--no-partials]
                                                  [--full-replies] [--threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402

from voxline.engines import protocol as p  # noqa: E402
from voxline.engines.client import EngineClient, InProcessEngineClient  # noqa: E402
from voxline.engines.factory import DEFAULT_CORE  # noqa: E402
from voxline.engines.process import MultiprocessEngineClient  # noqa: E402

CHUNK_MS = 20
CHUNK = p.INPUT_RATE * CHUNK_MS // 1000  # 320 samples
LEAD_SILENCE_S = 0.5
MAX_WAIT_S = 60.0  # per utterance, from the end of speech to ResponseDone
QUESTIONS = [
    "What is the capital of France, and what is it famous for?",
    "How many legs does a spider have?",
    "Why is the sky blue on a clear summer day?",
    "Who wrote the play Romeo and Juliet?",
    "At what temperature does water boil at sea level?",
    "How many days are there in a leap year?",
    "What is the largest planet in our solar system?",
    "Can you recommend a good book to read this weekend?",
    "What is the tallest mountain in the world?",
    "How do I make a really good cup of tea?",
    "What language do most people speak in Brazil?",
    "Why do the leaves of trees change color in the fall?",
    "What should I cook for dinner tonight?",
    "How far away is the moon from the earth?",
    "Tell me a fun fact about octopuses.",
    "What is the best way to learn a new language?",
]
WARMUP_QUESTION = "Hello, can you hear me clearly?"
MODES = ("inprocess", "process")


# --------------------------------------------------------------------------- audio


def speak(texts: Sequence[str], voice: str) -> list[np.ndarray]:
    """Each text spoken as float32 mono at 16 kHz."""
    if voice == "espeak":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from speech import espeak  # tests/speech.py

        return [espeak(t, rate=p.INPUT_RATE) for t in texts]
    from voxline.codecs.resample import resample
    from voxline.engines.models.piper_tts import PiperTTS

    tts = PiperTTS.load()
    return [resample(tts.synthesize_all(t, seed=i), tts.sample_rate, p.INPUT_RATE)
            for i, t in enumerate(texts)]


def trim_speech(audio: np.ndarray, level: float = 0.02, window: int = 160) -> np.ndarray:
    """Cut leading and trailing silence: keep from the first to the last 10 ms window
    whose peak reaches `level` x the clip's peak."""
    n = len(audio) // window
    peaks = np.abs(audio[: n * window]).reshape(n, window).max(axis=1)
    loud = np.nonzero(peaks >= level * peaks.max())[0]
    return audio[loud[0] * window: (loud[-1] + 1) * window].astype(np.float32)


@dataclass
class Clip:
    text: str
    speech: np.ndarray  # trimmed speech
    lead: int  # samples of silence before it; lead + len(speech) is a multiple of CHUNK

    @property
    def speech_s(self) -> float:
        return len(self.speech) / p.INPUT_RATE

    @property
    def speech_end_ms(self) -> float:
        """Where speech ends on the stream's own audio clock."""
        return (self.lead + len(self.speech)) * 1000 / p.INPUT_RATE


def make_clip(text: str, audio: np.ndarray) -> Clip:
    speech = trim_speech(audio)
    lead = int(LEAD_SILENCE_S * p.INPUT_RATE) + (-len(speech)) % CHUNK
    return Clip(text, speech, lead)


# --------------------------------------------------------------------------- one turn


@dataclass
class TurnTiming:
    mode: str
    text: str
    speech_end: float = 0.0  # perf_counter when the last speech chunk was sent
    started: float | None = None
    stopped: float | None = None
    stopped_audio_ms: int | None = None
    final: float | None = None
    first_text: float | None = None
    segment_ready: float | None = None  # text deltas hold the first audio chunk's text
    first_audio: float | None = None
    done: float | None = None
    transcript: str = ""
    asr_ms: float = 0.0
    first_segment: str = ""
    reply: str = ""
    status: str = ""
    errors: list[str] = field(default_factory=list)

    def ms(self, a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else (b - a) * 1000

    @property
    def from_speech_end(self) -> float | None:
        return self.ms(self.speech_end, self.first_audio)

    @property
    def from_stopped(self) -> float | None:
        return self.ms(self.stopped, self.first_audio)


async def run_turn(client: EngineClient, mode: str, stream_id: str, clip: Clip,
                   partials: bool, full_reply: bool) -> TurnTiming:
    """Feed one spoken question at real time on a fresh stream; time the reply."""
    timing = TurnTiming(mode, clip.text)
    stream = await client.open_stream(stream_id, p.StreamConfig(transcribe_partials=partials))
    audio = np.concatenate([np.zeros(clip.lead, np.float32), clip.speech])
    speech_chunks = len(audio) // CHUNK
    finished = asyncio.Event()

    async def feed() -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        silence = np.zeros(CHUNK, np.float32).tobytes()
        k = 0
        while not finished.is_set():
            if k < speech_chunks:
                data = audio[k * CHUNK:(k + 1) * CHUNK].tobytes()
            else:
                data = silence
            # A microphone hands over a chunk once its 20 ms have been captured.
            await asyncio.sleep(max(0.0, t0 + (k + 1) * CHUNK_MS / 1000 - loop.time()))
            stream.send(p.AppendAudio(stream_id, data))
            if k == speech_chunks - 1:
                timing.speech_end = time.perf_counter()
            k += 1
            if k * CHUNK_MS / 1000 > clip.speech_s + LEAD_SILENCE_S + MAX_WAIT_S:
                return

    feeder = asyncio.create_task(feed())
    deltas: list[tuple[float, str]] = []  # (arrival, text) of every TextDelta
    try:
        async with asyncio.timeout(clip.speech_s + LEAD_SILENCE_S + MAX_WAIT_S):
            async for out in stream:
                now = time.perf_counter()
                match out:
                    case p.SpeechStarted():
                        timing.started = timing.started or now
                    case p.SpeechStopped():
                        if timing.stopped is None:
                            timing.stopped, timing.stopped_audio_ms = now, out.audio_end_ms
                            stream.send(p.CreateResponse(stream_id, "resp_1", "item_reply"))
                    case p.TranscriptFinal():
                        timing.final = timing.final or now
                        timing.transcript, timing.asr_ms = out.text, out.asr_ms
                    case p.TextDelta():
                        timing.first_text = timing.first_text or now
                        deltas.append((now, out.text))
                    case p.AudioChunk():
                        if timing.first_audio is None:
                            timing.first_audio = now
                            timing.first_segment = out.text
                            if not full_reply:
                                stream.send(p.CancelResponse(stream_id))
                    case p.ResponseDone():
                        timing.done = now
                        timing.reply, timing.status = out.text, out.status.name.lower()
                        break
                    case p.StreamError():
                        timing.errors.append(f"{out.code}: {out.message}")
                        if out.fatal:
                            break
    except TimeoutError:
        timing.errors.append("timed out waiting for the reply")
    finally:
        finished.set()
        feeder.cancel()
        await asyncio.gather(feeder, return_exceptions=True)
        await stream.aclose()
    if timing.first_audio is not None:
        timing.segment_ready = segment_ready_at(deltas, timing.first_segment, timing.first_audio)
    return timing


def _alnum(text: str) -> str:
    return "".join(c for c in text.lower() if c.isalnum())


def segment_ready_at(deltas: Sequence[tuple[float, str]], segment: str,
                     first_audio: float) -> float | None:
    """When the first spoken segment's text was complete (approximate): the arrival of the
    delta after the one that brought the segment's last character (the chunker needs that
    look-ahead to close a segment), or of that delta itself if nothing followed before the
    first audio."""
    target = _alnum(segment)
    if not target:
        return None
    text = ""
    for i, (at, delta) in enumerate(deltas):
        text += delta
        if len(_alnum(text)) >= len(target) and target in _alnum(text):
            if i + 1 < len(deltas) and deltas[i + 1][0] <= first_audio:
                return deltas[i + 1][0]
            return at
    return None


# --------------------------------------------------------------------------- report


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q))


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def fmt(v: float | None) -> str:
    return "   -" if v is None else f"{v:5.0f}"


def print_turn(i: int, t: TurnTiming, clip: Clip) -> None:
    vad_ms = t.ms(t.speech_end, t.stopped)
    asr_ms = t.ms(t.stopped, t.final)
    llm_ms = t.ms(t.final, t.first_text)
    seg_ms = t.ms(t.first_text, t.segment_ready)
    tts_ms = t.ms(t.segment_ready or t.first_text, t.first_audio)
    clock = "" if t.stopped_audio_ms is None else f"{t.stopped_audio_ms - clip.speech_end_ms:+5.0f}"
    print(f"  {i:>2} {t.mode:<9} {clip.speech_s:4.1f}s | {fmt(t.from_speech_end)} {fmt(t.from_stopped)}"
          f" | {fmt(vad_ms)} {clock:>5} {fmt(asr_ms)} {fmt(t.asr_ms)} {fmt(llm_ms)} {fmt(seg_ms)}"
          f" {fmt(tts_ms)}"
          f" | {t.transcript[:40]!r} -> {t.first_segment[:40]!r}"
          + (f"  ERRORS: {t.errors}" if t.errors else ""), flush=True)


def summarize(results: dict[str, list[TurnTiming]]) -> None:
    print()
    head = (f"{'mode':<9} {'n':>3} | {'from end of speech audio (ms)':^29} | "
            f"{'from VAD speech_stopped (ms)':^29}")
    sub = f"{'':<9} {'':>3} | " + " | ".join([f"{'p50':>6} {'p95':>6} {'min':>6} {'max':>6}"] * 2)
    print(head)
    print(sub)
    print("-" * len(sub))
    stats: dict[str, tuple[float, float, float, float]] = {}
    for mode, turns in results.items():
        a = [t.from_speech_end for t in turns if t.from_speech_end is not None]
        b = [t.from_stopped for t in turns if t.from_stopped is not None]
        if not a or not b:
            print(f"{mode:<9} {0:>3} | no complete turns")
            continue
        row = []
        for vals in (a, b):
            row.append(f"{pct(vals, 50):6.0f} {pct(vals, 95):6.0f} {min(vals):6.0f} {max(vals):6.0f}")
        stats[mode] = (pct(a, 50), pct(a, 95), pct(b, 50), pct(b, 95))
        print(f"{mode:<9} {len(a):>3} | " + " | ".join(row))
    if "inprocess" in stats and "process" in stats:
        i, q = stats["inprocess"], stats["process"]
        print(f"{'ratio':<9} {'':>3} | {q[0] / i[0]:6.2f} {q[1] / i[1]:6.2f} {'':>13} | "
              f"{q[2] / i[2]:6.2f} {q[3] / i[3]:6.2f}   (process / inprocess)")
    print()
    print("Median breakdown (ms):  VAD = speech end -> speech_stopped, ASR = speech_stopped -> "
          "final transcript, LLM = final -> first text delta, text = first delta -> first "
          "spoken segment complete, TTS = segment complete -> first audio")
    print(f"{'mode':<9} | {'VAD':>5} {'ASR':>5} {'asr_ms':>6} {'LLM':>5} {'text':>5} {'TTS':>5}")
    for mode, turns in results.items():
        cols = [
            median_ms(turns, lambda t: t.ms(t.speech_end, t.stopped)),
            median_ms(turns, lambda t: t.ms(t.stopped, t.final)),
            f"{median_ms(turns, lambda t: t.asr_ms):>6}",
            median_ms(turns, lambda t: t.ms(t.final, t.first_text)),
            median_ms(turns, lambda t: t.ms(t.first_text, t.segment_ready)),
            median_ms(turns, lambda t: t.ms(t.segment_ready or t.first_text, t.first_audio)),
        ]
        print(f"{mode:<9} | " + " ".join(cols))


def median_ms(turns: Sequence[TurnTiming], part: Callable[[TurnTiming], float | None]) -> str:
    vals = [v for v in (part(t) for t in turns) if v is not None]
    return f"{pct(vals, 50):5.0f}" if vals else "    -"


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--utterances", type=int, default=10,
                    help=f"measured utterances per mode (max {len(QUESTIONS)}; default 10)")
    ap.add_argument("--mode", default="inprocess,process",
                    help="comma-separated engine clients: inprocess, process")
    ap.add_argument("--voice", choices=["espeak", "piper"], default="espeak",
                    help="who speaks the questions (default espeak-ng)")
    ap.add_argument("--no-partials", action="store_true",
                    help="open streams with transcribe_partials=False (default: engine default, on)")
    ap.add_argument("--full-replies", action="store_true",
                    help="let every reply finish instead of cancelling it after first audio")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured turns per mode first")
    ap.add_argument("--threads", type=int, default=0,
                    help="engine threads (core setting `threads`; 0 = VOXLINE_THREADS, else half the CPUs)")
    args = ap.parse_args(argv)
    args.modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    if not args.modes or any(m not in MODES for m in args.modes):
        ap.error(f"--mode takes a comma-separated subset of {','.join(MODES)}")
    if not 1 <= args.utterances <= len(QUESTIONS):
        ap.error(f"--utterances must be 1..{len(QUESTIONS)}")
    return args


async def amain(args: argparse.Namespace) -> int:
    print("command: " + shlex.join([sys.executable, *sys.argv]))
    print(f"machine: {load_note()}. The CPUs are shared with other work, so numbers are "
          "noisy; the modes run interleaved, utterance by utterance, so compare them side by side.")
    texts = QUESTIONS[: args.utterances]
    audios = speak([WARMUP_QUESTION, *texts], args.voice)
    warm_clip = make_clip(WARMUP_QUESTION, audios[0])
    clips = [make_clip(t, a) for t, a in zip(texts, audios[1:], strict=True)]
    lengths = [c.speech_s for c in clips]
    print(f"{len(clips)} utterances ({args.voice}), speech {min(lengths):.1f}-{max(lengths):.1f} s "
          f"each; fresh stream per utterance; partial transcripts "
          f"{'off' if args.no_partials else 'on (engine default)'}; replies "
          f"{'run to the end' if args.full_replies else 'cancelled after their first audio chunk'}")

    clients: dict[str, EngineClient] = {}
    try:
        for mode in args.modes:
            t0 = time.perf_counter()
            kwargs = {"threads": args.threads} if args.threads else {}
            client: EngineClient = (
                InProcessEngineClient(DEFAULT_CORE, kwargs) if mode == "inprocess"
                else MultiprocessEngineClient(DEFAULT_CORE, kwargs, restart=False))
            await client.start()
            clients[mode] = client
            print(f"{mode} engine ready in {time.perf_counter() - t0:.1f} s")
        from voxline.config import load_settings
        from voxline.engines.factory import model_threads

        threads = model_threads(load_settings(threads=args.threads or None))
        print(f"engine threads: torch and onnxruntime ASR {threads} (VOXLINE_THREADS, else "
              "half the CPUs), VAD and TTS 1")
        for mode, client in clients.items():
            for w in range(args.warmup):
                t = await run_turn(client, mode, f"warmup-{mode}-{w}", warm_clip,
                                   not args.no_partials, args.full_replies)
                print(f"warm-up {mode}: {fmt(t.from_speech_end)} ms from end of speech "
                      f"({t.transcript!r})" + (f" ERRORS: {t.errors}" if t.errors else ""))
        print()
        print(f"  {'#':>2} {'mode':<9} {'speech':>6} | {'end':>5} {'vadst':>5} | {'VAD':>5} "
              f"{'clock':>5} {'ASR':>5} {'model':>5} {'LLM':>5} {'text':>5} {'TTS':>5} | "
              "transcript -> first spoken segment")
        print("     (ms; end = from end of speech audio, vadst = from speech_stopped; clock = VAD "
              "audio_end_ms - true speech end on the stream clock; model = ASR model time of "
              "the final transcript, so ASR - model = queueing)")
        results: dict[str, list[TurnTiming]] = {m: [] for m in clients}
        for i, clip in enumerate(clips):
            order = list(clients) if i % 2 == 0 else list(reversed(clients))
            for mode in order:
                t = await run_turn(clients[mode], mode, f"bench-{mode}-{i}", clip,
                                   not args.no_partials, args.full_replies)
                results[mode].append(t)
                print_turn(i, t, clip)
        summarize(results)
        print(f"machine at end: {load_note()}")
    finally:
        for client in clients.values():
            await client.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(amain(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
