"""`/v1/videos` over the app, on an in-process engine whose video model is the tiny Helios
checkpoint loaded through the `video` setting (the other stages are the fakes)."""

from __future__ import annotations

import asyncio
import io

import httpx
import pytest
import pytest_asyncio

pytest.importorskip("diffusers")

from fakes import CountingLM, EnergyVAD, FixedASR, ToneTTS  # noqa: E402

from voxline.config import Settings  # noqa: E402
from voxline.engines.client import InProcessEngineClient  # noqa: E402
from voxline.realtime.app import create_app  # noqa: E402
from voxline.realtime.http.videos import video_store  # noqa: E402

pytestmark = pytest.mark.asyncio(loop_scope="module")

TINY = {"width": 16, "height": 16, "num_inference_steps": 2, "guidance_scale": 1.0, "seed": 5}


def make_video_core(wake, video_dir: str, max_videos: int = 4):
    """Core spec ``test_video_api:make_video_core``: fakes plus the real Helios loading."""
    import torch

    from voxline.engines.core import EngineCore, Models
    from voxline.engines.speech_model import SentenceSpeechModel
    from voxline.engines.stage_registry import load_video

    torch.set_num_threads(1)  # tiny tensors: threads only contend on a shared machine
    video = load_video(Settings(video=f"helios:{video_dir}"))
    return EngineCore(Models(EnergyVAD(), FixedASR(), CountingLM(),
                             SentenceSpeechModel(ToneTTS()), stages={"video": video}), wake,
                      max_videos=max_videos)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app(tmp_path_factory):
    import torch
    from tiny_helios import save_tiny_helios

    threads = torch.get_num_threads()  # the core sets 1; given back after the module
    video_dir = save_tiny_helios(tmp_path_factory.mktemp("helios"))
    engine = InProcessEngineClient("test_video_api:make_video_core",
                                   {"video_dir": str(video_dir)})
    await engine.start()
    yield create_app(Settings(), engine, manage_engine=False)
    await engine.close()
    torch.set_num_threads(threads)


@pytest_asyncio.fixture(loop_scope="module")
async def client(app):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test",
                                 timeout=60) as c:
        yield c


async def wait_done(client: httpx.AsyncClient, video_id: str) -> dict:
    for _ in range(600):
        body = (await client.get(f"/v1/videos/{video_id}")).json()
        if body["status"] in ("completed", "failed"):
            return body
        await asyncio.sleep(0.1)
    raise AssertionError(f"video {video_id} did not finish: {body}")


