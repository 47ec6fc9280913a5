"""The Helios chunk loop, one chunk per call, over a loaded `HeliosPipeline`'s components.

`HeliosPipeline.__call__` (text-to-video, `keep_first_frame=True`, the defaults) returns
only when every chunk is decoded and keeps its per-call state on the pipeline. This
module runs the same math in the same order, so the frames are bitwise those of a plain
call with the same seed (tested), but split at chunk boundaries and with every piece of
per-request state on a `HeliosRender`, so several requests interleave on one pipeline:

- once per request: the prompt embeddings (through the `PromptCache`), a generator
  seeded with the request's seed, a copy of the scheduler (its step counter and solver
  history are per denoising loop), zero history latents, the position indices;
- per chunk: the history window (long 16 / mid 2 / short 1 latent frames, plus the first
  chunk's first latent frame as prefix), fresh noise from the request's generator, the
  scheduler's steps (with classifier-free guidance above 1.0: a second, unconditional
  transformer call), then the VAE decode of the chunk's 9 latent frames to 33 frames.

Steering (`HeliosRender.steer`, the engine's `SteerVideo`): the next chunk to start swaps
the request's prompt and its embeddings (through the cache) and keeps everything else, the
history window and the first chunk's latent prefix included, so the picture morphs into
the new prompt rather than restarting. The steps a request runs when it names none are the
driver's per-path defaults (`request_steps`: real-time or not; per pyramid stage on the
pyramid driver, the recommended steps here, which has no stages).

The random draws happen in the pipeline's order (the noise of chunk k, then chunk k's
scheduler steps), which is what makes the seed reproduce a plain call. The history is
kept to the window the next chunk reads, so a long video holds bounded state.
"""

from __future__ import annotations

import contextlib
import copy
import random
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import torch
from diffusers import HeliosPipeline
from diffusers.pipelines.helios.pipeline_helios import calculate_shift
from diffusers.utils.torch_utils import randn_tensor

from voxline.engines.protocol import CreateVideo
from voxline.kernels.cuda_graphs import VIDEO_DECODE_PRIORITY, VIDEO_DENOISE_PRIORITY

from .chunks import LATENT_FRAMES_PER_CHUNK, VideoSpec, chunk_frame_counts, validate_spec
from .prompt_cache import PromptCache, PromptKey
from .step_cache import CacheBackend, CacheChoice, ResidualRecorder, StepCaches, parse_choice

NO_PYRAMID = ("the checkpoint runs Helios' standard sampler, which has no pyramid stages "
              "(helios-pyramid:DIR runs it through the pyramid sampler)")
HISTORY_SIZES = (16, 2, 1)  # long, mid, 1x: latent frames of history each chunk reads
FBC_UNDER_COMPILE = ("first_block_cache does not run with video_compile (its hooks make "
                     "torch.compile recompile the blocks: on an H200 a chunk took twice as "
                     "long as eager); use none or mag_cache, or turn video_compile off")


class HeliosRender:
    """One request's state between chunks; advanced only by `HeliosChunkDriver`."""

    def __init__(self, driver: HeliosChunkDriver, spec: VideoSpec, seed: int) -> None:
        self.spec = spec
        self.seed = seed
        self.frame_counts = chunk_frame_counts(spec.num_frames)
        self.cache = parse_choice(spec.cache_backend, spec.cache_threshold,
                                  driver.step_caches.default)
        self.chunks_done = 0
        self._driver = driver
        self.generator = torch.Generator(device=driver.device).manual_seed(seed)
        self.scheduler = copy.deepcopy(driver.pipe.scheduler)
        self.embeds: tuple[torch.Tensor, torch.Tensor | None] | None = None
        # (prompt, negative prompt) the next chunk should show: set by `steer` on the loop
        # thread, read once per chunk by the worker (one reference swap, so never torn)
        self.steering: tuple[str, str] | None = None
        self.history: torch.Tensor | None = None  # the last sum(HISTORY_SIZES) latent frames
        self.first_latent: torch.Tensor | None = None  # the prefix every later chunk sees

    @property
    def total_chunks(self) -> int:
        return len(self.frame_counts)

    @property
    def finished(self) -> bool:
        return self.chunks_done >= self.total_chunks

    def steer(self, prompt: str, negative_prompt: str | None = None) -> None:
        """Make the chunks not yet started show `prompt` over the history made so far."""
        if not prompt.strip():
            raise ValueError("SteerVideo.prompt: must not be empty")
        current = self.steering or (self.spec.prompt, self.spec.negative_prompt)
        self.steering = (prompt, current[1] if negative_prompt is None else negative_prompt)

    def next_chunk(self) -> np.ndarray:
        """The next chunk's frames, uint8 (frames, height, width, 3), denoised and decoded
        on the calling thread's stream. An out-of-memory frees the allocator's cached
        blocks before it propagates (the stage fails this request only), so the next
        request starts from the memory the model holds."""
        with _freeing_on_oom():
            return to_uint8(self._driver.render_chunk(self))

    def denoise_next(self) -> ChunkDecode:
        """Denoise the next chunk on the driver's denoise stream and count it made (its
        latents join the history, so the chunk after it may start at once); its frames
        come from the returned `ChunkDecode`, on the decode stream, a piece at a time."""
        driver = self._driver
        with _freeing_on_oom(), torch.no_grad(), driver.streams.denoising():
            driver.start_chunk(self)
            latents = driver.denoise_chunk(self)
            keep = self.frame_counts[self.chunks_done]
            current = driver._append_history(self, latents)
            self.chunks_done += 1
            ready = driver.streams.ready(current)
        return ChunkDecode(driver, current, keep, ready)


