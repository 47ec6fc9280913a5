"""Responses on a speech stage that takes streaming text (one job per reply), with a
hand-built stage: segments are appended to the reply's one job as the LLM closes them,
the job's text is ended once, and a speculative reply feeds only its first segment until
it is committed."""

from __future__ import annotations

import threading

import numpy as np
from fakes import CountingLM, EnergyVAD, tone
from test_engine_core import Harness, has
from test_speculation import AUTO, CFG, BurstASR, feed, outcomes, silence, speculating

from voxline.engines import protocol as p
from voxline.engines.core import EngineCore, Models
from voxline.engines.responses import STREAMED_MAX_CHARS, new_chunker
from voxline.engines.speech_model import SpeechJob, SpeechOut
from voxline.engines.text_chunker import MIN_CUT_WORDS


class StreamingTones:
    """A `TextStreamingModel`: each step speaks one received segment of each job as a
    short tone; a job ends once its text has ended and every segment was spoken."""

    sample_rate = 16000

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, str]] = []  # (start/append/end, job, text)
        self.jobs: dict[int, tuple[list[str], bool]] = {}  # job -> (unspoken, text open)

    def start(self, job: SpeechJob) -> None:
        self.calls.append(("start", job.job_id, job.text))
        self.jobs[job.job_id] = ([job.text], job.more_text)

    def append_text(self, job_id: int, text: str) -> None:
        self.calls.append(("append", job_id, text))
        if job_id in self.jobs:
            self.jobs[job_id][0].append(text)

    def end_text(self, job_id: int) -> None:
        self.calls.append(("end", job_id, ""))
        if job_id in self.jobs:
            self.jobs[job_id] = (self.jobs[job_id][0], False)

    def cancel(self, job_id: int) -> None:
        self.jobs.pop(job_id, None)

    def has_work(self) -> bool:
        return any(texts or not open_ for texts, open_ in self.jobs.values())

    def step(self) -> list[SpeechOut]:
        outs = []
        for job_id, (texts, open_) in list(self.jobs.items()):
            text = texts.pop(0) if texts else ""
            finished = not texts and not open_
            audio = np.full(160, 0.1, np.float32) if text else np.zeros(0, np.float32)
            outs.append(SpeechOut(job_id, audio, self.sample_rate, text, finished))
            if finished:
                del self.jobs[job_id]
        return outs


def harness(stop_after: int = 12) -> Harness:
    h = Harness.__new__(Harness)
    h.woke = threading.Event()
    h.lm = CountingLM(stop_after=stop_after, step_seconds=0.01)
    h.asr = BurstASR()
    h.tts = StreamingTones()
    h.core = EngineCore(Models(EnergyVAD(), h.asr, h.lm, h.tts), h.woke.set)
    h.outputs = []
    return h


def test_a_reply_is_one_job_fed_segment_by_segment():
    h = harness()
    h.send(p.OpenStream("s1", p.StreamConfig(turn_detection=None)),
           p.AddItem("s1", "u1", "user", "talk"), p.CreateResponse("s1", "r1", "a1"))
    h.run_until(has(p.ResponseFinished))
    (done,) = h.of(p.ResponseFinished)
    kinds = [c[0] for c in h.tts.calls]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("start") == 1
    assert kinds.count("end") == 1 and kinds.count("append") >= 1
    assert {c[1] for c in h.tts.calls} == {h.tts.calls[0][1]}  # all to the one job
    assert " ".join(c[2] for c in h.tts.calls if c[2]) == done.text
    spoken = " ".join(c.text for c in h.of(p.AudioChunk) if c.text)
    assert done.status == p.ResponseStatus.COMPLETED and spoken == done.text
    h.close()


def test_a_speculative_reply_feeds_only_its_first_segment_until_committed():
    h = harness(stop_after=12)
    h.send(p.OpenStream("s1", CFG))
    feed(h, np.concatenate([silence(0.3), tone(0.6), silence(0.25)]))
    h.run_until(lambda _: (run := speculating(h)) is not None and run.llm_done)
    assert outcomes(h) == ["started"] and not h.of(p.AudioChunk)
    assert [c[0] for c in h.tts.calls] == ["start"], "held: no appends, no end"
    assert speculating(h).tts_queue, "the later segments wait"
    feed(h, silence(0.55))
    h.run_until(has(p.TranscriptFinal))
    h.send(p.CreateResponse("s1", "r1", "a1", AUTO))
    h.run_until(has(p.ResponseFinished))
    (done,) = h.of(p.ResponseFinished)
    assert outcomes(h) == ["started", "committed"]
    kinds = [c[0] for c in h.tts.calls]
    assert kinds[0] == "start" and kinds.count("start") == 1 and kinds[-1] == "end"
    assert " ".join(c[2] for c in h.tts.calls if c[2]) == done.text
    assert done.status == p.ResponseStatus.COMPLETED
    h.close()


def test_a_streamed_reply_reaches_the_talker_a_few_words_at_a_time():
    """A streaming-text TTS speaks one text token per frame while the text is open, so
    text the chunker held back would be a gap: unpunctuated text comes in short segments,
    where a segment-at-a-time TTS would get a single 250-character one."""
    h = harness(stop_after=40)
    h.send(p.OpenStream("s1", p.StreamConfig(turn_detection=None)),
           p.AddItem("s1", "u1", "user", "talk"), p.CreateResponse("s1", "r1", "a1"))
    h.run_until(has(p.ResponseFinished))
    (done,) = h.of(p.ResponseFinished)
    texts = [c[2] for c in h.tts.calls if c[2]]
    assert len(texts) >= 4 and " ".join(texts) == done.text
    assert all(len(t) <= STREAMED_MAX_CHARS or len(t.split()) <= MIN_CUT_WORDS for t in texts)
    h.close()
    words = " ".join(f"word{i}" for i in range(40))  # no punctuation at all, as random weights write
    streamed, whole = new_chunker(streams_text=True), new_chunker(streams_text=False)
    assert len(streamed.push(words)) >= 15
    first, rest = whole.push(words)  # the first words, then one long segment (max_chars)
    assert first == "word0 word1" and len(rest) > 200
