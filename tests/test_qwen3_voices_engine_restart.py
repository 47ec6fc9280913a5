"""Registered voices survive an engine restart: the server registers its stored voices
with the supervisor's fresh engine process (random-weight Base checkpoint; slow: two
engine processes start)."""

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
from voxline.engines.process import MultiprocessEngineClient
from voxline.realtime.app import create_app

pytestmark = pytest.mark.slow


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


def test_registered_voices_are_registered_again_after_an_engine_restart(tmp_path, caplog):
    base_dir = write_base_checkpoint(tmp_path / "model")
    engine = MultiprocessEngineClient("test_qwen3_voice_clone_api:make_clone_core",
                                      {"model_dir": str(base_dir)})
    app = create_app(Settings(tts=f"qwen3:{base_dir}"), engine)
    caplog.set_level(logging.INFO, logger="voxline.realtime.voices")
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
