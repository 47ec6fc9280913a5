"""Audio representation: PCM16/float32, resampling, G.711, WAV, Opus, framing."""
