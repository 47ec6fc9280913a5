"""Typed, read-once configuration. Environment variables are read here and nowhere else.

`Settings` is the one home of a setting: its field holds the name, type, default,
constraints and description. Everything else is derived from the fields and never
restated: `voxline serve`'s flags (`add_setting_flags`: ``--kebab-name``, typed and
validated as the field, the description and default as help), their reading back into
`Settings` (`settings_from_flags`), and the settings page's table, docs/settings.md (`settings_table`).
A field that is not a flag says why in `NOT_FLAGS`; a flag that sets several fields at
once (``--device``) is one `DerivedFlag` row. The engine process receives the Settings
themselves (`model_dump(mode="json")`), not a list of chosen fields.
"""

from __future__ import annotations

import argparse
import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, TypeVar, get_args, get_origin

from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

# ------------------------------------------------------------------- backend choices
# A choice among backends is an enum, compared by identity where it is branched on; a
# value's text is its flag and environment spelling. A backend that takes a target (a
# checkpoint directory, a server URL) is written ``kind:target`` in one field and read
# through its `Settings` accessor as a `BackendChoice`.


class EngineKind(enum.StrEnum):
    PROCESS = "process"  # a supervised child process
    INPROCESS = "inprocess"  # a thread of this process


class LLMDtype(enum.StrEnum):
    INT8 = "int8"
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"


class Int8Prefill(enum.StrEnum):
    AUTO = "auto"  # dynamic where the CPU has AVX-512 but no native bfloat16
    WEIGHT_ONLY = "weight-only"
    DYNAMIC = "dynamic"


class ASRDecoder(enum.StrEnum):
    AUTO = "auto"  # int8 wherever the decoder is Moonshine's onnxruntime one (the CPU)
    INT8 = "int8"
    FLOAT32 = "float32"


class AutoOff(enum.StrEnum):
    AUTO = "auto"
    OFF = "off"


class TTSSchedule(enum.StrEnum):
    PLAYOUT = "playout"
    FIFO = "fifo"


class ASRBackend(enum.StrEnum):
    MOONSHINE = "moonshine"  # shipped
    WHISPER = "whisper"  # whisper:<checkpoint dir>


class TTSBackend(enum.StrEnum):
    PIPER = "piper"  # shipped
    QWEN3 = "qwen3"  # qwen3:<checkpoint dir>


class LLMBackend(enum.StrEnum):
    EMBEDDED = "embedded"  # shipped SmolLM2 or llm_checkpoint, in the engine
    OPENAI = "openai"  # openai:<server url>


class VideoBackend(enum.StrEnum):
    HELIOS = "helios"  # helios:<checkpoint dir>
    HELIOS_PYRAMID = "helios-pyramid"  # helios-pyramid:<checkpoint dir>


class VideoWeights(enum.StrEnum):
    BF16 = "bf16"  # as loaded
    FP8 = "fp8"  # float8 block projections (lossy; compute capability 8.9+)


BackendT = TypeVar("BackendT", bound=enum.StrEnum)


@dataclass(frozen=True)
class BackendChoice(Generic[BackendT]):
    """A backend field's value read: its kind, and its target ("" when it takes none)."""

    kind: BackendT
    target: str = ""

    @classmethod
    def parse(cls, value: str, kinds: type[BackendT]) -> BackendChoice[BackendT]:
        kind, _, target = value.partition(":")
        return cls(kinds(kind), target)


def default_cache() -> Path:
    """The `cache` setting's default; below the factory, the fallback of a caller that was
    handed no cache directory (reads no environment variable)."""
    return Path.home() / ".cache" / "voxline"


