"""A stream's input audio after framing: turns (server VAD) or the manual-commit buffer.

Server VAD: each scored frame advances the stream's audio clock and its
`TurnDetector`; a started turn collects its frames (plus `prefix_padding_ms` of the
frames before it) into an `Utterance`, which is transcribed when the turn stops.
Manual turns: appended audio collects in one utterance until the caller commits it.
That buffer is bounded (`max_utterance_ms`): an append past the bound is refused whole
with an error, never dropped silently.
"""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from voxline.engines.protocol import INPUT_RATE, MIN_COMMIT_MS, TurnParams
from voxline.engines.stage import RequestRefused
from voxline.engines.turn_detector import TurnDetector, TurnEvent, TurnState
from voxline.engines.vad_stage import FRAME_MS

MAX_UTTERANCE_MS = 360_000  # manual-commit buffer; above one 15 MiB realtime append
# Silence this long after voice is where a turn's speech ended (`SpeechEnded`). One
# silent frame is often only a gap between words (half of the gaps in the pipeline
# bench's spoken questions); that take goes stale and reports as a partial, which keeps
# the warm prefill current. Two frames (64 ms) were measured against one on an AVX-512
# host, semantic VAD, in-process: end of speech -> first audio p50 537 vs 439 ms, the
# reply's prompt 33 vs 40 of 41 tokens cached, CPU per turn unchanged over the WebSocket.
SPEECH_END_MS = FRAME_MS


# Loudness sub-windows per VAD frame (8 ms each): where in its last voiced frames the
# speech stopped (`TurnDetector`'s end of voice).
LEVELS_PER_FRAME = 4


def frame_levels(frame: np.ndarray) -> list[float]:
    """RMS of `frame` over `LEVELS_PER_FRAME` equal sub-windows, in order."""
    n = len(frame) // LEVELS_PER_FRAME * LEVELS_PER_FRAME
    if n == 0:
        return []
    sub = np.asarray(frame[:n], np.float32).reshape(LEVELS_PER_FRAME, -1)
    return np.sqrt(np.einsum("ij,ij->i", sub, sub) / sub.shape[1]).tolist()


def new_item_id() -> str:
    return "item_" + uuid.uuid4().hex[:20]


@dataclass
class Utterance:
    """Audio of one user turn (speech in progress, or the manual-commit buffer)."""

    item_id: str
    start_ms: float
    chunks: list[np.ndarray] = field(default_factory=list)
    samples: int = 0
    last_partial_samples: int = 0
    partial_queued: bool = False
    # Speculation: each resumed pause starts a new `generation`; a pause transcript
    # (`pause_text`) is only valid for the generation it was made in.
    generation: int = 0
    pause_asr: bool = False  # a pause transcript of this generation is being made
    pause_text: str | None = None
    pause_asr_ms: float = 0.0
    pause_tokens: tuple | None = None  # the pause transcript's token log-probabilities
    ended: bool = False  # the turn ended while its pause transcript was being made

    def add(self, audio: np.ndarray) -> None:
        self.chunks.append(audio)
        self.samples += len(audio)

    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)


@dataclass
class TurnStarted:
    utterance: Utterance
    audio_start_ms: float


@dataclass
class TurnStopped:
    utterance: Utterance
    audio_end_ms: float


@dataclass
class TurnPaused:
    """The turn paused long enough that it may be ending: transcribe it so far."""

    utterance: Utterance


@dataclass
class TurnResumed:
    """Speech again after `TurnPaused`: the turn goes on (anything made of the pause is void)."""

    utterance: Utterance


@dataclass
class SpeechEnded:
    """The turn's speech just fell silent (`SPEECH_END_MS` of silence after voice, before
    any pause is reported): a take of the turn now is ready early to be its pause
    transcript, and is one as long as no voice follows it."""

    utterance: Utterance


@dataclass
class PartialDue:
    """The turn has grown by a partial interval: transcribe what it holds so far."""

    utterance: Utterance


TurnUpdate = (TurnStarted | TurnStopped | TurnPaused | TurnResumed | SpeechEnded
              | PartialDue)


