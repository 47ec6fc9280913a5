"""The MCP network work of a session, on asyncio: the official `mcp` SDK's streamable
HTTP client. `McpWorker` runs each request (`ListMcpTools`, `CallMcpTool`) as its own task,
bounded by `timeout` and by `MAX_RUNNING` at once per session, so the session's loop
keeps serving other events meanwhile; every request ends in exactly one outcome (a
failure or a timeout is an outcome with an error, never an exception), handed to the
`done` callback on the loop. One connection per request: simple and stateless; a server
that keeps per-session state across calls is not supported.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from voxline.aio import cancel_and_wait
from voxline.sessions.mcp_servers import (
    CallMcpTool,
    ListMcpTools,
    McpCallDone,
    McpOutcome,
    McpRequest,
    McpServer,
    McpToolsListed,
)

logger = logging.getLogger(__name__)

TIMEOUT_S = 30.0  # one request, connect to result
MAX_RUNNING = 8  # requests at once per session; more fail at once
MAX_OUTPUT_CHARS = 64 * 1024  # a tool's text output beyond this is cut


class McpWorker:
    def __init__(self, done: Callable[[McpOutcome], None], *, timeout: float = TIMEOUT_S) -> None:
        self._done = done
        self._timeout = timeout
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, request: McpRequest) -> None:
        if len(self._tasks) >= MAX_RUNNING:
            self._done(_failure(request, f"more than {MAX_RUNNING} MCP requests at once"))
            return
        task = asyncio.create_task(self._run(request), name=f"mcp-{request.item_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, request: McpRequest) -> None:
        try:
            outcome = await asyncio.wait_for(_perform(request), self._timeout)
        except TimeoutError:
            outcome = _failure(request, f"no answer from {request.server.url} within "
                               f"{self._timeout:g} s")
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the SDK raises groups and its own types
            outcome = _failure(request, _describe(exc))
        self._done(outcome)

    async def aclose(self) -> None:
        await cancel_and_wait(*self._tasks)


def _describe(exc: BaseException) -> str:
    """The innermost useful message of `exc` (anyio wraps failures in exception groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _failure(request: McpRequest, why: str) -> McpOutcome:
    if isinstance(request, ListMcpTools):
        return McpToolsListed(request.item_id, error=why)
    return McpCallDone(request.item_id, error={"type": "http_error", "code": 0,
                                               "message": why[:500]})


async def _perform(request: McpRequest) -> McpOutcome:
    if isinstance(request, CallMcpTool):
        try:
            arguments = json.loads(request.arguments or "{}")
        except json.JSONDecodeError as exc:
            return McpCallDone(request.item_id, error={
                "type": "tool_execution_error", "message": f"arguments are not JSON: {exc}"})
        if not isinstance(arguments, dict):
            return McpCallDone(request.item_id, error={
                "type": "tool_execution_error", "message": "arguments must be a JSON object"})
    async with _session(request.server) as session:
        if isinstance(request, ListMcpTools):
            return McpToolsListed(request.item_id, tuple(
                _tool_info(t) for t in (await session.list_tools()).tools))
        result = await session.call_tool(request.name, arguments)
    text = "".join(getattr(c, "text", "") for c in result.content)[:MAX_OUTPUT_CHARS]
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content)[:MAX_OUTPUT_CHARS]
    if result.is_error:
        return McpCallDone(request.item_id, error={"type": "tool_execution_error",
                                                   "message": text or "the tool failed"})
    return McpCallDone(request.item_id, output=text)


def _tool_info(tool: Any) -> dict[str, Any]:
    info: dict[str, Any] = {"name": tool.name, "input_schema": tool.input_schema}
    if tool.description:
        info["description"] = tool.description
    if tool.annotations is not None:
        info["annotations"] = tool.annotations.model_dump(exclude_none=True)
    return info


@contextlib.asynccontextmanager
async def _session(server: McpServer):  # noqa: ANN202 - yields the SDK's ClientSession
    # imported here: the SDK is only loaded by sessions that use MCP tools
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async with create_mcp_http_client(headers=dict(server.headers)) as http, \
            streamable_http_client(server.url, http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session
