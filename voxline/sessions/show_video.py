"""The reply model's ``show_video`` tool: a server-side tool that puts a generated video on
the call while the model talks. Sans I/O, like the actor it serves.

Offered when the reply model calls tools (a remote OpenAI-compatible backend) and the
server has a video model (the actor's ``show_video_tool``), as one more function tool of
the engine's (`TOOL`): ``prompt`` (what to show), and optionally ``width`` and ``height``
(pixels, rounded to the model's multiple of 16 within 16..1280) and ``seconds`` (up to 20,
rounded up to a length the model makes exactly). The other video fields take
``response.video``'s defaults. It is left out, and the name is the other tool's, when a
client function tool or an MCP tool is already called ``show_video``.

The client runs nothing and sees no ``function_call`` item for it. When the model's call is
complete, the session starts the video through the same path as ``response.video``
(`VideoResponses.show`: ``response.output_video.started`` / ``.chunk`` / ``.done``, the
call's video track, the WebSocket's MP4) and answers the model at once with the call's
function result, ``{"status": "rendering", "video_id": ..., "width": ..., "height": ...,
"seconds": ...}`` (``{"status": "error", "error": ...}`` for arguments it cannot use, and
then no video), then asks for a follow-up response (once the calling one has ended), so the
model keeps talking while the frames are made.

Called again while a video is in progress (this tool's or a ``response.video``), it steers
that video instead of starting another (`VideoResponses.steer`): from the next chunk the
video shows the new prompt over what it showed so far (the picture morphs, its size and
length stay), ``response.output_video.updated`` goes out, and the model is answered
``{"status": "steered", "video_id": ..., ...}``.

The video does not hold the response that called the tool: that response ends as usual and
the video runs on until it completes, or ``response.cancel`` or barge-in stops it (also
after the follow-up has ended). Its events carry the calling
response's id. A call in a response that was cancelled before the call was complete starts
nothing: the model is told so, and no follow-up is made.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from voxline.engines import protocol as ep
from voxline.engines.video_frames import MAX_CHUNKS, output_frames
from voxline.sessions.actor_view import ActorView
from voxline.sessions.commands import VideoParams
from voxline.sessions.mcp import McpTools
from voxline.sessions.records import ActiveResponse
from voxline.sessions.video_responses import VideoResponses

TOOL_NAME = "show_video"
SIZE_MULTIPLE = 16  # Helios: VAE 8x and 2x2 patches (the engine refuses other sizes)
MAX_SIDE = 1280
MAX_SECONDS = 20.0
MAX_PROMPT = 4096  # as response.video's prompt
DEFAULTS = VideoParams(prompt="")  # the sizes and steps a tool video gets unless told
DEFAULT_SECONDS = 4.0

TOOL: dict[str, Any] = {
    "type": "function",
    "name": TOOL_NAME,
    "description": (
        "Show the user a short generated video on the call's video track while you keep "
        "talking. Call it when the user asks to see something, with a vivid description of "
        "the scene. The video starts rendering at once; the result says so, and you can go "
        "on speaking."),
    "parameters": {
        "type": "object",
        "properties": {
            "prompt": {"type": "string", "description": "what the video shows"},
            "width": {"type": "integer", "minimum": SIZE_MULTIPLE, "maximum": MAX_SIDE,
                      "description": f"pixels (default {DEFAULTS.width})"},
            "height": {"type": "integer", "minimum": SIZE_MULTIPLE, "maximum": MAX_SIDE,
                       "description": f"pixels (default {DEFAULTS.height})"},
            "seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_SECONDS,
                        "description": f"length (default {DEFAULT_SECONDS:g})"},
        },
        "required": ["prompt"],
        "additionalProperties": False,
    },
}


class ToolArgumentError(ValueError):
    """The model's arguments cannot make a video; the message names the field."""


def video_params(arguments: str) -> VideoParams:
    """The video a ``show_video`` call's JSON `arguments` ask for (see the module doc)."""
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        raise ToolArgumentError(f"show_video: the arguments are not JSON ({exc})") from None
    if not isinstance(args, dict):
        raise ToolArgumentError("show_video: the arguments must be a JSON object")
    unknown = sorted(set(args) - set(TOOL["parameters"]["properties"]))
    if unknown:
        raise ToolArgumentError(f"show_video: unknown argument {unknown[0]!r} (it takes "
                                "prompt, width, height, seconds)")
    prompt = args.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ToolArgumentError("show_video: 'prompt' must be a non-empty string")
    if len(prompt) > MAX_PROMPT:
        raise ToolArgumentError(f"show_video: 'prompt' is {len(prompt)} characters, more than "
                                f"the {MAX_PROMPT} allowed")
    fps = DEFAULTS.fps
    seconds = _number(args, "seconds", DEFAULT_SECONDS, 0.0, MAX_SECONDS)
    return VideoParams(prompt=prompt.strip(), width=_side(args, "width", DEFAULTS.width),
                       height=_side(args, "height", DEFAULTS.height), fps=fps,
                       num_frames=_makeable_frames(round(seconds * fps) + 1))


