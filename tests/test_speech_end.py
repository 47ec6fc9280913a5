"""Where a turn's speech ended: the detector places it by loudness inside the last voiced
frames (Silero hears voice for a frame or more after the sound stops), never more than
`MAX_TRIM_MS` before the last voiced frame's end."""

from __future__ import annotations

import numpy as np
import pytest
from speech import espeak

from voxline.engines import protocol as p
from voxline.engines.input_audio import LEVELS_PER_FRAME, InputAudio, TurnStopped, frame_levels
from voxline.engines.models.silero_vad import SileroVAD
from voxline.engines.turn_detector import MAX_TRIM_MS, TurnDetector, TurnEvent
from voxline.engines.vad_stage import FRAME_MS, VAD_FRAME

LOUD, SILENT = [0.3] * LEVELS_PER_FRAME, [0.0] * LEVELS_PER_FRAME
SUB_MS = FRAME_MS / LEVELS_PER_FRAME


def run(det: TurnDetector, frames: list[tuple[float, list[float] | None]]) -> tuple[float, float]:
    """Feed (probability, levels) frames, then silence until the turn stops; returns
    (where it stopped on the clock, `last_voice_ms`)."""
    t = 0.0
    for prob, levels in frames:
        assert det.update(prob, t, FRAME_MS, levels) != TurnEvent.STOPPED
        t += FRAME_MS
    while det.update(0.0, t, FRAME_MS, SILENT) != TurnEvent.STOPPED:
        t += FRAME_MS
    return t + FRAME_MS, det.last_voice_ms


def test_voice_ends_at_the_last_loud_sub_window_of_the_voiced_frames():
    speech = [(1.0, LOUD)] * 10
    partly = [0.3, 0.3, 0.0, 0.0]  # the sound stops half way through this frame
    tail = [(0.9, SILENT)]  # the model still hears voice after the sound stopped
    det = TurnDetector(p.TurnParams(silence_duration_ms=500))
    stopped, voice_end = run(det, [*speech, (1.0, partly), *tail])
    assert voice_end == 10 * FRAME_MS + 2 * SUB_MS
    assert det.voiced_until_ms == 12 * FRAME_MS
    assert 500 <= stopped - voice_end < 500 + FRAME_MS
    # the same frames without levels: the voiced frames' end, one frame and a half later
    plain = TurnDetector(p.TurnParams(silence_duration_ms=500))
    t = 0.0
    for _ in range(12):
        plain.update(1.0 if t < 11 * FRAME_MS else 0.9, t, FRAME_MS)
        t += FRAME_MS
    assert plain.last_voice_ms == 12 * FRAME_MS


def test_a_quiet_stretch_heard_as_voice_is_trimmed_no_further_than_the_cap():
    """A breathy ending the model hears as voice keeps the turn going: its end of voice
    trails the voiced frames by at most MAX_TRIM_MS, however long the quiet lasts."""
    quiet = [0.3 * 10 ** (-40 / 20)] * LEVELS_PER_FRAME  # 40 dB below the speech
    det = TurnDetector(p.TurnParams(silence_duration_ms=500))
    stopped, voice_end = run(det, [(1.0, LOUD)] * 10 + [(0.8, quiet)] * 20)
    assert voice_end == 30 * FRAME_MS - MAX_TRIM_MS
    assert stopped > 30 * FRAME_MS + 500 - MAX_TRIM_MS - FRAME_MS
    # a sound only 20 dB down is still speech: not trimmed at all
    softer = [0.3 * 10 ** (-20 / 20)] * LEVELS_PER_FRAME
    det = TurnDetector(p.TurnParams(silence_duration_ms=500))
    _, voice_end = run(det, [(1.0, LOUD)] * 10 + [(0.8, softer)] * 5)
    assert voice_end == 15 * FRAME_MS


def test_a_pause_counts_from_the_voiced_frame_and_the_turn_end_from_the_end_of_voice():
    """The pause (transcript, speculation, the end-of-turn model's hearing) comes where it
    did without levels; the silence that ends the turn counts from the end of voice."""
    det = TurnDetector(p.TurnParams(silence_duration_ms=500), pause_ms=160)
    t = 0.0
    for levels in [LOUD] * 10 + [[0.3, 0.0, 0.0, 0.0], SILENT]:
        det.update(1.0, t, FRAME_MS, levels)
        t += FRAME_MS
    assert (det.last_voice_ms, det.voiced_until_ms) == (10 * FRAME_MS + SUB_MS, t)
    while det.update(0.0, t, FRAME_MS, SILENT) != TurnEvent.PAUSED:
        t += FRAME_MS
    assert 160 <= t + FRAME_MS - det.voiced_until_ms < 160 + FRAME_MS
    while det.update(0.0, t, FRAME_MS, SILENT) != TurnEvent.STOPPED:
        t += FRAME_MS
    assert 500 <= t + FRAME_MS - det.last_voice_ms < 500 + FRAME_MS


def test_frame_levels_are_sub_window_rms():
    frame = np.concatenate([np.full(128, 0.5), np.zeros(256), np.full(128, -0.25)])
    assert frame_levels(frame.astype(np.float32)) == pytest.approx([0.5, 0.0, 0.0, 0.25])


@pytest.mark.parametrize("text", ["Who wrote the play Romeo and Juliet?",
                                  "What should I cook for dinner tonight?"])
def test_a_spoken_turn_ends_nearer_its_sound_than_silero_hears_it(text):
    """Real Silero over espeak: the reported end of the turn lies between the sound's true
    end and the last voiced frame's end, nearer the first."""
    speech = espeak(text)
    loud = np.nonzero(np.abs(speech) > 0.02 * np.abs(speech).max())[0]
    speech = speech[loud[0]:loud[-1] + 1]
    lead = 4800  # 300 ms (the frame alignment decides how late Silero hears the end)
    audio = np.concatenate([np.zeros(lead, np.float32), speech, np.zeros(16000, np.float32)])
    true_end = (lead + len(speech)) * 1000 / 16000
    vad = SileroVAD.load(threads=1)
    state = vad.new_state()
    inp = InputAudio(p.TurnParams(silence_duration_ms=500))
    stop = None
    for i in range(len(audio) // VAD_FRAME):
        frame = audio[i * VAD_FRAME:(i + 1) * VAD_FRAME]
        prob = float(vad.process(frame[None], [state])[0])
        if isinstance(update := inp.on_frame(frame, prob, False, 1000), TurnStopped):
            stop = update
            break
    assert stop is not None and inp.detector is not None
    heard_until = inp.detector.voiced_until_ms
    assert heard_until > true_end + FRAME_MS  # Silero's lag (56-71 ms here) ...
    assert true_end - SUB_MS <= stop.audio_end_ms < true_end + 2 * SUB_MS  # ... taken back
