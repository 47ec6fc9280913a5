"""Video capacity (`video_streams`): how many videos the server renders at once, and what a
request past it gets, on the tiny Helios checkpoint loaded through the `video` setting.

- `plan_video_streams`: explicit wins, 1 on a CPU, a measured row on a GPU (1 without one);
  `sized_for_device` logs the choice in one line beside the voice capacity line;
- `/v1/videos` on an engine holding one video: a job past it stays `queued` (progress 0)
  until the running one ends, then completes; `?wait=true` past it is a 503 `server_busy`
  with `Retry-After`, and keeps nothing. The chunks are let through one at a time by a
  gate around the real renders, so the order is the test's, never the clock's.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import httpx
import pytest
import pytest_asyncio

pytest.importorskip("diffusers")

from fakes import CountingLM, EnergyVAD, FixedASR, ToneTTS  # noqa: E402

from voxline.config import Settings  # noqa: E402
from voxline.engines.capacity import VideoRow, plan_video_streams  # noqa: E402
from voxline.engines.client import InProcessEngineClient  # noqa: E402
from voxline.realtime.app import create_app  # noqa: E402

TINY = {"width": 16, "height": 16, "num_inference_steps": 2, "guidance_scale": 1.0, "seed": 5,
        "num_frames": 65}  # two chunks
GATE = threading.Semaphore(0)  # one permit: one chunk may be made


def test_video_streams_explicit_then_cpu_then_a_measured_row_else_one():
    rows = [VideoRow("NVIDIA H200", 3, steps_per_stage=1, source="gpu_video_h200.json"),
            VideoRow("NVIDIA H200", 1, steps_per_stage=2), VideoRow("NVIDIA H100", 2)]
    assert plan_video_streams("NVIDIA H200", 5, rows, 1) == (5, "explicit")
    assert plan_video_streams(None, None, rows, 1) == (1, "CPU: one at a time")
    streams, why = plan_video_streams("NVIDIA H200", None, rows, 1)
    assert streams == 3 and "gpu_video_h200.json" in why
    # more steps a stage than measured: only the rows measured at least that slow count
    assert plan_video_streams("NVIDIA H200", None, rows, 2)[0] == 1
    streams, why = plan_video_streams("NVIDIA L4", None, rows, 1)
    assert streams == 1 and "no video row" in why


def test_the_start_logs_the_video_capacity_beside_the_voice_line(caplog, tmp_path):
    from voxline.engines.sizing import sized_for_device

    with caplog.at_level(logging.INFO, logger="voxline.engines.sizing"):
        sized = sized_for_device(Settings(video=f"helios:{tmp_path}"))
    assert sized.video_streams == 1
    line, = [r.getMessage() for r in caplog.records if "video capacity" in r.getMessage()]
    assert "video_streams=1 (CPU: one at a time)" in line
    assert "1 step(s) a pyramid stage (video_realtime_steps_per_stage)" in line
    assert sized_for_device(Settings(video=f"helios:{tmp_path}", video_streams=3)) \
        .video_streams == 3
    assert sized_for_device(Settings()).video_streams is None  # no video model: no line


class GatedRender:
    """A real Helios render whose every chunk waits for a permit of `GATE`."""

    def __init__(self, render) -> None:
        self._render = render

    def __getattr__(self, name: str):
        return getattr(self._render, name)

    def denoise_next(self):
        assert GATE.acquire(timeout=60), "the test let no chunk through"
        return self._render.denoise_next()


class GatedModel:
    def __init__(self, model) -> None:
        self.model = model
        self.decode_ahead = model.decode_ahead

    def begin_video(self, msg):
        return GatedRender(self.model.begin_video(msg))


def make_gated_core(wake, video_dir: str, max_videos: int):
    """Core spec ``test_video_capacity:make_gated_core``: the tiny Helios, gated."""
    import torch

    from voxline.engines.core import EngineCore, Models
    from voxline.engines.speech_model import SentenceSpeechModel
    from voxline.engines.stage_registry import load_video

    torch.set_num_threads(1)
    video = GatedModel(load_video(Settings(video=f"helios:{video_dir}")))
    return EngineCore(Models(EnergyVAD(), FixedASR(), CountingLM(),
                             SentenceSpeechModel(ToneTTS()), stages={"video": video}), wake,
                      max_videos=max_videos)


@pytest_asyncio.fixture
async def client(tmp_path):
    import torch
    from tiny_helios import save_tiny_helios

    threads = torch.get_num_threads()
    video_dir = save_tiny_helios(tmp_path / "helios")
    engine = InProcessEngineClient("test_video_capacity:make_gated_core",
                                   {"video_dir": str(video_dir), "max_videos": 1})
    await engine.start()
    app = create_app(Settings(), engine, manage_engine=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test",
                                 timeout=60) as c:
        yield c
    while GATE.acquire(blocking=False):  # no permit left for another test
        pass
    await engine.close()
    torch.set_num_threads(threads)


async def status_of(client: httpx.AsyncClient, video_id: str, want: str) -> dict:
    """The video's object once its status is `want` (the gate decides when; this waits)."""
    for _ in range(600):
        body = (await client.get(f"/v1/videos/{video_id}")).json()
        if body["status"] == want:
            return body
        assert body["status"] != "failed", body
        await asyncio.sleep(0.05)
    raise AssertionError(f"video {video_id} never {want}: {body}")


