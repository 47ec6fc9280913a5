"""A small OpenAI-compatible chat server for the fast remote-LLM tests, and an engine core
that uses it as the reply model (with tests/fakes.py's stand-ins for VAD, ASR and TTS).

The server streams `/v1/chat/completions` as server-sent events, like vLLM or llama.cpp:
each test queues what the next requests get (`FakeOpenAI.plan`), and reads back what was
asked (`bodies`) and whether a client hung up mid-stream (`hung_up`). The real-server twin
is tests/test_remote_llm_llamacpp.py (llama.cpp's server).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from live_server import free_port, serve_app
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Reply:
    """What one request gets. `status` >= 400: that error, nothing streamed. Otherwise the
    `text` pieces, then the `calls` (name, argument pieces), one chunk every `delay` s.
    `hold` (set by the test) is awaited before the last chunk; with `gate`, each chunk
    waits for the test to release it; `hang` streams nothing; `die_after` pieces, the
    connection is dropped without a finish."""

    text: list[str] = field(default_factory=lambda: ["Sure, ", "it is ", "sunny ", "today."])
    calls: list[tuple[str, list[str]]] = field(default_factory=list)
    status: int = 200
    error: str = "bad request"
    delay: float = 0.0
    hold: threading.Event | None = None
    gate: threading.Semaphore | None = None
    hang: bool = False
    die_after: int | None = None


class FakeOpenAI:
    def __init__(self) -> None:
        self.plan: list[Reply] = []
        self.bodies: list[dict[str, Any]] = []
        self.hung_up = threading.Event()  # a client closed a stream before it finished
        self.completed = 0  # streams sent to the end
        self.app = Starlette(routes=[
            Route("/health", lambda r: PlainTextResponse("ok")),
            Route("/v1/models", self._models),
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
        ])

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        reply = self.plan.pop(0) if self.plan else Reply()
        if reply.status >= 400:
            return JSONResponse({"error": {"message": reply.error, "type": "invalid_request"}},
                                status_code=reply.status)
        return StreamingResponse(self._stream(reply, body), media_type="text/event-stream")

    async def _stream(self, reply: Reply, body: dict[str, Any]) -> AsyncIterator[str]:
        finished = False
        try:
            if reply.hang:
                await asyncio.sleep(3600)
            chunks = [{"content": t} for t in reply.text]
            for i, (name, pieces) in enumerate(reply.calls):
                chunks.append({"tool_calls": [{"index": i, "id": f"call_fake{i}", "type": "function",
                                               "function": {"name": name, "arguments": ""}}]})
                chunks += [{"tool_calls": [{"index": i, "function": {"arguments": p}}]}
                           for p in pieces]
            for n, delta in enumerate(chunks):
                if reply.die_after is not None and n == reply.die_after:
                    raise ConnectionError("the fake server dies mid-reply")
                if n == len(chunks) - 1 and reply.hold is not None:
                    while not await asyncio.to_thread(reply.hold.wait, 0.05):
                        pass
                while reply.gate is not None and not await asyncio.to_thread(
                        reply.gate.acquire, True, 0.05):
                    pass
                yield _event(body, {"delta": delta, "finish_reason": None})
                await asyncio.sleep(reply.delay)
            reason = "tool_calls" if reply.calls else "stop"
            yield _event(body, {"delta": {}, "finish_reason": reason})
            yield _event(body, None, usage={"prompt_tokens": 42, "completion_tokens": len(chunks),
                                            "total_tokens": 42 + len(chunks)})
            yield "data: [DONE]\n\n"
            finished = True
            self.completed += 1
        finally:
            if not finished:
                self.hung_up.set()


def _event(body: dict[str, Any], choice: dict[str, Any] | None, **extra: Any) -> str:
    chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time()),
             "model": body.get("model", ""), "choices": [{"index": 0, **choice}] if choice else [],
             **extra}
    return f"data: {json.dumps(chunk)}\n\n"


@contextmanager
def fake_openai() -> Iterator[tuple[FakeOpenAI, str]]:
    """The fake server on loopback until the block ends; yields it and its `/v1` URL."""
    fake = FakeOpenAI()
    port = free_port()
    with serve_app(fake.app, port, name="fake-openai") as base:
        yield fake, base + "/v1"


def make_remote_core(wake, url: str, timeout: float = 5.0, retries: int = 2,
                     asr_text: str = "what is the weather"):
    """An EngineCore whose reply model is the server at `url` (core spec
    ``"fake_openai:make_remote_core"``); VAD, ASR and TTS are tests/fakes.py's."""
    from fakes import EnergyVAD, FixedASR, ToneTTS

    from voxline.engines.core import EngineCore, Models
    from voxline.engines.remote_llm import RemoteChat, RemoteLLMConfig
    from voxline.engines.speech_model import SentenceSpeechModel

    chat = RemoteChat(RemoteLLMConfig(url, "fake-model", api_key="sk-test", timeout=timeout,
                                      retries=retries, retry_backoff=0.05))
    return EngineCore(Models(EnergyVAD(), FixedASR(asr_text), chat,  # type: ignore[arg-type]
                             SentenceSpeechModel(ToneTTS())), wake)
