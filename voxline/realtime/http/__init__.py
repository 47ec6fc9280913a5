"""The HTTP APIs: `/v1/audio/speech`, `/v1/audio/transcriptions`, `/v1/videos`, `/v1/voices`, their shared request plumbing and the web demo page."""
