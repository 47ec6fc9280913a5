"""Opus packets, Ogg Opus / FLAC files and generic audio-file decoding, through PyAV.

``OpusEncoder``/``OpusDecoder`` work on raw Opus packets (WebRTC, RTP): one
packet per 20 ms frame, no container. The encoder's output starts ``pre_skip``
samples (at 48 kHz) late, as every Opus encoder's does; a decoder that is not
told about it (WebRTC never is) plays that look-ahead as leading silence.

Multi-channel sample arrays are interleaved, shape ``(samples, channels)``;
mono arrays are 1-D.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Literal

import av
import numpy as np

from voxline.codecs.chunker import FrameChunker
from voxline.codecs.pcm import BytesLike, float_to_int16, int16_to_float, pcm16_to_int16
from voxline.codecs.resample import Resampler, resample
from voxline.errors import AudioFormatError

OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
OPUS_DECODE_RATE = 48000
FRAME_MS = 20
_LAYOUTS = {1: "mono", 2: "stereo"}

OpusApplication = Literal["audio", "voip", "lowdelay"]
"""libopus tuning: ``audio`` (best fidelity), ``voip`` (speech, high-passed), ``lowdelay``."""


def _layout(channels: int) -> str:
    if channels not in _LAYOUTS:
        raise AudioFormatError(f"Opus here supports 1 or 2 channels, got {channels}")
    return _LAYOUTS[channels]


def _check_opus_rate(rate: int) -> None:
    if rate not in OPUS_RATES:
        raise AudioFormatError(f"Opus encodes at {OPUS_RATES} Hz, got {rate} Hz; resample first")


def _interleaved_float(audio: np.ndarray | BytesLike, channels: int) -> np.ndarray:
    """Float32 / int16 array or PCM16 bytes -> flat interleaved float32 samples."""
    if isinstance(audio, bytes | bytearray | memoryview):
        x = int16_to_float(pcm16_to_int16(audio))
    else:
        arr = np.asarray(audio)
        x = int16_to_float(arr) if arr.dtype == np.int16 else arr.astype(np.float32)
        if x.shape[1:] != ((channels,) if channels > 1 else ()):
            wanted = "(samples,)" if channels == 1 else f"(samples, {channels})"
            raise AudioFormatError(f"expected audio shaped {wanted}, got {x.shape}")
    x = x.reshape(-1)
    if len(x) % channels:
        raise AudioFormatError(
            f"{len(x)} interleaved samples do not split into {channels} channels"
        )
    return x


def _frame(
    flat: np.ndarray, channels: int, rate: int, pts: int, sample_format: str = "flt"
) -> av.AudioFrame:
    """Interleaved float samples -> a packed ``flt`` or ``s16`` frame."""
    data = float_to_int16(flat) if sample_format == "s16" else flat.astype(np.float32)
    frame = av.AudioFrame.from_ndarray(
        np.ascontiguousarray(data).reshape(1, -1), format=sample_format, layout=_layout(channels)
    )
    frame.sample_rate = rate
    frame.pts = pts
    return frame


def _to_float32(x: np.ndarray) -> np.ndarray:
    """Any FFmpeg sample array (u8, s16, s32, flt, dbl) -> float32 on the [-1, 1] scale."""
    if x.dtype == np.uint8:
        return (x.astype(np.float32) - 128.0) / 128.0
    if x.dtype.kind == "i":
        return (x / float(2 ** (8 * x.dtype.itemsize - 1))).astype(np.float32)
    return x.astype(np.float32, copy=False)


def _frame_to_interleaved(frame: av.AudioFrame, channels: int) -> np.ndarray:
    """Decoded frame (any float/int format) -> float32 shape (n,) or (n, channels)."""
    x = _to_float32(frame.to_ndarray())
    if frame.format.is_planar:
        x = x.T
    x = x.reshape(-1, frame.layout.nb_channels)
    if x.shape[1] != channels:
        x = np.repeat(x.mean(axis=1, keepdims=True), channels, axis=1).astype(np.float32)
    return np.ascontiguousarray(x[:, 0] if channels == 1 else x)


class OpusEncoder:
    """Stateful Opus encoder for one stream: samples in, one packet per 20 ms frame out.

    Input may be any length; samples are buffered until a whole frame is
    available, so N whole frames in give exactly N packets back. ``flush()``
    encodes the remainder and the codec's look-ahead, then starts a fresh stream.
    """

    def __init__(
        self,
        rate: int = 48000,
        channels: int = 1,
        bitrate: int = 32000,
        application: OpusApplication = "audio",
    ) -> None:
        _check_opus_rate(rate)
        _layout(channels)
        self.rate = rate
        self.channels = channels
        self.bitrate = bitrate
        self.application = application
        self.frame_samples = rate * FRAME_MS // 1000
        self._chunker = FrameChunker(self.frame_samples * channels)
        self._open()

    def _open(self) -> None:
        ctx = av.CodecContext.create("libopus", "w")
        ctx.sample_rate = self.rate
        ctx.layout = _layout(self.channels)
        ctx.format = "flt"
        ctx.bit_rate = self.bitrate
        ctx.time_base = Fraction(1, self.rate)
        ctx.options = {"application": self.application, "frame_duration": str(FRAME_MS)}
        ctx.open()
        self._ctx = ctx
        self._pts = 0

    @property
    def pre_skip(self) -> int:
        """Samples at 48 kHz a decoder should drop from the start (the OpusHead pre-skip)."""
        head = bytes(self._ctx.extradata or b"")
        if len(head) < 12 or head[:8] != b"OpusHead":
            return 0
        return struct.unpack_from("<H", head, 10)[0]

    def _encode_frame(self, flat: np.ndarray) -> list[bytes]:
        frame = _frame(flat, self.channels, self.rate, self._pts)
        self._pts += len(flat) // self.channels
        return [bytes(p) for p in self._ctx.encode(frame)]

    def encode(self, audio: np.ndarray | BytesLike) -> list[bytes]:
        """Buffer float32 / int16 samples or PCM16 bytes; return packets for whole frames."""
        packets: list[bytes] = []
        for flat in self._chunker.feed(_interleaved_float(audio, self.channels)):
            packets += self._encode_frame(flat)
        return packets

    def flush(self) -> list[bytes]:
        """Encode the buffered partial frame (zero-padded) and drain the codec; reset."""
        packets: list[bytes] = []
        rest = self._chunker.flush(pad=True)
        if rest is not None:
            packets += self._encode_frame(rest)
        packets += [bytes(p) for p in self._ctx.encode(None)]
        self._open()
        return packets


class OpusDecoder:
    """Stateful Opus packet decoder for one stream; returns float32 at ``rate``.

    Opus always decodes at 48 kHz; other rates go through a streaming resampler,
    whose delay ``flush()`` drains (mono only).
    """

    def __init__(self, rate: int = 48000, channels: int = 1) -> None:
        _layout(channels)
        if rate != OPUS_DECODE_RATE and channels != 1:
            raise AudioFormatError("OpusDecoder resamples mono only; use rate=48000 for stereo")
        self.rate = rate
        self.channels = channels
        self._ctx = av.CodecContext.create("opus", "r")
        self._ctx.sample_rate = OPUS_DECODE_RATE
        self._ctx.layout = _layout(channels)
        self._resampler = Resampler(OPUS_DECODE_RATE, rate)

    def decode(self, packet: BytesLike) -> np.ndarray:
        """Decode one packet; shape (n,) for mono or (n, channels)."""
        if not len(packet):
            raise AudioFormatError("empty Opus packet")
        try:
            frames = self._ctx.decode(av.Packet(bytes(packet)))
        except av.FFmpegError as exc:
            raise AudioFormatError(f"invalid Opus packet ({len(packet)} bytes): {exc}") from exc
        parts = [_frame_to_interleaved(f, self.channels) for f in frames]
        out = np.concatenate(parts) if parts else self._empty()
        return out if self._resampler.passthrough else self._resampler.process(out)

    def flush(self) -> np.ndarray:
        """Samples still held by the resampler (none at 48 kHz)."""
        return self._empty() if self._resampler.passthrough else self._resampler.flush()

    def _empty(self) -> np.ndarray:
        return np.zeros((0,) if self.channels == 1 else (0, self.channels), np.float32)


@dataclass(frozen=True)
class FileFormat:
    """An audio file format PyAV can write: container, codec, the codec's sample format."""

    container: str
    codec: str
    sample_format: str
    bitrate: int | None = None
    rates: tuple[int, ...] | None = None  # rates the codec takes; others go to the last one
    media_type: str = "application/octet-stream"
    options: tuple[tuple[str, str], ...] = ()  # muxer options


