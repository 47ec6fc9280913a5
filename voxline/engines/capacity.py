"""Capacity from the device: how many sessions, replies and TTS streams one GPU holds.

Contract. `plan_capacity` is pure (numbers in, a :class:`Capacity` out; no torch, no
files): given each CUDA device's free memory and what the models put on it
(:class:`Footprint`), the settings the user set explicitly, the field defaults and the
measured latency row for this GPU (if any), it returns ``max_sessions``,
``max_responses`` and ``tts_max_streams`` or raises :class:`~voxline.errors.VoxlineError`
naming the field and the numbers. `voxline.engines.factory.sized_for_device` gathers the
inputs (``torch.cuda.mem_get_info`` at start-up, the checkpoints' configs), calls it and
logs `Capacity.log_line` once. On the CPU it is never called: today's defaults stand.

The formula, per CUDA device ``d`` (every stage placed on ``d`` adds its footprint)::

    usable_d = free_d - ENGINE_CONTEXT_BYTES        # the engine process' own CUDA context
    need_d   = (1 + w) * (weights_d + scratch_d + S * per_session_d + T * per_stream_d)

``per_session`` is one LLM KV slot (layers x 2 x kv_heads x head_dim x dtype bytes x
positions); ``per_stream`` one Qwen3-TTS talker slot of the same shape plus the two
code2wav state slots a stream holds; ``scratch`` the padding slots CUDA graphs write to;
``weights`` the parameters as loaded (bf16 talker, fp32 codec, the LLM in ``llm_dtype``,
Whisper and Helios in bf16). ``w`` is the working memory (activations, graph pools,
prefill logits, allocator slack) as a fraction of that static footprint, measured: the
H200 serving run held 25.2 GiB statically (1B LLM, 65 slots x 2048 positions; 1.7B TTS,
64 streams) and peaked at 37.3 GiB (closing note, issue 24), so ``w = 0.5``
(``working_memory_fraction`` in the table).

Then, with ``S`` sessions and ``T = S`` streams, memory fits
``S_mem = min_d floor((usable_d / (1 + w) - weights_d - scratch_d) / (per_session_d +
per_stream_d))``. The defaults:

- ``max_sessions = min(S_mem, latency cap)``: the latency cap is the most sessions this GPU
  held at the latency bar (p95 ``speech_stopped`` -> first audio <= 250 ms, zero
  underruns) in ``capacity_table.json``, from a row measured on the same GPU name with
  models at least as large (parameter count) as ours; the benchmark writes the rows
  (``benchmarks/gpu_serving/record_capacity.py``). No such row: the field's default (8), so an
  unmeasured GPU is never promised more than a measured one.
- ``max_responses = max_sessions``; ``tts_max_streams = min(max_responses, what fits
  beside max_sessions)``; CUDA-graph batch buckets follow the counts (powers of two up to
  them) unless ``tts_batch_buckets`` is set.

An explicit setting wins, checked: one that does not fit is a start-up error; one above
the latency cap is logged as such.

Video: ``video_streams`` (videos rendered at once, real-time and ``/v1/videos`` together)
is not sized from memory but from measurement (`plan_video_streams`): the most streams a
``video_rows`` row of the table held on the same GPU name at no fewer steps a pyramid stage
than ``video_realtime_steps_per_stage``, each at least as fast as it plays; no such row, or
the CPU: 1. `voxline.engines.factory.sized_video_streams` logs it in its own line.

More than one GPU: one ``voxline serve`` per GPU (``CUDA_VISIBLE_DEVICES=N``), each sizing
itself here, behind the balancer (``deploy/``, docs/deploy.md "More than one GPU"), not one
server with an engine per GPU: the network edge (one event loop per API process) then
scales with the GPUs, a GPU's failure takes only its own sessions, and client secrets,
call and video ids and the voice directory already work across servers. A list such as
``--device cuda:0,cuda:1`` is refused with that advice.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from voxline.errors import VoxlineError

GIB = 1 << 30
ENGINE_CONTEXT_BYTES = 1 * GIB  # the engine's CUDA context + cuBLAS workspaces (~0.6 GiB seen)
DEFAULT_WORKING_FRACTION = 0.5  # used when the table does not say (see the module docstring)
CAPACITY_FIELDS = ("max_sessions", "max_responses", "tts_max_streams")
TABLE_PATH = Path(__file__).with_name("capacity_table.json")
UNBOUNDED = 1 << 20  # a count no device bounds (nothing on it costs per session)


@dataclass(frozen=True)
class Footprint:
    """Bytes the models put on one device: fixed, per session and per TTS stream."""

    weights: int = 0
    scratch: int = 0  # the CUDA graphs' padding slots
    per_session: int = 0  # one LLM KV slot
    per_stream: int = 0  # one talker slot + its code2wav state slots
    parts: tuple[str, ...] = ()  # what is on the device, for the log ("LLM", "TTS", ...)

    def __add__(self, other: Footprint) -> Footprint:
        return Footprint(self.weights + other.weights, self.scratch + other.scratch,
                         self.per_session + other.per_session, self.per_stream + other.per_stream,
                         self.parts + other.parts)


@dataclass(frozen=True)
class DeviceBudget:
    """One CUDA device as read at start-up, and what the models put on it."""

    device: str  # "cuda:0"
    name: str  # torch.cuda.get_device_name, e.g. "NVIDIA H200"
    total: int
    free: int
    footprint: Footprint

    @property
    def usable(self) -> int:
        return self.free - ENGINE_CONTEXT_BYTES

    def need(self, sessions: int, streams: int, working_fraction: float) -> float:
        f = self.footprint
        static = f.weights + f.scratch + sessions * f.per_session + streams * f.per_stream
        return (1 + working_fraction) * static

    def room(self, working_fraction: float) -> float:
        """Bytes left for slots once the fixed part is in (before working memory)."""
        f = self.footprint
        return self.usable / (1 + working_fraction) - f.weights - f.scratch


@dataclass(frozen=True)
class LatencyRow:
    """A benchmark's measurement: `sessions` held at the latency bar on `gpu` with these models."""

    gpu: str
    sessions: int
    tts_params: int = 0  # parameters of the speech model on the GPU (0: none there)
    llm_params: int = 0  # of the embedded LLM on the GPU (0: remote or on the CPU)
    asr_device: str = "cpu"  # where the ASR ran: "cpu" or "cuda" (a row counts for its own)
    models: str = ""  # what was measured, in words
    source: str = ""  # the result file


