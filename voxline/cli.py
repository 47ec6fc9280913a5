"""The `voxline` command line."""

from __future__ import annotations

import argparse
import re
import sys

_TTS = re.compile(r"^(piper|qwen3:.+)$")
_LLM = re.compile(r"^openai:https?://.+$")


def _tts_choice(value: str) -> str:
    if not _TTS.match(value):
        raise argparse.ArgumentTypeError("expected 'piper' or 'qwen3:<checkpoint dir>'")
    return value


def _llm_choice(value: str) -> str:
    if value != "embedded" and not _LLM.match(value):
        raise argparse.ArgumentTypeError("expected 'embedded' or 'openai:<server url>' "
                                         "(http:// or https://)")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="voxline",
        description="voxline: a streaming real-time voice engine (CPU by default, shipped models).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = sub.add_parser("serve", help="run the HTTP / WebSocket server with its engine process")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: %(default)s)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port (default: %(default)s)")
    serve.add_argument("--api-key", default=None,
                       help="require this key (Authorization: Bearer, or the browser "
                            "subprotocol openai-insecure-api-key.<key>); env VOXLINE_API_KEY")
    serve.add_argument("--max-sessions", type=int, default=None,
                       help="concurrent voice sessions: /v1/realtime WebSockets, WebRTC calls and "
                            "Twilio streams together; each holds an LLM cache slot, sized to this. "
                            "Past it: close 1013 / HTTP 503 + Retry-After (default: 8)")
    serve.add_argument("--max-responses", type=int, default=None,
                       help="replies and /v1/audio/speech requests the engine generates at once; "
                            "past it a reply fails with error code server_busy and speech gets "
                            "HTTP 503 + Retry-After (default: 8)")
    serve.add_argument("--send-buffer-kb", type=int, default=None,
                       help="KiB of events queued for a client that stopped reading before its "
                            "connection is dropped; other sessions are unaffected (default: 1024)")
    serve.add_argument("--speculate-after-ms", type=float, default=None,
                       help="a pause this long in a user's turn starts its transcript and reply "
                            "speculatively, so the reply is ready when the turn ends; dropped "
                            "unsent if the user goes on (0: off; default: 160)")
    serve.add_argument("--engine", choices=["process", "inprocess"], default=None,
                       help="engine in a supervised child process (default) or a thread")
    serve.add_argument("--output-lead-ms", type=float, default=None,
                       help="audio sent ahead of real-time playout, <= 1000 (default: 200)")
    serve.add_argument("--shutdown-grace", type=float, default=None,
                       help="on SIGTERM/SIGINT: seconds replies in flight may take to finish "
                            "before sessions close with 1001 (default: 5)")
    serve.add_argument("--tts", type=_tts_choice, default=None,
                       help="speech model: piper (shipped voice, default) or qwen3:<checkpoint dir> "
                            "(Qwen3-TTS, official layout); env VOXLINE_TTS")
    serve.add_argument("--llm", type=_llm_choice, default=None, metavar="embedded|openai:URL",
                       help="reply model: embedded (shipped SmolLM2, default) or openai:<server "
                            "url> for any OpenAI-compatible /v1/chat/completions server (vLLM, "
                            "SGLang, llama.cpp, Ollama), e.g. openai:http://127.0.0.1:8080/v1; "
                            "env VOXLINE_LLM")
    serve.add_argument("--llm-dtype", choices=["int8", "float32", "bfloat16"], default=None,
                       help="weights of the embedded LLM: int8 (decode steps read int8 "
                            "weights, about 2x faster than float32 on a CPU; prefill, "
                            "attention and the cache stay float32; default on the CPU), "
                            "float32, or bfloat16; env VOXLINE_LLM_DTYPE")
    serve.add_argument("--device", choices=["cpu", "cuda"], default=None,
                       help="torch device of the embedded LLM and of Qwen3-TTS (Piper always "
                            "runs on the CPU): cuda puts both on the GPU (the LLM in bfloat16 "
                            "unless --llm-dtype; Qwen3-TTS with CUDA graphs); env "
                            "VOXLINE_LLM_DEVICE / VOXLINE_TTS_DEVICE")
    serve.add_argument("--llm-model", default=None,
                       help="model name sent to the remote server (required with --llm openai:)")
    serve.add_argument("--llm-api-key", default=None,
                       help="bearer key for the remote server; env VOXLINE_LLM_API_KEY")
    serve.add_argument("--llm-timeout", type=float, default=None,
                       help="remote server: seconds to connect and to wait for each streamed "
                            "chunk (default: 30)")
    serve.add_argument("--llm-retries", type=int, default=None,
                       help="remote server: retries of a request that failed before its first "
                            "token (default: 2)")
    serve.add_argument("--ice-hosts", default=None,
                       help="WebRTC: comma-separated host addresses offered as ICE candidates "
                            "(default: 127.0.0.1 and every interface address); env "
                            "VOXLINE_ICE_HOSTS")
    serve.add_argument("--ice-servers", default=None,
                       help="WebRTC: comma-separated STUN/TURN URLs, e.g. "
                            "stun:stun.example.org:3478 (default: none); TURN credentials from "
                            "VOXLINE_TURN_USERNAME / VOXLINE_TURN_CREDENTIAL")
    serve.add_argument("--rtc-ports", default=None,
                       help="WebRTC: UDP port range LOW-HIGH for media (default: any free port)")

    converse = sub.add_parser(
        "converse", help="one spoken turn from a WAV file: ASR -> LLM -> TTS, reply as 24 kHz WAV"
    )
    converse.add_argument("--input", required=True, help="WAV file with the spoken question")
    converse.add_argument("--output", required=True, help="where to write the spoken reply (WAV)")
    converse.add_argument("--seed", type=int, default=None, help="sampling seed (default: greedy)")

    say = sub.add_parser("say", help="synthesize text to a WAV file (shipped Piper voice by default)")
    say.add_argument("text", help="text to speak")
    say.add_argument("--output", required=True, help="WAV file to write")
    say.add_argument("--rate", type=int, default=24000, help="output sample rate (default: %(default)s)")
    say.add_argument("--tts", type=_tts_choice, default="piper",
                     help="piper (default) or qwen3:<checkpoint dir>")
    say.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    bench = sub.add_parser(
        "bench", help="load a running server (realtime turns or streamed speech) and measure it",
        description="Drive a RUNNING voxline server over /v1/realtime or /v1/audio/speech: "
                    "a concurrency sweep or a Poisson arrival rate; time to first audio, end of "
                    "speech -> first audio, RTF, audio-seconds per second, playout underruns "
                    "(gaps > 100 ms), errors by type, as mean/p50/p90/p95/p99. Loopback only "
                    "unless --allow-remote. Exit 1 when a gate fails, 2 on a usage error. "
                    "--plot needs matplotlib, which voxline does not install.")
    bench.add_argument("--url", default="http://127.0.0.1:8000",
                       help="server base URL (default: %(default)s)")
    bench.add_argument("--allow-remote", action="store_true",
                       help="allow a --url host other than 127.0.0.1/localhost")
    bench.add_argument("--mode", choices=["realtime", "speech"], default="realtime",
                       help="realtime: spoken turns over /v1/realtime; speech: /v1/audio/speech "
                            "pcm streaming (default: %(default)s)")
    bench.add_argument("--turn-detection", choices=["server_vad", "manual"], default="server_vad",
                       help="realtime: end turns by server VAD or by commit + response.create")
    bench.add_argument("--concurrency", default="1",
                       help="closed-loop sweep, comma-separated (default: %(default)s)")
    bench.add_argument("--rate", type=float, default=None,
                       help="open-loop Poisson arrivals per second instead of the sweep")
    bench.add_argument("--requests", type=int, default=4,
                       help="requests per level (default: %(default)s)")
    bench.add_argument("--timeout", type=float, default=60.0,
                       help="seconds per request before it counts as a timeout (default: %(default)s)")
    bench.add_argument("--max-seconds", type=float, default=600.0,
                       help="no new request starts after this many seconds of a level "
                            "(default: %(default)s)")
    bench.add_argument("--audio-dir", default=None,
                       help="realtime: question WAVs (default: generated with espeak-ng, "
                            "else the shipped Piper voice)")
    bench.add_argument("--voice", default="alloy", help="speech: voice (default: %(default)s)")
    bench.add_argument("--api-key", default=None, help="sent as Authorization: Bearer")
    bench.add_argument("--seed", type=int, default=0, help="seed of the Poisson arrivals")
    bench.add_argument("--json", default=None, help="write the full report to this JSON file")
    bench.add_argument("--plot", default=None,
                       help="PNG of latency percentiles and underruns against concurrency "
                            "(only if matplotlib is importable; not a voxline dependency)")
    bench.add_argument("--gates", default=None,
                       help="TOML ([[gate]]) or JSON gates: level, metric, stat, max/min")
    bench.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"), default=None,
                       help="print B/A ratios of two reports and exit (runs nothing)")
    bench.add_argument("--quiet", action="store_true", help="no progress line")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from voxline.logs import setup_logging

    setup_logging(args.verbose)
    from voxline import commands

    return commands.run(args)


if __name__ == "__main__":
    sys.exit(main())
