"""The page's video panel (voxline/web_demo/video.js): served, and in a real headless
Chromium on a real WebRTC call (slow).

The browser test uses test_web_demo's fixture: the real server with the shipped voice
models plus the tiny Helios checkpoint (tests/tiny_helios.py) loaded through the real
`video=helios:DIR` setting, and Debian's `chromium` with a silent fake microphone
(press-to-talk, so no turn starts). Through the page's own controls it asks for a video:
the <video> element must reach the playing state at the requested size with frames
advancing, play to the end, steer a longer one to a new prompt ("Show" while it is made)
and stop when "Stop video" cancels it. Like the
page's WebRTC voice test, it runs in a network namespace whose only interface is
loopback.
"""

from __future__ import annotations

import base64
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from test_web_demo import (
    ECHO,
    IN_LOOPBACK_NAMESPACE,
    DevTools,
    run_in_loopback_namespace,
    voice_chat,
    wait_for,
)

from voxline.config import load_settings
from voxline.engines.client import InProcessEngineClient
from voxline.realtime.app import create_app

SCREENSHOT = Path(tempfile.gettempdir()) / "voxline_web_video.png"
WIDTH, HEIGHT, FPS = 48, 32, 16
# tiny sizes and steps keep a chunk well under its 2 s of playback on these CPUs
QUERY = (f"&mode=push&video_width={WIDTH}&video_height={HEIGHT}&video_fps={FPS}"
         "&video_frames=65&video_steps=2&video_guidance=1")
LONG_FRAMES = 657  # 20 chunks


@pytest.mark.parametrize(("video", "available"), [("", False), ("helios:/some/checkpoint", True)])
def test_the_video_script_and_the_servers_features_are_served(video, available):
    app = create_app(load_settings(video=video), InProcessEngineClient(ECHO))
    with TestClient(app) as client:
        page = client.get("/").text
        assert page.index('src="web/video.js"') < page.index('src="web/app.js"')
        assert '<video id="video"' in page and 'id="video-state"' in page
        script = client.get("/web/video.js")
        assert script.headers["content-type"] == "text/javascript; charset=utf-8"
        assert "response.output_video.started" in script.text and "recvonly" in script.text
        assert client.get("/web/features.json").json() == {"video": available}


def video_stats(state: dict[str, Any]) -> dict[str, Any]:
    return (state.get("stats") or {}).get("video") or {}


def click(page: DevTools, button: str) -> None:
    page.evaluate(f"document.getElementById({button!r}).click()")


def set_input(page: DevTools, input_id: str, value: str) -> None:
    page.evaluate(f"document.getElementById({input_id!r}).value = {value!r}")


@pytest.mark.slow
def test_browser_shows_a_generated_video_over_webrtc():
    """Runs the page test in a network namespace of its own whose only interface is
    loopback (as test_web_demo's WebRTC turn does)."""
    run_in_loopback_namespace(f"{Path(__file__).resolve()}::test_video_call_in_loopback_namespace")


