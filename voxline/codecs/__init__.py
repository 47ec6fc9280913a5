"""Audio representation: PCM16/float32, resampling, G.711, WAV, Opus, framing."""

from voxline.codecs.chunker import FrameChunker, frame_samples
from voxline.codecs.g711 import (
    alaw_decode,
    alaw_decode_pcm16,
    alaw_encode,
    alaw_to_float,
    float_to_alaw,
    float_to_ulaw,
    ulaw_decode,
    ulaw_decode_pcm16,
    ulaw_encode,
    ulaw_to_float,
)
from voxline.codecs.pcm import (
    b64decode_audio,
    b64encode_audio,
    float_to_int16,
    float_to_pcm16,
    int16_to_float,
    int16_to_pcm16,
    pcm16_to_float,
    pcm16_to_int16,
)
from voxline.codecs.resample import Resampler, resample
from voxline.codecs.wav import read_wav, wav_bytes, write_wav

__all__ = [
    "FrameChunker",
    "Resampler",
    "alaw_decode",
    "alaw_decode_pcm16",
    "alaw_encode",
    "alaw_to_float",
    "b64decode_audio",
    "b64encode_audio",
    "float_to_alaw",
    "float_to_int16",
    "float_to_pcm16",
    "float_to_ulaw",
    "frame_samples",
    "int16_to_float",
    "int16_to_pcm16",
    "pcm16_to_float",
    "pcm16_to_int16",
    "read_wav",
    "resample",
    "ulaw_decode",
    "ulaw_decode_pcm16",
    "ulaw_encode",
    "ulaw_to_float",
    "wav_bytes",
    "write_wav",
]
