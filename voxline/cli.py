"""The `voxline` command line. `serve`'s flags are generated from `Settings`' fields
(`voxline.config.add_setting_flags`): a setting is added, documented and validated there."""

from __future__ import annotations

import argparse
import sys

from voxline.config import add_setting_flags, field_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="voxline",
        description="voxline: a streaming real-time voice engine (CPU by default, shipped models).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = sub.add_parser(
        "serve", help="run the HTTP / WebSocket server with its engine process",
        description="Run the HTTP / WebSocket server with its engine process. Every flag is "
                    "a setting; its VOXLINE_* environment variable sets it too (a flag wins).")
    add_setting_flags(serve)

    converse = sub.add_parser(
        "converse", help="one spoken turn from a WAV file: ASR -> LLM -> TTS, reply as 24 kHz WAV"
    )
    converse.add_argument("--input", required=True, help="WAV file with the spoken question")
    converse.add_argument("--output", required=True, help="where to write the spoken reply (WAV)")
    converse.add_argument("--seed", type=int, default=None, help="sampling seed (default: greedy)")
    converse.add_argument("--turn-detection", choices=["semantic_vad", "server_vad"],
                          default="semantic_vad",
                          help="semantic_vad (default: end-of-turn model + transcript rules, "
                               "eagerness auto) or server_vad (500 ms of silence)")

    say = sub.add_parser("say", help="synthesize text to a WAV file (shipped Piper voice by default)")
    say.add_argument("text", help="text to speak")
    say.add_argument("--output", required=True, help="WAV file to write")
    say.add_argument("--rate", type=int, default=24000, help="output sample rate (default: %(default)s)")
    say.add_argument("--tts", type=field_parser("tts"), default="piper",
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
    bench.add_argument("--input", choices=["audio", "text"], default="audio",
                       help="realtime: spoken questions, or text user messages + "
                            "response.create (timed from the send) (default: %(default)s)")
    bench.add_argument("--max-output-tokens", type=int, default=None,
                       help="realtime: the session's max_output_tokens (the reply length cap; "
                            "the report records it and the replies' measured length)")
    bench.add_argument("--barge-in-fraction", type=float, default=0.0,
                       help="realtime, spoken turns: the fraction of turns (drawn from --seed) "
                            "on which the client talks over the reply, streaming its next "
                            "question --barge-in-after seconds after the reply's first audio; "
                            "timed to the reply's audio stopping (default: %(default)s)")
    bench.add_argument("--barge-in-after", type=float, default=1.0,
                       help="seconds from a reply's first audio to a barge-in "
                            "(default: %(default)s)")
    bench.add_argument("--concurrency", default="1",
                       help="closed-loop sweep, comma-separated (default: %(default)s)")
    bench.add_argument("--rate", type=float, default=None,
                       help="open-loop Poisson arrivals per second instead of the sweep")
    bench.add_argument("--requests", type=int, default=4,
                       help="requests per level (default: %(default)s)")
    bench.add_argument("--ramp", type=float, default=0.0,
                       help="closed loop: the c sessions start spread evenly over this many "
                            "seconds instead of all at once, so their turns are not in step "
                            "(default: %(default)s, a burst)")
    bench.add_argument("--turns", type=int, default=1,
                       help="realtime: turns per session; each session (a conversation) asks "
                            "this many questions in a row, the next once the reply has played "
                            "out, and --requests counts turns (default: %(default)s)")
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
    bench.add_argument("--seed", type=int, default=0,
                       help="seed of the Poisson arrivals and of the turns barged in on")
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
    from voxline import subcommands

    return subcommands.run(args)


if __name__ == "__main__":
    sys.exit(main())
