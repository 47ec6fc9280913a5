"""Typed, read-once configuration. Environment variables are read here and nowhere else."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_cache() -> Path:
    return Path.home() / ".cache" / "voxline"


class Settings(BaseSettings):
    """Process-wide settings; `VOXLINE_*` environment variables override defaults."""

    model_config = SettingsConfigDict(env_prefix="VOXLINE_", extra="ignore")

    cache: Path = Field(default_factory=_default_cache, description="converted-weights cache")
    api_key: str | None = Field(default=None, description="require this bearer key if set")
    llm_dtype: str = Field(default="int8", pattern="^(int8|float32|bfloat16)$",
                           description="embedded LLM weights: int8 (CPU: decode steps read "
                                       "int8 weights, about 2x faster), float32 or bfloat16")
    llm_device: str = Field(default="cpu", pattern=r"^(cpu|cuda(:\d+)?)$",
                            description="torch device of the embedded LLM: cpu or cuda (with "
                                        "llm_dtype bfloat16 or float32; int8 is CPU-only)")
    threads: int = Field(default=0, description="torch/onnxruntime intra-op threads (0 = auto)")
    host: str = Field(default="127.0.0.1", description="bind address of `voxline serve`")
    port: int = Field(default=8000, description="TCP port of `voxline serve`")
    # Capacity: each conversation holds one LLM KV-cache slot (the engine sizes its cache to
    # max_sessions), and the engine generates at most max_responses replies at once; past
    # either, clients are refused with a reason (close 1013, HTTP 503 + Retry-After).
    max_sessions: int = Field(default=8, ge=1, description="concurrent voice sessions "
                              "(/v1/realtime WebSocket, WebRTC calls, Twilio streams)")
    max_responses: int = Field(default=8, ge=1, description="replies (and /v1/audio/speech "
                               "requests) the engine generates at once")
    send_buffer_kb: int = Field(default=1024, ge=16, description="KiB of server events queued "
                                "for a connection whose client stopped reading before it is "
                                "disconnected")
    speculate_after_ms: float = Field(default=160.0, ge=0, description="a pause this long in a "
                                      "server-VAD turn starts its transcript and reply "
                                      "speculatively, released if the turn ends (0: off)")
    max_session_seconds: float = Field(default=1800.0, gt=0, description="session time limit")
    shutdown_grace: float = Field(default=5.0, ge=0, description="on SIGTERM/SIGINT: seconds "
                                  "replies in flight may take before sessions close (1001)")
    max_event_bytes: int = Field(default=15 * 1024 * 1024, description="largest client event")
    output_lead_ms: float = Field(default=200.0, gt=0, le=1000,
                                  description="audio sent ahead of real-time playout")
    engine: str = Field(default="process", pattern="^(process|inprocess)$",
                        description="run the engine in a supervised child process or a thread")
    tts: str = Field(default="piper", pattern=r"^(piper|qwen3:.+)$",
                     description="speech model: 'piper' (shipped voice) or 'qwen3:<checkpoint dir>' "
                                 "(Qwen3-TTS, official layout)")
    tts_device: str = Field(default="cpu", description="torch device of a neural TTS (e.g. cuda)")
    tts_speaker: str | None = Field(default=None, description="Qwen3-TTS preset voice "
                                    "(default: the checkpoint's first)")
    tts_language: str = Field(default="auto", description="Qwen3-TTS language, or auto")
    tts_max_streams: int = Field(default=8, ge=1, description="Qwen3-TTS replies spoken at once "
                                 "(talker slots; more wait for a free one)")
    tts_first_chunk_frames: int = Field(default=1, ge=1, le=48, description="Qwen3-TTS: "
                                        "12 Hz codec frames (80 ms each) in a reply's first "
                                        "audio chunk (fewer: earlier first audio)")
    tts_chunk_frames: int = Field(default=4, ge=1, le=48, description="Qwen3-TTS: codec "
                                  "frames in each later audio chunk (more: fewer, larger "
                                  "decoder calls; on CUDA one graph per length)")
    tts_batch_buckets: str = Field(default="", pattern=r"^(\d+(,\d+)*)?$",
                                   description="Qwen3-TTS on CUDA: comma-separated batch sizes its "
                                               "CUDA graphs are captured for, each <= tts_max_streams "
                                               "(empty: powers of two)")
    llm: str = Field(default="embedded", pattern=r"^(embedded|openai:https?://.+)$",
                     description="reply model: 'embedded' (shipped SmolLM2, in the engine) or "
                                 "'openai:<server url>' (any OpenAI-compatible "
                                 "/v1/chat/completions server: vLLM, SGLang, llama.cpp, Ollama)")
    llm_model: str | None = Field(default=None, description="model name sent to a remote "
                                  "server (required with llm=openai:...)")
    llm_api_key: str | None = Field(default=None, description="bearer key for a remote server")
    llm_timeout: float = Field(default=30.0, gt=0, description="remote server: seconds to "
                               "connect and to wait for each streamed chunk")
    llm_retries: int = Field(default=2, ge=0, description="remote server: retries of a request "
                             "that failed before its first token (connection error, timeout, "
                             "429/5xx)")
    twilio_auth_token: str | None = Field(default=None, description="validate "
                                          "X-Twilio-Signature on /v1/telephony/twilio* if set")
    ice_hosts: str = Field(default="", description="comma-separated host addresses offered as "
                           "WebRTC ICE candidates (empty: 127.0.0.1 and every interface address)")
    ice_servers: str = Field(default="", description="comma-separated STUN/TURN URLs for WebRTC "
                             "calls, e.g. stun:stun.example.org:3478,turn:turn.example.org:3478")
    turn_username: str | None = Field(default=None, description="username for the TURN servers")
    turn_credential: str | None = Field(default=None, description="password for the TURN servers")
    rtc_ports: str = Field(default="", pattern=r"^(\d+-\d+)?$",
                           description="UDP port range for WebRTC media, e.g. 40000-40199 "
                                       "(empty: any free port)")

    @property
    def remote_llm(self) -> bool:
        """The reply model runs on a remote server (which can call tools)."""
        return self.llm != "embedded"

    def ice_host_list(self) -> list[str]:
        return [h.strip() for h in self.ice_hosts.split(",") if h.strip()]

    def ice_server_list(self) -> list[str]:
        return [u.strip() for u in self.ice_servers.split(",") if u.strip()]

    def tts_bucket_list(self) -> list[int] | None:
        """``tts_batch_buckets`` as sizes (None: the default powers of two)."""
        if not self.tts_batch_buckets:
            return None
        sizes = [int(b) for b in self.tts_batch_buckets.split(",")]
        if not all(1 <= b <= self.tts_max_streams for b in sizes):
            raise ValueError(f"tts_batch_buckets must lie in 1..tts_max_streams "
                             f"({self.tts_max_streams}), got {self.tts_batch_buckets}")
        return sizes

    def rtc_port_range(self) -> tuple[int, int] | None:
        if not self.rtc_ports:
            return None
        low, high = (int(p) for p in self.rtc_ports.split("-"))
        if not 1024 <= low <= high <= 65535:
            raise ValueError(f"rtc_ports must be LOW-HIGH within 1024-65535, got {self.rtc_ports}")
        return low, high


def load_settings(**overrides: object) -> Settings:
    """Read settings once (environment + explicit overrides)."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
