"""The pause transcript taken where the speech fell silent, and the speculative reply's
first words held until the turn is committed (hand-built models; one real-Piper variant).

An early take (`turns.EarlyTake`) is a plain transcription of the utterance through the
frame where its speech fell silent; it is the pause transcript (and the final one) only
while no voice follows it. A speculation speaks its first segment inside the silence
window; what the client receives after the commit is exactly what a run without
speculation sends for the same turn.
"""

from __future__ import annotations

import numpy as np
import pytest
from fakes import EnergyVAD, tone
from test_engine_core import Harness, has
from test_speculation import CFG, BurstASR, feed, silence, speculating

from voxline.engines import protocol as p
from voxline.engines.asr_stage import ASRJob, ASRStage
from voxline.engines.input_audio import SPEECH_END_MS
from voxline.engines.vad_stage import VAD_FRAME as FRAME_SAMPLES

SPEECH = 0.01  # EnergyVAD: a frame is voiced above this RMS
SEEDED = p.ResponseConfig(voice="alloy", seed=7)  # the same audio for the same text


class RecordingASR:
    """A transcript that is a function of every sample of the clip; records each clip."""

    def __init__(self) -> None:
        self.clips: list[np.ndarray] = []

    @staticmethod
    def text_of(audio: np.ndarray) -> str:
        digest = hash(np.asarray(audio, np.float32).tobytes()) % 10_000
        return f"take of {len(audio)} samples {digest}"

    def transcribe(self, audio: np.ndarray) -> str:
        self.clips.append(np.array(audio, copy=True))
        return self.text_of(audio)


class LevelVAD(EnergyVAD):
    """Speech probability that grows with the frame's RMS: a quiet tone lands between
    threshold - 0.15 and threshold (a breath: it keeps the turn's voice, never resumes)."""

    def process(self, frames: np.ndarray, states: list) -> np.ndarray:
        return np.clip(np.sqrt((frames**2).mean(axis=1)) / 0.2, 0.0, 1.0).astype(np.float32)


def harness(asr=None, vad=None, **kwargs) -> Harness:
    h = Harness(**kwargs)
    h.core.asr.model = asr or RecordingASR()
    if vad is not None:
        h.core.vad.model = vad
    return h


def speech_end(audio: np.ndarray, after: int) -> int:
    """End sample of the frame where EnergyVAD has heard `SPEECH_END_MS` of silence since
    the voice that ended past sample `after`."""
    k = after // FRAME_SAMPLES
    while np.sqrt((audio[k * FRAME_SAMPLES:(k + 1) * FRAME_SAMPLES] ** 2).mean()) > SPEECH:
        k += 1
    return (k + round(SPEECH_END_MS * 16 / FRAME_SAMPLES)) * FRAME_SAMPLES


def run_turn(h: Harness, audio: np.ndarray) -> p.TranscriptFinal:
    h.send(p.OpenStream("s1", CFG))
    feed(h, audio)
    h.run_until(has(p.TranscriptFinal))
    final, = h.of(p.TranscriptFinal)
    return final


def test_the_pause_transcript_is_the_early_take_exactly_and_needs_no_asr_of_its_own():
    audio = np.concatenate([silence(0.3), tone(0.6), silence(0.8)])
    h = harness()
    final = run_turn(h, audio)
    take, = h.core.asr.model.clips  # one transcription: no pause job, no final job
    end = speech_end(audio, int(0.9 * 16000) - 1)
    assert np.array_equal(take, audio[:end])  # the utterance through its speech end
    assert final.text == RecordingASR.text_of(audio[:end])
    assert h.core.streams["s1"].conversation.items[0].text == final.text
    h.close()


def test_without_early_takes_the_pause_is_transcribed_as_it_stands():
    audio = np.concatenate([silence(0.3), tone(0.6), silence(0.8)])
    h = harness(early_pause_transcript=False)
    final = run_turn(h, audio)
    pause, = h.core.asr.model.clips
    early_end = speech_end(audio, int(0.9 * 16000) - 1)
    assert len(pause) > early_end  # 160 ms of silence into the pause, not the first frame
    assert np.array_equal(pause, audio[:len(pause)])
    assert final.text == RecordingASR.text_of(pause)
    h.close()


def test_a_take_with_voice_after_it_is_never_the_pause_transcript():
    # a gap shorter than a pause, then more speech: the first take goes stale
    audio = np.concatenate([silence(0.3), tone(0.4), silence(0.1), tone(0.4), silence(0.8)])
    h = harness()
    final = run_turn(h, audio)
    end = speech_end(audio, int(1.2 * 16000) - 1)
    assert final.text == RecordingASR.text_of(audio[:end])
    assert h.of(p.VoiceStopped)[0].audio_end_ms >= 1200
    h.close()


