"""Wire types between engine clients and the engine core (msgspec; audio as raw bytes).

Every input names the caller's `stream_id`; every output carries it back unchanged.
The engine gives each opened stream its own internal id as well, so after
`CloseStream` (answered by `StreamClosed`, after which nothing more of that stream
comes) the caller may open the same id again at once, even while the engine is still
finishing the old stream's in-flight work; nothing of the old stream reaches the new.
Audio into the engine is float32 mono at 16 kHz (`INPUT_RATE`); audio out is float32
mono at the TTS stage's native rate, stated on each chunk. Conversion to wire formats
happens at the edges (sessions / transports), never here.
"""

from __future__ import annotations

import enum
import json
from typing import Any

import msgspec

INPUT_RATE = 16000
# A committed utterance is at least this long (OpenAI refuses to commit less audio); one
# home for the engine's input buffer, the session actor and the transcription API.
MIN_COMMIT_MS = 100


# Kept firm: small local models ramble without a limit. One home; sessions use it too.
DEFAULT_INSTRUCTIONS = (
    "You are a helpful, concise voice assistant. Answer in one or two short sentences."
)


class TurnParams(msgspec.Struct, frozen=True):
    """Server-VAD parameters (OpenAI Realtime defaults).

    With `eagerness` set (``low``, ``medium``, ``high`` or ``auto``) the turn is detected
    semantically: how long a pause must last depends on the words said so far (a complete
    sentence ends the turn sooner, a trailing "and ..." waits longer), and
    `silence_duration_ms` is not used.
    """

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    eagerness: str | None = None


class VoiceReference(msgspec.Struct, frozen=True):
    """A voice to clone (Base checkpoints): a reference clip and, optionally, its
    transcript (with it: in-context cloning; without: x-vector only). ``audio`` is
    float32 little-endian mono at ``sample_rate``. A ``name`` also registers it in the
    speech stage under that name, so a later ``voice`` of that name speaks with it."""

    audio: bytes
    sample_rate: int
    text: str | None = None
    name: str | None = None


class ResponseConfig(msgspec.Struct, frozen=True):
    """Per-response overrides; None inherits the stream's config."""

    instructions: str | None = None
    audio: bool = True
    temperature: float | None = None
    max_output_tokens: int | None = None
    seed: int | None = None
    voice: str | None = None  # the TTS stage's preset voice, if it has several
    reference: VoiceReference | None = None  # a voice to clone (Base checkpoints)
    tools: tuple[dict[str, Any], ...] | None = None  # None: the stream's tools
    tool_choice: str | dict[str, Any] | None = None
    reasoning_effort: str | None = None  # None: the stream's
    parallel_tool_calls: bool | None = None  # None: the stream's


class Truncation(msgspec.Struct, frozen=True):
    """What the reply model reads when the conversation no longer fits its context.

    `retention_ratio` None (OpenAI's ``auto``): the newest messages that fit, chosen again
    for every response. With a ratio: when the conversation would overflow, the oldest
    messages are dropped in one cut until it uses at most `retention_ratio` of the limit,
    and the cut stays until the next overflow, so the prompt's prefix (and its KV cache)
    holds between cuts. The limit is the model's context less the reply's room, or
    `post_instructions` tokens after the instructions if that is smaller.
    """

    retention_ratio: float | None = None
    post_instructions: int | None = None


