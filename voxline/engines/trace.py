"""Turn milestones on the ``voxline.trace`` logger (DEBUG), for latency work.

``trace(stream_id, "event", **fields)`` logs one line with the monotonic clock in ms
(``time.monotonic``, the clock the engine loop and the benchmarks share), so a turn's
path — speech fell silent, pause transcript queued and landed, speculation started,
first token, first segment, first audio, commit — can be lined up after a run:

    logging.getLogger("voxline.trace").setLevel(logging.DEBUG)

or, for a server and its engine process, the `trace` setting (``--trace``,
``VOXLINE_TRACE=1``), which the engine's factory applies with :func:`enable`.
Off (the default) it costs one ``isEnabledFor`` check per milestone. :func:`timeline`
reads the lines back as median milestones (``bench_pipeline.py --trace``, and
``bench_gpu_serve.py`` per level when its server traces).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable

logger = logging.getLogger("voxline.trace")


def enable() -> None:
    """Log the milestones from now on (the `trace` setting; off leaves the level alone, so
    a benchmark that set it in-process keeps it)."""
    logger.setLevel(logging.DEBUG)


def trace(stream_id: object, event: str, **fields: object) -> None:
    if logger.isEnabledFor(logging.DEBUG):
        extra = "".join(f" {k}={v}" for k, v in fields.items())
        logger.debug("t=%.1f stream=%s %s%s", time.monotonic() * 1000, stream_id, event, extra)


TIMELINE_STEPS = ("asr_start", "asr_landed", "speculation_started", "first_delta",
                  "first_segment", "turn_stopped", "commit", "first_audio")
_LINE = re.compile(r"t=([\d.]+) stream=(\S+) (\S+)(.*)")


def _pct(values: list[float], q: float) -> float:
    """The q-th percentile, interpolated between the two nearest ranks (numpy's default)."""
    v = sorted(values)
    at = (len(v) - 1) * q / 100
    lo = int(at)
    return v[lo] + (v[min(lo + 1, len(v) - 1)] - v[lo]) * (at - lo)


def timeline(lines: Iterable[str]) -> str:
    """Median milestones of the turns that spoke, from trace messages (``t=... stream=...
    event ...``), in ms after the engine saw the speech fall silent (``speech_ended``,
    `input_audio.SPEECH_END_MS` into the silence), plus the LLM's work by the reply's first
    text and first segment, and the TTS step that made the first audio (the rest of
    first_segment -> first_audio is the wait for that step to start and be collected).
    A turn counts once it has both stopped and reached first audio, in either order (a
    speculative reply's first audio is often ready before the turn stops)."""
    turns: list[dict[str, float]] = []
    current: dict[str, dict[str, float]] = {}
    for line in lines:
        m = _LINE.match(line)
        if m is None:
            continue
        t, stream, event, rest = float(m.group(1)), m.group(2), m.group(3), m.group(4)
        fields = dict(f.split("=", 1) for f in rest.split() if "=" in f)
        if event == "speech_ended":
            current[stream] = {"t0": t}
            continue
        turn = current.get(stream)
        if turn is None:
            continue
        if event.startswith("asr_") and fields.get("kind") not in ("take", "pause", "final"):
            continue  # partials
        turn.setdefault(event, t - turn["t0"])
        for key in ("prompt", "cached", "tokens", "llm_ms", "step_ms"):
            if key in fields and fields[key] != "None":
                turn.setdefault(f"{event}.{key}", float(fields[key]))
        if "first_audio" in turn and "turn_stopped" in turn:
            turns.append(current.pop(stream))
    if not turns:
        return "trace: no turn reached its first audio"
    out = [f"trace: median of {len(turns)} turns, ms after speech_ended (where the engine "
           "saw the speech fall silent)"]
    for step in TIMELINE_STEPS:
        vals = [tr[step] for tr in turns if step in tr]
        if vals:
            out.append(f"  {step:<20} {_pct(vals, 50):6.0f}   (p95 {_pct(vals, 95):.0f}, n={len(vals)})")
    ready = [tr["first_audio"] - tr["turn_stopped"] for tr in turns]
    out.append(f"  first_audio - turn_stopped {_pct(ready, 50):6.0f}   (p95 {_pct(ready, 95):.0f}; "
               f"{sum(r <= 0 for r in ready)} of {len(ready)} ready by the stop)")
    for key in ("first_delta.prompt", "first_delta.cached", "first_delta.llm_ms",
                "first_segment.tokens", "first_segment.llm_ms", "first_audio.step_ms"):
        vals = [tr[key] for tr in turns if key in tr]
        if vals:
            out.append(f"  {key:<20} {_pct(vals, 50):6.0f}")
    return "\n".join(out)
