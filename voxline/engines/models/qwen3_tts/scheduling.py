"""Step scheduling for arrivals: which streams a Qwen3-TTS step serves, and when chunks leave.

A job arriving must not make the streams already playing underrun. Every decision here is
made from a job's *playout buffer* (:meth:`StepScheduler.ahead`): how much of the audio the
stage has sent a listener still has to play, for a listener who starts playing at the
job's first chunk, waits when audio runs out and resumes when the next chunk comes (the
client's view; wall clock, injectable). A job with no audio yet is the most urgent.

:class:`StepPolicy` holds the knobs, each off by default (``FIFO``: every live stream in
every step, every free slot prefilled at once: the stage's behaviour before this module):

- ``max_prefills``: at most this many queued jobs start a talker stream (their prompt
  prefill) in one step; 0 = every free slot.
- ``fit_ahead_s``: when the streams that would step just overflow a graph batch bucket
  (:func:`fit_to_bucket`: fewer rows over the bucket below than the bigger bucket would
  pad), the overflow waits a step, provided every waiting stream is at least this far
  ahead: the batch replays the bucket below instead of paying for the bigger one on
  behalf of streams that need no frame yet. It only ever trims the batch to the next
  smaller bucket (never emptier), so the stage never idles, the batch stays the larger
  part of what it was, and a stream waits only while it is among the furthest ahead.
  A waiting stream holds its talker slot longer, so the speech model trims nothing while
  a job waits for a slot.
- ``flush_below_s``: a stream whose buffer is below this has its pending frames decoded
  now rather than when its chunk is full (the chunk size adapts to a slow step).
- ``first_frame_with_prefill``: a new stream's first frame is made in its prefill step
  (a second, small generator step over the new streams), so first audio leaves one step
  earlier.

The scheduler also counts the gaps its own listener would hear (:meth:`StepScheduler.
load_note`): audio that left the stage after the job's earlier audio had run out, and
whether the job's talker had waited for its text meanwhile (the text arrives from the
LLM in segments), so a gap a client hears can be told apart from one the stage made.

Scheduling moves *when* a stream's frames are computed and decoded, never what they are:
a stream's frames are computed in the same order and its sampling is seeded per stream,
so a seeded job's codes equal those of an unscheduled run (``tests/test_tts_arrivals.py``).
Pure logic over job ids and times; no tensors, no model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from voxline.kernels.cuda_graphs import bucket_for

# A gap this long between a job's sent audio running out and its next audio counts as
# running dry (the bench's underrun threshold).
DRY_GAP_S = 0.1

__all__ = ["FIFO", "PLAYOUT", "SCHEDULES", "StepPolicy", "StepScheduler", "fit_to_bucket"]


@dataclass(frozen=True)
class StepPolicy:
    """How a step treats arrivals (see the module docstring); all off by default."""

    max_prefills: int = 0
    fit_ahead_s: float = 0.0
    flush_below_s: float = 0.0
    first_frame_with_prefill: bool = False

    def __post_init__(self) -> None:
        if self.max_prefills < 0 or self.fit_ahead_s < 0 or self.flush_below_s < 0:
            raise ValueError(f"StepPolicy values must be >= 0, got {self}")


FIFO = StepPolicy()
# The engine's default on a GPU, chosen by the open-loop measurement
# (benchmarks/results/gpu_tts_h200_open_loop.json, benchmarks/README.md).
PLAYOUT = StepPolicy(fit_ahead_s=1.0, flush_below_s=0.25, first_frame_with_prefill=True)
# The ``tts_schedule`` setting's choices: (chunk ramp, policy) for the speech model.
SCHEDULES: dict[str, tuple[bool, StepPolicy]] = {"playout": (True, PLAYOUT), "fifo": (False, FIFO)}


def fit_to_bucket(aheads: Sequence[float], buckets: Sequence[int] | None,
                  min_ahead: float) -> list[int]:
    """Indices (ascending) of the streams to step, given each one's playout buffer.

    All of them, unless their count just overflows a bucket (by no more rows than the next
    bucket up would pad, or past the largest bucket) and every stream beyond that bucket's
    size, taking the furthest ahead, is at least ``min_ahead`` seconds ahead: then only
    the bucket's worth of least-ahead streams."""
    n = len(aheads)
    everyone = list(range(n))
    up = bucket_for(n, buckets) if buckets else None
    below = [b for b in buckets or () if b < n]
    if min_ahead <= 0 or not below or up == n:
        return everyone
    keep = max(below)
    if up is not None and n - keep > up - n:
        return everyone  # mostly full: the bigger bucket pays for itself
    order = sorted(everyone, key=lambda i: (aheads[i], i))
    if any(aheads[i] < min_ahead for i in order[keep:]):
        return everyone
    return sorted(order[:keep])