class StreamConfig(msgspec.Struct, frozen=True):
    """How a stream runs. `turn_detection=None` means the client commits audio itself."""

    instructions: str = DEFAULT_INSTRUCTIONS
    turn_detection: TurnParams | None = TurnParams()
    transcribe_partials: bool = True
    partial_interval_ms: int = 1000
    temperature: float = 0.0
    max_output_tokens: int = 256
    speed: float = 1.0
    # The response the caller will ask for when a server-VAD turn ends (what its
    # `CreateResponse` will carry), or None if it will not ask. With it, the engine may
    # start that reply speculatively during a pause and release it when the turn ends.
    auto_response: ResponseConfig | None = None
    # Function tools (OpenAI Chat Completions shape) offered to the reply model, and how it
    # may use them; only a backend that supports tools (a remote one) accepts any.
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] = "auto"
    truncation: Truncation = Truncation()
    # Input noise reduction before VAD and ASR ("near_field" / "far_field"; None: off),
    # see voxline.engines.noise_reduction.
    noise_reduction: str | None = None
    # Transcription hints for an ASR that takes them (Whisper): the language its decoder is
    # forced to, and text it is conditioned on (None: detect / none). The session refuses
    # them for an ASR that cannot (Moonshine), so a stream never carries an ignored one.
    transcription_language: str | None = None
    transcription_prompt: str | None = None
    # Transcripts carry their tokens' log-probabilities (`TranscriptPartial.logprobs`...);
    # the session refuses it for an ASR that cannot give them.
    transcription_logprobs: bool = False
    # How hard a reasoning reply model thinks ("minimal" ... "xhigh", OpenAI's names; None:
    # the model's default). Only a remote backend takes it (as `reasoning_effort`).
    reasoning_effort: str | None = None
    # Whether the reply model may make several tool calls in one turn (None: its default);
    # sent with the tools to a remote backend (as `parallel_tool_calls`).
    parallel_tool_calls: bool | None = None


# ----------------------------------------------------------------------------- inputs


class OpenStream(msgspec.Struct, tag=True, frozen=True):
    stream_id: str
    config: StreamConfig = StreamConfig()


class UpdateStream(msgspec.Struct, tag=True, frozen=True):
    stream_id: str
    config: StreamConfig


class AppendAudio(msgspec.Struct, tag=True, frozen=True):
    """float32 LE mono samples at INPUT_RATE.

    Refused whole (`StreamError` code `input_audio_buffer_full`, not fatal) when it
    would pass the engine's bound on audio waiting for VAD or, on a manual-turn
    stream, on the uncommitted buffer.
    """

    stream_id: str
    audio: bytes


class CommitAudio(msgspec.Struct, tag=True, frozen=True):
    """Close the buffered utterance (manual turns): transcribe it into a user item."""

    stream_id: str
    item_id: str


class ClearAudio(msgspec.Struct, tag=True, frozen=True):
    stream_id: str


# `AddItem.previous_item_id` that puts the message first (OpenAI's "root").
CONVERSATION_START = "root"


class ImageInput(msgspec.Struct, frozen=True, weakref=True):
    """An image of a user message: a validated data URL, its `detail` (None: the model's
    default) and `offset`, where it sits in the message's text (in characters)."""

    url: str
    detail: str | None = None
    offset: int = 0


class AddItem(msgspec.Struct, tag=True, frozen=True):
    """Insert a message into the conversation after `previous_item_id` (None = at the end,
    `CONVERSATION_START` = at the beginning).

    Besides the chat roles, `role` may be `function_call` (text: JSON with `call_id`,
    `name`, `arguments`) or `function_call_output` (text: JSON with `call_id`, `output`),
    for a backend that supports tools. `images` only for a backend that reads them."""

    stream_id: str
    item_id: str
    role: str
    text: str
    previous_item_id: str | None = None
    images: tuple[ImageInput, ...] = ()


def function_call_text(call_id: str, name: str, arguments: str) -> str:
    """A `function_call` conversation message's text (see `AddItem`)."""
    return json.dumps({"call_id": call_id, "name": name, "arguments": arguments})


def function_output_text(call_id: str, output: str) -> str:
    """A `function_call_output` conversation message's text (see `AddItem`)."""
    return json.dumps({"call_id": call_id, "output": output})


class DeleteItem(msgspec.Struct, tag=True, frozen=True):
    stream_id: str
    item_id: str


class TruncateItem(msgspec.Struct, tag=True, frozen=True):
    """Cut an assistant item to what the listener heard: its first `audio_end_ms` of audio."""

    stream_id: str
    item_id: str
    audio_end_ms: int


class CreateResponse(msgspec.Struct, tag=True, frozen=True):
    stream_id: str
    response_id: str
    item_id: str
    config: ResponseConfig = ResponseConfig()


class Speak(msgspec.Struct, tag=True, frozen=True):
    """Text-to-speech only: speak `text` as response `response_id` (no LLM, no conversation)."""

    stream_id: str
    response_id: str
    text: str
    speed: float = 1.0
    seed: int | None = None
    voice: str | None = None
    reference: VoiceReference | None = None  # a voice to clone for this text