@dataclass(frozen=True)
class VideoRow:
    """A benchmark's measurement: `streams` videos rendered at once on `gpu`, each at least
    as fast as it plays (`fps`), at `steps_per_stage` steps a pyramid stage and this size."""

    gpu: str
    streams: int
    steps_per_stage: int = 1
    width: int = 640
    height: int = 384
    fps: int = 24
    source: str = ""


@dataclass(frozen=True)
class CapacityTable:
    rows: tuple[LatencyRow, ...] = ()
    working_fraction: float = DEFAULT_WORKING_FRACTION
    path: str = ""
    video_rows: tuple[VideoRow, ...] = ()


@dataclass(frozen=True)
class Capacity:
    """What `plan_capacity` chose, and from what."""

    max_sessions: int
    max_responses: int
    tts_max_streams: int
    memory_sessions: int  # sessions memory alone holds (with as many TTS streams)
    latency: LatencyRow | None  # the row that capped max_sessions (None: fallback)
    fallback_cap: int  # the cap used without a row
    explicit: tuple[str, ...]
    devices: tuple[DeviceBudget, ...]
    working_fraction: float
    speech_on_gpu: bool
    notes: tuple[str, ...] = field(default=())

    def values(self) -> dict[str, int]:
        """The fields to set on Settings (the explicit ones are unchanged)."""
        return {"max_sessions": self.max_sessions, "max_responses": self.max_responses,
                "tts_max_streams": self.tts_max_streams}

    def log_line(self) -> str:
        """One line: what was chosen, from what memory, which values were explicit."""
        chosen = (f"max_sessions={self.max_sessions} ({self._session_source()}), "
                  f"max_responses={self.max_responses}, tts_max_streams={self.tts_max_streams}")
        if not self.speech_on_gpu:
            chosen += " (speech not on the GPU)"
        devices = "; ".join(self._device_text(d) for d in self.devices)
        explicit = ", ".join(self.explicit) or "none"
        notes = "".join(f"; {n}" for n in self.notes)
        return f"capacity: {chosen}; {devices}; explicit: {explicit}{notes}"

    def _session_source(self) -> str:
        fits = (f"memory fits {self.memory_sessions}" if self.memory_sessions < UNBOUNDED
                else "memory does not bound them")
        if "max_sessions" in self.explicit:
            return f"explicit; {fits}"
        if self.latency is not None:
            cap = (f"{self.latency.gpu} held {self.latency.sessions} at the latency bar "
                   f"({self.latency.source or 'capacity table'})")
        else:
            cap = (f"GPU not in the latency table for these models: capped at "
                   f"{self.fallback_cap}, the default")
        return f"{cap}; {fits}"

    def _device_text(self, d: DeviceBudget) -> str:
        f = d.footprint
        need = d.need(self.max_sessions, self.tts_max_streams if f.per_stream else 0,
                      self.working_fraction)
        return (f"{d.device} {d.name} ({', '.join(f.parts)}): {_gib(d.free)} free of "
                f"{_gib(d.total)}, needs {_gib(need)} = (weights {_gib(f.weights)} + "
                f"{self.max_sessions} x {_mib(f.per_session)} per session + "
                f"{self.tts_max_streams if f.per_stream else 0} x {_mib(f.per_stream)} per "
                f"TTS stream + scratch {_mib(f.scratch)}) x {1 + self.working_fraction:g}")


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.0f} MiB"


