"""SIP: a real user agent (Debian's baresip) calls the server over loopback — G.711 RTP both
ways through the session host, RFC 4733 digits, BYE from either side, every resource
released — and hand-made requests no polite user agent sends (garbage, INVITEs the server
must refuse, a flood past max_sessions). Fast tests run over tests/fakes.py's stand-in
models; one slow call uses the shipped models and transcribes what the caller heard."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import TIME_FACTOR
from fakes import tone
from live_server import free_port, serve_app
from sip_peer import (
    RATE,
    RawSip,
    RtpSocket,
    baresip_call,
    next_request,
    rtp_port_of,
    sdp_offer,
)

from voxline.config import load_settings
from voxline.engines.client import InProcessEngineClient
from voxline.realtime.app import create_app
from voxline.realtime.transports.sip_media import RtpBridge
from voxline.sessions import commands as cmd
from voxline.sessions import events as ev

LOGGER = "voxline.realtime.transports"


@contextmanager
def sip_server(core_options: dict[str, object] | None = None,
               **settings: object) -> Iterator[tuple[Any, InProcessEngineClient]]:
    """The real app with SIP on loopback over the stand-in models; yields (app, engine)."""
    rtp = free_port() & ~1
    conf = load_settings(host="127.0.0.1", port=free_port(), engine="inprocess",
                         sip_port=free_port(), sip_rtp_ports=f"{rtp}-{rtp + 20}", **settings)
    engine = InProcessEngineClient("fakes:make_fake_core", {"stop_after": 60,
                                                            **(core_options or {})})
    app = create_app(conf, engine)
    with serve_app(app, conf.port, name="sip-server"):
        yield app, engine


@contextmanager
def stand_in_hooks() -> Iterator[str]:
    """A webhook receiver that takes every event and answers 200 (the app decides later)."""
    from fastapi import FastAPI, Response

    hooks = FastAPI()
    hooks.get("/health")(lambda: Response(status_code=200))
    hooks.post("/hooks")(lambda: Response(status_code=200))
    port = free_port()
    with serve_app(hooks, port, name="hooks") as base:
        yield base + "/hooks"


@pytest.fixture(scope="module")
def server():
    with sip_server(max_sessions=2) as running:
        yield running


def speech(seconds: float, silence: float = 0.8) -> np.ndarray:
    return np.concatenate([tone(seconds, RATE), np.zeros(int(silence * RATE), np.float32)])


async def eventually(check, timeout: float = 10.0) -> None:  # noqa: ANN001
    for _ in range(int(timeout * TIME_FACTOR / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    assert check()


async def released(app: Any, engine: InProcessEngineClient) -> None:
    """Every session slot, RTP port and engine stream is given back."""
    sip = app.state.sip
    await eventually(lambda: not sip.calls and sip.rtp_ports_in_use == 0
                     and app.state.voxline.host.active == 0
                     and not engine.status()["open_streams"])


def logged(caplog, pattern: str) -> list[str]:
    return re.findall(pattern, caplog.text)


# ------------------------------------------------------------------ a real user agent


async def test_a_real_user_agent_talks_presses_digits_and_hangs_up(server, caplog) -> None:
    app, engine = server
    caplog.set_level(logging.INFO, logger=LOGGER)
    port = app.state.voxline.settings.sip_port
    audio = np.concatenate([np.zeros(int(0.3 * RATE), np.float32), speech(0.6, 30.0)])
    async with baresip_call(port, audio) as ua:
        await ua.until("Call established")
        assert app.state.voxline.host.active == 1
        await eventually(lambda: logged(caplog, r"bot said '(.+)'"), 30)
        await ua.keys("15#")
        await eventually(lambda: len(logged(caplog, r"caller pressed (\S)")) == 3)
        assert logged(caplog, r"caller pressed (\S)") == ["1", "5", "#"]
        await ua.hangup()
        await released(app, engine)
        await eventually(lambda: ua.heard().size > RATE // 2)  # written when the call ends
        heard = ua.heard()
    assert np.abs(heard).max() > 0.05, "the caller heard only silence"
    assert logged(caplog, r"caller said 'hello there friend'")
    assert logged(caplog, r"sip call rtc_\S+ \(Call-ID \S+\): the caller hung up")


async def test_a_user_agent_offering_opus_talks_in_opus(server, caplog) -> None:
    app, engine = server
    caplog.set_level(logging.INFO, logger=LOGGER)
    port = app.state.voxline.settings.sip_port
    audio = np.concatenate([np.zeros(int(0.3 * RATE), np.float32), speech(0.6, 30.0)])
    async with baresip_call(port, audio, codec="opus/48000/2,PCMU") as ua:
        await ua.until("Call established")
        await eventually(lambda: logged(caplog, r"bot said '(.+)'"), 30)
        await ua.hangup()
        await released(app, engine)
        await eventually(lambda: ua.heard().size > RATE // 2)
        heard = ua.heard()
    assert logged(caplog, r"answered: Opus, RTP")
    assert logged(caplog, r"caller said 'hello there friend'")  # the ASR heard the Opus audio
    assert np.abs(heard).max() > 0.05, "the caller heard only silence"


def test_an_opus_offer_is_answered_with_opus_first_and_g711_otherwise() -> None:
    from aiosipua import parse_sdp

    from voxline.realtime.transports.sip_media import answer_offer

    plan = answer_offer(parse_sdp(sdp_offer(4000, codecs="0 111 101")), "127.0.0.1", 5000)
    assert plan.opus and plan.payload_type == 111 and plan.law == "pcm16"
    answer = serialize(plan.answer)
    assert "a=rtpmap:111 opus/48000/2" in answer and "PCMU" not in answer
    g711 = answer_offer(parse_sdp(sdp_offer(4000, codecs="8 0 101")), "127.0.0.1", 5000)
    assert not g711.opus and g711.law == "alaw"


def serialize(sdp: Any) -> str:  # noqa: ANN401
    from aiosipua import serialize_sdp

    return serialize_sdp(sdp)


async def test_the_server_hangs_up_when_the_session_ends(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    with sip_server(max_session_seconds=1.5) as (app, engine):
        port = app.state.voxline.settings.sip_port
        async with baresip_call(port, np.zeros(RATE * 30, np.float32)) as ua:
            await ua.until("Call established")
            await ua.until("terminated", 20)  # the server's BYE
            await released(app, engine)
    assert logged(caplog, r"hung up \(BYE\)")


async def test_a_drain_refuses_new_calls_503_and_lets_the_reply_finish_before_bye() -> None:
    import base64
    import json

    import websockets

    with sip_server() as (app, engine):
        sip, port = app.state.sip, app.state.voxline.settings.sip_port
        raw, other, rtp = RawSip(port), RawSip(port), RtpSocket()
        received: list[Any] = []

        async def collect() -> None:
            while True:
                received.extend(await rtp.packets(1, timeout=60))

        collector = asyncio.create_task(collect())
        try:
            raw.request("INVITE", "drained", body=sdp_offer(rtp.port))
            ok = await raw.response("drained")
            assert ok.status_code == 200
            raw.request("ACK", "drained", to_tag=tag_of(ok), content_type="")
            call_id = next(iter(sip.calls.values())).id
            url = f"ws://127.0.0.1:{app.state.voxline.settings.port}/v1/realtime?call_id={call_id}"
            sent = 0  # 20 ms frames of the reply the session sent the transport
            async with websockets.connect(url) as ws:
                await ws.send(json.dumps({"type": "response.create"}))
                async with asyncio.timeout(20 * TIME_FACTOR):
                    while (event := json.loads(await ws.recv()))["type"] != "response.created":
                        pass
                    asyncio.run_coroutine_threadsafe(app.state.voxline.host.drain(20), sip.loop)
                    while (event := json.loads(await ws.recv()))["type"] != "response.done":
                        if event["type"] in ("response.output_audio.delta", "response.audio.delta"):
                            sent += -(-len(base64.b64decode(event["delta"])) // 160)
                assert event["response"]["status"] == "completed"
                other.request("INVITE", "too-late", body=sdp_offer(4000))
                late = await other.response("too-late")
                assert late.status_code == 503
                assert late.headers.get_first("retry-after") == "5"
                bye = await next_request(raw, "BYE", timeout=30)
                await asyncio.sleep(0.3)  # packets that came before the BYE, read
                heard = len(received)  # the leg is closed: nothing comes after the BYE
            assert bye.call_id == "drained"
            assert sent > 10 and heard == sent  # the whole reply went out, then the BYE
            await eventually(lambda: not sip.calls and sip.rtp_ports_in_use == 0)
        finally:
            collector.cancel()
            raw.close()
            other.close()
            rtp.close()


async def test_comfort_noise_is_answered_heard_as_silence_and_sent_after_the_reply(
        server) -> None:
    import json

    import websockets

    from voxline.codecs import float_to_ulaw

    app, engine = server
    sip, port = app.state.sip, app.state.voxline.settings.sip_port
    raw, rtp = RawSip(port), RtpSocket()
    try:
        raw.request("INVITE", "comfort", body=sdp_offer(rtp.port, codecs="0 13 101"))
        ok = await raw.response("comfort")
        assert ok.status_code == 200 and "a=rtpmap:13 CN/8000" in ok.text
        server_rtp = rtp_port_of(ok)
        raw.request("ACK", "comfort", to_tag=tag_of(ok), content_type="")
        call_id = next(c.id for c in sip.calls.values() if c.sip_call_id == "comfort")
        url = f"ws://127.0.0.1:{app.state.voxline.settings.port}/v1/realtime?call_id={call_id}"
        async with websockets.connect(url) as ws:
            async def until(kind: str) -> None:
                async with asyncio.timeout(20 * TIME_FACTOR):
                    while json.loads(await ws.recv())["type"] != kind:
                        pass

            talk = float_to_ulaw(tone(1.0, RATE))
            for i in range(0, len(talk), 160):  # a second of speech at real time
                rtp.send(server_rtp, 0, talk[i:i + 160])
                await asyncio.sleep(0.02)
            rtp.send(server_rtp, 13, bytes([60]))  # then the phone goes quiet: CN, no audio
            await until("input_audio_buffer.speech_stopped")  # the silence was heard
            await until("response.done")
        sent_cn = []
        async with asyncio.timeout(20 * TIME_FACTOR):
            while not sent_cn:  # the reply ends: the server's pacer says CN
                sent_cn = [p for p in await rtp.packets(1) if p.payload_type == 13]
        assert len(sent_cn[0].payload) == 1  # the noise level, -dBov
        raw.request("BYE", "comfort", cseq=2, to_tag=tag_of(ok), content_type="")
        await released(app, engine)
    finally:
        raw.close()
        rtp.close()


# ------------------------------------------------------------------ refusals and bad input


def tag_of(response) -> str:  # noqa: ANN001
    return response.headers.get_first("to").split("tag=")[1].split(";")[0]


async def test_bad_requests_get_4xx_and_the_server_goes_on(server, caplog) -> None:
    app, engine = server
    caplog.set_level(logging.INFO, logger=LOGGER)
    raw = RawSip(app.state.voxline.settings.sip_port)
    try:
        for garbage in (b"\x00\xff" * 40, b"INVITE\r\n\r\n", b"SIP/2.0 200 OK\r\n\r\n",
                        "INVITE sip:x SIP/2.0\r\nVia: nonsense\r\n\r\n"):
            raw.send(garbage)
        raw.request("INVITE", "no-sdp")
        assert (await raw.response("no-sdp")).status_code == 488
        raw.request("INVITE", "no-codec", body=sdp_offer(4000, "9"))
        assert (await raw.response("no-codec")).status_code == 488
        raw.request("INVITE", "bad-sdp", body="this is not SDP at all\r\nm=audio x\r\n")
        assert (await raw.response("bad-sdp")).status_code in (400, 488)
        raw.request("BYE", "nobody", to_tag="x")
        assert (await raw.response("nobody")).status_code == 481
        raw.request("OPTIONS", "alive", content_type="")
        assert (await raw.response("alive")).status_code == 200
    finally:
        raw.close()
    await released(app, engine)


async def test_a_flood_of_invites_is_bounded_by_max_sessions(server) -> None:
    app, engine = server
    raw = RawSip(app.state.voxline.settings.sip_port)
    try:
        ids = [f"flood-{i}" for i in range(4)]
        for call_id in ids:
            raw.request("INVITE", call_id, body=sdp_offer(4000 + 2 * ids.index(call_id)))
        answers = {call_id: await raw.response(call_id) for call_id in ids}
        codes = sorted(r.status_code for r in answers.values())
        assert codes == [200, 200, 486, 486], codes
        assert app.state.voxline.host.active == 2
        assert app.state.sip.rtp_ports_in_use == 2
        for call_id, answer in answers.items():
            if answer.status_code == 200:
                raw.request("ACK", call_id, to_tag=tag_of(answer), content_type="")
                # a second INVITE for the same Call-ID from another dialog
                raw.request("INVITE", call_id, cseq=1, from_tag="intruder",
                            body=sdp_offer(5000))
                assert (await raw.response(call_id)).status_code == 481
                raw.request("BYE", call_id, cseq=2, to_tag=tag_of(answer), content_type="")
                assert (await raw.response(call_id)).status_code == 200
        await released(app, engine)
    finally:
        raw.close()


async def test_a_caller_that_goes_silent_is_hung_up_and_cancel_frees_a_ringing_call(
        caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    with stand_in_hooks() as url, sip_server(sip_media_timeout=1.0,
                                             sip_webhook_url=url) as (app, engine):
        raw = RawSip(app.state.voxline.settings.sip_port)
        try:
            invite = raw.request("INVITE", "cancel-me", body=sdp_offer(4000))
            assert (await raw.response("cancel-me", final=False)).status_code in (100, 180)
            await eventually(lambda: app.state.voxline.host.active == 1)
            cancel = invite.replace("INVITE sip:", "CANCEL sip:", 1).replace(
                "CSeq: 1 INVITE", "CSeq: 1 CANCEL").split("Content-Type:")[0] \
                + "Content-Length: 0\r\n\r\n"
            raw.send(cancel)
            assert (await raw.response("cancel-me")).status_code in (200, 487)
            await released(app, engine)
            # a call that the app accepts, then no RTP ever comes: the server hangs up
            raw.request("INVITE", "silent", body=sdp_offer(4000))
            await eventually(lambda: app.state.voxline.calls)
            call_id = next(iter(app.state.voxline.calls))
            base = f"http://127.0.0.1:{app.state.voxline.settings.port}"
            async with httpx.AsyncClient(base_url=base) as http:
                assert (await http.post(f"/v1/realtime/calls/{call_id}/accept",
                                        json={"type": "realtime"})).status_code == 200
            ok = await raw.response("silent")
            raw.request("ACK", "silent", to_tag=tag_of(ok), content_type="")
            bye = await next_request(raw, "BYE", timeout=15)
            assert bye.call_id == "silent"
            await released(app, engine)
        finally:
            raw.close()
    assert logged(caplog, r"no RTP from the caller for 1 s; hanging up")


async def test_re_invite_holds_and_resumes_the_call(server, caplog) -> None:
    app, engine = server
    caplog.set_level(logging.INFO, logger=LOGGER)
    raw = RawSip(app.state.voxline.settings.sip_port)
    try:
        raw.request("INVITE", "hold-me", body=sdp_offer(4000))
        ok = await raw.response("hold-me")
        assert ok.status_code == 200 and "a=sendrecv" in ok.text
        tag = tag_of(ok)
        raw.request("ACK", "hold-me", to_tag=tag, content_type="")
        leg = app.state.sip.calls["hold-me"].leg
        for cseq, (offered, answered, held) in enumerate(
                [("sendonly", "recvonly", True), ("sendrecv", "sendrecv", False)], start=2):
            raw.request("INVITE", "hold-me", cseq=cseq, to_tag=tag,
                        body=sdp_offer(4000, direction=offered, version=cseq))
            answer = await raw.response("hold-me")
            assert answer.status_code == 200 and f"a={answered}" in answer.text, answer.text
            assert f"m=audio {leg.port} " in answer.text  # the same port
            raw.request("ACK", "hold-me", cseq=cseq, to_tag=tag, content_type="")
            assert leg.on_hold is held
        raw.request("BYE", "hold-me", cseq=9, to_tag=tag, content_type="")
        assert (await raw.response("hold-me")).status_code == 200
        await released(app, engine)
    finally:
        raw.close()
    assert logged(caplog, r"re-INVITE, (on hold|media on)") == ["on hold", "media on"]


async def test_sip_over_tcp_is_answered(server) -> None:
    app, _ = server
    port = app.state.voxline.settings.sip_port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        local = writer.get_extra_info("sockname")[1]
        writer.write((f"OPTIONS sip:bot@127.0.0.1:{port} SIP/2.0\r\n"
                      f"Via: SIP/2.0/TCP 127.0.0.1:{local};branch=z9hG4bKtcp1\r\n"
                      "From: <sip:caller@127.0.0.1>;tag=t1\r\nTo: <sip:bot@127.0.0.1>\r\n"
                      "Call-ID: over-tcp\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\n"
                      "Content-Length: 0\r\n\r\n").encode())
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 5 * TIME_FACTOR)
        assert status.startswith(b"SIP/2.0 200"), status
    finally:
        writer.close()


async def test_while_the_engine_is_not_ready_calls_get_503_with_retry_after(server) -> None:
    app, engine = server
    raw = RawSip(app.state.voxline.settings.sip_port)
    engine._ready = False  # as while it starts or restarts (the host asks engine.ready)
    try:
        raw.request("INVITE", "too-early", body=sdp_offer(4000))
        answer = await raw.response("too-early")
        assert answer.status_code == 503
        assert answer.headers.get_first("retry-after") == "5"
    finally:
        engine._ready = True
        raw.close()
    await released(app, engine)


def test_the_rtp_bridge_frames_replies_and_truncates_to_what_was_sent() -> None:
    bridge = RtpBridge("call")
    frames, drop, commands = bridge.on_event(
        ev.AudioDelta(response_id="r1", item_id="i1", output_index=0, content_index=0,
                      delta=bytes(800)), queued_frames=0)
    assert [len(f) for f in frames] == [160] * 5 and not drop and commands == []
    assert bridge.on_frame(b"\xff" * 160) == [cmd.InputAudioAppend(audio=b"\xff" * 160)]
    # barge-in with 2 of the 5 frames still queued: 60 ms went out, the rest is dropped
    frames, drop, commands = bridge.on_event(ev.OutputAudioBufferCleared(response_id="r1"),
                                             queued_frames=2)
    assert frames == [] and drop
    assert commands == [cmd.ItemTruncate(item_id="i1", audio_end_ms=60)]
    # a second clear for the same reply cuts nothing more
    assert bridge.on_event(ev.OutputAudioBufferCleared(response_id="r1"), 0)[2] == []


async def test_unknown_sources_get_403_and_a_log_line(caplog) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    with sip_server(sip_allow="10.0.0.0/8") as (app, engine):
        raw = RawSip(app.state.voxline.settings.sip_port)
        try:
            raw.request("INVITE", "stranger", body=sdp_offer(4000))
            assert (await raw.response("stranger")).status_code == 403
        finally:
            raw.close()
        assert logged(caplog, r"SIP INVITE from 127\.0\.0\.1:\d+ refused \(403\)")
        assert app.state.voxline.host.active == 0


# ------------------------------------------------------------------ real models


@pytest.mark.slow
async def test_real_call_over_sip_answers_the_question_and_barge_in_cuts(caplog) -> None:
    """baresip asks a spoken question as G.711 RTP; what it heard, transcribed with the
    shipped ASR, is the bot's answer; digits arrive; a caller talking over a long reply
    cuts it; baresip hangs up at the end of its audio and everything is released."""
    import soxr
    from speech import espeak
    from test_realtime_e2e import sounds_like

    from voxline.engines.launch import make_engine
    from voxline.engines.models.moonshine_asr import MoonshineASR

    caplog.set_level(logging.INFO, logger=LOGGER)
    asr = MoonshineASR.load()

    def gap(seconds: float) -> np.ndarray:
        return np.zeros(int(seconds * RATE), np.float32)

    audio = np.concatenate([
        gap(0.4), espeak("What is the capital of France?", rate=RATE), gap(9.0),
        espeak("Tell me a long story about a dragon.", rate=RATE), gap(4.0),
        espeak("Stop. Thank you.", rate=RATE), gap(6.0)])
    rtp = free_port() & ~1
    conf = load_settings(host="127.0.0.1", port=free_port(), engine="inprocess",
                         sip_port=free_port(), sip_rtp_ports=f"{rtp}-{rtp + 20}",
                         sip_instructions="You are a voice assistant on a phone call. "
                                      "Answer in at most eight words.")
    engine = make_engine(conf)
    app = create_app(conf, engine)
    with serve_app(app, conf.port, startup_timeout=300, name="live-sip-server"):
        async with baresip_call(conf.sip_port, audio) as ua:
            await ua.until("Call established", 30)
            said = (await _first(caplog, r"bot said '(.+)'", 60))
            await ua.keys("42")
            await ua.until("terminated", 60 * TIME_FACTOR)  # baresip's audio ended: BYE
            await released(app, engine)
            await eventually(lambda: ua.heard().size > RATE)
            heard_audio = ua.heard()
    heard = asr.transcribe(soxr.resample(heard_audio, RATE, 16000).astype(np.float32))
    print(f"\nbot said: {said!r}\ncaller heard (ASR): {heard!r}")
    assert sounds_like(heard, said), (heard, said)
    assert "paris" in (said + heard).lower() or "france" in (said + heard).lower(), said
    assert logged(caplog, r"caller pressed (\S)") == ["4", "2"]
    cut = logged(caplog, r"barge-in, reply \S+ heard to (\d+) ms")
    print(f"barge-in cut: {cut}")
    assert cut or len(logged(caplog, r"bot said '(.+)'")) >= 2


async def _first(caplog, pattern: str, timeout: float) -> str:  # noqa: ANN001
    for _ in range(int(timeout * TIME_FACTOR / 0.1)):
        found = re.findall(pattern, caplog.text)
        if found:
            return found[0]
        await asyncio.sleep(0.1)
    raise AssertionError(f"never logged: {pattern}")


async def test_digest_authentication_lets_a_trunk_in_and_keeps_others_out(caplog) -> None:
    """Also the A-law path: the trunk talks PCMA."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    with sip_server(sip_allow="", sip_digest_user="trunk",
                    sip_digest_password="s3cret") as (app, engine):
        port = app.state.voxline.settings.sip_port
        async with baresip_call(port, speech(0.6, 30.0), auth=("trunk", "s3cret"),
                                codec="PCMA") as ua:
            await ua.until("Call established")
            assert "audio tx pipeline:      aufile ---> sndfile ---> PCMA" in ua.output
            assert logged(caplog, r"answered: (PCMA)") == ["PCMA"]
            await eventually(lambda: logged(caplog, r"bot said '(.+)'"), 30)
            await ua.hangup()
            await released(app, engine)
            await eventually(lambda: ua.heard().size > RATE // 2)
            assert np.abs(ua.heard()).max() > 0.05  # the A-law reply decoded to sound
        raw = RawSip(port)
        try:
            raw.request("INVITE", "no-creds", body=sdp_offer(4000))
            challenge = await raw.response("no-creds")
            assert challenge.status_code == 401
            assert 'realm="voxline"' in challenge.headers.get_first("www-authenticate")
            nonce = challenge.headers.get_first("www-authenticate").split('nonce="')[1][:-1]
            nonce = nonce.split('"')[0]
            raw.request("INVITE", "bad-creds", body=sdp_offer(4000), extra=(
                f'Authorization: Digest username="trunk", realm="voxline", nonce="{nonce}", '
                f'uri="sip:bot@127.0.0.1:{port}", response="0123456789abcdef0123456789abcdef"',))
            assert (await raw.response("bad-creds")).status_code == 403
        finally:
            raw.close()
        assert app.state.voxline.host.active == 0
    assert logged(caplog, r"refused \(403\): not in sip_allow and no valid digest credentials")
