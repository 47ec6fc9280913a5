"""Turn detection (server VAD, or semantic with `end_of_turn`) as a pure state machine over speech probabilities.

Time is the stream's own audio clock (milliseconds of input audio received), passed in
with every frame, so the detector is deterministic and needs no wall clock.

Where speech ended: Silero's probability stays high for one to three 32 ms frames after
the sound stops (its context window; 7-88 ms, median about 55, on the pipeline bench's
spoken questions), so the end of the last voiced frame is late. Given each frame's
loudness (`levels`: RMS over equal sub-windows), the detector places the end of voice at
the last sub-window within `QUIET_DB` of the turn's loudest, at most `MAX_TRIM_MS` before
the end of the voiced frame (a quiet stretch the model still hears as voice, such as a
breathy ending, is trimmed no further). The silence that ends a turn, and its
`audio_end_ms`, count from there; `pause_ms` still counts from the last voiced frame, so
the pause transcript, the speculation and the end-of-turn model's hearing (tuned on
that audio: Smart Turn's verdict moves with the trailing silence it hears) start where
they did. With no levels, both are the voiced frame's end.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from voxline.engines import end_of_turn
from voxline.engines.protocol import TurnParams

# Hysteresis: once speaking, a frame only counts as silence below threshold - margin
# (Silero's own recommendation), so breathy word endings don't split an utterance.
_NEG_MARGIN = 0.15
# Speech shorter than this is a click or a cough, not a turn.
_MIN_SPEECH_MS = 96
# Where speech ended (see the module docstring): a sub-window this far below the turn's
# loudest is quiet, and voice ends at most this much before its last voiced frame's end.
QUIET_DB = 30.0
MAX_TRIM_MS = 64.0
_QUIET = 10 ** (-QUIET_DB / 20)


class TurnState(enum.IntEnum):
    SILENCE = 0
    MAYBE_SPEECH = 1
    SPEECH = 2


class TurnEvent(enum.IntEnum):
    STARTED = 1
    STOPPED = 2
    PAUSED = 3  # a pause of `pause_ms` within a turn: the turn may be about to end
    RESUMED = 4  # speech again after PAUSED: the turn goes on


@dataclass
class TurnDetector:
    """`pause_ms` (0: never) reports PAUSED once a pause in a turn lasts that long, and
    RESUMED if speech follows before the turn ends. `silence_ms` is how long a pause
    ends the turn: `silence_duration_ms` for server VAD; set per pause by the semantic
    turn detector (`end_of_turn.decide`) from the words said (`judge`) and, when an
    end-of-turn model runs, how the speaker sounds (`hear`), whichever comes first."""

    params: TurnParams
    pause_ms: float = 0.0
    state: TurnState = TurnState.SILENCE
    speech_start_ms: float = 0.0
    last_voice_ms: float = 0.0  # where the voice ended (a turn's silence counts from here)
    voiced_until_ms: float = 0.0  # the end of the last frame that counted as voice (pauses)
    loudest: float = 0.0  # the (maybe) turn's loudest sub-window RMS so far
    paused: bool = False
    silence_ms: float = 0.0
    words: end_of_turn.Ending | None = None  # this pause's, once transcribed
    comma: bool = False  # ... INCOMPLETE by a trailing comma alone (`end_of_turn.comma_only`)
    heard: end_of_turn.Sound | None = None  # this pause's, once the model has answered

    def __post_init__(self) -> None:
        self.silence_ms = self.base_silence_ms()

    def base_silence_ms(self) -> float:
        """The pause that ends a turn before anything is known of its words."""
        if self.params.eagerness is None:
            return float(self.params.silence_duration_ms)
        return float(end_of_turn.silence_ms(self.params.eagerness, end_of_turn.Ending.NEUTRAL))

    def judge(self, transcript: str) -> None:
        """Semantic turn detection: the current pause ends the turn after a silence that
        depends on how `transcript` (the turn so far) ends. Server VAD ignores it."""
        if self.params.eagerness is not None and self.paused:
            self.words = end_of_turn.ending(transcript)
            self.comma = end_of_turn.comma_only(transcript)
            self._decide(self.params.eagerness)

    def hear(self, probability: float) -> None:
        """Semantic turn detection: the end-of-turn model's `probability` that the speaker
        sounds finished at the current pause. Server VAD ignores it."""
        if self.params.eagerness is not None and self.paused:
            self.heard = end_of_turn.sound(self.params.eagerness, probability)
            self._decide(self.params.eagerness)

    def expect_sound(self) -> None:
        """The end-of-turn model is judging the current pause: until a witness answers,
        the pause does not end the turn at the words-unknown wait. Server VAD ignores it."""
        if self.params.eagerness is not None and self.paused and self.heard is None:
            self.heard = end_of_turn.Sound.AWAITED
            self._decide(self.params.eagerness)

    def sound_failed(self) -> None:
        """The model could not judge the current pause: the words decide alone."""
        if self.params.eagerness is not None and self.heard == end_of_turn.Sound.AWAITED:
            self.heard = None
            self._decide(self.params.eagerness)

    def _decide(self, eagerness: str) -> None:
        self.silence_ms = float(end_of_turn.decide(eagerness, self.words, self.heard, self.comma))

    def may_be_voice(self, prob: float) -> bool:
        """Whether a frame of this probability can count as voice in some state (only
        those need `levels`)."""
        return prob >= self.params.threshold - _NEG_MARGIN

    def update(self, prob: float, frame_start_ms: float, frame_ms: float,
               levels: Sequence[float] | None = None) -> TurnEvent | None:
        """Feed one frame's speech probability (and, optionally, its loudness: `levels`,
        RMS over equal sub-windows in order); returns an event when a turn starts,
        pauses, resumes or ends.

        STARTED is reported once speech has lasted `_MIN_SPEECH_MS` (its start time is
        `speech_start_ms`); STOPPED after `silence_ms` of silence (the turn ended
        at `last_voice_ms`).
        """
        end_ms = frame_start_ms + frame_ms
        voiced = prob >= self.params.threshold
        if self.state == TurnState.SILENCE:
            if voiced:
                self.state = TurnState.MAYBE_SPEECH
                self.speech_start_ms = frame_start_ms
                self.loudest = 0.0
                self._voice(frame_start_ms, frame_ms, levels)
            return None
        if self.state == TurnState.MAYBE_SPEECH:
            if not voiced:
                self.state = TurnState.SILENCE
                return None
            self._voice(frame_start_ms, frame_ms, levels)
            if end_ms - self.speech_start_ms >= _MIN_SPEECH_MS:
                self.state = TurnState.SPEECH
                return TurnEvent.STARTED
            return None
        # SPEECH
        if prob >= self.params.threshold - _NEG_MARGIN:
            self._voice(frame_start_ms, frame_ms, levels)
            if self.paused and voiced:  # a breath below threshold does not resume a turn
                self._end_pause()
                return TurnEvent.RESUMED
            return None
        silent_ms = end_ms - self.last_voice_ms
        if silent_ms >= self.silence_ms:
            self.state = TurnState.SILENCE
            self._end_pause()
            return TurnEvent.STOPPED
        if self.pause_ms and not self.paused and end_ms - self.voiced_until_ms >= self.pause_ms:
            self.paused = True
            return TurnEvent.PAUSED
        return None

    def _voice(self, start_ms: float, frame_ms: float, levels: Sequence[float] | None) -> None:
        """A frame counts as voice: where its voice ends (see the module docstring)."""
        end_ms = start_ms + frame_ms
        self.voiced_until_ms = end_ms
        if not levels:
            self.last_voice_ms = end_ms
            return
        self.loudest = max(self.loudest, *levels)
        step = frame_ms / len(levels)
        loud = [i for i, v in enumerate(levels) if v > self.loudest * _QUIET]
        self.last_voice_ms = max(self.last_voice_ms, end_ms - MAX_TRIM_MS,
                                 start_ms + (loud[-1] + 1) * step if loud else 0.0)

    def _end_pause(self) -> None:
        self.paused = False
        self.words, self.heard, self.comma = None, None, False
        self.silence_ms = self.base_silence_ms()

    def reset(self) -> None:
        self.state = TurnState.SILENCE
        self._end_pause()
