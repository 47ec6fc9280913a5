"""Barge-in end to end with real third-party realtime clients: pipecat's
OpenAIRealtimeLLMService, the OpenAI Agents SDK's RealtimeRunner and LiveKit Agents' OpenAI
realtime plugin, each pointed at a live voxline server through its documented base-URL
setting (slow).

The clients pin versions that clash with the project venv, so they live in their own
cached venv (scripts/clients_venv.sh) and run as subprocesses: tests/third_party/*.py hold
a conversation (a text turn, a spoken question, a second utterance over the answer, the
answer to that) and print a JSON summary of every event each way, which is asserted here.
Without the clients venv the tests skip, except under CI (``CI`` set), whose `make test`
builds it: there they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import TIME_FACTOR
from live_server import live_server
from speech import espeak

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DRIVERS = Path(__file__).resolve().parent / "third_party"
QUESTION = "Tell me about the history of the city of Paris."
BARGE_IN = "Stop please. What is the capital of Spain?"


@pytest.fixture(scope="module")
def clients_python() -> str:
    """The clients venv's python (built on first use; cached by scripts/clients_venv.sh)."""
    try:
        proc = subprocess.run(["bash", str(ROOT / "scripts" / "clients_venv.sh")],
                              capture_output=True, text=True, timeout=1800,
                              stdin=subprocess.DEVNULL)
        reason = None if proc.returncode == 0 else (
            f"clients_venv.sh exited {proc.returncode}: "
            + " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-5:]))
    except (OSError, subprocess.TimeoutExpired) as exc:
        reason = f"clients_venv.sh failed to run: {exc}"
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"third-party clients venv unavailable under CI: {reason}")
        pytest.skip(f"third-party clients venv unavailable: {reason}")
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def server():
    with live_server() as base:
        yield base.replace("http://", "ws://")


def _write_wav(path: Path, text: str, lead_s: float = 0.3) -> Path:
    """espeak-ng speech as 24 kHz mono PCM16, what realtime clients send."""
    audio = np.concatenate([np.zeros(int(lead_s * 24000), np.float32), espeak(text, rate=24000)])
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    return path


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("third-party-speech")
    return _write_wav(tmp / "question.wav", QUESTION), _write_wav(tmp / "barge.wav", BARGE_IN)


def run_driver(python: str, script: str, url: str, speech: tuple[Path, Path]) -> dict[str, Any]:
    wait_s = 90 * TIME_FACTOR
    env = {k: v for k, v in os.environ.items()
           if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "pythonpath")}
    env |= {"NO_PROXY": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [python, str(DRIVERS / script), url, str(speech[0]), str(speech[1]), str(wait_s)],
        capture_output=True, text=True, timeout=wait_s * 4 + 60, env=env, cwd=DRIVERS,
        stdin=subprocess.DEVNULL,
    )
    lines = proc.stdout.strip().splitlines()
    if not lines or not lines[-1].startswith("{"):
        pytest.fail(f"{script} exited {proc.returncode} without a summary; stderr tail:\n"
                    + "\n".join(proc.stderr.strip().splitlines()[-30:]))
    summary = json.loads(lines[-1])
    summary["stderr_tail"] = proc.stderr.strip().splitlines()[-15:]
    # Shown by pytest -s, and by CI's log when an assertion below fails.
    sys.stderr.write(f"\n{script} summary:\n{json.dumps(summary, indent=1)}\n")
    return summary


def check_barge_in(s: dict[str, Any]) -> None:
    """What any conforming server must give a real client through a barge-in session."""
    where = "\n".join(s["timeline"])
    # Errors first: they are the usual reason a driver then timed out.
    assert s["errors"] == [], f"{s['client']} got error events: {s['errors']}\n{where}"
    assert s["notes"] == [], f"{s['client']} reported errors: {s['notes']}\n{where}"
    assert s["failure"] is None, f"{s['client']}: {s['failure']}\n{where}"

    by_phase = {p: [r for r in s["responses"] if r["phase"] == p]
                for p in ("text", "question", "barge")}
    text = by_phase["text"]
    assert text and text[0]["status"] == "completed" and text[0]["audio_bytes"] > 0, text

    # The interruption happened: the client truncated what it had played and/or the
    # server cut the answer short when the second utterance began.
    cancelled = [r for r in by_phase["question"] if r["status"] == "cancelled"]
    assert s["truncates"] or cancelled, f"no interruption seen\n{where}"
    if s["barge_in_while"]["response_in_progress"]:
        assert cancelled, f"the answer was in progress at the barge-in but not cancelled\n{where}"
    truncated_items = {e["item_id"] for e in s["truncated"]}
    for t in s["truncates"]:
        sent_ms = s["item_audio_ms"].get(t["item_id"], 0)
        # The client may only truncate within the audio it received.
        assert t["audio_end_ms"] <= sent_ms + 1, (t, sent_ms)
        assert t["item_id"] in truncated_items, f"truncate not confirmed: {t}\n{where}"

    # The follow-up turn: a completed, spoken answer.
    followups = [r for r in by_phase["barge"] if r["status"] == "completed"]
    assert followups and followups[-1]["audio_bytes"] > 0, f"{by_phase['barge']}\n{where}"

    for r in s["responses"]:
        if r["audio_bytes"] > 0:
            assert r["transcript"].strip(), f"empty assistant transcript: {r}"


def test_pipecat_openai_realtime_barge_in(clients_python, server, speech):
    s = run_driver(clients_python, "pipecat_bargein.py", server, speech)
    check_barge_in(s)
    # With server VAD pipecat truncates on speech_started (its playback is still going)
    # and leaves cancelling the response to the server's turn detection.
    if s["barge_in_while"]["speaker_playing"]:
        assert s["truncates"], "pipecat sent no conversation.item.truncate on speech_started"
    assert s["interruption_frames"] >= 1, s


def test_openai_agents_realtime_barge_in(clients_python, server, speech):
    s = run_driver(clients_python, "agents_bargein.py", server, speech)
    check_barge_in(s)
    # The SDK's truncate comes from its playback tracker: what the speaker really played.
    if s["barge_in_while"]["speaker_playing"]:
        assert s["truncates"], "openai-agents sent no conversation.item.truncate on speech_started"
        assert s["audio_interrupted_events"] >= 1, s


def test_livekit_realtime_barge_in(clients_python, server, speech):
    s = run_driver(clients_python, "livekit_bargein.py", server, speech)
    # LiveKit's agent layer sends response.cancel on speech_started (and again while the
    # reply still generates) as the server's turn detection cancels the reply itself. Those
    # cancels name the reply the barge-in ended, so they are answered by nothing (OpenAI
    # answers them with an error LiveKit has to recognise by its message); any error event,
    # or any error LiveKit raised to the application (s["notes"]), fails.
    assert s["cancels"], "livekit sent no response.cancel at the barge-in"
    check_barge_in(s)
    assert s["interruptions"] >= 1, s
    if s["barge_in_while"]["speaker_playing"]:
        assert s["truncates"], "livekit sent no conversation.item.truncate after interrupt()"
    # The agent's pre-filled history (a user and an assistant message) went in at
    # previous_item_id "root", then after each other, and the text turn after them; the
    # plugin's mirror of the conversation is the server's, in the server's order.
    added = s["items_added"]
    assert added[0]["previous_item_id"] is None, added
    assert [i["role"] for i in added[:3]] == ["user", "assistant", "user"], added
    assert [i["id"] for i in s["chat_ctx"]] == [i["item_id"] for i in added], s["chat_ctx"]
    assert s["livekit_warnings"] == [], s["livekit_warnings"]
