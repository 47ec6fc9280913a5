"""The remote reply model (`--llm openai:URL`) against a small OpenAI-compatible streaming
server on loopback (tests/fake_openai.py): streaming into TTS, cancel closing the HTTP
stream, truncation reaching the next request, retries and clear errors, TTFT, and function
calling end to end through /v1/realtime. llama.cpp's real server: test_remote_llm_llamacpp.py.
"""

from __future__ import annotations

import base64
import json
import math
import threading
import time

import numpy as np
import pytest
from conftest import TIME_FACTOR
from core_driver import CoreDriver
from fake_openai import Reply, fake_openai, make_remote_core
from fakes import CountingLM, EnergyVAD, FixedASR, ToneTTS
from openai_types import strict_problems
from starlette.testclient import TestClient

from voxline.config import load_settings
from voxline.engines import protocol as p
from voxline.engines.client import InProcessEngineClient
from voxline.engines.conversation import Conversation
from voxline.engines.core import EngineCore, Models
from voxline.engines.protocol import function_call_text, function_output_text
from voxline.engines.remote_llm import (
    RemoteChat,
    RemoteLLMConfig,
    chat_messages,
)
from voxline.engines.speech_model import SentenceSpeechModel
from voxline.realtime.app import create_app

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


class Harness(CoreDriver):
    """An EngineCore whose reply model is the server at `url` (wakes come from its HTTP thread)."""

    def __init__(self, url: str, **kw: object) -> None:
        super().__init__()
        self.core = make_remote_core(self.woke.set, url, **kw)

    def dones(self) -> list[p.ResponseFinished]:
        return self.of(p.ResponseFinished)


def n_done(n: int):
    return lambda outs: sum(isinstance(o, p.ResponseFinished) for o in outs) >= n


def start(h: Harness, text: str = "what is the weather", **cfg: object) -> None:
    h.send(p.OpenStream("s1", p.StreamConfig(**cfg)), p.AddItem("s1", "u1", "user", text),
           p.CreateResponse("s1", "r1", "a1"))


@pytest.fixture
def server():
    with fake_openai() as (fake, url):
        yield fake, url


# ------------------------------------------------------------------------ chat format


def test_the_conversation_reads_back_as_chat_messages_with_a_stable_prefix():
    chat = RemoteChat(RemoteLLMConfig("http://127.0.0.1:1/v1", "m"))
    conv = Conversation(chat.render_message)
    system = chat.render_message("system", "Be brief.")
    conv.add("u1", "user", "Weather in Paris?")
    conv.add("c1", "function_call", function_call_text("call_1", "get_weather", '{"city":"Paris"}'))
    conv.add("o1", "function_call_output", function_output_text("call_1", "sunny"))
    first = chat_messages(conv.render(system) + chat.generation_header())
    assert first == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    reply = chat.render_message("assistant", "It is sunny in Paris, 24 degrees.")
    conv.add_generated("a1", chat.generation_header(), reply[1:-1], "It is sunny in Paris, 24 "
                       "degrees.", chat.message_footer(), [])
    conv.add("u2", "user", "Thanks! 👍")
    second = chat_messages(conv.render(system) + chat.generation_header())
    assert second[:len(first)] == first  # each request extends the last: prefix caches hit
    assert second[-2:] == [{"role": "assistant", "content": "It is sunny in Paris, 24 degrees."},
                           {"role": "user", "content": "Thanks! 👍"}]
    conv.set_text("a1", "It is sunny")  # a truncate rewrites what the next request says
    assert chat_messages(conv.render(system))[-2]["content"] == "It is sunny"


# ------------------------------------------------------------------------- streaming