@pytest.mark.asyncio
async def test_past_video_streams_a_job_stays_queued_and_a_wait_is_a_503(client):
    first = (await client.post("/v1/videos", json={"prompt": "dance monkey", **TINY})).json()
    GATE.release()  # the first video's first chunk
    await status_of(client, first["id"], "in_progress")

    queued = (await client.post("/v1/videos", json={"prompt": "a red cat", **TINY})).json()
    busy = await client.post("/v1/videos?wait=true", json={"prompt": "a dog", **TINY})
    assert busy.status_code == 503 and busy.headers["retry-after"] == "5"
    error = busy.json()["error"]
    assert (error["code"], error["type"]) == ("server_busy", "server_error")
    assert "video_streams" in error["message"]
    listed = (await client.get("/v1/videos")).json()["data"]
    assert [v["id"] for v in listed if v["id"] not in (first["id"], queued["id"])] == []

    body = (await client.get(f"/v1/videos/{queued['id']}")).json()
    assert (body["status"], body["progress"]) == ("queued", 0)  # waits for the slot
    GATE.release()  # the first video's last chunk: its slot frees
    await status_of(client, first["id"], "completed")
    GATE.release(2)  # the queued one now takes the slot and makes its two chunks
    done = await status_of(client, queued["id"], "completed")
    assert done["progress"] == 100 and done["error"] is None


def test_the_video_footprint_counts_float8_block_linears_at_one_byte(tmp_path):
    """`video_weights=fp8` stores the transformer blocks' linears in one byte a weight; the
    GPU sizing counts them so (a float8 Helios leaves room for more voice sessions)."""
    from tiny_helios import save_tiny_helios

    from voxline.engines.model_memory import block_projection_params, safetensors_params
    from voxline.engines.stage_registry import _video_footprint

    root = save_tiny_helios(tmp_path / "helios")
    bf16 = _video_footprint(Settings(video=f"helios:{root}"), gpu_in_use=True)
    fp8 = _video_footprint(Settings(video=f"helios:{root}", video_weights="fp8"), gpu_in_use=True)
    linears = block_projection_params(root / "transformer")
    assert bf16[0] == fp8[0] == "cuda" and 0 < linears < safetensors_params(root / "transformer")
    assert bf16[1].weights == 2 * safetensors_params(root)
    assert bf16[1].weights - fp8[1].weights == linears
    assert _video_footprint(Settings(video=f"helios:{root}"), gpu_in_use=False) is None