def test_a_breath_after_the_take_makes_it_stale():
    # a quiet tone (between threshold - 0.15 and threshold) after the speech keeps the
    # turn's voice without resuming it: the take before it does not cover it
    quiet = tone(0.1, level=0.11)
    audio = np.concatenate([silence(0.3), tone(0.5), silence(0.1), quiet, silence(0.8)])
    h = harness(vad=LevelVAD())
    final = run_turn(h, audio)
    assert final.text == RecordingASR.text_of(h.core.asr.model.clips[-1])
    assert len(h.core.asr.model.clips[-1]) > int(0.9 * 16000)  # the breath is in it
    assert not [o for o in h.outputs if isinstance(o, p.Speculation)
                and o.outcome == "discarded"]  # a breath never resumed the turn
    h.close()


def test_an_unwanted_take_is_dropped_unrun_a_promoted_one_goes_first_and_a_take_replaces_partials():
    class Model:
        def __init__(self) -> None:
            self.calls = 0

        def transcribe(self, audio: np.ndarray) -> str:
            self.calls += 1
            return ""

    stage = ASRStage(Model())
    audio = np.zeros(1600, np.float32)
    stage.add(ASRJob(0, "i", audio, final=False, early=lambda: False))
    assert stage.schedule() is None and not stage.has_work()
    partial = ASRJob(0, "i", audio, final=False)
    take = ASRJob(1, "j", audio, final=False, early=lambda: True)
    stage.add(partial)
    stage.add(take)
    take.pause = object()  # type: ignore[assignment]  # it became a pause transcript
    stage.promote(take)
    assert stage.schedule() == [take]
    assert stage.schedule() == [partial]
    final = ASRJob(0, "i", audio, final=True)
    for job in (partial, final, ASRJob(1, "j", audio, final=False)):
        stage.add(job)
    assert stage.drop_partials(0) and not stage.drop_partials(0)
    assert [j.stream_id for j in [*stage.schedule(), *stage.schedule()]] == [0, 1]
    assert stage.model.calls == 0  # (nothing was executed: schedule only plans)
    stage.add(ASRJob(2, "k", audio, final=False))
    running, = stage.schedule()  # (on the worker now)
    assert not running.stopped.is_set()
    stage.drop_partials(3)  # another stream's take: this partial goes on
    assert not running.stopped.is_set()
    stage.drop_partials(2)  # a take of its own turn: the running partial stops early
    assert running.stopped.is_set()


# ------------------------------------------------------------------ held first words


def _client_audio(speculate: bool, resume: bool = False, tts=None) -> tuple[bytes, list[str], str]:
    """Audio bytes, chunk texts and reply text the client receives for one turn."""
    h = harness(asr=BurstASR(), stop_after=6, speculate_after_ms=160 if speculate else 0)
    if tts is not None:
        h.core.tts.speech = tts
    h.send(p.OpenStream("s1", p.StreamConfig(auto_response=SEEDED)))

    def first_words_held() -> None:  # spoken inside the silence window, and held
        if speculate:
            h.run_until(lambda _: (run := speculating(h)) is not None and bool(run.spans)
                        and run.tts_job is None)
            assert not h.of(p.AudioChunk) and not h.of(p.VoiceStopped)

    feed(h, np.concatenate([silence(0.3), tone(0.6), silence(0.25)]))
    first_words_held()
    if resume:  # the user goes on: that held audio is dropped, the next pause speaks again
        feed(h, np.concatenate([tone(0.4), silence(0.25)]))
        first_words_held()
    feed(h, silence(0.4))
    h.run_until(has(p.TranscriptFinal))
    h.send(p.CreateResponse("s1", "r1", "a1", SEEDED))
    released = h.core.step()
    h.outputs.extend(released)
    if speculate:  # released at once, in the step that committed it
        assert any(isinstance(o, p.AudioChunk) for o in released)
    h.run_until(has(p.ResponseFinished))
    chunks = [o for o in h.of(p.AudioChunk)]
    assert {o.response_id for o in chunks} == {"r1"}
    done, = h.of(p.ResponseFinished)
    assert done.status == p.ResponseStatus.COMPLETED
    outcomes = [o.outcome for o in h.of(p.Speculation)]
    if speculate:
        assert outcomes == (["started", "discarded", "started", "committed"] if resume
                            else ["started", "committed"])
    h.close()
    return b"".join(o.audio for o in chunks), [o.text for o in chunks], done.text


