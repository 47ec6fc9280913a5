"""Implementations of the `voxline` subcommands (argument parsing lives in cli.py)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from voxline.codecs.resample import resample
from voxline.codecs.wav import read_wav, write_wav
from voxline.engines import end_of_turn
from voxline.engines import protocol as p
from voxline.errors import VoxlineError

logger = logging.getLogger("voxline")

FEED_MS = 20  # converse feeds its input in wire-sized chunks
TRAILING_SILENCE_S = 1.0  # so server VAD sees the end of the question
# converse's default: semantic VAD (the end-of-turn model with the transcript rules); the
# /v1/realtime protocol's own default stays OpenAI's server_vad 500 ms
CONVERSE_TURN_DETECTION = {"semantic_vad": p.TurnParams(eagerness="auto"),
                           "server_vad": p.TurnParams()}


def trailing_silence_s(td: p.TurnParams) -> float:
    """Silence fed after the question: past the longest pause that can end its turn."""
    if td.eagerness is None:
        return TRAILING_SILENCE_S
    return end_of_turn.SILENCE_MS[td.eagerness][end_of_turn.Ending.INCOMPLETE] / 1000 + 0.5


@dataclass
class TurnResult:
    transcript: str = ""
    reply: str = ""
    audio: list[np.ndarray] = field(default_factory=list)
    sample_rate: int = 0
    asr_ms: float = 0.0
    llm_ms: float = 0.0
    tts_ms: float = 0.0
    # from the end of the speech itself (the VAD's audio_end_ms, on the feed's clock):
    # only when the audio was fed in real time, as a speaker says it
    speech_end_to_first_audio_ms: float | None = None
    # from speech_stopped, which comes after the VAD's silence window: the engine's part
    stopped_to_first_audio_ms: float | None = None
    status: str = ""


async def converse_turn(client: object, audio16k: np.ndarray, *, stream_id: str = "converse",
                        seed: int | None = None, realtime: bool = False,
                        turn_detection: p.TurnParams | None = None) -> TurnResult:
    """One spoken turn through an engine client: feed audio, answer the detected question
    (turns detected by `turn_detection`, server VAD's defaults when None).

    Latency to the first reply audio chunk is measured from `SpeechStopped` (which comes
    after the VAD's silence window) and, fed in `realtime`, from the end of the speech
    itself: the moment the sample at its `audio_end_ms` was fed.
    """
    from voxline.engines.client import EngineClient

    assert isinstance(client, EngineClient)
    result = TurnResult()
    td = turn_detection or p.TurnParams()
    stream = await client.open_stream(stream_id, p.StreamConfig(turn_detection=td,
                                                                transcribe_partials=False))
    tail = np.zeros(int(trailing_silence_s(td) * p.INPUT_RATE), np.float32)
    audio = np.concatenate([audio16k, tail])
    step = p.INPUT_RATE * FEED_MS // 1000

    fed: list[tuple[float, float]] = []  # (ms of audio fed, when), per chunk

    async def feed() -> None:
        t0 = time.perf_counter()
        for n, i in enumerate(range(0, len(audio), step)):
            # a chunk goes once its audio has been spoken, as a live microphone sends it
            wait = t0 + (n + 1) * FEED_MS / 1000 - time.perf_counter() if realtime else 0
            await asyncio.sleep(max(0.0, wait))
            stream.send(p.AppendAudio(stream_id, audio[i:i + step].astype("<f4").tobytes()))
            fed.append((min(i + step, len(audio)) * 1000 / p.INPUT_RATE, time.perf_counter()))

    def fed_at(ms: float) -> float | None:
        """When the sample at `ms` of the input was fed (None: not yet)."""
        chunk = next(((end, at) for end, at in fed if end >= ms), None)
        return None if chunk is None else chunk[1] - (chunk[0] - ms) / 1000

    feeder = asyncio.create_task(feed())
    stopped_at: float | None = None
    speech_end_at: float | None = None
    try:
        async for out in stream:
            match out:
                case p.VoiceStopped():
                    stopped_at = time.perf_counter()
                    speech_end_at = fed_at(out.audio_end_ms) if realtime else None
                case p.TranscriptFinal(text=text) if text and not result.transcript:
                    result.transcript, result.asr_ms = text, out.asr_ms
                    stream.send(p.CreateResponse(stream_id, "resp_1", "item_reply",
                                                 p.ResponseConfig(seed=seed)))
                case p.AudioChunk():
                    if result.stopped_to_first_audio_ms is None and stopped_at is not None:
                        now = time.perf_counter()
                        result.stopped_to_first_audio_ms = (now - stopped_at) * 1000
                        if speech_end_at is not None:
                            result.speech_end_to_first_audio_ms = (now - speech_end_at) * 1000
                    result.audio.append(np.frombuffer(out.audio, dtype="<f4"))
                    result.sample_rate = out.sample_rate
                case p.ResponseFinished():
                    result.reply, result.status = out.text, out.status.name.lower()
                    result.llm_ms, result.tts_ms = out.llm_ms, out.tts_ms
                    break
                case p.StreamError():
                    raise VoxlineError(f"engine error ({out.code}): {out.message}")
    finally:
        feeder.cancel()
        await stream.aclose()
    if not result.transcript:
        raise VoxlineError("no speech was recognised in the input")
    return result


async def _converse(args: argparse.Namespace) -> int:
    from voxline.engines.client import InProcessEngineClient
    from voxline.engines.launch import DEFAULT_CORE

    audio, rate = read_wav(args.input)
    audio16k = resample(audio, rate, p.INPUT_RATE)
    client = InProcessEngineClient(DEFAULT_CORE)
    t0 = time.perf_counter()
    await client.start()
    logger.info("engine ready in %.2f s", time.perf_counter() - t0)
    try:
        # in real time, as a speaker says it: the VAD's silence window is then waited out
        # as a listener waits for it, and the end of speech is on the wall clock
        result = await converse_turn(client, audio16k, seed=args.seed, realtime=True,
                                     turn_detection=CONVERSE_TURN_DETECTION[args.turn_detection])
    finally:
        await client.close()
    reply = np.concatenate(result.audio) if result.audio else np.zeros(0, np.float32)
    out_rate = 24000
    write_wav(args.output, resample(reply, result.sample_rate or out_rate, out_rate), out_rate)
    print(f"you said:  {result.transcript}")
    print(f"reply:     {result.reply}")
    print(f"timing:    ASR {result.asr_ms:.0f} ms | LLM {result.llm_ms:.0f} ms | "
          f"TTS {result.tts_ms:.0f} ms")
    print(f"latency:   {latency_line(result)}")
    print(f"wrote {args.output} ({len(reply) / max(result.sample_rate, 1):.1f} s, 24 kHz)")
    return 0


def latency_line(result: TurnResult) -> str:
    """What `converse` prints, each number named by where it counts from."""
    stopped = result.stopped_to_first_audio_ms
    if stopped is None:
        return "no reply audio after the end of speech"
    after = f"speech_stopped (after the VAD's silence window) -> first reply audio {stopped:.0f} ms"
    if result.speech_end_to_first_audio_ms is None:
        return after
    return (f"end of speech -> first reply audio {result.speech_end_to_first_audio_ms:.0f} ms "
            f"(of it, {after})")


def _say(args: argparse.Namespace) -> int:
    from voxline.config import load_settings
    from voxline.engines.factory import load_tts
    from voxline.engines.speech_model import SpeechJob

    stage = load_tts(load_settings(tts=args.tts))
    stage.start(SpeechJob(1, args.text, seed=args.seed))
    parts: list[np.ndarray] = []
    while stage.has_work():
        parts.extend(out.audio for out in stage.step())
    audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    if not len(audio):
        raise VoxlineError(f"nothing to say in {args.text!r}")
    write_wav(args.output, resample(audio, stage.sample_rate, args.rate), args.rate)
    note = ""
    if getattr(stage, "random_weights", False):
        note = " -- random-weight test checkpoint: noise, not speech"
    print(f"wrote {args.output} ({len(audio) / stage.sample_rate:.1f} s, {args.rate} Hz){note}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from voxline.realtime.server import serve

    return serve(args)


def _bench(args: argparse.Namespace) -> int:
    from voxline.bench import main

    return main(args)


def run(args: argparse.Namespace) -> int:
    handlers = {"bench": _bench, "converse": lambda a: asyncio.run(_converse(a)), "say": _say,
                "serve": _serve}
    try:
        return handlers[args.command](args)
    except VoxlineError as exc:
        print(f"voxline {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except FileNotFoundError as exc:
        print(f"voxline {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def sample_question(path: Path, text: str = "What is the capital of France?") -> Path:
    """Make a spoken sample question with the shipped voice (for `make run` demos)."""
    from voxline.engines.models.piper_tts import PiperTTS

    tts = PiperTTS.load()
    write_wav(path, tts.synthesize_all(text), tts.sample_rate)
    return path
