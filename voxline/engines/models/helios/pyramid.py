"""The Helios pyramid sampler (Helios-Mid, Helios-Distilled), one chunk per call.

`HeliosPyramidPipeline.__call__` (text-to-video, `keep_first_frame=True`) denoises each
33-frame chunk in stages of rising resolution: the chunk's noise is bilinearly shrunk by 2
per stage below the last, each stage runs its own scheduler loop (the scheduler's
`stage_index`), and between stages the latents are upsampled (nearest) and re-noised with
block noise from the request's generator. `HeliosPyramidDriver` runs that math in that
order over the same per-request `HeliosRender` as the plain driver, so its chunks are
bitwise a plain pyramid call's with the same seed and settings (tested), and requests
interleave the same way. What it takes from the checkpoint, as the pipeline does:

- the stage count: the scheduler's `stages` (the pipeline's step list must match it);
- `is_distilled` (Helios-Distilled, `HeliosDMDScheduler`): the scheduler's step gets the
  DMD arguments (the stage's start point, sigmas and timesteps), and the first chunk runs
  twice the steps (`is_amplify_first_chunk`, on for distilled checkpoints as their model
  card runs them; a real-time video's `VideoSpec.amplify_first_chunk` is off unless
  `video_realtime_amplify_first_chunk`, so its first frame comes sooner);
- `is_cfg_zero_star` (Helios-Mid): guidance by CFG-Zero* (optimised scale, the first
  steps of stage 0 zeroed: `use_zero_init`, `zero_steps` 1, the pipeline's defaults).

A request's `num_inference_steps` is the chunk's steps over all stages, split evenly from
the first stage on (6 -> [2, 2, 2], the distilled card's; 60 -> [20, 20, 20], Mid's; 50 ->
[17, 17, 16]); fewer steps than stages is refused naming the field, and so are a width or
height not a multiple of 16 * 2^(stages - 1) (64 for 3 stages: the smallest stage must
still split into 2x2 patches, and halving must come back to the same size). `guidance_scale` is run
as asked, as the pipeline runs it (above 1.0 two transformer calls a step, also on a
distilled checkpoint, which is trained for 1.0). `mag_cache` is refused: its magnitude
ratios belong to one loop at one resolution, and each stage is its own; first_block_cache
runs per stage (its state reset at every stage, since the token count changes).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from diffusers import HeliosPyramidPipeline
from diffusers.pipelines.helios.pipeline_helios_pyramid import calculate_shift, optimized_scale
from diffusers.utils.torch_utils import randn_tensor

from .chunks import LATENT_FRAMES_PER_CHUNK, SIZE_MULTIPLE, VideoSpec
from .driver import HeliosChunkDriver, HeliosRender
from .step_cache import CacheBackend

ZERO_STEPS = 1  # CFG-Zero*: steps 0..ZERO_STEPS of stage 0 predict zero (pipeline default)


def stage_steps(total: int, stages: int) -> list[int]:
    """`total` steps split over `stages`, the earlier stages taking the remainder."""
    return [total // stages + (1 if i < total % stages else 0) for i in range(stages)]


class HeliosPyramidDriver(HeliosChunkDriver):
    """The chunk loop of `HeliosPyramidPipeline`; see the module docstring."""

    def __init__(self, pipe: HeliosPyramidPipeline, *args: object, **kwargs: object) -> None:
        super().__init__(pipe, *args, **kwargs)  # type: ignore[arg-type]
        self.stages = int(pipe.scheduler.config.get("stages", 1))
        self.distilled = bool(pipe.config.get("is_distilled", False))
        self.cfg_zero_star = bool(pipe.config.get("is_cfg_zero_star", False))
        self.amplify_first_chunk = self.distilled
        if self.step_caches.default.backend == CacheBackend.MAG_CACHE:
            raise ValueError("video_cache_backend: mag_cache does not run with the Helios "
                             "pyramid sampler (its ratios are per loop, each stage is its "
                             "own); use none or first_block_cache")

    @property
    def recommended(self) -> dict[str, float | int]:
        """The settings the checkpoint's model card runs (total steps over the stages)."""
        if self.distilled:
            return {"num_inference_steps": 2 * self.stages, "guidance_scale": 1.0}
        return {"num_inference_steps": 20 * self.stages, "guidance_scale": 5.0}

    def check_step_settings(self) -> None:
        return  # every stage runs the per-stage steps

    def stage_steps_total(self, per_stage: int, field: str) -> int:
        return per_stage * self.stages  # [per_stage] * stages, split back by `stage_steps`

    def default_steps(self, realtime: bool) -> int:
        """Real-time: `realtime_steps_per_stage` a stage (Helios' real-time setting, one a
        stage, by default); otherwise `steps_per_stage`, None: the recommended."""
        per_stage = self.realtime_steps_per_stage if realtime else self.steps_per_stage
        if per_stage is None:
            return int(self.recommended["num_inference_steps"])
        return per_stage * self.stages

    def begin(self, spec: VideoSpec) -> HeliosRender:
        if spec.num_inference_steps < self.stages:
            raise ValueError(f"CreateVideo.num_inference_steps: {spec.num_inference_steps} is "
                             f"fewer than the checkpoint's {self.stages} pyramid stages "
                             "(at least one step each)")
        multiple = SIZE_MULTIPLE * 2 ** (self.stages - 1)  # the smallest stage still patches
        for name in ("width", "height"):
            value = getattr(spec, name)
            if value % multiple:
                raise ValueError(f"CreateVideo.{name}: {value} is not a multiple of {multiple} "
                                 f"(the pyramid's {self.stages} stages halve it {self.stages - 1} "
                                 "times before the 2x2 patches)")
        render = super().begin(spec)
        if render.cache.backend == CacheBackend.MAG_CACHE:
            raise ValueError("CreateVideo.cache_backend: mag_cache does not run with the Helios "
                             "pyramid sampler (its ratios are per loop, each stage is its "
                             "own); use none or first_block_cache")
        return render

    def _denoise_cached(self, render: HeliosRender) -> torch.Tensor:
        return self._denoise(render)  # the caches are prepared per stage, in `_stage`

    def _denoise(self, render: HeliosRender) -> torch.Tensor:
        """One chunk's pyramid: shrink its noise, then each stage's loop; 9 latent frames."""
        spec, transformer = render.spec, self.pipe.transformer
        channels = transformer.config.in_channels
        shape = (1, channels, LATENT_FRAMES_PER_CHUNK, spec.height // self.spatial,
                 spec.width // self.spatial)
        latents = randn_tensor(shape, generator=render.generator, device=self.device,
                               dtype=torch.float32)
        for _ in range(self.stages - 1):
            latents = _resize(latents, 0.5, "bilinear") * 2
        start_points = [latents] if self.distilled else None
        short, mid, long = (t.to(transformer.dtype) for t in self._history_window(render))
        history = {"latents_history_short": short, "latents_history_mid": mid,
                   "latents_history_long": long, **self.indices}
        steps = stage_steps(spec.num_inference_steps, self.stages)
        amplify = (self.amplify_first_chunk and render.spec.amplify_first_chunk
                   and render.chunks_done == 0)
        for stage in range(self.stages):
            timesteps = self._schedule_stage(render, latents, stage, steps[stage], amplify)
            if stage > 0:
                latents = self._renoise(render, _resize(latents, 2.0, "nearest"), stage)
                if start_points is not None:
                    start_points.append(latents)
            self.step_caches.prepare(render.cache, len(timesteps))
            start = start_points[stage] if start_points is not None else None
            latents = self._stage(render, latents, timesteps, stage, history, start)
        if render.first_latent is None:
            render.first_latent = latents[:, :, 0:1, :, :]
        return latents

    def _schedule_stage(self, render: HeliosRender, latents: torch.Tensor, stage: int,
                        steps: int, amplify: bool) -> torch.Tensor:
        """Set the request's scheduler for `stage` at `latents`' size; its timesteps."""
        patch = self.pipe.transformer.config.patch_size
        seq_len = (latents.shape[-1] * latents.shape[-2] * latents.shape[-3]
                   // (patch[0] * patch[1] * patch[2]))
        config = render.scheduler.config
        mu = calculate_shift(seq_len, config.get("base_image_seq_len", 256),
                             config.get("max_image_seq_len", 4096),
                             config.get("base_shift", 0.5), config.get("max_shift", 1.15))
        render.scheduler.set_timesteps(steps, stage, device=self.device, mu=mu,
                                       is_amplify_first_chunk=amplify)
        return render.scheduler.timesteps

    def _renoise(self, render: HeliosRender, latents: torch.Tensor,
                 stage: int) -> torch.Tensor:
        """Mix block noise into the upsampled latents (against the upsampling's blocks)."""
        scheduler = render.scheduler
        signal = 1 - scheduler.ori_start_sigmas[stage]
        gamma = scheduler.config.gamma
        alpha = 1 / (math.sqrt(1 + (1 / gamma)) * (1 - signal) + signal)
        beta = alpha * (1 - signal) / math.sqrt(gamma)
        batch, channels, frames, height, width = latents.shape
        noise = self.pipe.sample_block_noise(batch, channels, frames, height, width,
                                             self.pipe.transformer.config.patch_size,
                                             self.device, render.generator)
        noise = noise.to(device=self.device, dtype=self.pipe.transformer.dtype)
        return alpha * latents + beta * noise

    def _stage(self, render: HeliosRender, latents: torch.Tensor, timesteps: torch.Tensor,
               stage: int, history: dict[str, torch.Tensor],
               start: torch.Tensor | None) -> torch.Tensor:
        """One stage's scheduler loop over `timesteps`."""
        spec, scheduler = render.spec, render.scheduler
        dtype = self.pipe.transformer.dtype
        positive, negative = render.embeds or (None, None)
        guided = spec.guidance_scale > 1.0
        for i, t in enumerate(timesteps):
            timestep = t.expand(latents.shape[0]).to(torch.int64)
            cond, uncond = self._predict(latents.to(dtype), timestep, positive, negative,
                                         guided, history)
            noise = self._guide(cond, uncond, spec.guidance_scale, zeroed=stage == 0
                                and i <= ZERO_STEPS)
            extra = {} if start is None else {
                "cur_sampling_step": i, "dmd_noisy_tensor": start,
                "dmd_sigmas": scheduler.sigmas, "dmd_timesteps": scheduler.timesteps,
                "all_timesteps": timesteps}
            latents = scheduler.step(noise, t, latents, generator=render.generator,
                                     return_dict=False, **extra)[0]
        return latents

    def _guide(self, cond: torch.Tensor, uncond: torch.Tensor | None, scale: float,
               zeroed: bool) -> torch.Tensor:
        """Classifier-free guidance as the checkpoint's pipeline combines it."""
        if uncond is None:
            return cond
        if not self.cfg_zero_star:
            return uncond + scale * (cond - uncond)
        if zeroed:
            return cond * 0.0
        batch = cond.shape[0]
        alpha = optimized_scale(cond.reshape(batch, -1), uncond.reshape(batch, -1))
        alpha = alpha.view(batch, *([1] * (cond.dim() - 1))).to(cond.dtype)
        return uncond * alpha + scale * (cond - uncond * alpha)


def _resize(latents: torch.Tensor, factor: float, mode: str) -> torch.Tensor:
    """Scale each latent frame's height and width by `factor` (frames folded into batch)."""
    batch, channels, frames, height, width = latents.shape
    size = (int(height * factor), int(width * factor))
    flat = latents.permute(0, 2, 1, 3, 4).reshape(batch * frames, channels, height, width)
    flat = F.interpolate(flat, size=size, mode=mode)
    return flat.reshape(batch, frames, channels, *size).permute(0, 2, 1, 3, 4)


def driver_for(pipe: object, **kwargs: object) -> HeliosChunkDriver:
    """The chunk driver for a loaded pipeline: the pyramid one for `HeliosPyramidPipeline`."""
    if isinstance(pipe, HeliosPyramidPipeline):
        return HeliosPyramidDriver(pipe, **kwargs)
    return HeliosChunkDriver(pipe, **kwargs)  # type: ignore[arg-type]
