"""Server edges without models (engine = the echo core): auth, limits, health, metrics."""

from __future__ import annotations

import time
from typing import Any

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from voxline.config import load_settings
from voxline.engines.client import InProcessEngineClient
from voxline.realtime.app import create_app

ECHO = "echo_core:make_echo_core"


def make_client(**settings) -> TestClient:
    app = create_app(load_settings(**settings), InProcessEngineClient(ECHO))
    return TestClient(app)


def test_api_key_is_required_when_configured():
    with make_client(api_key="s3cret") as client:
        with pytest.raises(WebSocketDisconnect) as refused:
            with client.websocket_connect("/v1/realtime") as ws:
                ws.receive_json()
        assert refused.value.code == 1008
        with client.websocket_connect("/v1/realtime",
                                      headers={"Authorization": "Bearer s3cret"}) as ws:
            assert ws.receive_json()["type"] == "session.created"
        with client.websocket_connect(
                "/v1/realtime", subprotocols=["realtime", "openai-insecure-api-key.s3cret"]) as ws:
            assert ws.accepted_subprotocol == "realtime"
            assert ws.receive_json()["type"] == "session.created"
        with pytest.raises(WebSocketDisconnect):
            with client.websocket_connect("/v1/realtime",
                                          headers={"Authorization": "Bearer wrong"}) as ws:
                ws.receive_json()


def _closed(client: TestClient, ws: Any) -> None:
    """Close `ws` and wait until the server has finished with it: the test client's own
    exit cancels a handler still cleaning up, which surfaced as a CancelledError there."""
    ws.close()
    deadline = time.monotonic() + 30
    while not client.app.state.voxline.host.idle:
        assert time.monotonic() < deadline, "the server never finished the closed session"
        time.sleep(0.01)


def _ready(client: TestClient) -> None:
    """Wait until the engine is up (before it, a session is refused as not ready)."""
    deadline = time.monotonic() + 30
    while client.get("/health").status_code != 200:
        assert time.monotonic() < deadline, "the engine never became ready"
        time.sleep(0.01)


def test_sessions_over_the_limit_are_refused_with_a_reason():
    with make_client(max_sessions=1) as client:
        _ready(client)
        with client.websocket_connect("/v1/realtime") as first:
            assert first.receive_json()["type"] == "session.created"
            with client.websocket_connect("/v1/realtime") as second:
                with pytest.raises(WebSocketDisconnect) as refused:
                    second.receive_json()
            assert refused.value.code == 1013 and "limit of 1 sessions" in refused.value.reason
            _closed(client, first)
        metrics = client.get("/metrics").text
        assert "voxline_sessions_total 1" in metrics
        assert "voxline_sessions_refused_total 1" in metrics
        assert "voxline_first_audio_seconds_bucket" in metrics


def test_health_models_and_not_ready():
    with make_client() as client:
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert client.get("/v1/models").json()["data"][0]["id"] == "voxline"
    app = create_app(load_settings(), InProcessEngineClient(ECHO), manage_engine=False)
    with TestClient(app) as client:
        health = client.get("/health")
        assert health.status_code == 503
        assert health.json()["status"] == "unavailable" and health.json()["reason"]


def test_session_update_and_errors_over_the_echo_engine():
    with make_client() as client, client.websocket_connect("/v1/realtime") as ws:
        assert ws.receive_json()["type"] == "session.created"
        ws.send_json({"type": "session.update", "session": {
            "type": "realtime", "instructions": "Be brief.",
            "audio": {"input": {"turn_detection": {"type": "server_vad",
                                                   "silence_duration_ms": 800}}}}})
        updated = ws.receive_json()
        assert updated["type"] == "session.updated"
        td = updated["session"]["audio"]["input"]["turn_detection"]
        assert td["silence_duration_ms"] == 800 and td["threshold"] == 0.5  # deep-merged
        assert updated["session"]["instructions"] == "Be brief."
        ws.send_text("[1, 2]")
        err = ws.receive_json()
        assert err["type"] == "error" and err["error"]["code"] == "invalid_request_error"
        ws.send_json({"type": "response.cancel", "event_id": "x"})
        err = ws.receive_json()
        assert err["error"]["code"] == "response_cancel_not_active"
        assert err["error"]["event_id"] == "x"


def test_session_time_limit_ends_the_session_with_an_error():
    with make_client(max_session_seconds=0.5) as client, client.websocket_connect("/v1/realtime") as ws:
        assert ws.receive_json()["type"] == "session.created"
        err = ws.receive_json()
        assert err["type"] == "error" and err["error"]["code"] == "session_expired"
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 1000


def test_a_deeply_nested_message_is_an_error_and_the_session_lives_on():
    with make_client() as client:
        with client.websocket_connect("/v1/realtime") as ws:
            assert ws.receive_json()["type"] == "session.created"
            ws.send_text("[" * 50_000 + "]" * 50_000)
            err = ws.receive_json()
            assert err["type"] == "error" and err["error"]["code"] == "invalid_json"
            ws.send_text('{"type": "conversation.item.retrieve", "item_id": "x", '
                         '"event_id": "after"}')
            err = ws.receive_json()  # still served: the item does not exist
            assert err["error"]["code"] == "item_retrieve_invalid_item_id"
            assert err["error"]["event_id"] == "after"


def test_a_client_that_reconnects_at_once_finds_its_slot_free(monkeypatch):
    # the engine confirms a stream's close some time after the client left (slow here);
    # the slot is the client's, so it is free as soon as the client has gone
    from voxline.engines.client import StreamHandle

    confirmed = []
    close = StreamHandle.aclose

    async def slow_close(self, *args, **kwargs):
        import asyncio

        await asyncio.sleep(1.0)
        await close(self, *args, **kwargs)
        confirmed.append(self.stream_id)

    monkeypatch.setattr(StreamHandle, "aclose", slow_close)
    with make_client(max_sessions=1) as client:
        with client.websocket_connect("/v1/realtime") as first:
            assert first.receive_json()["type"] == "session.created"
        with client.websocket_connect("/v1/realtime") as second:
            assert second.receive_json()["type"] == "session.created"
            assert not confirmed  # the first stream is still closing in the engine
            with client.websocket_connect("/v1/realtime") as third:  # the limit still holds
                with pytest.raises(WebSocketDisconnect) as refused:
                    third.receive_json()
            assert refused.value.code == 1013
