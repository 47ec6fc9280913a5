"""Twilio Media Streams: the wire (messages, signatures, TwiML), the bridge's mark-based
truncation, and calls through the running server — fast ones over the engine with the
small stand-in models, and one slow call with the real models (spoken question, spoken
answer, barge-in)."""

from __future__ import annotations

import asyncio
import logging
import re
import time

import httpx
import numpy as np
import pytest
from conftest import TIME_FACTOR
from fake_server import fake_server
from fakes import tone
from twilio_peer import CALL_SID, STREAM_SID, twilio_call

from voxline.engines.client import InProcessEngineClient
from voxline.realtime.transports import twilio_wire as tw
from voxline.realtime.transports.twilio import TwilioBridge
from voxline.sessions import commands as cmd
from voxline.sessions import events as ev

RATE = 8000
LOGGER = "voxline.realtime.transports.twilio"


# ------------------------------------------------------------------------ the wire


def test_parses_twilios_messages() -> None:
    start = tw.parse_message(
        '{"event":"start","sequenceNumber":"1","streamSid":"MZ1","start":{"accountSid":"AC1",'
        '"streamSid":"MZ1","callSid":"CA1","tracks":["inbound"],"mediaFormat":{"encoding":'
        '"audio/x-mulaw","sampleRate":8000,"channels":1},"customParameters":{"voice":"ash"}}}')
    assert start == tw.Start("MZ1", "CA1", "AC1", "audio/x-mulaw", 8000, 1, ("inbound",),
                             {"voice": "ash"})
    media = tw.parse_message('{"event":"media","sequenceNumber":"3","streamSid":"MZ1","media":'
                             '{"track":"inbound","chunk":"2","timestamp":"40","payload":"/38="}}')
    assert media == tw.Media("MZ1", b"\xff\x7f", "inbound", 2, 40)
    assert tw.parse_message('{"event":"mark","streamSid":"MZ1","mark":{"name":"a"}}') == \
        tw.Mark("MZ1", "a")
    assert tw.parse_message('{"event":"dtmf","streamSid":"MZ1","dtmf":{"track":"inbound_track",'
                            '"digit":"7"}}') == tw.Dtmf("MZ1", "7")
    assert tw.parse_message('{"event":"stop","streamSid":"MZ1","stop":{"callSid":"CA1"}}') == \
        tw.Stop("MZ1", "CA1")
    assert tw.parse_message('{"event":"someday","streamSid":"MZ1"}') is None


@pytest.mark.parametrize("text,error", [
    ("not json", "not JSON"),
    ('{"event":"media","streamSid":"MZ1","media":{"payload":"***"}}', "media.media.payload is "
     "not base64"),
    ('{"event":"media","streamSid":"MZ1"}', "media.media is missing"),
    ('{"event":"start","streamSid":"MZ1","start":{"callSid":"CA1"}}',
     "start.start.mediaFormat is missing"),
    ('{"event":"mark","streamSid":"MZ1","mark":{"name":3}}', "mark.mark.name must be a str"),
])
def test_malformed_messages_say_what_is_wrong(text: str, error: str) -> None:
    with pytest.raises(tw.TwilioMessageError, match=re.escape(error)):
        tw.parse_message(text)


def test_signature_matches_twilios_algorithm_and_tolerates_proxies() -> None:
    params = [("CallSid", "CA1"), ("From", "+14155550100"), ("Digits", "1234")]
    url = "https://example.com/v1/telephony/twilio/twiml?voice=ash"
    sig = tw.twilio_signature("12345", url, params)
    # HMAC-SHA1 over the URL then the parameters sorted by name, name + value
    import base64
    import hashlib
    import hmac
    data = url + "CallSidCA1Digits1234From+14155550100"
    assert sig == base64.b64encode(hmac.new(b"12345", data.encode(), hashlib.sha1).digest()).decode()
    behind_proxy = "http://example.com/v1/telephony/twilio/twiml?voice=ash"
    assert tw.signature_valid("12345", behind_proxy, params, sig, schemes=("https", "http"))
    assert not tw.signature_valid("other", behind_proxy, params, sig, schemes=("https", "http"))
    assert not tw.signature_valid("12345", behind_proxy, params[:2], sig, schemes=("https",))
    assert not tw.signature_valid("12345", url, params, None, schemes=("https",))


