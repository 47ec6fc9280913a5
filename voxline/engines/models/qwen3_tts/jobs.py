"""A speech job inside the Qwen3-TTS speech model: its text, its talker streams and its frames.

:class:`Job` is the speech model's record of one :class:`~voxline.engines.speech_model.SpeechJob`.
The text side lives here: the job's text tokens as segments arrive (tokenized onto the
whole text, so the ids are those of one prompt), how many went into talker streams, the
current stream's frame limit, and the segment texts (:class:`TextSpan`) waiting to ride
on the output whose audio reaches them. The codec side of a job (its decoder state or
slot, the frames not yet decoded) is kept here too but moved only by
:class:`~.codec_chunks.ChunkScheduler`.

Text spans: each segment's text rides on the first output whose audio reaches the
segment's estimated start (:data:`SPOKEN_FRAMES_PER_TOKEN` frames per text token; the
talker has no alignment output), the first segment on the first audio; text not yet
placed when the job ends rides on its last output.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import Tensor

from voxline.codecs.tempo import TimeStretch
from voxline.engines.speech_model import SpeechJob

from .code2wav import Code2WavState
from .generation import TalkerStream

__all__ = ["FRAMES_BASE", "FRAMES_PER_TOKEN", "SPOKEN_FRAMES_PER_TOKEN", "Job", "TextSpan", "frame_limit"]

# Runaway guard: a segment of n text tokens gets at most BASE + PER_TOKEN * n frames
# (~5x a slow speaking rate: a token is ~0.3 s of speech, 4 frames at 12.5 Hz).
FRAMES_BASE = 16
FRAMES_PER_TOKEN = 20
# Where a segment's audio starts, for its text span: ~4 characters per Qwen token spoken
# at ~14 characters/s is ~3.5 frames at 12.5 Hz. An estimate: it only places span edges.
SPOKEN_FRAMES_PER_TOKEN = 3.5


def frame_limit(n_tokens: int, max_frames: int) -> int:
    """The most frames a talker stream of ``n_tokens`` text tokens may make."""
    return min(max_frames, FRAMES_BASE + FRAMES_PER_TOKEN * n_tokens)


@dataclass
class TextSpan:
    text: str
    token: int  # offset of its first token in the job's text
    frame: float | None = None  # estimated first frame of its audio, once in a talker stream


@dataclass(eq=False)
class Job:
    job: SpeechJob
    ids: list[int] = field(default_factory=list)  # the job's text tokens so far
    spans: deque[TextSpan] = field(default_factory=deque)  # segment texts not yet emitted
    text_open: bool = False  # more text may be appended
    fed: int = 0  # tokens handed to talker streams
    run_open: bool = False  # the current talker stream takes appended text
    run_tokens: int = 0  # tokens of the current talker stream (its frame limit)
    run_start: tuple[int, int] = (0, 0)  # (frames, token offset) at its start
    frames: int = 0  # frames generated over all the job's talker streams
    stream: TalkerStream | None = None
    done: bool = False  # no talker stream will run again; pending frames are the last
    tempo: TimeStretch | None = None  # the job's speed != 1: its PCM is time-stretched
    # Codec side (moved by ChunkScheduler):
    state: Code2WavState | None = None  # eager code2wav: the job's own decoder state
    codec_slot: int | None = None  # graphed code2wav: the job's state slot
    decoder_ready: bool = False  # state/slot set up (once per job, kept across streams)
    pending: list[Tensor] = field(default_factory=list)  # frames [G] not yet decoded
    decoded: int = 0  # frames decoded so far

    @property
    def job_id(self) -> int:
        return self.job.job_id

    @property
    def unfed(self) -> int:
        """Text tokens no talker stream has been given yet."""
        return len(self.ids) - self.fed

    def add_text(self, text: str, tokenize: Callable[[str], list[int]]) -> list[int]:
        """Tokenize a segment onto the job's text (a space before all but the first, so
        the ids are those of the whole text: the BPE never merges across that space);
        returns the new ids."""
        new = tokenize((" " if self.ids else "") + text)
        if new:
            self.spans.append(TextSpan(text, len(self.ids)))
            self.ids += new
        return new

    def start_run(self, stream: TalkerStream, text_open: bool) -> None:
        """``stream`` now speaks the job's text from token ``fed`` on."""
        self.stream = stream
        self.run_open = text_open
        self.run_tokens = 0
        self.run_start = (self.frames, self.fed)

    def feed(self, n: int, max_frames: int) -> None:
        """``n`` more of the job's tokens went into its talker stream: place their spans
        and raise the stream's frame limit with its text."""
        self.fed += n
        self.run_tokens += n
        frames0, token0 = self.run_start
        last = 0.0
        for span in self.spans:
            if span.frame is not None:
                last = span.frame
            elif span.token < self.fed:
                span.frame = last = max(last, frames0 + (span.token - token0) * SPOKEN_FRAMES_PER_TOKEN)
        if self.stream is not None:
            self.stream.params = dataclasses.replace(
                self.stream.params, max_frames=frame_limit(self.run_tokens, max_frames))

    def span_text(self, final: bool) -> str:
        """The texts of the segments whose audio starts within the frames decoded so far
        (all that are left, at the end)."""
        texts = []
        while self.spans and (final or (self.spans[0].frame is not None
                                        and self.spans[0].frame < self.decoded)):
            texts.append(self.spans.popleft().text)
        return " ".join(texts)
