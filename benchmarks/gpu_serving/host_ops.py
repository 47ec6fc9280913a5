"""Torch calls the host makes per unit of engine work, eager against graph replays (CPU).

    .venv/bin/python benchmarks/gpu_serving/host_ops.py

On a GPU server every torch call a stage's thread makes from Python gives up the GIL and
must win it back from the engine's other threads (each spinning Python for up to the
engine's 0.5 ms switch interval): `bench_gpu_llm_cold.py` measured a 57-token eager
prompt at 16-19 ms alone and 777-878 ms beside one busy thread. So the count of such
calls per plan is what a stage costs the others, whatever the GPU. This counts them on
the CPU, where the same code runs: Python-level torch calls (a ``TorchFunctionMode``) and
the aten ops they dispatch (a ``TorchDispatchMode``), for

- a prompt of the embedded LLM (Llama-3.2-1B's 16 layers, narrow: the count does not
  depend on width): eager (`LlamaModel.forward_batch`) against the prefill-graph path
  (`GraphedLlamaDecoder.prompts`), its replay counted as one call;
- Moonshine's encoder on 1 and 4 clips: eager (`encode_many`) against the bucketed
  encoder (`StaticEncoder.run`), replay as one;
- Moonshine's greedy decoding of those clips: host reads of the picks per transcript (one
  per replay; one per token before four tokens a replay);
- one graphed LLM decode step of 64 rows at 0.8 and its tokens read: the step then
  `sample` against the tokens picked inside the graph (`forward_picked`);
- one Qwen3-TTS step of the graph path with 16 and 64 replies speaking (replays as one);
- sampling 64 LLM rows at temperature 0.8, unseeded (one noise draw) and seeded (a draw
  per row, which is what every row cost before).

Host-bound arms (the graph paths, with replays stubbed) are also timed: the mean host
ms of one unit alone and beside one thread spinning Python at the engine's switch
interval. Not every torch call gives up the GIL (indexing and ``.shape`` keep it; an op
such as ``add`` or ``copy_`` releases it and, beside a busy thread, waits up to a switch
interval to get it back), so the second time is what the calls cost a stage on a loaded
server, as nearly as one CPU can say.

A "replay as one" arm swaps `StaticStep.__call__` for a stand-in that only returns the
step's outputs: on a GPU that call is one `CUDAGraph.replay`.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

from voxline.engines.factory import GIL_SWITCH_INTERVAL_S  # noqa: E402
from voxline.engines.models.llama.graphs import PREFILL_BUCKETS, GraphedLlamaDecoder  # noqa: E402
from voxline.engines.models.llama.model import LlamaModel  # noqa: E402
from voxline.engines.models.sampling import sample  # noqa: E402
from voxline.kernels.cuda_graphs import StaticStep  # noqa: E402


class _Calls(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def count(fn: Callable[[], object], after: Callable[[], object] = lambda: None,
          timed: bool = True, most: int = 400) -> dict[str, object]:
    """Python-level torch calls and aten ops of one call of ``fn``, and (``timed``) its
    mean host time alone and beside a thread spinning Python (``after`` runs between
    calls, untimed). Time only host-bound work: an eager arm's time here is mostly its CPU
    arithmetic, which a GPU would do instead."""
    with _Calls() as calls, _Ops() as ops:
        fn()
    after()
    if not timed:
        return {"torch_calls": calls.n, "aten_ops": sum(ops.ops.values())}
    alone = mean_ms(fn, after, most=most)
    with busy_thread():
        busy = mean_ms(fn, after, most=most)
    return {"torch_calls": calls.n, "aten_ops": sum(ops.ops.values()),
            "host_ms": round(alone, 3), "host_ms_beside_busy_thread": round(busy, 3)}


def mean_ms(fn: Callable[[], object], after: Callable[[], object], budget_s: float = 0.5,
            most: int = 400) -> float:
    """Mean host ms of ``fn`` over as many calls as fit ``budget_s`` (at least 5): a wait
    for the GIL comes at some calls and not others, so the mean is its cost."""
    total, n = 0.0, 0
    while n < 5 or (total < budget_s and n < most):
        t0 = time.perf_counter()
        fn()
        total += time.perf_counter() - t0
        n += 1
        after()
    return total / n * 1e3


@contextmanager
def busy_thread():
    """Another thread spinning Python at the engine's GIL switch interval, as the engine's
    other stages' threads are on a loaded server."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(previous)


@contextmanager
def replay_as_one():
    """StaticStep calls return their outputs without running (a graph replay's one call)."""
    def replay(step: StaticStep) -> dict[str, torch.Tensor]:
        if not step.outputs:
            step._run()  # the first call makes the output buffers (capture does, at load)
        return step.outputs

    with mock.patch.object(StaticStep, "__call__", replay):
        yield


def llm_prompt() -> dict[str, object]:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=16,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                         max_position_embeddings=2048, tie_word_embeddings=True)
    model = LlamaModel(config).eval()
    model.allocate_cache(3, 1024)
    dec = GraphedLlamaDecoder(model, max_streams=2, prefill_buckets=PREFILL_BUCKETS)
    history = torch.randint(0, 512, (157,)).tolist()
    model.forward_batch([0], [history])  # 157 tokens cached, as a conversation's turn
    prompt = torch.randint(0, 512, (57,)).tolist()

    def eager() -> None:
        model.forward_batch([0], [prompt])
        model.cache.truncate(0, 157)

    def graphed() -> None:
        dec.prompts([0], [prompt])
        model.cache.truncate(0, 157)

    graphed()  # make the bucket's step (and its output buffers) first
    with replay_as_one():
        return {"eager": count(eager, timed=False), "prefill graph": count(graphed)}