def test_twiml_connects_a_stream_with_parameters() -> None:
    xml = tw.connect_stream_twiml("wss://bot.example.com/v1/telephony/twilio",
                                  {"instructions": 'Say "hi" & <go>'})
    assert xml == ('<?xml version="1.0" encoding="UTF-8"?><Response><Connect><Stream '
                   'url="wss://bot.example.com/v1/telephony/twilio"><Parameter name="instructions"'
                   ' value=\'Say "hi" &amp; &lt;go&gt;\'/></Stream></Connect></Response>')


# --------------------------------------------------------------------- the bridge


def _delta(item: str, ms: int) -> ev.AudioDelta:
    return ev.AudioDelta(response_id="resp_1", item_id=item, delta=b"\xff" * (8 * ms))


def test_bridge_frames_marks_and_truncates_at_the_last_mark_played() -> None:
    bridge = TwilioBridge()
    bridge.on_twilio(tw.Start("MZ1", "CA1", "AC1", "audio/x-mulaw", 8000, 1))
    out, _ = bridge.on_event(_delta("item_a", 40))
    assert [m["event"] for m in out] == ["media", "media", "mark"]
    assert all(len(m["media"]["payload"]) == 216 for m in out[:2])  # 160 bytes, base64
    marks = [out[2]["mark"]["name"]]
    for _ in range(3):
        out, _ = bridge.on_event(_delta("item_a", 40))
        marks.append(out[-1]["mark"]["name"])
    assert marks == ["item_a:40", "item_a:80", "item_a:120", "item_a:160"]
    bridge.on_twilio(tw.Mark("MZ1", marks[0]))
    bridge.on_twilio(tw.Mark("MZ1", marks[1]))
    out, commands = bridge.on_event(ev.OutputAudioBufferCleared(response_id="resp_1"))
    assert out == [{"event": "clear", "streamSid": "MZ1"}]
    assert commands == [cmd.ItemTruncate(item_id="item_a", audio_end_ms=80)]
    # Twilio echoes the marks the clear dropped (never heard); the reply is cut once
    bridge.on_twilio(tw.Mark("MZ1", marks[2]))
    assert bridge.on_event(ev.OutputAudioBufferCleared(response_id="resp_1"))[1] == []


def test_bridge_maps_start_parameters_and_refuses_other_formats() -> None:
    bridge = TwilioBridge()
    commands = bridge.on_twilio(tw.Start("MZ1", "CA1", "AC1", "audio/x-mulaw", 8000, 1, (),
                                         {"instructions": "Be brief.", "voice": "ash"}))
    assert commands == [cmd.SessionUpdate(changes={"instructions": "Be brief.", "audio": {
        "output": {"voice": "ash"}}}, event_id="twilio_start")]
    with pytest.raises(tw.TwilioMessageError, match="only audio/x-mulaw 8000 Hz mono"):
        bridge.on_twilio(tw.Start("MZ1", "CA1", "AC1", "audio/x-l16", 16000, 1))
    assert bridge.on_twilio(tw.Dtmf("MZ1", "5")) == []
    assert bridge.on_twilio(tw.Media("MZ1", b"\x7f" * 160)) == [cmd.InputAudioAppend(audio=b"\x7f" * 160)]


# ------------------------------------------------------- calls over stand-in models


def speech(seconds: float, silence: float = 0.8) -> np.ndarray:
    return np.concatenate([tone(seconds, RATE), np.zeros(int(silence * RATE), np.float32)])


async def streams_closed(engine: InProcessEngineClient) -> None:
    deadline = time.monotonic() + 10 * TIME_FACTOR
    for _ in range(int(10 * TIME_FACTOR / 0.02)):  # the client counts streams; no event
        if not engine.status()["open_streams"]:
            return
        await asyncio.sleep(0.02)
    assert time.monotonic() >= deadline and not engine.status()["open_streams"]


@pytest.fixture(scope="module")
def server():
    with fake_server() as running:
        yield running


