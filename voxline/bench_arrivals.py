"""Open-loop load as a listener hears it, for the TTS stage benchmark
(``benchmarks/gpu_speech/bench_gpu_tts.py --arrivals``): jobs arriving at random (a Poisson
process), each job's playout and underruns counted from its chunks' arrival times, and the
step schedules the benchmark compares."""

from __future__ import annotations

import dataclasses

import numpy as np

from voxline.engines.models.qwen3_tts import scheduling as sched

# name -> (ramp, step policy). fifo: the stage before arrival scheduling (chunks of 1 then
# 4 frames, every live stream in every step); playout: what the engine runs by default now.
SCHEDULES: dict[str, tuple[bool, sched.StepPolicy]] = {
    **sched.SCHEDULES,  # the tts_schedule setting's choices
    "ramp": (True, sched.FIFO),
    "playout-no-first-frame": (True, dataclasses.replace(sched.PLAYOUT, first_frame_with_prefill=False)),
    "playout-no-fit": (True, dataclasses.replace(sched.PLAYOUT, fit_ahead_s=0.0)),
    "playout-k1": (True, dataclasses.replace(sched.PLAYOUT, max_prefills=1)),
}


def poisson_arrivals(rate: float, window: float, seed: int) -> list[float]:
    """Arrival times in ``[0, window)`` of a Poisson process of ``rate`` per second."""
    rng = np.random.default_rng(seed)
    times, t = [], rng.exponential(1.0 / rate)
    while t < window:
        times.append(float(t))
        t += rng.exponential(1.0 / rate)
    return times


class Listener:
    """One job as its client hears it: playout from the first chunk, underruns after it."""

    def __init__(self, arrival: float) -> None:
        self.arrival = arrival
        self.first: float | None = None  # arrival -> first chunk (s)
        self.until = 0.0  # when the audio received so far has played out
        self.underruns = 0
        self.longest_wait = 0.0  # the longest silence a listener sat through after the start
        self.finished = False

    def chunk(self, now: float, seconds: float) -> None:
        if not seconds:
            return
        if self.first is None:
            self.first, self.until = now - self.arrival, now
        elif now > self.until + 1e-4:
            self.underruns += 1
            self.longest_wait = max(self.longest_wait, now - self.until)
        self.until = max(self.until, now) + seconds
