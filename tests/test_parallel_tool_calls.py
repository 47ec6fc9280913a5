"""Parallel tool calls and reasoning effort with a remote reply model: a scripted
OpenAI-compatible server on loopback (tests/fake_openai.py) returns two tool calls in one
turn, over a real voxline server's /v1/realtime WebSocket (uvicorn on loopback); every
event validates strictly against the `openai` package's GA types."""

from __future__ import annotations

import pytest
from fake_openai import Reply, fake_openai
from live_server import free_port, live_socket, serve_app
from openai_types import strict_problems
from test_mcp_tools import _mcp_app, _mcp_tool
from test_remote_llm import remote_app
from ws_events import until

TOOLS = [
    {"type": "function", "name": "get_weather", "description": "Weather in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
    {"type": "function", "name": "get_time", "description": "Local time in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
]
TWO_CALLS = [("get_weather", ['{"city": ', '"Paris"}']), ("get_time", ['{"city": "Tokyo"}'])]


@pytest.fixture
def server():
    with fake_openai() as (fake, url):
        yield fake, url


def open_session(ws, seen: list[dict], **session: object) -> None:
    until(ws, "session.created", seen)
    ws.send_json({"type": "session.update", "session": {
        "type": "realtime", "output_modalities": ["text"],
        "audio": {"input": {"turn_detection": None}}, **session}})
    until(ws, "session.updated", seen)


def ask(ws, text: str, **response: object) -> None:
    ws.send_json({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    ws.send_json({"type": "response.create", **({"response": response} if response else {})})


def output(call_id: str, text: str) -> dict:
    return {"type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": call_id, "output": text}}


def test_two_calls_in_one_turn_answered_out_of_order_and_the_reply_waits_for_both(server):
    fake, url = server
    fake.plan.append(Reply(text=[], calls=TWO_CALLS))
    fake.plan.append(Reply(text=["Sunny in Paris, ", "nine in Tokyo."]))
    seen: list[dict] = []
    with live_socket(remote_app(url)) as ws:
        open_session(ws, seen, tools=TOOLS)
        ask(ws, "Weather in Paris and the time in Tokyo?")
        done = until(ws, "response.done", seen)
        calls = [o for o in done["response"]["output"] if o["type"] == "function_call"]
        assert [(c["name"], c["call_id"], c["arguments"], c["status"]) for c in calls] == [
            ("get_weather", "call_fake0", '{"city": "Paris"}', "completed"),
            ("get_time", "call_fake1", '{"city": "Tokyo"}', "completed")]
        added = [e for e in seen if e["type"] == "response.output_item.added"
                 and e["item"]["type"] == "function_call"]
        assert [(e["output_index"], e["item"]["call_id"]) for e in added] == [
            (1, "call_fake0"), (2, "call_fake1")]
        args_done = [e for e in seen if e["type"] == "response.function_call_arguments.done"]
        assert [(e["call_id"], e["output_index"]) for e in args_done] == [
            ("call_fake0", 1), ("call_fake1", 2)]
        # the second call answered first; a response.create before the first is answered
        # waits for it
        ws.send_json(output("call_fake1", '{"time": "21:00"}'))
        until(ws, "conversation.item.done", seen)
        ws.send_json({"type": "response.create", "event_id": "evt_follow"})
        ws.send_json(output("call_fake0", '{"sky": "sunny"}'))
        waited = until(ws, "conversation.item.done", seen)
        assert waited["item"]["call_id"] == "call_fake0"
        follow = until(ws, "response.done", seen)
        assert follow["response"]["status"] == "completed"
        created = [i for i, e in enumerate(seen) if e["type"] == "response.created"]
        assert len(created) == 2 and created[1] > seen.index(waited)  # it waited for both
    messages = fake.bodies[1]["messages"]
    assert messages[-3] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_fake0", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_fake1", "type": "function",
         "function": {"name": "get_time", "arguments": '{"city": "Tokyo"}'}}]}
    assert messages[-2:] == [
        {"role": "tool", "tool_call_id": "call_fake1", "content": '{"time": "21:00"}'},
        {"role": "tool", "tool_call_id": "call_fake0", "content": '{"sky": "sunny"}'}]
    assert [p for e in seen for p in strict_problems(e, "ga")] == []