def decoding(rows: int) -> tuple[LlamaModel, GraphedLlamaDecoder, list[int], list[list[int]]]:
    """A narrow 16-layer Llama with a graphed decoder (eager twins here), ``rows`` slots
    holding 20 tokens each, and a next token for each: a decode step's inputs."""
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=16,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                         max_position_embeddings=2048, tie_word_embeddings=True)
    model = LlamaModel(config).eval()
    model.allocate_cache(rows + 1, 256)
    dec = GraphedLlamaDecoder(model, max_streams=rows)
    slots = list(range(rows))
    model.forward_batch(slots, [torch.randint(0, 512, (20,)).tolist() for _ in slots])
    return model, dec, slots, [[t] for t in torch.randint(0, 512, (rows,)).tolist()]


def llm_decode(rows: int = 64) -> dict[str, object]:
    """One graphed decode step of ``rows`` replies at temperature 0.8 and their tokens read
    on the host: the step, then :func:`sample` over its logits (what the LLM stage did)
    against the tokens picked inside the step's graph (``forward_picked``)."""
    model, dec, slots, tokens = decoding(rows)
    temps = [0.8] * rows

    def then_sample() -> None:
        sample(dec.forward(slots, tokens), temps, generators=[None] * rows).tolist()

    def picked() -> None:
        dec.forward_picked(slots, tokens, temps)[1].tolist()

    def rewind() -> None:  # back to the 20 cached tokens (not counted)
        for s in slots:
            model.cache.truncate(s, 20)

    picked()  # make the bucket's step (and its output buffers) first
    rewind()
    with replay_as_one():
        return {"step, then sample": count(then_sample, rewind),
                "picked in the graph": count(picked, rewind)}


def moonshine() -> dict[str, object]:
    from speech import espeak

    from voxline.engines.models import moonshine_decoder
    from voxline.engines.models.moonshine_asr import BOS_ID, EOS_ID, token_budget
    from voxline.engines.models.moonshine_torch import MoonshineTorchASR

    asr = MoonshineTorchASR.load("cpu", max_batch=4)
    clips = [espeak("What is the capital of France?"),
             espeak("Please set a timer for ten minutes and turn off the kitchen lights."),
             espeak("Good morning."), espeak("How far away is the moon?")]
    out: dict[str, object] = {}
    for n in (1, 4):
        batch = clips[:n]
        asr.encoder.run(batch)
        with replay_as_one():
            out[f"encode {n} clip(s)"] = {"eager": count(lambda b=batch: asr.encode_many(b), timed=False),
                                          "encoder graph": count(lambda b=batch: asr.encoder.run(b))}
    states, frames = asr.encode_many(clips)
    valid = asr._valid(frames, states.shape[1])
    budgets = [token_budget(len(c)) for c in clips]
    reads = Counter()
    real_tolist = torch.Tensor.tolist

    def tolist(t: torch.Tensor):
        reads["n"] += 1
        return real_tolist(t)

    with mock.patch.object(torch.Tensor, "tolist", tolist):
        tokens = asr.decoder.decode(states, valid, budgets, bos=BOS_ID, eos=EOS_ID)
    longest = max(len(t) for t in tokens) + 1  # the steps until every row ended
    out["decode 4 clips"] = {"tokens": [len(t) for t in tokens], "host reads": reads["n"],
                             "host reads at one token a replay": longest,
                             "tokens per replay": moonshine_decoder.TOKENS_PER_REPLAY}
    return out


def tts_step(streams: int = 16) -> dict[str, object]:
    """One Qwen3-TTS step of the graph path with ``streams`` replies speaking (the tests'
    tiny random checkpoint: the count does not depend on the model's size)."""
    import tempfile

    from test_qwen3_tts_stage import make_stage, write_test_checkpoint

    from voxline.engines.models.qwen3_tts import TalkerSampling
    from voxline.engines.speech_model import SpeechJob

    with tempfile.TemporaryDirectory() as tmp:
        stage = make_stage(write_test_checkpoint(Path(tmp) / "model"), graphs=True,
                           max_streams=streams, max_frames=400, max_len=1024,
                           sampling=TalkerSampling(min_frames=300))  # no reply ends early
        for i in range(streams):
            stage.start(SpeechJob(i + 1, "a long enough reply to keep speaking for a while"))
        for _ in range(12):  # every stream admitted and its first chunks out
            stage.step()
        with replay_as_one():
            stage.step()  # the steady step's buffers exist
            # (80 steps in all: every stream still speaking, min_frames above)
            return {f"{streams} streams, a steady step": count(stage.step, most=40)}


def sampling() -> dict[str, object]:
    logits = torch.randn(64, 4096)
    gens = [torch.Generator().manual_seed(i) for i in range(64)]
    # every row seeded: each draws its own noise, as every row did before unseeded rows
    # drew theirs in one go
    # (not timed: on the CPU the softmax over 64 x 4096 is most of it)
    return {"64 unseeded rows at 0.8": count(lambda: sample(logits, [0.8] * 64, generators=[None] * 64),
                                             timed=False),
            "64 seeded rows at 0.8": count(lambda: sample(logits, [0.8] * 64, generators=gens),
                                           timed=False)}


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # speech.espeak
    report = {"llm prompt, 157 cached + 57 new, 16 layers": llm_prompt(),
              "llm decode step, 64 rows at 0.8": llm_decode(),
              "moonshine": moonshine(), "sampling": sampling(),
              "qwen3-tts step": {**tts_step(16), **tts_step(64)}}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
