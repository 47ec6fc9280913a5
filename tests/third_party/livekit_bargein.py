"""Barge-in through LiveKit Agents' OpenAI realtime plugin, against a live voxline server.

Runs in the clients venv (scripts/clients_venv.sh), not the project's:

    livekit_bargein.py ws://127.0.0.1:PORT QUESTION.wav BARGE.wav [TIMEOUT_S]

The plugin is pointed at the server the documented way, `openai.realtime.RealtimeModel(
base_url=..., api_key=...)`, every other option the plugin's default (its session.update is
part of what this checks). No LiveKit room: the plugin's RealtimeSession is driven
directly, by a stand-in for the part of the agent layer (voice.AgentActivity) that a voice
agent exercises, making the same calls in the same order: instructions, a pre-filled chat
context and tools set at start; a text turn as `generate_reply(user_input=...)` does it (update_chat_ctx with the
user message, then generate_reply); on the server's speech_started `interrupt()`, again
while the response is still generating, then `truncate()` of the message it cut at what
the speaker had played. The speaker plays at real time. The session: a text turn, a
spoken question, a second utterance while the answer plays, and the answer to that.
Prints one JSON summary (see _common.WireLog.summary) on stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from _common import (
    CHUNK_MS,
    RATE,
    Mic,
    WireLog,
    audio_ms,
    load_pcm24k,
    parse_args,
)
from livekit import rtc
from livekit.agents import llm
from livekit.plugins import openai as lk_openai

INSTRUCTIONS = "You are a helpful voice assistant. Answer every question in three full sentences."
GREETING = "Say hello to me in one short sentence."
# An agent's pre-filled chat context (Agent(chat_ctx=...)): sent at start as items inserted
# at previous_item_id "root", then after each other
HISTORY = [("user", "Hi, my name is Ada."), ("assistant", "Nice to meet you, Ada.")]
PLAY_BEFORE_BARGE_S = 0.8  # how much of the answer the "user" hears before talking over it
MAX_WARNINGS = 20


class Speaker:
    """Plays queued (message id, PCM) at real time and counts what each message played."""

    def __init__(self) -> None:
        self._queue: deque[tuple[str, bytes]] = deque()
        self._task: asyncio.Task[None] | None = None
        self.played: Counter[str] = Counter()  # PCM bytes played, per message id
        self.playing = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def enqueue(self, message_id: str, pcm: bytes) -> None:
        size = RATE * 2 * CHUNK_MS // 1000
        for i in range(0, len(pcm), size):
            self._queue.append((message_id, pcm[i:i + size]))
        self.playing = True

    def interrupt(self) -> None:
        self._queue.clear()
        self.playing = False

    @property
    def played_bytes(self) -> int:
        return sum(self.played.values())

    async def _run(self) -> None:
        t = time.monotonic()
        while True:
            if not self._queue:
                self.playing = False
                await asyncio.sleep(CHUNK_MS / 1000)
                t = time.monotonic()
                continue
            message_id, chunk = self._queue.popleft()
            t += len(chunk) / 2 / RATE
            await asyncio.sleep(max(0.0, t - time.monotonic()))
            self.played[message_id] += len(chunk)


@dataclass
class Speech:
    """One generation as the agent plays it (AgentActivity's speech handle, reduced)."""

    generation: llm.GenerationCreatedEvent
    messages: dict[str, llm.MessageGeneration] = field(default_factory=dict)
    transcripts: dict[str, str] = field(default_factory=dict)
    interrupted: bool = False
    ended: bool = False  # the plugin closed the message stream (response.done)


class Agent:
    """What LiveKit's agent layer does with a RealtimeSession in a voice call, reduced to
    the calls a text turn, a spoken turn and a barge-in make."""

    def __init__(self, session: lk_openai.realtime.RealtimeSession, speaker: Speaker,
                 log: WireLog) -> None:
        self.session = session
        self.speaker = speaker
        self.log = log
        self.current: Speech | None = None
        self.interruptions = 0
        self.truncations: list[dict[str, Any]] = []
        self.user_transcripts: list[str] = []
        self._tasks: set[asyncio.Task[None]] = set()
        session.on("generation_created", self._on_generation_created)
        session.on("input_speech_started", self._on_input_speech_started)
        session.on("input_audio_transcription_completed", self._on_transcription)
        session.on("error", self._on_error)
        session.on("session_reconnected", lambda _ev: log.note("session reconnected"))

    async def start(self) -> None:
        """AgentActivity's start: instructions, the agent's chat context, no tools."""
        await self.session.update_instructions(INSTRUCTIONS)
        history = llm.ChatContext.empty()
        for role, text in HISTORY:
            history.add_message(role=role, content=text)
        await self.session.update_chat_ctx(history)
        await self.session.update_tools([])

    async def generate_reply(self, user_input: str) -> None:
        """AgentSession.generate_reply(user_input=...) on a realtime model."""
        chat_ctx = self.session.chat_ctx.copy()
        chat_ctx.add_message(role="user", content=user_input)
        try:
            await self.session.update_chat_ctx(chat_ctx)
        except llm.RealtimeError as exc:  # the agent layer logs it and replies anyway
            self.log.note(f"update_chat_ctx failed: {exc}")
        await self.session.generate_reply()

    def _on_generation_created(self, ev: llm.GenerationCreatedEvent) -> None:
        speech = Speech(ev)
        self.current = speech
        self._spawn(self._play(speech))

    def _on_input_speech_started(self, _ev: llm.InputSpeechStartedEvent) -> None:
        # AgentActivity.interrupt(): the playing speech stops, then the session's interrupt()
        speech = self.current
        cut = speech is not None and not speech.interrupted and (
            self.speaker.playing or not speech.ended)
        if cut:
            speech.interrupted = True
            self.interruptions += 1
            self.speaker.interrupt()
        self.session.interrupt()
        if cut:
            self._spawn(self._after_interruption(speech))

    def _on_transcription(self, ev: llm.InputTranscriptionCompleted) -> None:
        if ev.is_final:
            self.user_transcripts.append(ev.transcript)

    def _on_error(self, ev: llm.RealtimeModelError) -> None:
        body = getattr(ev.error, "body", None)
        self.log.note(f"RealtimeModelError ({ev.label}, recoverable={ev.recoverable}): "
                      f"{ev.error}; body={body!r}")

    async def _play(self, speech: Speech) -> None:
        readers = []
        async for message in speech.generation.message_stream:
            speech.messages[message.message_id] = message
            speech.transcripts[message.message_id] = ""
            readers.append(asyncio.create_task(self._read_message(speech, message)))
        speech.ended = True
        await asyncio.gather(*readers)

    async def _read_message(self, speech: Speech, message: llm.MessageGeneration) -> None:
        async def text() -> None:
            async for delta in message.text_stream:
                speech.transcripts[message.message_id] += delta

        text_task = asyncio.create_task(text())
        async for frame in message.audio_stream:
            if not speech.interrupted:  # after a cut the rest is drained, never played
                self.speaker.enqueue(message.message_id, frame.data.tobytes())
        await text_task

    async def _after_interruption(self, speech: Speech) -> None:
        """The generation task's cleanup: cancel again while the response still generates,
        then truncate each message that played in part at its playback position."""
        if not speech.ended:
            self.session.interrupt()
        for message in list(speech.messages.values()):
            played_ms = int(audio_ms(self.speaker.played[message.message_id]))
            if played_ms == 0:  # "skipped": the agent layer truncates only what it played
                continue
            modalities = await message.modalities
            self.truncations.append({"message_id": message.message_id,
                                     "audio_end_ms": played_ms, "modalities": list(modalities)})
            self.session.truncate(message_id=message.message_id, modalities=modalities,
                                  audio_end_ms=played_ms,
                                  audio_transcript=speech.transcripts[message.message_id])

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(self._report)

    def _report(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.log.note(f"agent task failed: {task.exception()!r}")

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class LogTap(logging.Handler):
    """LiveKit's own complaints: errors become notes (the test asserts none), warnings are
    kept for the summary."""

    def __init__(self, log: WireLog) -> None:
        super().__init__(logging.WARNING)
        self.log = log
        self.warnings: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = f"{record.name}: {record.getMessage()}"
        if record.exc_info and record.exc_info[1] is not None:
            text += f" ({record.exc_info[1]!r})"
        if record.levelno >= logging.ERROR:
            self.log.note(text)
        elif len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(text)


def record_wire(session: lk_openai.realtime.RealtimeSession, log: WireLog) -> None:
    """The plugin's raw-event hooks: every client event as sent, every server event as read."""
    session.on("openai_client_event_queued", lambda ev: log.on_sent(json.dumps(ev)))
    session.on("openai_server_event_received", lambda ev: log.on_received(json.dumps(ev)))


def items_added(log: WireLog) -> list[dict[str, Any]]:
    """Where the server put each item (conversation.item.added), in order."""
    return [{"item_id": e["item"].get("id"), "role": e["item"].get("role"),
             "previous_item_id": e.get("previous_item_id")}
            for e in log.received if e.get("type") == "conversation.item.added"]


def chat_ctx_summary(chat_ctx: llm.ChatContext) -> list[dict[str, Any]]:
    """The plugin's mirror of the server's conversation (what a reconnect would replay)."""
    return [{"id": item.id, "role": getattr(item, "role", item.type),
             "text": (item.text_content or "")[:80] if item.type == "message" else ""}
            for item in chat_ctx.items]


async def converse(log: WireLog, url: str, question: bytes, barge: bytes, timeout: float,
                   extra: dict[str, Any]) -> None:
    async with aiohttp.ClientSession() as http:
        model = lk_openai.realtime.RealtimeModel(base_url=f"{url}/v1", api_key="sk-voxline-test",
                                                 http_session=http)
        session = model.session()
        record_wire(session, log)
        speaker = Speaker()
        agent = Agent(session, speaker, log)

        async def push(pcm: bytes) -> None:
            session.push_audio(rtc.AudioFrame(data=pcm, sample_rate=RATE, num_channels=1,
                                              samples_per_channel=len(pcm) // 2))

        mic = Mic(push)
        speaker.start()
        try:
            await log.wait_for("session.updated", lambda: any(
                e.get("type") == "session.updated" for e in log.received), 30)
            await agent.start()
            mic.start()

            log.mark("text")
            await agent.generate_reply(GREETING)
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
            extra["interruptions"] = agent.interruptions
            extra["truncate_calls"] = agent.truncations
            extra["user_transcripts"] = agent.user_transcripts
            extra["items_added"] = items_added(log)
            extra["chat_ctx"] = chat_ctx_summary(session.chat_ctx)
            await mic.stop()
            await speaker.stop()
            await agent.stop()
            await session.aclose()
            await model.aclose()


async def main() -> int:
    url, question_wav, barge_wav, timeout = parse_args(sys.argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    log = WireLog("livekit")
    tap = LogTap(log)
    logging.getLogger("livekit").addHandler(tap)
    extra: dict[str, Any] = {}
    try:
        await asyncio.wait_for(converse(log, url, load_pcm24k(question_wav),
                                        load_pcm24k(barge_wav), timeout, extra), timeout * 3)
    except Exception as exc:  # report, don't crash: the summary is the result
        log.failure = f"{type(exc).__name__}: {exc}"
    extra["livekit_warnings"] = tap.warnings
    print(json.dumps(log.summary() | extra), flush=True)
    return 0 if log.failure is None else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