# --------------------------------------------------------------------------- planning


def find_latency_row(rows: Iterable[LatencyRow], gpu: str, *, tts_params: int,
                     llm_params: int, asr_device: str = "cpu") -> LatencyRow | None:
    """The measured row that bounds us: same GPU name and ASR device ("cpu" or "cuda":
    the CPU's transcription queue bounds a server differently), models at least as large
    as ours (a larger model holds no more sessions, so its figure is a safe cap); of
    several, the one that held the most."""
    fits = [r for r in rows
            if r.gpu == gpu and r.asr_device == asr_device and r.tts_params >= tts_params
            and r.llm_params >= llm_params]
    return max(fits, key=lambda r: r.sessions, default=None)


def plan_capacity(devices: Sequence[DeviceBudget], *, explicit: Mapping[str, int],
                  defaults: Mapping[str, int], latency: LatencyRow | None,
                  working_fraction: float = DEFAULT_WORKING_FRACTION) -> Capacity:
    """Sessions, replies and TTS streams for `devices` (see the module docstring).

    `explicit` holds the capacity fields the user set (they win, and are checked),
    `defaults` every capacity field's default. Raises VoxlineError when the models do
    not fit, or an explicit value does not."""
    if not devices:
        raise ValueError("plan_capacity needs at least one CUDA device")
    w = working_fraction
    for d in devices:
        if d.room(w) < 0:
            raise VoxlineError(
                f"the models do not fit {d.device} ({d.name}): their weights and scratch "
                f"slots need {_gib(d.need(0, 0, w))} with working memory, "
                f"{_gib(d.usable)} is usable ({_gib(d.free)} free less "
                f"{_gib(ENGINE_CONTEXT_BYTES)} for the engine's CUDA context)")
    speech = any(d.footprint.per_stream for d in devices)
    memory_sessions = _fit(devices, w, per=lambda f: f.per_session + f.per_stream)
    cap = latency.sessions if latency is not None else defaults["max_sessions"]
    sessions = explicit.get("max_sessions", min(memory_sessions, cap))
    responses = explicit.get("max_responses", sessions)
    if not speech:
        streams = explicit.get("tts_max_streams", defaults["tts_max_streams"])
    elif "tts_max_streams" in explicit:
        streams = explicit["tts_max_streams"]
    else:
        streams = min(responses, _streams_beside(devices, sessions, w))
    _check(devices, sessions, streams if speech else 0, explicit, w)
    notes = []
    if "max_sessions" in explicit and sessions > cap:
        notes.append(f"max_sessions={sessions} is above the {cap} sessions "
                     + ("measured at the latency bar" if latency else "default for an "
                        "unmeasured GPU"))
    return Capacity(sessions, responses, streams, memory_sessions, latency,
                    defaults["max_sessions"], tuple(f for f in CAPACITY_FIELDS if f in explicit),
                    tuple(devices), w, speech, tuple(notes))


def _fit(devices: Sequence[DeviceBudget], w: float, per: Callable[[Footprint], int]) -> int:
    """The most slots of `per(footprint)` bytes every device holds (huge if none costs)."""
    counts = [math.floor(d.room(w) / per(d.footprint)) for d in devices if per(d.footprint) > 0]
    return min(counts, default=UNBOUNDED)


def _streams_beside(devices: Sequence[DeviceBudget], sessions: int, w: float) -> int:
    counts = [math.floor((d.room(w) - sessions * d.footprint.per_session) / d.footprint.per_stream)
              for d in devices if d.footprint.per_stream > 0]
    return min(counts, default=UNBOUNDED)