def test_answering_before_asking_replies_at_once_and_a_second_wait_is_refused(server):
    fake, url = server
    fake.plan.append(Reply(text=[], calls=TWO_CALLS))
    fake.plan.append(Reply(text=["Done."]))
    seen: list[dict] = []
    with live_socket(remote_app(url)) as ws:
        open_session(ws, seen, tools=TOOLS)
        ask(ws, "Weather in Paris and the time in Tokyo?")
        until(ws, "response.done", seen)
        ws.send_json({"type": "response.create", "event_id": "evt_1"})
        ws.send_json({"type": "response.create", "event_id": "evt_2"})
        err = until(ws, "error", seen, errors_ok=True)["error"]
        assert err["event_id"] == "evt_2" and "waiting for the outputs" in err["message"]
        ws.send_json(output("call_fake0", "sunny"))
        ws.send_json(output("call_fake1", "21:00"))
        assert until(ws, "response.done", seen)["response"]["status"] == "completed"
    assert len(fake.bodies) == 2


def test_parallel_mcp_calls_both_run_before_the_follow_up():
    port = free_port()
    with fake_openai() as (fake, url), serve_app(_mcp_app(), port, name="mcp") as base:
        fake.plan.append(Reply(text=[], calls=[("add", ['{"a": 2, "b": 3}']),
                                               ("add", ['{"a": 4, ', '"b": 5}'])]))
        fake.plan.append(Reply(text=["Five and nine."]))
        seen: list[dict] = []
        with live_socket(remote_app(url)) as ws:
            open_session(ws, seen, tools=[_mcp_tool(base + "/mcp")])
            until(ws, "mcp_list_tools.completed", seen)
            ask(ws, "What are 2 + 3 and 4 + 5?")
            first = until(ws, "response.done", seen)
            calls = [o for o in first["response"]["output"] if o["type"] == "mcp_call"]
            assert [(c["arguments"], c["output"]) for c in calls] == [
                ('{"a": 2, "b": 3}', "5"), ('{"a": 4, "b": 5}', "9")]
            follow = until(ws, "response.done", seen)
            assert follow["response"]["status"] == "completed"
    tools = [m for m in fake.bodies[1]["messages"] if m["role"] == "tool"]
    assert sorted(m["content"] for m in tools) == ["5", "9"]  # in the order they finished
    assert len(fake.bodies[1]["messages"][-3]["tool_calls"]) == 2
    assert [p for e in seen for p in strict_problems(e, "ga")] == []


def test_parallel_tool_calls_setting_reaches_the_remote_model_with_the_tools(server):
    fake, url = server
    fake.plan += [Reply(text=["One."]), Reply(text=["Two."]), Reply(text=["Three."])]
    seen: list[dict] = []
    with live_socket(remote_app(url)) as ws:
        open_session(ws, seen, tools=TOOLS, parallel_tool_calls=False)
        assert seen[-1]["session"]["parallel_tool_calls"] is False
        ask(ws, "Weather?")
        until(ws, "response.done", seen)
        ask(ws, "And again?", parallel_tool_calls=True)
        until(ws, "response.done", seen)
        ws.send_json({"type": "session.update", "session": {"type": "realtime", "tools": []}})
        until(ws, "session.updated", seen)
        ask(ws, "No tools now.")
        until(ws, "response.done", seen)
    assert [b.get("parallel_tool_calls") for b in fake.bodies] == [False, True, None]
    assert [p for e in seen for p in strict_problems(e, "ga")] == []


# --------------------------------------------------------------------- reasoning effort


def test_reasoning_effort_reaches_the_remote_model_from_the_session_and_a_response(server):
    fake, url = server
    fake.plan += [Reply(text=["Fine."]), Reply(text=["Thought hard."]), Reply(text=["Ok."])]
    seen: list[dict] = []
    with live_socket(remote_app(url)) as ws:
        open_session(ws, seen, reasoning={"effort": "low"})
        assert seen[-1]["session"]["reasoning"] == {"effort": "low"}
        ask(ws, "Hello?")
        until(ws, "response.done", seen)
        ask(ws, "Prove it.", reasoning={"effort": "high"})
        until(ws, "response.done", seen)
        ws.send_json({"type": "session.update", "session": {"type": "realtime",
                                                            "reasoning": {"effort": None}}})
        assert "reasoning" not in until(ws, "session.updated", seen)["session"]
        ask(ws, "And now?")
        until(ws, "response.done", seen)
        ws.send_json({"type": "session.update", "event_id": "evt_e", "session": {
            "type": "realtime", "reasoning": {"effort": "maximal"}}})
        err = until(ws, "error", seen, errors_ok=True)["error"]
        assert (err["event_id"], err["param"]) == ("evt_e", "session.reasoning.effort")
    assert [b.get("reasoning_effort") for b in fake.bodies] == ["low", "high", None]
    assert [p for e in seen for p in strict_problems(e, "ga")] == []