@pytest.mark.slow
def test_video_call_in_loopback_namespace(tmp_path: Path):
    if os.environ.get(IN_LOOPBACK_NAMESPACE) != "1":
        pytest.skip("run by test_browser_shows_a_generated_video_over_webrtc in its own "
                    "network namespace")
    pytest.importorskip("diffusers")
    from tiny_helios import save_tiny_helios

    video_dir = save_tiny_helios(tmp_path / "helios")
    with voice_chat(tmp_path, transport="webrtc", query=QUERY,
                    video=f"helios:{video_dir}") as page:
        wait_for(page, lambda s: video_stats(s).get("available") and s["stats"]["state"]
                 == "listening" and s["stats"]["iceState"] == "connected", "a live call")
        set_input(page, "video-prompt", "a train crossing the mountains at sunset")
        click(page, "video-show")
        playing = wait_for(page, lambda s: video_stats(s).get("state") == "playing"
                           and video_stats(s)["framesThisVideo"] >= 10, "the video playing")
        first = video_stats(playing)
        assert (first["videoWidth"], first["videoHeight"]) == (WIDTH, HEIGHT)
        assert not first["paused"] and first["videosStarted"] == 1
        later = video_stats(wait_for(
            page, lambda s: video_stats(s)["framesShown"] >= first["framesShown"] + 10,
            "more frames"))
        assert later["currentTime"] > first["currentTime"]  # the element's clock runs too
        shot = page.call("Page.captureScreenshot", format="png")
        SCREENSHOT.write_bytes(base64.b64decode(shot["data"]))
        ended = video_stats(wait_for(page, lambda s: video_stats(s)["state"] == "stopped",
                                     "the video played to its end"))
        assert ended["lastStatus"] == "completed" and ended["chunks"] == 2
        # 65 frames, less what a loaded browser skipped: frames of both chunks were shown
        assert ended["framesThisVideo"] > 33

        # a 20-chunk video (41 s) at twice the steps, stopped with the page's button while
        # it plays and the model is still making it
        set_input(page, "video-frames", str(LONG_FRAMES))
        set_input(page, "video-steps", "4")
        click(page, "video-show")
        playing = video_stats(wait_for(
            page, lambda s: video_stats(s)["videosStarted"] == 2
            and video_stats(s)["state"] == "playing", "the second video playing"))
        # "Show" while it is still being made steers it: no new video, the chunks go on
        set_input(page, "video-prompt", "a red cat over the mountains")
        click(page, "video-show")
        steered = video_stats(wait_for(
            page, lambda s: video_stats(s)["steered"] == 1
            and video_stats(s)["chunks"] > playing["chunks"] + 1, "the video steered"))
        assert steered["videosStarted"] == 2 and steered["state"] == "playing"
        assert steered["prompt"] == "a red cat over the mountains"
        click(page, "video-stop")
        stopped = video_stats(wait_for(
            page, lambda s: video_stats(s)["state"] == "stopped", "the video stopped"))
        assert stopped["lastStatus"] == "cancelled"
        last: list[int] = []

        def frames_settled(state: dict[str, Any]) -> bool:
            last.append(video_stats(state)["framesShown"])
            return len(last) >= 8 and len(set(last[-8:])) == 1  # none for 8 polls (2 s)

        settled = video_stats(wait_for(page, frames_settled, "the frames to stop"))
    late = settled["framesShown"] - stopped["framesAtStop"]
    print(f"page video: {first['videoWidth']}x{first['videoHeight']}, Show -> first frame "
          f"{settled['firstFrameMs']} ms, {ended['framesThisVideo']} frames of the first video "
          f"shown, {late} after the stop")
    assert late < 33  # not another chunk's worth: the track stopped with the cancel
    assert settled["framesThisVideo"] < LONG_FRAMES


PANEL_STATE = """JSON.stringify((() => {
  const shown = (id) => {
    const r = document.getElementById(id).getBoundingClientRect();
    return r.width > 0 && r.height > 0;
  };
  return {loaded: window.voxlineVideo.stats().featuresLoaded,
          panel: getComputedStyle(document.getElementById('video-panel')).display,
          shown: ['video', 'video-state', 'video-show', 'video-stop', 'video-prompt']
            .filter(shown),
          talk: shown('talk')};
})())"""


@pytest.mark.parametrize(("video", "shown"), [
    ("", []),
    ("helios:/some/checkpoint", ["video", "video-state", "video-show", "video-stop",
                                 "video-prompt"]),
])
def test_the_page_shows_the_video_controls_only_when_the_server_has_a_video_model(video,
                                                                                   shown):
    """In a real headless Chromium: with no video model there is no black panel and no
    greyed-out Show / Stop video; with one (web/features.json says so) they are there."""
    import json
    import time

    from conftest import TIME_FACTOR
    from test_web_demo import chromium_path, headless_chromium, not_ready_server

    chromium_path()
    with not_ready_server(video=video) as port, headless_chromium() as page:
        page.navigate(f"http://127.0.0.1:{port}/")
        deadline = time.monotonic() + 30 * TIME_FACTOR
        state = json.loads(page.evaluate(PANEL_STATE))
        while not state["loaded"] and time.monotonic() < deadline:
            time.sleep(0.05)
            state = json.loads(page.evaluate(PANEL_STATE))
    assert state["loaded"] and state["talk"]  # the voice controls are there either way
    assert state["shown"] == shown
    assert state["panel"] == ("flex" if shown else "none")
