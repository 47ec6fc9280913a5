"""The embedded SDK: one bot script run in-process (``voxline.Engine``) and against a
running server (``voxline.connect``) must see the same typed session events. Fast over
the stand-in models; slow with the real ones (a spoken question answered in speech)."""

from __future__ import annotations

import numpy as np
import pytest
import soxr
from conftest import TIME_FACTOR
from fake_server import fake_server
from fakes import tone

import voxline
from voxline.codecs.g711 import float_to_ulaw, ulaw_to_float
from voxline.errors import ProtocolError
from voxline.realtime.openai.dialect import Dialect
from voxline.realtime.openai.peer import parse_server_event, render_command
from voxline.realtime.openai.server_events import render
from voxline.sessions import commands as cmd
from voxline.sessions import events as ev

FAKES = {"core": "fakes:make_fake_core", "core_options": {"stop_after": 40}}
T = 120 * TIME_FACTOR


async def bot_script(engine, question: np.ndarray, instructions: str | None = None) -> dict:
    """A phone bot's moves: a spoken turn, a text turn, cancel, truncate. `question` is
    8 kHz float audio with trailing silence."""
    out: dict = {}
    async with engine.session(instructions=instructions, input_format="g711_ulaw",
                              output_format="g711_ulaw", transcription={}) as call:
        ulaw = float_to_ulaw(question)
        for i in range(0, len(ulaw), 160):
            await call.send_audio(ulaw[i:i + 160])
        heard = await call.wait_for(ev.InputTranscriptionCompleted, T)
        audio = bytearray()
        async for event in call:
            if isinstance(event, ev.AudioDelta):
                audio += event.delta
            if isinstance(event, ev.AudioTranscriptDone):
                out["spoken_transcript"] = event.transcript
            if isinstance(event, ev.ResponseDone):
                out["spoken_status"] = event.response.status
                break
        out["question"] = heard.transcript
        out["audio"] = ulaw_to_float(bytes(audio))

        await call.send_text("Tell me a long story about a dragon.")
        await call.respond()
        first = await call.wait_for(ev.AudioDelta, T)
        await call.cancel()
        done = await call.wait_for(ev.ResponseDone, T)
        out["cancel_status"] = (done.response.status, done.response.status_details.reason)
        await call.truncate(first.item_id, 20)
        cut = await call.wait_for(ev.ItemTruncated, T)
        out["truncated"] = (cut.item_id == first.item_id, cut.audio_end_ms)

        await call.update(output_modalities=["text"])
        await call.send_text("What is the capital of France?")
        await call.respond()
        text = ""
        async for event in call:
            assert not isinstance(event, ev.AudioDelta)
            if isinstance(event, ev.TextDelta):
                text += event.delta
            if isinstance(event, ev.ResponseDone):
                out["text_status"] = event.response.status
                break
        out["text"] = text
    return out


def speech_tone() -> np.ndarray:
    return np.concatenate([np.zeros(1600, np.float32), tone(0.6, 8000),
                           np.zeros(8000, np.float32)])


def check_fake(result: dict) -> None:
    assert result["question"] == "hello there friend"
    assert result["spoken_status"] == "completed" and len(result["audio"]) > 8000 * 0.2
    assert result["cancel_status"] == ("cancelled", "client_cancelled")
    assert result["truncated"] == (True, 20)
    assert result["text_status"] == "completed" and result["text"]


async def test_in_process_session_over_stand_in_models() -> None:
    async with voxline.Engine(**FAKES) as engine:
        check_fake(await bot_script(engine, speech_tone()))


async def test_same_script_through_a_server() -> None:
    with fake_server() as (base, _):
        async with voxline.connect(base) as engine:
            check_fake(await bot_script(engine, speech_tone()))


async def test_bad_options_and_tools_are_refused_at_the_call_site() -> None:
    async with voxline.Engine(**FAKES) as engine:
        with pytest.raises(voxline.ToolsNotAvailable, match="not available with the embedded"):
            engine.session(tools=[lambda city: "sunny"])
        with pytest.raises(ProtocolError, match="unknown audio format 'mp3'"):
            engine.session(input_format="mp3")
        with pytest.raises(ProtocolError, match="session.temperature"):
            engine.session(temperature=9.0)
        with pytest.raises(voxline.SessionError, match="truncation"):
            # valid on the wire, refused by the session: raised by `async with`
            from voxline.sdk.engine import LocalTransport
            from voxline.sdk.session import Session
            async with Session(LocalTransport(engine.client),
                               {"truncation": "disabled"}):
                pass


def test_wire_peer_round_trips_commands_and_events() -> None:
    from voxline.realtime.openai.client_events import parse_command
    from voxline.sessions.items import ContentPart, MessageItem

    commands = [cmd.InputAudioAppend(audio=b"\x01\x02"), cmd.ItemTruncate(item_id="i", audio_end_ms=5),
                cmd.ResponseCancel(), cmd.InputAudioCommit(event_id="e1"),
                cmd.ItemCreate(item=MessageItem(id="m", role="user", content=[
                    ContentPart(type="input_text", text="hi")])),
                cmd.ResponseCreate(overrides=cmd.ResponseOverrides(instructions="brief"))]
    for command in commands:
        assert parse_command(render_command(command)) == command
    events = [ev.AudioDelta(response_id="r", item_id="i", delta=b"\xff\x00"),
              ev.SpeechStarted(audio_start_ms=3, item_id="i"),
              ev.InputTranscriptionCompleted(item_id="i", transcript="hi", audio_seconds=1.5)]
    for event in events:
        assert parse_server_event(render(event, Dialect.GA)) == event


# ------------------------------------------------------------------ real models

SHORT = "You are a voice assistant on a phone call. Answer in at most eight words."


def spoken_question() -> np.ndarray:
    from speech import espeak

    return np.concatenate([np.zeros(3200, np.float32), espeak("What is the capital of France?",
                                                              rate=8000),
                           np.zeros(12000, np.float32)])


def check_real(result: dict, asr) -> None:
    assert "capital" in result["question"].lower()
    assert result["spoken_status"] == "completed"
    heard = asr.transcribe(soxr.resample(result["audio"], 8000, 16000).astype(np.float32))
    from test_realtime_e2e import sounds_like

    assert sounds_like(heard, result["spoken_transcript"]), (heard, result["spoken_transcript"])
    assert result["cancel_status"] == ("cancelled", "client_cancelled")
    assert result["truncated"] == (True, 20)
    assert result["text_status"] == "completed" and "paris" in result["text"].lower()


@pytest.fixture(scope="module")
def asr():
    from voxline.engines.models.moonshine_asr import MoonshineASR

    return MoonshineASR.load()


@pytest.mark.slow
async def test_real_models_in_process_and_through_a_server(asr) -> None:
    from live_server import live_server

    async with voxline.Engine() as engine:
        check_real(await bot_script(engine, spoken_question(), SHORT), asr)
    with live_server() as base:
        async with voxline.connect(base) as engine:
            check_real(await bot_script(engine, spoken_question(), SHORT), asr)
