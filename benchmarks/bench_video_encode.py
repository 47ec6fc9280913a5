"""CPU cost of encoding one call video frame with aiortc's own encoders (VP8, H.264).

aiortc's RTP sender runs `encoder.encode` on its executor thread, so this is CPU taken
from a worker thread per frame, not event-loop time. Run:
``python benchmarks/bench_video_encode.py [--width 640 --height 384 --frames 60]``.
Random frames are the worst case for an encoder; generated video costs less.
"""

from __future__ import annotations

import argparse
import fractions
import time

import av
import numpy as np
from aiortc.codecs import get_encoder
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

CODECS = {"VP8": "video/VP8", "H264": "video/H264"}


def encode_ms(mime: str, width: int, height: int, frames: int) -> tuple[np.ndarray, np.ndarray]:
    """(CPU ms, wall ms) per frame, the first 5 frames (encoder warm-up) left out."""
    encoder = get_encoder(RTCRtpCodecParameters(mimeType=mime, clockRate=90000,
                                                payloadType=96))
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(4)]
    cpu, wall = [], []
    for i in range(frames):
        frame = av.VideoFrame.from_ndarray(images[i % 4], format="rgb24")
        frame.pts, frame.time_base = i * 3750, fractions.Fraction(1, 90000)
        c0, w0 = time.process_time(), time.perf_counter()
        encoder.encode(frame, i == 0)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return np.array(cpu[5:]) * 1000, np.array(wall[5:]) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=384)
    parser.add_argument("--frames", type=int, default=60)
    args = parser.parse_args()
    for name, mime in CODECS.items():
        cpu, wall = encode_ms(mime, args.width, args.height, args.frames)
        print(f"{name} {args.width}x{args.height}: CPU ms/frame p50 {np.median(cpu):.1f} "
              f"p90 {np.percentile(cpu, 90):.1f}, wall p50 {np.median(wall):.1f} "
              f"(24 fps needs < {1000 / 24:.1f} ms of one core)")


if __name__ == "__main__":
    main()
