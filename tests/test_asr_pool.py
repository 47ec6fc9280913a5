"""Concurrent one-clip transcriptions (`asr_workers`): the ASR stage hands several finals
to `ConcurrentASR` at once, they run side by side, and each transcript is exactly a lone
transcription's."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import TIME_FACTOR
from speech import espeak

from voxline.config import Settings
from voxline.engines.asr_stage import ASRJob, ASRStage
from voxline.engines.factory import load_asr
from voxline.engines.models.asr_pool import ConcurrentASR
from voxline.engines.models.moonshine_asr import MoonshineASR
from voxline.engines.models.whisper_asr import TranscriptionOptions


class MeetingASR:
    """Transcribes a clip only once `parties` clips are being transcribed at the same time
    (a barrier): a pool that ran them one by one would time out instead."""

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, timeout=10 * TIME_FACTOR)
        self.threads: set[str] = set()

    def transcribe(self, audio: np.ndarray) -> str:
        self.threads.add(threading.current_thread().name)
        self.barrier.wait()
        return f"{len(audio)} samples"


def test_the_stage_runs_up_to_workers_finals_side_by_side_in_order():
    model = MeetingASR(parties=3)
    stage = ASRStage(ConcurrentASR(model, workers=3))
    for n in (100, 200, 300, 400):
        stage.add(ASRJob(stream_id=n, item_id=f"item{n}", audio=np.zeros(n, np.float32),
                            final=True))
    plan = stage.schedule()
    assert plan is not None and [job.stream_id for job in plan] == [100, 200, 300]
    assert stage.execute(plan) == ["100 samples", "200 samples", "300 samples"]
    assert len(model.threads) == 3  # the calling thread and two pool threads
    assert not [t for t in threading.enumerate() if t.name.startswith("voxline-asr-pool")]


def test_options_the_model_cannot_take_are_refused_not_ignored():
    asr = ConcurrentASR(MeetingASR(parties=1), workers=2)
    with pytest.raises(ValueError, match="no transcription language or prompt"):
        asr.transcribe_many([np.zeros(10, np.float32)], [TranscriptionOptions(language="fr")])
    with pytest.raises(ValueError, match="at least 2 workers"):
        ConcurrentASR(MeetingASR(parties=1), workers=1)


def test_concurrent_moonshine_transcripts_equal_lone_ones():
    lone = MoonshineASR.load()
    clips = [espeak(text) for text in ("What is the capital of France?", "Good morning.",
                                       "Please turn off the kitchen lights.", "Thank you.")]
    want = [lone.transcribe(clip) for clip in clips]
    pooled = load_asr(Settings(asr_workers=4), threads=1)
    assert isinstance(pooled, ConcurrentASR) and pooled.max_batch == 4
    assert pooled.transcribe_many(clips, [TranscriptionOptions()] * 4) == want
    assert "capital" in want[0].lower()


def test_asr_workers_is_refused_for_whisper(tmp_path):
    with pytest.raises(ValueError, match="asr_workers=2 applies to Moonshine"):
        load_asr(Settings(asr=f"whisper:{tmp_path}", asr_workers=2), threads=1)