class Settings(BaseSettings):
    """Process-wide settings; `VOXLINE_*` environment variables override defaults."""

    model_config = SettingsConfigDict(env_prefix="VOXLINE_", extra="ignore")

    trace: bool = Field(default=False, description="log each turn's milestones (speech "
                        "fell silent, transcript, speculation, first token, first audio) on "
                        "the voxline.trace logger at DEBUG, in the engine's process, for "
                        "latency work (benchmarks/cpu_latency/bench_pipeline.py --trace)")
    cache: Path = Field(default_factory=default_cache,
                        description="directory of converted weights (the shipped GGUF as "
                                    "safetensors, converted once)")
    api_key: str | None = Field(default=None, description="require this key from clients "
                                "(Authorization: Bearer, or the browser subprotocol "
                                "openai-insecure-api-key.<key>)")
    llm_dtype: LLMDtype = Field(default=LLMDtype.INT8,
                           description="weights of the embedded LLM: int8 (decode steps read "
                                       "int8 weights, about 2x faster than float32 on a CPU; "
                                       "prefill, attention and the cache stay float32; CPU "
                                       "only), float32, or bfloat16")
    llm_int8_prefill: Int8Prefill = Field(
        default=Int8Prefill.AUTO,
        description="with llm_dtype int8: how a step of several tokens (a prefill) "
                    "multiplies. 'weight-only': bfloat16 activations against the int8 "
                    "weights; 'dynamic': each token's activations quantized to int8 as well, "
                    "an int8 x int8 GEMM (about 2.5x faster prefill on AVX-512 CPUs without "
                    "native bfloat16; decode steps stay weight-only); 'auto': dynamic on "
                    "exactly those CPUs")
    llm_device: str = Field(default="cpu", pattern=r"^(cpu|cuda(:\d+)?)$",
                            json_schema_extra={"metavar": "cpu|cuda[:N]"},
                            description="torch device of the embedded LLM: cpu or cuda (with "
                                        "llm_dtype bfloat16 or float32; int8 is CPU-only)")
    threads: int = Field(default=0, description="torch/onnxruntime intra-op threads "
                         "(0: half the cores)")
    host: str = Field(default="127.0.0.1", description="bind address of `voxline serve`")
    port: int = Field(default=8000, description="TCP port of `voxline serve`")
    # Capacity: each conversation holds one LLM KV-cache slot (the engine sizes its cache to
    # max_sessions), and the engine generates at most max_responses replies at once; past
    # either, clients are refused with a reason (close 1013, HTTP 503 + Retry-After).
    max_sessions: int = Field(default=8, ge=1, description="concurrent voice sessions: "
                              "/v1/realtime WebSockets, WebRTC calls and Twilio streams "
                              "together; each holds an LLM cache slot, sized to this. Past "
                              "it: close 1013 / HTTP 503 + Retry-After. On a GPU, unset: what "
                              "its memory holds, capped by the sessions measured at the "
                              "latency bar (docs: GPU serving and capacity)")
    max_responses: int = Field(default=8, ge=1, description="replies and /v1/audio/speech "
                               "requests the engine generates at once; past it a reply fails "
                               "with error code server_busy and speech gets HTTP 503 + "
                               "Retry-After. On a GPU, unset: max_sessions")
    send_buffer_kb: int = Field(default=1024, ge=16, description="KiB of events queued for a "
                                "client that stopped reading before its connection is "
                                "dropped; other sessions are unaffected")
    ws_compression: bool = Field(default=False, description="permessage-deflate on WebSockets "
                                 "when the client offers it; off because base64 audio barely "
                                 "compresses and deflating every audio delta was the server "
                                 "process's largest cost at 64 sessions (py-spy, one H200)")
    speculate_after_ms: float = Field(default=160.0, ge=0, description="a pause this long in "
                                      "a server-VAD turn starts its transcript and reply "
                                      "speculatively, so the reply is ready when the turn "
                                      "ends; dropped unsent if the user goes on (0: off)")
    warm_prefill: bool = Field(default=True, description="while the user speaks, each partial "
                               "transcript prefills the reply's prompt (embedded LLM, idle "
                               "cycles only), so at the end of the turn only the last words "
                               "are new")
    early_pause_transcript: bool = Field(default=True, description="32 ms (one VAD frame) "
                                         "into a silence the turn so far is transcribed, and that take is the "
                                         "pause (and final) transcript when no voice followed: "
                                         "the transcript is ready when the silence window "
                                         "closes (costs one or two extra ASR runs a turn)")
    early_speculation: bool = Field(default=True, description="semantic_vad: when the "
                                    "transcript taken where the speech fell silent ends a "
                                    "sentence (a question, a statement), the speculative reply "
                                    "starts then, not at the speculate_after_ms pause, so it is "
                                    "ready when the turn is judged complete; dropped unsent if "
                                    "the user goes on (needs speculation and "
                                    "early_pause_transcript on)")
    max_session_seconds: float = Field(default=1800.0, gt=0, description="session time "
                                       "limit, seconds")
    shutdown_grace: float = Field(default=5.0, ge=0, description="on SIGTERM/SIGINT: seconds "
                                  "replies in flight may take to finish before sessions close "
                                  "with 1001")
    max_event_bytes: int = Field(default=15 * 1024 * 1024,
                                 description="largest client event, bytes")
    max_image_bytes: int = Field(default=5 * 1024 * 1024, gt=0,
                                 description="largest input_image, decoded bytes (image input "
                                             "needs --llm openai:<url>, a vision model)")
    max_session_images: int = Field(default=20, ge=0,
                                    description="input_image parts a session may send in all")
    output_lead_ms: float = Field(default=200.0, gt=0, le=1000,
                                  description="audio sent ahead of real-time playout, ms "
                                              "(<= 1000)")
    generation_lead_s: float = Field(default=20.0, ge=0, description="seconds of a spoken "
                                     "reply the engine generates ahead of its playout; past "
                                     "it the reply's LLM and TTS work waits for the listener, "
                                     "so a long answer never overflows and a barge-in "
                                     "discards at most this (0: off, generate as fast as "
                                     "possible; a reply 300 s ahead is then cut)")
    engine: EngineKind = Field(default=EngineKind.PROCESS,
                        description="run the engine in a supervised child process or a thread")
    asr: str = Field(default="moonshine", pattern=r"^(moonshine|whisper:.+)$",
                     json_schema_extra={"metavar": "moonshine|whisper:<checkpoint dir>"},
                     description="speech recognition: 'moonshine' (shipped base-en, "
                                 "English only; onnxruntime on the CPU, torch on a GPU) or "
                                 "'whisper:<checkpoint dir>' (any transformers "
                                 "WhisperForConditionalGeneration checkpoint, e.g. "
                                 "large-v3-turbo; batched across sessions, takes "
                                 "transcription language and prompt)")
    asr_device: str = Field(default="cpu", pattern=r"^(cpu|cuda(:\d+)?)$",
                            json_schema_extra={"metavar": "cpu|cuda[:N]"},
                            description="device of the ASR: on cuda Moonshine runs through "
                                        "torch (float32) and Whisper in bfloat16, both "
                                        "batched across sessions")
    asr_workers: int = Field(default=1, ge=1, le=64,
                             description="Moonshine transcriptions run at once, each on "
                                         "threads/asr_workers cores: on a many-core server "
                                         "many sessions' final transcripts are made side by "
                                         "side instead of queueing (a Whisper ASR batches "
                                         "on its device instead)")
    asr_decoder: ASRDecoder = Field(
        default=ASRDecoder.AUTO,
        description="Moonshine's decoder on the CPU: 'int8' multiplies int8 weights (one "
                    "scale per output column) by each step's activations quantized to int8 "
                    "(about 2x faster per token on an AVX-512 VNNI CPU; the same word error "
                    "rate on the latency benchmark's questions); 'float32' the folded "
                    "float32 weights; 'auto': int8 (on a GPU, or for Whisper, only auto)")
    tts: str = Field(default="piper", pattern=r"^(piper|qwen3:.+)$",
                     json_schema_extra={"metavar": "piper|qwen3:<checkpoint dir>"},
                     description="speech model: 'piper' (shipped voice) or 'qwen3:<checkpoint dir>' "
                                 "(Qwen3-TTS, official layout)")
    tts_device: str = Field(default="cpu", pattern=r"^(cpu|cuda(:\d+)?)$",
                            json_schema_extra={"metavar": "cpu|cuda[:N]"},
                            description="torch device of a neural TTS (e.g. cuda; Piper always "
                                        "runs on the CPU)")
    tts_speaker: str | None = Field(default=None, description="Qwen3-TTS preset voice "
                                    "(default: the checkpoint's first)")
    tts_language: str = Field(default="auto", description="Qwen3-TTS language, or auto")
    tts_max_streams: int = Field(default=8, ge=1, description="Qwen3-TTS replies spoken at once "
                                 "(talker slots; more wait for a free one). On a GPU, unset: "
                                 "max_responses, or what fits beside max_sessions if fewer")
    tts_first_chunk_frames: int = Field(default=1, ge=1, le=48, description="Qwen3-TTS: "
                                        "12 Hz codec frames (80 ms each) in a reply's first "
                                        "audio chunk (fewer: earlier first audio)")
    tts_max_frames: int = Field(default=2048, ge=1, description="Qwen3-TTS: most codec "
                                "frames (80 ms each) one talker stream speaks before it is "
                                "stopped (a checkpoint that never says EOS)")
    tts_chunk_frames: int = Field(default=4, ge=1, le=48, description="Qwen3-TTS: codec "
                                  "frames in each later audio chunk (more: fewer, larger "
                                  "decoder calls; on CUDA one graph per length)")
    tts_batch_buckets: str = Field(default="", pattern=r"^(\d+(,\d+)*)?$",
                                   json_schema_extra={"metavar": "N,N,..."},
                                   description="Qwen3-TTS on CUDA: comma-separated batch sizes its "
                                               "CUDA graphs are captured for, each <= tts_max_streams "
                                               "(empty: 1, 4, 16, ... up to tts_max_streams; "
                                               "each bucket's compiled code predictor takes "
                                               "~20 s to start on an H200)")
    tts_schedule: TTSSchedule = Field(default=TTSSchedule.PLAYOUT,
                              description="Qwen3-TTS steps under arriving replies: 'playout' (chunks "
                                          "ramp up from the first; a reply short of unplayed audio "
                                          "gets its frames decoded at once; one far ahead waits a "
                                          "step rather than push the batch into a bigger CUDA-graph "
                                          "bucket; a new reply's first frame is made in its prefill "
                                          "step) or 'fifo' (every reply every step, fixed chunks)")
    tts_pdl: AutoOff = Field(default=AutoOff.AUTO,
                         description="Qwen3-TTS on CUDA: programmatic dependent launch of its "
                                     "step kernels (each placed on the GPU while the one before "
                                     "it finishes; faster steps on one stream): 'auto' (on where "
                                     "the GPU has it, Hopper and newer) or 'off' (for a GPU whose "
                                     "other stages' kernels run beside the speech steps)")
    llm: str = Field(default="embedded", pattern=r"^(embedded|openai:https?://.+)$",
                     json_schema_extra={"metavar": "embedded|openai:<server url>"},
                     description="reply model: 'embedded' (shipped SmolLM2, in the engine) or "
                                 "'openai:<server url>' (any OpenAI-compatible "
                                 "/v1/chat/completions server: vLLM, SGLang, llama.cpp, "
                                 "Ollama), e.g. openai:http://127.0.0.1:8080/v1")
    llm_model: str | None = Field(default=None, description="model name sent to a remote "
                                  "server (required with llm=openai:...)")
    llm_api_key: str | None = Field(default=None, description="bearer key for a remote server")
    llm_checkpoint: str | None = Field(default=None, description="embedded LLM: a local "
                                       "Hugging Face Llama-family checkpoint directory "
                                       "(default: the shipped SmolLM2)")
    llm_step_tokens: int = Field(default=512, ge=1, le=8192,
                                 description="embedded LLM: most tokens one batched step "
                                             "computes: every speaking reply's next token "
                                             "first, then new prompts up to this (a longer "
                                             "prompt goes on in the next steps). Fewer: replies "
                                             "already running wait less behind a new prompt, "
                                             "whose first token comes later")
    llm_prefill_graphs: AutoOff = Field(default=AutoOff.AUTO,
                                    description="embedded LLM on CUDA: prompts replayed from "
                                                "CUDA graphs, one per query-length bucket "
                                                "(16-256 tokens, longer ones in chunks): "
                                                "'auto' (on wherever the LLM's decode steps are "
                                                "graphed) or 'off' (prompts run eagerly, "
                                                "kernel by kernel)")
    background_graphs: AutoOff = Field(default=AutoOff.AUTO,
                                   description="models on CUDA (Qwen3-TTS, Moonshine): "
                                               "'auto' captures only the smallest and largest "
                                               "CUDA-graph buckets before the engine is ready "
                                               "and the rest afterwards, on each stage's "
                                               "thread between its steps (a batch meanwhile "
                                               "runs padded up to a captured bucket); 'off' "
                                               "captures every bucket before ready")
    gil_switch_us: int = Field(default=500, ge=20, le=5000,
                               description="with a model on a GPU: the engine process's GIL "
                                           "switch interval in microseconds (its stages' "
                                           "threads share the GIL; a thread back from a "
                                           "torch call waits up to this long for it). "
                                           "Smaller favours the model threads' many short "
                                           "calls over the engine loop's Python; on the CPU "
                                           "the engine keeps CPython's own (5000)")
    gpu_stream_priority: AutoOff = Field(default=AutoOff.AUTO,
                                     description="on CUDA: the ASR's and the embedded LLM's "
                                                 "GPU work goes on high-priority streams, so "
                                                 "the GPU starts their kernels' blocks ahead of "
                                                 "the speech steps' (a reply's first words wait "
                                                 "on them; speech has its playout buffer): "
                                                 "'auto' (on wherever they run on CUDA) or "
                                                 "'off' (every stage at one priority)")
    video: str = Field(default="", pattern=r"^((helios|helios-pyramid):.+)?$",
                       json_schema_extra={"metavar": "helios:DIR"},
                       description="video model: 'helios:<checkpoint dir>' (diffusers layout; "
                                   "its model_index.json picks HeliosPipeline, or "
                                   "HeliosPyramidPipeline for Helios-Mid/-Distilled, run chunk by "
                                   "chunk with the checkpoint's pyramid stages); "
                                   "'helios-pyramid:<dir>' runs any Helios checkpoint through the "
                                   "pyramid sampler; on CUDA when there is a GPU; empty: no "
                                   "video, video requests are refused")
    video_cache_backend: str = Field(default="none",
                                     pattern=r"^(none|first_block_cache|mag_cache)$",
                                     description="video step cache when a request names none "
                                     "(diffusers' hooks): none, first_block_cache or mag_cache "
                                     "(its ratios calibrated by the first such chunk and kept in "
                                     "voxline_mag_ratios.json beside the checkpoint or in the "
                                     "cache folder)")
    video_cache_threshold: float | None = Field(default=None, ge=0, description="the video "
                                                "step cache's threshold (higher skips more); "
                                                "empty: the backend's default (0.05 first "
                                                "block, 0.06 MagCache)")
    video_compile: bool = Field(default=False, description="torch.compile the video "
                                "transformer's blocks (one graph for all; each new frame size "
                                "compiles on its first chunk, ~12 s on an H200, where a "
                                "chunk's denoise took ~25% less); first_block_cache is then "
                                "refused (its hooks recompile the blocks, twice as slow)")
    video_attention: str = Field(default="native", pattern=r"^[a-z0-9_]+$",
                                 description="attention backend of the video transformer, by "
                                 "diffusers' name (native: PyTorch SDPA; e.g. flash, "
                                 "_native_cudnn, sage, xformers when their package is "
                                 "installed); refused at start-up when diffusers cannot run it")
    video_pipelined_decode: AutoOff = Field(
        default=AutoOff.AUTO, description="decode a video chunk's frames (the VAE, on its own "
        "thread and CUDA stream) while the next chunk denoises, and send each decoded piece "
        "at once: 'auto' (on, except with video_attention=_native_cudnn, whose process-wide "
        "SDPA flags fail the VAE's attention beside it: then serial) or 'off' (each chunk "
        "decodes after its denoise; pieces are still sent as decoded)")
    video_weights: VideoWeights = Field(
        default=VideoWeights.BF16,
        description="number format of the video transformer's block projections: bf16 (as "
                    "loaded) or fp8 (float8 e4m3 weights and activations scaled per row: "
                    "lossy, about half the transformer's memory; a CUDA GPU of compute "
                    "capability 8.9 or newer)")
    video_realtime_steps_per_stage: int = Field(
        default=1, ge=1, le=50, description="denoising steps per pyramid stage of a real-time "
        "video (a call's video track, response.video, the show_video tool) that names no "
        "steps: 1 is Helios' real-time setting (pyramid_num_inference_steps_list [1, 1, 1]), "
        "2 the distilled model card's; a request's steps_per_stage picks another; a "
        "standard-sampler checkpoint runs its recommended steps (another value is refused)")
    video_realtime_amplify_first_chunk: bool = Field(
        default=False, description="run a real-time video's first chunk at twice the steps, "
        "as Helios-Distilled's model card does for every video (/v1/videos keeps it): off, "
        "the first chunk runs as many steps as the later ones and its first frame comes "
        "about twice as soon (H100, 384x640, 1 step a stage: 1.46 against 2.87 s)")
    video_steps_per_stage: int | None = Field(
        default=None, ge=1, le=50, description="denoising steps per pyramid stage of a "
        "/v1/videos video that names no steps; empty: the checkpoint's recommended (2 a stage "
        "distilled, 20 otherwise); refused for a standard-sampler checkpoint")
    video_streams: int | None = Field(
        default=None, ge=1, le=64, description="videos the engine renders at once (real-time "
        "streams and /v1/videos jobs together); past it a session's video is refused with "
        "server_busy, /v1/videos?wait=true answers 503 + Retry-After and a /v1/videos job "
        "stays queued until one ends; empty: measured capacity on a GPU (the capacity "
        "table's video rows; 1 where the GPU was not measured), 1 on a CPU")
    video_voice_reserve_ms: float = Field(
        default=500.0, ge=0, le=10000, description="voice comes first: no video chunk starts "
        "its denoise while a spoken reply still being generated has less than this much audio "
        "sent and not yet played (its playout buffer runs low); the chunk starts once the "
        "reply's next audio, a playout report or its end lifts it; the VAE decode of chunks "
        "already denoised goes on (0: off); below generation_lead_s")
    llm_timeout: float = Field(default=30.0, gt=0, description="remote server: seconds to "
                               "connect and to wait for each streamed chunk")
    llm_retries: int = Field(default=2, ge=0, description="remote server: retries of a request "
                             "that failed before its first token (connection error, timeout, "
                             "429/5xx)")
    twilio_auth_token: str | None = Field(default=None, description="validate "
                                          "X-Twilio-Signature on /v1/telephony/twilio* if set")
    sip_port: int | None = Field(default=None, ge=1, le=65535, description="answer phone "
                                 "calls over SIP on this port, UDP and TCP (unset: no SIP)")
    sip_allow: str = Field(default="127.0.0.1,::1", description="SIP: comma-separated "
                           "addresses or networks (10.0.0.0/8) whose INVITEs are answered; "
                           "others get 403")
    sip_digest_user: str | None = Field(default=None, description="SIP: callers outside "
                                        "sip_allow may authenticate with this digest user "
                                        "and sip_digest_password (unset: they get 403)")
    sip_digest_password: str | None = Field(default=None, description="SIP: the digest "
                                            "password of sip_digest_user")
    sip_digest_realm: str = Field(default="voxline", description="SIP: the digest realm")
    sip_rtp_ports: str = Field(default="10000-20000", pattern=r"^\d{1,5}-\d{1,5}$",
                               description="SIP: the UDP port range for calls' RTP (two ports "
                               "a call: RTP and RTCP)")
    sip_instructions: str | None = Field(default=None, description="SIP: the instructions of "
                                         "calls answered with the default session (unset: "
                                         "the default session's)")
    sip_webhook_url: str | None = Field(default=None, description="SIP: where each incoming "
                                        "call's realtime.call.incoming webhook is POSTed; the "
                                        "app answers with /v1/realtime/calls/{call_id}/accept "
                                        "or /reject (unset: calls are accepted with the "
                                        "default session)")
    sip_webhook_secret: str | None = Field(default=None, description="SIP: the Standard "
                                           "Webhooks secret (whsec_...) that signs the webhook")
    sip_webhook_timeout: float = Field(default=5.0, gt=0, description="SIP: seconds one "
                                       "webhook delivery may take")
    sip_webhook_retries: int = Field(default=2, ge=0, description="SIP: retries of a webhook "
                                     "that failed (connection error, timeout, 429/5xx)")
    sip_accept_timeout: float = Field(default=15.0, gt=0, description="SIP: seconds a call "
                                      "rings waiting for the app's accept or reject; then it "
                                      "is rejected with 480")
    sip_early_media: str = Field(default="ringback", description="SIP: what a caller hears "
                                 "while the webhook's app decides: 183 Session Progress with "
                                 "SDP, then 'ringback' (a 440+480 Hz ringback tone), the path "
                                 "of a WAV file (looped), or 'none' (a plain 180 Ringing)")
    sip_media_timeout: float = Field(default=60.0, gt=0, description="SIP: seconds without "
                                     "RTP from a caller (not on hold) before the call is hung "
                                     "up")
    sip_media_host: str | None = Field(default=None, description="SIP: the address put in "
                                       "SDP answers for RTP (unset: --host, or 127.0.0.1 when "
                                       "that is a wildcard)")
    ice_hosts: str = Field(default="", description="WebRTC: comma-separated host addresses "
                           "offered as ICE candidates (empty: 127.0.0.1 and every interface "
                           "address)")
    ice_servers: str = Field(default="", description="WebRTC: comma-separated STUN/TURN URLs, "
                             "e.g. stun:stun.example.org:3478,turn:turn.example.org:3478")
    turn_username: str | None = Field(default=None, description="username for the TURN servers")
    turn_credential: str | None = Field(default=None, description="password for the TURN servers")
    client_secret_keys: str | None = Field(default=None, description="keys that sign "
                                           "client secrets (ek_ tokens), comma-separated, "
                                           "the current one first (it signs), then previous "
                                           "ones (still accepted, for rotation); every server "
                                           "behind one balancer needs the same; at least 16 "
                                           "bytes each (unset: a random key per process, one "
                                           "server only)")
    server_id: str = Field(default="", pattern=r"^[A-Za-z0-9-]{0,32}$",
                           description="this server's name in the ids it hands out (WebRTC "
                                       "calls rtc_<server_id>_...), so a balancer can route "
                                       "requests for a call to its server; unique per server "
                                       "(empty: a random one per process)")
    voice_dir: Path | None = Field(default=None, description="directory of registered voices "
                                   "(POST /v1/voices); point every server at one shared "
                                   "directory (NFS) to share them (unset: a temporary "
                                   "directory, forgotten at exit)")
    rtc_ports: str = Field(default="", pattern=r"^(\d+-\d+)?$",
                           json_schema_extra={"metavar": "LOW-HIGH"},
                           description="WebRTC: UDP port range for media, e.g. 40000-40199 "
                                       "(empty: any free port)")

    @property
    def asr_backend(self) -> BackendChoice[ASRBackend]:
        return BackendChoice.parse(self.asr, ASRBackend)

    @property
    def tts_backend(self) -> BackendChoice[TTSBackend]:
        return BackendChoice.parse(self.tts, TTSBackend)

    @property
    def llm_backend(self) -> BackendChoice[LLMBackend]:
        return BackendChoice.parse(self.llm, LLMBackend)

    @property
    def video_backend(self) -> BackendChoice[VideoBackend] | None:
        """The video model's backend and checkpoint (None: no video model)."""
        return BackendChoice.parse(self.video, VideoBackend) if self.video else None

    @property
    def remote_llm(self) -> bool:
        """The reply model runs on a remote server (which can call tools)."""
        return self.llm_backend.kind is LLMBackend.OPENAI

    @property
    def whisper_checkpoint(self) -> str | None:
        """The Whisper checkpoint directory ``asr`` names (None: the shipped Moonshine)."""
        backend = self.asr_backend
        return backend.target if backend.kind is ASRBackend.WHISPER else None

    def ice_host_list(self) -> list[str]:
        return [h.strip() for h in self.ice_hosts.split(",") if h.strip()]

    def ice_server_list(self) -> list[str]:
        return [u.strip() for u in self.ice_servers.split(",") if u.strip()]

    def tts_bucket_list(self) -> list[int] | None:
        """``tts_batch_buckets`` as sizes (None: the default ladder, `ladder_buckets`)."""
        if not self.tts_batch_buckets:
            return None
        sizes = [int(b) for b in self.tts_batch_buckets.split(",")]
        if not all(1 <= b <= self.tts_max_streams for b in sizes):
            raise ValueError(f"tts_batch_buckets must lie in 1..tts_max_streams "
                             f"({self.tts_max_streams}), got {self.tts_batch_buckets}")
        return sizes

    @model_validator(mode="after")
    def _voice_reserve_under_lead(self) -> Settings:
        lead_ms = self.generation_lead_s * 1000
        if self.video and lead_ms and self.video_voice_reserve_ms >= lead_ms:
            raise ValueError(f"video_voice_reserve_ms ({self.video_voice_reserve_ms:g}) must be "
                             f"below generation_lead_s ({self.generation_lead_s:g} s): a reply "
                             "is generated at most that far ahead of its playout, so video "
                             "would wait through every reply")
        return self

    @field_validator("sip_early_media")
    @classmethod
    def _early_media(cls, value: str) -> str:
        if value in ("ringback", "none") or Path(value).is_file():
            return value
        raise ValueError(f"sip_early_media must be 'ringback', 'none' or the path of a WAV "
                         f"file, got {value!r} (no such file)")

    def rtc_port_range(self) -> tuple[int, int] | None:
        if not self.rtc_ports:
            return None
        low, high = (int(p) for p in self.rtc_ports.split("-"))
        if not 1024 <= low <= high <= 65535:
            raise ValueError(f"rtc_ports must be LOW-HIGH within 1024-65535, got {self.rtc_ports}")
        return low, high


