"""The Realtime video extension: `response.create` with "video" in output_modalities.

- `VideoPlayout` (the call's video track's jitter queue and 90 kHz clock) over a given clock;
- the session actor with a hand-played engine: CreateVideo out, progress events in order,
  `response.done` only after the video, cancel sends CancelVideo and ends it at once;
- end to end (slow): the tiny Helios checkpoint loaded through the real `video` setting in a
  live server; a real aiortc peer on loopback receives the frames on its video track, and
  `response.cancel` stops them; over the WebSocket the openai SDK passes the progress events
  through and the done event names a `/v1/videos` id whose content is the MP4.
"""

from __future__ import annotations

import asyncio
import contextlib
import io

import httpx
import numpy as np
import pytest

from voxline.engines import protocol as ep
from voxline.errors import ProtocolError
from voxline.realtime.openai.client_events import parse_command
from voxline.realtime.transports.video_track import VIDEO_CLOCK, VideoPlayout
from voxline.sessions import events as ev
from voxline.sessions.actor import SessionActor
from voxline.sessions.settings import SessionSettings

VIDEO = {"prompt": "a train crossing the mountains at sunset", "width": 32, "height": 16,
         "fps": 16, "num_frames": 65, "num_inference_steps": 2, "guidance_scale": 1.0, "seed": 5}


def frames(n: int, value: int = 0, h: int = 2, w: int = 3) -> np.ndarray:
    out = np.zeros((n, h, w, 3), np.uint8)
    out[:, 0, 0, 0] = np.arange(value, value + n) % 256  # each frame tells which it is
    return out


def play(playout: VideoPlayout, start: float, until: float) -> list[tuple[float, int, int, bool]]:
    """Every frame due in [start, until): (time, pts, frame tag, held), as the track takes them."""
    out, now = [], start
    while now < until:
        due = playout.due(now)
        if due is None:
            break
        now = max(now, due)
        if now >= until:
            break
        f = playout.take(now)
        out.append((now, f.pts, int(f.pixels[0, 0, 0]), f.held))
    return out

# ------------------------------------------------------------------------------ playout


