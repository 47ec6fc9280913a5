"""The reply model on a remote OpenAI-compatible server (vLLM, SGLang, llama.cpp, Ollama).

Two pieces, so that the engine's conversation logic stays in one home (`conversation`,
`responses`) for both backends:

- `RemoteChat` is the chat format the conversation is kept in. Its "tokens" are symbols:
  a role mark, the message's Unicode code points, an end mark. Truncation, deletion and
  insertion edit that symbol sequence exactly as they edit the embedded model's tokens;
  `chat_messages` reads it back as Chat Completions messages. Messages are only ever
  appended or edited in place, so each request's messages start with the previous
  request's: the server's prefix cache (vLLM automatic prefix caching, SGLang's radix
  cache, llama.cpp's slot cache) hits on everything but the new turn.
- `RemoteLLMStage` replaces the embedded `LLMStage` behind the same calls. `add` sends
  `POST /v1/chat/completions` with `stream: true` from a private asyncio thread; each
  streamed delta is queued and wakes the engine loop, whose `schedule`/`update` fold the
  deltas into the request (text as symbols in `generated`, function calls in `calls`), so
  the text chunker hands the first clause to TTS as soon as it streams in. `abort`
  cancels the HTTP task, which closes the connection at once (the server stops
  generating). A connection error, timeout or HTTP error before the first token is
  retried (`retries`, backoff); after it, or once retries are spent, the request fails
  with a message naming the server and the cause, never a hung response.

Back-pressure: at most `MAX_QUEUED_DELTAS` deltas (all requests together) wait for the
engine loop. Past that the HTTP thread stops reading its streams until the loop has taken
them (the next step takes every queued delta), so the server's stream waits in TCP
instead of piling up here; nothing is dropped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from voxline.config import setting_default
from voxline.engines.llm_stage import FinishReason, GenerationRequest, Slot, ToolCall
from voxline.engines.protocol import ImageInput
from voxline.engines.remote_images import ImageSymbols, chat_content, render_with_images
from voxline.errors import VoxlineError

logger = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "function_call", "function_call_output")
_MARK = 0x110000  # past the last Unicode code point: role marks and the end mark
_END = _MARK + len(ROLES)
# The conversation budget is counted in characters here; the server enforces its own
# context window (an overflow comes back as an HTTP 400 and fails the response clearly).
MAX_CONTEXT_CHARS = 1 << 20
RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
ERROR_BODY_CHARS = 300
MAX_QUEUED_DELTAS = 1024  # streamed deltas waiting for the engine loop, all requests


class RemoteLLMError(VoxlineError):
    """A request to the remote server failed; `retryable` if trying again may help."""

    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class RemoteLLMConfig:
    """Where the reply model runs. `url` is the server's base (`.../v1` is appended when
    missing); `timeout` bounds connecting and each wait for the next streamed chunk."""

    url: str
    model: str
    api_key: str | None = None
    timeout: float = setting_default("llm_timeout")
    retries: int = setting_default("llm_retries")
    retry_backoff: float = 0.25  # seconds before the first retry; doubles each time

    @property
    def chat_url(self) -> str:
        base = self.url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        return base + "/chat/completions"

    @property
    def models_url(self) -> str:
        return self.chat_url.removesuffix("/chat/completions") + "/models"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def parse_llm_spec(spec: str) -> str:
    """The server URL of an `--llm openai:URL` spec (raises ValueError when malformed)."""
    if not spec.startswith("openai:"):
        raise ValueError(f"expected 'embedded' or 'openai:<server url>', got {spec!r}")
    url = spec.removeprefix("openai:")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"the server URL must start with http:// or https://, got {url!r}")
    return url


class RemoteChat:
    """The chat format of a conversation whose replies come from a remote server.

    It stands where the embedded `ChatModel` stands (the engine's `Models.llm`), but never
    runs a forward pass: `RemoteLLMStage` does the generating.
    """

    eos_token_ids: frozenset[int] = frozenset()
    max_len = MAX_CONTEXT_CHARS
    context_unit = "characters"  # what `max_len` counts (named in context errors)
    max_token_chars = 1  # characters per "token" (the engine's cheap length check)
    supports_tools = True
    supports_reasoning_effort = True  # sent as `reasoning_effort`; the server may refuse it

    def __init__(self, config: RemoteLLMConfig) -> None:
        self.config = config
        self._slots = 0
        self.images = ImageSymbols(_END + 1)  # image symbols come after the end mark

    # chat format -------------------------------------------------------------------

    def render_message(self, role: str, text: str,
                       images: tuple[ImageInput, ...] = ()) -> list[int]:
        if images:
            return [_MARK + ROLES.index(role), *render_with_images(text, images, self.images),
                    _END]
        return [_MARK + ROLES.index(role), *map(ord, text), _END]

    def generation_header(self) -> list[int]:
        return [_MARK + ROLES.index("assistant")]

    def message_footer(self) -> list[int]:
        return [_END]

    def decode(self, tokens: list[int]) -> str:
        return "".join(chr(t) for t in tokens if t < _MARK)

    # slots: the server keeps its own cache, so a slot is only a name here --------------

    def alloc_slot(self) -> int | None:
        self._slots += 1
        return self._slots

    def free_slot(self, slot: int) -> None:
        pass

    def truncate(self, slot: int, length: int) -> None:
        pass

    def forward(self, slots: list[int], tokens: list[list[int]]) -> Any:
        raise NotImplementedError("a remote model is driven by RemoteLLMStage")

    def sample(self, logits: Any, temperatures: list[float], generators: list[Any]) -> list[int]:
        raise NotImplementedError("a remote model is driven by RemoteLLMStage")

    # -------------------------------------------------------------------------------

    def check(self) -> str:
        """Ask the server for its models (a start-up log line; never fatal: the server may
        come up later, and each response then reports what went wrong)."""
        try:
            r = httpx.get(self.config.models_url, headers=self.config.headers(),
                          timeout=min(self.config.timeout, 5.0))
            r.raise_for_status()
            ids = [m.get("id") for m in r.json().get("data", [])]
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            return f"not reachable yet ({type(exc).__name__}: {exc})"
        return f"serving {', '.join(map(str, ids)) or 'no listed models'}"


def chat_messages(tokens: list[int], images: ImageSymbols | None = None
                  ) -> list[dict[str, Any]]:
    """Chat Completions messages from a `RemoteChat` prompt (a trailing generation header,
    an unterminated assistant mark, is left out). Function calls join the assistant message
    before them (as `tool_calls`); their outputs become `tool` messages. A message with
    image symbols (known to `images`) gets a list of text and image parts as content."""
    out: list[dict[str, Any]] = []
    role: str | None = None
    text: list[str] = []
    pieces: list[str | ImageInput] = []  # the message's text so far and its images
    for t in tokens:
        if t == _END:
            if role is not None and pieces:
                out.append({"role": role, "content": chat_content([*pieces, "".join(text)])})
            elif role is not None:
                _append_message(out, role, "".join(text))
            role, text, pieces = None, [], []
        elif t > _END:
            image = images.get(t) if images is not None else None
            if role is not None and image is not None:
                pieces += ["".join(text), image]
                text = []
        elif t >= _MARK:
            role, text = ROLES[t - _MARK], []
        elif role is not None:
            text.append(chr(t))
    return out


def _append_message(out: list[dict[str, Any]], role: str, text: str) -> None:
    if role in ("system", "user", "assistant"):
        out.append({"role": role, "content": text})
        return
    data = json.loads(text)
    if role == "function_call_output":
        out.append({"role": "tool", "tool_call_id": data["call_id"], "content": data["output"]})
        return
    call = {"id": data["call_id"], "type": "function",
            "function": {"name": data["name"], "arguments": data["arguments"]}}
    if not out or out[-1]["role"] != "assistant":
        out.append({"role": "assistant", "content": ""})
    out[-1].setdefault("tool_calls", []).append(call)


# ------------------------------------------------------------------------------ stage


@dataclass
class Delta:
    """One streamed piece of a request's reply, queued for the engine loop."""

    request_id: str
    text: str = ""
    call: tuple[int, str | None, str | None, str] | None = None  # index, id, name, arguments
    finish: FinishReason | None = None
    error: str | None = None
    first_token_ms: float | None = None
    usage: dict[str, Any] | None = None  # the server's token counts, at the end


@dataclass
class RemotePlan:
    """The deltas that arrived since the last step, and the requests they belong to."""

    deltas: list[Delta]
    entries: list[RemoteEntry] = field(default_factory=list)

    @property
    def slots(self) -> list[int]:
        return []  # no engine-side cache is written


@dataclass
class RemoteEntry:
    request: GenerationRequest


class RemoteLLMStage:
    """Streams replies from a remote server; `LLMStage`'s calls, so `EngineCore` and
    `Responses` drive both backends alike (see the module docstring)."""

    def __init__(self, model: RemoteChat, wake: Callable[[], None]) -> None:
        self.model = model
        self.config = model.config
        self.running: dict[str, GenerationRequest] = {}
        self._wake = wake
        self._deltas: deque[Delta] = deque()  # appended by the HTTP thread, drained by the loop
        self._room = asyncio.Event()  # HTTP thread: set when the loop took the queued deltas
        self._want_room = False  # the HTTP thread waits for room (the loop sets `_room`)
        self._tasks: dict[str, asyncio.Future[None]] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="voxline-remote-llm",
                                        daemon=True)
        self._thread.start()
        self._client: httpx.AsyncClient = asyncio.run_coroutine_threadsafe(
            self._new_client(), self._loop).result()

    async def _new_client(self) -> httpx.AsyncClient:
        cfg = self.config
        timeout = httpx.Timeout(cfg.timeout, connect=min(cfg.timeout, 10.0))
        return httpx.AsyncClient(timeout=timeout, headers=cfg.headers(),
                                 limits=httpx.Limits(max_connections=None))

    # engine loop side ------------------------------------------------------------------

    def add(self, request: GenerationRequest) -> None:
        self.running[request.request_id] = request
        body = self._body(request)
        self._tasks[request.request_id] = asyncio.run_coroutine_threadsafe(
            self._generate(request.request_id, body), self._loop)

    def abort(self, request_id: str) -> GenerationRequest | None:
        """Stop now: the HTTP stream is closed (the server stops generating) and any delta
        still queued for it is dropped."""
        req = self.running.pop(request_id, None)
        task = self._tasks.pop(request_id, None)
        if task is not None:
            task.cancel()
        if req is not None:
            req.finish = FinishReason.ABORT
            req.epoch += 1
        return req

    def roll_back(self, slot: Slot, length: int) -> None:
        """A dropped speculation: the server keeps no state of ours, only the mirror changes."""
        del slot.tokens[length:]

    def has_work(self) -> bool:
        return bool(self._deltas)

    def schedule(self) -> RemotePlan | None:
        deltas: list[Delta] = []
        while self._deltas:
            deltas.append(self._deltas.popleft())
        if self._want_room:
            self._want_room = False
            self._loop.call_soon_threadsafe(self._room.set)
        if not deltas:
            return None
        seen: dict[str, RemoteEntry] = {}
        for d in deltas:
            req = self.running.get(d.request_id)
            if req is not None and d.request_id not in seen:
                seen[d.request_id] = RemoteEntry(req)
        return RemotePlan(deltas, list(seen.values()))

    def execute(self, plan: RemotePlan) -> list[Delta]:
        return plan.deltas  # the generating happened on the server; `update` folds it in

    def update(self, plan: RemotePlan, result: list[Delta]
               ) -> list[tuple[GenerationRequest, int]]:
        for d in plan.deltas:
            req = self.running.get(d.request_id)
            if req is None:
                continue  # aborted meanwhile
            if d.first_token_ms is not None and req.first_token_ms is None:
                req.first_token_ms = d.first_token_ms
            if d.text or d.call is not None:  # a streamed chunk is one token, until usage says
                req.reported_output_tokens = (req.reported_output_tokens or 0) + 1
            req.generated.extend(map(ord, d.text))
            if d.call is not None:
                _merge_call(req, *d.call)
            if d.usage:
                _apply_usage(req, d.usage)
            if d.error is not None:
                req.finish, req.error = FinishReason.ERROR, d.error
            elif d.finish is not None:
                req.finish = d.finish
            if req.finish is not None:
                del self.running[req.request_id]
                self._tasks.pop(req.request_id, None)
        return []

    def finished_with_error(self) -> list[GenerationRequest]:
        return []  # failures arrive as deltas, through `update`

    def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()
        with_timeout = asyncio.run_coroutine_threadsafe(self._client.aclose(), self._loop)
        try:
            with_timeout.result(timeout=5)
        except Exception:  # closing is best effort; the thread goes either way
            logger.debug("closing the remote LLM client failed", exc_info=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def _body(self, req: GenerationRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": chat_messages(req.prompt(), self.model.images),
            "stream": True,
            "max_tokens": req.max_tokens,
            "temperature": req.temperature,
            "stream_options": {"include_usage": True},  # token counts in the last chunk
        }
        if req.tools:
            body["tools"] = list(req.tools)
            body["tool_choice"] = req.tool_choice
            if req.parallel_tool_calls is not None:
                body["parallel_tool_calls"] = req.parallel_tool_calls
        if req.reasoning_effort is not None:
            body["reasoning_effort"] = req.reasoning_effort
        return body

    # HTTP thread side -------------------------------------------------------------------

    async def _push(self, delta: Delta) -> None:
        """Queue `delta` for the loop, first waiting while `MAX_QUEUED_DELTAS` wait."""
        while len(self._deltas) >= MAX_QUEUED_DELTAS:
            self._room.clear()
            self._want_room = True
            if len(self._deltas) < MAX_QUEUED_DELTAS:  # the loop took them meanwhile
                break
            await self._room.wait()
        self._deltas.append(delta)
        self._wake()

    async def _generate(self, request_id: str, body: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        streamed = [False]  # set once a delta went out: from then on, no retry
        attempts = self.config.retries + 1
        for attempt in range(1, attempts + 1):
            try:
                await self._stream(request_id, body, t0, streamed)
                return
            except asyncio.CancelledError:
                raise
            except RemoteLLMError as exc:
                failure, retryable = str(exc), exc.retryable
            except httpx.TimeoutException as exc:
                failure, retryable = f"timed out after {self.config.timeout:g} s " \
                                     f"({type(exc).__name__})", True
            except httpx.HTTPError as exc:
                failure, retryable = f"{type(exc).__name__}: {exc or 'connection failed'}", True
            except (ValueError, KeyError, TypeError) as exc:  # a malformed stream
                failure, retryable = f"unreadable reply stream: {exc}", False
            if not retryable or streamed[0] or attempt == attempts:
                tries = f" (after {attempt} attempts)" if attempt > 1 else ""
                logger.warning("remote LLM request %s failed: %s%s", request_id, failure, tries)
                await self._push(Delta(request_id, error=f"the reply model at {self.config.url} "
                                 f"failed: {failure}{tries}"))
                return
            delay = self.config.retry_backoff * 2 ** (attempt - 1)
            logger.info("remote LLM request %s: %s; retrying in %.2f s", request_id, failure,
                        delay)
            await asyncio.sleep(delay)

    async def _stream(self, request_id: str, body: dict[str, Any], t0: float,
                      streamed: list[bool]) -> None:
        async with self._client.stream("POST", self.config.chat_url, json=body) as resp:
            if resp.status_code >= 400:
                text = (await resp.aread()).decode("utf-8", "replace")
                raise RemoteLLMError(f"HTTP {resp.status_code}: {_error_text(text)}",
                                     retryable=resp.status_code in RETRYABLE_STATUS)
            finish: FinishReason | None = None
            usage: dict[str, Any] | None = None
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise RemoteLLMError(f"error in stream: {_error_text(data)}", retryable=False)
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or ():
                    for delta in _deltas(request_id, choice.get("delta") or {}):
                        if not streamed[0]:
                            streamed[0] = True
                            delta.first_token_ms = (time.perf_counter() - t0) * 1000
                        await self._push(delta)
                    reason = choice.get("finish_reason")
                    if reason:
                        finish = FinishReason.LENGTH if reason == "length" else FinishReason.STOP
            if finish is None:
                raise RemoteLLMError("the stream ended before the reply finished",
                                     retryable=True)
            await self._push(Delta(request_id, finish=finish, usage=usage))


def _deltas(request_id: str, delta: dict[str, Any]) -> list[Delta]:
    out: list[Delta] = []
    if delta.get("content"):
        out.append(Delta(request_id, text=delta["content"]))
    for call in delta.get("tool_calls") or ():
        fn = call.get("function") or {}
        out.append(Delta(request_id, call=(int(call.get("index", 0)), call.get("id"),
                                           fn.get("name"), fn.get("arguments") or "")))
    return out


def _merge_call(req: GenerationRequest, index: int, call_id: str | None, name: str | None,
                arguments: str) -> None:
    while len(req.calls) <= index:  # a server that sends no call id gets one made here
        req.calls.append(ToolCall(call_id=f"call_{uuid.uuid4().hex[:24]}", name=""))
    call = req.calls[index]
    if call_id:
        call.call_id = call_id
    if name:
        call.name = name
    call.arguments += arguments
    call.unsent += arguments


def _apply_usage(req: GenerationRequest, usage: dict[str, Any]) -> None:
    if isinstance(usage.get("prompt_tokens"), int):
        req.prompt_tokens = usage["prompt_tokens"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if isinstance(cached, int):
        req.cached_tokens = cached
    if isinstance(usage.get("completion_tokens"), int):
        req.reported_output_tokens = usage["completion_tokens"]


def _error_text(body: str) -> str:
    """The server's error message, from an OpenAI-style error body when it has one."""
    try:
        data = json.loads(body)
        err = data.get("error", data) if isinstance(data, dict) else data
        msg = err.get("message") if isinstance(err, dict) else None
        if msg:
            return str(msg)[:ERROR_BODY_CHARS]
    except ValueError:
        pass
    return body.strip()[:ERROR_BODY_CHARS] or "(empty body)"
