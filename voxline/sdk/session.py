"""A voice session as a Python object: commands out, typed session events in.

:class:`Session` is the same whether the session runs in this process
(:class:`voxline.sdk.engine.Engine`) or on a voxline server (:func:`voxline.sdk.remote.connect`):
only its :class:`Transport` differs. Its methods build the neutral
:mod:`voxline.sessions.commands`; its events are the neutral :mod:`voxline.sessions.events`
the ``/v1/realtime`` WebSocket renders. Session options are validated here, by the same
validator the server applies to ``session.update``, so a bad option fails at the call
site in both modes.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import inspect
import json
import typing
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, TypeVar

from voxline.aio import cancel_and_wait
from voxline.errors import ProtocolError, VoxlineError
from voxline.realtime.openai.session_object import beta_format, validate_session
from voxline.sessions import commands as cmd
from voxline.sessions import events as ev
from voxline.sessions.items import (
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    RealtimeResponse,
)
from voxline.sessions.settings import DOCUMENT_FORMAT_NAMES, AudioFormat

E = TypeVar("E", bound=ev.ServerEvent)
UNSET: Any = object()  # "option not given" (None may mean "off")
EVENT_QUEUE_LIMIT = 4096  # events the bot has not read yet


class SessionError(VoxlineError):
    """The session refused something or ended; ``error`` is the server's error detail."""

    def __init__(self, message: str, error: ev.ErrorEvent | None = None) -> None:
        super().__init__(message)
        self.error = error


class ToolsNotAvailable(VoxlineError, NotImplementedError):
    """Function tools were passed, but the reply model cannot call functions (the embedded
    model; a remote one, ``llm="openai:<url>"``, can)."""


_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean",
                               list: "array", dict: "object"}


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """A Python function as a Realtime function tool: its name, the first paragraph of its
    docstring, and its parameters typed from their annotations (str, int, float, bool,
    list, dict; unannotated: string). Raises ProtocolError for what JSON cannot pass."""
    name = getattr(fn, "__name__", "")
    props: dict[str, Any] = {}
    required: list[str] = []
    hints = typing.get_type_hints(fn)
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ProtocolError(f"tool {name}: parameter {pname!r} must be passable by keyword",
                                code="invalid_value", param="tools")
        kind = _JSON_TYPES.get(typing.get_origin(hints.get(pname)) or hints.get(pname, str))
        if kind is None:
            raise ProtocolError(f"tool {name}: parameter {pname!r} has type "
                                f"{hints[pname]!r}; use str, int, float, bool, list or dict",
                                code="invalid_value", param="tools")
        props[pname] = {"type": kind}
        if param.default is param.empty:
            required.append(pname)
    doc = (inspect.getdoc(fn) or "").split("\n\n")[0].strip()
    tool: dict[str, Any] = {"type": "function", "name": name}
    if doc:
        tool["description"] = doc
    tool["parameters"] = {"type": "object", "properties": props, "required": required}
    return tool


async def call_tool(fn: Callable[..., Any], arguments: str) -> str:
    """Run a tool on the model's JSON arguments (a plain function on a worker thread); its
    result as the output text (JSON unless it is a string). A failure is reported to the
    model as {"error": ...} rather than raised: the conversation goes on."""
    try:
        kwargs = json.loads(arguments or "{}")
        if not isinstance(kwargs, dict):
            raise TypeError(f"arguments are {type(kwargs).__name__}, not an object")
        if inspect.iscoroutinefunction(fn):
            result = await fn(**kwargs)
        else:
            result = await asyncio.to_thread(fn, **kwargs)
    except Exception as exc:
        return json.dumps({"error": f"{type(exc).__name__}: {exc}"})
    return result if isinstance(result, str) else json.dumps(result)


class Transport(abc.ABC):
    """Where a session runs: commands go in, server events come out (then ``None``)."""

    @abc.abstractmethod
    async def open(self) -> None: ...

    @abc.abstractmethod
    async def send(self, command: cmd.ClientCommand) -> None: ...

    @abc.abstractmethod
    def events(self) -> AsyncIterator[ev.ServerEvent]: ...

    @abc.abstractmethod
    async def close(self) -> None: ...


def audio_format(value: str | AudioFormat) -> dict[str, Any]:
    """A format option as a settings-document format: ``"pcm16"`` (24 kHz),
    ``"g711_ulaw"``, ``"g711_alaw"``, a GA name (``"audio/pcmu"``) or an AudioFormat."""
    if isinstance(value, AudioFormat):
        return value.to_document()
    if value in DOCUMENT_FORMAT_NAMES.values():
        return {"type": value}
    try:
        return beta_format(value).to_document()
    except KeyError:
        raise ProtocolError(f"unknown audio format {value!r}; use pcm16, g711_ulaw, g711_alaw, "
                            "audio/pcm, audio/pcmu or audio/pcma", code="invalid_value",
                            param="format") from None


