"""End of speech -> first reply audio: the embedded SmolLM2 vs the same model on llama.cpp's
OpenAI-compatible server (`--llm openai:URL`), measured side by side in one run.

Both engines run in this process (`InProcessEngineClient`, shipped VAD, ASR and Piper TTS);
the llama.cpp server (llama-cpp-python[server], the cached venv of
scripts/llama_server_venv.sh) serves the shipped SmolLM2 GGUF on 127.0.0.1 with one
thread. Spoken questions (espeak-ng) are fed at real time in 20 ms chunks, each on a fresh
stream; utterances alternate between the two engines (and which goes first), so both see
the same machine load. Latency: from the engine's `SpeechStopped` (end of speech after
the VAD's silence window, as `voxline converse` reports) to the first `AudioChunk`; the
reply is cancelled there. Also printed: the remote server's time to first token.

    .venv/bin/python benchmarks/cpu_latency/bench_remote_llm.py [--utterances 8] [--llama-threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from llama_server import MODEL_ALIAS, LlamaServer  # noqa: E402

from voxline.codecs.resample import resample  # noqa: E402
from voxline.codecs.wav import read_wav  # noqa: E402
from voxline.engines import protocol as p  # noqa: E402
from voxline.engines.client import EngineClient, InProcessEngineClient  # noqa: E402
from voxline.engines.launch import DEFAULT_CORE  # noqa: E402

CHUNK = p.INPUT_RATE * 20 // 1000
QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Why is the sky blue?",
    "Who wrote Romeo and Juliet?",
    "What is the largest planet in our solar system?",
    "How do I make a good cup of tea?",
    "What language do people speak in Brazil?",
    "Tell me a fun fact about octopuses.",
]


def espeak(text: str) -> np.ndarray:
    with tempfile.NamedTemporaryFile(suffix=".wav") as f:
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", f.name, text], check=True)
        audio, rate = read_wav(f.name)
    return resample(audio, rate, p.INPUT_RATE)


async def turn(client: EngineClient, stream_id: str, audio: np.ndarray) -> tuple[float, float | None]:
    """One spoken question; (speech stopped -> first audio ms, remote first token ms)."""
    stream = await client.open_stream(stream_id, p.StreamConfig(transcribe_partials=False))
    pad = np.zeros(int(0.5 * p.INPUT_RATE), np.float32)
    samples = np.concatenate([pad, audio, pad, pad, pad])

    async def feed() -> None:
        for i in range(0, len(samples), CHUNK):
            stream.send(p.AppendAudio(stream_id, samples[i:i + CHUNK].astype("<f4").tobytes()))
            await asyncio.sleep(0.02)

    feeder = asyncio.create_task(feed())
    stopped = first_audio = None
    ttft = None
    try:
        async for out in stream:
            match out:
                case p.VoiceStopped() if stopped is None:
                    stopped = time.perf_counter()
                    stream.send(p.CreateResponse(stream_id, "r1", "a1"))
                case p.AudioChunk() if first_audio is None:
                    first_audio = time.perf_counter()
                    stream.send(p.CancelResponse(stream_id))
                case p.ResponseFinished():
                    ttft = out.first_token_ms
                    break
                case p.StreamError():
                    raise RuntimeError(f"{out.code}: {out.message}")
    finally:
        feeder.cancel()
        await stream.aclose()
    if stopped is None or first_audio is None:
        raise RuntimeError("no reply audio")
    return (first_audio - stopped) * 1000, ttft


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--utterances", type=int, default=8, help="questions per engine")
    parser.add_argument("--llama-threads", type=int, default=1,
                        help="threads of the llama.cpp server (default: %(default)s)")
    args = parser.parse_args()
    audio = [espeak(q) for q in QUESTIONS]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        server = LlamaServer(Path(tmp) / "llama.log", threads=args.llama_threads)
        server.start()
        print(f"llama.cpp server up in {time.perf_counter() - t0:.1f} s at {server.url}")
        engines = {
            "embedded": InProcessEngineClient(DEFAULT_CORE, {}),
            "llama.cpp": InProcessEngineClient(DEFAULT_CORE, {
                "llm": "openai:" + server.url, "llm_model": MODEL_ALIAS}),
        }
        try:
            for client in engines.values():
                await client.start()
            for name, client in engines.items():  # warm: first requests pay for lazy setup
                await turn(client, f"warm-{name}", audio[0])
            lat: dict[str, list[float]] = {n: [] for n in engines}
            ttfts: list[float] = []
            for i in range(args.utterances):
                order = list(engines) if i % 2 == 0 else list(reversed(engines))
                for name in order:
                    ms, ttft = await turn(engines[name], f"{name}-{i}", audio[i % len(audio)])
                    lat[name].append(ms)
                    if ttft is not None:
                        ttfts.append(ttft)
                    print(f"  {name:9s} #{i}: {ms:6.0f} ms", flush=True)
        finally:
            for client in engines.values():
                await client.close()
            server.stop()
    print(f"\nend of speech (VAD speech_stopped) -> first reply audio, {args.utterances} "
          "utterances each, interleaved")
    for name, values in lat.items():
        print(f"  {name:9s} p50 {pct(values, 50):6.0f} ms   p95 {pct(values, 95):6.0f} ms")
    ratio = pct(lat["llama.cpp"], 50) / pct(lat["embedded"], 50)
    print(f"  ratio llama.cpp / embedded (p50): {ratio:.2f}")
    if ttfts:
        print(f"  llama.cpp time to first token: p50 {pct(ttfts, 50):.0f} ms, "
              f"p95 {pct(ttfts, 95):.0f} ms")


if __name__ == "__main__":
    asyncio.run(main())
