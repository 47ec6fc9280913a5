"""Barge-in through pipecat's OpenAIRealtimeLLMService, against a live voxline server.

Runs in the clients venv (scripts/clients_venv.sh), not the project's:

    pipecat_bargein.py ws://127.0.0.1:PORT QUESTION.wav BARGE.wav [TIMEOUT_S]

The pipeline is the one pipecat documents for realtime services (input transport, user
aggregator, LLM service, output transport, assistant aggregator), with two stand-ins for
real devices: a microphone transport fed from the WAV files at real time and a speaker
transport that "plays" at real time, so the service's bot-speaking state and its
truncation arithmetic (wall clock vs. audio received) behave as in a call. Turn detection
is the server's VAD, pipecat's default. The session: a text turn (LLMRunFrame on a context
holding a user message), a spoken question, a second utterance while the answer plays,
and the answer to that. Prints one JSON summary (see _common.WireLog.summary) on stdout.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import pipecat.services.openai.realtime.llm as realtime_llm
from _common import Mic, RecordingSocket, WireLog, audio_ms, load_pcm24k, parse_args
from loguru import logger
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    InterruptionFrame,
    LLMRunFrame,
    OutputAudioRawFrame,
    StartFrame,
    TTSAudioRawFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.transports.base_input import BaseInputTransport
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import TransportParams
from pipecat.workers.runner import WorkerRunner

RATE = 24000
INSTRUCTIONS = "You are a helpful voice assistant. Answer every question in three full sentences."
GREETING = "Say hello to me in one short sentence."
PLAY_BEFORE_BARGE_S = 0.8  # how much of the answer the "user" hears before talking over it


class MicTransport(BaseInputTransport):
    """Input transport whose audio comes from `push_pcm` (driven by a _common.Mic)."""

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def push_pcm(self, pcm: bytes) -> None:
        await self.push_audio_frame(InputAudioRawFrame(audio=pcm, sample_rate=RATE, num_channels=1))


class SpeakerTransport(BaseOutputTransport):
    """Output transport that takes audio as fast as a sound card plays it."""

    def __init__(self, params: TransportParams) -> None:
        super().__init__(params)
        self._clock = 0.0
        self.played_bytes = 0

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        now = time.monotonic()
        self._clock = max(self._clock, now) + len(frame.audio) / 2 / frame.sample_rate
        await asyncio.sleep(max(0.0, self._clock - now - 0.04))  # keep ~40 ms queued
        self.played_bytes += len(frame.audio)
        return True


class Tap(FrameProcessor):
    """Pass-through that notes the frames the driver waits on or reports."""

    def __init__(self, log: WireLog) -> None:
        super().__init__()
        self.log = log
        self.bot_speaking = False
        self.interruptions = 0
        self.tts_audio_frames = 0

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, BotStartedSpeakingFrame):
            self.bot_speaking = True
        elif isinstance(frame, BotStoppedSpeakingFrame):
            self.bot_speaking = False
        elif isinstance(frame, InterruptionFrame):
            self.interruptions += 1
        elif isinstance(frame, TTSAudioRawFrame):
            self.tts_audio_frames += 1
        elif isinstance(frame, ErrorFrame):
            self.log.note(f"ErrorFrame: {frame.error}")
        await self.push_frame(frame, direction)


async def converse(log: WireLog, url: str, question: bytes, barge: bytes, timeout: float,
                   extra: dict[str, Any]) -> None:
    # Record the service's own socket: patch the connect it imported (module attribute).
    real_connect = realtime_llm.websocket_connect

    async def recording_connect(*args: Any, **kwargs: Any) -> Any:
        return RecordingSocket(await real_connect(*args, **kwargs), log)

    realtime_llm.websocket_connect = recording_connect  # type: ignore[assignment]

    llm = OpenAIRealtimeLLMService(
        api_key="sk-voxline-test",
        base_url=f"{url}/v1/realtime",  # the service appends ?model=<settings.model>
        settings=OpenAIRealtimeLLMService.Settings(model="voxline",
                                                   system_instruction=INSTRUCTIONS),
    )
    mic_transport = MicTransport(TransportParams(audio_in_enabled=True, audio_in_sample_rate=RATE))
    speaker = SpeakerTransport(TransportParams(audio_out_enabled=True,
                                               audio_out_sample_rate=RATE))
    context = LLMContext(messages=[{"role": "user", "content": GREETING}])
    aggregators = LLMContextAggregatorPair(context)
    tap = Tap(log)
    pipeline = Pipeline([mic_transport, aggregators.user(), llm, speaker, tap,
                         aggregators.assistant()])
    worker = PipelineWorker(pipeline, params=PipelineParams(
        audio_in_sample_rate=RATE, audio_out_sample_rate=RATE), idle_timeout_secs=None)

    @worker.event_handler("on_pipeline_error")
    async def on_error(_worker: Any, frame: ErrorFrame) -> None:
        log.note(f"pipeline error: {frame.error}")
        # pipecat stops reading the socket after a server error event: nothing more comes.
        log.abort = log.abort or f"pipecat pipeline error: {frame.error}"

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run_task = asyncio.create_task(runner.run())
    mic = Mic(mic_transport.push_pcm)
    try:
        await log.wait_for("session.updated", lambda: any(
            e.get("type") == "session.updated" for e in log.received), 30)
        mic.start()

        log.mark("text")
        await worker.queue_frames([LLMRunFrame()])
        await log.wait_for("the text turn's response.done", lambda: log.done_in("text"), timeout)
        await log.wait_for("the greeting to finish playing", lambda: not tap.bot_speaking, 30)

        log.mark("question")
        played_before = speaker.played_bytes
        await mic.say(question)
        await log.wait_for("reply audio to the question", lambda: log.audio_in("question"),
                           timeout)
        await log.wait_for("the speaker to start playing", lambda: tap.bot_speaking, 10)
        await asyncio.sleep(PLAY_BEFORE_BARGE_S)
        extra["barge_in_while"] = {
            "speaker_playing": tap.bot_speaking,
            "response_in_progress": any(r["status"] is None
                                        for r in log.phase_responses("question")),
            "answer_played_ms": round(audio_ms(speaker.played_bytes - played_before)),
        }

        log.mark("barge")
        await mic.say(barge)
        await log.wait_for("a completed response to the barge-in", lambda: log.done_in(
            "barge", "completed"), timeout)
        await log.wait_for("the follow-up to finish playing", lambda: not tap.bot_speaking, 30)
        await asyncio.sleep(0.5)  # late events (e.g. an error answering a truncate)
    finally:
        extra["interruption_frames"] = tap.interruptions
        extra["tts_audio_frames"] = tap.tts_audio_frames
        await mic.stop()
        await worker.cancel()
        try:
            await asyncio.wait_for(run_task, 15)
        except (TimeoutError, asyncio.CancelledError):
            run_task.cancel()


async def main() -> int:
    url, question_wav, barge_wav, timeout = parse_args(sys.argv)
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    log = WireLog("pipecat")
    extra: dict[str, Any] = {}
    try:
        await asyncio.wait_for(converse(log, url, load_pcm24k(question_wav),
                                        load_pcm24k(barge_wav), timeout, extra), timeout * 3)
    except Exception as exc:  # report, don't crash: the summary is the result
        log.failure = f"{type(exc).__name__}: {exc}"
    summary = log.summary() | extra
    print(json.dumps(summary), flush=True)
    return 0 if log.failure is None else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
