"""MCP tools end to end: a real MCP server (the official `mcp` SDK's MCPServer over
streamable HTTP on loopback), a fake remote reply model that calls its tools
(tests/fake_openai.py), and a real voxline server's /v1/realtime WebSocket. Every event is
validated strictly against the `openai` package's GA types.
"""

from __future__ import annotations

import json

import pytest
from fake_openai import Reply, fake_openai
from live_server import free_port, serve_app
from openai_types import strict_problems
from test_remote_llm import ready, realtime_app
from ws_events import until

from voxline.sessions.mcp_servers import McpServer

pytest.importorskip("mcp")


def _mcp_app():
    from mcp.server.mcpserver import MCPServer
    from starlette.responses import PlainTextResponse

    srv = MCPServer("test-tools")

    @srv.tool()
    def add(a: int, b: int) -> int:
        """Add two numbers"""
        return a + b

    @srv.tool()
    def boom(reason: str) -> str:
        """Always fails"""
        raise ValueError(f"kaboom: {reason}")

    @srv.tool()
    def secret() -> str:
        """Not allowed by the session"""
        return "hidden"

    @srv.custom_route("/health", methods=["GET"])
    async def health(request):  # noqa: ANN001, ANN202
        return PlainTextResponse("ok")

    return srv.streamable_http_app()


@pytest.fixture(scope="module")
def mcp_url():
    port = free_port()
    with serve_app(_mcp_app(), port, name="mcp-server") as base:
        yield base + "/mcp"


@pytest.fixture
def server():
    with fake_openai() as (fake, url):
        yield fake, url


def _mcp_tool(url: str, **extra: object) -> dict:
    return {"type": "mcp", "server_label": "calc", "server_url": url,
            "allowed_tools": ["add", "boom"], "require_approval": "never",
            "headers": {"X-Test": "1"}, **extra}


def _connect(ws, seen: list[dict], tool: dict) -> dict:
    until(ws, "session.created", seen)
    ws.send_json({"type": "session.update", "session": {
        "type": "realtime", "tools": [tool], "audio": {"input": {"turn_detection": None}}}})
    until(ws, "session.updated", seen)
    completed = until(ws, "mcp_list_tools.completed", seen)
    until(ws, "conversation.item.done", seen)
    return completed


