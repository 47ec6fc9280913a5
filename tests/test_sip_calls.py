"""OpenAI's SIP call control against a stand-in app on loopback: the signed
``realtime.call.incoming`` webhook, accept with a session config, reject, the 480 of a
call nobody accepts, refer, hangup, and a ``/v1/realtime?call_id=`` WebSocket that sees
the call's events (digits included) and steers its session. Stand-in models, fast."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
import pytest
import websockets
from conftest import TIME_FACTOR
from fastapi import FastAPI, Request, Response
from live_server import serve_app
from openai_types import strict_problems
from sip_peer import (
    RATE,
    RawSip,
    RtpSocket,
    baresip_call,
    next_request,
    rtp_port_of,
    sdp_offer,
)
from test_sip import eventually, released, sip_server, tag_of

from voxline.realtime.transports import sip_webhook
from voxline.realtime.transports.sip_call import SipCall

SECRET = "whsec_" + "c2VjcmV0LXNlY3JldC1zZWNyZXQ="  # base64 of a test key


@contextmanager
def stand_in_app() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """An app that takes webhooks (checking their signatures) and answers 200."""
    from live_server import free_port

    hooks: list[dict[str, Any]] = []
    app = FastAPI()

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.post("/hooks")
    async def hook(request: Request) -> Response:
        body = await request.body()
        hooks.append({"valid": sip_webhook.verify(SECRET, request.headers, body),
                      "event": json.loads(body)})
        return Response(status_code=200)

    port = free_port()
    with serve_app(app, port, name="stand-in-app") as base:
        yield base + "/hooks", hooks


@pytest.fixture(scope="module")
def world():
    with stand_in_app() as (url, hooks), sip_server(
            sip_webhook_url=url, sip_webhook_secret=SECRET, sip_accept_timeout=2.0,
            max_sessions=4) as (app, engine):
        yield app, engine, hooks


async def incoming(hooks: list[dict[str, Any]], count: int) -> dict[str, Any]:
    await eventually(lambda: len(hooks) >= count)
    hook = hooks[count - 1]
    assert hook["valid"], "the webhook's signature does not verify"
    return hook["event"]


def api(app: Any) -> str:
    return f"http://127.0.0.1:{app.state.voxline.settings.port}"


def headers_of(event: dict[str, Any]) -> dict[str, str]:
    return {h["name"]: h["value"] for h in event["data"]["sip_headers"]}


async def test_accept_with_a_session_watch_digits_steer_and_hang_up(world) -> None:
    app, engine, hooks = world
    port = app.state.voxline.settings.sip_port
    before = len(hooks)
    async with baresip_call(port, np.zeros(RATE * 30, np.float32)) as ua:
        event = await incoming(hooks, before + 1)
        assert event["type"] == "realtime.call.incoming" and event["object"] == "event"
        call_id = event["data"]["call_id"]
        assert call_id.startswith("rtc_")
        names = [h["name"] for h in event["data"]["sip_headers"]]
        assert names[:3] == ["From", "To", "Call-ID"] and "Via" in names
        assert headers_of(event)["To"].startswith("<sip:bot@127.0.0.1")
        await ua.until("Ringing")
        url = api(app).replace("http", "ws") + f"/v1/realtime?call_id={call_id}"
        async with websockets.connect(url) as ws:
            async with httpx.AsyncClient(base_url=api(app)) as http:
                answer = await http.post(f"/v1/realtime/calls/{call_id}/accept", json={
                    "type": "realtime", "instructions": "You answer the bakery's phone."})
                assert answer.status_code == 200, answer.text
                again = await http.post(f"/v1/realtime/calls/{call_id}/reject", json={})
                assert again.status_code == 409
            await ua.until("Call established")
            created = await until_event(ws, "session.created")
            assert created["session"]["instructions"] == "You answer the bakery's phone."
            assert created["session"]["audio"]["input"]["format"]["type"] == "audio/pcmu"
            await ua.keys("7")
            dtmf = await until_event(ws, "input_audio_buffer.dtmf_event_received")
            assert dtmf["event"] == "7" and isinstance(dtmf["received_at"], int)
            assert strict_problems(dtmf, "ga") == []
            await ws.send(json.dumps({"type": "response.create"}))  # the app steers
            await until_event(ws, "response.created")
            async with httpx.AsyncClient(base_url=api(app)) as http:
                assert (await http.post(f"/v1/realtime/calls/{call_id}/hangup")).status_code \
                    == 200
            await ua.until("session closed: Connection reset by peer")  # the server's BYE
            await released(app, engine)


async def until_event(ws: Any, kind: str) -> dict[str, Any]:
    async with asyncio.timeout(20 * TIME_FACTOR):
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == kind:
                return event


async def test_reject_answers_the_status_and_default_603(world) -> None:
    app, engine, hooks = world
    raw = RawSip(app.state.voxline.settings.sip_port)
    try:
        async with httpx.AsyncClient(base_url=api(app)) as http:
            for call, body, status in (("reject-486", {"status_code": 486}, 486),
                                       ("reject-default", None, 603)):
                before = len(hooks)
                raw.request("INVITE", call, body=sdp_offer(4000))
                call_id = (await incoming(hooks, before + 1))["data"]["call_id"]
                bad = await http.post(f"/v1/realtime/calls/{call_id}/reject",
                                      json={"status_code": 99})
                assert bad.status_code == 400 and "status_code" in bad.text
                answer = await http.post(f"/v1/realtime/calls/{call_id}/reject", json=body)
                assert answer.status_code == 200
                assert (await raw.response(call)).status_code == status
            missing = await http.post("/v1/realtime/calls/rtc_nope/accept", json={})
            assert missing.status_code == 404
    finally:
        raw.close()
    await released(app, engine)


async def test_a_second_invite_for_a_ringing_call_is_refused_and_a_resend_is_not(
        world) -> None:
    app, engine, hooks = world
    raw = RawSip(app.state.voxline.settings.sip_port)
    try:
        before = len(hooks)
        first = raw.request("INVITE", "twice", body=sdp_offer(4000))
        call_id = (await incoming(hooks, before + 1))["data"]["call_id"]
        raw.request("INVITE", "twice", body=sdp_offer(4002))  # another transaction
        assert (await raw.response("twice")).status_code == 482
        raw.unclaimed.clear()  # the first INVITE's 100 and 180
        raw.send(first)  # a retransmission: it rings again, no new session
        provisional = await raw.response("twice", final=False)
        assert provisional.status_code == 183 and provisional.text  # early media, again
        assert app.state.voxline.host.active == 1 and len(hooks) == before + 1
        async with httpx.AsyncClient(base_url=api(app)) as http:
            assert (await http.post(f"/v1/realtime/calls/{call_id}/reject")).status_code == 200
        assert (await raw.response("twice")).status_code == 603
    finally:
        raw.close()
    await released(app, engine)


async def progress(raw: RawSip, call: str) -> Any:  # noqa: ANN401
    """The 183 Session Progress the server sends `call` while it rings."""
    while (response := await raw.response(call, final=False)).status_code != 183:
        assert response.status_code < 200, response.status_code
    return response


def tone_power(payloads: list[bytes], hz: float) -> float:
    """The share of the decoded μ-law audio's power within 20 Hz of `hz`."""
    from voxline.codecs import ulaw_to_float

    audio = ulaw_to_float(b"".join(payloads))
    spectrum = np.abs(np.fft.rfft(audio)) ** 2
    freqs = np.fft.rfftfreq(audio.size, 1 / RATE)
    return float(spectrum[np.abs(freqs - hz) < 20].sum() / max(spectrum.sum(), 1e-12))