def setting_default(name: str) -> Any:
    """The default of the `Settings` field `name`: the one place it is written, for code
    below the factory that has a keyword of the same meaning (e.g. `EngineCore`'s)."""
    return Settings.model_fields[name].get_default(call_default_factory=True)


def load_settings(**overrides: object) -> Settings:
    """Read settings once (environment + explicit overrides)."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def settings_from_dump(dump: Mapping[str, Any] | None = None, **fields: object) -> Settings:
    """Settings rebuilt from ``Settings.model_dump(mode="json")`` (as sent to an engine
    process; no environment is read for the fields it holds), with `fields` over it.
    Without a dump: the environment and `fields`, as `load_settings`. An unknown field
    name is an error (a misspelt override would otherwise be ignored silently)."""
    unknown = sorted(set(fields) - set(Settings.model_fields))
    if unknown:
        raise TypeError(f"unknown setting(s): {', '.join(unknown)}")
    if dump is None:
        return load_settings(**fields)
    return Settings.model_validate({**dump, **{k: v for k, v in fields.items() if v is not None}})


# --- the command line, generated from the fields -------------------------------------

NOT_FLAGS: dict[str, str] = {
    "twilio_auth_token": "a secret, and a command line is visible to every local user (ps)",
    "turn_credential": "a secret, and a command line is visible to every local user (ps)",
    "client_secret_keys": "a secret, and a command line is visible to every local user (ps)",
    "sip_webhook_secret": "a secret, and a command line is visible to every local user (ps)",
    "sip_digest_password": "a secret, and a command line is visible to every local user (ps)",
}
"""Fields with no ``voxline serve`` flag, and why (their environment variable still works)."""


def device_fields(device: str) -> dict[str, str]:
    """``--device``: the embedded LLM, Qwen3-TTS and the ASR on `device`; on a GPU the LLM
    in bfloat16 (the CPU default int8 is CPU-only)."""
    fields = {"llm_device": device, "tts_device": device, "asr_device": device}
    if device.startswith("cuda"):
        fields["llm_dtype"] = "bfloat16"
    return fields


@dataclass(frozen=True)
class DerivedFlag:
    """A flag that sets several fields; a field's own flag, when given, wins over it."""

    dest: str
    choices: tuple[str, ...]
    help: str
    fields: Callable[[str], dict[str, str]]
    parse: Callable[[str], str] = str  # a value's check before `choices` (argparse's type)

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")


