"""`POST /v1/realtime/client_secrets` without models (engine = the echo core): issuing,
using, expiring and refusing short-lived tokens, in OpenAI's error shape."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from voxline.config import load_settings
from voxline.engines.client import InProcessEngineClient
from voxline.realtime.app import create_app
from voxline.realtime.auth import ClientSecrets

ECHO = "echo_core:make_echo_core"
KEY = {"Authorization": "Bearer s3cret"}


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def client_and_clock():
    app = create_app(load_settings(api_key="s3cret"), InProcessEngineClient(ECHO))
    clock = Clock()
    app.state.voxline.client_secrets = ClientSecrets(clock=clock)
    with TestClient(app) as client:
        yield client, clock


def test_a_client_secret_opens_a_session_with_its_config_until_it_expires(client_and_clock):
    client, clock = client_and_clock
    r = client.post("/v1/realtime/client_secrets", headers=KEY, json={
        "expires_after": {"anchor": "created_at", "seconds": 60},
        "session": {"type": "realtime", "instructions": "Be brief."}})
    assert r.status_code == 200
    body = r.json()
    assert body["value"].startswith("ek_") and body["expires_at"] == 1_000_060
    assert body["session"]["instructions"] == "Be brief."
    token = body["value"]
    # the browser's way: the key subprotocol carries the token
    with client.websocket_connect(
            "/v1/realtime", subprotocols=["realtime", f"openai-insecure-api-key.{token}"]) as ws:
        created = ws.receive_json()
        assert created["type"] == "session.created"
        assert created["session"]["instructions"] == "Be brief."
    clock.now += 61
    with pytest.raises(WebSocketDisconnect) as refused:
        with client.websocket_connect("/v1/realtime",
                                      headers={"Authorization": f"Bearer {token}"}) as ws:
            ws.receive_json()
    assert refused.value.code == 1008 and refused.value.reason == "client secret has expired"
    r = client.post("/v1/realtime/calls", content="v=0",
                    headers={"Authorization": f"Bearer {token}",
                             "Content-Type": "application/sdp"})
    assert r.status_code == 401
    assert r.json() == {"error": {"message": "unknown client secret", "type":
                                  "invalid_request_error", "param": None,
                                  "code": "invalid_api_key"}}


def test_wrong_tokens_and_bad_requests_are_refused(client_and_clock):
    client, _ = client_and_clock
    assert client.post("/v1/realtime/client_secrets", json={}).status_code == 401
    r = client.post("/v1/realtime/calls", content="v=0",
                    headers={"Authorization": "Bearer ek_forged",
                             "Content-Type": "application/sdp"})
    assert r.status_code == 401 and r.json()["error"]["message"] == "unknown client secret"
    # a client secret cannot mint another
    token = client.post("/v1/realtime/client_secrets", headers=KEY).json()["value"]
    r = client.post("/v1/realtime/client_secrets",
                    headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 401
    r = client.post("/v1/realtime/client_secrets", headers=KEY,
                    json={"expires_after": {"seconds": 5}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "expires_after.seconds"
    r = client.post("/v1/realtime/client_secrets", headers=KEY,
                    json={"session": {"type": "realtime", "temperature": 9}})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("session")
    r = client.post("/v1/realtime/client_secrets", headers=KEY, content=b"{nope")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
