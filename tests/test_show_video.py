"""The reply model's `show_video` tool (voxline/sessions/show_video.py).

- the session actor with a scripted engine: the tool is offered only with a tool-calling
  model and a video model (and yields its name to a client or MCP tool); a call starts the
  video on the `response.video` path, answers the model with a function result at once,
  lets the calling response end and asks for a follow-up; bad arguments, a cancelled
  call, barge-in and response.cancel after the follow-up;
- end to end over `/v1/realtime`: a scripted OpenAI-compatible chat server on 127.0.0.1
  (tests/fake_openai.py) calls show_video; the client sees the video events, the model
  gets the function result in its next request, and the reply goes on.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from ws_events import until

from voxline.engines import protocol as ep
from voxline.engines.video_frames import makeable
from voxline.realtime.openai.client_events import parse_command
from voxline.sessions import events as ev
from voxline.sessions.actor import SessionActor
from voxline.sessions.settings import SessionSettings, TurnDetection
from voxline.sessions.show_video import TOOL_NAME, ToolArgumentError, video_params

STREAM = "stream_1"
ARGS = '{"prompt": "a train crossing the mountains", "width": 32, "height": 16, "seconds": 2}'


def actor(show_video_tool: bool = True, **settings: object) -> SessionActor:
    a = SessionActor("sess_1", STREAM, tools_supported=True, show_video_tool=show_video_tool,
                     settings=SessionSettings(**{"turn_detection": None, **settings}))
    a.start(0.0)
    a.take_events()
    return a


def tool_names(config: ep.StreamConfig) -> list[str]:
    return [t["function"]["name"] for t in config.tools]


def ask(a: SessionActor, now: float = 1.0) -> str:
    a.receive(parse_command({"type": "response.create"}), now)
    return a.response.response.id


def call(a: SessionActor, rid: str, arguments: str = ARGS, now: float = 1.2,
         completed: bool = True) -> None:
    """The model writes a show_video call in two pieces, then the engine ends it."""
    item = f"{a.response.item_id if a.response else 'item_x'}_call0"
    half = len(arguments) // 2
    for piece in (arguments[:half], arguments[half:]):
        a.on_engine(ep.FunctionCallDelta(STREAM, rid, item, 0, "call_1", TOOL_NAME, piece), now)
    a.on_engine(ep.FunctionCallDone(STREAM, rid, item, 0, "call_1", TOOL_NAME, arguments,
                                    completed), now)


def results(commands: list[ep.EngineInput]) -> list[dict]:
    """The function results the model was given (AddItem function_call_output)."""
    out = []
    for c in commands:
        if isinstance(c, ep.AddItem) and c.role == "function_call_output":
            body = json.loads(c.text)
            assert body["call_id"] == "call_1"
            out.append(json.loads(body["output"]))
    return out


def finish(a: SessionActor, rid: str, now: float) -> None:
    a.on_engine(ep.ResponseFinished(STREAM, rid, ep.ResponseStatus.COMPLETED, ""), now)
    a.tick(now)


def test_offered_only_with_a_video_model_and_a_tool_calling_model():
    a = actor()
    opened = next(c for c in a.take_commands() if isinstance(c, ep.OpenStream))
    assert tool_names(opened.config) == [TOOL_NAME]
    fn = opened.config.tools[0]["function"]
    assert fn["parameters"]["required"] == ["prompt"]
    assert set(fn["parameters"]["properties"]) == {"prompt", "width", "height", "seconds"}
    a.receive(parse_command({"type": "session.update", "session": {"type": "realtime", "tools": [
        {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]}}), 0.5)
    update = next(c for c in a.take_commands() if isinstance(c, ep.UpdateStream))
    assert tool_names(update.config) == ["get_weather", TOOL_NAME]

    plain = actor(show_video_tool=False)
    opened = next(c for c in plain.take_commands() if isinstance(c, ep.OpenStream))
    assert opened.config.tools == ()


def test_a_client_tool_named_show_video_keeps_its_name_and_runs_on_the_client():
    own = {"type": "function", "name": TOOL_NAME, "parameters": {"type": "object"}}
    a = actor(tools=(own,))
    opened = next(c for c in a.take_commands() if isinstance(c, ep.OpenStream))
    assert tool_names(opened.config) == [TOOL_NAME]
    assert "additionalProperties" not in opened.config.tools[0]["function"]["parameters"]
    rid = ask(a)
    a.take_commands(), a.take_events()
    call(a, rid)
    assert not [c for c in a.take_commands() if isinstance(c, ep.CreateVideo)]
    assert [e for e in a.take_events() if isinstance(e, ev.FunctionCallArgumentsDone)]


def test_a_call_starts_the_video_answers_the_model_and_the_reply_goes_on():
    a = actor()
    rid = ask(a)
    a.take_commands(), a.take_events()
    a.on_engine(ep.ReplyTextDelta(STREAM, rid, "Sure, look. "), 1.1)
    call(a, rid)
    commands, events = a.take_commands(), a.take_events()
    made = [c for c in commands if isinstance(c, ep.CreateVideo)]
    assert len(made) == 1
    cv = made[0]
    # 2 s at 24 fps is 49 frames: rounded up to 65, a length the model makes exactly
    assert (cv.prompt, cv.width, cv.height, cv.num_frames) == (
        "a train crossing the mountains", 32, 16, 65)
    started = [e for e in events if isinstance(e, ev.VideoStarted)]
    assert [(e.response_id, e.video_id, e.fps, e.num_frames) for e in started] == [
        (rid, cv.video_id, 24, 65)]
    assert results(commands) == [{"status": "rendering", "video_id": cv.video_id, "width": 32,
                                  "height": 16, "seconds": 2.67}]
    # the tool runs on the server: the client sees no function_call item for it
    assert not [e for e in events if isinstance(e, ev.FunctionCallArgumentsDelta
                                                | ev.FunctionCallArgumentsDone
                                                | ev.OutputItemAdded)]

    finish(a, rid, 1.5)  # the calling response ends; its video does not hold it
    out, commands = a.take_events(), a.take_commands()
    done = next(e for e in out if isinstance(e, ev.ResponseDone))
    assert done.response.id == rid and done.response.status == "completed"
    assert [o.type for o in done.response.output] == ["message"]
    follow = [c for c in commands if isinstance(c, ep.CreateResponse)]
    assert len(follow) == 1 and a.response is not None and a.response.response.id != rid
    assert [type(e) for e in out].index(ev.ResponseDone) < [type(e) for e in out].index(
        ev.ResponseCreated)
    follow_id = a.response.response.id

    pixels = np.zeros((33, 16, 32, 3), np.uint8).tobytes()
    a.on_engine(ep.VideoChunk(STREAM, cv.video_id, pixels, 33, 16, 32, 0, 2, False), 1.6)
    a.on_engine(ep.ReplyTextDelta(STREAM, follow_id, "Here is the train."), 1.7)
    a.on_engine(ep.VideoChunk(STREAM, cv.video_id, pixels, 32, 16, 32, 1, 2, True), 1.8)
    a.on_engine(ep.VideoDone(STREAM, cv.video_id, ep.ResponseStatus.COMPLETED), 1.9)
    finish(a, follow_id, 2.0)
    out = a.take_events()
    assert [(c.response_id, c.index) for c in out if isinstance(c, ev.VideoChunk)] == [
        (rid, 0), (rid, 1)]
    assert [(d.response_id, d.status) for d in out if isinstance(d, ev.VideoDone)] == [
        (rid, "completed")]
    said = next(e for e in out if isinstance(e, ev.AudioTranscriptDone))
    assert (said.response_id, said.transcript) == (follow_id, "Here is the train.")
    assert next(e for e in out if isinstance(e, ev.ResponseDone)).response.status == "completed"
    assert a.response is None and not a.take_commands()  # no second follow-up


@pytest.mark.parametrize(("arguments", "words"), [
    ("not json", "not JSON"),
    ('{"width": 32}', "'prompt'"),
    ('{"prompt": "x", "fps": 60}', "unknown argument 'fps'"),
    ('{"prompt": "x", "seconds": 90}', "'seconds' must be"),
    ('{"prompt": "x", "width": "big"}', "'width' must be a number"),
])
def test_arguments_it_cannot_use_are_answered_with_the_reason_and_no_video(arguments, words):
    a = actor()
    rid = ask(a)
    a.take_commands(), a.take_events()
    call(a, rid, arguments)
    commands = a.take_commands()
    assert not [c for c in commands if isinstance(c, ep.CreateVideo)]
    [result] = results(commands)
    assert result["status"] == "error" and words in result["error"], result
    assert not [e for e in a.take_events() if isinstance(e, ev.VideoStarted)]
    finish(a, rid, 1.5)  # the model is asked again, to say what went wrong
    assert [c for c in a.take_commands() if isinstance(c, ep.CreateResponse)]


def test_a_call_in_a_cancelled_reply_starts_nothing_and_asks_no_follow_up():
    a = actor()
    rid = ask(a)
    a.receive(parse_command({"type": "response.cancel"}), 1.1)
    a.take_commands(), a.take_events()
    call(a, rid)
    commands = a.take_commands()
    assert not [c for c in commands if isinstance(c, ep.CreateVideo)]
    assert [r["status"] for r in results(commands)] == ["cancelled"]
    a.on_engine(ep.ResponseFinished(STREAM, rid, ep.ResponseStatus.CANCELLED, ""), 1.3)
    a.tick(1.4)
    assert a.response is None and not [c for c in a.take_commands()
                                       if isinstance(c, ep.CreateResponse)]


def test_a_cut_off_call_is_not_answered():
    a = actor()
    rid = ask(a)
    a.take_commands()
    call(a, rid, completed=False)
    assert a.take_commands() == []


def _video_after_the_follow_up(a: SessionActor) -> ep.CreateVideo:
    rid = ask(a)
    call(a, rid)
    cv = next(c for c in a.take_commands() if isinstance(c, ep.CreateVideo))
    finish(a, rid, 1.5)
    follow = a.response.response.id
    finish(a, follow, 1.6)
    assert a.response is None and a.video.active is not None
    a.take_events(), a.take_commands()
    return cv


def test_response_cancel_stops_a_video_that_outlived_its_response():
    a = actor()
    cv = _video_after_the_follow_up(a)
    a.receive(parse_command({"type": "response.cancel"}), 2.0)
    assert ep.CancelVideo(STREAM, cv.video_id) in a.take_commands()
    out = a.take_events()
    assert [(d.video_id, d.status) for d in out if isinstance(d, ev.VideoDone)] == [
        (cv.video_id, "cancelled")]
    assert not [e for e in out if isinstance(e, ev.ErrorEvent)]
    a.receive(parse_command({"type": "response.cancel"}), 2.1)  # nothing left to cancel
    assert [e.error.code for e in a.take_events() if isinstance(e, ev.ErrorEvent)] == [
        "response_cancel_not_active"]


def test_barge_in_stops_a_video_that_outlived_its_response():
    a = actor(turn_detection=TurnDetection(type="server_vad"))
    cv = _video_after_the_follow_up(a)
    a.on_engine(ep.VoiceStarted(STREAM, 2000, "item_user"), 2.0)
    assert ep.CancelVideo(STREAM, cv.video_id) in a.take_commands()
    assert [d.status for d in a.take_events() if isinstance(d, ev.VideoDone)] == ["cancelled"]


def test_a_second_call_steers_the_video_on_screen_instead_of_restarting_it():
    a = actor()
    first = _video_after_the_follow_up(a)
    assert first.realtime and first.steps_per_stage is None  # the server's real-time steps
    rid = ask(a, 3.0)
    a.take_commands(), a.take_events()
    call(a, rid, '{"prompt": "a red cat", "width": 640}', now=3.1)
    commands, out = a.take_commands(), a.take_events()
    assert ep.SteerVideo(STREAM, first.video_id, "a red cat") in commands
    assert not [c for c in commands if isinstance(c, ep.CreateVideo | ep.CancelVideo)]
    assert [(u.video_id, u.prompt) for u in out if isinstance(u, ev.VideoUpdated)] == [
        (first.video_id, "a red cat")]
    assert not [d for d in out if isinstance(d, ev.VideoDone)]
    # the model is told the video it steered keeps its size and length
    assert results(commands) == [{"status": "steered", "video_id": first.video_id,
                                  "width": 32, "height": 16, "seconds": 2.67,
                                  "note": "the video on screen changes to the new prompt "
                                          "from its next chunk; its size and length stay"}]


def test_a_call_after_the_video_ended_starts_a_new_one():
    a = actor()
    first = _video_after_the_follow_up(a)
    a.on_engine(ep.VideoDone(STREAM, first.video_id, ep.ResponseStatus.COMPLETED), 2.0)
    rid = ask(a, 3.0)
    a.take_commands(), a.take_events()
    call(a, rid, '{"prompt": "a red cat"}', now=3.1)
    second = next(c for c in a.take_commands() if isinstance(c, ep.CreateVideo))
    assert second.video_id != first.video_id and second.prompt == "a red cat"
    # the defaults: response.video's size, 4 s at 24 fps (97 frames, exact for the model)
    assert (second.width, second.height, second.num_frames) == (640, 384, 97)


def test_sizes_round_to_the_model_multiple_and_seconds_up_to_an_exact_length():
    p = video_params('{"prompt": " dogs ", "width": 500, "height": 1, "seconds": 1}')
    assert (p.prompt, p.width, p.height, p.num_frames, p.fps) == ("dogs", 496, 16, 33, 24)
    longest = video_params('{"prompt": "x", "seconds": 20}').num_frames  # 481 asked
    assert longest == 493 and makeable(longest) and not makeable(481)
    with pytest.raises(ToolArgumentError, match="'height' must be"):
        video_params('{"prompt": "x", "height": 5000}')

# ------------------------------------------------------------------------ end to end


class RequestSizedRender:
    """Two chunks of 3 frames at the requested size (a stand-in for the video model)."""

    total_chunks = 2

    def __init__(self, msg: ep.CreateVideo) -> None:
        self.shape = (3, msg.height, msg.width, 3)
        self.made = 0

    @property
    def finished(self) -> bool:
        return self.made >= self.total_chunks

    def denoise_next(self):
        from fakes import OnePieceDecode

        self.made += 1
        return OnePieceDecode(np.full(self.shape, 40 * self.made, np.uint8))


class RequestSizedVideoModel:
    decode_ahead = 1

    def begin_video(self, msg: ep.CreateVideo) -> RequestSizedRender:
        return RequestSizedRender(msg)


def make_remote_video_core(wake, url: str):
    """Core spec ``test_show_video:make_remote_video_core``: the scripted chat server as the
    reply model, tests/fakes.py's VAD, ASR and TTS, and the stand-in video model."""
    from fakes import EnergyVAD, FixedASR, ToneTTS

    from voxline.engines.core import EngineCore, Models
    from voxline.engines.remote_llm import RemoteChat, RemoteLLMConfig
    from voxline.engines.speech_model import SentenceSpeechModel

    chat = RemoteChat(RemoteLLMConfig(url, "fake-model", api_key="sk-test", timeout=5.0,
                                      retries=1, retry_backoff=0.05))
    return EngineCore(Models(EnergyVAD(), FixedASR(), chat,  # type: ignore[arg-type]
                             SentenceSpeechModel(ToneTTS()),
                             stages={"video": RequestSizedVideoModel()}),
                      wake)


