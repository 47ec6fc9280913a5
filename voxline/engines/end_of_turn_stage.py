"""The end-of-turn stage: at each pause of a semantic-VAD turn, how finished the speaker sounds.

When a turn under semantic turn detection pauses (`TurnPaused`), `Turns` queues one job
here beside the pause transcript: the turn's audio so far. The model (Smart Turn,
`models.smart_turn`) runs on this stage's own worker thread, never on the loop; its
probability goes back to the stream's `TurnDetector.hear`, which combines it with the
words (`end_of_turn.decide`). A job is made in its utterance's `generation`: one that
lands after speech resumed (or after the turn ended) is void. The queue holds at most
one job per stream (a newer pause replaces an older one), so it is bounded by the
number of streams.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from voxline.engines.input_audio import Utterance
from voxline.engines.stage import StreamId


class EndOfTurnModel(Protocol):
    def probability(self, audio: np.ndarray) -> float:
        """How likely the speaker sounds finished at the end of `audio` (16 kHz float32)."""
        ...


@dataclass
class EndOfTurnJob:
    """The turn so far (`audio`) at a pause of `utterance`, made in its `generation`."""

    stream_id: StreamId
    utterance: Utterance
    generation: int
    audio: np.ndarray


class EndOfTurnStage:
    """Stage interface (see `voxline.engines.stage`) over a one-clip-at-a-time model."""

    def __init__(self, model: EndOfTurnModel) -> None:
        self.model = model
        self._jobs: OrderedDict[StreamId, EndOfTurnJob] = OrderedDict()

    def add(self, job: EndOfTurnJob) -> None:
        """Queue `job`, replacing the stream's older one (that pause has passed)."""
        self._jobs.pop(job.stream_id, None)
        self._jobs[job.stream_id] = job

    def drop(self, stream_id: StreamId) -> None:
        """Forget a closed stream's queued job (a running one is ignored when it returns)."""
        self._jobs.pop(stream_id, None)

    def has_work(self) -> bool:
        return bool(self._jobs)

    def schedule(self) -> EndOfTurnJob | None:
        return self._jobs.popitem(last=False)[1] if self._jobs else None

    def execute(self, job: EndOfTurnJob) -> float:
        return self.model.probability(job.audio)

    def update(self, job: EndOfTurnJob, probability: float) -> float:
        return probability