def test_the_embedded_model_refuses_reasoning_effort_by_name():
    from voxline.config import load_settings
    from voxline.engines.client import InProcessEngineClient
    from voxline.realtime.app import create_app

    engine = InProcessEngineClient("fakes:make_fake_core", {})
    seen: list[dict] = []
    with live_socket(create_app(load_settings(), engine)) as ws:
        until(ws, "session.created", seen)
        ws.send_json({"type": "session.update", "session": {"type": "realtime",
                                                            "reasoning": {"effort": "low"}}})
        err = until(ws, "error", seen, errors_ok=True)["error"]
        assert err["param"] == "session.reasoning.effort" and "embedded model" in err["message"]
        ws.send_json({"type": "response.create", "event_id": "evt_r",
                      "response": {"reasoning": {"effort": "high"}}})
        err = until(ws, "error", seen, errors_ok=True)["error"]
        assert (err["event_id"], err["param"]) == ("evt_r", "response.reasoning.effort")
        ws.send_json({"type": "session.update", "session": {"type": "realtime"}})
        assert "reasoning" not in until(ws, "session.updated", seen)["session"]


# ------------------------------------------------------------ the wait, at the actor


def test_a_later_reply_or_a_deleted_call_waits_for_nothing():
    import json

    from voxline.engines import protocol as ep
    from voxline.realtime.openai.client_events import parse_command
    from voxline.sessions.actor import SessionActor

    actor = SessionActor("sess_1", "s1", tools_supported=True)
    actor.start(0.0)
    actor.take_commands()

    def send(**event: object) -> list[ep.EngineInput]:
        actor.receive(parse_command(json.dumps(event)), 0.0)
        return actor.take_commands()

    def engine(*outs: ep.EngineOutput) -> list[ep.EngineInput]:
        for out in outs:
            actor.on_engine(out, 0.0)
        return actor.take_commands()

    def reply_with_calls(create: ep.CreateResponse, *call_ids: str) -> None:
        rid = create.response_id
        engine(*(ep.FunctionCallDone("s1", rid, f"item_{c}", n, c, "get_time", "{}", True)
                 for n, c in enumerate(call_ids)),
               ep.ResponseFinished("s1", rid, ep.ResponseStatus.COMPLETED, "", 5, 1))

    def created(cmds: list[ep.EngineInput]) -> ep.CreateResponse | None:
        return next((c for c in cmds if isinstance(c, ep.CreateResponse)), None)

    send(type="session.update", session={"type": "realtime", "tools": TOOLS[1:],
                                         "audio": {"input": {"turn_detection": None}}})
    reply_with_calls(created(send(type="response.create")), "call_a", "call_b")
    assert actor.calls.unanswered() == ["call_a", "call_b"]
    assert created(send(type="response.create")) is None  # held
    send(type="conversation.item.delete", item_id="item_call_a")
    follow = created(send(type="conversation.item.create", item={
        "type": "function_call_output", "call_id": "call_b", "output": "9"}))
    assert follow is not None  # the deleted call waits for nothing
    reply_with_calls(follow, "call_c")
    assert actor.calls.unanswered() == ["call_c"]
    # the user speaks on instead: server VAD's reply to the turn leaves call_c behind
    send(type="session.update", session={"type": "realtime", "audio": {"input": {
        "turn_detection": {"type": "server_vad"}}}})
    engine(ep.VoiceStarted("s1", 100, "item_u2"))
    assert created(engine(ep.VoiceStopped("s1", 1500, "item_u2"))) is not None
    assert actor.calls.unanswered() == []