async def test_barge_in_clears_before_more_media_and_truncates_to_the_marks_heard(
        server, caplog) -> None:
    base, engine = server
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with twilio_call(base) as call:
        await call.start()
        await call.speak(np.zeros(int(0.3 * RATE), np.float32))  # line noise-free silence
        await call.dtmf("1")  # a keypress does not end or start a turn
        await call.speak(speech(0.6))
        await call.until(lambda m: m["event"] == "mark" and call.echoed, 30 * TIME_FACTOR)
        first_item = call.echoed[0].split(":")[0]
        await call.speak(speech(0.5))  # talk over the reply
        clear = await call.until(lambda m: m["event"] == "clear", 30 * TIME_FACTOR)
        i = call.messages.index(clear)
        heard = max(int(n.split(":")[1]) for n in call.echoed if n.startswith(first_item)
                    and call.messages.index(next(m for m in call.messages if m["event"] == "mark"
                                                 and m["mark"]["name"] == n)) < i)
        # the next reply comes, and nothing of the old one after the clear
        await call.until(lambda m: m["event"] == "mark" and call.messages.index(m) > i
                         and not m["mark"]["name"].startswith(first_item), 30 * TIME_FACTOR)
        after = [m for m in call.messages[i:] if m["event"] == "mark"]
        assert not [m for m in after if m["mark"]["name"].startswith(first_item)]
        assert clear["streamSid"] == STREAM_SID
        await call.stop()
        await streams_closed(engine)
    # truncated at a mark the caller had played: the last one the server had received when
    # it saw the barge-in (a mark echoed just before the clear may still be on its way)
    marks = {int(n.split(":")[1]) for n in call.echoed if n.startswith(first_item)}
    cut, = (int(m) for m in re.findall(rf"reply {first_item} truncated at (\d+) ms", caplog.text))
    assert cut in marks and cut <= heard, (cut, sorted(marks), heard)


async def test_malformed_messages_are_logged_with_the_call_and_the_call_goes_on(
        server, caplog) -> None:
    base, engine = server
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with twilio_call(base) as call:
        await call.start()
        await call.ws.send("{not json")
        await call.send("media", media={"track": "inbound", "payload": "@@@"})
        await call.send("mark", mark={})
        await call.send("someday", someday={})  # unknown events are ignored
        await call.speak(speech(0.6))
        await call.until(lambda m: m["event"] == "media", 30 * TIME_FACTOR)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 3
    assert all(CALL_SID in r.getMessage() and STREAM_SID in r.getMessage() for r in errors)
    assert "media.media.payload is not base64" in errors[1].getMessage()
    await streams_closed(engine)  # the dropped socket freed the stream


async def test_stop_frees_the_engine_stream(server) -> None:
    base, engine = server
    async with twilio_call(base) as call:
        await call.start()
        await call.speak(speech(0.3, silence=0.1))
        assert engine.status()["open_streams"] == 1
        await call.stop()
        await streams_closed(engine)


def test_twiml_endpoint_and_signature_validation() -> None:
    with fake_server(twilio_auth_token="secret") as (base, _):
        url = base + "/v1/telephony/twilio/twiml?voice=ash"
        form = {"CallSid": "CA1", "From": "+14155550100"}
        assert httpx.post(url, data=form).status_code == 403
        sig = tw.twilio_signature("secret", url, form.items())
        r = httpx.post(url, data=form, headers={"X-Twilio-Signature": sig})
        assert r.status_code == 200 and r.headers["content-type"] == "application/xml"
        host = base.split("//")[1]
        assert f'<Stream url="ws://{host}/v1/telephony/twilio">' in r.text
        assert '<Parameter name="voice" value="ash"/>' in r.text

        async def connect(headers: dict[str, str]) -> str:
            async with twilio_call(base, **headers) as call:
                await call.start()
                await call.until(lambda m: True, 2)
            return "open"
        with pytest.raises(Exception, match="403"):  # refused before the upgrade
            asyncio.run(connect({}))
        ws_url = base.replace("http", "ws") + "/v1/telephony/twilio"
        good = {"X-Twilio-Signature": tw.twilio_signature("secret", ws_url)}
        with pytest.raises(TimeoutError):  # accepted: it waits for the caller to speak
            asyncio.run(connect(good))


# ------------------------------------------------------------------ real models


