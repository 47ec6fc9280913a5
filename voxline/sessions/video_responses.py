"""A response's video: the voxline Realtime extension, sans I/O like the actor it serves.

A ``response.create`` with "video" in ``output_modalities`` and a ``response.video``
object (`commands.VideoParams`) makes its response show a generated video beside the
reply: the session sends the engine `CreateVideo` (the video's id is fresh, ``video_...``)
and reports it to the client as ``response.output_video.started``, one
``response.output_video.chunk`` per chunk as the engine makes it, and
``response.output_video.done``. The frames come before their chunk's event, a decoded
piece at a time, in `events.VideoFrames` (never rendered on the wire: the transport plays
them on a video track or records them).

Lifecycle rules: the response stays in progress until its video ended (`holds`), so
``response.done`` ends both. ``response.cancel`` and barge-in (the actor's `_cancel`) send
`CancelVideo`: the engine stops at the next chunk boundary and nothing more of the video is
sent; the done event (``cancelled``) goes out at once, so a transport stops playing it
then. Each response has at most one video and a new video replaces the last one (the old
one ends ``cancelled``). Without a video model the engine refuses `CreateVideo` with an
error naming the `video` setting; the response then ends as its reply does and the
session lives on.

Steering: ``response.video.update`` (`commands.ResponseVideoUpdate`: ``response_id`` and
``video.prompt``) changes what the response's video in progress shows from its next chunk
on (`SteerVideo`): the engine keeps the video's history, so the picture morphs rather than
restarts, and its chunks keep coming. It is answered with
``response.output_video.updated``. An update naming no response with a video in progress
(unknown, or its video already ended) or with an empty prompt is refused with an error
naming the field; nothing else changes. The ``show_video`` tool called while a video is in
progress steers that video the same way.

The reply model's ``show_video`` tool (`sessions.show_video`) starts its video through
`show`: the same events, but the video does not hold its response (the model keeps talking
in a follow-up response while the frames are made), so it may outlive the response that
called the tool; a cancel or barge-in still stops it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from voxline.engines import protocol as ep
from voxline.errors import ProtocolError
from voxline.sessions import events as ev
from voxline.sessions.commands import ResponseOverrides, ResponseVideoUpdate, VideoParams
from voxline.sessions.ids import new_id

if TYPE_CHECKING:
    from voxline.sessions.records import ActiveResponse

_STATUS = {ep.ResponseStatus.COMPLETED: "completed", ep.ResponseStatus.CANCELLED: "cancelled"}
ENDED_KEPT = 64  # responses whose video ended, remembered to say so to a late update


def check_video_overrides(overrides: ResponseOverrides) -> None:
    """Refuse a response.create whose video modality and ``response.video`` disagree."""
    if not overrides.video_modality and overrides.video is None:
        return
    if overrides.video is None:
        raise ProtocolError("response.create: output_modalities includes 'video' but "
                            "response.video (with its prompt) is missing",
                            code="missing_required_parameter", param="response.video.prompt")
    if not overrides.video_modality:
        raise ProtocolError("response.create: response.video is set but "
                            "response.output_modalities does not include 'video'",
                            code="invalid_value", param="response.output_modalities")
    video = overrides.video
    if video.steps_per_stage is not None and video.num_inference_steps is not None:
        raise ProtocolError("response.create: response.video.steps_per_stage and "
                            "num_inference_steps both set the steps; send one",
                            code="invalid_value", param="response.video.steps_per_stage")


class VideoHost(Protocol):
    """What of the actor this needs: its engine stream and its outgoing lists."""

    stream_id: str
    commands: list[ep.EngineInput]
    events: list[ev.ServerEvent]


@dataclass
class ActiveVideo:
    response_id: str
    video_id: str
    params: VideoParams
    held: bool = True  # its response waits for it (response.video; not the show_video tool)
    chunk_frames: int = 0  # frames of the chunk being decoded, sent so far


class VideoResponses:
    """The actor's video half: at most one video in flight (a response's or the tool's)."""

    def __init__(self, actor: VideoHost) -> None:
        self._actor = actor
        self.active: ActiveVideo | None = None
        # a server names itself in the ids (video_<server_id>_...) so a balancer can route
        # /v1/videos/{id} to the server holding the MP4 (realtime/ops/owned_ids.py)
        self.id_prefix = "video"
        self._ended: OrderedDict[str, str] = OrderedDict()  # response id -> its video's status

    def start(self, response: ActiveResponse | None, overrides: ResponseOverrides | None
              ) -> None:
        """`response` just started: ask the engine for its video, if it asked for one."""
        params = overrides.video if overrides is not None else None
        if response is None or params is None:
            return
        self._begin(ActiveVideo(response.response.id, new_id(self.id_prefix), params))

    def show(self, response_id: str, params: VideoParams) -> str:
        """Start a video for the ``show_video`` tool, called in response `response_id`; it
        does not hold that response. Returns the new video's id."""
        video = ActiveVideo(response_id, new_id(self.id_prefix), params, held=False)
        self._begin(video)
        return video.video_id

    def _begin(self, video: ActiveVideo) -> None:
        self.cancel()  # a new video replaces the one in flight
        actor, params = self._actor, video.params
        self.active = video
        actor.commands.append(ep.CreateVideo(
            actor.stream_id, video.video_id, params.prompt, width=params.width,
            height=params.height, num_frames=params.num_frames,
            num_inference_steps=params.num_inference_steps,
            guidance_scale=params.guidance_scale, negative_prompt=params.negative_prompt,
            seed=params.seed, steps_per_stage=params.steps_per_stage, realtime=True))
        actor.events.append(ev.VideoStarted(
            response_id=video.response_id, video_id=video.video_id, prompt=params.prompt,
            width=params.width, height=params.height, fps=params.fps,
            num_frames=params.num_frames))

    def update(self, e: ResponseVideoUpdate, now: float = 0.0) -> None:
        """``response.video.update``: steer the video of `e.response_id` (see the module doc)."""
        video = self.active
        if video is None or video.response_id != e.response_id:
            ended = self._ended.get(e.response_id)
            why = (f"its video has ended ({ended}); ask for a new one with response.create"
                   if ended is not None else "it has no video in progress"
                   + (f" (the video in progress is response {video.response_id!r}'s)"
                      if video is not None else ""))
            raise ProtocolError(f"response.video.update: response {e.response_id!r}: {why}",
                                code="invalid_value", param="response_id")
        if not e.prompt.strip():
            raise ProtocolError("response.video.update: video.prompt must not be empty",
                                code="invalid_value", param="video.prompt")
        self.steer(e.prompt, e.negative_prompt)

    def steer(self, prompt: str, negative_prompt: str | None = None) -> ActiveVideo | None:
        """The active video shows `prompt` from its next chunk on; None if none is active."""
        video = self.active
        if video is None:
            return None
        changes = {"prompt": prompt}
        if negative_prompt is not None:
            changes["negative_prompt"] = negative_prompt
        video.params = replace(video.params, **changes)
        self._actor.commands.append(ep.SteerVideo(self._actor.stream_id, video.video_id,
                                                  prompt, negative_prompt))
        self._actor.events.append(ev.VideoUpdated(response_id=video.response_id,
                                                  video_id=video.video_id, prompt=prompt))
        return video

    def holds(self, response_id: str) -> bool:
        """True while `response_id`'s video is still being made (its response waits)."""
        video = self.active
        return video is not None and video.held and video.response_id == response_id

    def cancel(self) -> None:
        """Stop the active video at the engine's next chunk boundary; done at once."""
        video = self.active
        if video is None:
            return
        self._actor.commands.append(ep.CancelVideo(self._actor.stream_id, video.video_id))
        self._end(video, "cancelled", None)

    def cancel_lingering(self, response_id: str | None) -> bool:
        """``response.cancel`` with no response in progress: stop a ``show_video`` video that
        outlived its response (`response_id` None or that response's); False if none."""
        video = self.active
        if video is None or video.held or response_id not in (None, video.response_id):
            return False
        self.cancel()
        return True

    def on_engine(self, out: ep.VideoChunk | ep.VideoDone) -> None:
        video = self.active
        if video is None or out.video_id != video.video_id:
            return  # a cancelled video's tail
        if isinstance(out, ep.VideoChunk):
            self._actor.events.append(ev.VideoFrames(
                response_id=video.response_id, video_id=video.video_id, index=out.index,
                piece=out.piece, frames=out.num_frames, width=out.width, height=out.height,
                fps=video.params.fps, pixels=out.frames))
            video.chunk_frames += out.num_frames
            if out.chunk_done:
                self._actor.events.append(ev.VideoChunk(
                    response_id=video.response_id, video_id=video.video_id, index=out.index,
                    total=out.total_chunks, frames=video.chunk_frames))
                video.chunk_frames = 0
            return
        self._end(video, _STATUS.get(out.status, "failed"), out.error or None)

    def _end(self, video: ActiveVideo, status: str, error: str | None) -> None:
        self.active = None
        self._ended[video.response_id] = status
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)
        self._actor.events.append(ev.VideoDone(response_id=video.response_id,
                                               video_id=video.video_id, status=status,
                                               error=error))