class StepScheduler:
    """Playout buffers per job and the :class:`StepPolicy` decisions made from them."""

    def __init__(self, policy: StepPolicy = FIFO, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.clock = clock
        self._until: dict[int, float] = {}  # job id -> when its sent audio runs out
        self._text_waits: set[int] = set()  # jobs whose talker waited for text since last sent
        self._steps = 0  # model steps so far
        self._sent_step: dict[int, int] = {}  # job id -> the step of its last audio
        self._dry: list[tuple[float, bool, int]] = []  # (gap s, after a text wait, steps)

    def sent(self, job_id: int, seconds: float, now: float) -> None:
        """``seconds`` of the job's audio left the stage at ``now``."""
        if seconds <= 0:
            return
        until = self._until.get(job_id)
        if until is not None and now - until > DRY_GAP_S:
            steps = self._steps - self._sent_step.get(job_id, self._steps)
            self._dry.append((now - until, job_id in self._text_waits, steps))
        self._text_waits.discard(job_id)
        self._sent_step[job_id] = self._steps
        self._until[job_id] = max(now, until if until is not None else now) + seconds

    def stepped(self) -> None:
        """The model ran a step (the gaps count the steps between a job's outputs)."""
        self._steps += 1

    def waits_for_text(self, job_id: int) -> None:
        """The job's talker stream sat out a step: its next frame's text had not come."""
        self._text_waits.add(job_id)

    def forget(self, job_id: int) -> None:
        self._until.pop(job_id, None)
        self._text_waits.discard(job_id)
        self._sent_step.pop(job_id, None)

    def load_note(self) -> str | None:
        """The gaps since the last note (see the module docstring), and reset; None: none."""
        dry, self._dry = self._dry, []
        if not dry:
            return None
        waited = sum(1 for _, w, _ in dry if w)
        steps = sorted(n for _, _, n in dry)
        return (f"{len(dry)} gaps in sent audio, max {max(g for g, _, _ in dry) * 1000:.0f} ms, "
                f"{waited} after a wait for text, {steps[len(steps) // 2]} steps apart "
                f"(p50; max {steps[-1]})")

    def ahead(self, job_id: int, now: float) -> float:
        """Seconds of the job's sent audio not yet played at ``now`` (negative: the
        listener has been waiting that long); ``-inf`` before its first audio."""
        until = self._until.get(job_id)
        return -math.inf if until is None else until - now

    def admissions(self, free: int) -> int:
        """How many queued jobs may start a talker stream in this step."""
        cap = self.policy.max_prefills
        return max(0, min(free, cap) if cap else free)

    def batch(self, job_ids: Sequence[int], buckets: Sequence[int] | None, now: float) -> list[int]:
        """Indices into ``job_ids`` of the streams that step now (see :func:`fit_to_bucket`)."""
        aheads = [self.ahead(j, now) for j in job_ids]
        return fit_to_bucket(aheads, buckets, self.policy.fit_ahead_s)

    def low(self, job_id: int, now: float) -> bool:
        """The job's buffer is below ``flush_below_s`` (its frames should be decoded now)."""
        limit = self.policy.flush_below_s
        return limit > 0 and self.ahead(job_id, now) < limit
