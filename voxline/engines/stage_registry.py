"""The registered stages: each is its module plus one `StageRegistration` row in `STAGES`.

A registration says everything the rest of the engine needs to know of a stage, in one
place: how its model loads from `Settings` in the engine process (`load`; None: the
stage is off), what it adds to the core once built (`attach`: its stage-table rows, the
engine inputs it handles, what it does when a stream closes), what its model holds on a
GPU for the API process's capacity plan (`footprint`), and its warm-up call. The core,
the factory and the sizing loop over `STAGES`; none of them names a registered stage.

The conversation pipeline (VAD, ASR, LLM, TTS) is the core itself (`Turns` and
`Responses` route between those four); the stages registered here hang off it.
Importing this module loads no model and no torch: loaders import their model modules
when called, so the API process can read the footprints.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from voxline.engines import protocol as p
from voxline.engines.capacity import Footprint
from voxline.engines.model_memory import bf16_weights_footprint, block_projection_params
from voxline.engines.stage import StageWorker, StreamId
from voxline.engines.stage_table import StageSlot

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # the stages' modules import torch (via streams): attach imports them
    from voxline.config import Settings
    from voxline.engines.end_of_turn_stage import EndOfTurnModel
    from voxline.engines.streams import StreamState
    from voxline.engines.turns import Turns
    from voxline.engines.video_stage import VideoModel

InputHandler = Callable[["StreamState", Any], None]


@dataclass(frozen=True)
class StageContext:
    """What of the core a stage may use while it attaches (loop thread only after)."""

    wake: Callable[[], None]  # the loop's wake-up, for the stage's worker thread
    emit: Callable[[p.EngineOutput], None]  # outputs to the callers
    live: Callable[[StreamId], StreamState | None]  # an open stream by internal id
    turns: Turns  # turn routing, for a stage that hears turns
    max_videos: int = 1  # videos rendered at once (`video_streams`)
    # some spoken reply is short of unplayed audio (`speech_pacing.VoiceReserve.low`)
    voice_low: Callable[[], bool] = lambda: False


def _ignore(stream: StreamState) -> None:
    return None


@dataclass
class StagePart:
    """What one registered stage adds to the core."""

    owner: Any  # the stage's loop-thread owner (e.g. `Videos`), for callers that need it
    rows: list[StageSlot[Any, Any, Any]] = field(default_factory=list)  # after the core's
    handlers: dict[type[p.EngineInput], InputHandler] = field(default_factory=dict)
    closed: Callable[[StreamState], None] = _ignore  # a stream closed: drop its work


def _no_footprint(settings: Settings, gpu_in_use: bool) -> tuple[str, Footprint] | None:
    return None


def _no_warm_up(model: Any) -> None:
    return None


@dataclass(frozen=True)
class StageRegistration:
    """One registered stage; see the module docstring."""

    name: str
    load: Callable[[Settings], Any | None]
    attach: Callable[[StageContext, Any | None], StagePart]
    # (device, footprint) its model holds on a GPU, given whether another stage uses one
    footprint: Callable[[Settings, bool], tuple[str, Footprint] | None] = _no_footprint
    warm_up: Callable[[Any], None] = _no_warm_up


# ------------------------------------------------------------------------- end of turn


def _load_smart_turn(settings: Settings) -> EndOfTurnModel:
    from voxline.engines.models.smart_turn import SmartTurn

    return SmartTurn.load(threads=1)  # semantic VAD's ear; ~9 MB in pipecat-ai's wheel


def _attach_end_of_turn(ctx: StageContext, model: EndOfTurnModel | None) -> StagePart:
    """Semantic-VAD pauses go to the model; its verdicts back to `Turns` (None: the words
    decide alone)."""
    from voxline.engines.end_of_turn_stage import EndOfTurnStage

    if model is None:
        return StagePart(owner=None)
    stage = EndOfTurnStage(model)
    ctx.turns.end_of_turn = stage
    return StagePart(owner=stage, rows=[StageSlot(
        "end_of_turn", stage, StageWorker(stage, ctx.wake, "voxline-eot"),
        route=ctx.turns.on_turn_end_heard, fail=ctx.turns.turn_end_failed)])


def _warm_up_end_of_turn(model: EndOfTurnModel) -> None:
    model.probability(np.zeros(16000, np.float32))


# ------------------------------------------------------------------------------- video


def load_video(settings: Settings) -> VideoModel | None:
    """The video model `settings.video` names (a Helios checkpoint, plain or pyramid), or
    None when unset."""
    if not settings.video:
        return None
    import torch

    from voxline.engines.models.helios import (
        driver_for,
        load_helios,
        parse_video_setting,
        set_attention_backend,
        set_video_weights,
    )
    from voxline.engines.models.helios.step_cache import step_caches_for

    sampler, model_dir = parse_video_setting(settings.video)
    cuda = torch.cuda.is_available()
    t0 = time.perf_counter()
    pipe = load_helios(model_dir, device="cuda" if cuda else "cpu",
                       dtype=torch.bfloat16 if cuda else None, sampler=sampler)
    logger.info("Helios %s loaded in %.2f s", model_dir, time.perf_counter() - t0)
    set_attention_backend(pipe.transformer, settings.video_attention)
    swapped = set_video_weights(pipe.transformer, settings.video_weights)
    if swapped:
        logger.info("video transformer: %d block projections in float8", swapped)
    caches = step_caches_for(pipe.transformer, model_dir, settings.cache,
                             settings.video_cache_backend, settings.video_cache_threshold)
    driver = driver_for(pipe, step_caches=caches, compile=settings.video_compile,
                        realtime_steps_per_stage=settings.video_realtime_steps_per_stage,
                        steps_per_stage=settings.video_steps_per_stage,
                        realtime_amplify_first_chunk=settings.video_realtime_amplify_first_chunk)
    driver.check_step_settings()
    driver.decode_ahead = decode_ahead(settings)
    return driver


def _warm_up_video(model: VideoModel) -> None:
    """On a GPU, one two-chunk real-time video at the default size through the driver's own
    streams before ready: the compile of both chunk shapes (`video_compile`: ~20 s on an
    H100), the prompt encoder, and each CUDA stream's memory pool (the caching allocator
    keeps blocks per stream: a stream's first chunk waited ~0.4 s for fresh memory), so a
    user's first video is not the one that pays. Off CUDA nothing is warmed."""
    if str(getattr(model, "device", "cpu")).split(":")[0] != "cuda":
        return
    t0 = time.perf_counter()
    render = model.begin_video(p.CreateVideo("", "warm-up", "a warm-up clip", num_frames=65,
                                             realtime=True, seed=0))
    while not render.finished:
        decode = render.denoise_next()
        while not decode.next_piece()[1]:
            pass
    logger.info("video warm-up: %d chunks at the default size in %.1f s", render.total_chunks,
                time.perf_counter() - t0)