async def test_lifecycle_create_poll_content_list_delete(client, app):
    import av

    created = (await client.post("/v1/videos", json={"prompt": "dance monkey",
                                                     "num_frames": 65, "fps": 16, **TINY}))
    assert created.status_code == 200, created.text
    video = created.json()
    assert (video["object"], video["status"], video["size"]) == ("video", "queued", "16x16")
    done = await wait_done(client, video["id"])
    assert (done["status"], done["progress"], done["error"]) == ("completed", 100, None)
    assert done["completed_at"] >= done["created_at"]

    content = await client.get(f"/v1/videos/{video['id']}/content")
    assert content.status_code == 200 and content.headers["content-type"] == "video/mp4"
    with av.open(io.BytesIO(content.content)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 65 and frames[0].shape == (16, 16, 3)

    listed = (await client.get("/v1/videos")).json()
    assert video["id"] in [v["id"] for v in listed["data"]]
    path = app.state.videos.videos[video["id"]].path
    assert path.exists()
    deleted = await client.delete(f"/v1/videos/{video['id']}")
    assert deleted.json() == {"id": video["id"], "object": "video.deleted", "deleted": True}
    assert not path.exists()  # gone from disk
    assert (await client.get(f"/v1/videos/{video['id']}")).status_code == 404


async def test_a_frame_count_the_model_cannot_make_fails_naming_it(client):
    video = (await client.post("/v1/videos", json={"prompt": "dance monkey",
                                                   "num_frames": 66, **TINY})).json()
    done = await wait_done(client, video["id"])
    assert done["status"] == "failed"
    assert "CreateVideo.num_frames: 66" in done["error"]["message"]
    assert (await client.get(f"/v1/videos/{video['id']}/content")).status_code == 404


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "width": 20, "height": 16}, "width"),
    ({"prompt": "x", "size": "100x64"}, "size"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": "x", "num_inference_steps": 0}, "num_inference_steps"),
    ({"prompt": "x", "colour": "red"}, "colour"),
    ({"width": 16}, "prompt"),
])
async def test_bad_input_is_a_400_naming_the_field_and_keeps_nothing(client, app, body, param):
    before = set(getattr(app.state, "videos", None).videos
                 if getattr(app.state, "videos", None) else ())
    response = await client.post("/v1/videos", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    after = set(app.state.videos.videos) if getattr(app.state, "videos", None) else set()
    assert after == before


async def test_the_openai_sdk_creates_polls_and_downloads(app):
    from openai import AsyncOpenAI

    http = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test")
    sdk = AsyncOpenAI(api_key="none", base_url="http://test/v1", http_client=http)
    try:
        video = await sdk.videos.create(prompt="dance monkey", size="16x16",  # type: ignore[arg-type]
                                        extra_body={k: str(v) for k, v in TINY.items()
                                                    if k not in ("width", "height")})
        assert video.status == "queued" and video.size == "16x16"
        for _ in range(600):
            video = await sdk.videos.retrieve(video.id)
            if video.status in ("completed", "failed"):
                break
            await asyncio.sleep(0.1)
        assert video.status == "completed", video.error
        content = await sdk.videos.download_content(video.id)
        assert (await content.aread())[4:8] == b"ftyp"  # an MP4
        listed = await sdk.videos.list()
        assert video.id in [v.id for v in listed.data]
        deleted = await sdk.videos.delete(video.id)
        assert deleted.deleted
    finally:
        await sdk.close()


async def test_deleting_a_running_video_stops_it_and_keeps_no_file(client, app):
    video = (await client.post("/v1/videos", json={"prompt": "dance monkey",
                                                   "num_frames": 129, **TINY})).json()
    record = app.state.videos.videos[video["id"]]
    deleted = await client.delete(f"/v1/videos/{video['id']}")
    assert deleted.json()["deleted"] is True
    with pytest.raises(asyncio.CancelledError):
        await record.task  # the generation ends (its engine stream closes) ...
    assert record.path is None  # ... before any file was written
    assert not list(app.state.videos.directory.glob(f"{video['id']}*"))
    assert (await client.get(f"/v1/videos/{video['id']}")).status_code == 404


# ------------------------------------------------------------ seconds, sync, streaming


async def asgi_get(app, path: str, on_body) -> list[bytes]:
    """GET `path` straight through the ASGI app (httpx's transport buffers whole bodies);
    `on_body()` runs as each body message arrives, its results returned in order."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "headers": [(b"host", b"test")],
             "client": ("127.0.0.1", 1), "server": ("test", 80)}
    bodies: list[bytes] = []
    seen: list = []

    requested = []

    async def receive():
        if requested:  # Starlette listens for a disconnect meanwhile: none comes
            await asyncio.Event().wait()
        requested.append(True)
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        if message["type"] == "http.response.body" and message.get("body"):
            bodies.append(message["body"])
            seen.append(on_body())

    await app(scope, receive, send)
    return bodies, seen


async def test_content_streams_while_in_progress_and_equals_the_finished_file(client, app):
    import av

    video = (await client.post("/v1/videos", json={"prompt": "dance monkey",
                                                   "num_frames": 129, **TINY})).json()
    record = app.state.videos.videos[video["id"]]
    bodies, statuses = await asgi_get(app, f"/v1/videos/{video['id']}/content",
                                      lambda: record.status)
    assert statuses[0] in ("queued", "in_progress")  # bytes came before the end ...
    assert record.status == "completed"  # ... and the stream ended with the video
    streamed = b"".join(bodies)
    assert streamed == record.path.read_bytes()
    with av.open(io.BytesIO(streamed)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 129


async def test_seconds_maps_to_frames_at_the_fps(client):
    created = await client.post("/v1/videos", json={"prompt": "dance monkey", "seconds": "2",
                                                    "fps": 16, **TINY})
    assert created.status_code == 200, created.text
    assert created.json()["seconds"] == "2"
    done = await wait_done(client, created.json()["id"])
    assert done["status"] == "completed"
    assert done["expires_at"] == done["completed_at"] + 3600


@pytest.mark.parametrize("body, words", [
    ({"seconds": "5"}, ["5 s at 24 fps is 121 frames", "32k+1", "use seconds 4 or 5.333"]),
    ({"seconds": 2, "fps": 16, "num_frames": 65}, ["is 33 frames, but num_frames is 65"]),
    ({"seconds": "four"}, ["'seconds' must be a number"]),
])
async def test_seconds_the_model_cannot_make_is_a_400_saying_why(client, body, words):
    response = await client.post("/v1/videos", json={"prompt": "x", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "seconds" and all(w in error["message"] for w in words)


async def test_wait_true_answers_with_the_mp4_or_the_failure(client, app):
    response = await client.post("/v1/videos?wait=true", json={"prompt": "dance monkey",
                                                               **TINY})
    assert response.status_code == 200 and response.headers["content-type"] == "video/mp4"
    assert response.content[4:8] == b"ftyp"
    video_id = response.headers["x-video-id"]
    assert (await client.get(f"/v1/videos/{video_id}")).json()["status"] == "completed"

    failed = await client.post("/v1/videos?wait=true", json={"prompt": "dance monkey",
                                                             "num_frames": 66, **TINY})
    assert failed.status_code == 400
    assert "CreateVideo.num_frames: 66" in failed.json()["error"]["message"]


def png_bytes() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 10, 10)).save(out, format="PNG")
    return out.getvalue()


@pytest.mark.parametrize("data, words", [
    (b"not an image at all", ["is not an image"]),
    (None, ["image-to-video is not supported", "Helios driver"]),
])
async def test_input_reference_is_checked_and_image_to_video_refused_saying_so(client, app,
                                                                             data, words):
    before = set(video_store(app.state).videos)  # made on first use: this may be the module's first test
    files = {"input_reference": ("ref.png", data if data is not None else png_bytes(),
                                 "image/png")}
    response = await client.post("/v1/videos", data={"prompt": "dance monkey"}, files=files)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "input_reference" and all(w in error["message"] for w in words)
    assert set(video_store(app.state).videos) == before  # nothing kept for a refused request


async def test_the_sdk_sends_seconds_and_input_reference(app):
    from openai import AsyncOpenAI, BadRequestError

    http = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test")
    sdk = AsyncOpenAI(api_key="none", base_url="http://test/v1", http_client=http)
    try:
        video = await sdk.videos.create(prompt="dance monkey", seconds="4", size="16x16",  # type: ignore[arg-type]
                                        extra_body={"num_inference_steps": "1",
                                                    "guidance_scale": "1.0"})
        assert video.seconds == "4"
        await sdk.videos.delete(video.id)
        with pytest.raises(BadRequestError) as err:
            await sdk.videos.create(prompt="dance monkey", size="16x16",  # type: ignore[arg-type]
                                    input_reference=("ref.png", png_bytes(), "image/png"))
        assert "image-to-video is not supported" in str(err.value)
    finally:
        await sdk.close()


async def test_retention_expires_finished_videos_and_their_files(client, app):
    store = video_store(app.state)
    video = (await client.post("/v1/videos", json={"prompt": "dance monkey", **TINY})).json()
    done = await wait_done(client, video["id"])
    path = store.videos[video["id"]].path
    store.expire(done["completed_at"] + store.retention_s - 1)
    assert video["id"] in store.videos
    store.expire(done["completed_at"] + store.retention_s)
    assert video["id"] not in store.videos and not path.exists()


async def test_shutdown_removes_the_videos_folder():
    from fastapi import FastAPI

    from voxline.realtime.http.videos import close_videos

    state = FastAPI().state
    store = video_store(state)
    folder = store.directory
    (folder / "left.mp4.part").write_bytes(b"x")
    await close_videos(state)
    assert not folder.exists()


def test_a_server_that_renders_no_video_or_voice_makes_no_folder(tmp_path, monkeypatch):
    """A killed server cannot clean up: so the folders are made on first use only."""
    import tempfile

    from voxline.realtime.http.videos import VideoStore
    from voxline.realtime.http.voice_store import VoiceStore

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    videos, voices = VideoStore(), VoiceStore()
    assert voices.all() == [] and not voices.exists("x") and voices.get("x") is None
    assert not voices.remove("x") and list(tmp_path.iterdir()) == []
    videos.close()
    assert list(tmp_path.iterdir()) == []
    assert videos.directory.parent == tmp_path and voices.root.parent == tmp_path
