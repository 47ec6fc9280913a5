"""Model adapters for the shipped models (VAD, ASR, LLM, TTS) and model code of our own."""