@pytest.mark.slow
async def test_real_call_answers_in_speech_and_barge_in_clears(caplog) -> None:
    import soxr
    from live_server import live_server
    from speech import espeak
    from test_realtime_e2e import sounds_like

    from voxline.engines.models.moonshine_asr import MoonshineASR

    caplog.set_level(logging.INFO, logger=LOGGER)
    asr = MoonshineASR.load()
    silence = np.zeros(int(1.2 * RATE), np.float32)
    with live_server() as base:
        async with twilio_call(base) as call:
            await call.start(instructions="You are a voice assistant on a phone call. "
                                          "Answer in at most eight words.")
            end_of_speech = await call.speak(np.concatenate([
                np.zeros(int(0.4 * RATE), np.float32),
                espeak("What is the capital of France?", rate=RATE)]))
            mark = len(call.messages)
            speaking = asyncio.create_task(call.speak(silence))
            first = await call.until(lambda m: m["event"] == "media", 60 * TIME_FACTOR)
            print(f"\nend of speech -> first media: {first['_at'] - end_of_speech:.2f} s")
            await speaking
            said = await _bot_said(caplog, 60)
            # keep the line open (silence) until the reply has played and its marks came back
            while len(call.echoed) < len([m for m in call.messages if m["event"] == "mark"]):
                await call.speak(np.zeros(int(0.2 * RATE), np.float32))
            audio = call.media_audio(mark)
            heard = asr.transcribe(soxr.resample(audio, RATE, 16000).astype(np.float32))
            assert sounds_like(heard, said), (heard, said)

            # barge-in: a long answer, interrupted once it has played for a while
            await call.speak(np.concatenate([espeak("Tell me a long story about a dragon.",
                                                    rate=RATE), silence]))
            start = len(call.messages)
            await call.until(lambda m: m["event"] == "media" and call.messages.index(m) > start,
                             60 * TIME_FACTOR)
            await call.speak(np.zeros(int(1.0 * RATE), np.float32))
            await call.speak(np.concatenate([espeak("Stop. Thank you.", rate=RATE), silence]))
            clear = await call.until(lambda m: m["event"] == "clear", 30 * TIME_FACTOR)
            i = call.messages.index(clear)
            cut = [m["mark"]["name"] for m in call.messages[start:i] if m["event"] == "mark"][0]
            item = cut.split(":")[0]
            assert not [m for m in call.messages[i:] if m["event"] == "mark"
                        and m["mark"]["name"].startswith(item)]
            sent = [m["mark"]["name"] for m in call.messages[:i]
                    if m["event"] == "mark" and m["mark"]["name"].startswith(item)]
            await call.stop()
    # The reply is cut where the caller stopped hearing it, unless the caller had played
    # every mark sent before the clear: on two cores the story's audio can run out before
    # the barge-in is heard (the session keeps only 200 ms ahead), and then nothing is cut
    # (the bridge's unit tests hold the cut itself to the marks heard).
    played_all = all(name in call.echoed for name in sent)
    assert re.search(rf"reply {item} truncated at \d+ ms", caplog.text) or played_all, sent


async def _bot_said(caplog, timeout: float) -> str:
    for _ in range(int(timeout * TIME_FACTOR / 0.1)):
        found = re.findall(r"bot said '(.*)'", caplog.text)
        if found:
            return found[0]
        await asyncio.sleep(0.1)
    raise AssertionError("the bot never finished a reply")


async def test_frame_pacer_sends_frames_20_ms_apart_with_a_lead_and_clear_drops_the_rest(
        ) -> None:
    """The pacing of reply frames, on a stand-in clock (no waiting on real time)."""
    from voxline.realtime.transports.frame_pacer import FramePacer

    now = [100.0]
    sent: list[str] = []
    pacer = FramePacer(sent.append, lead=0.06, clock=lambda: now[0])
    for i in range(10):  # one reply chunk: ten frames, then its mark
        pacer.push(f"f{i}", is_frame=True)
    pacer.push("mark", is_frame=False)
    wait = pacer.pump()
    assert sent == ["f0", "f1", "f2"]  # the lead: 60 ms ahead of the peer's playback
    assert wait is not None and 0 < wait <= 0.02
    for step in range(1, 5):  # one frame per 20 ms of playback
        now[0] += 0.02
        pacer.pump()
        assert len(sent) == 3 + step
    assert pacer.clear() == 3  # barge-in: f7..f9 are never sent, nor the mark after them
    assert pacer.pump() is None and sent[-1] == "f6" and "mark" not in sent
    now[0] += 1.0  # silence, then the next reply starts with the lead again
    for i in range(4):
        pacer.push(f"g{i}", is_frame=True)
    pacer.push("mark2", is_frame=False)
    pacer.pump()
    assert sent[-3:] == ["g0", "g1", "g2"]
    pacer.flush()  # the session closes: the rest goes at once, in order
    assert sent[-2:] == ["g3", "mark2"]