def one_device(text: str) -> str:
    """``--device``'s value: one device. A list of GPUs is refused with the way to use
    them (one server per GPU behind the balancer), never taken as its first entry."""
    if "," in text:
        raise argparse.ArgumentTypeError(
            f"{text!r} names several devices; a server uses one GPU: run one `voxline serve` "
            "per GPU (CUDA_VISIBLE_DEVICES=N --device cuda --port P --server-id gpuN) behind "
            "the balancer, as deploy/haproxy-gpus.cfg does (docs: GPU serving and capacity)")
    return text


DERIVED_FLAGS: tuple[DerivedFlag, ...] = (
    DerivedFlag("device", ("cpu", "cuda"),
                "torch device of the embedded LLM, Qwen3-TTS and the ASR (Piper always runs "
                "on the CPU): sets llm_device, tts_device and asr_device; cuda puts all three "
                "on the GPU (the LLM in bfloat16 unless --llm-dtype; Qwen3-TTS and Moonshine "
                "with CUDA graphs; capacity sized to the GPU); one GPU per server",
                device_fields, one_device),
)

_CHOICES = re.compile(r"^\^\(([\w.-]+(?:\|[\w.-]+)+)\)\$$")  # ^(a|b|c)$: plain alternatives


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def env_name(field: str) -> str:
    return "VOXLINE_" + field.upper()