def test_a_reply_streams_into_speech_before_the_server_finishes(server):
    fake, url = server
    hold = threading.Event()
    fake.plan.append(Reply(text=["Sure, ", "it is sunny. ", "In Paris ", "today."], hold=hold))
    h = Harness(url)
    start(h, temperature=0.3, max_output_tokens=50)
    h.run_until(lambda outs: any(isinstance(o, p.AudioChunk) for o in outs))
    assert not h.dones()  # the first clause is spoken while the server still streams
    hold.set()
    h.run_until(n_done(1))
    done, = h.dones()
    assert done.status == p.ResponseStatus.COMPLETED
    assert done.text == "Sure, it is sunny. In Paris today."
    assert "".join(o.text for o in h.of(p.ReplyTextDelta)) == done.text
    assert (done.input_tokens, done.output_tokens) == (42, 4)  # the server's usage
    assert done.first_token_ms is not None and done.first_token_ms > 0
    body = fake.bodies[0]
    assert body["stream"] is True and body["model"] == "fake-model"
    assert body["temperature"] == 0.3 and body["max_tokens"] == 50 and "tools" not in body
    assert body["messages"][-1] == {"role": "user", "content": "what is the weather"}
    assert h.core.streams["s1"].conversation.find("a1").text == done.text
    h.core.close()


def test_cancel_closes_the_http_stream_and_the_next_turn_works(server):
    fake, url = server
    fake.plan.append(Reply(text=["One, ", "two, "] + ["more "] * 200, delay=0.05))
    h = Harness(url)
    start(h)
    h.run_until(lambda outs: any(isinstance(o, p.ReplyTextDelta) for o in outs))
    h.send(p.CancelResponse("s1"))
    h.run_until(n_done(1))
    assert h.dones()[0].status == p.ResponseStatus.CANCELLED
    assert fake.hung_up.wait(5 * TIME_FACTOR), "the server never saw the client hang up"
    assert fake.completed == 0
    h.send(p.AddItem("s1", "u2", "user", "again"), p.CreateResponse("s1", "r2", "a2"))
    h.run_until(n_done(2))
    assert h.dones()[1].status == p.ResponseStatus.COMPLETED
    h.core.close()


def test_truncation_rewrites_what_the_next_request_sends(server):
    fake, url = server
    fake.plan.append(Reply(text=["It is sunny today. ", "Tomorrow it will rain. ",
                                 "The day after, snow."]))
    h = Harness(url)
    start(h)
    h.run_until(n_done(1))
    first = h.of(p.AudioChunk)[0]
    h.send(p.TruncateItem("s1", "a1", math.ceil(first.duration_ms)))  # all of the first chunk
    h.run_until(lambda outs: any(isinstance(o, p.TruncationApplied) for o in outs))
    heard = h.of(p.TruncationApplied)[0].text
    assert heard == first.text.strip() and "rain" not in heard
    h.send(p.AddItem("s1", "u2", "user", "and then?"), p.CreateResponse("s1", "r2", "a2"))
    h.run_until(n_done(2))
    messages = fake.bodies[1]["messages"]
    assert messages[-2:] == [{"role": "assistant", "content": heard},
                             {"role": "user", "content": "and then?"}]
    assert messages[:2] == fake.bodies[0]["messages"]  # the same prefix as the first request
    h.core.close()


# ------------------------------------------------------------------------ failures


def test_server_errors_are_retried_before_the_first_token(server):
    fake, url = server
    fake.plan += [Reply(status=503, error="overloaded"), Reply(status=500), Reply()]
    h = Harness(url, retries=2)
    start(h)
    h.run_until(n_done(1))
    assert h.dones()[0].status == p.ResponseStatus.COMPLETED and not h.of(p.StreamError)
    assert len(fake.bodies) == 3
    h.core.close()


def test_a_client_error_fails_the_response_clearly_and_the_session_goes_on(server):
    fake, url = server
    fake.plan.append(Reply(status=400, error="model 'fake-model' has no such context"))
    h = Harness(url)
    start(h)
    h.run_until(n_done(1))
    err, = h.of(p.StreamError)
    assert err.code == "llm_backend_error" and not err.fatal
    assert "HTTP 400" in err.message and "no such context" in err.message and url in err.message
    assert h.dones()[0].status == p.ResponseStatus.FAILED
    assert len(fake.bodies) == 1  # a 4xx is not retried
    h.send(p.AddItem("s1", "u2", "user", "again"), p.CreateResponse("s1", "r2", "a2"))
    h.run_until(n_done(2))
    assert h.dones()[1].status == p.ResponseStatus.COMPLETED
    h.core.close()


