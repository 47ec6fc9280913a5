"""voxline with its reply model on a REAL OpenAI-compatible server: llama.cpp's server
(llama-cpp-python[server], cached venv) serving the shipped SmolLM2 GGUF on loopback,
behind a TCP relay that shows what voxline sends it and when voxline hangs up (slow).

Spoken turns, barge-in aborting the HTTP stream, truncation reaching the next request, the
server dying mid-reply, and a forced tool call whose arguments stream back as deltas,
followed by its output and a spoken answer. The fast twin is tests/test_remote_llm.py.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from conftest import TIME_FACTOR
from live_server import live_server
from llama_server import MODEL_ALIAS, LlamaServer, Relay
from openai_types import strict_problems
from test_realtime_e2e import Conn, open_conn, spoken

from voxline.codecs.pcm import float_to_pcm16

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    server = LlamaServer(tmp_path_factory.mktemp("llama") / "server.log")
    server.start()
    relay = Relay(server.port)
    yield server, relay
    relay.close()
    server.stop()


@pytest.fixture(scope="module")
def voxline(llama):
    _, relay = llama
    with live_server(llm="openai:" + relay.url, llm_model=MODEL_ALIAS, llm_timeout=20.0,
                     llm_retries=1) as base:
        yield base


def text_item(text: str) -> dict:
    return {"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


async def response_done(c: Conn, timeout: float = 180.0) -> dict:
    return (await c.until_type("response.done", timeout))["response"]


async def test_a_spoken_turn_is_answered_by_the_llamacpp_server(voxline, llama):
    _, relay = llama
    before = len(relay.chat_requests())
    ws, c = await open_conn(voxline)
    try:
        await c.send(type="session.update", session={
            "type": "realtime", "instructions": "Answer in one short sentence.",
            "audio": {"input": {"transcription": {"model": "moonshine-base-en"},
                                "turn_detection": {"type": "server_vad"}}}})
        await c.append(float_to_pcm16(spoken("What is the capital of France?")))
        done = await response_done(c)
        assert done["status"] == "completed", done
        transcript = done["output"][0]["content"][0]["transcript"]
        assert transcript and done["usage"]["output_tokens"] > 0
        assert c.of("response.output_audio.delta")
        heard = c.of("conversation.item.input_audio_transcription.completed")[0]["transcript"]
        assert "capital" in heard.lower()
        request = relay.chat_requests()[before]
        assert request["model"] == MODEL_ALIAS and request["stream"] is True
        assert request["messages"][0] == {"role": "system",
                                          "content": "Answer in one short sentence."}
        assert request["messages"][-1] == {"role": "user", "content": heard}
        assert [p for e in c.events for p in strict_problems(e, "ga")] == []
    finally:
        await ws.close()
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(voxline + "/metrics")).text
    count = next(line for line in metrics.splitlines()
                 if line.startswith("voxline_llm_first_token_seconds_count"))
    assert float(count.split()[-1]) >= 1


async def test_barge_in_aborts_the_stream_and_the_next_request_holds_what_was_heard(voxline,
                                                                                    llama):
    _, relay = llama
    relay.client_hung_up.clear()
    ws, c = await open_conn(voxline)
    try:
        # the answer to the interruption is capped: a story told in full now plays to its
        # end at real time (flow control), where it used to be cut at the 300 s pacer bound
        await c.send(type="session.update", session={
            "type": "realtime", "instructions": "You tell long, detailed stories.",
            "max_output_tokens": 60,
            "audio": {"input": {"turn_detection": {"type": "server_vad"}}}})
        await c.send(**text_item("Tell me a very long story about a dragon and a knight."))
        await c.send(type="response.create", response={"max_output_tokens": 1500})
        first = await c.until_type("response.output_audio.delta")
        # talk over the reply while the server is still writing it
        await c.append(float_to_pcm16(spoken("Stop, wait a moment please.", lead_s=0.0)))
        done = await c.until(lambda e: e["type"] == "response.done"
                             and e["response"]["id"] == first["response_id"])
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        assert await asyncio.to_thread(relay.client_hung_up.wait, 10 * TIME_FACTOR), \
            "voxline did not close the llama.cpp stream on barge-in"
        trunc = await c.until_type("conversation.item.truncated")
        assert trunc["item_id"] == first["item_id"]
        # the interruption is answered; that request carries the story as it was heard
        await c.until(lambda e: e["type"] == "response.done"
                      and e["response"]["id"] != first["response_id"], timeout=180)
        await c.send(type="conversation.item.retrieve", item_id=first["item_id"])
        heard = (await c.until_type("conversation.item.retrieved"))["item"]["content"][0]
        full = done["response"]["output"][0]["content"][0]["transcript"]
        assert len(heard["transcript"]) < len(full)
        story = [r for r in relay.chat_requests()
                 if any("dragon" in str(m.get("content")) for m in r["messages"])]
        follow_up = story[-1]["messages"]
        assert {"role": "assistant", "content": heard["transcript"]} in follow_up
        assert not any(m["role"] == "assistant" and m["content"] == full for m in follow_up)
    finally:
        await ws.close()


async def test_a_forced_tool_call_streams_its_arguments_then_the_answer_is_spoken(voxline, llama):
    _, relay = llama
    ws, c = await open_conn(voxline)
    try:
        await c.send(type="session.update", session={
            "type": "realtime", "tools": [WEATHER],
            "audio": {"input": {"turn_detection": None}}})
        await c.until_type("session.updated")
        await c.send(**text_item("What is the weather like in Paris?"))
        await c.send(type="response.create", response={
            "tool_choice": {"type": "function", "name": "get_weather"}})
        done = await response_done(c)
        assert done["status"] == "completed", done
        call, = [o for o in done["output"] if o["type"] == "function_call"]
        deltas = [e["delta"] for e in c.of("response.function_call_arguments.delta")]
        assert len(deltas) >= 2, deltas  # the arguments arrive as they are written
        args_done, = c.of("response.function_call_arguments.done")
        assert "".join(deltas) == args_done["arguments"] == call["arguments"]
        assert isinstance(json.loads(call["arguments"]).get("city"), str)  # grammar-forced
        assert call["name"] == "get_weather" and call["call_id"]
        sent = relay.chat_requests()[-1]
        assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
        assert sent["tools"][0]["function"]["name"] == "get_weather"
        # the client runs the function; its output goes back and the answer is spoken
        await c.send(type="conversation.item.create", item={
            "type": "function_call_output", "call_id": call["call_id"],
            "output": json.dumps({"city": "Paris", "sky": "sunny", "celsius": 24})})
        await c.send(type="response.create", response={"tool_choice": "none"})
        follow = await response_done(c)
        assert follow["status"] == "completed", follow
        assert follow["output"][0]["content"][0]["transcript"]
        assert [e for e in c.events if e["type"] == "response.output_audio.delta"
                and e["response_id"] == follow["id"]]
        messages = relay.chat_requests()[-1]["messages"]
        assert messages[-2]["tool_calls"][0]["id"] == call["call_id"]
        assert messages[-1] == {"role": "tool", "tool_call_id": call["call_id"],
                                "content": json.dumps({"city": "Paris", "sky": "sunny",
                                                       "celsius": 24})}
        assert [p for e in c.events for p in strict_problems(e, "ga")] == []
    finally:
        await ws.close()


async def test_the_server_dying_mid_reply_is_an_error_and_the_session_goes_on(voxline, llama):
    server, _ = llama
    ws, c = await open_conn(voxline)
    try:
        await c.send(type="session.update", session={
            "type": "realtime", "instructions": "You tell long, detailed stories.",
            "audio": {"input": {"turn_detection": None}}})
        await c.send(**text_item("Tell me a very long story about the sea."))
        await c.send(type="response.create", response={"max_output_tokens": 1500})
        await c.until_type("response.output_audio_transcript.delta")
        await asyncio.to_thread(server.kill)
        error = await c.until_type("error")
        assert error["error"]["code"] == "llm_backend_error"
        assert "failed" in error["error"]["message"]
        done = await response_done(c)
        assert done["status"] == "failed"
        # the server comes back; the same session's next turn works
        await asyncio.to_thread(server.start)
        await c.send(**text_item("Say hello."))
        await c.send(type="response.create", response={"max_output_tokens": 30})
        again = await response_done(c)
        assert again["status"] in ("completed", "incomplete"), again
        assert again["output"][0]["content"][0]["transcript"]
    finally:
        await ws.close()