def _pattern(info: FieldInfo) -> str | None:
    return next((m.pattern for m in info.metadata if getattr(m, "pattern", None)), None)


def _extra(info: FieldInfo, key: str) -> Any:
    extra = info.json_schema_extra
    return extra.get(key) if isinstance(extra, dict) else None


def field_choices(name: str) -> list[str] | None:
    """The values a field allows, when it is an enum, a ``Literal`` of strings or its pattern a plain
    ``^(a|b|c)$`` alternation (None: free text, validated by `field_parser`)."""
    info = Settings.model_fields[name]
    if isinstance(info.annotation, type) and issubclass(info.annotation, enum.Enum):
        return [str(member.value) for member in info.annotation]
    if get_origin(info.annotation) is Literal and all(
            isinstance(v, str) for v in get_args(info.annotation)):
        return list(get_args(info.annotation))
    match = _CHOICES.match(_pattern(info) or "")
    return match.group(1).split("|") if match else None


def field_parser(name: str) -> Callable[[str], Any]:
    """Parse and validate one flag value exactly as the field would (type and constraints);
    argparse reports a bad value as ``argument --flag: ...``."""
    info = Settings.model_fields[name]
    annotation = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
    adapter = TypeAdapter(annotation)
    expected = _extra(info, "metavar")

    def parse(text: str) -> Any:
        try:
            return adapter.validate_python(text)
        except ValidationError as exc:
            reason = exc.errors()[0]["msg"]
            raise argparse.ArgumentTypeError(f"expected {expected} ({reason})" if expected
                                             else f"{reason}, got {text!r}") from None

    parse.__name__ = name  # argparse names the type in its errors
    return parse