def test_a_server_that_dies_mid_reply_fails_the_response_without_retrying(server):
    fake, url = server
    fake.plan.append(Reply(text=["Sure, ", "it is ", "sunny."], die_after=2))
    h = Harness(url)
    start(h)
    h.run_until(n_done(1))
    err, = h.of(p.StreamError)
    assert err.code == "llm_backend_error"
    assert h.dones()[0].status == p.ResponseStatus.FAILED
    assert len(fake.bodies) == 1  # words were already spoken: not asked again
    h.send(p.AddItem("s1", "u2", "user", "again"), p.CreateResponse("s1", "r2", "a2"))
    h.run_until(n_done(2))
    assert h.dones()[1].status == p.ResponseStatus.COMPLETED
    h.core.close()


def test_an_unreachable_server_and_a_silent_one_become_errors_not_hangs(server):
    fake, url = server
    from live_server import free_port

    h = Harness(f"http://127.0.0.1:{free_port()}/v1", retries=1)
    start(h)
    h.run_until(n_done(1))
    err, = h.of(p.StreamError)
    assert "ConnectError" in err.message and "after 2 attempts" in err.message
    assert h.dones()[0].status == p.ResponseStatus.FAILED
    h.core.close()
    fake.plan.append(Reply(hang=True))
    h = Harness(url, timeout=0.3, retries=0)
    start(h)
    h.run_until(n_done(1))
    err, = h.of(p.StreamError)
    assert "timed out after 0.3 s" in err.message
    h.core.close()


# ------------------------------------------------------------------------------ tools


def test_a_function_call_streams_as_deltas_and_its_output_reaches_the_next_request(server):
    fake, url = server
    gate = threading.Semaphore(0)
    fake.plan.append(Reply(text=[], calls=[("get_weather", ['{"city"', ': "Par', 'is"}'])],
                           gate=gate))
    h = Harness(url)
    start(h, tools=(WEATHER,), tool_choice={"type": "function",
                                            "function": {"name": "get_weather"}})
    for n in range(1, 4):  # the call's name, then each piece of its arguments, one by one
        gate.release()
        h.run_until(lambda outs, n=n: len([o for o in outs
                                           if isinstance(o, p.FunctionCallDelta)]) >= n - 1)
    gate.release()
    h.run_until(n_done(1))
    deltas = h.of(p.FunctionCallDelta)
    assert [d.delta for d in deltas] == ['{"city"', ': "Par', 'is"}']
    assert {(d.item_id, d.call_id, d.name) for d in deltas} == {("a1_call0", "call_fake0",
                                                                 "get_weather")}
    done, = h.of(p.FunctionCallDone)
    assert (done.arguments, done.completed) == ('{"city": "Paris"}', True)
    assert h.kinds().index("FunctionCallDone") < h.kinds().index("ResponseFinished")
    assert fake.bodies[0]["tools"] == [WEATHER]
    assert fake.bodies[0]["tool_choice"] == {"type": "function",
                                             "function": {"name": "get_weather"}}
    h.send(p.AddItem("s1", "o1", "function_call_output",
                     function_output_text("call_fake0", '{"sky": "clear"}')),
           p.CreateResponse("s1", "r2", "a2", p.ResponseConfig(tool_choice="none")))
    h.run_until(n_done(2))
    body = fake.bodies[1]
    assert body["tool_choice"] == "none"
    assert body["messages"][-2:] == [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_fake0",
         "type": "function", "function": {"name": "get_weather",
                                          "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_fake0", "content": '{"sky": "clear"}'}]
    assert h.dones()[1].status == p.ResponseStatus.COMPLETED and h.of(p.AudioChunk)
    h.core.close()


def test_the_embedded_model_refuses_tools_in_the_engine_too():
    woke = threading.Event()
    core = EngineCore(Models(EnergyVAD(), FixedASR(), CountingLM(),
                             SentenceSpeechModel(ToneTTS())), woke.set)
    core.add_input(p.OpenStream("s1", p.StreamConfig(tools=(WEATHER,))))
    core.add_input(p.CreateResponse("s1", "r1", "a1"))
    err, = [o for o in core.step() if isinstance(o, p.StreamError)]
    assert err.code == "invalid_value" and "tools" in err.message
    core.close()


