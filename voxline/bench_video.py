"""Peer-side video measures for `benchmarks/video/bench_video_peer.py`: what a WebRTC peer
receiving a call's video track sees, from arrival times alone (no server, no GPU).

The track never goes quiet mid-video: when the model falls behind, the server holds the
last frame and sends it again at the frame rate (`VideoPlayout`). So the measures count
*new* frames (a frame whose picture differs from the one before it, `is_new`) and time
them against their due time: new frame ``i`` is due at the first frame's arrival
+ ``i / fps``.

- stalls: new frames arriving later than their due time + ``tolerance_s``;
- freezes: gaps between consecutive new frames longer than two frame periods;
- jitter: the p99 of |inter-arrival - 1/fps| over every frame on the track (held ones
  too: the transport's own jitter);
- steady fps: new frames per second over the clip after its first frame.

Which frames are new is read two ways, both reported: by the picture (`is_new`: a luma
thumbnail that changed; a still or smooth video reads as held) and by the chunk events
(`new_by_chunks`: the server's playout rule replayed on the events' arrival times).

`chunk_lateness` is the same due-time test on the server's chunk events (the data
channel's ``response.output_video.chunk``, each naming its frame count): frame ``i`` is
late when the event of the chunk holding it came after its due time, which says whether
the generator kept up independently of the pictures.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

NEW_FRAME_MIN_DIFF = 2.0  # mean |luma difference| (0-255) above which a frame is new
DEFAULT_TOLERANCE_S = 0.05


def is_new(prev: np.ndarray | None, cur: np.ndarray, min_diff: float = NEW_FRAME_MIN_DIFF) -> bool:
    """Whether `cur` (a small luma thumbnail, any numeric dtype) shows a new picture after
    `prev` (None: the first frame is new). A held frame is the same picture re-encoded:
    the codec refines it by a level or so at most."""
    if prev is None or prev.shape != cur.shape:
        return True
    return float(np.abs(cur.astype(np.float32) - prev.astype(np.float32)).mean()) > min_diff


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, np.float64), q)) if len(values) else None


def frame_measures(arrivals: Sequence[float], new: Sequence[bool], fps: float,
                   requested_at: float | None = None,
                   tolerance_s: float = DEFAULT_TOLERANCE_S) -> dict[str, Any]:
    """One video clip at the peer: `arrivals` (seconds, rising) of every frame received on
    the track for it, `new[i]` whether frame i showed a new picture, the video's `fps`,
    and when it was asked for (`requested_at`, same clock). Times out are in ms."""
    if len(arrivals) != len(new):
        raise ValueError("arrivals and new must have the same length")
    period = 1.0 / fps
    t = np.asarray(arrivals, np.float64)
    out: dict[str, Any] = {"frames": int(len(t)), "new_frames": int(sum(new)),
                           "held_frames": int(len(t) - sum(new)), "fps_asked": fps}
    if not len(t):
        return out | {"first_frame_ms": None, "steady_fps": None, "track_fps": None,
                      "stalls": 0, "freezes": 0, "worst_gap_ms": None, "jitter_p99_ms": None,
                      "worst_late_ms": None}
    out["first_frame_ms"] = None if requested_at is None else round((t[0] - requested_at) * 1e3, 1)
    fresh = t[np.asarray(new, bool)]
    due = t[0] + np.arange(len(fresh)) * period
    late = fresh - (due + tolerance_s)
    gaps = np.diff(fresh)
    span = fresh[-1] - fresh[0] if len(fresh) > 1 else 0.0  # no new picture: held frames only
    track_span = t[-1] - t[0]
    inter = np.diff(t)
    out |= {
        "steady_fps": round((len(fresh) - 1) / span, 2) if span > 0 else None,
        "track_fps": round((len(t) - 1) / track_span, 2) if track_span > 0 else None,
        "stalls": int((late > 0).sum()),
        "worst_late_ms": round(float(late.max() + tolerance_s) * 1e3, 1) if len(late) else None,
        "freezes": int((gaps > 2 * period).sum()),
        "worst_gap_ms": round(float(gaps.max()) * 1e3, 1) if len(gaps) else None,
        "jitter_p99_ms": (round(percentile(np.abs(inter - period).tolist(), 99) * 1e3, 1)
                          if len(inter) else None),
        "interarrival_p50_ms": round(percentile(inter.tolist(), 50) * 1e3, 1) if len(inter) else None,
        "new_gap_p99_ms": round(percentile(gaps.tolist(), 99) * 1e3, 1) if len(gaps) else None,
    }
    return out


def chunk_lateness(first_frame_at: float, chunks: Sequence[tuple[float, int]], fps: float,
                   tolerance_s: float = DEFAULT_TOLERANCE_S) -> dict[str, Any]:
    """Frames whose chunk event (arrival time, frames in it) came after their due time
    (`first_frame_at` + i / fps + tolerance), and the generated fps after the first chunk
    (frames of later chunks over the time from the first chunk's event to the last's)."""
    late, worst, index = 0, 0.0, 0
    for at, count in chunks:
        due = first_frame_at + (index + np.arange(count)) / fps
        over = at - (due + tolerance_s)
        late += int((over > 0).sum())
        if count:
            worst = max(worst, float(over.max() + tolerance_s))
        index += count
    later = sum(n for _, n in chunks[1:])
    span = chunks[-1][0] - chunks[0][0] if len(chunks) > 1 else 0.0
    return {"chunks": len(chunks), "chunk_frames": index, "late_frames": late,
            "worst_late_ms": round(worst * 1e3, 1),
            "generated_fps": round(later / span, 2) if span > 0 else None}


def new_by_chunks(arrivals: Sequence[float], chunks: Sequence[tuple[float, int]]) -> list[bool]:
    """Which received frames were new, from the chunk events alone: the server plays a
    queued frame when one is there at its due time, else holds the last one. So frame
    ``s`` (arrived at ``arrivals[s]``) is new when more frames had arrived in chunk
    events by then than new frames were played before it. Independent of the pictures
    (a still scene or a codec's smoothing cannot hide a new frame); the events come
    before their frames (the frames are encoded first), so a frame on time reads new."""
    out, played, ready, i = [], 0, 0, 0
    for at in arrivals:
        while i < len(chunks) and chunks[i][0] <= at:
            ready += chunks[i][1]
            i += 1
        fresh = ready > played
        played += fresh
        out.append(fresh)
    return out


def summarize_clips(clips: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Clips of one arm (every stream's): totals of the counts, percentiles of the rest."""
    if not clips:
        return {"clips": 0}
    out: dict[str, Any] = {"clips": len(clips)}
    for key in ("frames", "new_frames", "held_frames", "stalls", "freezes"):
        out[key] = sum(c.get(key) or 0 for c in clips)
    for key in ("first_frame_ms", "steady_fps", "track_fps", "jitter_p99_ms", "worst_gap_ms",
                "worst_late_ms"):
        vals = [c[key] for c in clips if c.get(key) is not None]
        out[key] = ({"min": min(vals), "p50": round(percentile(vals, 50), 1),
                     "max": max(vals)} if vals else None)
    return out