def _ask(ws, text: str) -> None:
    ws.send_json({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    ws.send_json({"type": "response.create"})


def _strict(seen: list[dict]) -> None:
    assert [pr for e in seen for pr in strict_problems(e, "ga")] == []


def test_tools_are_listed_filtered_and_a_call_runs_with_its_output(server, mcp_url):
    fake, url = server
    fake.plan.append(Reply(text=[], calls=[("add", ['{"a": 2, ', '"b": 3}'])]))
    fake.plan.append(Reply(text=["Two and three make five."]))
    seen: list[dict] = []
    with realtime_app(url) as client, ready(client).websocket_connect("/v1/realtime") as ws:
        done = _connect(ws, seen, _mcp_tool(mcp_url))
        listed = [e for e in seen if e["type"] == "conversation.item.done"
                  and e["item"]["type"] == "mcp_list_tools"][0]["item"]
        assert listed["id"] == done["item_id"] and listed["server_label"] == "calc"
        assert sorted(t["name"] for t in listed["tools"]) == ["add", "boom"]  # not "secret"
        assert any(e["type"] == "mcp_list_tools.in_progress" for e in seen)
        _ask(ws, "What is 2 + 3?")
        first = until(ws, "response.done", seen)
        call = [o for o in first["response"]["output"] if o["type"] == "mcp_call"]
        assert call == [{"id": call[0]["id"], "type": "mcp_call", "server_label": "calc",
                         "name": "add", "arguments": '{"a": 2, "b": 3}',
                         "approval_request_id": None, "output": "5", "error": None}]
        kinds = [e["type"] for e in seen if e.get("item_id") == call[0]["id"]]
        assert kinds[0] == "response.mcp_call_arguments.delta"
        assert kinds.index("response.mcp_call_arguments.done") < kinds.index(
            "response.mcp_call.in_progress") < kinds.index("response.mcp_call.completed")
        follow = until(ws, "response.done", seen)  # the model answers with the result
        assert follow["response"]["status"] == "completed"
    names = [t["function"]["name"] for t in fake.bodies[0]["tools"]]
    assert sorted(names) == ["add", "boom"]
    assert fake.bodies[1]["messages"][-1]["role"] == "tool"
    assert fake.bodies[1]["messages"][-1]["content"] == "5"
    _strict(seen)


def test_a_failing_tool_ends_the_call_with_an_error_and_the_session_goes_on(server, mcp_url):
    fake, url = server
    fake.plan.append(Reply(text=[], calls=[("boom", ['{"reason": "test"}'])]))
    fake.plan.append(Reply(text=["That did not work."]))
    seen: list[dict] = []
    with realtime_app(url) as client, ready(client).websocket_connect("/v1/realtime") as ws:
        _connect(ws, seen, _mcp_tool(mcp_url))
        _ask(ws, "Break it")
        done = until(ws, "response.done", seen)
        call, = [o for o in done["response"]["output"] if o["type"] == "mcp_call"]
        assert call["output"] is None and call["error"]["type"] == "tool_execution_error"
        assert any(e["type"] == "response.mcp_call.failed" for e in seen)
        assert until(ws, "response.done", seen)["response"]["status"] == "completed"
    assert "error" in fake.bodies[1]["messages"][-1]["content"]
    _strict(seen)


@pytest.mark.parametrize("approve", [True, False])
def test_require_approval_asks_the_client_first(server, mcp_url, approve):
    fake, url = server
    fake.plan.append(Reply(text=[], calls=[("add", ['{"a": 1, "b": 1}'])]))
    fake.plan.append(Reply(text=["Done."]))
    seen: list[dict] = []
    with realtime_app(url) as client, ready(client).websocket_connect("/v1/realtime") as ws:
        _connect(ws, seen, _mcp_tool(mcp_url, require_approval="always"))
        _ask(ws, "1 + 1?")
        done = until(ws, "response.done", seen)
        request, = [o for o in done["response"]["output"] if o["type"] == "mcp_approval_request"]
        assert (request["name"], request["arguments"]) == ("add", '{"a": 1, "b": 1}')
        assert not any(e["type"].startswith("response.mcp_call") for e in seen)
        ws.send_json({"type": "conversation.item.create", "item": {
            "type": "mcp_approval_response", "approval_request_id": request["id"],
            "approve": approve}})
        added = until(ws, "conversation.item.added", seen)
        assert added["item"]["type"] == "mcp_approval_response"
        if approve:
            until(ws, "response.mcp_call.completed", seen)
        follow = until(ws, "response.done", seen)
        assert follow["response"]["status"] == "completed"
        calls = [e["item"] for e in seen if e["type"] == "conversation.item.done"
                 and e["item"]["type"] == "mcp_call"]
        if approve:
            assert calls[-1]["output"] == "2" and calls[-1]["approval_request_id"] == request["id"]
        else:
            assert calls == []
        # answering twice is refused, naming the field
        ws.send_json({"type": "conversation.item.create", "item": {
            "type": "mcp_approval_response", "approval_request_id": request["id"],
            "approve": True}})
        err = until(ws, "error", seen, errors_ok=True)
        assert err["error"]["param"] == "item.approval_request_id"
    tool_msg = fake.bodies[1]["messages"][-1]
    assert tool_msg["role"] == "tool"
    assert tool_msg["content"] == "2" if approve else "denied" in tool_msg["content"]
    _strict(seen)


def test_an_unreachable_server_fails_the_listing_and_the_session_lives_on(server):
    fake, url = server
    seen: list[dict] = []
    dead = f"http://127.0.0.1:{free_port()}/mcp"
    with realtime_app(url) as client, ready(client).websocket_connect("/v1/realtime") as ws:
        until(ws, "session.created", seen)
        ws.send_json({"type": "session.update", "session": {
            "type": "realtime", "tools": [_mcp_tool(dead)],
            "audio": {"input": {"turn_detection": None}}}})
        until(ws, "mcp_list_tools.failed", seen)
        err = until(ws, "error", seen, errors_ok=True)
        assert err["error"]["code"] == "mcp_list_tools_failed" and "calc" in err["error"]["message"]
        _ask(ws, "Hello?")
        done = until(ws, "response.done", seen)
        assert done["response"]["status"] == "completed"
    assert "tools" not in fake.bodies[0]
    _strict(seen)


def test_bad_mcp_tools_are_refused_naming_the_field(server):
    fake, url = server
    with realtime_app(url) as client, ready(client).websocket_connect("/v1/realtime") as ws:
        assert ws.receive_json()["type"] == "session.created"
        ws.send_json({"type": "session.update", "session": {"type": "realtime", "tools": [
            {"type": "mcp", "server_label": "x", "server_url": "ftp://nope"}]}})
        err = ws.receive_json()
        assert err["type"] == "error" and err["error"]["param"] == "session.tools[0].server_url"


def test_approval_filters_follow_openai_semantics():
    tool = {"name": "add", "annotations": {"readOnlyHint": True}}
    assert McpServer("s", "http://x").needs_approval(tool)  # OpenAI's default
    assert not McpServer("s", "http://x", approval="never").needs_approval(tool)
    assert not McpServer("s", "http://x", approval={"never": {"tool_names": ["add"]}}
                         ).needs_approval(tool)
    assert McpServer("s", "http://x", approval={"always": {"read_only": True}}).needs_approval(tool)
    assert not McpServer("s", "http://x", allowed=("sub",)).allows(tool)
    assert json.dumps(tool)


def test_the_embedded_model_refuses_mcp_tools_clearly():
    from starlette.testclient import TestClient

    from voxline.config import load_settings
    from voxline.engines.client import InProcessEngineClient
    from voxline.realtime.app import create_app

    engine = InProcessEngineClient("fakes:make_fake_core", {})
    with TestClient(create_app(load_settings(), engine)) as client, \
            ready(client).websocket_connect("/v1/realtime") as ws:
        assert ws.receive_json()["type"] == "session.created"
        ws.send_json({"type": "session.update", "session": {"type": "realtime", "tools": [
            _mcp_tool("http://127.0.0.1:1/mcp")]}})
        err = ws.receive_json()
        assert err["type"] == "error" and err["error"]["param"] == "session.tools"
        assert "embedded model" in err["error"]["message"]
