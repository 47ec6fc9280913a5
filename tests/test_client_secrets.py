"""`POST /v1/realtime/client_secrets` without models (engine = the echo core): issuing,
using, expiring and refusing short-lived tokens, in OpenAI's error shape."""

from __future__ import annotations

import base64
import json

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from voxline.config import load_settings
from voxline.engines.client import InProcessEngineClient
from voxline.realtime.app import create_app
from voxline.realtime.auth.access import ClientSecret, ClientSecrets
from voxline.realtime.auth.signed_tokens import SigningKeys

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


# --- stateless tokens: any server with the signing keys verifies them ------------------

KEY_A, KEY_B = "a" * 32, "b" * 32


def _app(**settings):
    return create_app(load_settings(api_key="s3cret", **settings), InProcessEngineClient(ECHO))


def test_a_token_minted_on_one_server_opens_a_session_on_another_with_the_same_keys():
    with TestClient(_app(client_secret_keys=KEY_A)) as one, \
            TestClient(_app(client_secret_keys=KEY_A)) as other, \
            TestClient(_app(client_secret_keys=KEY_B)) as stranger:
        token = one.post("/v1/realtime/client_secrets", headers=KEY, json={
            "session": {"type": "realtime", "instructions": "Be brief."}}).json()["value"]
        with other.websocket_connect(
                "/v1/realtime", subprotocols=["realtime", f"openai-insecure-api-key.{token}"]) as ws:
            created = ws.receive_json()
            assert created["session"]["instructions"] == "Be brief."
        with pytest.raises(WebSocketDisconnect) as refused:
            with stranger.websocket_connect("/v1/realtime",
                                            headers={"Authorization": f"Bearer {token}"}) as ws:
                ws.receive_json()
        assert refused.value.code == 1008 and refused.value.reason == "unknown client secret"


def test_rotation_signs_with_the_current_key_and_still_accepts_the_previous():
    clock = Clock()
    old = ClientSecrets(SigningKeys.parse(KEY_A), clock=clock)
    rotated = ClientSecrets(SigningKeys.parse(f"{KEY_B},{KEY_A}"), clock=clock)
    retired = ClientSecrets(SigningKeys.parse(KEY_B), clock=clock)
    before = old.issue(60, None).value
    after = rotated.issue(60, None).value
    assert isinstance(rotated.check(before), ClientSecret)  # the previous key still verifies
    assert isinstance(retired.check(after), ClientSecret)  # new tokens: the current key
    assert retired.check(before) == "unknown client secret"  # the old key retired
    clock.now += 61
    assert rotated.check(before) == "client secret has expired"


def test_a_tampered_token_is_refused():
    secrets = ClientSecrets(SigningKeys.parse(KEY_A), clock=Clock())
    token = secrets.issue(60, None, {"type": "realtime", "instructions": "x"}).value
    body, _, sig = token.removeprefix("ek_").partition(".")
    payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    payload["exp"] += 10_000  # a longer life, signature unchanged
    forged = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    for bad in (f"ek_{forged}.{sig}", token[:-2], "ek_", "ek_x.y", token + "."):
        assert secrets.check(bad) == "unknown client secret", bad
    assert isinstance(secrets.check(token), ClientSecret)
    assert secrets.check(token).settings.instructions == "x"  # type: ignore[union-attr]


def test_keys_too_short_or_missing_are_refused_naming_the_setting():
    with pytest.raises(ValueError, match="client_secret_keys: key 2 is shorter than 16"):
        SigningKeys.parse(f"{KEY_A},short")
    with pytest.raises(ValueError, match="client_secret_keys holds no key"):
        SigningKeys.parse(" , ")
