"""Image input: `input_image` parts of user messages kept as sent, validated and bounded,
given to a remote reply model (tests/fake_openai.py records the request bodies) as Chat
Completions image content, and refused clearly by the embedded text-only model."""

from __future__ import annotations

import base64
import gc

import pytest
from fake_openai import fake_openai
from openai_types import strict_problems
from starlette.testclient import TestClient
from test_remote_llm import ready, realtime_app, receive_until

from voxline.config import load_settings
from voxline.engines import protocol as ep
from voxline.engines.client import InProcessEngineClient
from voxline.engines.conversation import Conversation
from voxline.engines.remote_llm import RemoteChat, RemoteLLMConfig, chat_messages
from voxline.errors import ProtocolError
from voxline.realtime.app import create_app
from voxline.sessions.images import ImageLimits, engine_images, image_data_url, sniff_mime
from voxline.sessions.items import ContentPart

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(40)
JPEG = b"\xff\xd8\xff\xe0" + bytes(40)
WEBP = b"RIFF\x10\x00\x00\x00WEBPVP8 " + bytes(20)
GIF = b"GIF89a" + bytes(20)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{b64(data)}"


# ------------------------------------------------------------------------- validation


@pytest.mark.parametrize("data,mime", [(PNG, "image/png"), (JPEG, "image/jpeg"),
                                       (WEBP, "image/webp"), (GIF, "image/gif")])
def test_each_accepted_type_passes_as_sent_and_bare_base64_gets_its_type(data, mime):
    assert sniff_mime(data) == mime
    assert image_data_url(data_url(data, mime), "p", 1 << 20) == data_url(data, mime)
    assert image_data_url(b64(data), "p", 1 << 20) == data_url(data, mime)


@pytest.mark.parametrize("url,says", [
    (data_url(PNG, "image/tiff"), "image type 'image/tiff' is not supported"),
    ("data:image/png;base64,@@@@", "not valid base64"),
    ("data:image/png,abc", "a data URL must read"),
    (data_url(JPEG, "image/png"), "says image/png but the data is image/jpeg"),
    (data_url(b"hello world!"), "not a PNG, JPEG, WebP or GIF"),
    ("https://example.com/cat.png", "image URLs are not fetched"),
    ("data:image/png;base64,", "the image is empty"),
    (data_url(PNG + bytes(100)), "larger than the limit of 64 bytes (max_image_bytes)"),
])
def test_a_bad_image_is_refused_naming_the_field(url, says):
    with pytest.raises(ProtocolError) as err:
        image_data_url(url, "item.content[0].image_url", 64)
    assert says in str(err.value)
    assert str(err.value).startswith("conversation.item.create: ")
    assert (err.value.code, err.value.param) == ("invalid_value", "item.content[0].image_url")


def test_images_carry_detail_and_offset_and_the_count_is_per_session():
    parts = [ContentPart(type="input_text", text="Look: "),
             ContentPart(type="input_image", image_url=data_url(PNG), detail="low"),
             ContentPart(type="input_text", text="and "),
             ContentPart(type="input_image", image_url=b64(GIF))]
    limits = ImageLimits(max_bytes=1 << 20, max_count=3)
    images = engine_images(parts, limits, accepted=0)
    assert images == (ep.ImageInput(data_url(PNG), "low", 6),
                      ep.ImageInput(data_url(GIF, "image/gif"), None, 10))
    with pytest.raises(ProtocolError) as err:
        engine_images(parts, limits, accepted=2)  # the second would be the session's 4th
    assert err.value.param == "item.content[3]" and "at most 3 images" in str(err.value)
    assert "max_session_images" in str(err.value)
    with pytest.raises(ProtocolError) as err:
        engine_images(parts, None, accepted=0)
    assert (err.value.code, err.value.param) == ("invalid_value", "item.content[1]")
    assert "embedded text-only model" in str(err.value)


# ---------------------------------------------------------------- the remote chat form


def test_images_read_back_as_chat_image_parts_in_order_and_leave_with_their_message():
    chat = RemoteChat(RemoteLLMConfig("http://127.0.0.1:1/v1", "m"))
    conv = Conversation(chat.render_message)
    conv.add("u1", "user", "What is this? And this?", images=(
        ep.ImageInput(data_url(PNG), "high", 13), ep.ImageInput(data_url(JPEG), None, 23)))
    conv.add("u2", "user", "plain text")
    messages = chat_messages(conv.render([]), chat.images)
    assert messages == [
        {"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": data_url(PNG), "detail": "high"}},
            {"type": "text", "text": " And this?"},
            {"type": "image_url", "image_url": {"url": data_url(JPEG)}}]},
        {"role": "user", "content": "plain text"}]
    assert chat.decode(conv.render([])) == "What is this? And this?plain text"
    conv.delete("u1")
    gc.collect()
    assert len(chat.images) == 0  # nothing held for a deleted message


