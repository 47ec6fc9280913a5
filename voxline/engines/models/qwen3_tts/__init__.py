"""Qwen3-TTS (12 Hz codec) as plain PyTorch modules: talker, code predictor, prompts,
and a stateful streaming codec decoder; loads checkpoints in the official layout."""

from .checkpoint import (
    Qwen3TTSModel,
    load_code2wav,
    load_safetensors_dir,
    load_speaker_encoder,
    load_talker,
)
from .code2wav import Code2WavDecoder, Code2WavState
from .codec_encoder import CodecEncoder
from .config import Code2WavConfig, Qwen3TTSConfig, load_code2wav_config, load_config
from .generation import FinishReason, TalkerFrame, TalkerGenerator, TalkerSampling, TalkerStream
from .prompt import (
    QWEN_CHAT_TOKENS,
    ChatTokens,
    TalkerPrompt,
    assistant_ids,
    build_prompt,
    instruct_ids,
    ref_text_ids,
)
from .speaker_encoder import SpeakerEncoder, mel_spectrogram
from .talker import CodePredictor, Talker

__all__ = [
    "ChatTokens",
    "Code2WavConfig",
    "Code2WavDecoder",
    "Code2WavState",
    "CodecEncoder",
    "CodePredictor",
    "FinishReason",
    "QWEN_CHAT_TOKENS",
    "Qwen3TTSConfig",
    "Qwen3TTSModel",
    "SpeakerEncoder",
    "Talker",
    "TalkerFrame",
    "TalkerGenerator",
    "TalkerPrompt",
    "TalkerSampling",
    "TalkerStream",
    "assistant_ids",
    "build_prompt",
    "instruct_ids",
    "load_code2wav",
    "load_code2wav_config",
    "load_config",
    "load_safetensors_dir",
    "load_speaker_encoder",
    "load_talker",
    "mel_spectrogram",
    "ref_text_ids",
]
