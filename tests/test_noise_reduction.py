"""Input noise reduction (RNNoise, voxline/engines/noise_reduction.py): the setting is
accepted and echoed in both dialects, reaches the engine's stream config, and the reducer
runs before VAD and ASR; it cuts noise while keeping speech, and keeps state across
frames."""

from __future__ import annotations

import json

import numpy as np
import pytest
from core_driver import CoreDriver
from fakes import CountingLM, EnergyVAD, FixedASR, ToneTTS
from openai_types import strict_problems
from speech import espeak

from voxline.engines import protocol as ep
from voxline.engines.core import EngineCore, Models
from voxline.engines.noise_reduction import NoiseReducer
from voxline.engines.speech_model import SentenceSpeechModel
from voxline.engines.vad_stage import VAD_FRAME, VADStage
from voxline.realtime.openai.client_events import parse_command
from voxline.realtime.openai.dialect import Dialect
from voxline.realtime.openai.server_events import render
from voxline.sessions import events as ev
from voxline.sessions.actor import SessionActor
from voxline.sessions.capabilities import stream_config

RATE = 16_000


def new_actor() -> SessionActor:
    actor = SessionActor("sess_1", "s1")
    actor.start(0.0)
    actor.take_events()
    actor.take_commands()
    return actor


def update(actor: SessionActor, session: dict) -> tuple[list, list]:
    actor.receive(parse_command(json.dumps({"type": "session.update", "session": session})), 0.0)
    return actor.take_events(), actor.take_commands()


def pink(seconds: float, level: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    spec = np.fft.rfft(rng.standard_normal(n))
    spec /= np.sqrt(np.maximum(np.arange(len(spec)), 1))
    x = np.fft.irfft(spec, n)
    return (level * x / np.sqrt(np.mean(x ** 2))).astype(np.float32)


def stream_through(nr: NoiseReducer, audio: np.ndarray, chunk: int = 320) -> np.ndarray:
    """`audio` through `nr` in `chunk`-sample pieces, realigned (its delay taken off)."""
    padded = np.concatenate([audio, np.zeros(nr.delay_samples, np.float32)])
    out = np.concatenate([nr.process(padded[i:i + chunk]) for i in range(0, len(padded), chunk)])
    assert len(out) == len(padded)  # as many samples back as went in, chunk by chunk
    return out[nr.delay_samples:nr.delay_samples + len(audio)]


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))


# --------------------------------------------------------------------- the setting


@pytest.mark.parametrize("kind", ["near_field", "far_field"])
def test_ga_setting_is_accepted_echoed_and_reaches_the_engine(kind: str) -> None:
    actor = new_actor()
    events, commands = update(actor, {"type": "realtime",
                                      "audio": {"input": {"noise_reduction": {"type": kind}}}})
    updated, = events
    assert isinstance(updated, ev.SessionUpdated), updated
    cmd, = commands
    assert isinstance(cmd, ep.UpdateStream) and cmd.config.noise_reduction == kind
    wire = render(updated, Dialect.GA)
    assert strict_problems(wire, "ga") == []
    assert wire["session"]["audio"]["input"]["noise_reduction"] == {"type": kind}


@pytest.mark.parametrize("kind", ["near_field", "far_field"])
def test_beta_setting_is_accepted_and_echoed(kind: str) -> None:
    actor = new_actor()
    events, commands = update(actor, {"model": "gpt-4o-realtime-preview",
                                      "input_audio_noise_reduction": {"type": kind}})
    updated, = events
    assert isinstance(updated, ev.SessionUpdated), updated
    assert commands[0].config.noise_reduction == kind
    wire = render(updated, Dialect.BETA)
    assert strict_problems(wire, "beta") == []
    assert wire["session"]["input_audio_noise_reduction"] == {"type": kind}


