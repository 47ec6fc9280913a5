"""Server-VAD turn detection as a pure state machine over speech probabilities.

Time is the stream's own audio clock (milliseconds of input audio received), passed in
with every frame, so the detector is deterministic and needs no wall clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from voxline.engines.protocol import TurnDetection

# Hysteresis: once speaking, a frame only counts as silence below threshold - margin
# (Silero's own recommendation), so breathy word endings don't split an utterance.
_NEG_MARGIN = 0.15
# Speech shorter than this is a click or a cough, not a turn.
_MIN_SPEECH_MS = 96


class TurnState(enum.IntEnum):
    SILENCE = 0
    MAYBE_SPEECH = 1
    SPEECH = 2


class TurnEvent(enum.IntEnum):
    STARTED = 1
    STOPPED = 2


@dataclass
class TurnDetector:
    params: TurnDetection
    state: TurnState = TurnState.SILENCE
    speech_start_ms: float = 0.0
    last_voice_ms: float = 0.0

    def update(self, prob: float, frame_start_ms: float, frame_ms: float) -> TurnEvent | None:
        """Feed one frame's speech probability; returns an event when a turn starts or ends.

        STARTED is reported once speech has lasted `_MIN_SPEECH_MS` (its start time is
        `speech_start_ms`); STOPPED after `silence_duration_ms` of silence (the turn ended
        at `last_voice_ms`).
        """
        end_ms = frame_start_ms + frame_ms
        voiced = prob >= self.params.threshold
        if self.state == TurnState.SILENCE:
            if voiced:
                self.state = TurnState.MAYBE_SPEECH
                self.speech_start_ms = frame_start_ms
                self.last_voice_ms = end_ms
            return None
        if self.state == TurnState.MAYBE_SPEECH:
            if not voiced:
                self.state = TurnState.SILENCE
                return None
            self.last_voice_ms = end_ms
            if end_ms - self.speech_start_ms >= _MIN_SPEECH_MS:
                self.state = TurnState.SPEECH
                return TurnEvent.STARTED
            return None
        # SPEECH
        if prob >= self.params.threshold - _NEG_MARGIN:
            self.last_voice_ms = end_ms
            return None
        if end_ms - self.last_voice_ms >= self.params.silence_duration_ms:
            self.state = TurnState.SILENCE
            return TurnEvent.STOPPED
        return None

    def reset(self) -> None:
        self.state = TurnState.SILENCE
