"""A video's MP4 on disk while it is made, and readers that follow it as it grows.

`Mp4Writer` encodes chunks as they arrive (H.264 yuv420p, x264 ``zerolatency`` so every
frame's packet comes out at once) into a *fragmented* MP4 (``empty_moov`` then one fragment
per frame), so the bytes written so far are always a playable prefix: a player that reads
the file from byte 0 while it grows plays what exists and continues. Nothing already
written is rewritten, so the finished file is exactly those bytes plus the rest.

`LiveFile` is the loop-side view: `grew()` after each chunk (and `ended()` at the end)
wakes every `follow()` reader, which sends the bytes past its offset and waits for more
until the video ends. A reader opens the file once, so the rename of the finished
``.part`` file (or its removal on failure) never cuts it short mid-read.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

READ_BYTES = 1 << 16
# fragment per frame, moov first and never rewritten: a growing file is a playable prefix
MOVFLAGS = "frag_every_frame+empty_moov+default_base_moof"


class Mp4Writer:
    """H.264 in fragmented MP4, written chunk by chunk to `path` + ``.part``; `finish`
    renames it to `path`, `discard` removes whatever was written. Thread-safe: the calls
    run on worker threads and `discard` may follow a cancelled `add`."""

    def __init__(self, path: Path, fps: int) -> None:
        self.path = path
        self.partial = path.with_name(path.name + ".part")
        self.fps = fps
        self._lock = threading.Lock()
        self._container: Any = None
        self._stream: Any = None

    def add(self, frames: np.ndarray) -> None:
        """Encode RGB frames, uint8 (F, H, W, 3); their bytes are on disk on return."""
        import av

        with self._lock:
            if self._container is None:
                self._container = av.open(str(self.partial), "w", format="mp4",
                                          options={"movflags": MOVFLAGS, "flush_packets": "1"})
                self._stream = self._container.add_stream(
                    "libx264", rate=self.fps, options={"tune": "zerolatency"})
                self._stream.width, self._stream.height = frames.shape[2], frames.shape[1]
                self._stream.pix_fmt = "yuv420p"
            for frame in frames:
                packets = self._stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24"))
                self._container.mux(packets)

    def finish(self) -> None:
        with self._lock:
            if self._container is None:
                raise RuntimeError(f"video {self.path.stem}: no frames were encoded")
            self._container.mux(self._stream.encode(None))
            self._container.close()
            self._container = None
            self.partial.replace(self.path)

    def discard(self) -> None:
        with self._lock:
            if self._container is not None:
                self._container.close()
                self._container = None
            self.partial.unlink(missing_ok=True)
            self.path.unlink(missing_ok=True)


class LiveFile:
    """The loop's handle on a writer's growing file (loop thread only)."""

    def __init__(self, writer: Mp4Writer) -> None:
        self.writer = writer
        self.done = False
        self._changed = asyncio.Event()

    def grew(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def ended(self) -> None:
        self.done = True
        self.grew()

    async def follow(self) -> AsyncIterator[bytes]:
        """Every byte of the file from the start, as it is written, until it ends."""
        handle: BinaryIO | None = None
        try:
            while True:
                changed, done = self._changed, self.done  # before reading: no lost wake-up
                if handle is None:
                    handle = await asyncio.to_thread(_open_either, self.writer)
                while handle is not None and (data := await asyncio.to_thread(
                        handle.read, READ_BYTES)):
                    yield data
                if done:
                    return
                await changed.wait()
        finally:
            if handle is not None:
                handle.close()


def _open_either(writer: Mp4Writer) -> BinaryIO | None:
    """The file being written, or the finished one; None before the first chunk."""
    for path in (writer.partial, writer.path):
        try:
            return path.open("rb")
        except FileNotFoundError:
            continue
    return None
