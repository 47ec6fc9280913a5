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


def _encode_file(
    audio: np.ndarray,
    rate: int,
    container: str,
    codec: str,
    sample_format: str,
    bitrate: int | None = None,
) -> bytes:
    """Encode mono float audio into a whole container file in memory."""
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim != 1:
        raise AudioFormatError(f"expected mono 1-D audio, got shape {audio.shape}")
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout="mono")
        stream.codec_context.format = sample_format
        if bitrate is not None:
            stream.codec_context.bit_rate = bitrate
        stream.codec_context.open()
        step = stream.codec_context.frame_size or 4096
        for start in range(0, len(audio), step):
            frame = _frame(audio[start : start + step], 1, rate, start, sample_format)
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buf.getvalue()


def encode_ogg_opus(audio: np.ndarray, rate: int, bitrate: int = 64000) -> bytes:
    """Mono float audio -> an Ogg Opus file (RFC 7845); other rates resampled to 48 kHz.

    The file carries pre-skip and end trimming, so decoders return exactly
    ``len(audio)`` samples (scaled to the decode rate).
    """
    if rate not in OPUS_RATES:
        audio, rate = resample(audio, rate, OPUS_DECODE_RATE), OPUS_DECODE_RATE
    return _encode_file(audio, rate, "ogg", "libopus", "flt", bitrate)


def encode_flac(audio: np.ndarray, rate: int) -> bytes:
    """Mono float audio -> a 16-bit FLAC file (lossless for PCM16-exact input)."""
    return _encode_file(audio, rate, "flac", "flac", "s16")


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
