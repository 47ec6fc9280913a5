"""Qwen3-TTS as the engine's :class:`~voxline.engines.speech_model.SpeechModel`.

Every job (one text segment) becomes a talker stream. Each :meth:`Qwen3SpeechModel.step`
is one batched talker step over all live streams (continuous batching: a job started
between steps is prefilled in the same forward as the others' next frame, a finished or
cancelled job leaves at once), followed by one batched code2wav call over the streams
whose next audio chunk is due. Two pieces beside this module hold the halves of that
work: :mod:`.jobs` a job's text and frame bookkeeping (tokens, talker-stream runs,
frame limits, text spans), :mod:`.codec_chunks` the codec-chunk scheduling (the due rule,
the decoder state per job, batched code2wav, the PCM's copy to the host).

Arrivals (``schedule``, :mod:`.scheduling`; the engine runs ``PLAYOUT``, the class
defaults to ``FIFO``): from each job's playout buffer (audio sent minus what a listener
has played since its first chunk, on ``clock``) a step may cap its new prefills, leave a
far-ahead stream out rather than replay a bigger batch bucket (never while a job waits for
a talker slot), decode a stream short of audio at once, and make a new stream's first
frame in its prefill step. It changes when frames are made and decoded, never which.

Overlap (``overlap_codec``, default on when the decoder is on CUDA): chunks that are
due from frames of earlier steps (every chunk but a stream's first) are decoded at the
start of the next step, on a CUDA stream of their own, while the talker and code
predictor run theirs on the main stream; their PCM is collected after the talker's
step. Only first chunks (first audio), and under the schedule's ``flush_below_s`` the
chunks of streams short of unplayed audio, are decoded right after the step that made
their frames: a stream's second chunk would otherwise leave two steps after its first,
with one frame (80 ms) to cover them. The audio and texts are the same either way, and
so are the chunks, except that text arriving between steps may cut them differently and
a stream that stops on codec EOS right after a chunk was due ends with that chunk
(``finished``) instead of an empty output after it; later chunks leave one step later,
off the step's critical path.

One stream per reply (streaming text input): a job started with ``more_text`` takes
later segments (:meth:`Qwen3SpeechModel.append_text`) into the same talker stream, one text
token per frame as the model's streaming-text layout does, until
:meth:`~Qwen3SpeechModel.end_text` adds ``tts_eos``. A stream whose next frame needs text
that has not arrived waits (it skips steps; its undecoded frames are decoded meanwhile),
so its frames are exactly those of one prompt with the whole text, however the text was
split in time. The decoder state lives for the whole job. Text that reaches the job after
its talker stream stopped (codec EOS or the frame limit while more text was coming), or
any text of an in-context clone (whose prompt holds the whole text), is spoken by a new
talker stream of the same job, still on the same decoder state.

A job whose text has nothing to speak (blank, or no tokens) ends with one empty
``finished`` output; text spans ride on outputs as :mod:`.jobs` describes.

Seeds: ``job.seed`` seeds the stream's own generator, so a seeded job gives the same
audio whatever shares its batch; ``None`` draws a fresh seed (the published sampling
settings, like the reference's default). Greedy decoding is ``sampling=
TalkerSampling.greedy()`` (or ``temperature=0``), deterministic for every job.

Speed: Qwen3-TTS has no speaking-rate control of its own, so a job whose ``speed`` is
not 1 has its PCM time-stretched at the same pitch
(:class:`~voxline.codecs.tempo.TimeStretch`, FFmpeg's ``atempo``), streamed chunk by
chunk: 2.0 speaks in half the time, as Piper's ``length_scale / speed`` does. The
stretcher holds back up to one analysis window, released on the job's next output or
its last; a speed outside ``SPEED_RANGE`` (0.25..4) is refused by :meth:`start`.

Voice: the model speaks every job with one preset ``speaker`` and ``language``, unless
the job names another preset (``job.voice``) or, on a Base checkpoint, clones one: a
``job.reference`` (clip + transcript, normalised once for both encoders) or a ``job.voice``
naming a reference registered with :meth:`Qwen3SpeechModel.register_voice`. Encoded
references are cached (:class:`~.reference.ReferenceCache`), so a repeated voice runs
neither the speaker encoder nor the codec encoder again. In-context clones prime the
job's codec decoder with the reference codes (eager decoder state, also when graphed).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from voxline.codecs.tempo import TimeStretch
from voxline.engines.protocol import VoiceReference
from voxline.engines.speech_model import SpeechJob, SpeechOut
from voxline.kernels.cuda_graphs import GraphBackfill, to_device
from voxline.logs import phase

from .checkpoint import Qwen3TTSModel
from .codec_chunks import ChunkScheduler, LaunchedChunks
from .codec_encoder import CodecEncoder
from .generation import TalkerGenerator, TalkerSampling, awaits_text
from .graphed_code2wav import GraphedCode2Wav
from .graphed_talker import PREDICTOR_TOP_K_CAP, GraphedTalkerGenerator
from .jobs import Job, frame_limit
from .prompt import TalkerPrompt, assistant_ids, build_prompt, ref_text_ids
from .reference import (
    EncodedReference,
    ReferenceCache,
    check_duration,
    normalize_reference,
    reference_key,
)
from .scheduling import FIFO, StepPolicy, StepScheduler
from .tokenizer import Qwen3TextTokenizer

__all__ = ["RANDOM_WEIGHTS_KEY", "Qwen3SpeechModel"]

logger = logging.getLogger(__name__)

# A key in config.json that marks a random-weight test checkpoint (never a voice).
RANDOM_WEIGHTS_KEY = "voxline_random_weights"


class Qwen3SpeechModel:
    """Continuous-batching Qwen3-TTS speech model (see the module docstring)."""

    def __init__(
        self,
        model: Qwen3TTSModel | str | Path,
        tokenizer: Qwen3TextTokenizer | None = None,
        *,
        initial_chunk_frames: int = 1,
        chunk_frames: int = 4,
        ramp: bool = False,
        max_streams: int = 8,
        max_len: int = 2048,
        max_frames: int = 2048,
        speaker: str | None = None,
        language: str = "auto",
        sampling: TalkerSampling | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        codec_dtype: torch.dtype = torch.float32,
        graphs: bool | None = None,
        capture_at_load: bool = True,
        compile: bool | None = None,
        batch_buckets: Sequence[int] | None = None,
        codec_encoder: CodecEncoder | None = None,
        reference_cache: int = 16,
        overlap_codec: bool | None = None,
        schedule: StepPolicy = FIFO,
        clock: Callable[[], float] = time.monotonic,
        backfill: GraphBackfill | None = None,
    ) -> None:
        """``model``: a loaded model (then ``tokenizer`` is required) or a checkpoint
        directory in the official layout (loaded on ``device``: talker in ``dtype``,
        codec decoder in ``codec_dtype``; tokenizer from the same directory).

        ``speaker`` defaults to the checkpoint's first preset voice (CustomVoice models;
        none for other kinds), ``language`` to ``"auto"``. ``sampling`` defaults to the
        published settings; ``temperature``/``top_k``/``top_p`` override it for the
        talker and the code predictor alike. ``max_streams`` talker slots of ``max_len``
        positions (prompt + frames) are allocated once; more jobs wait for a free slot.
        ``ramp``: after the first chunk, each chunk holds at most as many frames as were
        already emitted (e.g. 1, 1, 2, 4, 4, ...), so at a real-time factor below 1 the
        listener never waits for the next chunk while the chunks grow to ``chunk_frames``.
        ``graphs`` (default: on for CUDA) steps frames with :class:`GraphedTalkerGenerator`
        (CUDA graphs in batch/length buckets, captured at load unless ``capture_at_load``
        is off; on the CPU its eager twin) and code2wav with :class:`GraphedCode2Wav`
        (one graph per batch bucket and chunk length). ``compile`` (default: with capture)
        compiles the decoder-layer steps inside those graphs (static shapes per bucket;
        2.5x faster steps), and code2wav's steps for the steady chunk length
        (``chunk_frames``): ~2.5 minutes at load on an H200 for batch buckets 1, 4, 10, 32,
        longer for more buckets. ``batch_buckets``: the batch sizes
        the graphs are captured for (default: powers of two up to ``max_streams``; a batch
        runs in the smallest bucket that holds it).
        ``codec_encoder`` (Base checkpoints, in-context cloning) defaults to the checkpoint
        directory's, loaded on first use; ``reference_cache`` encoded references are kept.
        ``overlap_codec`` (default: the decoder is on CUDA) decodes later chunks at the
        start of the next step, overlapping the talker (see the module docstring); on
        CUDA on a stream of their own.
        ``schedule``: how steps treat arriving jobs (:mod:`.scheduling`; default ``FIFO``:
        every live stream every step, every free slot prefilled at once), judged by each
        job's playout buffer on ``clock`` (seconds, monotonic).
        ``backfill``: with capture at load, only the buckets that cover the others are
        captured here; the rest join it, for the engine's TTS thread to capture once the
        engine is ready (:class:`~voxline.kernels.cuda_graphs.GraphBackfill`).
        """
        if initial_chunk_frames < 1 or chunk_frames < 1:
            raise ValueError("initial_chunk_frames and chunk_frames must be >= 1")
        self.model, self.tokenizer = self._open(model, tokenizer, dtype=dtype, device=device,
                                                codec_dtype=codec_dtype)
        self.max_frames = max_frames
        self.decoder = self.model.code2wav
        self.sample_rate = self.decoder.config.output_sample_rate
        self.samples_per_frame = self.decoder.samples_per_frame

        spk_ids = self.model.config.talker.spk_id
        if speaker is None and self.model.config.tts_model_type == "custom_voice" and spk_ids:
            speaker = next(iter(spk_ids))
        self.speaker = speaker
        self.language = language
        self.sampling = _with_overrides(sampling or TalkerSampling(), temperature=temperature,
                                        top_k=top_k, top_p=top_p)
        # Fail on an unknown voice or language now, not on the first job.
        self._build(assistant_ids([self.tokenizer.chat.newline], self.tokenizer.chat), self.speaker)

        self.max_streams = max_streams
        self.backfill = backfill
        if graphs is None:
            graphs = self.model.talker.device.type == "cuda"
        self.generator, self.codec = self._make_generator(
            graphs, max_len=max_len, compile=compile, batch_buckets=batch_buckets,
            capture_at_load=capture_at_load, codec_frames=(initial_chunk_frames, chunk_frames))
        self.chunks = ChunkScheduler(self.decoder, self.codec, initial_chunk_frames=initial_chunk_frames,
                                     chunk_frames=chunk_frames, ramp=ramp, eos=self.generator.eos)
        on_cuda = self.decoder.device.type == "cuda"
        self.overlap_codec = on_cuda if overlap_codec is None else overlap_codec
        self._jobs: dict[int, Job] = {}  # every job not yet finished, in start order
        self._queue: deque[Job] = deque()  # started, waiting for a talker slot
        self.codec_encoder = codec_encoder
        self.references = ReferenceCache(reference_cache)
        self._registered: dict[str, VoiceReference] = {}  # named, not yet encoded
        self.scheduler = StepScheduler(schedule, clock)

    def _open(self, model: Qwen3TTSModel | str | Path, tokenizer: Qwen3TextTokenizer | None, *,
              dtype: torch.dtype, device: torch.device | str, codec_dtype: torch.dtype,
              ) -> tuple[Qwen3TTSModel, Qwen3TextTokenizer]:
        """The model and tokenizer, loaded from a checkpoint directory if given one."""
        self.random_weights = False
        self.model_dir: Path | None = None
        if not isinstance(model, Qwen3TTSModel):
            model_dir = self.model_dir = Path(model)
            self.random_weights = _is_random_weights(model_dir)
            with phase(logger, "Qwen3-TTS weights"):
                model = Qwen3TTSModel.from_pretrained(
                    model_dir, dtype=dtype, device=device, codec_dtype=codec_dtype
                )
            tokenizer = tokenizer or Qwen3TextTokenizer.from_pretrained(model_dir, model.config)
            if self.random_weights:
                logger.warning(
                    "%s is a random-weight TEST checkpoint: its audio is noise, not speech",
                    model_dir,
                )
        if tokenizer is None:
            raise ValueError("a loaded model needs its tokenizer (Qwen3TextTokenizer)")
        return model, tokenizer

    def _make_generator(
        self, graphs: bool, *, max_len: int, compile: bool | None, batch_buckets: Sequence[int] | None,
        capture_at_load: bool, codec_frames: tuple[int, int],
    ) -> tuple[TalkerGenerator, GraphedCode2Wav | None]:
        """The talker's frame generator and, when graphed, the graphed code2wav."""
        max_streams = self.max_streams
        if batch_buckets is not None and not graphs:
            raise ValueError("batch_buckets needs graphs=True (the plain generator has no buckets)")
        if not graphs:
            return TalkerGenerator(self.model.talker, max_streams=max_streams, max_len=max_len), None
        if batch_buckets is not None and not all(1 <= b <= max_streams for b in batch_buckets):
            raise ValueError(f"batch_buckets must lie in 1..max_streams ({max_streams}), "
                             f"got {list(batch_buckets)}")
        sub = self.sampling
        # Frame steps rank a top-k of the predictor's logits when the top-k fits
        # (captured at load); otherwise they sort them all (then those are captured).
        cap = PREDICTOR_TOP_K_CAP if (sub.subtalker_temperature <= 0
                                      or 0 < sub.subtalker_top_k <= PREDICTOR_TOP_K_CAP) else 0
        graphed = GraphedTalkerGenerator(self.model.talker, max_streams=max_streams, max_len=max_len,
                                         compile=compile, batch_buckets=batch_buckets,
                                         predictor_top_k_cap=cap)
        initial_chunk_frames, chunk_frames = codec_frames
        codec = GraphedCode2Wav(self.decoder, max_streams=max_streams,
                                max_frames=max(chunk_frames, initial_chunk_frames),
                                batch_buckets=batch_buckets, compile=graphed.compiled,
                                compile_frames={chunk_frames})
        if graphed.capture and capture_at_load:
            with phase(logger, "Qwen3-TTS talker graphs" + (" (first buckets)" if self.backfill else "")):
                graphed.prepare(backfill=self.backfill)
        if codec.capture and capture_at_load:
            with phase(logger, "Qwen3-TTS code2wav graphs" + (" (first buckets)" if self.backfill else "")):
                codec.prepare(backfill=self.backfill)
        return graphed, codec

    @property
    def device(self) -> torch.device:
        """Where the talker runs (the stage gives its steps a CUDA stream of their own)."""
        return self.model.talker.device

    @property
    def initial_chunk_frames(self) -> int:
        return self.chunks.initial_chunk_frames

    @property
    def chunk_frames(self) -> int:
        return self.chunks.chunk_frames

    @property
    def ramp(self) -> bool:
        return self.chunks.ramp

    # ------------------------------------------------------------------ SpeechModel

    def start(self, job: SpeechJob) -> None:
        """Queue a job; it joins the talker batch at the next step with a free slot.
        A ``speed`` outside :data:`~voxline.codecs.tempo.SPEED_RANGE` is refused."""
        if job.job_id in self._jobs:
            raise ValueError(f"job {job.job_id} is already running")
        tempo = TimeStretch(self.sample_rate, job.speed) if job.speed != 1.0 else None
        entry = Job(job, text_open=job.more_text, tempo=tempo)
        self._jobs[job.job_id] = entry
        entry.add_text(job.text, self.tokenizer.text_ids)
        self._queue.append(entry)

    def append_text(self, job_id: int, text: str) -> None:
        """More text for a ``more_text`` job (joined to the last segment with a space);
        an open talker stream takes it at once. Unknown (cancelled) jobs are ignored."""
        entry = self._jobs.get(job_id)
        if entry is None:
            return
        if not entry.text_open:
            raise ValueError(f"job {job_id}'s text has ended (end_text) or was never open")
        new = entry.add_text(text, self.tokenizer.text_ids)
        stream = entry.stream
        if new and entry.run_open and stream is not None and not stream.finished:
            ids = to_device([new], torch.long, self.model.talker.device)
            stream.prompt.append_text(self.model.talker.embed_text(ids)[0])
            entry.feed(len(new), self.max_frames)

    def end_text(self, job_id: int) -> None:
        """The job's text is complete: its talker stream gets ``tts_eos`` after the last
        token and the job finishes when the talker stops."""
        entry = self._jobs.get(job_id)
        if entry is None:
            return
        entry.text_open = False
        if entry.run_open and entry.stream is not None:
            entry.stream.prompt.end_text()
        entry.run_open = False

    def cancel(self, job_id: int) -> None:
        """Drop a job now: its talker slot and decoder state are freed, no more outputs."""
        entry = self._jobs.pop(job_id, None)
        if entry is None:
            return
        if entry.stream is not None:
            self.generator.release(entry.stream)
        if entry in self._queue:
            self._queue.remove(entry)
        entry.pending.clear()
        self.chunks.drop(entry)
        self.scheduler.forget(job_id)

    def load_note(self) -> str | None:
        """For the engine's stage load line: gaps in the audio this model sent."""
        return self.scheduler.load_note()

    def has_work(self) -> bool:
        """A step would make progress. False while every job waits for text (its stream
        held back, or between streams), so the engine does not spin until text comes."""
        eos = self.generator.eos
        free = sum(1 for j in self._jobs.values() if j.stream is not None) < self.max_streams
        for j in self._jobs.values():
            if j.done or j.pending:
                return True
            if j.stream is None:
                if not j.text_open or (free and j.unfed > 0):
                    return True  # ends now, or starts a stream
            elif not awaits_text(j.stream, eos):
                return True
        return False

    def step(self) -> list[SpeechOut]:
        """One batched talker step over every live job, then the chunks that are due.

        If it raises, every job is dropped (the caller fails them all) and the stage is
        idle and reusable."""
        try:
            return self._step()
        except BaseException:
            self.chunks.synchronize()  # nothing may still read freed frames
            for job_id in list(self._jobs):
                self.cancel(job_id)
            raise

    def _step(self) -> list[SpeechOut]:
        # Chunks due from earlier frames start first (before _admit changes any job's
        # talker stream, so the due rule sees what the previous step left).
        self.scheduler.stepped()
        jobs = self._jobs.values()
        early = (self.chunks.launch(self.chunks.due(jobs, urgent_only=False, low=self._low()))
                 if self.overlap_codec else None)
        self._talk()
        late = self.chunks.launch(self.chunks.due(jobs, urgent_only=self.overlap_codec, low=self._low()))
        return self._outputs([c for c in (early, late) if c is not None])

    def _low(self) -> Callable[[Job], bool] | None:
        """The schedule's test for a job low on unplayed audio (None: the policy has none)."""
        if self.scheduler.policy.flush_below_s <= 0:
            return None
        now = self.scheduler.clock()
        return lambda job: self.scheduler.low(job.job_id, now)

    def _talk(self) -> None:
        """Admit queued jobs, then one batched talker step over the live streams the
        schedule picks (and, with ``first_frame_with_prefill``, a second over the new ones)."""
        fresh = self._admit()
        eos = self.generator.eos
        live = []
        for j in self._jobs.values():
            if j.stream is None:
                continue
            if awaits_text(j.stream, eos):
                self.scheduler.waits_for_text(j.job_id)
            else:
                live.append(j)
        self._generate(self._batch(live))
        if self.scheduler.policy.first_frame_with_prefill:
            self._generate([j for j in fresh if j.stream is not None and not j.stream.finished
                            and not awaits_text(j.stream, eos)])

    def _batch(self, live: list[Job]) -> list[Job]:
        """The live streams this step serves: new ones (their prefill) always; the others
        as the schedule fits them to the generator's batch buckets, unless a job waits for
        a talker slot (then every stream steps, so that slots free up soonest)."""
        if self.scheduler.policy.fit_ahead_s <= 0 or any(j.unfed > 0 for j in self._queue):
            return live
        new = [j for j in live if j.stream.hidden is None]  # type: ignore[union-attr]
        running = [j for j in live if j.stream.hidden is not None]  # type: ignore[union-attr]
        keep = self.scheduler.batch([j.job_id for j in running],
                                    getattr(self.generator, "batch_buckets", None),
                                    self.scheduler.clock())
        return new + [running[i] for i in keep]

    def _generate(self, live: list[Job]) -> None:
        """One batched talker step over ``live``: frames to their jobs, stops handled."""
        if not live:
            return
        by_id = {id(j.stream): j for j in live}
        for r in self.generator.step([j.stream for j in live]):  # type: ignore[misc]
            entry = by_id[id(r.stream)]
            if r.frame is not None:
                entry.pending.append(r.frame)
                entry.frames += 1
            if r.finish is not None:
                self._stream_stopped(entry)

    def _stream_stopped(self, entry: Job) -> None:
        """The job's talker stream stopped: the job is done unless text came (or may
        come) after what the stream was given; that text gets a new stream."""
        self.generator.release(entry.stream)  # type: ignore[arg-type]
        entry.stream = None
        entry.run_open = False
        if entry.unfed > 0 or entry.text_open:
            self._queue.append(entry)
        else:
            entry.done = True

    def _outputs(self, launched: list[LaunchedChunks]) -> list[SpeechOut]:
        """One output per job with new audio or finished, its chunks in launch order."""
        audio = self.chunks.collect(launched)
        now = self.scheduler.clock()  # the chunks leave the stage: playout counts from here
        outs: list[SpeechOut] = []
        for job_id, entry in list(self._jobs.items()):
            parts = audio.get(job_id)
            finished = entry.done and not entry.pending
            if parts is None and not finished:
                continue
            wav = np.concatenate(parts) if parts else np.zeros(0, np.float32)
            if entry.tempo is not None:
                wav = _stretch(entry.tempo, wav, finished)
                if not len(wav) and not finished:
                    continue  # held back by the stretcher: its text waits for the audio
            text = entry.span_text(finished) if len(wav) or finished else ""
            outs.append(SpeechOut(job_id, wav, self.sample_rate, text, finished))
            self.scheduler.sent(job_id, len(wav) / self.sample_rate, now)
            if finished:
                del self._jobs[job_id]
                self.chunks.drop(entry)
                self.scheduler.forget(job_id)
        return outs

    def synthesize_all(self, text: str, *, seed: int | None = None, speed: float = 1.0) -> np.ndarray:
        """Speak ``text`` as one job to the end (offline use; the stage must be idle)."""
        if self._jobs:
            raise RuntimeError("synthesize_all needs an idle stage")
        self.start(SpeechJob(-1, text, speed=speed, seed=seed))
        parts: list[np.ndarray] = []
        while self._jobs:
            parts += [o.audio for o in self.step()]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    # ------------------------------------------------------------------ jobs and prompts

    def _admit(self) -> list[Job]:
        """Give queued jobs with text to speak free talker slots (their prompts prefill
        in this step), as many as the schedule admits; a job whose text has all been
        spoken ends, unless more may come. Returns the jobs whose stream started."""
        used = sum(1 for j in self._jobs.values() if j.stream is not None and j.stream.slot >= 0)
        admit = self.scheduler.admissions(self.max_streams - used)
        started: list[Job] = []
        for entry in list(self._queue):
            if entry.unfed == 0:
                if not entry.text_open:
                    self._queue.remove(entry)
                    entry.done = True  # nothing (more) to say: finishes in this step
                continue  # waits for text, holding no talker slot
            if len(started) >= admit:
                continue
            self._queue.remove(entry)
            try:
                self._start_stream(entry)
                started.append(entry)
            except Exception:  # one bad job must not fail every other job
                logger.exception("Qwen3-TTS could not start job %d", entry.job_id)
                entry.done = True  # finishes with the audio it has, in this step
        return started

    def _start_stream(self, entry: Job) -> None:
        """A talker stream for the job's text not yet given to one; the decoder state is
        set up for the job's first stream and kept for the next ones."""
        job = entry.job
        ids = entry.ids[entry.fed:]
        clone = self.reference_of(job)
        speaker = None if clone is not None else self.voice_of(job)
        in_context = clone is not None and clone.ref_codes is not None
        streaming = entry.text_open and not in_context  # an ICL prompt holds all its text
        prompt = self._build(assistant_ids(ids, self.tokenizer.chat), speaker, clone,
                             text_open=streaming)
        self.chunks.open(entry, clone.ref_codes if in_context else None)  # type: ignore[union-attr]
        params = dataclasses.replace(self.sampling, seed=job.seed, max_frames=1)
        entry.start_run(self.generator.start(prompt, params, stream_id=job.job_id), streaming)
        entry.feed(len(ids), self.max_frames)

    def prepare(self, job: SpeechJob) -> tuple[TalkerPrompt, TalkerSampling] | None:
        """The talker prompt and sampling settings a job runs with; None: nothing to say."""
        ids = self.tokenizer.assistant_ids(job.text)
        if ids is None:
            return None
        limit = frame_limit(len(ids) - 8, self.max_frames)  # the template adds 8 ids around the text
        clone = self.reference_of(job)
        speaker = None if clone is not None else self.voice_of(job)
        return (self._build(ids, speaker, clone),
                dataclasses.replace(self.sampling, seed=job.seed, max_frames=limit))

    def voice_of(self, job: SpeechJob) -> str | None:
        """The job's voice when the checkpoint has that preset (any case), else the stage's."""
        if job.voice:
            for name in self.model.config.talker.spk_id or {}:
                if name.lower() == job.voice.lower():
                    return name
        return self.speaker

    def _build(self, input_ids: list[int], speaker: str | None,
               clone: EncodedReference | None = None, text_open: bool = False) -> TalkerPrompt:
        if clone is None:
            return build_prompt(self.model.talker, self.model.config, input_ids,
                                language=self.language, speaker=speaker, text_open=text_open)
        return build_prompt(
            self.model.talker, self.model.config, input_ids, language=self.language,
            speaker_embedding=clone.speaker_embedding, ref_ids=clone.ref_ids,
            ref_codes=clone.ref_codes, text_open=text_open,
        )

    # ------------------------------------------------------------------ voice cloning

    @property
    def can_clone(self) -> bool:
        """A Base checkpoint: it has the speaker encoder that cloning needs."""
        return self.model.speaker_encoder is not None

    def register_voice(self, reference: VoiceReference) -> None:
        """Register ``reference`` under its name (encoded on first use); empty audio
        removes the name. Call between steps, like :meth:`start`."""
        if not reference.name:
            raise ValueError("a registered voice needs a name")
        self.references.drop_named(reference.name)
        self._registered.pop(reference.name.lower(), None)
        if reference.audio:
            if not self.can_clone:
                raise ValueError(f"{self.model.config.tts_model_type} checkpoints cannot clone "
                                 "voices (a Base checkpoint can)")
            self._registered[reference.name.lower()] = reference

    def reference_of(self, job: SpeechJob) -> EncodedReference | None:
        """The job's clone: its own reference, or the registered voice it names."""
        if job.reference is not None:
            encoded = self._encoded(job.reference)
            if job.reference.name:
                self.references.set_named(job.reference.name, encoded)
            return encoded
        if not job.voice:
            return None
        encoded = self.references.named(job.voice)
        pending = self._registered.pop(job.voice.lower(), None)
        if encoded is None and pending is not None:
            encoded = self._encoded(pending)
            self.references.set_named(job.voice, encoded)
        return encoded

    def _encoded(self, ref: VoiceReference) -> EncodedReference:
        """``ref`` encoded, from the LRU when the same clip and transcript were seen."""
        key = reference_key(ref.audio, ref.sample_rate, ref.text)
        encoded = self.references.get(key)
        if encoded is None:
            encoded = self.encode_reference(ref)
            self.references.put(key, encoded)
        return encoded

    def encode_reference(self, ref: VoiceReference) -> EncodedReference:
        """Normalise the clip once; x-vector from the speaker encoder and, with a
        transcript, codes from the codec encoder (in-context cloning)."""
        if self.model.speaker_encoder is None:
            raise ValueError(f"{self.model.config.tts_model_type} checkpoints cannot clone "
                             "voices (a Base checkpoint can)")
        audio = normalize_reference(np.frombuffer(ref.audio, dtype="<f4"), ref.sample_rate)
        check_duration(audio)
        embedding = self.model.speaker_encoder.embed(audio)
        if not ref.text or not ref.text.strip():
            return EncodedReference(embedding, None, None)
        if self.codec_encoder is None:
            if self.model_dir is None:
                raise ValueError("in-context cloning needs a codec_encoder for a loaded model")
            self.codec_encoder = CodecEncoder.from_pretrained(
                self.model_dir, device=self.model.talker.device)
        codes = self.codec_encoder.encode(audio)
        ids = ref_text_ids(self.tokenizer.text_ids(ref.text), self.tokenizer.chat)
        return EncodedReference(embedding, ids, codes)


def _with_overrides(base: TalkerSampling, **values: float | None) -> TalkerSampling:
    """``base`` with each given setting applied to the talker and the code predictor alike."""
    overrides = {}
    for name, value in values.items():
        if value is not None:
            overrides[name] = overrides[f"subtalker_{name}"] = value
    return dataclasses.replace(base, **overrides)


def _stretch(tempo: TimeStretch, wav: np.ndarray, final: bool) -> np.ndarray:
    """The job's new PCM through its stretcher, with the stretcher's rest at the end."""
    out = tempo.push(wav)
    return np.concatenate([out, tempo.flush()]) if final else out


def _is_random_weights(model_dir: Path) -> bool:
    try:
        return bool(json.loads((model_dir / "config.json").read_text()).get(RANDOM_WEIGHTS_KEY))
    except (OSError, ValueError):
        return False