def default_text(name: str) -> str | None:
    """A field's default as shown to people (None when it has none worth showing)."""
    value = Settings.model_fields[name].get_default(call_default_factory=True)
    if value is None or value == "":
        return None
    if isinstance(value, Path) and value.is_relative_to(Path.home()):
        return "~/" + value.relative_to(Path.home()).as_posix()
    return f"{value:g}" if isinstance(value, float) else str(value)


def flag_help(name: str) -> str:
    """A field's description, default and environment variable: its ``--help`` line."""
    default = default_text(name)
    shown = f"default: {default}; " if default is not None else ""
    return f"{Settings.model_fields[name].description} ({shown}env {env_name(name)})"


def flag_fields() -> list[str]:
    """The fields that are ``voxline serve`` flags, in declaration order."""
    return [name for name in Settings.model_fields if name not in NOT_FLAGS]


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per field (bar `NOT_FLAGS`) and the `DERIVED_FLAGS`. A flag not given is
    absent from the namespace, so the environment and then the field default apply."""
    for name in flag_fields():
        info = Settings.model_fields[name]
        help_text = flag_help(name).replace("%", "%%")
        if info.annotation is bool:
            parser.add_argument(flag_name(name), dest=name, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=help_text)
            continue
        choices = field_choices(name)  # argparse then names the choices in its error
        parser.add_argument(flag_name(name), dest=name,
                            type=str if choices else field_parser(name), choices=choices,
                            metavar=_extra(info, "metavar"), default=argparse.SUPPRESS,
                            help=help_text)
    for derived in DERIVED_FLAGS:
        parser.add_argument(derived.flag, dest=derived.dest, choices=derived.choices,
                            type=derived.parse, default=argparse.SUPPRESS,
                            help=derived.help.replace("%", "%%"))


def settings_from_flags(args: argparse.Namespace) -> Settings:
    """Settings from parsed flags: a field's own flag, else a derived flag, else the
    environment, else the default."""
    given = {k: v for k, v in vars(args).items() if v is not None}
    values: dict[str, object] = {}
    for derived in DERIVED_FLAGS:
        if derived.dest in given:
            values.update(derived.fields(given[derived.dest]))
    values.update({name: given[name] for name in Settings.model_fields if name in given})
    return Settings(**values)


def settings_table() -> str:
    """The settings table of docs/settings.md (Markdown), generated from the fields and flags."""
    rows = ["| flag | environment | default | what |", "|---|---|---|---|"]
    for name in Settings.model_fields:
        flag = f"`{flag_name(name)}`" if name not in NOT_FLAGS else "(none)"
        default = default_text(name)
        what = Settings.model_fields[name].description or ""
        if name in NOT_FLAGS:
            what += f" (environment only: {NOT_FLAGS[name]})"
        rows.append(f"| {flag} | `{env_name(name)}` | {f'`{default}`' if default else ''} "
                    f"| {_cell(what)} |")
    for derived in DERIVED_FLAGS:
        rows.append(f"| `{derived.flag} {{{','.join(derived.choices)}}}` | | "
                    f"| {_cell(derived.help)} |")
    return "\n".join(rows) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