# ------------------------------------------------------------------- over /v1/realtime


def remote_app(url: str, **settings: object):
    """A voxline app whose reply model is the scripted OpenAI-compatible server at `url`."""
    conf = load_settings(llm="openai:" + url, llm_model="fake-model", **settings)
    engine = InProcessEngineClient("fake_openai:make_remote_core", {"url": url})
    return create_app(conf, engine)


def realtime_app(url: str, **settings: object) -> TestClient:
    return TestClient(remote_app(url, **settings))


def ready(client: TestClient) -> TestClient:
    deadline = time.monotonic() + 30 * TIME_FACTOR
    while client.get("/health").status_code != 200:
        assert time.monotonic() < deadline, "the engine did not start"
        time.sleep(0.05)
    return client


def receive_until(ws, kind: str, seen: list[dict]) -> dict:
    while True:
        event = ws.receive_json()
        seen.append(event)
        assert event["type"] != "error", event
        if event["type"] == kind:
            return event


def test_tool_flow_over_the_realtime_websocket_validates_strictly(server):
    fake, url = server
    fake.plan.append(Reply(text=[], calls=[("get_weather", ['{"city": ', '"Paris"}'])]))
    fake.plan.append(Reply(text=["It is clear ", "in Paris."]))
    seen: list[dict] = []
    with realtime_app(url) as client, ready(client).websocket_connect("/v1/realtime") as ws:
        receive_until(ws, "session.created", seen)
        ws.send_json({"type": "session.update", "session": {"type": "realtime", "tools": [{
            "type": "function", "name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "audio": {"input": {"turn_detection": None}}}})
        receive_until(ws, "session.updated", seen)
        ws.send_json({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "Weather in Paris?"}]}})
        ws.send_json({"type": "response.create", "response": {
            "tool_choice": {"type": "function", "name": "get_weather"}}})
        done = receive_until(ws, "response.done", seen)
        calls = [o for o in done["response"]["output"] if o["type"] == "function_call"]
        assert calls == [{"id": calls[0]["id"], "object": "realtime.item", "type": "function_call",
                          "status": "completed", "name": "get_weather", "call_id": "call_fake0",
                          "arguments": '{"city": "Paris"}'}]
        deltas = [e["delta"] for e in seen if e["type"] == "response.function_call_arguments.delta"]
        assert deltas and "".join(deltas) == '{"city": "Paris"}'  # pieces may coalesce
        args_done, = [e for e in seen if e["type"] == "response.function_call_arguments.done"]
        assert (args_done["name"], args_done["output_index"]) == ("get_weather", 1)
        assert fake.bodies[0]["tools"][0]["function"]["name"] == "get_weather"
        # the client runs the function and asks for the spoken follow-up
        ws.send_json({"type": "conversation.item.create", "item": {
            "type": "function_call_output", "call_id": "call_fake0", "output": '{"sky":"clear"}'}})
        ws.send_json({"type": "response.create", "response": {"tool_choice": "auto"}})
        done = receive_until(ws, "response.done", seen)
        assert done["response"]["status"] == "completed"
        audio = [e for e in seen[-40:] if e["type"] == "response.output_audio.delta"]
        assert audio and np.frombuffer(base64.b64decode(audio[0]["delta"]), "<i2").any()
        assert fake.bodies[1]["messages"][-1] == {"role": "tool", "tool_call_id": "call_fake0",
                                                  "content": '{"sky":"clear"}'}
        # an output for a call that does not exist is refused, naming the field
        ws.send_json({"type": "conversation.item.create", "item": {
            "type": "function_call_output", "call_id": "call_nope", "output": "x"}})
        err = ws.receive_json()
        assert err["type"] == "error" and err["error"]["param"] == "item.call_id"
    problems = [pr for e in seen for pr in strict_problems(e, "ga")]
    assert problems == []
    assert json.dumps(seen)  # all plain JSON


def test_tools_are_refused_with_the_embedded_model_and_named():
    conf = load_settings()
    engine = InProcessEngineClient("fakes:make_fake_core", {})
    with TestClient(create_app(conf, engine)) as client, \
            ready(client).websocket_connect("/v1/realtime") as ws:
        assert ws.receive_json()["type"] == "session.created"
        ws.send_json({"type": "session.update", "session": {"type": "realtime", "tools": [{
            "type": "function", "name": "get_weather"}]}})
        err = ws.receive_json()
        assert err["type"] == "error" and err["error"]["param"] == "session.tools"
        assert "embedded model" in err["error"]["message"]
        ws.send_json({"type": "conversation.item.create", "item": {
            "type": "function_call_output", "call_id": "c", "output": "x"}})
        err = ws.receive_json()
        assert err["type"] == "error" and err["error"]["param"] == "item.type"


def test_the_remote_first_token_time_is_in_metrics(server):
    fake, url = server
    with realtime_app(url) as client:
        with ready(client).websocket_connect("/v1/realtime") as ws:
            receive_until(ws, "session.created", [])
            ws.send_json({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "Hi"}]}})
            ws.send_json({"type": "response.create"})
            receive_until(ws, "response.done", [])
        text = client.get("/metrics").text
    count = [line for line in text.splitlines()
             if line.startswith("voxline_llm_first_token_seconds_count")]
    assert count and float(count[0].split()[-1]) == 1.0


