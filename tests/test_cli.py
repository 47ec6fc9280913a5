"""The `voxline` command line, run as a user would (subprocess, real models)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from speech import espeak_wav

from voxline.codecs.wav import read_wav


def voxline(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "voxline.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_help_lists_the_subcommands():
    out = voxline("--help")
    assert out.returncode == 0
    for cmd in ("serve", "converse", "say"):
        assert cmd in out.stdout
    serve = voxline("serve", "--help")
    assert serve.returncode == 0 and "--port" in serve.stdout and "--api-key" in serve.stdout


def test_say_writes_speech(tmp_path):
    out = voxline("say", "Hello there, this is a test.", "--output", str(tmp_path / "s.wav"))
    assert out.returncode == 0, out.stderr
    audio, rate = read_wav(tmp_path / "s.wav")
    assert rate == 24000 and 0.8 < len(audio) / rate < 5 and np.abs(audio).max() > 0.1


def test_converse_answers_a_spoken_question(tmp_path):
    question = espeak_wav("What is the capital of France?")
    out = voxline("converse", "--input", str(question), "--output", str(tmp_path / "r.wav"))
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(":", 1) for line in out.stdout.splitlines() if ":" in line)
    assert "capital" in lines["you said"].lower()
    assert "paris" in lines["reply"].lower()
    assert "ASR" in lines["timing"] and "LLM" in lines["timing"] and "TTS" in lines["timing"]
    assert "first reply audio" in lines["latency"]
    audio, rate = read_wav(tmp_path / "r.wav")
    assert rate == 24000 and len(audio) / rate > 0.5


@pytest.mark.parametrize("bad", [["converse", "--input", "/nonexistent.wav", "--output", "x.wav"]])
def test_bad_input_is_a_clear_error(bad):
    out = voxline(*bad)
    assert out.returncode == 1 and "error" in out.stderr and "nonexistent" in out.stderr