def session_patch(
    *,
    instructions: str | None = None,
    voice: str | None = None,
    input_format: str | AudioFormat | None = None,
    output_format: str | AudioFormat | None = None,
    output_modalities: Sequence[str] | None = None,
    turn_detection: Mapping[str, Any] | None = UNSET,
    transcription: Mapping[str, Any] | None = UNSET,
    temperature: float | None = None,
    max_output_tokens: int | None = None,
    tools: Sequence[Callable[..., Any]] = (),
) -> dict[str, Any]:
    """Session options as a validated settings-document patch (GA ``session`` nesting).

    ``turn_detection=None`` switches server VAD off (commit turns yourself); a mapping
    patches it (e.g. ``{"silence_duration_ms": 300}``). ``transcription={}`` turns on
    transcripts of the caller's speech. Raises ProtocolError naming the bad option.
    """
    patch: dict[str, Any] = {}
    if tools:
        patch["tools"] = [tool_schema(fn) for fn in tools]
    audio_in: dict[str, Any] = {}
    audio_out: dict[str, Any] = {}
    if instructions is not None:
        patch["instructions"] = instructions
    if output_modalities is not None:
        patch["output_modalities"] = ["audio"] if "audio" in output_modalities else ["text"]
    if temperature is not None:
        patch["temperature"] = temperature
    if max_output_tokens is not None:
        patch["max_output_tokens"] = max_output_tokens
    if input_format is not None:
        audio_in["format"] = audio_format(input_format)
    if turn_detection is not UNSET:
        td = None if turn_detection is None else {"type": "server_vad", **turn_detection}
        audio_in["turn_detection"] = td
    if transcription is not UNSET:
        audio_in["transcription"] = None if transcription is None else dict(transcription)
    if output_format is not None:
        audio_out["format"] = audio_format(output_format)
    if voice is not None:
        audio_out["voice"] = voice
    if audio_in or audio_out:
        patch["audio"] = {k: v for k, v in (("input", audio_in), ("output", audio_out)) if v}
    validate_session({"type": "realtime", **patch})
    return patch


