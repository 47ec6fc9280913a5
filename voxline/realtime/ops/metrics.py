"""Server metrics in Prometheus' text format, through `prometheus-client`.

Each app has its own registry (tests run several apps in one process). Counters and
gauges are created on first use by name; histograms are declared here with their help
text and latency buckets. Updated on the event loop only.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
HISTOGRAMS = {
    "voxline_first_audio_seconds":
        "time from end of user speech (or response.create) to the first audio delta",
    "voxline_response_seconds": "duration of responses until response.done",
    "voxline_speech_request_seconds": "time to first audio of /v1/audio/speech",
    "voxline_llm_first_token_seconds":
        "remote reply model (--llm openai:...): request sent to first streamed token",
}
# Counters the sessions report through `observe` (each observation adds its value).
OBSERVED_COUNTERS = {
    "voxline_speculation_started_total":
        "speculative turns started: a reply begun during a pause, before the turn ended",
    "voxline_speculation_committed_total":
        "speculative turns released: the turn ended and the reply was the one asked for",
    "voxline_speculation_discarded_total":
        "speculative turns dropped unsent: the user went on speaking, or another reply was "
        "asked for",
}
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """One app's metrics: `inc` counters, `set` gauges, `observe` histograms."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._counters: dict[str, Counter] = {}
        self._gauges: dict[str, Gauge] = {}
        self._histograms = {name: Histogram(name, help, buckets=LATENCY_BUCKETS,
                                            registry=self.registry)
                            for name, help in HISTOGRAMS.items()}

    def inc(self, name: str, help: str, value: float = 1.0) -> None:
        counter = self._counters.get(name)
        if counter is None:
            counter = self._counters[name] = Counter(name, help, registry=self.registry)
        counter.inc(value)

    def set(self, name: str, help: str, value: float) -> None:
        gauge = self._gauges.get(name)
        if gauge is None:
            gauge = self._gauges[name] = Gauge(name, help, registry=self.registry)
        gauge.set(value)

    def observe(self, name: str, value: float) -> None:
        if name in OBSERVED_COUNTERS:
            self.inc(name, OBSERVED_COUNTERS[name], value)
        else:
            self._histograms[name].observe(value)

    def value(self, sample: str) -> float | None:
        """One sample's current value (e.g. ``voxline_sessions_total``), None if absent."""
        return self.registry.get_sample_value(sample)

    def render(self) -> bytes:
        return generate_latest(self.registry)
