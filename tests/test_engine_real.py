"""The engine core with the real shipped models (CPU): parity, async chunks, batching."""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest
import torch
from conftest import TIME_FACTOR
from speech import espeak

from voxline.config import load_settings
from voxline.engines import protocol as p
from voxline.engines.core import EngineCore
from voxline.engines.factory import load_models, load_reply_model
from voxline.engines.model_memory import LLM_POSITIONS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models():
    return load_models()


class Driver:
    def __init__(self, models) -> None:
        self.woke = threading.Event()
        self.core = EngineCore(models, self.woke.set)
        self.outputs: list[p.EngineOutput] = []

    def send(self, *msgs: p.EngineInput) -> None:
        for m in msgs:
            self.core.add_input(m)

    def run_until(self, pred, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout * TIME_FACTOR
        while not pred(self.outputs):
            assert time.monotonic() < deadline, [type(o).__name__ for o in self.outputs][-20:]
            if not self.core.has_work():
                self.woke.wait(0.05)
                self.woke.clear()
            self.outputs.extend(self.core.step())

    def run_for(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        self.run_until(lambda outs: time.monotonic() >= until)

    def of(self, cls, stream_id: str | None = None):
        return [o for o in self.outputs if isinstance(o, cls)
                and (stream_id is None or o.stream_id == stream_id)]

    def done_count(self, n: int):
        return lambda outs: sum(isinstance(o, p.ResponseFinished) for o in outs) >= n


@pytest.fixture
def driver(models):
    d = Driver(models)
    yield d
    d.core.close()


def hf_greedy(models, prompt: list[int], max_new: int) -> str:
    """Reference: transformers generate() on the same weights and prompt tokens."""
    from voxline.engines.models.llama.checkpoint import load_hf_smollm2

    hf = load_hf_smollm2(torch.float32)
    out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                      max_new_tokens=max_new, do_sample=False,
                      eos_token_id=sorted(models.llm.eos_token_ids), pad_token_id=2)
    return models.llm.decode(out[0, len(prompt):].tolist()).strip()


QUESTIONS = ["What is the capital of France?", "Name three colors.", "What is two plus two?"]


def greedy_replies(models) -> dict[str, str]:
    """Greedy replies of one stream alone, then of three decoding in the same steps."""
    driver = Driver(models)
    try:
        cfg = p.ResponseConfig(audio=False, max_output_tokens=24)
        driver.send(p.OpenStream("solo"), p.AddItem("solo", "u", "user", QUESTIONS[0]),
                    p.CreateResponse("solo", "r", "a", cfg))
        driver.run_until(driver.done_count(1))
        for i, q in enumerate(QUESTIONS):
            driver.send(p.OpenStream(f"b{i}"), p.AddItem(f"b{i}", "u", "user", q),
                        p.CreateResponse(f"b{i}", "r", "a", cfg))
        driver.run_until(driver.done_count(4))
        llm = models.llm
        system = llm.render_message("system", p.StreamConfig().instructions)
        replies = {}
        for sid, q in [("solo", QUESTIONS[0])] + [(f"b{i}", q) for i, q in enumerate(QUESTIONS)]:
            done, = driver.of(p.ResponseFinished, sid)
            assert done.input_tokens == len(system + llm.render_message("user", q)
                                            + llm.generation_header())
            replies[sid] = done.text
        return replies
    finally:
        driver.core.close()


def test_engine_greedy_equals_transformers_generate_alone_and_batched(models):
    # float32 weights: exactly transformers' generate on the same weights and prompts
    f32 = dataclasses.replace(models, llm=load_reply_model(
        load_settings(llm_dtype="float32"), None, max_slots=8, max_len=LLM_POSITIONS))
    llm = f32.llm
    system = llm.render_message("system", p.StreamConfig().instructions)
    replies = greedy_replies(f32)
    for sid, q in [("solo", QUESTIONS[0])] + [(f"b{i}", q) for i, q in enumerate(QUESTIONS)]:
        prompt = system + llm.render_message("user", q) + llm.generation_header()
        assert replies[sid] == hf_greedy(f32, prompt, 24), sid
    # the default int8 weights: batching changes nothing, and the answer is still right
    int8 = greedy_replies(models)
    assert int8["solo"] == int8["b0"]
    assert "Paris" in int8["solo"]


def test_second_turn_reuses_the_cached_conversation(driver):
    cfg = p.ResponseConfig(audio=False, max_output_tokens=16)
    driver.send(p.OpenStream("s"), p.AddItem("s", "u1", "user", "What is the capital of France?"),
                p.CreateResponse("s", "r1", "a1", cfg))
    driver.run_until(driver.done_count(1))
    first = driver.of(p.ResponseFinished)[0]
    driver.send(p.AddItem("s", "u2", "user", "And of Italy?"), p.CreateResponse("s", "r2", "a2", cfg))
    driver.run_until(driver.done_count(2))
    second = driver.of(p.ResponseFinished)[1]
    # everything up to the end of the first reply came from the cache
    assert second.cached_tokens >= first.input_tokens + first.output_tokens - 1
    assert second.input_tokens - second.cached_tokens < 20
    assert "Rome" in second.text


def test_first_audio_arrives_while_the_llm_is_still_writing(driver):
    driver.send(p.OpenStream("s"), p.AddItem("s", "u", "user",
                "Tell me a short story about a cat, in three sentences."),
                p.CreateResponse("s", "r", "a", p.ResponseConfig(max_output_tokens=80)))
    driver.run_until(driver.done_count(1))
    kinds = [type(o).__name__ for o in driver.outputs]
    assert kinds.index("AudioChunk") < max(i for i, k in enumerate(kinds) if k == "ReplyTextDelta")
    chunks = driver.of(p.AudioChunk)
    assert all(c.sample_rate == 22050 and c.text for c in chunks)
    audio = np.concatenate([np.frombuffer(c.audio, "<f4") for c in chunks])
    assert np.abs(audio).max() > 0.1


def test_spoken_turns_on_three_streams_are_batched_and_kept_apart(driver):
    # sentences Moonshine hears the same however much silence follows them (a turn's
    # transcript may be made at a pause, 160 ms after the speech, rather than at its end)
    sentences = {"x": "My dog likes to play football.", "y": "Please open the window.",
                 "z": "Turn on the kitchen lights."}
    silence = np.zeros(16000, np.float32)
    clips = {sid: np.concatenate([silence[:8000], espeak(text), silence])
             for sid, text in sentences.items()}
    for sid in sentences:
        driver.send(p.OpenStream(sid, p.StreamConfig(partial_interval_ms=500)))
    # feed all three at real time, 100 ms at a time, so partials can run during speech
    step = 1600
    for i in range(0, max(len(c) for c in clips.values()), step):
        for sid, clip in clips.items():
            if i < len(clip):
                driver.send(p.AppendAudio(sid, clip[i:i + step].astype("<f4").tobytes()))
        driver.run_for(0.1)
    driver.run_until(lambda outs: sum(isinstance(o, p.TranscriptFinal) for o in outs) == 3)
    key = {"x": "football", "y": "window", "z": "kitchen"}
    for sid in sentences:
        final, = driver.of(p.TranscriptFinal, sid)
        assert key[sid] in final.text.lower(), final.text
        assert len(driver.of(p.VoiceStarted, sid)) == 1
        assert len(driver.of(p.VoiceStopped, sid)) == 1
        # partials may lose the race to the final on a busy machine, but never cross streams
        assert all(o.item_id == final.item_id for o in driver.of(p.TranscriptPartial, sid))


def test_partial_transcripts_arrive_during_speech(driver):
    clip = np.concatenate([np.zeros(8000, np.float32),
                           espeak("Please turn off the lights in the kitchen and close the door."),
                           np.zeros(16000, np.float32)])
    driver.send(p.OpenStream("s", p.StreamConfig(partial_interval_ms=500)))
    for i in range(0, len(clip), 1600):  # real time, 100 ms at a time
        driver.send(p.AppendAudio("s", clip[i:i + 1600].astype("<f4").tobytes()))
        driver.run_for(0.1)
    driver.run_until(lambda outs: any(isinstance(o, p.TranscriptFinal) for o in outs))
    kinds = [type(o).__name__ for o in driver.outputs]
    assert "TranscriptPartial" in kinds
    assert kinds.index("TranscriptPartial") < kinds.index("VoiceStopped")
    assert "kitchen" in driver.of(p.TranscriptFinal)[0].text.lower()
