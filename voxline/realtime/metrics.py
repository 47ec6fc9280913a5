"""Prometheus text-format metrics (no client library: a few counters and histograms)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

LATENCY_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


@dataclass
class Histogram:
    help: str
    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def render(self, name: str) -> list[str]:
        lines = [f"# HELP {name} {self.help}", f"# TYPE {name} histogram"]
        cumulative = 0
        for bound, count in zip(self.buckets, self.counts, strict=False):
            cumulative += count
            lines.append(f'{name}_bucket{{le="{bound}"}} {cumulative}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.n}')
        lines += [f"{name}_sum {self.total:.6f}", f"{name}_count {self.n}"]
        return lines


class Metrics:
    """Server-wide counters; updated on the event loop only (no locking needed)."""

    def __init__(self) -> None:
        self.counters: dict[str, tuple[str, float]] = {}
        self.gauges: dict[str, tuple[str, float]] = {}
        self.histograms: dict[str, Histogram] = {
            "voxline_first_audio_seconds": Histogram(
                "time from end of user speech (or response.create) to the first audio delta"),
            "voxline_response_seconds": Histogram("duration of responses until response.done"),
            "voxline_speech_request_seconds": Histogram("time to first audio of /v1/audio/speech"),
        }

    def inc(self, name: str, help: str, value: float = 1.0) -> None:
        old = self.counters.get(name, (help, 0.0))[1]
        self.counters[name] = (help, old + value)

    def set(self, name: str, help: str, value: float) -> None:
        self.gauges[name] = (help, value)

    def observe(self, name: str, value: float) -> None:
        self.histograms[name].observe(value)

    def render(self) -> str:
        lines: list[str] = []
        for name, (help, value) in sorted(self.counters.items()):
            lines += [f"# HELP {name} {help}", f"# TYPE {name} counter", f"{name} {value:g}"]
        for name, (help, value) in sorted(self.gauges.items()):
            lines += [f"# HELP {name} {help}", f"# TYPE {name} gauge", f"{name} {value:g}"]
        for name, hist in sorted(self.histograms.items()):
            lines += hist.render(name)
        return "\n".join(lines) + "\n"


router = APIRouter()


@router.get("/metrics")
async def metrics(request: Request) -> PlainTextResponse:
    from voxline.realtime.app import get_state

    state = get_state(request)
    m = state.metrics
    m.set("voxline_sessions_active", "open realtime sessions", state.sessions)
    m.set("voxline_engine_ready", "1 when the engine is ready", 1.0 if state.engine.ready else 0.0)
    m.set("voxline_engine_restarts", "engine process restarts",
          float(state.engine.status().get("restarts", 0)))
    return PlainTextResponse(m.render(), media_type="text/plain; version=0.0.4")
