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

Every variant is started up front and the utterances are interleaved between them
(alternating which goes first), so they see the same machine load:

- inprocess: `InProcessEngineClient` (engine loop on a thread of this process);
- process: `MultiprocessEngineClient` (engine in a child process, ZeroMQ + msgspec);
- ws: a `voxline serve` subprocess on 127.0.0.1, driven over `/v1/realtime` the way a
  client is (24 kHz PCM16 appends at real time, server VAD with its defaults, the
  session's own `response.create`): what a client hears, pacing included. Latency is
  from sending the last speech chunk to the first `response.output_audio.delta` of a
  reply created after the speech ended. `--turn-detection server_vad,semantic_vad`
  runs each session's turn detection both ways (one server each, interleaved).

each with speculation on and/or off (`--speculation on,off`: `speculate_after_ms` 160 or
0; one server per setting in ws mode). Besides the questions, some utterances pause for
300-600 ms mid-sentence ("I would like to book a table for ... four people"): a *false
cut* is a turn the server ended inside such a pause (it then answers half a sentence);
speculation must not add any (server VAD decides when a turn ends either way). For the
speculation variants the table also gives speculations started and discarded per turn
(from the engine's counters; `/metrics` in ws mode) and, in ws mode, the CPU seconds the
server's process tree spent per turn, so the work thrown away is visible.

`--variants` instead names the steps of the speech_stopped -> first audio ladder, each a
variant of the same run (inprocess/process modes; ws takes only the server's defaults):

- baseline: no speculation; the reply starts when the turn ends;
- spec-text: a pause speculates the reply's text only (its speech waits for the commit);
- held: the speculation also speaks its first words, audio held until the commit;
- early: + the pause transcript taken where the speech fell silent (the engine default);
- early-cold: the same with warm prefill off;
- early-refeed: warm prefill on, but a reply over exactly its prompt feeds the prompt's
  last token again instead of sampling from the logits the warm prefill kept.

By default the reply is cancelled once its first audio chunk arrives (the rest of the
reply does not affect the measurement and would make the run much longer); the
benchmark still waits for the `ResponseDone` before the next utterance, so replies never
overlap. ``--full-replies`` lets every reply run to its end instead.

    .venv/bin/python benchmarks/cpu_latency/bench_pipeline.py [--utterances 20] [--mode ws]
                                                  [--speculation on,off]
                                                  [--warm-prefill on,off]
                                                  [--variants baseline,held,early,...]
                                                  [--voice espeak,espeak:en-us+f3,piper]
                                                  [--no-partials]
                                                  [--full-replies] [--threads N]
    (--mode inprocess,process compares the engine clients directly, without a server)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402

from voxline.engines import protocol as p  # noqa: E402
from voxline.engines.client import EngineClient, InProcessEngineClient  # noqa: E402
from voxline.engines.process import MultiprocessEngineClient  # noqa: E402
from voxline.engines.trace import timeline as trace_timeline  # noqa: E402

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
# Sentences with a pause in the middle: (before, pause ms, after).
PAUSED = [
    ("I would like to book a table for", 450, "four people tonight."),
    ("Can you tell me the way to the", 350, "nearest train station?"),
    ("My favourite food is", 550, "pizza with lots of cheese."),
    ("I think I will go to the beach and", 600, "swim in the sea."),
    ("Please remind me to call my", 300, "sister tomorrow morning."),
    ("What is the weather like in", 500, "London this week?"),
]
WARMUP_QUESTION = "Hello, can you hear me clearly?"
MODES = ("inprocess", "process", "ws")
# What each --turn-detection asks for (the realtime protocol's defaults for each type)
TURN_DETECTION = {"server_vad": p.TurnParams(), "semantic_vad": p.TurnParams(eagerness="auto")}
SPECULATE_MS = 160  # the engine default
READY_MS = 50  # first audio this soon after speech_stopped was made before it
BENCH_CORE = "bench_pipeline:bench_core"  # benchmarks/ is on sys.path (this script's folder)
WS_RATE = 24000  # the /v1/realtime default input format: audio/pcm at 24 kHz
# What the engine clients ask for at the end of a turn (the session's auto response)
AUTO_RESPONSE = p.ResponseConfig(voice="alloy")


@dataclass(frozen=True)
class Variant:
    """One engine configuration of the latency ladder (`--variants`)."""

    speculate: bool = True  # a pause starts the reply speculatively
    speech: bool = True  # ... and speaks its first words, held until the commit
    early_pause: bool = True  # the pause transcript is taken where the speech fell silent
    warm: bool = True  # partial transcripts prefill the reply's prompt
    kept: bool = True  # ... and a reply over exactly that prompt samples from its logits
    speculate_ms: float = SPECULATE_MS  # the pause that starts it (speculate_after_ms)
    early_spec: bool = True  # semantic VAD: complete words start it before the pause

    @property
    def server_default(self) -> bool:
        """What the ws servers run (started with `speech`, `early_pause` and `kept` on)."""
        return self.speech and self.early_pause and self.kept


LADDER = {
    "baseline": Variant(speculate=False),
    "spec-text": Variant(speech=False, early_pause=False),
    "held": Variant(early_pause=False),
    "early": Variant(),
    "early-cold": Variant(warm=False),
    "early-refeed": Variant(kept=False),
}


def bench_core(wake: Callable[[], None], settings: dict | None = None, *,
               speculate_speech: bool = True, kept_logits: bool = True,
               **fields: object) -> object:
    """The engine's own core (`make_engine_core`, settings such as `early_pause_transcript`
    in `fields`) with the ladder steps that have no setting, held first-words audio and
    the warm prefill's kept logits, switched as asked (core spec
    ``bench_pipeline:bench_core``)."""
    from voxline.engines.factory import make_engine_core

    core = make_engine_core(wake, settings, **fields)
    core.responses.speculate_speech = speculate_speech
    core.llm.keep_logits = kept_logits
    return core


# --------------------------------------------------------------------------- audio


def speak(texts: Sequence[str], voice: str) -> list[np.ndarray]:
    """Each text spoken as float32 mono at 16 kHz by `voice`: espeak (espeak-ng's en-us),
    espeak:<espeak-ng voice> (e.g. en-us+f3, en-gb-x-rp) or piper (the shipped voice)."""
    if voice.split(":")[0] == "espeak":
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
        from speech import espeak  # tests/speech.py

        name = voice.partition(":")[2] or "en-us"
        return [espeak(t, rate=p.INPUT_RATE, voice=name) for t in texts]
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
    pause_ms: int = 0  # a pause this long mid-sentence (0: none)

    @property
    def speech_s(self) -> float:
        return len(self.speech) / p.INPUT_RATE

    @property
    def speech_end_ms(self) -> float:
        """Where speech ends on the stream's own audio clock."""
        return (self.lead + len(self.speech)) * 1000 / p.INPUT_RATE


def make_clip(text: str, audio: np.ndarray, pause_ms: int = 0) -> Clip:
    speech = trim_speech(audio)
    lead = int(LEAD_SILENCE_S * p.INPUT_RATE) + (-len(speech)) % CHUNK
    return Clip(text, speech, lead, pause_ms)


def make_clips(n: int, voice: str) -> tuple[Clip, list[Clip]]:
    """The warm-up clip and `n` measured ones: questions, with every third or so a
    sentence that pauses mid-way (at least 6 of 20)."""
    n_paused = min(len(PAUSED), max(1, n * 3 // 10)) if n >= 3 else 0
    questions = QUESTIONS[: n - n_paused]
    texts = [WARMUP_QUESTION, *questions]
    for before, _, after in PAUSED[:n_paused]:
        texts += [before, after]
    audios = speak(texts, voice)
    warm = make_clip(WARMUP_QUESTION, audios[0])
    clips = [make_clip(t, a) for t, a in zip(questions, audios[1:1 + len(questions)], strict=True)]
    rest = audios[1 + len(questions):]
    for k, (before, pause_ms, after) in enumerate(PAUSED[:n_paused]):
        gap = np.zeros(int(pause_ms * p.INPUT_RATE / 1000), np.float32)
        speech = np.concatenate([trim_speech(rest[2 * k]), gap, trim_speech(rest[2 * k + 1])])
        clips.append(make_clip(f"{before} ... {after}", speech, pause_ms))
    # spread the paused sentences among the questions
    order = sorted(range(len(clips)), key=lambda i: (i * 7919) % len(clips))
    return warm, [clips[i] for i in order]


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
    false_cut: bool = False  # the turn ended inside a mid-sentence pause
    speculations: int = 0  # speculative replies started during the turn
    discards: int = 0  # ... and dropped unsent
    cpu_s: float | None = None  # CPU seconds of the server's process tree (ws mode)

    def ms(self, a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else (b - a) * 1000

    @property
    def from_speech_end(self) -> float | None:
        return self.ms(self.speech_end, self.first_audio)

    @property
    def from_stopped(self) -> float | None:
        return self.ms(self.stopped, self.first_audio)


async def run_turn(client: EngineClient, mode: str, stream_id: str, clip: Clip,
                   partials: bool, full_reply: bool, detection: str = "server_vad") -> TurnTiming:
    """Feed one spoken question at real time on a fresh stream; time the reply."""
    timing = TurnTiming(mode, clip.text)
    stream = await client.open_stream(stream_id, p.StreamConfig(
        transcribe_partials=partials, auto_response=AUTO_RESPONSE,
        turn_detection=TURN_DETECTION[detection]))
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
                    case p.VoiceStarted():
                        timing.started = timing.started or now
                    case p.VoiceStopped():
                        if out.audio_end_ms < clip.speech_end_ms - 150:
                            timing.false_cut = True  # cut inside the pause: not answered here
                        elif timing.stopped is None:
                            timing.stopped, timing.stopped_audio_ms = now, out.audio_end_ms
                            stream.send(p.CreateResponse(stream_id, "resp_1", "item_reply",
                                                         AUTO_RESPONSE))
                    case p.Speculation():
                        timing.speculations += out.outcome == "started"
                        timing.discards += out.outcome == "discarded"
                    case p.TranscriptFinal() if timing.stopped is not None:
                        timing.final = timing.final or now
                        timing.transcript, timing.asr_ms = out.text, out.asr_ms
                    case p.ReplyTextDelta():
                        timing.first_text = timing.first_text or now
                        deltas.append((now, out.text))
                    case p.AudioChunk():
                        if timing.first_audio is None:
                            timing.first_audio = now
                            timing.first_segment = out.text
                            if not full_reply:
                                stream.send(p.CancelResponse(stream_id))
                    case p.ResponseFinished():
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


# ------------------------------------------------------------------ one turn, over ws


class WsServer:
    """`voxline serve` in a subprocess on a free loopback port (one per variant)."""

    def __init__(self, label: str, speculate_ms: float, threads: int,
                 warm_prefill: bool = True, turn_detection: str = "server_vad",
                 log_prefix: str = "", early_speculation: bool = True,
                 serve_args: Sequence[str] = ()) -> None:
        self.early_speculation = early_speculation
        self.serve_args = list(serve_args)  # the variant's own settings (--int8-prefill ...)
        self.label, self.speculate_ms, self.threads = label, speculate_ms, threads
        self.log_prefix = log_prefix  # the server's log goes to prefix + label + .log
        self.warm_prefill = warm_prefill
        self.turn_detection = turn_detection  # what each session asks for in session.update
        self.proc: subprocess.Popen[bytes] | None = None
        self.base = ""

    def _spawn(self) -> subprocess.Popen[bytes]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        env = dict(os.environ)
        if self.threads:
            env["VOXLINE_THREADS"] = str(self.threads)
        cmd = [sys.executable, "-c", "from voxline.cli import main; raise SystemExit(main())",
               "serve", "--host", "127.0.0.1", "--port", str(port),
               "--speculate-after-ms", str(self.speculate_ms),
               "--warm-prefill" if self.warm_prefill else "--no-warm-prefill",
               "--early-speculation" if self.early_speculation else "--no-early-speculation"]
        cmd += self.serve_args
        if not self.log_prefix:
            return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
        with open(f"{self.log_prefix}{self.label}.log", "wb") as log:  # the child keeps a copy
            return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)

    async def start(self) -> None:
        self.proc = self._spawn()
        async with httpx.AsyncClient() as http:
            for _ in range(1200):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.label}: voxline serve exited ({self.proc.returncode})")
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(self.base + "/health", timeout=2)).status_code == 200:
                        return
                await asyncio.sleep(0.5)
        raise RuntimeError(f"{self.label}: voxline serve did not become healthy in 600 s")

    def cpu_seconds(self) -> float:
        """CPU time of the server and its engine process so far."""
        assert self.proc is not None
        root = psutil.Process(self.proc.pid)
        total = 0.0
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                total += t.user + t.system
        return total

    async def counter(self, name: str) -> float:
        async with httpx.AsyncClient() as http:
            text = (await http.get(self.base + "/metrics", timeout=5)).text
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return 0.0

    async def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.proc.wait, 30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


async def run_ws_turn(server: WsServer, clip: Clip, full_reply: bool) -> TurnTiming:
    """One spoken question over /v1/realtime, appended at real time on a new session."""
    from websockets.asyncio.client import connect

    from voxline.codecs.pcm import float_to_pcm16
    from voxline.codecs.resample import resample

    timing = TurnTiming(server.label, clip.text)
    audio = resample(np.concatenate([np.zeros(clip.lead, np.float32), clip.speech]),
                     p.INPUT_RATE, WS_RATE)
    step = WS_RATE * CHUNK_MS // 1000
    speech_chunks = -(-len(audio) // step)
    cpu0 = server.cpu_seconds()
    started0 = await server.counter("voxline_speculation_started_total")
    discarded0 = await server.counter("voxline_speculation_discarded_total")
    early: set[str] = set()  # replies created before the speech ended (after a false cut)
    reply_id: str | None = None
    finished = asyncio.Event()
    deltas: list[tuple[float, str]] = []
    url = "ws" + server.base[len("http"):] + "/v1/realtime"
    try:
        async with asyncio.timeout(clip.speech_s + LEAD_SILENCE_S + MAX_WAIT_S), \
                connect(url, max_size=None) as ws:
            created = json.loads(await ws.recv())
            assert created["type"] == "session.created", created
            audio_in: dict[str, object] = {"transcription": {"model": "asr"}}
            if server.turn_detection != "server_vad":  # else the protocol's default, untouched
                audio_in["turn_detection"] = {"type": server.turn_detection}
            await ws.send(json.dumps({"type": "session.update", "session": {
                "type": "realtime", "audio": {"input": audio_in}}}))

            async def feed() -> None:
                t0 = time.perf_counter()
                silence = float_to_pcm16(np.zeros(step, np.float32))
                k = 0
                while not finished.is_set():
                    piece = (float_to_pcm16(audio[k * step:(k + 1) * step]) if k < speech_chunks
                             else silence)
                    await asyncio.sleep(max(0.0, t0 + (k + 1) * CHUNK_MS / 1000
                                            - time.perf_counter()))
                    await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                              "audio": base64.b64encode(piece).decode()}))
                    if k == speech_chunks - 1:
                        timing.speech_end = time.perf_counter()
                    k += 1

            feeder = asyncio.create_task(feed())
            try:
                async for raw in ws:
                    now = time.perf_counter()
                    event = json.loads(raw)
                    kind = event["type"]
                    if kind == "input_audio_buffer.speech_started":
                        timing.started = timing.started or now
                    elif kind == "input_audio_buffer.speech_stopped":
                        if event["audio_end_ms"] < clip.speech_end_ms - 150:
                            timing.false_cut = True
                        elif timing.stopped is None:
                            timing.stopped, timing.stopped_audio_ms = now, event["audio_end_ms"]
                    elif kind == "conversation.item.input_audio_transcription.completed":
                        if timing.stopped is not None and timing.final is None:
                            timing.final, timing.transcript = now, event["transcript"]
                    elif kind == "response.created":
                        if timing.speech_end == 0.0:
                            early.add(event["response"]["id"])
                        elif reply_id is None:
                            reply_id = event["response"]["id"]
                    elif kind == "response.output_audio_transcript.delta":
                        if event["response_id"] == reply_id:
                            timing.first_text = timing.first_text or now
                            deltas.append((now, event["delta"]))
                    elif kind == "response.output_audio.delta":
                        if event["response_id"] == reply_id and timing.first_audio is None:
                            timing.first_audio = now
                            timing.first_segment = "".join(d for _, d in deltas)
                            if not full_reply:
                                await ws.send(json.dumps({"type": "response.cancel"}))
                    elif kind == "response.done":
                        if event["response"]["id"] == reply_id:
                            timing.done = now
                            timing.status = event["response"]["status"]
                            break
                    elif kind == "error":
                        timing.errors.append(f"{event['error'].get('code')}: "
                                             f"{event['error'].get('message')}")
            finally:
                finished.set()
                feeder.cancel()
                await asyncio.gather(feeder, return_exceptions=True)
    except TimeoutError:
        timing.errors.append("timed out waiting for the reply")
    await asyncio.sleep(0.2)  # let the session close before reading its counters
    timing.cpu_s = server.cpu_seconds() - cpu0
    timing.speculations = int(await server.counter("voxline_speculation_started_total") - started0)
    timing.discards = int(await server.counter("voxline_speculation_discarded_total") - discarded0)
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


def client_milestones(path: str, i: int, t: TurnTiming) -> None:
    """Append a ws turn's client-side milestones, in ms of the same monotonic clock as the
    server's VOXLINE_TRACE lines (perf_counter), so the two line up turn by turn."""
    marks = {"speech_end": t.speech_end or None, "speech_stopped": t.stopped,
             "transcript": t.final, "first_text": t.first_text, "first_audio": t.first_audio}
    with open(path, "a") as out:
        for name, at in marks.items():
            if at is not None:
                out.write(f"t={at * 1000:.1f} turn={i} client {name} text={t.text!r}\n")


def print_turn(i: int, t: TurnTiming, clip: Clip) -> None:
    vad_ms = t.ms(t.speech_end, t.stopped)
    asr_ms = t.ms(t.stopped, t.final)
    llm_ms = t.ms(t.final, t.first_text)
    seg_ms = t.ms(t.first_text, t.segment_ready)
    tts_ms = t.ms(t.segment_ready or t.first_text, t.first_audio)
    clock = "" if t.stopped_audio_ms is None else f"{t.stopped_audio_ms - clip.speech_end_ms:+5.0f}"
    print(f"  {i:>2} {t.mode:<34} {clip.speech_s:4.1f}s | {fmt(t.from_speech_end)} {fmt(t.from_stopped)}"
          f" | {fmt(vad_ms)} {clock:>5} {fmt(asr_ms)} {fmt(t.asr_ms)} {fmt(llm_ms)} {fmt(seg_ms)}"
          f" {fmt(tts_ms)}"
          f" | {t.transcript[:40]!r} -> {t.first_segment[:40]!r}"
          + (f"  ERRORS: {t.errors}" if t.errors else ""), flush=True)


def summarize(results: dict[str, list[TurnTiming]]) -> None:
    print()
    head = (f"{'variant':<34} {'n':>3} | {'from end of speech audio (ms)':^29} | "
            f"{'from VAD speech_stopped (ms)':^29}")
    sub = f"{'':<34} {'':>3} | " + " | ".join([f"{'p50':>6} {'p95':>6} {'min':>6} {'max':>6}"] * 2)
    print(head)
    print(sub)
    print("-" * len(sub))
    stats: dict[str, tuple[float, float, float, float]] = {}
    for mode, turns in results.items():
        a = [t.from_speech_end for t in turns if t.from_speech_end is not None]
        b = [t.from_stopped for t in turns if t.from_stopped is not None]
        if not a or not b:
            print(f"{mode:<34} {0:>3} | no complete turns")
            continue
        row = []
        for vals in (a, b):
            row.append(f"{pct(vals, 50):6.0f} {pct(vals, 95):6.0f} {min(vals):6.0f} {max(vals):6.0f}")
        stats[mode] = (pct(a, 50), pct(a, 95), pct(b, 50), pct(b, 95))
        print(f"{mode:<34} {len(a):>3} | " + " | ".join(row))
    pairs = [(m, m + "+spec") for m in MODES if m in stats and m + "+spec" in stats]
    if "inprocess" in stats and "process" in stats:
        pairs.append(("inprocess", "process"))
    for base, other in pairs:
        i, q = stats[base], stats[other]
        print(f"{'ratio':<34} {'':>3} | {q[0] / i[0]:6.2f} {q[1] / i[1]:6.2f} {'':>13} | "
              f"{q[2] / i[2]:6.2f} {q[3] / i[3]:6.2f}   ({other} / {base})")
    print()
    print(f"{'variant':<34} | {'turns':>5} {'paused':>6} {'false cuts':>10} | "
          f"{'speculations/turn':>17} {'discards/turn':>13} | {'CPU s/turn':>10}")
    for mode, turns in results.items():
        paused = sum(1 for t in turns if " ... " in t.text)
        cuts = sum(t.false_cut for t in turns)
        cpu = [t.cpu_s for t in turns if t.cpu_s is not None]
        print(f"{mode:<34} | {len(turns):>5} {paused:>6} {cuts:>10} | "
              f"{np.mean([t.speculations for t in turns]):>17.2f} "
              f"{np.mean([t.discards for t in turns]):>13.2f} | "
              f"{(f'{np.mean(cpu):10.2f}' if cpu else '         -')}")
    print()
    print("Median breakdown (ms):  VAD = speech end -> speech_stopped, ASR = speech_stopped -> "
          "final transcript, LLM = final -> first text delta, text = first delta -> first "
          "spoken segment complete, TTS = segment complete -> first audio")
    print(f"{'variant':<34} | {'VAD':>5} {'ASR':>5} {'asr_ms':>6} {'LLM':>5} {'text':>5} {'TTS':>5}")
    for mode, turns in results.items():
        cols = [
            median_ms(turns, lambda t: t.ms(t.speech_end, t.stopped)),
            median_ms(turns, lambda t: t.ms(t.stopped, t.final)),
            f"{median_ms(turns, lambda t: t.asr_ms):>6}",
            median_ms(turns, lambda t: t.ms(t.final, t.first_text)),
            median_ms(turns, lambda t: t.ms(t.first_text, t.segment_ready)),
            median_ms(turns, lambda t: t.ms(t.segment_ready or t.first_text, t.first_audio)),
        ]
        print(f"{mode:<34} | " + " ".join(cols))


def markdown_table(results: dict[str, list[TurnTiming]]) -> None:
    """The side-by-side table as the README carries it. *Ready at the stop*: turns whose
    first audio came within `READY_MS` of `speech_stopped`, i.e. it was already made
    (held) when the turn was committed."""
    print(f"\n| variant | `speech_stopped` -> first audio p50 / p95 | end of speech -> first "
          f"audio p50 / p95 | the same, complete questions | ready at the stop (<= {READY_MS} "
          f"ms) | turns | false cuts (paused) |")
    print("|---|---|---|---|---|---|---|")
    for mode, turns in results.items():
        a = [t.from_speech_end for t in turns if t.from_speech_end is not None]
        b = [t.from_stopped for t in turns if t.from_stopped is not None]
        whole = [t.from_speech_end for t in turns
                 if t.from_speech_end is not None and " ... " not in t.text]
        paused = sum(" ... " in t.text for t in turns)
        if a and b:
            ready = sum(v <= READY_MS for v in b)
            print(f"| {mode} | {pct(b, 50):.0f} / {pct(b, 95):.0f} ms | {pct(a, 50):.0f} / "
                  f"{pct(a, 95):.0f} ms | {pct(whole, 50):.0f} / {pct(whole, 95):.0f} ms | "
                  f"{ready}/{len(b)} | {len(b)} | {sum(t.false_cut for t in turns)} / {paused} |")


class TraceRecords(logging.Handler):
    """Collects the engine's ``voxline.trace`` milestones (see voxline.engines.trace)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def median_ms(turns: Sequence[TurnTiming], part: Callable[[TurnTiming], float | None]) -> str:
    vals = [v for v in (part(t) for t in turns) if v is not None]
    return f"{pct(vals, 50):5.0f}" if vals else "    -"


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--utterances", type=int, default=20,
                    help=f"measured utterances per variant, about 3 in 10 pausing mid-sentence "
                         f"(max {len(QUESTIONS) + len(PAUSED)}; default 20)")
    ap.add_argument("--mode", default="ws",
                    help="comma-separated: ws (voxline serve + /v1/realtime, default), "
                         "inprocess, process (engine clients, no server)")
    ap.add_argument("--speculation", default="on,off",
                    help="comma-separated: on, off -- each mode runs once per setting "
                         "(default: on,off, interleaved)")
    ap.add_argument("--speculate-after-ms", default=str(SPECULATE_MS),
                    help="comma-separated: with speculation on, the pause that starts it "
                         "(speculate_after_ms); more than one runs each, interleaved "
                         f"(default {SPECULATE_MS}, the engine default)")
    ap.add_argument("--warm-prefill", default="on",
                    help="comma-separated: on, off -- the warm_prefill setting (partial "
                         "transcripts prefill the reply's prompt); on,off runs both, "
                         "interleaved (default: on, the engine default)")
    ap.add_argument("--early-speculation", default="on",
                    help="comma-separated: on, off -- the early_speculation setting (semantic "
                         "VAD: an early take whose words end a sentence starts the reply "
                         "before the pause); on,off runs both, interleaved, labelled -early "
                         "when off (default: on, the engine default)")
    ap.add_argument("--variants", default="",
                    help=f"comma-separated steps of the latency ladder, run side by side "
                         f"instead of --speculation x --warm-prefill: {', '.join(LADDER)} "
                         "(inprocess/process modes; ws runs only baseline, early, early-cold)")
    ap.add_argument("--turn-detection", default="server_vad",
                    help="comma-separated: server_vad (the protocol default, 500 ms), "
                         "semantic_vad (the engine's detector: Smart Turn + transcript rules, "
                         "eagerness auto); each runs as its own server or engine, interleaved "
                         "(default: server_vad)")
    ap.add_argument("--voice", default="espeak",
                    help="comma-separated: who speaks the questions -- espeak (espeak-ng en-us, "
                         "the default), espeak:<espeak-ng voice> (e.g. espeak:en-us+f3, "
                         "espeak:en-gb-x-rp), piper (the shipped voice); more than one runs "
                         "every utterance in each voice, rows per variant x voice")
    ap.add_argument("--no-partials", action="store_true",
                    help="open streams with transcribe_partials=False (default: engine default, on)")
    ap.add_argument("--full-replies", action="store_true",
                    help="let every reply finish instead of cancelling it after first audio")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured turns per mode first")
    ap.add_argument("--threads", type=int, default=0,
                    help="engine threads (core setting `threads`; 0 = VOXLINE_THREADS, else half the CPUs)")
    ap.add_argument("--trace", action="store_true",
                    help="also print the median timeline of the engine's turn milestones "
                         "(pause transcript, speculation, first token, first segment, first "
                         "audio); one variant, --mode inprocess")
    ap.add_argument("--trace-file", default="",
                    help="with --trace: also write every milestone line there, for per-turn reading")
    ap.add_argument("--int8-prefill", default="",
                    help="--mode ws: comma-separated llm_int8_prefill values, one server each "
                         "side by side (weight-only,dynamic); default: the server's own (auto)")
    ap.add_argument("--asr-decoder", default="",
                    help="--mode ws: comma-separated asr_decoder values, one server each side "
                         "by side (int8,float32); default: the server's own (auto)")
    ap.add_argument("--server-log", default="",
                    help="--mode ws: write each server's log to this prefix + variant + .log "
                         "(with VOXLINE_TRACE=1 in the environment, its turn milestones too), "
                         "and the client's milestones on the same clock to ... + .client.log")
    args = ap.parse_args(argv)
    args.voices = [v.strip() for v in args.voice.split(",") if v.strip()]
    if not args.voices or any(v != "piper" and v.split(":")[0] != "espeak" for v in args.voices):
        ap.error("--voice takes a comma-separated list of espeak, espeak:<voice>, piper")
    args.modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    if not args.modes or any(m not in MODES for m in args.modes):
        ap.error(f"--mode takes a comma-separated subset of {','.join(MODES)}")
    if not 1 <= args.utterances <= len(QUESTIONS) + len(PAUSED):
        ap.error(f"--utterances must be 1..{len(QUESTIONS) + len(PAUSED)}")
    choices = {"on": True, "off": False}
    args.speculation = [choices.get(v.strip()) for v in args.speculation.split(",") if v.strip()]
    if not args.speculation or None in args.speculation:
        ap.error("--speculation takes on, off or on,off")
    try:
        args.speculate_after_ms = [float(v) for v in args.speculate_after_ms.split(",") if v.strip()]
    except ValueError:
        ap.error("--speculate-after-ms takes comma-separated milliseconds, e.g. 160,96")
    if not args.speculate_after_ms or min(args.speculate_after_ms) <= 0:
        ap.error("--speculate-after-ms takes positive milliseconds (--speculation off turns it off)")
    args.early_speculation = [choices.get(v.strip())
                              for v in args.early_speculation.split(",") if v.strip()]
    if not args.early_speculation or None in args.early_speculation:
        ap.error("--early-speculation takes on, off or on,off")
    args.warm_prefill = [choices.get(v.strip()) for v in args.warm_prefill.split(",") if v.strip()]
    if not args.warm_prefill or None in args.warm_prefill:
        ap.error("--warm-prefill takes on, off or on,off")
    args.turn_detection = [v.strip() for v in args.turn_detection.split(",") if v.strip()]
    if not args.turn_detection or any(v not in TURN_DETECTION for v in args.turn_detection):
        ap.error(f"--turn-detection takes a comma-separated subset of {','.join(TURN_DETECTION)}")
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    if any(n not in LADDER for n in names):
        ap.error(f"--variants takes a comma-separated subset of {','.join(LADDER)}")
    if "ws" in args.modes and any(not LADDER[n].server_default for n in names):
        ap.error("--variants spec-text, held and early-refeed need --mode inprocess or "
                 "process: the server has no settings for them")
    args.variants = {n: LADDER[n] for n in names}
    if args.trace_file and not args.trace:
        ap.error("--trace-file needs --trace")
    args.int8_prefill = [v.strip() for v in args.int8_prefill.split(",") if v.strip()] or [""]
    args.asr_decoder = [v.strip() for v in args.asr_decoder.split(",") if v.strip()] or [""]
    for flag, values in (("--int8-prefill", args.int8_prefill),
                         ("--asr-decoder", args.asr_decoder)):
        if values != [""] and "ws" not in args.modes:
            ap.error(f"{flag} needs --mode ws (it is a `voxline serve` setting)")
    if args.server_log and "ws" not in args.modes:
        ap.error("--server-log needs --mode ws (the other modes start no server)")
    if args.trace and (args.modes != ["inprocess"] or len(variant_grid(args)) != 1
                       or len(args.turn_detection) != 1):
        ap.error("--trace needs --mode inprocess and one variant (the milestones of "
                 "interleaved engines would mix)")
    return args


def variant_grid(args: argparse.Namespace) -> dict[str, Variant]:
    """The named ladder steps, else --speculation x --warm-prefill (labels as before)."""
    if args.variants:
        return args.variants
    grid = {}
    for spec, warm, early in itertools.product(args.speculation, args.warm_prefill,
                                               args.early_speculation):
        if not spec and not early:
            continue  # (no speculation: nothing to start early)
        for ms in args.speculate_after_ms if spec else [SPECULATE_MS]:
            label = ("+spec" if spec else "") + (
                f"@{ms:g}" if spec and len(args.speculate_after_ms) > 1 else "") + (
                ("+warm" if warm else "-warm") if len(args.warm_prefill) > 1 else "") + (
                "-early" if spec and not early else "")
            grid[label] = Variant(speculate=spec, warm=warm, speculate_ms=ms, early_spec=early)
    return grid


def server_settings(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """(label suffix, `voxline serve` flags) of each server setting compared side by side:
    every --int8-prefill value with every --asr-decoder value ("": the server's default)."""
    out = []
    for prefill, decoder in itertools.product(args.int8_prefill, args.asr_decoder):
        flags = (["--llm-int8-prefill", prefill] if prefill else []) + (
            ["--asr-decoder", decoder] if decoder else [])
        out.append(("".join(f":{v}" for v in (prefill, decoder) if v), flags))
    return out


def detection_label(label: str, detection: str) -> str:
    """A variant's label with its turn detection (server VAD, the default, unmarked)."""
    return label + (":semantic" if detection == "semantic_vad" else "")


async def amain(args: argparse.Namespace) -> int:
    print("command: " + shlex.join([sys.executable, *sys.argv]))
    print(f"machine: {load_note()}. The CPUs are shared with other work, so numbers are "
          "noisy; the variants run interleaved, utterance by utterance, so compare them side by "
          "side.")
    voiced: dict[str, list[Clip]] = {}
    warms = []
    for voice in args.voices:
        warm, voiced[voice] = make_clips(args.utterances, voice)
        warms.append(warm)
    warm_clip = warms[0]  # the first voice warms up
    clips = [c for cs in voiced.values() for c in cs]
    lengths = [c.speech_s for c in clips]
    print(f"{len(clips)} utterances ({', '.join(args.voices)}), speech {min(lengths):.1f}-{max(lengths):.1f} s "
          f"each, {sum(c.pause_ms > 0 for c in clips)} of them pausing mid-sentence; fresh "
          f"stream per utterance; partial transcripts "
          f"{'off' if args.no_partials else 'on (engine default)'}; replies "
          f"{'run to the end' if args.full_replies else 'cancelled after their first audio chunk'}")

    variants: dict[str, EngineClient | WsServer] = {}
    detections: dict[str, str] = {}  # engine-client variants' turn detection
    traced = TraceRecords()
    if args.trace:
        trace_logger = logging.getLogger("voxline.trace")
        trace_logger.setLevel(logging.DEBUG)
        trace_logger.addHandler(traced)
    try:
        for mode in args.modes:
            for name, v in variant_grid(args).items():
                label = mode + (f":{name}" if args.variants else name)
                speculate = v.speculate_ms if v.speculate else 0
                t0 = time.perf_counter()
                if mode == "ws":
                    for detection in args.turn_detection:
                        for suffix, serve_args in server_settings(args):
                            named = detection_label(label, detection) + suffix
                            server = WsServer(named, speculate, args.threads, v.warm, detection,
                                              log_prefix=args.server_log,
                                              early_speculation=v.early_spec,
                                              serve_args=serve_args)
                            variants[named] = server
                            await server.start()
                            print(f"{named} ready in {time.perf_counter() - t0:.1f} s")
                    continue
                kwargs: dict[str, object] = {"speculate_after_ms": speculate,
                                             "warm_prefill": v.warm,
                                             "early_pause_transcript": v.early_pause,
                                             "early_speculation": v.early_spec,
                                             "speculate_speech": v.speech,
                                             "kept_logits": v.kept}
                if args.threads:
                    kwargs["threads"] = args.threads
                for detection in args.turn_detection:
                    named = detection_label(label, detection)
                    client: EngineClient = (
                        InProcessEngineClient(BENCH_CORE, kwargs) if mode == "inprocess"
                        else MultiprocessEngineClient(BENCH_CORE, kwargs, restart=False))
                    variants[named] = client
                    detections[named] = detection
                    await client.start()
                    print(f"{named} ready in {time.perf_counter() - t0:.1f} s")
        from voxline.config import load_settings
        from voxline.engines.factory import model_threads

        threads = model_threads(load_settings(threads=args.threads or None))
        print(f"engine threads: torch and onnxruntime ASR {threads} (VOXLINE_THREADS, else "
              "half the CPUs), VAD and TTS 1")

        async def turn(label: str, name: str, clip: Clip) -> TurnTiming:
            target = variants[label]
            if isinstance(target, WsServer):
                return await run_ws_turn(target, clip, args.full_replies)
            return await run_turn(target, label, name, clip, not args.no_partials,
                                  args.full_replies, detections[label])

        for label in variants:
            for w in range(args.warmup):
                t = await turn(label, f"warmup-{label}-{w}", warm_clip)
                print(f"warm-up {label}: {fmt(t.from_speech_end)} ms from end of speech "
                      f"({t.transcript!r})" + (f" ERRORS: {t.errors}" if t.errors else ""))
        print()
        print(f"  {'#':>2} {'variant':<34} {'speech':>6} | {'end':>5} {'vadst':>5} | {'VAD':>5} "
              f"{'clock':>5} {'ASR':>5} {'model':>5} {'LLM':>5} {'text':>5} {'TTS':>5} | "
              "transcript -> first spoken segment")
        print("     (ms; end = from end of speech audio, vadst = from speech_stopped; clock = VAD "
              "audio_end_ms - true speech end on the stream clock; model = ASR model time of "
              "the final transcript, so ASR - model = queueing; with speculation the reply may "
              "be ready before speech_stopped, so parts can be negative)")
        def row(label: str, voice: str) -> str:  # per voice when there are several
            return label if len(args.voices) == 1 else f"{label} {voice}"

        results: dict[str, list[TurnTiming]] = {
            row(label, voice): [] for voice in args.voices for label in variants}
        # voices alternate utterance by utterance too, so each sees the same load
        schedule = [(voice, c) for k in range(args.utterances)
                    for voice in args.voices if k < len(voiced[voice])
                    for c in [voiced[voice][k]]]
        for i, (voice, clip) in enumerate(schedule):
            order = list(variants) if i % 2 == 0 else list(reversed(variants))
            for label in order:
                t = await turn(label, f"bench-{label}-{i}", clip)
                t.mode = row(label, voice)
                results[row(label, voice)].append(t)
                print_turn(i, t, clip)
                if args.server_log and isinstance(variants[label], WsServer):
                    client_milestones(f"{args.server_log}{label}.client.log", i, t)
        summarize(results)
        markdown_table(results)
        if args.trace:
            print(trace_timeline(traced.lines))
            if args.trace_file:
                await asyncio.to_thread(Path(args.trace_file).write_text,
                                        "\n".join(traced.lines) + "\n")
        print(f"machine at end: {load_note()}")
    finally:
        for target in variants.values():
            await target.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(amain(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