class RegisterVoice(msgspec.Struct, tag=True, frozen=True):
    """Register the named `reference` in the speech stage, so that a later ``voice`` of
    that name speaks with it; empty ``audio`` unregisters the name. Answered by
    `VoiceRegistered`; it reaches the model ahead of any speech asked for after it. A
    speech model that cannot clone ignores it. Refused (`INVALID_VALUE`) without a name."""

    stream_id: str
    reference: VoiceReference


class CancelResponse(msgspec.Struct, tag=True, frozen=True):
    """Stop the running response (if any) within one engine step; its slot is freed."""

    stream_id: str


class PlayoutProgress(msgspec.Struct, tag=True, frozen=True):
    """The caller's listener has heard `played_ms` of response `response_id`'s audio.

    Flow control for long replies: the first report of a response (the session sends
    one as the response starts) opts it in, and from then on the engine keeps its audio
    at most its generation lead (the `generation_lead_s` setting) ahead of the latest
    `played_ms`, holding the response's LLM decoding and TTS segments while it is
    further ahead and resuming as reports arrive. A response never reported on is
    generated as fast as the engine can. A report for a response that is not running
    is ignored (it finished or was cancelled meanwhile).
    """

    stream_id: str
    response_id: str
    played_ms: float


class CloseStream(msgspec.Struct, tag=True, frozen=True):
    """End the stream: abort every request behind it and free its resources."""

    stream_id: str


class CreateVideo(msgspec.Struct, tag=True, frozen=True):
    """Generate a video for `prompt` (the `video` setting's model); answered by one
    `VideoChunk` per decoded piece of each chunk as it is made, then `VideoDone`. Refused
    (a `StreamError` naming the field, then `VideoDone` failed) for a size or frame count the model cannot
    make exactly, a `video_id` already running on the stream, or no video model loaded.
    `seed` None: a fresh random seed; the same seed gives the same frames on one build.
    `num_inference_steps` / `guidance_scale` None: the checkpoint's recommended setting.

    `steps_per_stage`: each pyramid stage's denoising steps (diffusers'
    `pyramid_num_inference_steps_list` is that many for every stage), instead of
    `num_inference_steps` (sending both is refused, and so is a checkpoint without a
    pyramid). With neither, a pyramid checkpoint runs the server's per-path setting:
    `video_realtime_steps_per_stage` when `realtime` (a video played as it is made: a
    session's, a call's track), else `video_steps_per_stage` (None: the recommended).

    Capacity: at most `video_streams` videos render at once, engine-wide. Past it a
    request is refused with `server_busy` (`StreamError`, then `VideoDone` failed), or,
    with `wait_for_slot`, waits first in first out until one ends (no `VideoChunk`
    before it starts: `/v1/videos` shows it `queued`)."""

    stream_id: str
    video_id: str
    prompt: str
    width: int = 640
    height: int = 384
    num_frames: int = 33
    # None: the model's own setting (`recommended`: Helios 50 steps at guidance 5.0, a
    # distilled pyramid checkpoint 2 steps a stage at 1.0)
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    negative_prompt: str = ""
    seed: int | None = None
    cache_backend: str = ""  # step cache: "" the server's video_cache_backend, or by name
    cache_threshold: float | None = None  # the step cache's threshold; None: its default
    steps_per_stage: int | None = None
    realtime: bool = False
    wait_for_slot: bool = False


class SteerVideo(msgspec.Struct, tag=True, frozen=True):
    """Change what video `video_id` shows from its next chunk on: the chunks after it are
    made for `prompt` (and `negative_prompt`, None: unchanged) over the history made so
    far, so the picture morphs instead of restarting; the chunk count, size and seed stay.
    A chunk already being made keeps the prompt it started with. Refused (`StreamError`
    naming the field; the video goes on) for an empty prompt or a video not in progress."""

    stream_id: str
    video_id: str
    prompt: str
    negative_prompt: str | None = None


class CancelVideo(msgspec.Struct, tag=True, frozen=True):
    """Stop video `video_id` at its next chunk boundary (`VideoDone` cancelled)."""

    stream_id: str
    video_id: str


EngineInput = (
    OpenStream
    | UpdateStream
    | AppendAudio
    | CommitAudio
    | ClearAudio
    | AddItem
    | DeleteItem
    | TruncateItem
    | CreateResponse
    | Speak
    | RegisterVoice
    | CancelResponse
    | PlayoutProgress
    | CloseStream
    | CreateVideo
    | SteerVideo
    | CancelVideo
)

