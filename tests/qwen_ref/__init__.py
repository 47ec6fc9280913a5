"""Parity harness for the Qwen3-TTS reference (``qwen-tts``); see harness.py."""