async def test_a_ringing_call_hears_ringback_as_early_media_before_the_200(world) -> None:
    app, engine, hooks = world
    raw, rtp = RawSip(app.state.voxline.settings.sip_port), RtpSocket()
    try:
        before = len(hooks)
        raw.request("INVITE", "early", body=sdp_offer(rtp.port))
        call_id = (await incoming(hooks, before + 1))["data"]["call_id"]
        session_progress = await progress(raw, "early")
        server_rtp = rtp_port_of(session_progress)
        early = await rtp.packets(25)  # 0.5 s of ringback while the app decides
        assert {p.payload_type for p in early} == {0}  # the caller's first law, PCMU
        payloads = [p.payload for p in early]
        assert tone_power(payloads, 440) + tone_power(payloads, 480) > 0.8
        assert not [r for r in raw.unclaimed if r.status_code >= 200]  # still ringing
        async with httpx.AsyncClient(base_url=api(app)) as http:
            assert (await http.post(f"/v1/realtime/calls/{call_id}/accept",
                                    json={"type": "realtime"})).status_code == 200
        ok = await raw.response("early")
        assert ok.status_code == 200 and rtp_port_of(ok) == server_rtp  # the same media
        raw.request("ACK", "early", to_tag=tag_of(ok), content_type="")
        raw.request("BYE", "early", cseq=2, to_tag=tag_of(ok), content_type="")
        await released(app, engine)
    finally:
        raw.close()
        rtp.close()