# ---------------------------------------------------------------------------- outputs


class VoiceStarted(msgspec.Struct, tag=True, frozen=True):
    stream_id: str
    audio_start_ms: int
    item_id: str


class VoiceStopped(msgspec.Struct, tag=True, frozen=True):
    stream_id: str
    audio_end_ms: int
    item_id: str


class TokenLogprob(msgspec.Struct, array_like=True, frozen=True):
    """One transcript token: its text, natural-log probability and raw UTF-8 bytes."""

    token: str
    logprob: float
    utf8: bytes  # the token's raw bytes (OpenAI's `bytes`)


class TranscriptPartial(msgspec.Struct, tag=True, frozen=True):
    """`logprobs`: the hypothesis's tokens, when the stream asked for them (else None)."""

    stream_id: str
    item_id: str
    text: str
    logprobs: list[TokenLogprob] | None = None


class TranscriptFinal(msgspec.Struct, tag=True, frozen=True):
    """The utterance's transcript; the item is now in the conversation (unless empty).
    `logprobs`: its tokens, when the stream asked for them (else None)."""

    stream_id: str
    item_id: str
    text: str
    asr_ms: float = 0.0  # time the ASR model spent on this utterance
    logprobs: list[TokenLogprob] | None = None


class ReplyTextDelta(msgspec.Struct, tag=True, frozen=True):
    stream_id: str
    response_id: str
    text: str


class FunctionCallDelta(msgspec.Struct, tag=True, frozen=True):
    """More of a function call's arguments (JSON text) as the model writes them.

    `item_id` is the call's conversation item (the engine derives it from the response's
    `item_id`); `index` orders the response's calls."""

    stream_id: str
    response_id: str
    item_id: str
    index: int
    call_id: str
    name: str
    delta: str


class FunctionCallDone(msgspec.Struct, tag=True, frozen=True):
    """A function call is complete (sent before the response's `ResponseFinished`); when the
    response completed, the call is in the conversation as a `function_call` item."""

    stream_id: str
    response_id: str
    item_id: str
    index: int
    call_id: str
    name: str
    arguments: str
    completed: bool  # False: the response was cut off (cancelled, failed) mid-call


class AudioChunk(msgspec.Struct, tag=True, frozen=True):
    """float32 LE mono at `sample_rate`; `text` is the span of the reply this audio speaks."""

    stream_id: str
    response_id: str
    audio: bytes
    sample_rate: int
    duration_ms: float
    text: str


class ResponseStatus(enum.IntEnum):
    IN_PROGRESS = 0
    COMPLETED = 1
    CANCELLED = 2
    INCOMPLETE = 3  # stopped by max_output_tokens
    FAILED = 4


class ResponseFinished(msgspec.Struct, tag=True, frozen=True):
    stream_id: str
    response_id: str
    status: ResponseStatus
    text: str
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    llm_ms: float = 0.0  # wall time of the batched LLM steps this response took part in
    tts_ms: float = 0.0  # time the TTS model spent on this response
    first_token_ms: float | None = None  # remote backend: request sent -> first streamed token


class VideoChunk(msgspec.Struct, tag=True, frozen=True):
    """Piece `piece` of chunk `index` of `total_chunks` of a video, sent as soon as it is
    decoded: `num_frames` frames of uint8 RGB, (num_frames, height, width, 3) row-major in
    `frames`; `chunk_done` on the chunk's last piece (progress counts chunks), `final` on
    the video's last piece."""

    stream_id: str
    video_id: str
    frames: bytes
    num_frames: int
    height: int
    width: int
    index: int
    total_chunks: int
    final: bool
    piece: int = 0
    chunk_done: bool = True


class VideoDone(msgspec.Struct, tag=True, frozen=True):
    """A video ended: completed (every chunk sent), cancelled, or failed with `error`."""

    stream_id: str
    video_id: str
    status: ResponseStatus
    error: str = ""


class TruncationApplied(msgspec.Struct, tag=True, frozen=True):
    stream_id: str
    item_id: str
    audio_end_ms: int
    text: str


