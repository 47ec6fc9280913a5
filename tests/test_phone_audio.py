"""Phone audio through a session's edges: 8 kHz μ-law in 20 ms frames to the engine's
16 kHz, and the TTS's 22 050 Hz back to 8 kHz μ-law frames. Streaming equals one-shot,
and chunk joins add no clicks."""

from __future__ import annotations

import numpy as np

from voxline.codecs.g711 import float_to_ulaw, ulaw_to_float
from voxline.sessions.audio import InputConverter, OutputEncoder


def sweep(seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * (200 + 400 * t) * t)).astype(np.float32)


def test_caller_frames_convert_as_one_shot() -> None:
    ulaw = float_to_ulaw(sweep(1.0, 8000))
    framed = InputConverter("ulaw", 8000)
    chunks = [framed.convert(ulaw[i:i + 160]) for i in range(0, len(ulaw), 160)]
    whole = InputConverter("ulaw", 8000).convert(ulaw)
    np.testing.assert_allclose(np.concatenate(chunks), whole, atol=1e-6)
    assert framed.received_ms == 1000


def test_reply_chunks_encode_as_one_shot_without_clicks() -> None:
    audio = sweep(1.0, 22050)
    pieces = np.array_split(audio, [1000, 1001, 4000, 9000, 15000])  # odd sizes, a 1-sample one
    streamed = OutputEncoder("ulaw", 8000, frame_ms=20)
    frames = [f for p in pieces for f in streamed.push(p, 22050)] + streamed.flush()
    oneshot = OutputEncoder("ulaw", 8000, frame_ms=20)
    reference = oneshot.push(audio, 22050) + oneshot.flush()
    assert b"".join(f for f, _ in frames) == b"".join(f for f, _ in reference)
    assert all(len(f) == 160 for f, _ in frames[:-1])
    out = ulaw_to_float(b"".join(f for f, _ in frames))
    # a click is a jump far beyond what the sweep's slope and μ-law steps allow
    jumps = np.abs(np.diff(out[400:-400]))
    assert jumps.max() < 0.5 * 2 * np.pi * 600 / 8000 * 1.5 + 0.02