def test_early_media_plays_a_wav_at_8_khz_and_refuses_a_bad_setting(tmp_path) -> None:
    from pydantic import ValidationError

    from voxline.codecs import write_wav
    from voxline.config import load_settings
    from voxline.realtime.transports.sip_early_media import encode_frames, load_early_media

    wav = tmp_path / "hold.wav"
    write_wav(wav, 0.3 * np.sin(2 * np.pi * 1000 * np.arange(16000) / 16000), 16000)
    audio = load_early_media(str(wav))
    assert audio is not None and audio.size == RATE  # one second, resampled to 8 kHz
    frames = encode_frames(audio, "ulaw")
    assert len(frames) == 50 and {len(f) for f in frames} == {160}
    assert tone_power(frames, 1000) > 0.9
    packets = encode_frames(audio, "pcm16", opus=True)  # an Opus call's early media
    assert 50 <= len(packets) <= 52 and all(packets)
    assert load_early_media("none") is None
    assert load_settings(sip_early_media=str(wav)).sip_early_media == str(wav)
    with pytest.raises(ValidationError, match="sip_early_media"):
        load_settings(sip_early_media="ringtone.mp3")
    (tmp_path / "bad.wav").write_bytes(b"not a wav")
    with pytest.raises(ValueError, match="sip_early_media: cannot read"):
        load_early_media(str(tmp_path / "bad.wav"))


async def test_a_call_nobody_accepts_is_rejected_with_480(world, caplog) -> None:
    app, engine, hooks = world
    caplog.set_level(logging.INFO, logger="voxline.realtime.transports")
    raw = RawSip(app.state.voxline.settings.sip_port)
    try:
        raw.request("INVITE", "unanswered", body=sdp_offer(4000))
        assert (await raw.response("unanswered", timeout=10)).status_code == 480
    finally:
        raw.close()
    assert "not accepted within 2 s: rejected (480)" in caplog.text
    await released(app, engine)


async def test_refer_sends_the_caller_a_refer_with_the_target(world) -> None:
    app, engine, hooks = world
    raw = RawSip(app.state.voxline.settings.sip_port)
    try:
        before = len(hooks)
        raw.request("INVITE", "transfer-me", body=sdp_offer(4000))
        call_id = (await incoming(hooks, before + 1))["data"]["call_id"]
        async with httpx.AsyncClient(base_url=api(app)) as http:
            early = await http.post(f"/v1/realtime/calls/{call_id}/refer",
                                    json={"target_uri": "tel:+14155550123"})
            assert early.status_code == 409  # not answered yet
            assert (await http.post(f"/v1/realtime/calls/{call_id}/accept",
                                    json={"type": "realtime"})).status_code == 200
            ok = await raw.response("transfer-me")
            assert ok.status_code == 200
            raw.request("ACK", "transfer-me", to_tag=tag_of(ok), content_type="")
            bad = await http.post(f"/v1/realtime/calls/{call_id}/refer",
                                  json={"target_uri": "http://example.com"})
            assert bad.status_code == 400
            assert (await http.post(f"/v1/realtime/calls/{call_id}/refer",
                                    json={"target_uri": "tel:+14155550123"})).status_code == 200
        refer = await next_request(raw, "REFER")
        assert refer.headers.get_first("refer-to") == "<tel:+14155550123>"
        assert refer.call_id == "transfer-me"
        call = app.state.voxline.calls[call_id]
        assert isinstance(call, SipCall)
        raw.request("BYE", "transfer-me", cseq=2, to_tag=tag_of(ok), content_type="")
        await released(app, engine)
    finally:
        raw.close()


def notify(raw: RawSip, call: str, cseq: int, to_tag: str, sipfrag: str) -> None:
    """The transferee's progress report on a REFER (RFC 3515 §2.4.5)."""
    raw.request("NOTIFY", call, cseq=cseq, to_tag=to_tag, content_type="message/sipfrag",
                body=f"{sipfrag}\r\n", extra=("Event: refer",
                                               "Subscription-State: terminated;reason=noresource"))


