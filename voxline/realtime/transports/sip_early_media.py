"""Early media while a SIP call rings: what the caller hears between the 183 Session
Progress (with the SDP answer) and the 200 OK, as ``sip_early_media`` chooses.

- ``ringback``: the North American ringback tone (440 + 480 Hz, 2 s on, 4 s off);
- a WAV file's path: that file, looped (any rate or channel count ``voxline.codecs``
  reads; resampled to 8 kHz);
- ``none``: no early media (a plain 180 Ringing; the phone rings by itself).

The audio is prepared once per server as 8 kHz float samples and encoded to the call's
G.711 law through ``voxline.codecs``; :class:`EarlyMedia` keeps the call's paced RTP
queue a little ahead until the app decides.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np

from voxline.aio import cancel_and_wait
from voxline.codecs import float_to_alaw, float_to_ulaw, read_wav, resample
from voxline.codecs.opus import OpusEncoder
from voxline.sessions.settings import AudioEncoding

RATE = 8000
FRAME_SAMPLES = 160  # 20 ms at 8 kHz
LEAD_FRAMES = 10  # keep 200 ms queued: the pacer never runs dry, a stop drops little
RINGBACK_HZ = (440.0, 480.0)
RINGBACK_ON_S, RINGBACK_OFF_S = 2.0, 4.0
RINGBACK_LEVEL = 0.12  # each tone's peak (about -21 dBFS): a ringback, not a siren


def ringback_tone() -> np.ndarray:
    """One 6 s cycle of the ringback tone, 8 kHz float."""
    t = np.arange(int(RINGBACK_ON_S * RATE)) / RATE
    on = sum(RINGBACK_LEVEL * np.sin(2 * np.pi * hz * t) for hz in RINGBACK_HZ)
    ramp = np.minimum(1.0, np.minimum(t, t[-1] - t) / 0.01)  # 10 ms fades: no clicks
    off = np.zeros(int(RINGBACK_OFF_S * RATE))
    return np.concatenate([on * ramp, off]).astype(np.float32)


def load_early_media(spec: str) -> np.ndarray | None:
    """The 8 kHz samples `spec` (``sip_early_media``) names, None for ``none``; raises
    ValueError naming the setting when the WAV cannot be read."""
    if spec == "none":
        return None
    if spec == "ringback":
        return ringback_tone()
    try:
        audio, rate = read_wav(Path(spec))
    except (OSError, ValueError) as exc:
        raise ValueError(f"sip_early_media: cannot read the WAV file {spec!r} ({exc})") from None
    if audio.size == 0:
        raise ValueError(f"sip_early_media: the WAV file {spec!r} holds no audio")
    audio = resample(audio, rate, RATE)
    pad = -audio.size % FRAME_SAMPLES  # whole frames, so the loop stays in step
    return np.concatenate([audio, np.zeros(pad, np.float32)])


def encode_frames(audio: np.ndarray, law: AudioEncoding, *, opus: bool = False) -> list[bytes]:
    """`audio` (8 kHz float) as 20 ms RTP payloads: Opus packets, or G.711 in `law`."""
    if opus:
        encoder = OpusEncoder(RATE, application="voip")
        return encoder.encode(audio) + encoder.flush()
    encoded = (float_to_ulaw if law == "ulaw" else float_to_alaw)(audio)
    return [encoded[i:i + FRAME_SAMPLES] for i in range(0, len(encoded), FRAME_SAMPLES)]


class EarlyMedia:
    """Loops one call's early-media frames into its paced RTP queue until stopped."""

    def __init__(self, frames: list[bytes], send: Callable[[list[bytes]], None],
                 queued: Callable[[], int], drop: Callable[[], None]) -> None:
        self._frames = frames
        self._send = send
        self._queued = queued
        self._drop = drop
        self._next = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def playing(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        self._task = asyncio.create_task(self._feed(), name="sip-early-media")

    async def _feed(self) -> None:
        while True:
            want = LEAD_FRAMES - self._queued()
            if want > 0:
                batch = [self._frames[(self._next + i) % len(self._frames)] for i in range(want)]
                self._next = (self._next + want) % len(self._frames)
                self._send(batch)
            await asyncio.sleep(0.06)

    async def stop(self) -> None:
        """Stop feeding and drop what is still queued: the call's own audio follows."""
        task, self._task = self._task, None
        if task is None:
            return
        await cancel_and_wait(task)
        self._drop()