class SpeculationOutcome(enum.StrEnum):
    STARTED = "started"
    COMMITTED = "committed"  # the turn ended and the caller asked for that reply
    DISCARDED = "discarded"  # the user went on speaking, or the caller asked for another


class Speculation(msgspec.Struct, tag=True, frozen=True):
    """A speculative turn (a reply started during a pause) started, was committed or was
    discarded. For metrics only: nothing of a discarded speculation was ever sent."""

    stream_id: str
    outcome: SpeculationOutcome


class VoiceRegistered(msgspec.Struct, tag=True, frozen=True):
    """The voice `name` of a `RegisterVoice` is registered (or unregistered)."""

    stream_id: str
    name: str


class ErrorCode(enum.StrEnum):
    """Why a request failed (`StreamError.code`); the wire carries the value.

    `server_side`: the engine failed or is at its limits (try again later); every other
    code says what was wrong with the request.
    """

    ENGINE_ERROR = "engine_error"  # an input failed unexpectedly
    VAD_ERROR = "vad_error"
    ASR_ERROR = "asr_error"
    LLM_BACKEND_ERROR = "llm_backend_error"
    TTS_ERROR = "tts_error"
    SERVER_BUSY = "server_busy"  # `max_responses` (or `video_streams` videos) in progress
    CAPACITY = "capacity"  # no free stream or KV slot
    ENGINE_DEAD = "engine_dead"  # (fatal, from the client) the engine process died
    ENGINE_CLOSED = "engine_closed"  # (fatal, from the client) the client was closed
    OUTPUT_OVERFLOW = "output_overflow"  # (fatal, from the client) the consumer fell behind
    UNKNOWN_STREAM = "unknown_stream"
    STREAM_EXISTS = "stream_exists"
    INPUT_AUDIO_BUFFER_FULL = "input_audio_buffer_full"
    INPUT_AUDIO_BUFFER_COMMIT_EMPTY = "input_audio_buffer_commit_empty"
    CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE = "conversation_already_has_active_response"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    INVALID_VALUE = "invalid_value"

    @property
    def server_side(self) -> bool:
        return self in _SERVER_SIDE


_SERVER_SIDE = frozenset({
    ErrorCode.ENGINE_ERROR, ErrorCode.VAD_ERROR, ErrorCode.ASR_ERROR,
    ErrorCode.LLM_BACKEND_ERROR, ErrorCode.TTS_ERROR, ErrorCode.SERVER_BUSY,
    ErrorCode.CAPACITY, ErrorCode.ENGINE_DEAD, ErrorCode.ENGINE_CLOSED,
})


class StreamError(msgspec.Struct, tag=True, frozen=True):
    """A request failed; the stream stays usable unless `fatal`."""

    stream_id: str
    message: str
    code: ErrorCode = ErrorCode.ENGINE_ERROR
    fatal: bool = False
    param: str | None = None  # the client field at fault, e.g. "session.instructions"


class StreamClosed(msgspec.Struct, tag=True, frozen=True):
    stream_id: str


EngineOutput = (
    VoiceStarted
    | VoiceStopped
    | TranscriptPartial
    | TranscriptFinal
    | ReplyTextDelta
    | FunctionCallDelta
    | FunctionCallDone
    | AudioChunk
    | ResponseFinished
    | TruncationApplied
    | Speculation
    | VoiceRegistered
    | StreamError
    | StreamClosed
    | VideoChunk
    | VideoDone
)


class EngineReady(msgspec.Struct, tag=True, frozen=True):
    """Sent once by the engine process when its models are loaded."""

    load_seconds: float
    pid: int


class EngineFailed(msgspec.Struct, tag=True, frozen=True):
    """Sent by the engine process before it exits on an unrecoverable error."""

    message: str


ProcessMessage = EngineOutput | EngineReady | EngineFailed

_encoder = msgspec.msgpack.Encoder()
_input_decoder = msgspec.msgpack.Decoder(EngineInput)
_output_decoder = msgspec.msgpack.Decoder(ProcessMessage)


def encode(msg: msgspec.Struct) -> bytes:
    return _encoder.encode(msg)


def decode_input(data: bytes) -> EngineInput:
    return _input_decoder.decode(data)


def decode_output(data: bytes) -> EngineOutput | EngineReady | EngineFailed:
    return _output_decoder.decode(data)