def decode_ahead(settings: Settings) -> int:
    """1 (chunk n's decode beside chunk n+1's denoise) unless `video_pipelined_decode` is
    off or the transformer's attention is cuDNN's: diffusers' `_native_cudnn` turns
    PyTorch's SDPA kernels to cuDNN's alone process-wide while it runs, and the VAE's
    attention (head dimension 384) has no cuDNN kernel, so a decode beside it fails."""
    from voxline.config import AutoOff

    if settings.video_pipelined_decode == AutoOff.OFF:
        return 0
    if settings.video_attention == "_native_cudnn":
        logger.info("video_pipelined_decode: each chunk decodes after its denoise "
                    "(video_attention=_native_cudnn sets SDPA's kernels process-wide)")
        return 0
    return 1


def _attach_video(ctx: StageContext, model: VideoModel | None) -> StagePart:
    """Without a model `CreateVideo` is still taken, and refused naming the setting. The
    denoise starts no chunk while `ctx.voice_low()` (voice comes first)."""
    from voxline.engines.video_stage import Videos, VideoStage

    stage = VideoStage(model, voice_low=ctx.voice_low) if model is not None else None
    videos = Videos(stage, ctx.emit, ctx.live, ctx.max_videos)
    rows = [] if stage is None else [
        StageSlot("video", stage, StageWorker(stage, ctx.wake, "voxline-video"),
                  route=videos.denoised, fail=videos.fail),
        StageSlot("video_decode", stage.decoder,
                  StageWorker(stage.decoder, ctx.wake, "voxline-video-decode"),
                  route=videos.route, fail=videos.fail_decode)]
    return StagePart(owner=videos, rows=rows,
                     handlers={p.CreateVideo: videos.create, p.SteerVideo: videos.steer,
                               p.CancelVideo: lambda stream, msg: videos.cancel(stream,
                                                                                msg.video_id)},
                     closed=videos.closed)


def _video_footprint(settings: Settings, gpu_in_use: bool) -> tuple[str, Footprint] | None:
    video = settings.video_backend
    if not gpu_in_use or video is None:  # Helios loads on the default GPU if there is one
        return None
    footprint = bf16_weights_footprint(Path(video.target), "video")
    from voxline.config import VideoWeights

    if settings.video_weights == VideoWeights.FP8:  # the block linears at one byte a weight
        saved = block_projection_params(Path(video.target) / "transformer")
        footprint = replace(footprint, weights=footprint.weights - saved)
    return "cuda", footprint


STAGES: tuple[StageRegistration, ...] = (
    StageRegistration("end_of_turn", load=_load_smart_turn, attach=_attach_end_of_turn,
                      warm_up=_warm_up_end_of_turn),
    StageRegistration("video", load=load_video, attach=_attach_video,
                      warm_up=_warm_up_video, footprint=_video_footprint),
)