class VideoStreams:
    """The CUDA streams a chunk runs on: the denoise on one, the VAE decode on another (its
    own thread), so chunk n's decode overlaps chunk n+1's denoise. Both are below every
    voice stage's priority (the voice's first words and speech are never queued behind
    video), and the decode is above the denoise (`VIDEO_DECODE_PRIORITY`): its frames are
    due at the player, the next chunk is made ahead (at one priority, an H100's decode took
    140 ms a piece beside the denoise against 70 ms alone, and held the video back).
    Off CUDA there are no streams and each call runs on the calling thread as is.

    The denoise thread records an event after the VAE's input is made, and waits for the
    chunk's denoise before handing it over; the decode stream waits for that event. Every
    piece ends in a copy to the host, so no decode work is in flight once a piece is out,
    and the VAE input is marked used on the decode stream before the allocator may reuse it."""

    def __init__(self, device: torch.device,
                 decode_priority: int = VIDEO_DECODE_PRIORITY) -> None:
        on_cuda = torch.device(device).type == "cuda"
        self.denoise = (torch.cuda.Stream(device, priority=VIDEO_DENOISE_PRIORITY)
                        if on_cuda else None)
        self.decode = (torch.cuda.Stream(device, priority=decode_priority)
                       if on_cuda else None)

    @contextlib.contextmanager
    def denoising(self) -> Iterator[None]:
        if self.denoise is None:
            yield
            return
        self.denoise.wait_stream(torch.cuda.default_stream(self.denoise.device))
        with torch.cuda.stream(self.denoise):
            yield

    def ready(self, current: torch.Tensor) -> torch.cuda.Event | None:
        """An event after `current` is made (denoise stream), once its work is done."""
        if self.denoise is None or self.decode is None:
            return None
        event = torch.cuda.Event()
        event.record(self.denoise)
        current.record_stream(self.decode)
        event.synchronize()  # the stage's execute time is the denoise's
        return event

    @contextlib.contextmanager
    def decoding(self, ready: torch.cuda.Event | None) -> Iterator[None]:
        if self.decode is None:
            yield
            return
        with torch.cuda.stream(self.decode):
            if ready is not None:
                self.decode.wait_event(ready)
            yield


class ChunkDecode:
    """One denoised chunk's frames, decoded a piece (a latent frame) per `next_piece` on the
    driver's decode stream. The VAE keeps one decode's causal cache: take one chunk's pieces
    to the end (or `close` it) before another's."""

    def __init__(self, driver: HeliosChunkDriver, current: torch.Tensor, keep: int,
                 ready: torch.cuda.Event | None) -> None:
        self._driver = driver
        self._ready = ready
        self._pieces = driver._frames(current, keep)
        self.done = False

    def next_piece(self) -> tuple[np.ndarray, bool]:
        """The next piece as uint8 (frames, height, width, 3), and whether it is the last."""
        with _freeing_on_oom(), torch.no_grad(), self._driver.streams.decoding(self._ready):
            self._ready = None
            frames, last = next(self._pieces)
        self.done = last
        if last:
            self._pieces.close()
        return to_uint8(frames), last

    def close(self) -> None:
        """Drop the rest (a cancelled video); clears the VAE's cache if it was mid-chunk."""
        self.done = True
        self._pieces.close()