def test_a_burst_plays_at_fps_on_the_90khz_clock():
    p = VideoPlayout()
    p.start("v1", fps=24)
    p.push("v1", frames(33))
    played = play(p, 10.0, 10.0 + 33 / 24)
    assert [t for _, _, t, _ in played] == list(range(33))
    assert np.diff([pts for _, pts, _, _ in played]).tolist() == [VIDEO_CLOCK // 24] * 32
    assert np.allclose(np.diff([at for at, *_ in played]), 1 / 24)


def test_underrun_holds_the_last_frame_then_a_completed_video_goes_quiet():
    p = VideoPlayout()
    p.start("v1", fps=16)
    p.push("v1", frames(2))
    played = play(p, 0.0, 5 / 16 - 1e-9)  # 5 slots, 2 frames: the second is held 3 times
    assert [(t, held) for _, _, t, held in played] == [
        (0, False), (1, False), (1, True), (1, True), (1, True)]
    assert np.diff([pts for _, pts, _, _ in played]).tolist() == [5625] * 4
    p.push("v1", frames(2, value=2))
    p.end("v1", "completed")  # what is queued still plays, then nothing
    rest = play(p, 5 / 16, 100.0)
    assert [t for _, _, t, _ in rest] == [2, 3] and p.due(100.0) is None


def test_cancel_stops_at_once_and_a_new_video_replaces_the_old():
    p = VideoPlayout()
    p.start("v1", fps=24)
    p.push("v1", frames(33))
    first = play(p, 0.0, 0.5)
    p.end("v1", "cancelled")
    assert p.due(0.5) is None and p.queued == 0
    p.push("v1", frames(5))  # a late chunk of the cancelled video is not played
    assert p.due(0.6) is None
    p.start("v2", fps=24)
    p.push("v2", frames(3, value=100))
    second = play(p, 2.0, 3.0)
    assert [t for _, _, t, _ in second][:3] == [100, 101, 102]
    assert second[0][1] > first[-1][1]  # pts keeps rising across videos
    assert second[0][1] == round(2.0 * VIDEO_CLOCK)  # from wall time since the first frame


def test_the_jitter_queue_is_bounded_and_drops_the_oldest():
    p = VideoPlayout(max_buffered_s=2.0)
    p.start("v1", fps=10)
    for i in range(5):
        p.push("v1", frames(10, value=10 * i))
    assert p.queued == 20 and p.dropped == 30
    assert play(p, 0.0, 0.05)[0][2] == 30  # the newest 2 s are kept

# ------------------------------------------------------------------------------ session


def actor() -> SessionActor:
    a = SessionActor("sess_1", "stream_1", settings=SessionSettings(turn_detection=None))
    a.start(0.0)
    a.take_events(), a.take_commands()
    return a


def create(a: SessionActor, response: dict, now: float = 1.0) -> None:
    a.receive(parse_command({"type": "response.create", "response": response}), now)


def test_a_video_response_sends_create_video_and_ends_after_the_video():
    a = actor()
    create(a, {"output_modalities": ["audio", "video"], "video": VIDEO})
    commands = a.take_commands()
    made = [c for c in commands if isinstance(c, ep.CreateVideo)]
    assert len(made) == 1 and isinstance(commands[0], ep.CreateResponse)
    cv = made[0]
    assert (cv.prompt, cv.width, cv.height, cv.num_frames, cv.num_inference_steps, cv.seed) == (
        VIDEO["prompt"], 32, 16, 65, 2, 5)
    rid = a.response.response.id
    started = [e for e in a.take_events() if isinstance(e, ev.VideoStarted)]
    assert [(e.response_id, e.video_id, e.fps) for e in started] == [(rid, cv.video_id, 16)]
    a.on_engine(ep.ReplyTextDelta("stream_1", rid, "hi"), 1.1)
    a.on_engine(ep.ResponseFinished("stream_1", rid, ep.ResponseStatus.COMPLETED, ""), 1.2)
    a.tick(5.0)
    assert a.response is not None  # the reply is done, its video is not
    pixels = frames(33, h=16, w=32)
    head, rest = pixels[:1].tobytes(), pixels[1:].tobytes()
    # the chunk's pieces come as decoded (pixels for the track), its progress event once
    a.on_engine(ep.VideoChunk("stream_1", cv.video_id, head, 1, 16, 32, 0, 2, False, piece=0,
                              chunk_done=False), 5.1)
    out = [e for e in a.take_events() if isinstance(e, ev.VideoFrames | ev.VideoChunk)]
    assert [(type(e), e.index, e.piece, e.frames, e.pixels == head) for e in out] == [
        (ev.VideoFrames, 0, 0, 1, True)]
    a.on_engine(ep.VideoChunk("stream_1", cv.video_id, rest, 32, 16, 32, 0, 2, False, piece=1,
                              chunk_done=True), 5.2)
    out = [e for e in a.take_events() if isinstance(e, ev.VideoFrames | ev.VideoChunk)]
    assert [(type(e), e.index, e.frames) for e in out] == [(ev.VideoFrames, 0, 32),
                                                           (ev.VideoChunk, 0, 33)]
    assert out[0].pixels == rest and out[1].total == 2
    a.on_engine(ep.VideoDone("stream_1", cv.video_id, ep.ResponseStatus.COMPLETED), 6.0)
    out = a.take_events()
    kinds = [type(e) for e in out]
    assert kinds.index(ev.VideoDone) < kinds.index(ev.ResponseDone)
    done = next(e for e in out if isinstance(e, ev.ResponseDone))
    assert done.response.status == "completed" and a.response is None


def test_cancel_sends_cancel_video_and_ends_the_video_at_once():
    a = actor()
    create(a, {"output_modalities": ["video"], "video": VIDEO})
    cv = next(c for c in a.take_commands() if isinstance(c, ep.CreateVideo))
    rid = a.response.response.id
    a.take_events()
    a.receive(parse_command({"type": "response.cancel"}), 2.0)
    assert ep.CancelVideo("stream_1", cv.video_id) in a.take_commands()
    done = [e for e in a.take_events() if isinstance(e, ev.VideoDone)]
    assert [(d.video_id, d.status) for d in done] == [(cv.video_id, "cancelled")]
    pixels = frames(33, h=16, w=32).tobytes()  # a chunk already on its way is not shown
    a.on_engine(ep.VideoChunk("stream_1", cv.video_id, pixels, 33, 16, 32, 1, 2, False), 2.1)
    a.on_engine(ep.ResponseFinished("stream_1", rid, ep.ResponseStatus.CANCELLED, ""), 2.2)
    out = a.take_events()
    assert not [e for e in out if isinstance(e, ev.VideoChunk | ev.VideoFrames)]
    assert next(e for e in out if isinstance(e, ev.ResponseDone)).response.status == "cancelled"


@pytest.mark.parametrize(("response", "param"), [
    ({"output_modalities": ["video"]}, "response.video.prompt"),
    ({"output_modalities": ["audio"], "video": VIDEO}, "response.output_modalities"),
])
def test_a_video_request_that_disagrees_with_itself_is_refused(response, param):
    a = actor()
    create(a, response)
    errors = [e for e in a.take_events() if isinstance(e, ev.ErrorEvent)]
    assert [e.error.param for e in errors] == [param] and a.response is None


def test_no_video_model_the_engine_refusal_names_the_setting_and_the_session_lives():
    from voxline.engines.video_stage import NO_VIDEO_MODEL

    a = actor()
    create(a, {"output_modalities": ["video"], "video": VIDEO})
    cv = next(c for c in a.take_commands() if isinstance(c, ep.CreateVideo))
    rid = a.response.response.id
    a.on_engine(ep.StreamError("stream_1", NO_VIDEO_MODEL, ep.ErrorCode.INVALID_VALUE), 1.1)
    a.on_engine(ep.VideoDone("stream_1", cv.video_id, ep.ResponseStatus.FAILED,
                             NO_VIDEO_MODEL), 1.1)
    a.on_engine(ep.ResponseFinished("stream_1", rid, ep.ResponseStatus.COMPLETED, ""), 1.2)
    a.tick(1.3)
    out = a.take_events()
    error = next(e for e in out if isinstance(e, ev.ErrorEvent))
    assert "`video` setting" in error.error.message and a.closed is None
    assert next(e for e in out if isinstance(e, ev.VideoDone)).status == "failed"
    assert a.response is None



def test_a_response_video_asks_for_the_real_time_steps_unless_it_names_its_own():
    a = actor()
    create(a, {"output_modalities": ["video"], "video": {"prompt": "a cat"}})
    cv = next(c for c in a.take_commands() if isinstance(c, ep.CreateVideo))
    assert cv.realtime and (cv.steps_per_stage, cv.num_inference_steps) == (None, None)
    a = actor()
    create(a, {"output_modalities": ["video"], "video": {"prompt": "a cat",
                                                          "steps_per_stage": 2}})
    cv = next(c for c in a.take_commands() if isinstance(c, ep.CreateVideo))
    assert cv.realtime and cv.steps_per_stage == 2


def test_bad_steps_are_refused_naming_the_field():
    with pytest.raises(ProtocolError) as refused:  # the wire refuses what it checks alone
        create(actor(), {"output_modalities": ["video"],
                         "video": {"prompt": "a cat", "steps_per_stage": 0}})
    assert refused.value.param == "response.video.steps_per_stage"
    a = actor()
    create(a, {"output_modalities": ["video"], "video": {
        "prompt": "a cat", "steps_per_stage": 2, "num_inference_steps": 4}})
    errors = [e for e in a.take_events() if isinstance(e, ev.ErrorEvent)]
    assert [e.error.param for e in errors] == ["response.video.steps_per_stage"]
    assert a.response is None and a.take_commands() == []


def update(a: SessionActor, response_id: str, prompt: str, now: float = 2.0) -> None:
    a.receive(parse_command({"type": "response.video.update", "event_id": "evt_u",
                             "response_id": response_id, "video": {"prompt": prompt}}), now)


def test_an_update_steers_the_video_in_progress_and_keeps_it_going():
    a = actor()
    create(a, {"output_modalities": ["audio", "video"], "video": VIDEO})
    cv = next(c for c in a.take_commands() if isinstance(c, ep.CreateVideo))
    rid = a.response.response.id
    a.take_events()
    update(a, rid, "a red cat over the mountains")
    assert a.take_commands() == [ep.SteerVideo("stream_1", cv.video_id,
                                               "a red cat over the mountains")]
    out = a.take_events()
    assert [(type(e), e.response_id, e.video_id, e.prompt) for e in out] == [
        (ev.VideoUpdated, rid, cv.video_id, "a red cat over the mountains")]
    pixels = frames(33, h=16, w=32).tobytes()  # the chunks keep coming, on the same video
    a.on_engine(ep.VideoChunk("stream_1", cv.video_id, pixels, 33, 16, 32, 0, 2, False), 2.1)
    assert [e.index for e in a.take_events() if isinstance(e, ev.VideoChunk)] == [0]
    assert a.video.active.params.prompt == "a red cat over the mountains"


def test_bad_updates_name_the_field_and_the_session_and_its_video_go_on():
    a = actor()
    create(a, {"output_modalities": ["video"], "video": VIDEO})
    cv = next(c for c in a.take_commands() if isinstance(c, ep.CreateVideo))
    rid = a.response.response.id
    a.take_events()
    update(a, "resp_nope", "a cat")
    update(a, rid, "   ")
    errors = [e.error for e in a.take_events() if isinstance(e, ev.ErrorEvent)]
    assert [(e.param, e.event_id) for e in errors] == [("response_id", "evt_u"),
                                                       ("video.prompt", "evt_u")]
    assert "'resp_nope': it has no video in progress" in errors[0].message
    assert "response.video.update" in errors[1].message
    assert a.take_commands() == [] and a.closed is None and a.video.active is not None
    a.on_engine(ep.VideoDone("stream_1", cv.video_id, ep.ResponseStatus.COMPLETED), 3.0)
    a.take_events()
    update(a, rid, "a cat", now=3.1)  # the video has ended
    error, = [e.error for e in a.take_events() if isinstance(e, ev.ErrorEvent)]
    assert error.param == "response_id" and "its video has ended (completed)" in error.message
    with pytest.raises(ProtocolError) as refused:  # the wire alone refuses an empty prompt
        parse_command({"type": "response.video.update", "response_id": rid,
                       "video": {"prompt": ""}})
    assert refused.value.param == "video.prompt"
    assert a.closed is None


def test_past_video_streams_the_busy_video_is_an_error_and_the_voice_reply_still_comes():
    a = actor()
    create(a, {"output_modalities": ["audio", "video"], "video": VIDEO})
    cv = next(c for c in a.take_commands() if isinstance(c, ep.CreateVideo))
    rid = a.response.response.id
    busy = ("CreateVideo: the engine is rendering its limit of 1 video(s) at once (the "
            "video_streams setting); try again when one ends")
    a.on_engine(ep.StreamError("stream_1", busy, ep.ErrorCode.SERVER_BUSY), 1.1)
    a.on_engine(ep.VideoDone("stream_1", cv.video_id, ep.ResponseStatus.FAILED, busy), 1.1)
    a.on_engine(ep.ReplyTextDelta("stream_1", rid, "hello"), 1.2)
    a.on_engine(ep.ResponseFinished("stream_1", rid, ep.ResponseStatus.COMPLETED, ""), 1.3)
    a.tick(1.4)
    out = a.take_events()
    error = next(e for e in out if isinstance(e, ev.ErrorEvent)).error
    assert (error.code, error.type) == ("server_busy", "server_error")
    assert next(e for e in out if isinstance(e, ev.VideoDone)).status == "failed"
    done = next(e for e in out if isinstance(e, ev.ResponseDone))
    assert done.response.status == "completed" and a.closed is None


# ------------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("diffusers")
    import torch
    from live_server import free_port, serve_app
    from tiny_helios import save_tiny_helios

    from voxline.config import Settings
    from voxline.engines.client import InProcessEngineClient
    from voxline.realtime.app import create_app

    threads = torch.get_num_threads()  # the core sets 1; given back after the module
    video_dir = save_tiny_helios(tmp_path_factory.mktemp("helios"))
    settings = Settings(video=f"helios:{video_dir}", ice_hosts="127.0.0.1", server_id="vid1")
    engine = InProcessEngineClient("test_video_api:make_video_core",
                                   {"video_dir": str(video_dir)})
    with serve_app(create_app(settings, engine), free_port(), name="video-server") as base:
        yield base
    torch.set_num_threads(threads)


def pts_steps(received: list) -> list[int]:
    pts = [f.pts for _, f in received]
    return [(b - a) % 2**32 for a, b in zip(pts, pts[1:], strict=False)]  # RTP wraps at 2^32


@pytest.mark.slow
async def test_a_call_shows_the_video_on_its_track_and_cancel_stops_it(server):
    from webrtc_client import CallClient

    call = await CallClient.place(server, video=True, session={
        "type": "realtime", "audio": {"input": {"turn_detection": None}}})
    try:
        await call.open()
        call.send(type="response.create",
                  response={"output_modalities": ["audio", "video"], "video": VIDEO})
        started = await call.until_type("response.output_video.started")
        await call.until_audio(lambda _: len(call.video) >= 33, timeout=120)
        done = await call.until_type("response.done")
        assert done["response"]["status"] == "completed"
        chunks = call.of("response.output_video.chunk")
        assert [c["index"] for c in chunks] == [0, 1] and "pixels" not in chunks[0]
        assert call.of("response.output_video.done")[0]["video_id"] == started["video_id"]
        assert {(f.width, f.height) for _, f in call.video} == {(32, 16)}
        assert set(pts_steps(call.video)) == {VIDEO_CLOCK // 16}

        # a long video, cancelled after its first chunk: no new frame after the cancel
        call.send(type="response.create", response={
            "output_modalities": ["video"], "video": {**VIDEO, "num_frames": 229}})  # 7 chunks
        await call.until(lambda e: e["type"] == "response.output_video.chunk"
                         and e["video_id"] != started["video_id"], timeout=120)
        call.send(type="response.cancel")
        at, cancelled = await call.until(lambda e: e["type"] == "response.done"
                                         and e["response"]["status"] == "cancelled")
        before = len(call.video)
        with contextlib.suppress(TimeoutError):  # frames may trickle for the jitter margin
            await call.until_audio(lambda _: False, timeout=1.5)
        late = [t for t, _ in call.video if t > at + 0.3]
        assert late == [] and len(call.video) - before < 33
        assert call.of("response.output_video.done")[-1]["status"] == "cancelled"
    except TimeoutError:
        seen = [(e["type"], e.get("error") or e.get("status")) for _, e in call.events[-40:]]
        raise AssertionError(f"events so far: {seen}") from None
    finally:
        await call.close()


@pytest.mark.slow
async def test_the_websocket_gets_progress_events_and_a_fetchable_mp4(server):
    import av
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=server + "/v1", api_key="unused")
    seen: list = []
    async with client.realtime.connect(model="voxline") as rt:
        await rt.send({"type": "response.create", "response": {
            "output_modalities": ["video"], "video": VIDEO}})

        async def collect() -> None:
            async for event in rt:  # the SDK passes voxline's event types through
                seen.append(event)
                if event.type == "response.done":
                    return
        await asyncio.wait_for(collect(), 120)
    types = [e.type for e in seen]
    assert types.count("response.output_video.chunk") == 2
    assert (types.index("response.output_video.started") < types.index(
        "response.output_video.done") < types.index("response.done"))
    done = next(e for e in seen if e.type == "response.output_video.done")
    video_id = done.to_dict()["video_id"] if hasattr(done, "to_dict") else done.video_id
    assert video_id.startswith("video_vid1_")  # names its server, for a balancer's routing
    async with httpx.AsyncClient(base_url=server, timeout=30) as http:
        meta = (await http.get(f"/v1/videos/{video_id}")).json()
        assert (meta["status"], meta["size"]) == ("completed", "32x16")
        content = await http.get(f"/v1/videos/{video_id}/content")
    assert content.status_code == 200 and content.headers["content-type"] == "video/mp4"
    with av.open(io.BytesIO(content.content)) as container:
        decoded = [f for f in container.decode(video=0)]
    assert len(decoded) == 65 and (decoded[0].width, decoded[0].height) == (32, 16)


@pytest.fixture(scope="module")
def one_video_server(tmp_path_factory):
    """A live server whose engine renders one video at a time (`video_streams` 1)."""
    pytest.importorskip("diffusers")
    import torch
    from live_server import free_port, serve_app
    from tiny_helios import save_tiny_helios

    from voxline.config import Settings
    from voxline.engines.client import InProcessEngineClient
    from voxline.realtime.app import create_app

    threads = torch.get_num_threads()
    video_dir = save_tiny_helios(tmp_path_factory.mktemp("helios"))
    settings = Settings(video=f"helios:{video_dir}", server_id="vid2")
    engine = InProcessEngineClient("test_video_api:make_video_core",
                                   {"video_dir": str(video_dir), "max_videos": 1})
    with serve_app(create_app(settings, engine), free_port(), name="one-video") as base:
        yield base
    torch.set_num_threads(threads)


async def events_until(rt, seen: list, done, timeout: float = 120) -> None:
    async def collect() -> None:
        async for event in rt:
            seen.append(event.to_dict() if hasattr(event, "to_dict") else event)
            if done(seen[-1]):
                return
    await asyncio.wait_for(collect(), timeout)


@pytest.mark.slow
async def test_steering_mid_stream_and_a_busy_second_session_over_the_websocket(
        one_video_server):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=one_video_server + "/v1", api_key="unused")
    long_video = {**VIDEO, "num_frames": 229}  # 7 chunks
    a_seen: list[dict] = []
    b_seen: list[dict] = []
    async with client.realtime.connect(model="voxline") as a, \
            client.realtime.connect(model="voxline") as b:
        await a.send({"type": "response.create", "response": {
            "output_modalities": ["audio", "video"], "video": long_video}})
        await events_until(a, a_seen, lambda e: e["type"] == "response.output_video.chunk")
        rid = a_seen[-1]["response_id"]
        await a.send({"type": "response.video.update", "response_id": rid,
                      "video": {"prompt": "a red cat over the mountains"}})
        # the second session's video finds the one slot taken: a clear error, and its
        # voice reply still comes and ends cleanly
        await b.send({"type": "response.create", "response": {
            "output_modalities": ["audio", "video"], "video": VIDEO}})
        await events_until(b, b_seen, lambda e: e["type"] == "response.done")
        await events_until(a, a_seen, lambda e: e["type"] == "response.done")
        # a late, an unknown and an empty update: errors naming the field; the session lives
        for event_id, target, prompt in (("late", rid, "a dog"), ("unknown", "resp_x", "a dog"),
                                         ("empty", rid, "")):
            await a.send({"type": "response.video.update", "event_id": event_id,
                          "response_id": target, "video": {"prompt": prompt}})
        await a.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
        tail: list[dict] = []
        await events_until(a, tail, lambda e: e["type"] == "response.done")

    b_types = [e["type"] for e in b_seen]
    busy = next(e for e in b_seen if e["type"] == "error")["error"]
    assert busy["code"] == "server_busy" and "video_streams" in busy["message"]
    assert next(e for e in b_seen if e["type"] == "response.output_video.done")["status"] \
        == "failed"
    assert "response.output_audio.delta" in b_types
    assert b_seen[-1]["response"]["status"] == "completed"

    a_types = [e["type"] for e in a_seen]
    assert "error" not in a_types
    chunks = [e["index"] for e in a_seen if e["type"] == "response.output_video.chunk"]
    assert chunks == list(range(7))  # no chunk lost or restarted around the update
    updated = a_types.index("response.output_video.updated")
    assert a_types.index("response.output_video.chunk") < updated < a_types.index(
        "response.output_video.done")
    assert a_seen[updated]["prompt"] == "a red cat over the mountains"
    assert next(e for e in a_seen if e["type"] == "response.output_video.done")["status"] \
        == "completed"
    errors = {e["error"]["event_id"]: e["error"] for e in tail if e["type"] == "error"}
    assert {k: v["param"] for k, v in errors.items()} == {
        "late": "response_id", "unknown": "response_id", "empty": "video.prompt"}
    assert "has ended (completed)" in errors["late"]["message"]
    assert tail[-1]["response"]["status"] == "completed"
