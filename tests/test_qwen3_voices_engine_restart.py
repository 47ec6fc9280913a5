"""Session voices on a server that clones (random-weight Base checkpoint): a voice that
is neither registered nor an OpenAI voice name is refused naming the field, and
registered voices survive an engine restart (the server registers its stored voices with
the supervisor's fresh engine process; slow: two engine processes start)."""

from __future__ import annotations

import base64
import logging
import os
import signal
import time

import numpy as np
import pytest
from conftest import TIME_FACTOR
from fastapi.testclient import TestClient
from test_qwen3_voice_clone_api import clip_wav, write_base_checkpoint

from voxline.config import Settings
from voxline.engines.client import InProcessEngineClient
from voxline.engines.process import MultiprocessEngineClient
from voxline.realtime.app import create_app


def wait_for(pred, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout * TIME_FACTOR
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def spoken_reply(client: TestClient, voice: str) -> np.ndarray:
    """A `/v1/realtime` reply's audio with `session.audio.output.voice` = `voice`."""
    with client.websocket_connect("/v1/realtime") as ws:
        assert ws.receive_json()["type"] == "session.created"
        ws.send_json({"type": "session.update", "session": {
            "type": "realtime", "audio": {"output": {"voice": voice}}}})
        ws.send_json({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "hello"}]}})
        ws.send_json({"type": "response.create"})
        pcm = b""
        while (event := ws.receive_json())["type"] != "response.done":
            assert event["type"] != "error", event
            if event["type"] == "response.output_audio.delta":
                pcm += base64.b64decode(event["delta"])
    assert event["response"]["status"] == "completed"
    return np.frombuffer(pcm, dtype="<i2")


def test_an_unknown_session_voice_is_an_error_naming_the_field(tmp_path):
    base_dir = write_base_checkpoint(tmp_path / "model")
    engine = InProcessEngineClient("test_qwen3_voice_clone_api:make_clone_core",
                                   {"model_dir": str(base_dir)})
    app = create_app(Settings(tts=f"qwen3:{base_dir}"), engine)
    with TestClient(app) as client:
        wait_for(lambda: client.get("/health").status_code == 200, "the engine")
        r = client.post("/v1/voices", data={"name": "known"},
                        files={"audio": ("ref.wav", clip_wav(seed=5), "audio/wav")})
        assert r.status_code == 201, r.text
        with client.websocket_connect("/v1/realtime") as ws:
            assert ws.receive_json()["type"] == "session.created"
            ws.send_json({"type": "session.update", "session": {
                "type": "realtime", "audio": {"output": {"voice": "nobody"}}}})
            err = ws.receive_json()
            assert err["type"] == "error", err
            assert err["error"]["param"] == "session.audio.output.voice"
            assert "'nobody' does not exist" in err["error"]["message"]
            assert "known" in err["error"]["message"]  # says which voices there are
            ws.send_json({"type": "response.create", "response": {"voice": "nobody"}})
            err = ws.receive_json()
            assert err["type"] == "error" and err["error"]["param"] == "response.audio.output.voice"
            # The session lives on: a registered voice and an OpenAI name are accepted.
            for voice in ("KNOWN", "alloy"):
                ws.send_json({"type": "session.update", "session": {
                    "type": "realtime", "audio": {"output": {"voice": voice}}}})
                event = ws.receive_json()
                assert event["type"] == "session.updated", event
                assert event["session"]["audio"]["output"]["voice"] == voice


@pytest.mark.slow
def test_registered_voices_are_registered_again_after_an_engine_restart(tmp_path, caplog):
    base_dir = write_base_checkpoint(tmp_path / "model")
    engine = MultiprocessEngineClient("test_qwen3_voice_clone_api:make_clone_core",
                                      {"model_dir": str(base_dir)})
    app = create_app(Settings(tts=f"qwen3:{base_dir}"), engine)
    caplog.set_level(logging.INFO, logger="voxline.realtime.http.voices")
    with TestClient(app) as client:
        wait_for(lambda: client.get("/health").status_code == 200, "the engine")
        r = client.post("/v1/voices", data={"name": "keeper"},
                        files={"audio": ("ref.wav", clip_wav(seed=4), "audio/wav")})
        assert r.status_code == 201, r.text
        before = spoken_reply(client, "keeper")
        default = spoken_reply(client, "alloy")
        assert len(before) and not np.array_equal(before, default), "the clone is audible"

        os.kill(engine.status()["pid"], signal.SIGKILL)
        wait_for(lambda: engine.status()["restarts"] == 1 and engine.ready, "the restart")
        wait_for(lambda: "registered 1 voices with the restarted engine" in caplog.text,
                 "the voices to be registered again")
        assert [v["name"] for v in client.get("/v1/voices").json()["data"]] == ["keeper"]
        after = spoken_reply(client, "keeper")
    assert np.array_equal(before, after), "the restarted engine speaks with the same clone"