FILE_FORMATS: dict[str, FileFormat] = {
    "mp3": FileFormat("mp3", "libmp3lame", "fltp", 64000, media_type="audio/mpeg"),
    "aac": FileFormat("adts", "aac", "fltp", 64000, media_type="audio/aac"),
    # Ogg pages of 100 ms (FFmpeg's default is 1 s), so a stream's first audio leaves early
    "opus": FileFormat("ogg", "libopus", "flt", 64000, OPUS_RATES, media_type="audio/ogg",
                       options=(("page_duration", "100000"),)),
    "flac": FileFormat("flac", "flac", "s16", media_type="audio/flac"),
}


class _Sink:
    """A write-only file for PyAV. It has no `seek`, so muxers write forward only (FLAC and
    MP3 leave their optional after-the-fact headers out) and bytes can leave as they come."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._chunks.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self._chunks = b"".join(self._chunks), []
        return out


class StreamingFileEncoder:
    """Mono float audio in, container bytes out as soon as the muxer writes them.

    `push` returns the bytes produced so far (possibly none: codecs work in whole frames
    and the muxer buffers a little); `finish` flushes the codec and the container.
    Concatenating every return value gives one valid file.
    """

    def __init__(self, fmt: FileFormat | str, rate: int, io_buffer: int = 1024) -> None:
        self.format = FILE_FORMATS[fmt] if isinstance(fmt, str) else fmt
        self._resampler: Resampler | None = None
        if self.format.rates is not None and rate not in self.format.rates:
            self._resampler = Resampler(rate, self.format.rates[-1])
            rate = self.format.rates[-1]
        self.rate = rate
        self._sink = _Sink()
        self._out = av.open(self._sink, "w", format=self.format.container, buffer_size=io_buffer,
                            options=dict(self.format.options))
        self._stream = self._out.add_stream(self.format.codec, rate=rate, layout="mono")
        ctx = self._stream.codec_context
        ctx.format = self.format.sample_format
        if self.format.bitrate is not None:
            ctx.bit_rate = self.format.bitrate
        ctx.open()
        self._frame_size = ctx.frame_size or 4096
        self._pending = np.zeros(0, np.float32)
        self._pts = 0
        self._finished = False

    def push(self, audio: np.ndarray) -> bytes:
        if self._finished:
            raise AudioFormatError("the encoder is finished")
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim != 1:
            raise AudioFormatError(f"expected mono 1-D audio, got shape {audio.shape}")
        if self._resampler is not None:
            audio = self._resampler.process(audio)
        self._pending = np.concatenate([self._pending, audio])
        n = len(self._pending) // self._frame_size * self._frame_size
        self._encode(self._pending[:n])
        self._pending = self._pending[n:]
        return self._sink.take()

    def finish(self) -> bytes:
        if not self._finished:
            self._finished = True
            tail = self._pending
            if self._resampler is not None:
                tail = np.concatenate([tail, self._resampler.flush()])
            self._encode(tail)
            self._out.mux(self._stream.encode(None))
            self._out.close()
        return self._sink.take()

    def _encode(self, audio: np.ndarray) -> None:
        for start in range(0, len(audio), self._frame_size):
            chunk = audio[start : start + self._frame_size]
            # mono: a planar frame (fltp) has the same (1, n) layout as a packed one
            frame = _frame(chunk, 1, self.rate, self._pts, self.format.sample_format)
            self._pts += len(chunk)
            self._out.mux(self._stream.encode(frame))


def encode_file(audio: np.ndarray, rate: int, fmt: FileFormat | str) -> bytes:
    """Mono float audio -> a whole audio file (`fmt`: a `FILE_FORMATS` key or a format)."""
    encoder = StreamingFileEncoder(fmt, rate)
    return encoder.push(audio) + encoder.finish()


def encode_ogg_opus(audio: np.ndarray, rate: int, bitrate: int = 64000) -> bytes:
    """Mono float audio -> an Ogg Opus file (RFC 7845); other rates resampled to 48 kHz.

    The file carries pre-skip and end trimming, so decoders return exactly
    ``len(audio)`` samples (scaled to the decode rate).
    """
    if rate not in OPUS_RATES:
        audio, rate = resample(audio, rate, OPUS_DECODE_RATE), OPUS_DECODE_RATE
    return encode_file(audio, rate, replace(FILE_FORMATS["opus"], bitrate=bitrate))


def encode_flac(audio: np.ndarray, rate: int) -> bytes:
    """Mono float audio -> a 16-bit FLAC file (lossless for PCM16-exact input)."""
    return encode_file(audio, rate, "flac")


def decode_audio_file(data: BytesLike, rate: int | None = None) -> tuple[np.ndarray, int]:
    """Any audio file PyAV can read (Ogg Opus, FLAC, MP3, WAV, ...) -> (float32 mono, rate).

    The first audio stream is decoded and downmixed; with ``rate`` it is resampled to it.
    """
    try:
        with av.open(io.BytesIO(bytes(data))) as container:
            if not container.streams.audio:
                raise AudioFormatError("file has no audio stream")
            stream = container.streams.audio[0]
            parts = [_frame_to_interleaved(f, 1) for f in container.decode(stream)]
            native = stream.codec_context.sample_rate
    except av.FFmpegError as exc:
        raise AudioFormatError(f"cannot decode audio file ({len(data)} bytes): {exc}") from exc
    audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    if rate is None or rate == native:
        return audio, native
    return resample(audio, native, rate), rate
