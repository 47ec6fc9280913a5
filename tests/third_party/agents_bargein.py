"""Barge-in through the OpenAI Agents SDK's RealtimeRunner, against a live voxline server.

Runs in the clients venv (scripts/clients_venv.sh), not the project's:

    agents_bargein.py ws://127.0.0.1:PORT QUESTION.wav BARGE.wav [TIMEOUT_S]

The SDK is pointed at the server the documented way: `model_config={"url": ...,
"api_key": ...}`; every session setting is the SDK's default (its session.update is part of
what this checks). Audio out goes to a simulated speaker that plays at real time and
reports progress to a RealtimePlaybackTracker, as the SDK asks of apps with their own
playback, so its truncate carries what was really heard; on `audio_interrupted` the
speaker drops what is still queued. The session: a text turn (send_message), a spoken
question, a second utterance while the answer plays, and the answer to that. Prints one
JSON summary (see _common.WireLog.summary) on stdout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections import deque
from typing import Any

from _common import (
    CHUNK_MS,
    RATE,
    Mic,
    RecordingSocket,
    WireLog,
    audio_ms,
    load_pcm24k,
    parse_args,
)
from agents.realtime import RealtimeAgent, RealtimePlaybackTracker, RealtimeRunner
from agents.realtime.openai_realtime import OpenAIRealtimeWebSocketModel

INSTRUCTIONS = "You are a helpful voice assistant. Answer every question in three full sentences."
GREETING = "Say hello to me in one short sentence."
PLAY_BEFORE_BARGE_S = 0.8  # how much of the answer the "user" hears before talking over it


class RecordingModel(OpenAIRealtimeWebSocketModel):
    """The SDK's own WebSocket model, its connection wrapped to log both directions."""

    def __init__(self, log: WireLog) -> None:
        super().__init__()
        self._wire_log = log

    async def _create_websocket_connection(self, url: str, headers: dict[str, str],
                                           transport_config: Any = None) -> Any:
        ws = await super()._create_websocket_connection(url, headers, transport_config)
        return RecordingSocket(ws, self._wire_log)


class Speaker:
    """Plays queued (item, content index, PCM) at real time; tells the tracker what played."""

    def __init__(self, tracker: RealtimePlaybackTracker) -> None:
        self._tracker = tracker
        self._queue: deque[tuple[str, int, bytes]] = deque()
        self._task: asyncio.Task[None] | None = None
        self.played_bytes = 0
        self.playing = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def enqueue(self, item_id: str, content_index: int, pcm: bytes) -> None:
        size = RATE * 2 * CHUNK_MS // 1000
        for i in range(0, len(pcm), size):
            self._queue.append((item_id, content_index, pcm[i:i + size]))
        self.playing = True

    def interrupt(self) -> None:
        self._queue.clear()
        self.playing = False

    async def _run(self) -> None:
        t = time.monotonic()
        while True:
            if not self._queue:
                self.playing = False
                await asyncio.sleep(CHUNK_MS / 1000)
                t = time.monotonic()
                continue
            item_id, index, chunk = self._queue.popleft()
            t += len(chunk) / 2 / RATE
            await asyncio.sleep(max(0.0, t - time.monotonic()))
            self._tracker.on_play_bytes(item_id, index, chunk)
            self.played_bytes += len(chunk)


async def converse(log: WireLog, url: str, question: bytes, barge: bytes, timeout: float,
                   extra: dict[str, Any]) -> None:
    agent = RealtimeAgent(name="Assistant", instructions=INSTRUCTIONS)
    runner = RealtimeRunner(agent, model=RecordingModel(log))
    tracker = RealtimePlaybackTracker()
    speaker = Speaker(tracker)
    interrupted = 0
    session = await runner.run(model_config={
        "url": f"{url}/v1/realtime?model=voxline",
        "api_key": "sk-voxline-test",
        "playback_tracker": tracker,
    })

    async def consume() -> None:
        nonlocal interrupted
        async for event in session:
            if event.type == "audio":
                speaker.enqueue(event.item_id, event.content_index, event.audio.data)
            elif event.type == "audio_interrupted":
                interrupted += 1
                speaker.interrupt()
            elif event.type == "error":
                log.note(f"RealtimeError: {event.error}")
            elif event.type == "raw_model_event" and event.data.type in ("error", "exception"):
                detail = getattr(event.data, "exception", None) or getattr(event.data, "error", "")
                log.note(f"model {event.data.type}: {detail!r}")

    mic = Mic(session.send_audio)
    async with session:
        consumer = asyncio.create_task(consume())
        speaker.start()
        try:
            await log.wait_for("session.updated", lambda: any(
                e.get("type") == "session.updated" for e in log.received), 30)
            mic.start()

            log.mark("text")
            await session.send_message(GREETING)
            await log.wait_for("the text turn's response.done", lambda: log.done_in("text"),
                               timeout)
            await log.wait_for("the greeting to finish playing", lambda: not speaker.playing, 30)

            log.mark("question")
            played_before = speaker.played_bytes
            await mic.say(question)
            await log.wait_for("reply audio to the question", lambda: log.audio_in("question"),
                               timeout)
            await log.wait_for("the speaker to start playing", lambda: speaker.playing, 10)
            await asyncio.sleep(PLAY_BEFORE_BARGE_S)
            extra["barge_in_while"] = {
                "speaker_playing": speaker.playing,
                "response_in_progress": any(r["status"] is None
                                            for r in log.phase_responses("question")),
                "answer_played_ms": round(audio_ms(speaker.played_bytes - played_before)),
            }

            log.mark("barge")
            await mic.say(barge)
            await log.wait_for("a completed response to the barge-in", lambda: log.done_in(
                "barge", "completed"), timeout)
            await log.wait_for("the follow-up to finish playing", lambda: not speaker.playing,
                               30)
            await asyncio.sleep(0.5)  # late events (e.g. an error answering a truncate)
        finally:
            extra["audio_interrupted_events"] = interrupted
            await mic.stop()
            await speaker.stop()
            consumer.cancel()
            try:
                await consumer
            except (asyncio.CancelledError, Exception):
                pass


async def main() -> int:
    url, question_wav, barge_wav, timeout = parse_args(sys.argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    log = WireLog("openai-agents")
    extra: dict[str, Any] = {}
    try:
        await asyncio.wait_for(converse(log, url, load_pcm24k(question_wav),
                                        load_pcm24k(barge_wav), timeout, extra), timeout * 3)
    except Exception as exc:  # report, don't crash: the summary is the result
        log.failure = f"{type(exc).__name__}: {exc}"
    print(json.dumps(log.summary() | extra), flush=True)
    return 0 if log.failure is None else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
