"""Voice registration, the one path from the edge to the engine for a named voice: one
short-lived stream per registration, always closed, its outcome as a value the voices API
maps onto its errors (the engine's own error, or a stream closed before the answer)."""

from __future__ import annotations

import pytest

from voxline.engines import protocol as p
from voxline.errors import EngineDeadError
from voxline.realtime.session_host import SessionHost
from voxline.sessions.voices import VoiceNotRegistered, register_voice

REFERENCE = p.VoiceReference(b"\0\0\0\0", 24_000, None, "anna")


class FakeStream:
    def __init__(self, stream_id: str, answer: type) -> None:
        self.stream_id = stream_id
        self.answer = answer
        self.sent: list[object] = []
        self.closed = False

    def send(self, message: object) -> None:
        self.sent.append(message)

    async def next(self) -> object:
        if self.answer is p.VoiceRegistered:
            return p.VoiceRegistered(self.stream_id, "anna")
        if self.answer is p.StreamError:
            return p.StreamError(self.stream_id, "cloning needs a Base checkpoint",
                                 p.ErrorCode.INVALID_VALUE)
        return p.StreamClosed(self.stream_id)

    async def aclose(self) -> None:
        self.closed = True


class FakeEngine:
    ready = True

    def __init__(self, answer: type) -> None:
        self.answer = answer
        self.streams: list[FakeStream] = []

    async def open_stream(self, stream_id: str, config: p.StreamConfig) -> FakeStream:
        if self.answer is EngineDeadError:
            raise EngineDeadError("the engine process died", stream_id)
        self.streams.append(FakeStream(stream_id, self.answer))
        return self.streams[-1]


async def test_a_registered_voice_is_sent_once_and_its_stream_closed():
    engine = FakeEngine(p.VoiceRegistered)
    await SessionHost(engine).register_voice(REFERENCE)  # type: ignore[arg-type]
    [stream] = engine.streams
    assert stream.sent == [p.RegisterVoice(stream.stream_id, REFERENCE)] and stream.closed
    assert stream.stream_id.startswith("voice-")


async def test_the_engines_refusal_comes_back_as_its_error():
    engine = FakeEngine(p.StreamError)
    with pytest.raises(VoiceNotRegistered, match="Base checkpoint") as failed:
        await register_voice(engine, REFERENCE)  # type: ignore[arg-type]
    assert failed.value.error is not None and failed.value.error.code == p.ErrorCode.INVALID_VALUE
    assert engine.streams[0].closed


async def test_a_stream_closed_before_the_answer_is_not_a_registration():
    engine = FakeEngine(p.StreamClosed)
    with pytest.raises(VoiceNotRegistered, match="closed the stream") as failed:
        await register_voice(engine, REFERENCE)  # type: ignore[arg-type]
    assert failed.value.error is None and engine.streams[0].closed


async def test_an_engine_that_is_down_raises_its_engine_error():
    with pytest.raises(EngineDeadError):
        await register_voice(FakeEngine(EngineDeadError), REFERENCE)  # type: ignore[arg-type]
