"""A phone bot on voxline's embedded SDK, answering a simulated call.

The caller's side comes from a WAV file (any rate): it is turned into 8 kHz μ-law and
fed to the bot in 20 ms frames at real time, as a phone line would, followed by silence.
The bot's μ-law reply is "played" as it arrives. The call recording (caller left, bot
right, time-aligned, 8 kHz) is written to a WAV file.

    .venv/bin/voxline say "What is the capital of France?" --output question.wav
    .venv/bin/python examples/phone_bot.py question.wav call.wav
    .venv/bin/python examples/phone_bot.py question.wav call.wav --server http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio
import time
import wave

import numpy as np
import soxr

import voxline
from voxline.codecs.g711 import float_to_ulaw, ulaw_to_float

RATE = 8000
FRAME = 160  # 20 ms of μ-law


def read_caller(path: str) -> bytes:
    with wave.open(path, "rb") as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        pcm = pcm.reshape(-1, w.getnchannels()).mean(axis=1)
        audio = soxr.resample(pcm.astype(np.float32) / 32768, w.getframerate(), RATE)
    return float_to_ulaw(audio.astype(np.float32))


class Recording:
    """Two tracks on one clock: frames land where (when) they were heard."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.tracks: list[list[tuple[int, bytes]]] = [[], []]
        self._bot_end = 0

    def caller(self, at: float, frame: bytes) -> None:
        self.tracks[0].append((int(at * RATE), frame))

    def bot(self, frame: bytes) -> None:
        # played from arrival, or after what is still playing
        start = max(self._bot_end, int((time.monotonic() - self.t0) * RATE))
        self.tracks[1].append((start, frame))
        self._bot_end = start + len(frame)

    def write(self, path: str) -> None:
        end = max((s + len(f) for track in self.tracks for s, f in track), default=0)
        stereo = np.zeros((end, 2), np.float32)
        for channel, track in enumerate(self.tracks):
            for start, frame in track:
                stereo[start:start + len(frame), channel] = ulaw_to_float(frame)
        with wave.open(path, "wb") as w:
            w.setnchannels(2)
            w.setsampwidth(2)
            w.setframerate(RATE)
            w.writeframes((np.clip(stereo, -1, 1) * 32767).astype("<i2").tobytes())


async def answer_call(engine: voxline.Engine | voxline.RemoteEngine, caller: bytes,
                      recording: Recording, hangup_after: float = 30.0) -> None:
    async with engine.session(
            instructions="You are a helpful voice assistant on a phone call. Answer in "
                         "English, in at most eight words.",
            input_format="g711_ulaw", output_format="g711_ulaw", transcription={}) as call:
        recording.t0 = time.monotonic()
        silence = bytes([0xFF]) * FRAME  # μ-law zero

        async def line() -> None:
            """The caller's microphone: the WAV, then silence until hang-up."""
            for n in range(int(hangup_after * 1000 / 20)):
                frame = caller[n * FRAME:(n + 1) * FRAME] if n * FRAME < len(caller) else silence
                frame = frame.ljust(FRAME, b"\xff")
                recording.caller(n * 0.02, frame)
                await call.send_audio(frame)
                await asyncio.sleep(max(0.0, recording.t0 + (n + 1) * 0.02 - time.monotonic()))

        mic = asyncio.create_task(line())
        try:
            async for event in call:
                if isinstance(event, voxline.events.AudioDelta):
                    recording.bot(event.delta)
                elif isinstance(event, voxline.events.InputTranscriptionCompleted):
                    print(f"caller: {event.transcript}")
                elif isinstance(event, voxline.events.AudioTranscriptDone):
                    print(f"bot:    {event.transcript}")
                elif isinstance(event, voxline.events.OutputAudioBufferStopped):
                    break  # the answer has played out: hang up
                elif isinstance(event, voxline.events.ErrorEvent):
                    print(f"error:  {event.error.message}")
        finally:
            mic.cancel()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("caller_wav")
    parser.add_argument("recording_wav")
    parser.add_argument("--server", help="use a voxline server (http://host:port) instead")
    args = parser.parse_args()
    recording = Recording()
    engine = voxline.connect(args.server) if args.server else voxline.Engine()
    async with engine:
        await answer_call(engine, read_caller(args.caller_wav), recording)
    recording.write(args.recording_wav)
    print(f"wrote {args.recording_wav}")


if __name__ == "__main__":
    asyncio.run(main())