class Session:
    """One conversation. Use as ``async with``; iterate it for events.

    Sending methods return once the command is handed to the session; what it does with
    it (and any error) arrives as events. ``async for event in session`` ends when the
    session ends. One reader: iterate from one task.
    """

    def __init__(self, transport: Transport, options: Mapping[str, Any],
                 tools: Sequence[Callable[..., Any]] = ()) -> None:
        self._transport = transport
        self._options = dict(options)
        self._tools = {fn.__name__: fn for fn in tools}
        self._events: asyncio.Queue[ev.ServerEvent | None] = asyncio.Queue(EVENT_QUEUE_LIMIT)
        self._pump: asyncio.Task[None] | None = None
        self._ended = False
        self.session_id: str | None = None

    # -- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> Session:
        await self._transport.open()
        self._pump = asyncio.create_task(self._read(), name="voxline-session-events")
        created = await self.wait_for(ev.SessionCreated)
        self.session_id = created.session_id
        if self._options:
            await self._transport.send(cmd.SessionUpdate(changes=self._options,
                                                         event_id="sdk_initial_update"))
            reply = await self.wait_for(
                lambda e: isinstance(e, ev.SessionUpdated)
                or (isinstance(e, ev.ErrorEvent) and e.error.event_id == "sdk_initial_update"))
            if isinstance(reply, ev.ErrorEvent):
                await self.aclose()
                if reply.error.param == "session.tools":
                    raise ToolsNotAvailable(reply.error.message)
                raise SessionError(f"session options refused: {reply.error.message}", reply)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """End the session (frees its engine stream)."""
        await self._transport.close()
        await cancel_and_wait(self._pump)

    async def _read(self) -> None:
        try:
            async for event in self._transport.events():
                await self._events.put(event)
                if self._tools and isinstance(event, ev.ResponseDone):
                    await self._answer_calls(event.response)
        finally:
            with contextlib.suppress(asyncio.QueueFull):
                self._events.put_nowait(None)

    async def _answer_calls(self, response: RealtimeResponse) -> None:
        """The session's tools run on the calls a completed response made; their outputs go
        back into the conversation and the model is asked to answer with them."""
        calls = [o for o in response.output if isinstance(o, FunctionCallItem)
                 and o.name in self._tools and o.status == "completed"]
        if response.status != "completed" or not calls:
            return
        for call in calls:
            output = await call_tool(self._tools[call.name], call.arguments)
            await self._transport.send(cmd.ItemCreate(item=FunctionCallOutputItem(
                call_id=call.call_id, output=output)))
        await self._transport.send(cmd.ResponseCreate())

    # -- events ------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[ev.ServerEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ev.ServerEvent]:
        while (event := await self.next_event()) is not None:
            yield event

    async def next_event(self, timeout: float | None = None) -> ev.ServerEvent | None:
        """The next event, or None once the session has ended."""
        if self._ended:
            return None
        event = await asyncio.wait_for(self._events.get(), timeout)
        if event is None:
            self._ended = True
        return event

    async def wait_for(self, what: type[E] | Callable[[ev.ServerEvent], bool],
                       timeout: float | None = None) -> Any:
        """Read events until one is of type ``what`` (or satisfies it); earlier events are
        consumed. Raises SessionError if the session ends first."""
        match: Callable[[ev.ServerEvent], bool] = (
            (lambda e: isinstance(e, what)) if isinstance(what, type) else what)

        async def scan() -> ev.ServerEvent:
            while (event := await self.next_event()) is not None:
                if match(event):
                    return event
            raise SessionError("the session ended")
        return await asyncio.wait_for(scan(), timeout)

    # -- commands ----------------------------------------------------------------------

    async def send(self, command: cmd.ClientCommand) -> None:
        """Send any neutral session command (the methods below are shorthands)."""
        await self._transport.send(command)

    async def send_audio(self, audio: bytes) -> None:
        """Caller audio in the session's input format (e.g. 20 ms of μ-law: 160 bytes)."""
        await self.send(cmd.InputAudioAppend(audio=audio))

    async def commit(self) -> None:
        """End the caller's turn yourself (with ``turn_detection=None``)."""
        await self.send(cmd.InputAudioCommit())

    async def clear_audio(self) -> None:
        await self.send(cmd.InputAudioClear())

    async def send_text(self, text: str, *, role: str = "user", item_id: str | None = None) -> None:
        """Add a text message to the conversation (no reply until :meth:`respond`)."""
        kind = "output_text" if role == "assistant" else "input_text"
        item = MessageItem(id=item_id, role=role,  # type: ignore[arg-type]
                           content=[ContentPart(type=kind, text=text)])
        await self.send(cmd.ItemCreate(item=item))

    async def respond(self, *, instructions: str | None = None,
                      output_modalities: Sequence[str] | None = None,
                      voice: str | None = None) -> None:
        """Ask for a reply now (server VAD answers spoken turns by itself)."""
        overrides = None
        if instructions is not None or output_modalities is not None or voice is not None:
            overrides = cmd.ResponseOverrides(
                instructions=instructions, voice=voice,
                output_modalities=None if output_modalities is None
                else frozenset(output_modalities))
        await self.send(cmd.ResponseCreate(overrides=overrides))

    async def cancel(self) -> None:
        """Stop the reply in progress; its audio stops within one paced frame."""
        await self.send(cmd.ResponseCancel())

    async def truncate(self, item_id: str, audio_end_ms: int) -> None:
        """Cut an assistant item to what the listener heard; the model forgets the rest."""
        await self.send(cmd.ItemTruncate(item_id=item_id, audio_end_ms=audio_end_ms))

    async def delete(self, item_id: str) -> None:
        await self.send(cmd.ItemDelete(item_id=item_id))

    async def clear_output(self) -> None:
        """Drop reply audio queued for playout."""
        await self.send(cmd.OutputAudioClear())

    async def update(self, **options: Any) -> None:
        """Change session options (as :func:`session_patch` takes them; ``tools`` replaces
        the functions this session runs)."""
        await self.send(cmd.SessionUpdate(changes=session_patch(**options)))
        if "tools" in options:
            self._tools = {fn.__name__: fn for fn in options["tools"]}


class SessionFactory(abc.ABC):
    """What opens sessions: an in-process Engine or a remote server (``connect``)."""

    @abc.abstractmethod
    def _transport(self) -> Transport: ...

    @property
    def tools_supported(self) -> bool | None:
        """Whether the reply model can call functions (None: the server will say)."""
        return None

    def session(
        self,
        *,
        instructions: str | None = None,
        voice: str | None = None,
        input_format: str | AudioFormat | None = None,
        output_format: str | AudioFormat | None = None,
        output_modalities: Sequence[str] | None = None,
        turn_detection: Mapping[str, Any] | None = UNSET,
        transcription: Mapping[str, Any] | None = UNSET,
        temperature: float | None = None,
        max_output_tokens: int | None = None,
        tools: Sequence[Callable[..., Any]] = (),
    ) -> Session:
        """A new session (enter it with ``async with``); options as :func:`session_patch`.

        Formats take the beta names (``"g711_ulaw"``) or GA ones (``"audio/pcmu"``).
        ``tools`` are Python functions (sync or async) the model may call; the session runs
        them on each call it makes, sends their results back and asks for the answer, which
        arrives as the next response. They need a reply model that calls functions (a
        remote server, ``llm="openai:<url>"``); otherwise ToolsNotAvailable. Invalid options
        raise ProtocolError here, before anything is opened.
        """
        if tools and self.tools_supported is False:
            raise ToolsNotAvailable(
                "function tools are not available with the embedded model (it calls no "
                "functions); run the engine with llm='openai:<server url>' to use them")
        options = session_patch(
            instructions=instructions, voice=voice, input_format=input_format,
            output_format=output_format, output_modalities=output_modalities,
            turn_detection=turn_detection, transcription=transcription,
            temperature=temperature, max_output_tokens=max_output_tokens, tools=tools)
        return Session(self._transport(), options, tools)