# ------------------------------------------------------------------------------ SDK


async def test_the_sdk_runs_python_tools_and_the_answer_follows(server):
    import voxline
    from voxline.sessions import events as ev

    fake, url = server
    fake.plan += [Reply(text=[], calls=[("get_weather", ['{"city": "Paris", ', '"days": 2}'])]),
                  Reply(text=["Sunny in Paris ", "for two days."])]
    asked: list[tuple[str, int]] = []

    async def get_weather(city: str, days: int = 1) -> dict:
        """Weather for a city.

        More text the model does not need."""
        asked.append((city, days))
        return {"city": city, "sky": "sunny"}

    settings = load_settings(engine="inprocess", llm="openai:" + url, llm_model="fake-model")
    client = InProcessEngineClient("fake_openai:make_remote_core", {"url": url})
    await client.start()
    try:
        engine = voxline.Engine(settings, client=client)
        async with engine.session(tools=[get_weather], turn_detection=None) as call:
            await call.send_text("Weather in Paris for two days?")
            await call.respond()
            first = await call.wait_for(ev.ResponseDone, timeout=30 * TIME_FACTOR)
            assert [o.type for o in first.response.output] == ["message", "function_call"]
            second = await call.wait_for(ev.ResponseDone, timeout=30 * TIME_FACTOR)
        assert asked == [("Paris", 2)]
        assert second.response.status == "completed"
        assert second.response.output[0].content[0].transcript == "Sunny in Paris for two days."
        sent = fake.bodies[0]["tools"][0]["function"]
        assert sent == {"name": "get_weather", "description": "Weather for a city.",
                        "parameters": {"type": "object", "required": ["city"], "properties": {
                            "city": {"type": "string"}, "days": {"type": "integer"}}}}
        assert fake.bodies[1]["messages"][-1]["content"] == '{"city": "Paris", "sky": "sunny"}'
    finally:
        await client.close()


def test_tool_functions_become_schemas_or_clear_errors():
    from voxline.errors import ProtocolError
    from voxline.sdk.session import tool_schema

    def lookup(order_id: int, verbose: bool = False, note="") -> str:
        return ""

    assert tool_schema(lookup)["parameters"] == {"type": "object", "required": ["order_id"],
                                                 "properties": {"order_id": {"type": "integer"},
                                                                "verbose": {"type": "boolean"},
                                                                "note": {"type": "string"}}}

    def bad(when: complex) -> str:
        return ""

    with pytest.raises(ProtocolError, match="'when'"):
        tool_schema(bad)


def test_serve_refuses_a_bad_llm_spec_and_a_missing_model(capsys):
    from voxline.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["serve", "--llm", "ollama"])
    assert exc.value.code == 2 and "openai:<server url>" in capsys.readouterr().err
    assert main(["serve", "--llm", "openai:http://127.0.0.1:9/v1"]) == 1
    assert "needs --llm-model" in capsys.readouterr().err