# ------------------------------------------------------------------ over /v1/realtime


def create_item(ws, content: list[dict], item_id: str | None = None) -> None:
    item = {"type": "message", "role": "user", "content": content}
    ws.send_json({"type": "conversation.item.create",
                  "item": {**item, "id": item_id} if item_id else item})


def test_an_image_reaches_the_remote_model_as_chat_image_content_and_reads_back_as_sent():
    sent = [{"type": "input_text", "text": "What is in the picture?"},
            {"type": "input_image", "image_url": data_url(PNG), "detail": "low"},
            {"type": "input_image", "image_url": b64(JPEG)}]
    seen: list[dict] = []
    with fake_openai() as (fake, url), realtime_app(url) as client, \
            ready(client).websocket_connect("/v1/realtime") as ws:
        receive_until(ws, "session.created", seen)
        create_item(ws, sent, "item_img")
        added = receive_until(ws, "conversation.item.added", seen)
        assert added["item"]["content"] == sent
        ws.send_json({"type": "conversation.item.retrieve", "item_id": "item_img"})
        retrieved = receive_until(ws, "conversation.item.retrieved", seen)
        assert retrieved["item"]["content"] == sent
        ws.send_json({"type": "response.create"})
        done = receive_until(ws, "response.done", seen)
        assert done["response"]["status"] == "completed"
    user = fake.bodies[0]["messages"][-1]
    assert user == {"role": "user", "content": [
        {"type": "text", "text": "What is in the picture?"},
        {"type": "image_url", "image_url": {"url": data_url(PNG), "detail": "low"}},
        {"type": "image_url", "image_url": {"url": data_url(JPEG, "image/jpeg")}}]}
    problems = [pr for e in seen for pr in strict_problems(e, "ga")]
    assert problems == []


def test_images_past_the_bounds_are_refused_naming_the_limit_and_the_session_goes_on():
    seen: list[dict] = []
    with fake_openai() as (fake, url), \
            realtime_app(url, max_session_images=1, max_image_bytes=len(PNG)) as client, \
            ready(client).websocket_connect("/v1/realtime") as ws:
        receive_until(ws, "session.created", seen)
        create_item(ws, [{"type": "input_image", "image_url": data_url(PNG + b"x")}])
        err = ws.receive_json()["error"]
        assert err["param"] == "item.content[0].image_url" and "max_image_bytes" in err["message"]
        create_item(ws, [{"type": "input_image", "image_url": data_url(PNG)}], "ok")
        receive_until(ws, "conversation.item.done", seen)
        create_item(ws, [{"type": "input_text", "text": "and"},
                         {"type": "input_image", "image_url": data_url(PNG)}], "second")
        err = ws.receive_json()["error"]
        assert (err["code"], err["param"]) == ("invalid_value", "item.content[1]")
        assert "at most 1 images (max_session_images)" in err["message"]
        ws.send_json({"type": "conversation.item.retrieve", "item_id": "second"})
        assert ws.receive_json()["type"] == "error"  # the refused item was not kept
        ws.send_json({"type": "response.create"})
        assert receive_until(ws, "response.done", seen)["response"]["status"] == "completed"
    assert [m["role"] for m in fake.bodies[0]["messages"]] == ["system", "user"]


def test_the_embedded_model_refuses_an_image_clearly_and_keeps_the_session():
    engine = InProcessEngineClient("fakes:make_fake_core", {})
    with TestClient(create_app(load_settings(), engine)) as client, \
            ready(client).websocket_connect("/v1/realtime") as ws:
        assert ws.receive_json()["type"] == "session.created"
        create_item(ws, [{"type": "input_text", "text": "see"},
                         {"type": "input_image", "image_url": data_url(PNG)}], "img")
        event = ws.receive_json()
        assert event["type"] == "error"
        err = event["error"]
        assert (err["code"], err["param"]) == ("invalid_value", "item.content[1]")
        assert err["message"].startswith("conversation.item.create: image input")
        assert "--llm openai:" in err["message"]
        create_item(ws, [{"type": "input_text", "text": "hello"}], "txt")
        assert ws.receive_json()["type"] == "conversation.item.added"  # the session lives on