def _check(devices: Sequence[DeviceBudget], sessions: int, streams: int,
           explicit: Mapping[str, int], w: float) -> None:
    """Every device holds `sessions` and `streams`; else an error naming the fields."""
    if sessions < 1:
        raise VoxlineError(f"not even one session fits beside the models' weights "
                           f"({'; '.join(_room_text(d, w) for d in devices)})")
    if streams < 1 and any(d.footprint.per_stream for d in devices):
        named = _named(explicit, ("max_sessions", "tts_max_streams")) or "max_sessions"
        raise VoxlineError(f"{named}: not even one TTS stream fits beside {sessions} sessions "
                           f"({'; '.join(_room_text(d, w) for d in devices)})")
    for d in devices:
        need = d.need(sessions, streams, w)
        if need <= d.usable * (1 + 1e-9):  # the counts were floored from the same quotient
            continue
        f = d.footprint
        named = _named(explicit, CAPACITY_FIELDS) or "the default capacity"
        most = (f"at most {_streams_fit(d, sessions, w)} TTS streams fit beside {sessions} "
                f"sessions" if f.per_stream else
                f"at most {math.floor(d.room(w) / f.per_session)} sessions fit")
        verb = "do" if " and " in named or named.startswith("the ") else "does"
        raise VoxlineError(
            f"{named} {verb} not fit {d.device} ({d.name}): (weights {_gib(f.weights)} + "
            f"{sessions} sessions x {_mib(f.per_session)} + {streams} TTS streams x "
            f"{_mib(f.per_stream)} + scratch {_mib(f.scratch)}) x {1 + w:g} working memory = "
            f"{_gib(need)}, but {_gib(d.usable)} is usable ({_gib(d.free)} free less "
            f"{_gib(ENGINE_CONTEXT_BYTES)} for the engine's CUDA context); {most}")


def _streams_fit(d: DeviceBudget, sessions: int, w: float) -> int:
    return max(0, math.floor((d.room(w) - sessions * d.footprint.per_session)
                             / d.footprint.per_stream))


def _named(explicit: Mapping[str, int], fields: Sequence[str]) -> str:
    return " and ".join(f"{f}={explicit[f]}" for f in fields if f in explicit)


def _room_text(d: DeviceBudget, w: float) -> str:
    return f"{d.device}: {_gib(d.room(w))} for slots after the weights"


# --------------------------------------------------------------------------- the table


def load_table(path: Path | None = None) -> CapacityTable:
    """The packaged latency table (a missing file is an empty table: the fallback applies)."""
    path = path or TABLE_PATH
    if not path.exists():
        return CapacityTable(path=str(path))
    data = json.loads(path.read_text())
    rows = tuple(LatencyRow(**row) for row in data.get("rows", []))
    video_rows = tuple(VideoRow(**row) for row in data.get("video_rows", []))
    return CapacityTable(rows, float(data.get("working_memory_fraction",
                                              DEFAULT_WORKING_FRACTION)), str(path), video_rows)


def plan_video_streams(gpu: str | None, explicit: int | None, rows: Iterable[VideoRow],
                       steps_per_stage: int) -> tuple[int, str]:
    """Real-time video streams the server renders at once (the `video_streams` setting) and
    why, in words for the log. Explicit wins; on a CPU (`gpu` None) 1; on a GPU the most a
    row measured on the same GPU name held at no fewer steps a stage (more steps are
    slower); no such row: 1, so a stream never plays slower than real time on a guess."""
    if explicit is not None:
        return explicit, "explicit"
    if gpu is None:
        return 1, "CPU: one at a time"
    fits = [r for r in rows if r.gpu == gpu and r.steps_per_stage >= steps_per_stage]
    if not fits:
        return 1, (f"{gpu} has no video row at {steps_per_stage} step(s) a stage in the "
                   "capacity table: 1")
    best = max(fits, key=lambda r: r.streams)
    return best.streams, (f"{gpu} held {best.streams} at {best.width}x{best.height}, "
                          f"{best.steps_per_stage} step(s) a stage, {best.fps} fps "
                          f"({best.source or 'capacity table'})")


def with_row(data: Mapping[str, Any], row: LatencyRow) -> dict[str, Any]:
    """The table's JSON with `row` in place of any row for the same GPU and models."""
    same = (row.gpu, row.tts_params, row.llm_params, row.asr_device)
    rows = [r for r in data.get("rows", [])
            if (r["gpu"], r.get("tts_params", 0), r.get("llm_params", 0),
                r.get("asr_device", "cpu")) != same]
    return {**data, "rows": [*rows, asdict(row)]}