async def test_refer_progress_a_failure_keeps_the_call_a_success_ends_it(world) -> None:
    app, engine, hooks = world
    raw = RawSip(app.state.voxline.settings.sip_port)
    try:
        before = len(hooks)
        raw.request("INVITE", "transfer-notify", body=sdp_offer(4000))
        call_id = (await incoming(hooks, before + 1))["data"]["call_id"]
        url = api(app).replace("http", "ws") + f"/v1/realtime?call_id={call_id}"
        async with websockets.connect(url) as ws, httpx.AsyncClient(base_url=api(app)) as http:
            assert (await http.post(f"/v1/realtime/calls/{call_id}/accept",
                                    json={"type": "realtime"})).status_code == 200
            ok = await raw.response("transfer-notify")
            tag = tag_of(ok)
            raw.request("ACK", "transfer-notify", to_tag=tag, content_type="")
            refer = {"target_uri": "sip:desk@pbx.example"}
            assert (await http.post(f"/v1/realtime/calls/{call_id}/refer",
                                    json=refer)).status_code == 200
            await next_request(raw, "REFER")
            again = await http.post(f"/v1/realtime/calls/{call_id}/refer", json=refer)
            assert again.status_code == 409
            assert again.json()["error"]["code"] == "call_transfer_in_progress"
            notify(raw, "transfer-notify", 2, tag, "SIP/2.0 100 Trying")
            notify(raw, "transfer-notify", 3, tag, "SIP/2.0 486 Busy Here")
            failed = await until_event(ws, "error")
            assert failed["error"]["code"] == "call_transfer_failed"
            assert "sip:desk@pbx.example" in failed["error"]["message"]
            assert "486" in failed["error"]["message"]
            assert call_id in app.state.voxline.calls  # the call goes on
            assert (await http.post(f"/v1/realtime/calls/{call_id}/refer",
                                    json=refer)).status_code == 200  # a new try
            await next_request(raw, "REFER")
            notify(raw, "transfer-notify", 4, tag, "SIP/2.0 200 OK")
            bye = await next_request(raw, "BYE")
            assert bye.call_id == "transfer-notify"
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    await ws.recv()
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.reason == "transferred to sip:desk@pbx.example"
        await released(app, engine)
    finally:
        raw.close()


def test_webhook_signatures_follow_standard_webhooks() -> None:
    import base64
    import hashlib
    import hmac

    body = b'{"type":"realtime.call.incoming"}'
    signature = sip_webhook.sign(SECRET, "evt_1", 1700000000, body)
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    mac = hmac.new(key, b"evt_1.1700000000." + body, hashlib.sha256).digest()
    assert signature == "v1," + base64.b64encode(mac).decode()
    headers = {"webhook-id": "evt_1", "webhook-timestamp": "1700000000",
               "webhook-signature": f"v1,bm90aXQ= {signature}"}  # any listed one may match
    assert sip_webhook.verify(SECRET, headers, body)
    assert not sip_webhook.verify(SECRET, headers, body + b" ")
    assert not sip_webhook.verify("whsec_b3RoZXI=", headers, body)


async def test_webhook_delivery_retries_server_errors_and_stops_at_refusals() -> None:
    from live_server import free_port

    answers = [503, 200, 404]
    seen: list[str] = []
    receiver = FastAPI()

    @receiver.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @receiver.post("/hooks")
    async def hook(request: Request) -> Response:
        seen.append(request.headers["webhook-id"])
        return Response(status_code=answers.pop(0))

    event = sip_webhook.incoming_call_event("rtc_1", [("Via", "v"), ("To", "t"), ("From", "f")])
    assert [h["name"] for h in event["data"]["sip_headers"]] == ["From", "To", "Via"]
    with serve_app(receiver, free_port(), name="hooks") as base:
        assert await sip_webhook.deliver(base + "/hooks", SECRET, event, timeout=5, retries=2)
        assert seen == [event["id"]] * 2  # one 503, then 200: the same webhook id
        assert not await sip_webhook.deliver(base + "/hooks", SECRET, event, timeout=5,
                                             retries=2)  # a 404 is not retried
        assert len(seen) == 3
        assert not await sip_webhook.deliver(f"http://127.0.0.1:{free_port()}/x", None, event,
                                             timeout=1, retries=0)  # nobody listening


async def test_a_call_whose_webhook_cannot_be_delivered_is_rejected_with_480(caplog) -> None:
    from live_server import free_port

    caplog.set_level(logging.INFO, logger="voxline.realtime.transports")
    with sip_server(sip_webhook_url=f"http://127.0.0.1:{free_port()}/hooks",
                    sip_webhook_retries=0, sip_webhook_timeout=1.0) as (app, engine):
        raw = RawSip(app.state.voxline.settings.sip_port)
        try:
            raw.request("INVITE", "nobody-home", body=sdp_offer(4000))
            assert (await raw.response("nobody-home")).status_code == 480
        finally:
            raw.close()
        await released(app, engine)
    assert "the webhook was not delivered: rejected (480)" in caplog.text


async def test_a_call_ringing_when_the_server_drains_gets_503_with_retry_after() -> None:
    with stand_in_app() as (url, hooks), sip_server(
            sip_webhook_url=url, sip_webhook_secret=SECRET, sip_accept_timeout=30.0) as (
            app, engine):
        raw = RawSip(app.state.voxline.settings.sip_port)
        try:
            raw.request("INVITE", "ringing-drain", body=sdp_offer(4000))
            await incoming(hooks, 1)  # the app has not decided yet
            asyncio.run_coroutine_threadsafe(app.state.voxline.host.drain(10), app.state.sip.loop)
            refused = await raw.response("ringing-drain")
            assert refused.status_code == 503
            assert refused.headers.get_first("retry-after") == "5"
        finally:
            raw.close()
        await released(app, engine)