class InputAudio:
    def __init__(self, turn_detection: TurnParams | None,
                 max_utterance_ms: float = MAX_UTTERANCE_MS, pause_ms: float = 0.0) -> None:
        """`pause_ms`: report `TurnPaused` after a pause this long within a turn (0: never)."""
        self.pause_ms = pause_ms
        self.detector = self._detector(turn_detection)
        self.max_utterance_samples = int(max_utterance_ms * INPUT_RATE / 1000)
        self.audio_ms = 0.0  # input clock: ms of audio framed (or buffered) so far
        self.history: deque[np.ndarray] = deque(maxlen=64)  # recent frames (prefix padding)
        self.utterance: Utterance | None = None

    def _detector(self, params: TurnParams | None) -> TurnDetector | None:
        return TurnDetector(params, self.pause_ms) if params else None

    def configure(self, turn_detection: TurnParams | None) -> None:
        if self.detector is None or turn_detection != self.detector.params:
            self.detector = self._detector(turn_detection)

    def append_manual(self, audio: np.ndarray) -> None:
        """Add to the manual-commit buffer; raises `RequestRefused` (nothing kept) past the bound."""
        have = self.utterance.samples if self.utterance else 0
        if have + len(audio) > self.max_utterance_samples:
            raise RequestRefused(
                f"append: {len(audio) * 1000 / INPUT_RATE:.0f} ms of audio refused: the input "
                f"audio buffer holds {have * 1000 / INPUT_RATE:.0f} ms and at most "
                f"{self.max_utterance_samples * 1000 / INPUT_RATE:.0f} ms; commit or clear it",
                "input_audio_buffer_full")
        if self.utterance is None:
            self.utterance = Utterance("", self.audio_ms)
        self.utterance.add(audio.copy())
        self.audio_ms += len(audio) * 1000 / INPUT_RATE

    def commit(self) -> Utterance:
        """Take the buffered utterance; raises `RequestRefused` below `MIN_COMMIT_MS`."""
        utt = self.utterance
        ms = utt.samples * 1000 / INPUT_RATE if utt else 0.0
        if utt is None or ms < MIN_COMMIT_MS:
            raise RequestRefused(f"commit: input audio buffer too small, expected at least "
                                 f"{MIN_COMMIT_MS} ms of audio, have {ms:.0f} ms",
                                 "input_audio_buffer_commit_empty")
        self.utterance = None
        if self.detector:
            self.detector.reset()
        return utt

    def clear(self) -> None:
        self.utterance = None
        if self.detector:
            self.detector.reset()

    def on_frame(self, frame: np.ndarray, prob: float, partials: bool,
                 partial_interval_ms: int) -> TurnUpdate | None:
        """Advance the turn by one scored frame (server VAD only)."""
        det = self.detector
        assert det is not None
        start_ms = self.audio_ms
        self.audio_ms += FRAME_MS
        self.history.append(frame)
        levels = frame_levels(frame) if det.may_be_voice(prob) else None  # (per frame: skip silence)
        event = det.update(prob, start_ms, FRAME_MS, levels)
        if event == TurnEvent.STARTED:
            first_ms = max(0.0, det.speech_start_ms - det.params.prefix_padding_ms)
            n = min(len(self.history), int(round((self.audio_ms - first_ms) / FRAME_MS)))
            utt = Utterance(new_item_id(), first_ms)
            for f in list(self.history)[-n:]:
                utt.add(f)
            self.utterance = utt
            return TurnStarted(utt, det.speech_start_ms)
        utt = self.utterance
        if utt is None or det.state == TurnState.SILENCE and event is None:
            return None
        utt.add(frame)
        if event == TurnEvent.STOPPED:
            self.utterance = None
            return TurnStopped(utt, det.last_voice_ms)
        if event == TurnEvent.PAUSED:
            return TurnPaused(utt)
        if event == TurnEvent.RESUMED:
            utt.generation += 1
            utt.pause_asr = False
            utt.pause_text = None
            return TurnResumed(utt)
        silent_ms = self.audio_ms - det.voiced_until_ms
        if (self.pause_ms and det.state == TurnState.SPEECH and not det.paused
                and SPEECH_END_MS <= silent_ms < SPEECH_END_MS + FRAME_MS):
            return SpeechEnded(utt)
        interval = partial_interval_ms * INPUT_RATE // 1000
        # Partials only on voiced frames: one started in the pause before the end of a
        # turn would still be running when the final transcript is needed.
        if (partials and not utt.partial_queued and prob >= det.params.threshold
                and utt.samples - utt.last_partial_samples >= interval):
            utt.partial_queued = True
            utt.last_partial_samples = utt.samples
            return PartialDue(utt)
        return None
