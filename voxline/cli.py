"""The `voxline` command line."""

from __future__ import annotations

import argparse
import os
import re
import sys

_TTS = re.compile(r"^(piper|qwen3:.+)$")


def _tts_choice(value: str) -> str:
    if not _TTS.match(value):
        raise argparse.ArgumentTypeError("expected 'piper' or 'qwen3:<checkpoint dir>'")
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
                       help="concurrent /v1/realtime sessions (default: 16)")
    serve.add_argument("--engine", choices=["process", "inprocess"], default=None,
                       help="engine in a supervised child process (default) or a thread")
    serve.add_argument("--output-lead-ms", type=float, default=None,
                       help="audio sent ahead of real-time playout, <= 1000 (default: 200)")
    serve.add_argument("--tts", type=_tts_choice, default=None,
                       help="speech model: piper (shipped voice, default) or qwen3:<checkpoint dir> "
                            "(Qwen3-TTS, official layout); env VOXLINE_TTS")

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
    say.add_argument("--seed", type=int, default=None, help="Qwen3-TTS sampling seed (default: random)")
    return parser


def _say_qwen3(args: argparse.Namespace) -> int:
    """`voxline say --tts qwen3:DIR`: one utterance through the Qwen3-TTS speech stage."""
    from voxline.codecs.resample import resample
    from voxline.codecs.wav import write_wav
    from voxline.config import load_settings
    from voxline.engines.factory import load_tts
    from voxline.engines.models.qwen3_tts.stage import Qwen3SpeechStage
    from voxline.errors import VoxlineError

    try:
        stage = load_tts(load_settings(tts=args.tts))
        assert isinstance(stage, Qwen3SpeechStage)
        audio = stage.synthesize_all(args.text, seed=args.seed)
    except (VoxlineError, FileNotFoundError, ValueError) as exc:
        print(f"voxline say: error: {exc}", file=sys.stderr)
        return 1
    write_wav(args.output, resample(audio, stage.sample_rate, args.rate), args.rate)
    note = " -- random-weight test checkpoint: noise, not speech" if stage.random_weights else ""
    print(f"wrote {args.output} ({len(audio) / stage.sample_rate:.1f} s, {args.rate} Hz){note}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from voxline.logs import setup_logging

    setup_logging(args.verbose)
    if args.command == "serve" and args.tts:
        os.environ["VOXLINE_TTS"] = args.tts  # read by the engine's settings (child process too)
    if args.command == "say" and args.tts != "piper":
        return _say_qwen3(args)
    from voxline import commands

    return commands.run(args)


if __name__ == "__main__":
    sys.exit(main())