def _number(args: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolArgumentError(f"show_video: {name!r} must be a number, got {value!r}")
    if not low < value <= high:
        raise ToolArgumentError(f"show_video: {name!r} must be more than {low:g} and at most "
                                f"{high:g}, got {value:g}")
    return float(value)


def _side(args: dict[str, Any], name: str, default: int) -> int:
    value = _number(args, name, default, 0, MAX_SIDE)
    return max(SIZE_MULTIPLE, round(value / SIZE_MULTIPLE) * SIZE_MULTIPLE)


def _makeable_frames(frames: int) -> int:
    """The least frame count at or above `frames` that the model makes exactly."""
    return next((n for n in map(output_frames, range(1, MAX_CHUNKS + 1)) if n >= frames),
                output_frames(MAX_CHUNKS))


class ShowVideoHost(ActorView, Protocol):
    """What of the actor this needs: its public face and its video and MCP halves."""

    video: VideoResponses
    mcp: McpTools


@dataclass
class ShowVideoTool:
    """A session's ``show_video`` side; the actor delegates to it (see the module doc)."""

    actor: ShowVideoHost
    enabled: bool = False
    follow_up_of: ActiveResponse | None = None  # the response whose call wants an answer

    def _available(self) -> bool:
        if not self.enabled:
            return False
        taken = {t.get("name") for t in self.actor.settings.tools if t.get("type") != "mcp"}
        taken.update(t["name"] for t in self.actor.mcp.function_tools())
        return TOOL_NAME not in taken

    def function_tools(self) -> tuple[dict[str, Any], ...]:
        """The tool for the engine's tool list, or nothing (see the module doc)."""
        return (TOOL,) if self._available() else ()

    def owns(self, name: str) -> bool:
        """Whether a call the model made of `name` is this tool's."""
        return name == TOOL_NAME and self._available()

    def on_call(self, r: ActiveResponse | None,
                out: ep.FunctionCallDelta | ep.FunctionCallDone) -> None:
        """The model's call `out`, in response `r` (None: not the active one)."""
        if not isinstance(out, ep.FunctionCallDone) or not out.completed:
            return  # arguments are used whole; a cut-off call is not in the model's context
        if r is None or r.cancel_reason is not None:
            self._answer(out, {"status": "cancelled", "error": "the user interrupted the "
                               "reply before the video started; nothing is shown"})
            return
        try:
            params = video_params(out.arguments)
        except ToolArgumentError as exc:
            self._answer(out, {"status": "error", "error": str(exc)})
        else:
            steered = self.actor.video.steer(params.prompt)
            if steered is not None:  # a video is on: it morphs to the new prompt
                shown = steered.params
                self._answer(out, {"status": "steered", "video_id": steered.video_id,
                                   "width": shown.width, "height": shown.height,
                                   "seconds": round((shown.num_frames - 1) / shown.fps, 2),
                                   "note": "the video on screen changes to the new prompt "
                                           "from its next chunk; its size and length stay"})
            else:
                video_id = self.actor.video.show(r.response.id, params)
                self._answer(out, {"status": "rendering", "video_id": video_id,
                                   "width": params.width, "height": params.height,
                                   "seconds": round((params.num_frames - 1) / params.fps, 2)})
        self.follow_up_of = r

    def _answer(self, out: ep.FunctionCallDone, result: dict[str, Any]) -> None:
        a = self.actor
        a.commands.append(ep.AddItem(a.stream_id, f"{out.item_id}_output",
                                     "function_call_output",
                                     ep.function_output_text(out.call_id, json.dumps(result)),
                                     None))

    def take_follow_up(self) -> bool:
        """Whether a response should now answer the tool's result: once, when the calling
        response has ended, unless it was cancelled (barge-in: the user speaks instead)."""
        r = self.follow_up_of
        if r is None or self.actor.response is not None:
            return False
        self.follow_up_of = None
        return r.cancel_reason is None