def test_a_remote_model_calls_show_video_over_the_realtime_websocket():
    from fake_openai import Reply, fake_openai
    from starlette.testclient import TestClient
    from test_remote_llm import ready

    from voxline.config import load_settings
    from voxline.engines.client import InProcessEngineClient
    from voxline.realtime.app import create_app

    with fake_openai() as (fake, url):
        fake.plan.append(Reply(text=["Sure, ", "look. "], calls=[(TOOL_NAME, [
            '{"prompt": "a train crossing ', 'the mountains", "width": 32, "height": 16}'])]))
        fake.plan.append(Reply(text=["Here is ", "the train."]))
        # the app reads only that a video model is configured; the core's stand-in serves it
        conf = load_settings(llm="openai:" + url, llm_model="fake-model",
                             video="helios:/configured-for-the-app-only")
        engine = InProcessEngineClient("test_show_video:make_remote_video_core", {"url": url})
        seen: list[dict] = []
        with TestClient(create_app(conf, engine)) as client, \
                ready(client).websocket_connect("/v1/realtime") as ws:
            until(ws, "session.created", seen)
            ws.send_json({"type": "session.update", "session": {
                "type": "realtime", "audio": {"input": {"turn_detection": None}}}})
            until(ws, "session.updated", seen)
            ws.send_json({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "Show me a train."}]}})
            ws.send_json({"type": "response.create"})
            first = until(ws, "response.done", seen)
            follow = until(ws, "response.done", seen)
            if not any(e["type"] == "response.output_video.done" for e in seen):
                until(ws, "response.output_video.done", seen)
            video_id = next(e for e in seen
                            if e["type"] == "response.output_video.started")["video_id"]
            meta = client.get(f"/v1/videos/{video_id}").json()  # the WebSocket's MP4

    types = [e["type"] for e in seen]
    started = next(e for e in seen if e["type"] == "response.output_video.started")
    assert (started["response_id"], started["width"], started["height"], started["fps"],
            started["num_frames"], started["prompt"]) == (
        first["response"]["id"], 32, 16, 24, 97, "a train crossing the mountains")
    assert [e["index"] for e in seen if e["type"] == "response.output_video.chunk"] == [0, 1]
    done = next(e for e in seen if e["type"] == "response.output_video.done")
    assert (done["video_id"], done["status"]) == (video_id, "completed")
    assert meta["status"] == "completed" and meta["size"] == "32x16"
    # the calling reply ended without waiting for the video, and the model went on talking
    assert types.index("response.output_video.started") < types.index("response.done")
    assert first["response"]["status"] == follow["response"]["status"] == "completed"
    assert [o["type"] for o in first["response"]["output"]] == ["message"]
    assert follow["response"]["output"][0]["content"][0]["transcript"] == "Here is the train."
    # the tool runs on the server: the client is shown no function_call to run
    assert not [e for e in seen if e["type"].startswith("response.function_call")]
    assert not [e for e in seen if e.get("item", {}).get("type") == "function_call"]

    first_body, second_body = fake.bodies
    assert [t["function"]["name"] for t in first_body["tools"]] == [TOOL_NAME]
    assert "prompt" in first_body["tools"][0]["function"]["parameters"]["properties"]
    call_message, result_message = second_body["messages"][-2:]
    assert call_message["tool_calls"][0]["function"]["name"] == TOOL_NAME
    assert result_message["role"] == "tool" and result_message["tool_call_id"] == "call_fake0"
    assert json.loads(result_message["content"]) == {
        "status": "rendering", "video_id": video_id, "width": 32, "height": 16, "seconds": 4.0}


def test_no_video_model_no_show_video_tool():
    from fake_openai import fake_openai
    from starlette.testclient import TestClient
    from test_remote_llm import ready

    from voxline.config import load_settings
    from voxline.engines.client import InProcessEngineClient
    from voxline.realtime.app import create_app

    with fake_openai() as (fake, url):
        conf = load_settings(llm="openai:" + url, llm_model="fake-model")
        engine = InProcessEngineClient("test_show_video:make_remote_video_core", {"url": url})
        seen: list[dict] = []
        with TestClient(create_app(conf, engine)) as client, \
                ready(client).websocket_connect("/v1/realtime") as ws:
            until(ws, "session.created", seen)
            ws.send_json({"type": "response.create"})
            until(ws, "response.done", seen)
    assert "tools" not in fake.bodies[0] or not fake.bodies[0]["tools"]