def test_null_turns_it_off() -> None:
    actor = new_actor()
    update(actor, {"type": "realtime", "audio": {"input": {"noise_reduction": {"type": "far_field"}}}})
    events, commands = update(actor, {"type": "realtime",
                                      "audio": {"input": {"noise_reduction": None}}})
    wire = render(events[0], Dialect.GA)
    assert strict_problems(wire, "ga") == []
    assert wire["session"]["audio"]["input"]["noise_reduction"] is None
    assert commands[0].config.noise_reduction is None
    assert stream_config(actor.settings).noise_reduction is None


# --------------------------------------------------------------------- the reducer


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    pad = np.zeros(RATE // 2, np.float32)
    return np.concatenate([pad, espeak("What is the capital of France? I would like to know."),
                           pad])


@pytest.mark.parametrize("kind", ["near_field", "far_field"])
def test_cuts_noise_and_keeps_speech(speech: np.ndarray, kind: str) -> None:
    noise = pink(len(speech) / RATE, level=0.3 * rms(speech), seed=1)
    noisy = speech + noise
    out = stream_through(NoiseReducer(kind), noisy)  # type: ignore[arg-type]
    voiced = np.abs(speech) > 0.05 * np.abs(speech).max()
    lead = slice(RATE // 10, RATE // 2 - RATE // 20)  # noise alone, before the speech
    # Speech survives: the voiced part keeps most of its energy ...
    assert rms(out[voiced]) > 0.5 * rms(speech[voiced])
    # ... while noise alone comes out much quieter, so speech stands well above it.
    assert rms(out[lead]) < rms(noise[lead]) / (3 if kind == "far_field" else 10)
    gain_db = 20 * np.log10((rms(out[voiced]) / rms(out[lead]))
                            / (rms(noisy[voiced]) / rms(noisy[lead])))
    assert gain_db > (6 if kind == "far_field" else 10), gain_db


def test_far_field_keeps_more_than_near_field(speech: np.ndarray) -> None:
    noisy = speech + pink(len(speech) / RATE, level=0.3 * rms(speech), seed=2)
    near = stream_through(NoiseReducer("near_field"), noisy)
    far = stream_through(NoiseReducer("far_field"), noisy)
    lead = slice(RATE // 10, RATE // 2 - RATE // 20)
    assert rms(far[lead]) > rms(near[lead])  # its gain never drops below -12 dB


def test_state_carries_across_frames_and_chunking_does_not_matter(speech: np.ndarray) -> None:
    noisy = speech + pink(len(speech) / RATE, level=0.2 * rms(speech), seed=3)
    whole = stream_through(NoiseReducer("near_field"), noisy, chunk=len(noisy) + 1000)
    by_20ms = stream_through(NoiseReducer("near_field"), noisy, chunk=320)
    by_odd = stream_through(NoiseReducer("near_field"), noisy, chunk=77)
    np.testing.assert_allclose(by_20ms, whole, atol=1e-5)
    np.testing.assert_allclose(by_odd, whole, atol=1e-5)
    # Stateful: the second half through a reducer that heard the first half is not what a
    # fresh reducer makes of it.
    half = len(noisy) // 2 // 320 * 320
    fresh = stream_through(NoiseReducer("near_field"), noisy[half:])
    assert np.abs(fresh - whole[half:]).max() > 1e-3


def test_rejects_unknown_kind() -> None:
    with pytest.raises(ValueError, match="noise_reduction.type"):
        NoiseReducer("studio")  # type: ignore[arg-type]


# ----------------------------------------------------------------- before VAD and ASR


class _RecordingVAD:
    """A VAD model that remembers the frames it scored (and calls them all silence)."""

    def __init__(self) -> None:
        self.seen: list[np.ndarray] = []

    def new_state(self) -> None:
        return None

    def process(self, frames: np.ndarray, states: list) -> np.ndarray:
        self.seen.append(frames.copy())
        return np.zeros(len(frames), np.float32)


def run_vad(stage: VADStage, audio: np.ndarray) -> np.ndarray:
    stage.append("s", audio)
    out = []
    while (plan := stage.schedule()) is not None:
        out += [f.frame for f in stage.update(plan, stage.execute(plan))]
    return np.concatenate(out)


def test_vad_stage_scores_and_hands_on_denoised_frames(speech: np.ndarray) -> None:
    noisy = speech + pink(len(speech) / RATE, level=0.3 * rms(speech), seed=4)
    noisy = noisy[:len(noisy) // VAD_FRAME * VAD_FRAME]
    model = _RecordingVAD()
    stage = VADStage(model)
    stage.add_stream("s", enabled=True)
    stage.set_noise_reduction("s", "near_field")
    frames = run_vad(stage, noisy)
    expected = NoiseReducer("near_field").process(noisy)
    np.testing.assert_allclose(frames, expected, atol=1e-6)  # ASR gets these frames too
    np.testing.assert_allclose(np.concatenate(model.seen).reshape(-1), expected, atol=1e-6)
    stage.set_noise_reduction("s", None)  # off: frames pass as they came
    np.testing.assert_array_equal(run_vad(stage, noisy[:VAD_FRAME * 4]), noisy[:VAD_FRAME * 4])


class _EnergyCore(CoreDriver):
    """A real EngineCore whose VAD calls any frame louder than RMS 0.01 speech."""

    def __init__(self) -> None:
        super().__init__()
        self.core = EngineCore(Models(EnergyVAD(), FixedASR("heard"), CountingLM(),
                                      SentenceSpeechModel(ToneTTS())), self.woke.set)

    def settle(self) -> None:
        while self.core.has_work():
            self.outputs.extend(self.core.step())


@pytest.mark.parametrize("kind", [None, "near_field", "far_field"])
def test_noise_alone_starts_no_turn_with_it_on(kind: str | None) -> None:
    """Through the engine: steady noise (RMS 0.03) is 'speech' to an energy VAD unless the
    reducer, which runs before VAD, takes it down first. (Silero itself already ignores
    steady noise like this, so the stand-in VAD shows what runs first.)"""
    core = _EnergyCore()
    noise = np.concatenate([pink(3.0, level=0.03, seed=6), np.zeros(RATE // 2, np.float32)])
    config = ep.StreamConfig(turn_detection=ep.TurnParams(silence_duration_ms=300),
                             noise_reduction=kind)
    core.send(ep.OpenStream("s1", config), ep.AppendAudio("s1", noise.astype("<f4").tobytes()))
    core.settle()
    assert bool(core.of(ep.VoiceStarted)) == (kind is None), core.kinds()


def test_speech_in_noise_still_makes_a_turn_with_it_on(speech: np.ndarray) -> None:
    core = _EnergyCore()
    audio = np.concatenate([speech + pink(len(speech) / RATE, level=0.004, seed=7),
                            np.zeros(RATE, np.float32)])
    config = ep.StreamConfig(turn_detection=ep.TurnParams(silence_duration_ms=500),
                             noise_reduction="near_field")
    core.send(ep.OpenStream("s1", config), ep.AppendAudio("s1", audio.astype("<f4").tobytes()))
    core.run_until(lambda outs: any(isinstance(o, ep.TranscriptFinal) for o in outs))
    assert core.of(ep.VoiceStarted) and core.of(ep.TranscriptFinal)[0].text == "heard"


def test_manual_turn_audio_is_denoised_before_the_buffer() -> None:
    core = _EnergyCore()
    noise = pink(1.0, level=0.05, seed=8)
    core.send(ep.OpenStream("s1", ep.StreamConfig(turn_detection=None,
                                                   noise_reduction="near_field")),
              ep.AppendAudio("s1", noise.astype("<f4").tobytes()))
    stream, = core.core.streams.values()
    held = stream.input.utterance.audio()
    assert len(held) == len(noise) and rms(held[RATE // 2:]) < rms(noise) / 10
