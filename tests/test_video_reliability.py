"""Video reliability over `/v1/videos`: an engine process killed during a video fails that
video with the reason (and leaves no file), `/health` turns 503 and a new video completes
after the restart; an out-of-memory in the real Helios path (the tiny checkpoint's
transformer raising `torch.OutOfMemoryError` for one request's size) fails that request
only, while a neighbour and later requests complete; a refused request writes nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import numpy as np
import pytest
import pytest_asyncio
from conftest import TIME_FACTOR
from fakes import CountingLM, EnergyVAD, FixedASR, ToneTTS

from voxline.config import Settings
from voxline.engines import protocol as p
from voxline.realtime.app import create_app
from voxline.realtime.http.videos import video_store

pytestmark = pytest.mark.asyncio(loop_scope="module")

OOM_WIDTH = 32  # the tiny Helios transformer runs out of memory for this width only


class SlowRender:
    """`chunks` chunks of 2 black 16x16 frames, each taking `seconds` (a slow model)."""

    def __init__(self, chunks: int, seconds: float) -> None:
        self.total_chunks, self.made, self.seconds = chunks, 0, seconds

    @property
    def finished(self) -> bool:
        return self.made >= self.total_chunks

    def denoise_next(self):
        from fakes import OnePieceDecode

        time.sleep(self.seconds)  # on the video worker thread, as a model's compute
        self.made += 1
        return OnePieceDecode(np.zeros((2, 16, 16, 3), np.uint8))


class SlowVideoModel:
    decode_ahead = 1

    def begin_video(self, msg: p.CreateVideo) -> SlowRender:
        return SlowRender(max(1, msg.num_frames // 2), 0.05 if msg.prompt == "slow" else 0.0)


def make_slow_video_core(wake):
    """Core spec ``test_video_reliability:make_slow_video_core`` (the fakes, in a child)."""
    from voxline.engines.core import EngineCore, Models
    from voxline.engines.speech_model import SentenceSpeechModel

    return EngineCore(Models(EnergyVAD(), FixedASR(), CountingLM(),
                             SentenceSpeechModel(ToneTTS()), stages={"video": SlowVideoModel()}), wake)


def make_oom_video_core(wake, video_dir: str):
    """Core spec ``test_video_reliability:make_oom_video_core``: the tiny Helios checkpoint
    through the `video` setting, its transformer out of memory at `OOM_WIDTH`."""
    import torch
    from test_video_api import make_video_core

    core = make_video_core(wake, video_dir)
    transformer = core.parts["video"].owner.stage.model.pipe.transformer

    def out_of_memory(_module, _args, kwargs):
        if kwargs["hidden_states"].shape[-1] * 8 == OOM_WIDTH:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB (test)")

    transformer.register_forward_pre_hook(out_of_memory, with_kwargs=True)
    return core


TINY = {"size": "16x16", "num_inference_steps": 2, "guidance_scale": 1.0, "seed": 5}


async def wait_status(client: httpx.AsyncClient, video_id: str, statuses: tuple[str, ...],
                      timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout * TIME_FACTOR
    while (body := (await client.get(f"/v1/videos/{video_id}")).json())["status"] not in statuses:
        assert time.monotonic() < deadline, f"video {video_id} stayed {body['status']}"
        await asyncio.sleep(0.02)
    return body


def files_of(app, video_id: str) -> list:
    return list(app.state.videos.directory.glob(f"{video_id}*"))


@pytest_asyncio.fixture(loop_scope="module")
async def crashing_server():
    from voxline.engines.process import MultiprocessEngineClient

    engine = MultiprocessEngineClient("test_video_reliability:make_slow_video_core",
                                      start_timeout=120 * TIME_FACTOR)
    await engine.start()
    app = create_app(Settings(), engine, manage_engine=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test",
                                 timeout=60) as client:
        yield app, client
    await engine.close()


async def test_an_engine_crash_fails_the_running_video_with_the_reason(crashing_server):
    app, client = crashing_server
    pid = (await client.get("/health")).json()["engine"]["pid"]
    video = (await client.post("/v1/videos", json={"prompt": "slow", "num_frames": 400,
                                                   "size": "16x16"})).json()
    await wait_status(client, video["id"], ("in_progress",))
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    failed = await wait_status(client, video["id"], ("failed", "completed"))
    print(f"video failed {1000 * (time.monotonic() - killed):.0f} ms after the SIGKILL")
    assert failed["status"] == "failed" and failed["progress"] < 100
    assert "engine" in failed["error"]["message"] and str(pid) in failed["error"]["message"]
    assert not files_of(app, video["id"])  # nothing of the failed video stays on disk
    assert (await client.get(f"/v1/videos/{video['id']}/content")).status_code == 404

    deadline = time.monotonic() + 300 * TIME_FACTOR
    while (await client.get("/health")).status_code != 200:  # the supervisor restarts it
        assert time.monotonic() < deadline, "the engine did not come back"
        await asyncio.sleep(0.2)
    again = (await client.post("/v1/videos", json={"prompt": "fast", "num_frames": 6,
                                                   "size": "16x16"})).json()
    assert (await wait_status(client, again["id"], ("failed", "completed")))["status"] == \
        "completed"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def oom_server(tmp_path_factory):
    pytest.importorskip("diffusers")
    import torch
    from tiny_helios import save_tiny_helios

    from voxline.engines.client import InProcessEngineClient

    threads = torch.get_num_threads()
    video_dir = save_tiny_helios(tmp_path_factory.mktemp("helios"))
    engine = InProcessEngineClient("test_video_reliability:make_oom_video_core",
                                   {"video_dir": str(video_dir)})
    await engine.start()
    app = create_app(Settings(), engine, manage_engine=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test",
                                 timeout=60) as client:
        yield app, client
    await engine.close()
    torch.set_num_threads(threads)


@pytest.mark.parametrize("cache_backend", ["none", "first_block_cache"])
async def test_an_out_of_memory_fails_that_request_not_the_server(oom_server, cache_backend):
    app, client = oom_server
    tiny = {**TINY, "cache_backend": cache_backend}
    neighbour = (await client.post("/v1/videos", json={"prompt": "dance monkey",
                                                       "num_frames": 65, **tiny})).json()
    oom = (await client.post("/v1/videos", json={"prompt": "dance monkey", **tiny,
                                                 "size": f"{OOM_WIDTH}x16"})).json()
    failed = await wait_status(client, oom["id"], ("failed", "completed"))
    assert failed["status"] == "failed" and "out of memory" in failed["error"]["message"]
    assert not files_of(app, oom["id"])
    done = await wait_status(client, neighbour["id"], ("failed", "completed"))
    assert done["status"] == "completed", done["error"]
    assert (await client.get("/health")).status_code == 200
    after = await client.post("/v1/videos?wait=true", json={"prompt": "dance monkey", **tiny})
    assert after.status_code == 200 and after.content[4:8] == b"ftyp"
    sync_oom = await client.post("/v1/videos?wait=true", json={"prompt": "dance monkey", **tiny,
                                                               "size": f"{OOM_WIDTH}x16"})
    assert sync_oom.status_code == 500 and "out of memory" in sync_oom.text


async def test_a_refused_request_writes_nothing(oom_server):
    app, client = oom_server
    store = video_store(app.state)  # made on first use: this may be the module's first request
    before = sorted(p.name for p in store.directory.iterdir())
    records = set(store.videos)
    for body in ({"prompt": "x", "size": "20x16"}, {"prompt": "x", "seconds": "5"},
                 {"prompt": "x", "cache_backend": "teacache"}):
        assert (await client.post("/v1/videos", json=body)).status_code == 400
    assert sorted(p.name for p in store.directory.iterdir()) == before
    assert set(store.videos) == records
