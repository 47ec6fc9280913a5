"""Codec-chunk scheduling for the Qwen3-TTS speech model: which jobs' frames become audio when.

:class:`ChunkScheduler` owns everything between a job's talker frames and its PCM:

- the due rule: the first chunk as soon as ``initial_chunk_frames`` frames exist (first
  audio one talker step after the prompt's prefill when it is 1), later chunks every
  ``chunk_frames`` frames (or growing up to it, with ``ramp``), and whatever is left when
  the job's talker stops or waits for text; and, with a ``low`` test (the step schedule's
  :meth:`~.scheduling.StepScheduler.low`), any later chunk of a job short of unplayed
  audio as soon as it has a frame;
- the job's decoder state, set up once per job (:meth:`ChunkScheduler.open`): a slot of
  :class:`~.graphed_code2wav.GraphedCode2Wav` when graphed, else an eager
  :class:`~.code2wav.Code2WavState`, primed with the reference codes for an in-context
  clone. The decoder is stateful, so every frame is decoded exactly once and the
  concatenated chunks equal a one-shot decode of all frames;
- one batched code2wav call per launch (graphed slots and eager states in separate
  batches) and the PCM's copy to the host: frames stay on the model's device; on CUDA
  the copy goes into pinned memory, non-blocking, waited on by an event. With a codec
  stream (CUDA), every code2wav op runs on it, after the work queued so far on the
  current stream, so a launch returns at once and overlaps the next talker step.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from .code2wav import Code2WavDecoder
from .generation import awaits_text
from .graphed_code2wav import GraphedCode2Wav
from .jobs import Job

__all__ = ["ChunkScheduler", "LaunchedChunks"]


@dataclass(eq=False)
class LaunchedChunks:
    """Chunks handed to code2wav, maybe still running on the codec stream."""

    jobs: list[Job]
    sizes: list[int]  # samples per job, in ``jobs`` order
    host: Tensor | None = None  # pinned PCM, valid once ``event`` has completed (CUDA)
    event: torch.cuda.Event | None = None
    audio: np.ndarray | None = None  # the PCM, when decoded synchronously
    keep: list[Tensor] = field(default_factory=list)  # frames the codec stream reads


class ChunkScheduler:
    """Due chunks -> batched code2wav -> host PCM, per job (see the module docstring)."""

    def __init__(
        self, decoder: Code2WavDecoder, codec: GraphedCode2Wav | None, *,
        initial_chunk_frames: int, chunk_frames: int, ramp: bool, eos: int,
    ) -> None:
        """``codec``: the graphed decoder (None: eager states only). Chunk sizes are >= 1
        (the model checks). ``eos``: the talker's codec EOS id (a stream that awaits text
        leaves no frame undecoded)."""
        self.decoder = decoder
        self.codec = codec
        self.initial_chunk_frames = initial_chunk_frames
        self.chunk_frames = chunk_frames
        self.ramp = ramp
        self.eos = eos
        on_cuda = decoder.device.type == "cuda"
        self.stream = torch.cuda.Stream(decoder.device) if on_cuda else None

    def open(self, job: Job, ref_codes: Tensor | None = None) -> None:
        """Set up the job's decoder state once (kept across its talker streams); an
        in-context clone's state is eager, primed with the reference codes ``[T, Q]``."""
        if job.decoder_ready:
            return
        if ref_codes is not None:  # decode after the reference
            job.state = self.decoder.new_state()
            self.decoder.prime(job.state, ref_codes.T.to(self.decoder.device))
        elif self.codec is not None:
            with self.on_stream():
                job.codec_slot = self.codec.open()
        else:
            job.state = self.decoder.new_state()
        job.decoder_ready = True

    def drop(self, job: Job) -> None:
        """Free the job's decoder state or slot."""
        job.state = None
        if job.codec_slot is not None and self.codec is not None:
            self.codec.release(job.codec_slot)
        job.codec_slot = None

    def due(self, jobs: Iterable[Job], urgent_only: bool,
            low: Callable[[Job], bool] | None = None) -> list[Job]:
        """Jobs whose next chunk is due; a job for which ``low`` holds has any pending
        frames due after its first chunk. ``urgent_only``: only first chunks and those of
        low jobs (the chunks decoded right after the step that made their frames)."""
        due: list[Job] = []
        for job in jobs:
            if job.decoded == 0:
                want = self.initial_chunk_frames
            elif urgent_only and (low is None or not low(job)):
                continue
            elif self.ramp:
                want = min(self.chunk_frames, job.decoded)
            else:
                want = self.chunk_frames
            # A talker waiting for text (or between streams) leaves no frame undecoded.
            waits = job.stream is None or awaits_text(job.stream, self.eos)
            if job.pending and (job.done or waits or len(job.pending) >= want
                                or (low is not None and job.decoded > 0 and low(job))):
                due.append(job)
        return due

    def on_stream(self) -> contextlib.AbstractContextManager:
        """Run the enclosed code2wav ops on the codec stream (a no-op without one)."""
        if self.stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self.stream)

    def synchronize(self) -> None:
        """Wait until nothing on the codec stream may still read freed frames."""
        if self.stream is not None:
            self.stream.synchronize()

    def launch(self, due: list[Job]) -> LaunchedChunks | None:
        """Decode the due jobs' pending frames and start the PCM's copy to the host; on
        CUDA all on the codec stream (after the work queued so far on the current one),
        returning at once."""
        if not due:
            return None
        # Graphed slots and eager states (primed clones) decode in separate batches; the
        # graphed ones grouped by chunk length, each group one batch.
        due.sort(key=lambda j: (j.codec_slot is None, len(j.pending)))
        graphed = [j for j in due if j.codec_slot is not None]
        eager = due[len(graphed):]
        out = LaunchedChunks(due, [], keep=[f for j in due for f in j.pending])
        main = torch.cuda.current_stream(self.decoder.device) if self.stream is not None else None
        with self.on_stream():
            if main is not None:  # after the frames (and primed states) queued on the main stream
                self.stream.wait_stream(main)  # type: ignore[union-attr]
            wavs: list[Tensor] = []
            if graphed:
                wavs += self._decode_graphed(graphed)
            if eager:
                wavs += self.decoder.decode_batch([j.state for j in eager],  # type: ignore[misc]
                                                  [torch.stack(j.pending, dim=1) for j in eager])
            pcm = torch.cat(wavs).float()  # one device -> host copy
            if pcm.device.type == "cuda":
                out.host = torch.empty(pcm.shape, dtype=torch.float32, pin_memory=True)
                out.host.copy_(pcm, non_blocking=True)
                out.event = torch.cuda.Event()
                out.event.record()
            else:
                out.audio = pcm.numpy()
        out.sizes = [len(job.pending) * self.decoder.samples_per_frame for job in due]
        for job in due:
            job.decoded += len(job.pending)
            job.pending = []
        return out

    def _decode_graphed(self, jobs: list[Job]) -> list[Tensor]:
        """Each run of equal chunk lengths in ``jobs`` (sorted by it) as one batch: its
        frames stacked in one call and viewed as ``[n, Q, T]``, its waveforms flattened
        in job order. Per job torch calls (a stack of its frames, an index of its row)
        each gave up the GIL, some 130 a chunk at 64 streams."""
        wavs: list[Tensor] = []
        for t, run in itertools.groupby(jobs, key=lambda j: len(j.pending)):
            group = list(run)
            frames = torch.stack([f for j in group for f in j.pending])  # [n * T, Q]
            codes = frames.view(len(group), t, -1).transpose(1, 2)
            wav = self.codec.decode_batch([j.codec_slot for j in group], codes)  # type: ignore[union-attr,misc]
            wavs.append(wav.reshape(-1))
        return wavs

    def to_host(self, chunks: LaunchedChunks) -> np.ndarray:
        """The chunks' PCM on the host (waits for its copy: an event, not a device sync)."""
        if chunks.audio is None:
            chunks.event.synchronize()  # type: ignore[union-attr]
            chunks.audio = chunks.host.numpy().copy()  # type: ignore[union-attr]
            chunks.keep.clear()
        return chunks.audio

    def collect(self, launched: Iterable[LaunchedChunks]) -> dict[int, list[np.ndarray]]:
        """Each job's PCM from the launched chunks, by job id, in launch order."""
        audio: dict[int, list[np.ndarray]] = {}
        for chunks in launched:
            host = self.to_host(chunks)
            offset = 0
            for job, n in zip(chunks.jobs, chunks.sizes, strict=True):
                audio.setdefault(job.job_id, []).append(host[offset : offset + n])
                offset += n
        return audio