class HeliosChunkDriver:
    """The chunk loop over `pipe`'s components; `begin` one `HeliosRender` per request."""

    def __init__(self, pipe: HeliosPipeline, prompt_cache: PromptCache | None = None,
                 max_sequence_length: int = 512, step_caches: StepCaches | None = None,
                 compile: bool = False, realtime_steps_per_stage: int = 1,
                 steps_per_stage: int | None = None,
                 realtime_amplify_first_chunk: bool = False) -> None:
        self.pipe = pipe
        # the per-path defaults a pyramid checkpoint runs (`CreateVideo.steps_per_stage`)
        self.realtime_steps_per_stage = realtime_steps_per_stage
        self.realtime_amplify_first_chunk = realtime_amplify_first_chunk
        self.steps_per_stage = steps_per_stage
        self.step_caches = (step_caches if step_caches is not None
                            else StepCaches(pipe.transformer, CacheChoice()))
        self.compiled = compile
        if compile:
            if self.step_caches.default.backend == CacheBackend.FIRST_BLOCK_CACHE:
                raise ValueError(f"video_cache_backend: {FBC_UNDER_COMPILE}")
            compile_blocks(pipe.transformer)
        self._recorder: ResidualRecorder | None = None  # set while MagCache calibrates
        self.max_sequence_length = max_sequence_length  # prompt padding of `begin_video`
        self.prompt_cache = prompt_cache if prompt_cache is not None else PromptCache()
        self.device = pipe._execution_device
        vae = pipe.vae
        z_dim = vae.config.z_dim
        self.latents_mean = (torch.tensor(vae.config.latents_mean).view(1, z_dim, 1, 1, 1)
                             .to(self.device, vae.dtype))
        # the pipeline keeps 1/std and divides by it; so do we, for the same rounding
        self.latents_std = 1.0 / torch.tensor(vae.config.latents_std).view(
            1, z_dim, 1, 1, 1).to(self.device, vae.dtype)
        self.spatial = pipe.vae_scale_factor_spatial
        self.indices = _history_indices()
        self.streams = VideoStreams(self.device)
        # chunks a video may be denoised ahead of its decode (the video stage's
        # backpressure): 1 pipelines chunk n's decode beside chunk n+1's denoise, 0 runs
        # them one after the other (`video_pipelined_decode`)
        self.decode_ahead = 1

    def begin(self, spec: VideoSpec) -> HeliosRender:
        """A new request's state (no model call: the prompt is encoded with chunk 0)."""
        validate_spec(spec)
        seed = spec.seed if spec.seed is not None else random.randrange(2**63)
        render = HeliosRender(self, spec, seed)
        if self.compiled and render.cache.backend == CacheBackend.FIRST_BLOCK_CACHE:
            raise ValueError(f"CreateVideo.cache_backend: {FBC_UNDER_COMPILE}")
        return render

    @property
    def recommended(self) -> dict[str, float | int]:
        """The settings a request that names none runs: HeliosPipeline's defaults."""
        return {"num_inference_steps": 50, "guidance_scale": 5.0}

    def check_step_settings(self) -> None:
        """Refuse, naming the setting, a per-stage step setting this sampler cannot run.
        The engine sees the settings by value, so only a non-default value is refused."""
        if self.realtime_steps_per_stage != 1:
            raise ValueError(f"video_realtime_steps_per_stage={self.realtime_steps_per_stage}: "
                             f"{NO_PYRAMID}; real-time videos run its recommended steps "
                             f"({self.recommended['num_inference_steps']}) unless they name "
                             "num_inference_steps")
        if self.steps_per_stage is not None:
            raise ValueError(f"video_steps_per_stage={self.steps_per_stage}: {NO_PYRAMID}")

    def stage_steps_total(self, per_stage: int, field: str) -> int:
        """A chunk's steps over all stages for `per_stage` steps a stage (`field` names the
        request's field when refused)."""
        raise ValueError(f"{field}: {NO_PYRAMID}; use num_inference_steps")

    def request_steps(self, msg: CreateVideo) -> int:
        """The chunk's steps a request runs (see `CreateVideo`'s docstring for the order)."""
        if msg.steps_per_stage is not None:
            if msg.num_inference_steps is not None:
                raise ValueError("CreateVideo.steps_per_stage: send it or num_inference_steps, "
                                 "not both")
            if msg.steps_per_stage < 1:
                raise ValueError(f"CreateVideo.steps_per_stage: {msg.steps_per_stage} is less "
                                 "than 1")
            return self.stage_steps_total(msg.steps_per_stage, "CreateVideo.steps_per_stage")
        if msg.num_inference_steps is not None:
            return msg.num_inference_steps
        return self.default_steps(msg.realtime)

    def default_steps(self, realtime: bool) -> int:
        """The steps of a request naming none (the standard sampler: its recommended)."""
        return int(self.recommended["num_inference_steps"])

    def begin_video(self, msg: CreateVideo) -> HeliosRender:
        """`begin` for the engine's request (the video stage's model interface)."""
        recommended = self.recommended
        guidance = msg.guidance_scale
        return self.begin(VideoSpec(
            prompt=msg.prompt, width=msg.width, height=msg.height, num_frames=msg.num_frames,
            num_inference_steps=self.request_steps(msg),
            guidance_scale=(float(recommended["guidance_scale"]) if guidance is None
                            else guidance),
            negative_prompt=msg.negative_prompt, seed=msg.seed,
            max_sequence_length=self.max_sequence_length, cache_backend=msg.cache_backend,
            cache_threshold=msg.cache_threshold,
            amplify_first_chunk=not msg.realtime or self.realtime_amplify_first_chunk))

    # ------------------------------------------------------------------ the loop body

    @torch.no_grad()
    def render_chunk(self, render: HeliosRender) -> np.ndarray:
        """`render`'s next chunk as the pipeline's float frames in [0, 1], (F, H, W, 3):
        `start_chunk`, `denoise_chunk`, `finish_chunk` (a benchmark times them apart)."""
        self.start_chunk(render)
        return self.finish_chunk(render, self.denoise_chunk(render))

    def start_chunk(self, render: HeliosRender) -> None:
        """Refuse a finished render; encode the prompt before the first chunk."""
        if render.finished:
            raise RuntimeError(f"video: all {render.total_chunks} chunks are already made")
        steering = render.steering
        if steering is not None and steering != (render.spec.prompt,
                                                 render.spec.negative_prompt):
            # a new prompt from this chunk on; the history (and the first latent) stay
            render.spec = replace(render.spec, prompt=steering[0], negative_prompt=steering[1])
            render.embeds = None
        if render.embeds is None:
            render.embeds = self.encode(render.spec)
        if render.history is None:
            render.history = self._empty_history(render.spec)

    def denoise_chunk(self, render: HeliosRender) -> torch.Tensor:
        """The chunk's denoising loop (under the request's step cache); its latents."""
        return self._denoise_cached(render)

    def finish_chunk(self, render: HeliosRender, latents: torch.Tensor) -> np.ndarray:
        """Decode the chunk's latents to frames and count it made (`decode_pieces`, joined)."""
        return np.concatenate(list(self.decode_pieces(render, latents)), axis=0)

    def decode_pieces(self, render: HeliosRender, latents: torch.Tensor) -> Iterator[np.ndarray]:
        """The chunk's frames as the VAE makes them: one piece per latent frame (1 frame,
        then 4 each), so the first frame is out after one decoder call instead of nine.

        The chunk's latents join the history and the chunk counts as made at the call, so
        the next chunk's denoise may start before these frames are decoded (on another CUDA
        stream). The VAE holds one decode's causal cache: consume one chunk's pieces before
        asking for another's. The Wan VAE decodes latent frames one at a time; this makes
        the same calls in the same order as `vae.decode`, so the joined pieces are bitwise
        its frames (tested)."""
        keep = render.frame_counts[render.chunks_done]
        current = self._append_history(render, latents)
        render.chunks_done += 1
        return (frames for frames, _last in self._frames(current, keep))

    def _frames(self, current: torch.Tensor, keep: int) -> Iterator[tuple[np.ndarray, bool]]:
        """The chunk's `keep` frames a piece at a time, each with whether it is the last."""
        postprocess = self.pipe.video_processor.postprocess_video
        sent = 0
        for video in self._vae_pieces(current):
            frames = postprocess(video, output_type="np")[0][:keep - sent]
            sent += frames.shape[0]
            if frames.shape[0]:
                yield frames, sent >= keep
            if sent >= keep:
                return

    def _denoise_cached(self, render: HeliosRender) -> torch.Tensor:
        """`_denoise` under the request's step cache (or MagCache's calibration run)."""
        caches, steps = self.step_caches, render.spec.num_inference_steps
        if not caches.needs_calibration(render.cache):
            caches.prepare(render.cache, steps)
            return self._denoise(render)
        with caches.calibrating() as recorder:
            self._recorder = recorder
            try:
                latents = self._denoise(render)
            finally:
                self._recorder = None
        spec = render.spec
        caches.mag_ratios.save(recorder.ratios, {
            "num_inference_steps": steps, "width": spec.width, "height": spec.height,
            "guidance_scale": spec.guidance_scale, "chunk": render.chunks_done})
        return latents

    def encode(self, spec: VideoSpec) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Prompt (and, under guidance, negative prompt) embeddings, from the cache if there."""
        guided = spec.guidance_scale > 1.0
        dtype = self.pipe.transformer.dtype
        key = PromptKey(spec.prompt, spec.negative_prompt if guided else None,
                        spec.max_sequence_length, f"{self.device}/{dtype}")
        cached = self.prompt_cache.get(key)
        if cached is not None:
            return cached
        positive, negative = self.pipe.encode_prompt(
            prompt=spec.prompt, negative_prompt=spec.negative_prompt or None,
            do_classifier_free_guidance=guided, num_videos_per_prompt=1,
            max_sequence_length=spec.max_sequence_length, device=self.device)
        embeds = (positive.to(dtype), negative.to(dtype) if negative is not None else None)
        self.prompt_cache.put(key, embeds)
        return embeds

    def _empty_history(self, spec: VideoSpec) -> torch.Tensor:
        channels = self.pipe.transformer.config.in_channels
        return torch.zeros(1, channels, sum(HISTORY_SIZES), spec.height // self.spatial,
                           spec.width // self.spatial, device=self.device, dtype=torch.float32)

    def _history_window(self, render: HeliosRender) -> tuple[torch.Tensor, ...]:
        """(short, mid, long) history latents for the next chunk, as the pipeline splits them."""
        assert render.history is not None
        long, mid, one = render.history[:, :, -sum(HISTORY_SIZES):].split(HISTORY_SIZES, dim=2)
        prefix = render.first_latent
        if prefix is None:  # first chunk of a text-to-video request: a zero prefix
            prefix = torch.zeros((1, one.shape[1], 1, one.shape[-2], one.shape[-1]),
                                 device=self.device, dtype=one.dtype)
        return torch.cat([prefix, one], dim=2), mid, long

    def _schedule(self, render: HeliosRender) -> torch.Tensor:
        """Set the request's scheduler for one chunk's loop; returns its timesteps."""
        spec, transformer = render.spec, self.pipe.transformer
        patch = transformer.config.patch_size
        seq_len = (LATENT_FRAMES_PER_CHUNK * (spec.height // self.spatial)
                   * (spec.width // self.spatial) // (patch[0] * patch[1] * patch[2]))
        config = render.scheduler.config
        mu = calculate_shift(seq_len, config.get("base_image_seq_len", 256),
                             config.get("max_image_seq_len", 4096),
                             config.get("base_shift", 0.5), config.get("max_shift", 1.15))
        sigmas = np.linspace(0.999, 0.0, spec.num_inference_steps + 1)[:-1]
        render.scheduler.set_timesteps(spec.num_inference_steps, device=self.device,
                                       sigmas=sigmas, mu=mu)
        return render.scheduler.timesteps

    def _denoise(self, render: HeliosRender) -> torch.Tensor:
        """One chunk's denoising loop; returns its 9 float32 latent frames."""
        spec = render.spec
        dtype = self.pipe.transformer.dtype
        short, mid, long = (t.to(dtype) for t in self._history_window(render))
        channels = self.pipe.transformer.config.in_channels
        shape = (1, channels, LATENT_FRAMES_PER_CHUNK, spec.height // self.spatial,
                 spec.width // self.spatial)
        latents = randn_tensor(shape, generator=render.generator, device=self.device,
                               dtype=torch.float32)
        positive, negative = render.embeds or (None, None)
        history = {"latents_history_short": short, "latents_history_mid": mid,
                   "latents_history_long": long, **self.indices}
        for t in self._schedule(render):
            cond, uncond = self._predict(latents.to(dtype), t.expand(1), positive, negative,
                                         spec.guidance_scale > 1.0, history)
            noise = cond if uncond is None else uncond + spec.guidance_scale * (cond - uncond)
            latents = render.scheduler.step(noise, t, latents, generator=render.generator,
                                            return_dict=False)[0]
        if render.first_latent is None:
            render.first_latent = latents[:, :, 0:1, :, :]
        return latents

    def _predict(self, latents: torch.Tensor, timestep: torch.Tensor, positive: torch.Tensor,
                 negative: torch.Tensor | None, guided: bool, history: dict[str, torch.Tensor],
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The transformer's conditional prediction, and the unconditional one when `guided`
        (a second call; the caller combines them, as its pipeline does)."""
        transformer, recorder = self.pipe.transformer, self._recorder
        with transformer.cache_context("cond"):
            if recorder is not None:
                recorder.active = True  # MagCache calibrates on the conditional calls
            cond = transformer(hidden_states=latents, timestep=timestep,
                               encoder_hidden_states=positive, return_dict=False, **history)[0]
            if recorder is not None:
                recorder.active = False
        if not guided:
            return cond, None
        with transformer.cache_context("uncond"):
            uncond = transformer(hidden_states=latents, timestep=timestep,
                                 encoder_hidden_states=negative, return_dict=False, **history)[0]
        return cond, uncond

    def _append_history(self, render: HeliosRender, latents: torch.Tensor) -> torch.Tensor:
        """Append the chunk to the history (kept to the window); the VAE's input for it."""
        assert render.history is not None
        history = torch.cat([render.history, latents], dim=2)
        render.history = history[:, :, -sum(HISTORY_SIZES):]
        vae = self.pipe.vae
        current = history[:, :, -LATENT_FRAMES_PER_CHUNK:].to(vae.dtype) / self.latents_std
        return current + self.latents_mean

    def _vae_pieces(self, current: torch.Tensor) -> Iterator[torch.Tensor]:
        """`current` decoded a latent frame per piece where the VAE allows (else at once).
        no_grad around each call, not the generator: a mode set inside would leak to the
        caller between yields."""
        vae = self.pipe.vae
        if not streams_frames(vae):
            with torch.no_grad():
                video = vae.decode(current, return_dict=False)[0]
            yield video
            return
        vae.clear_cache()  # AutoencoderKLWan._decode's loop, one latent frame per yield
        try:
            with torch.no_grad():
                x = vae.post_quant_conv(current)
            for i in range(x.shape[2]):
                vae._conv_idx = [0]
                with torch.no_grad():
                    out = vae.decoder(x[:, :, i:i + 1], feat_cache=vae._feat_map,
                                      feat_idx=vae._conv_idx, first_chunk=i == 0)
                    out = torch.clamp(out, min=-1.0, max=1.0)
                yield out
        finally:
            vae.clear_cache()


@contextlib.contextmanager
def _freeing_on_oom() -> Iterator[None]:
    try:
        yield
    except torch.OutOfMemoryError:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        raise


def streams_frames(vae: torch.nn.Module) -> bool:
    """Whether `vae` can decode a latent frame at a time as `decode_pieces` drives it: a Wan
    VAE without tiling, patching or hooks (an offload hook runs only around `decode`).
    `clear_cache` makes the causal cache, so a VAE that never decoded yet streams too."""
    return (type(vae).__name__ == "AutoencoderKLWan" and not getattr(vae, "use_tiling", False)
            and getattr(vae.config, "patch_size", None) is None
            and not hasattr(vae, "_hf_hook") and callable(getattr(vae, "clear_cache", None)))


def compile_blocks(transformer: torch.nn.Module) -> None:
    """torch.compile the transformer's repeated blocks (regional: one graph serves all 40;
    each new chunk shape compiles on its first call, ~12 s on an H200, where it saved about
    a quarter of a chunk's denoise: docs/video.md, benchmarks/video/bench_gpu_video.py)."""
    import torch._dynamo

    for name in ("cache_size_limit", "recompile_limit"):  # a pyramid has 3 shapes a size
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
    transformer.compile_repeated_blocks()


def _history_indices() -> dict[str, torch.Tensor]:
    """Frame positions of the prefix, the history windows and the chunk (keep_first_frame)."""
    sizes = [1, *HISTORY_SIZES, LATENT_FRAMES_PER_CHUNK]
    prefix, long, mid, one, hidden = torch.arange(0, sum(sizes)).split(sizes, dim=0)
    return {"indices_hidden_states": hidden.unsqueeze(0),
            "indices_latents_history_short": torch.cat([prefix, one], dim=0).unsqueeze(0),
            "indices_latents_history_mid": mid.unsqueeze(0),
            "indices_latents_history_long": long.unsqueeze(0)}


def to_uint8(frames: np.ndarray) -> np.ndarray:
    """[0, 1] float frames to uint8 (rounded), the bytes a video track or MP4 carries."""
    return np.clip(np.rint(frames * 255.0), 0, 255).astype(np.uint8)