@pytest.mark.parametrize("resume", [False, True], ids=["committed", "resumed"])
def test_the_client_hears_exactly_the_reply_a_turn_without_speculation_gets(resume):
    assert _client_audio(True, resume) == _client_audio(False, resume)


@pytest.mark.slow
def test_held_piper_audio_equals_a_plain_runs_audio():
    """Real Piper (seeded): the held first words and the rest are the same samples."""
    from voxline.engines.models.piper_tts import PiperTTS
    from voxline.engines.speech_model import SentenceSpeechModel

    piper = PiperTTS.load(threads=1)
    held = _client_audio(True, tts=SentenceSpeechModel(piper))
    plain = _client_audio(False, tts=SentenceSpeechModel(piper))
    assert held[0] and held == plain


class Recording:
    """The real model, with every clip it was given kept."""

    def __init__(self, model) -> None:
        self.model, self.clips = model, []

    def transcribe(self, audio: np.ndarray) -> str:
        self.clips.append(np.array(audio, copy=True))
        return self.model.transcribe(audio)


@pytest.mark.slow
def test_moonshine_final_is_a_plain_transcription_of_the_audio_it_covers():
    """Silero VAD and Moonshine: the turn's final transcript (the early take, drafted from
    the partials) is what Moonshine gives that audio on its own, with no draft."""
    from speech import espeak

    from voxline.engines.models.moonshine_asr import MoonshineASR
    from voxline.engines.models.silero_vad import SileroVAD

    asr = Recording(MoonshineASR.load(threads=1))
    speech = espeak("What is the capital of France, and what is it famous for?", rate=16000)
    audio = np.concatenate([silence(0.5), speech, silence(0.9)])
    h = harness(asr=asr, vad=SileroVAD.load(threads=1))
    h.send(p.OpenStream("s1", CFG))
    split = int(2.0 * 16000)  # a partial first, as while the user speaks
    feed(h, audio[:split])
    h.run_until(has(p.TranscriptPartial))
    feed(h, audio[split:])
    h.run_until(has(p.TranscriptFinal))
    h.close()
    final, = h.of(p.TranscriptFinal)
    take = max(asr.clips, key=len)  # the longest transcription this turn asked for
    start = next(s for s in range(0, len(audio) - len(take), FRAME_SAMPLES)
                 if np.array_equal(audio[s:s + len(take)], take))  # a span of what was fed
    speech_end = int(0.5 * 16000) + len(speech)
    assert start + len(take) < speech_end + 0.16 * 16000  # taken before any pause is
    asr.model._drafts.clear()
    assert final.text and final.text == asr.model.transcribe(take)
    asked = iter(range(100))  # a superseded partial stops after three decoding steps
    asr.model._drafts.clear()
    cut = asr.model.transcribe(take, stop=lambda: next(asked) >= 3)
    assert cut and len(cut) < len(final.text) and final.text.startswith(cut)


def test_the_early_pause_transcript_setting_reaches_the_engine(monkeypatch):
    from voxline.engines import factory

    seen: dict = {}
    monkeypatch.setattr(factory, "load_models", lambda *a, **k: None)
    monkeypatch.setattr(factory.EngineCore, "from_settings",
                        lambda models, wake, settings, **kw: seen.update(settings=settings))
    for value in (False, True):
        factory.make_engine_core(lambda: None, {"early_pause_transcript": value})
        assert seen["settings"].early_pause_transcript is value


def test_a_speculated_turn_logs_its_milestones_in_order(caplog):
    """`voxline.trace` (DEBUG): what bench_pipeline --trace lines up, in causal order."""
    import re

    with caplog.at_level("DEBUG", logger="voxline.trace"):
        _client_audio(True)
    lines = [r.getMessage() for r in caplog.records if r.name == "voxline.trace"]
    events = [(float(m.group(1)), m.group(2), m.group(3)) for line in lines
              if (m := re.match(r"t=([\d.]+) stream=(\S+) (\S+)", line))]
    names = [e for _, _, e in events]
    assert len({s for _, s, _ in events}) == 1  # one stream's turn
    assert [t for t, _, _ in events] == sorted(t for t, _, _ in events)
    order = ["speech_ended", "asr_start", "asr_landed", "speculation_started", "first_delta",
             "first_segment", "first_audio", "turn_stopped", "commit"]
    assert [names.index(n) for n in order] == sorted(names.index(n) for n in order), names
    assert re.search(r" first_audio held=True step_ms=\d+$", lines[names.index("first_audio")])
