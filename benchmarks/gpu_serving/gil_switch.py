"""The engine's threads sharing the GIL at different switch intervals (CPU, host work).

    .venv/bin/python benchmarks/gpu_serving/gil_switch.py [--seconds 3] [--intervals-us 500,100,50]

On a GPU server the stages' threads run beside each other in one process: the engine
loop (Python bookkeeping), the LLM worker and the TTS worker (torch calls around graph
replays). A torch call gives up the GIL, and taking it back waits while another thread
runs Python, up to the switch interval (`voxline.engines.factory.GIL_SWITCH_INTERVAL_S`).
This runs three such threads at once for ``--seconds`` per arm, graph replays stubbed
(`host_ops.replay_as_one`: their host work only, which is what the GIL serialises):

- tts: Qwen3-TTS graph-path steps with 64 replies speaking (the tests' tiny checkpoint;
  when all 64 have said 400 frames, 64 more start);
- llm: graphed decode steps of 64 rows at temperature 0.8, tokens picked in the graph;
- loop: pure Python, a stand-in for the engine loop's routing (events built and
  JSON-encoded).

Each arm reports every thread's units per second and mean ms per unit. Arms run in the
order given, each interval twice (a, b, a, b), so drift between arms is visible.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent),
                str(Path(__file__).resolve().parents[2] / "tests")]

from host_ops import decoding, replay_as_one  # noqa: E402


def tts_unit(tmp: Path, streams: int = 64):
    from test_qwen3_tts_stage import make_stage, write_test_checkpoint

    from voxline.engines.models.qwen3_tts import TalkerSampling
    from voxline.engines.speech_model import SpeechJob

    stage = make_stage(write_test_checkpoint(tmp / "model"), graphs=True, max_streams=streams,
                       max_frames=400, max_len=1024, sampling=TalkerSampling(min_frames=300))
    jobs = iter(range(1, 1 << 30))

    def step() -> None:
        if not stage.has_work():  # every reply has ended (400 frames): the next 64 start
            for _ in range(streams):
                stage.start(SpeechJob(next(jobs), "a long enough reply to keep speaking for a while"))
        stage.step()

    return step


def llm_unit(rows: int = 64):
    model, dec, slots, tokens = decoding(rows)

    def step() -> None:
        dec.forward_picked(slots, tokens, [0.8] * rows)[1].tolist()
        for s in slots:
            model.cache.truncate(s, 20)

    return step


def loop_unit() -> None:
    events = [{"type": "response.output_audio_transcript.delta", "response_id": f"resp_{i}",
               "item_id": f"item_{i}", "output_index": 0, "content_index": 0, "delta": "word "}
              for i in range(64)]
    json.dumps(events)


def run_arm(units: dict, interval_s: float, seconds: float) -> dict:
    sys.setswitchinterval(interval_s)
    stop = threading.Event()
    done: dict[str, int] = {}
    busy: dict[str, float] = {}

    def worker(name: str, fn) -> None:
        n, t0 = 0, time.perf_counter()
        while not stop.is_set():
            fn()
            n += 1
        busy[name] = time.perf_counter() - t0
        done[name] = n

    threads = [threading.Thread(target=worker, args=(name, fn)) for name, fn in units.items()]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return {name: {"per_s": round(done[name] / busy[name], 1),
                   "ms_each": round(busy[name] / max(1, done[name]) * 1e3, 3)} for name in units}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--intervals-us", default="500,100,50")
    args = parser.parse_args(argv)
    intervals = [int(x) for x in args.intervals_us.split(",")]
    previous = sys.getswitchinterval()
    report = []
    with tempfile.TemporaryDirectory() as tmp, replay_as_one():
        units = {"tts": tts_unit(Path(tmp)), "llm": llm_unit(), "loop": loop_unit}
        alone = {name: run_arm({name: fn}, 0.0005, args.seconds / 2) for name, fn in units.items()}
        print("alone:", json.dumps({k: v[k] for k, v in alone.items()}), flush=True)
        for us in intervals * 2:
            arm = run_arm(units, us / 1e6, args.seconds)
            report.append({"interval_us": us, **arm})
            print(f"{us:4d} us:", json.dumps(arm), flush=True)
    sys.setswitchinterval(previous)
    print(json.dumps({"alone": {k: v[k] for k, v in alone.items()}, "arms": report}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
