"""The video stage in a real `EngineCore`: chunks per step, round-robin, cancel, failure,
refusals; and the real Helios path (`video=helios:DIR` through the factory) against a
plain diffusers call on the tiny local checkpoint."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
from core_driver import CoreDriver
from fakes import CountingLM, EnergyVAD, FixedASR, ToneTTS

from voxline.engines import protocol as p
from voxline.engines.core import EngineCore, Models
from voxline.engines.speech_model import SentenceSpeechModel

DONE = p.ResponseStatus


class CountingRender:
    """`chunks` chunks of 2 frames, 4x4, every pixel the chunk's index; `fail_at` raises."""

    def __init__(self, chunks: int, fail_at: int | None = None) -> None:
        self.total_chunks = chunks
        self.made = 0
        self.fail_at = fail_at
        self.prompt = "a train"
        self.prompts: list[str] = []  # the prompt each chunk was made for

    def steer(self, prompt: str, negative_prompt: str | None = None) -> None:
        if not prompt.strip():
            raise ValueError("SteerVideo.prompt: must not be empty")
        self.prompt = prompt

    @property
    def finished(self) -> bool:
        return self.made >= self.total_chunks

    def denoise_next(self) -> OnePiece:
        if self.made == self.fail_at:
            raise MemoryError("out of memory (test)")
        self.made += 1
        self.prompts.append(self.prompt)
        return OnePiece(np.full((2, 4, 4, 3), self.made - 1, np.uint8))


class OnePiece:
    """A chunk decoded in one piece."""

    def __init__(self, frames: np.ndarray) -> None:
        self.frames = frames

    def next_piece(self) -> tuple[np.ndarray, bool]:
        return self.frames, True

    def close(self) -> None:
        pass


class FakeVideoModel:
    def __init__(self, fail_at: int | None = None, decode_ahead: int = 1) -> None:
        self.fail_at = fail_at
        self.decode_ahead = decode_ahead
        self.renders: dict[str, CountingRender] = {}  # by prompt

    def begin_video(self, msg: p.CreateVideo) -> CountingRender:
        if msg.width % 16:
            raise ValueError(f"CreateVideo.width: {msg.width} is not a positive multiple of 16")
        render = CountingRender(msg.num_frames // 2,
                                self.fail_at if msg.prompt == "fail" else None)
        self.renders[msg.prompt] = render
        return render


class Harness(CoreDriver):
    def __init__(self, video=None, max_videos: int = 4, core: dict | None = None,
                 tts: ToneTTS | None = None) -> None:
        super().__init__()
        models = Models(EnergyVAD(), FixedASR(), CountingLM(),
                        SentenceSpeechModel(tts or ToneTTS()), stages={"video": video})
        self.core = EngineCore(models, self.woke.set, max_videos=max_videos, **(core or {}))
        self.steps: list[list[p.EngineOutput]] = []

    def run_until(self, pred, timeout: float = 20.0):
        before = len(self.outputs)
        out = super().run_until(pred, timeout)
        self.steps.append(out[before:])
        return out

    def drain(self) -> None:
        self.run_until(lambda _o: not self.core.has_work())

    def chunks(self, video_id: str) -> list[p.VideoChunk]:
        return [c for c in self.of(p.VideoChunk) if c.video_id == video_id]


def has(cls, **fields):
    return lambda outs: any(isinstance(o, cls) and all(getattr(o, k) == v
                                                       for k, v in fields.items()) for o in outs)


def video(stream: str, video_id: str, frames: int = 6, **kw) -> p.CreateVideo:
    return p.CreateVideo(stream, video_id, kw.pop("prompt", "a train"), width=16, height=16,
                         num_frames=frames, **kw)


def test_videos_interleave_one_chunk_per_step_with_progress():
    h = Harness(FakeVideoModel())
    h.send(p.OpenStream("s1"), p.OpenStream("s2"), video("s1", "a"), video("s2", "b"))
    h.run_until(lambda outs: len(h.of(p.VideoDone)) == 2)
    order = [(c.video_id, c.index) for c in h.of(p.VideoChunk)]
    # round-robin: both first chunks before any second one; after that a video whose first
    # frame is not out yet waits (first frame first), so the other may go one chunk ahead
    assert order[:2] == [("a", 0), ("b", 0)]
    for vid in "ab":
        assert [i for v, i in order if v == vid] == [0, 1, 2]
    a = h.chunks("a")
    assert [(c.index, c.total_chunks, c.final) for c in a] == [(0, 3, False), (1, 3, False),
                                                              (2, 3, True)]
    assert a[1].frames == bytes([1]) * (2 * 4 * 4 * 3) and (a[1].num_frames, a[1].height,
                                                             a[1].width) == (2, 4, 4)
    assert [(d.stream_id, d.video_id, d.status) for d in h.of(p.VideoDone)] == [
        ("s1", "a", DONE.COMPLETED), ("s2", "b", DONE.COMPLETED)]
    h.close()


def test_cancel_stops_a_video_at_the_next_chunk_boundary():
    h = Harness(FakeVideoModel())
    h.send(p.OpenStream("s1"), video("s1", "a", frames=20))
    h.run_until(has(p.VideoChunk, video_id="a"))
    h.send(p.CancelVideo("s1", "a"))
    sent = len(h.chunks("a"))
    h.drain()
    assert len(h.chunks("a")) == sent  # the chunk running at the cancel is dropped
    assert [(d.video_id, d.status) for d in h.of(p.VideoDone)] == [("a", DONE.CANCELLED)]
    h.send(video("s1", "a", frames=2))  # the id is free again
    h.run_until(has(p.VideoDone, status=DONE.COMPLETED))
    h.close()


def test_a_failed_chunk_fails_that_video_only():
    h = Harness(FakeVideoModel(fail_at=1))
    h.send(p.OpenStream("s1"), video("s1", "bad", prompt="fail"), video("s1", "good"))
    h.run_until(lambda outs: len(h.of(p.VideoDone)) == 2)
    done = {d.video_id: d for d in h.of(p.VideoDone)}
    assert done["bad"].status == DONE.FAILED and "out of memory" in done["bad"].error
    # chunk 0 is sent unless its decode was still running when chunk 1's denoise failed
    assert "chunk 1" in done["bad"].error and len(h.chunks("bad")) <= 1
    assert done["good"].status == DONE.COMPLETED and len(h.chunks("good")) == 3
    error, = h.of(p.StreamError)
    assert error.code == p.ErrorCode.ENGINE_ERROR and "'bad'" in error.message
    h.close()


def test_a_closed_stream_gets_nothing_more_of_its_video():
    h = Harness(FakeVideoModel())
    h.send(p.OpenStream("s1"), video("s1", "a", frames=20))
    h.run_until(has(p.VideoChunk, video_id="a"))
    h.send(p.CloseStream("s1"))
    sent = len(h.outputs)
    h.drain()
    assert h.kinds()[sent:] == ["StreamClosed"]
    h.close()


@pytest.mark.parametrize("model, msg, words", [
    (None, video("s1", "a"), ["no video model is loaded", "--video helios:", "`video` setting"]),
    (FakeVideoModel(), p.CreateVideo("s1", "a", "x", width=20, height=16),
     ["CreateVideo.width: 20"]),
])
def test_refused_videos_name_why_and_end_failed(model, msg, words):
    h = Harness(model)
    h.send(p.OpenStream("s1"), msg)
    h.run_until(has(p.VideoDone))
    error, = h.of(p.StreamError)
    assert error.code == p.ErrorCode.INVALID_VALUE and all(w in error.message for w in words)
    done, = h.of(p.VideoDone)
    assert (done.video_id, done.status) == ("a", DONE.FAILED)
    assert not h.core.has_work()
    h.close()


def test_a_video_id_in_progress_is_refused():
    h = Harness(FakeVideoModel())
    h.send(p.OpenStream("s1"), video("s1", "a"), video("s1", "a"))
    h.run_until(has(p.StreamError))
    error, = h.of(p.StreamError)
    assert "CreateVideo.video_id: 'a' is already in progress" in error.message
    h.run_until(has(p.VideoDone, status=DONE.COMPLETED))
    assert len(h.chunks("a")) == 3 and len(h.of(p.VideoDone)) == 1  # the running one's
    h.close()


# ------------------------------------------------------------------ capacity and steering


def test_past_video_streams_a_video_is_refused_server_busy_and_the_running_one_goes_on():
    h = Harness(FakeVideoModel(), max_videos=1)
    h.send(p.OpenStream("s1"), p.OpenStream("s2"), video("s1", "a"), video("s2", "b"))
    h.run_until(has(p.VideoDone, video_id="b"))
    error, = h.of(p.StreamError)
    assert (error.stream_id, error.code) == ("s2", p.ErrorCode.SERVER_BUSY)
    assert "limit of 1 video(s) at once" in error.message and "video_streams" in error.message
    h.run_until(has(p.VideoDone, video_id="a"))
    assert [(d.video_id, d.status) for d in h.of(p.VideoDone)] == [
        ("b", DONE.FAILED), ("a", DONE.COMPLETED)]
    assert len(h.chunks("a")) == 3 and not h.chunks("b")
    h.send(video("s2", "b"))  # the slot is free again
    h.run_until(has(p.VideoDone, video_id="b", status=DONE.COMPLETED))
    h.close()


def test_a_video_that_waits_for_a_slot_starts_when_one_frees_first_in_first_out():
    h = Harness(FakeVideoModel(), max_videos=1)
    h.send(p.OpenStream("s1"), p.OpenStream("s2"), p.OpenStream("s3"), p.OpenStream("s4"),
           video("s1", "a"), video("s2", "b", wait_for_slot=True),
           video("s3", "c", wait_for_slot=True), video("s4", "d", wait_for_slot=True))
    h.run_until(has(p.VideoChunk, video_id="a"))
    assert h.core.parts["video"].owner.in_progress() == 1 and h.core.parts["video"].owner.waiting() == 3
    h.send(p.CancelVideo("s3", "c"), p.CloseStream("s4"))  # waiting ones leave the line
    h.run_until(lambda outs: len(h.of(p.VideoDone)) == 3)
    order = [c.video_id for c in h.of(p.VideoChunk)]
    assert order == ["a"] * 3 + ["b"] * 3 and not h.of(p.StreamError)
    assert [(d.video_id, d.status) for d in h.of(p.VideoDone)] == [
        ("c", DONE.CANCELLED), ("a", DONE.COMPLETED), ("b", DONE.COMPLETED)]
    assert h.core.parts["video"].owner.waiting() == 0 and h.core.parts["video"].owner.in_progress() == 0
    h.close()


def test_steering_changes_the_next_chunks_prompt_and_a_bad_steer_names_the_field():
    model = FakeVideoModel()
    h = Harness(model)
    h.send(p.OpenStream("s1"), video("s1", "a", frames=8))
    h.run_until(has(p.VideoChunk, video_id="a", index=0))
    h.send(p.SteerVideo("s1", "a", "a boat"), p.SteerVideo("s1", "a", " "),
           p.SteerVideo("s1", "zz", "a boat"))
    h.run_until(has(p.VideoDone, video_id="a"))
    prompts = model.renders["a train"].prompts
    assert prompts[0] == "a train" and prompts[-1] == "a boat"  # from the next chunk not started
    assert [c.index for c in h.chunks("a")] == [0, 1, 2, 3]  # no chunk lost, none restarted
    errors = [(e.param, e.code) for e in h.of(p.StreamError)]
    assert errors == [("prompt", p.ErrorCode.INVALID_VALUE),
                      ("video_id", p.ErrorCode.INVALID_VALUE)]
    assert "SteerVideo.video_id: 'zz' is not in progress" in h.of(p.StreamError)[1].message
    assert h.of(p.VideoDone)[0].status == DONE.COMPLETED
    h.close()


# ------------------------------------------------------------------ the real Helios path


@pytest.fixture(scope="module")
def helios_dir(tmp_path_factory):
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    from tiny_helios import save_tiny_helios

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only contend on a shared machine
    yield save_tiny_helios(tmp_path_factory.mktemp("helios"))
    torch.set_num_threads(threads)


def frames_of(chunks: list[p.VideoChunk], size: int = 16) -> np.ndarray:
    return np.concatenate([np.frombuffer(c.frames, np.uint8).reshape(c.num_frames, size,
                                                                      size, 3) for c in chunks])


HELIOS_VIDEO = p.CreateVideo("s1", "v", "dance monkey", width=16, height=16, num_frames=65,
                             num_inference_steps=2, guidance_scale=1.0, seed=3)


def test_helios_through_the_video_setting_streams_pieces_equal_to_a_plain_call(helios_dir):
    import torch
    from diffusers import HeliosPipeline

    from voxline.config import Settings
    from voxline.engines.models.helios.driver import to_uint8
    from voxline.engines.stage_registry import load_video

    model = load_video(Settings(video=f"helios:{helios_dir}"))
    assert model.decode_ahead == 1  # pipelined by default
    h = Harness(model)
    h.send(p.OpenStream("s1"), HELIOS_VIDEO)
    h.run_until(has(p.VideoChunk, index=0, chunk_done=True))
    assert not h.of(p.VideoDone)  # the first chunk is out before the video ends
    h.run_until(has(p.VideoDone))
    chunks = h.chunks("v")
    # the Wan VAE decodes a latent frame a piece: 1 frame, then 4 (the last chunk's last 3)
    assert [(c.index, c.piece, c.num_frames) for c in chunks] == (
        [(0, 0, 1)] + [(0, i, 4) for i in range(1, 9)]
        + [(1, 0, 1)] + [(1, i, 4) for i in range(1, 8)] + [(1, 8, 3)])
    per_chunk = [[c for c in chunks if c.index == k] for k in (0, 1)]
    assert [sum(c.num_frames for c in cs) for cs in per_chunk] == [33, 32]
    assert [c.chunk_done for c in chunks] == [False] * (len(per_chunk[0]) - 1) + [True] + [
        False] * (len(per_chunk[1]) - 1) + [True]
    assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]
    pipe = HeliosPipeline.from_pretrained(str(helios_dir))
    pipe.set_progress_bar_config(disable=True)
    ref = pipe("dance monkey", height=16, width=16, num_frames=65, num_inference_steps=2,
               guidance_scale=1.0, generator=torch.Generator().manual_seed(3),
               output_type="np").frames[0]
    assert np.array_equal(frames_of(chunks), to_uint8(ref))
    h.close()


def test_pieces_are_sent_while_their_chunk_still_decodes_and_match_the_serial_order(helios_dir):
    """The first piece reaches the stream while the first chunk's last latent frame is held
    back in the decoder (ordering by events, not time); pipelined and serial give the same
    frames on the same seed."""
    import threading

    from voxline.config import Settings
    from voxline.engines.stage_registry import load_video

    serial_model = load_video(Settings(video=f"helios:{helios_dir}", video_pipelined_decode="off"))
    assert serial_model.decode_ahead == 0
    h = Harness(serial_model)
    h.send(p.OpenStream("s1"), HELIOS_VIDEO)
    h.run_until(has(p.VideoDone))
    serial = frames_of(h.chunks("v"))
    h.close()

    model = load_video(Settings(video=f"helios:{helios_dir}"))
    release, calls = threading.Event(), []
    original = model._vae_pieces

    def held_pieces(current):
        for k, piece in enumerate(original(current)):
            if not calls and k == current.shape[2] - 1:  # the first chunk's last latent frame
                assert release.wait(60)
            yield piece
        calls.append(1)

    model._vae_pieces = held_pieces
    h = Harness(model)
    h.send(p.OpenStream("s1"), HELIOS_VIDEO)
    h.run_until(has(p.VideoChunk, index=0, piece=7))
    assert not [c for c in h.chunks("v") if c.chunk_done]  # the chunk is not all decoded
    release.set()
    h.run_until(has(p.VideoDone))
    assert h.of(p.VideoDone)[0].status == DONE.COMPLETED
    assert np.array_equal(frames_of(h.chunks("v")), serial)
    h.close()


def test_the_engine_imports_no_diffusers_until_a_video_model_loads():
    import subprocess
    import sys

    code = ("import sys, voxline, voxline.engines.core, voxline.engines.factory, "
            "voxline.engines.video_stage; print('diffusers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300)
    assert out.stdout.strip() == "False"


def test_video_messages_cross_the_process_wire_unchanged():
    chunk = p.VideoChunk("s1", "v", bytes(range(48)), num_frames=1, height=4, width=4, index=0,
                         total_chunks=2, final=False, piece=3, chunk_done=False)
    done = p.VideoDone("s1", "v", DONE.CANCELLED)
    assert [p.decode_output(p.encode(m)) for m in (chunk, done)] == [chunk, done]
    create = video("s1", "v", seed=9, steps_per_stage=2, realtime=True, wait_for_slot=True)
    assert p.decode_input(p.encode(create)) == create
    assert p.decode_input(p.encode(p.CancelVideo("s1", "v"))) == p.CancelVideo("s1", "v")
    steer = p.SteerVideo("s1", "v", "a boat", negative_prompt="blur")
    assert p.decode_input(p.encode(steer)) == steer


@pytest.mark.parametrize("ahead", [1, 0])
def test_a_video_is_denoised_at_most_decode_ahead_chunks_ahead_of_its_decode(ahead):
    from voxline.engines.video_stage import VideoJob, VideoStage

    model = FakeVideoModel(decode_ahead=ahead)
    stage = VideoStage(model, first_frame_first=False)
    job = VideoJob(1, "a", model.begin_video(video("s1", "a", frames=8)))  # 4 chunks
    stage.add(job)
    for _ in range(ahead + 1):  # chunk 0, and chunk 1 beside its decode when pipelined
        planned = stage.schedule()
        assert planned is job
        stage.update(job, stage.execute(job))
    assert not stage.has_work() and stage.schedule() is None  # held back by the decode
    decoder = stage.decoder
    item = decoder.schedule()
    piece = decoder.update(item, decoder.execute(item))
    assert (piece.index, piece.last, job.chunks_decoded) == (0, True, 1)
    assert stage.has_work() and stage.schedule() is job  # the next chunk may go


class TwoPieces(OnePiece):
    """A chunk decoded in two pieces (the first frame, then the rest)."""

    def __init__(self, frames: np.ndarray) -> None:
        super().__init__(frames)
        self.sent = 0

    def next_piece(self) -> tuple[np.ndarray, bool]:
        self.sent += 1
        return self.frames[self.sent - 1:self.sent], self.sent == 2


def test_the_second_chunk_waits_for_the_first_frame_then_overlaps_the_rest():
    from voxline.engines.video_stage import VideoJob, VideoStage

    model = FakeVideoModel(decode_ahead=1)
    stage = VideoStage(model)  # first_frame_first by default
    render = model.begin_video(video("s1", "a", frames=6))  # 3 chunks
    render.denoise_next = lambda r=render, f=render.denoise_next: TwoPieces(f().frames)
    job = VideoJob(1, "a", render)
    stage.add(job)
    stage.update(job, stage.execute(stage.schedule()))  # chunk 0 denoised
    assert not stage.has_work() and stage.schedule() is None  # chunk 1 waits for frame 1
    decoder = stage.decoder
    item = decoder.schedule()
    first = decoder.update(item, decoder.execute(item))
    assert (first.index, first.piece, first.last, first.frames.shape[0]) == (0, 0, False, 1)
    assert stage.schedule() is job  # the first frame is out: chunk 1 denoises beside the rest
    stage.update(job, stage.execute(job))
    assert stage.schedule() is None  # chunk 2: one chunk ahead of the decode at most
    rest = decoder.update(item, decoder.execute(decoder.schedule()))
    assert (rest.index, rest.piece, rest.last, job.chunks_decoded) == (0, 1, True, 1)
    assert stage.schedule() is job  # no hold after the first chunk: only the backpressure


def test_cancel_mid_chunk_sends_nothing_more_of_the_video(helios_dir):
    import threading

    from voxline.config import Settings
    from voxline.engines.stage_registry import load_video

    model = load_video(Settings(video=f"helios:{helios_dir}"))
    release = threading.Event()
    original = model._vae_pieces

    def held_pieces(current):
        for k, piece in enumerate(original(current)):
            if k == 2:
                assert release.wait(60)
            yield piece

    model._vae_pieces = held_pieces
    h = Harness(model)
    h.send(p.OpenStream("s1"), HELIOS_VIDEO)
    h.run_until(has(p.VideoChunk, index=0, piece=1))  # the decode now waits in piece 2
    h.send(p.CancelVideo("s1", "v"))
    h.run_until(has(p.VideoDone))
    sent = len(h.chunks("v"))
    release.set()
    h.drain()
    assert len(h.chunks("v")) == sent == 2  # the piece decoding at the cancel is dropped
    assert [(d.video_id, d.status) for d in h.of(p.VideoDone)] == [("v", DONE.CANCELLED)]
    model._vae_pieces = original  # the VAE is free for the next video (its cache cleared)
    h.send(p.CreateVideo("s1", "w", "dance monkey", width=16, height=16, num_frames=33,
                         num_inference_steps=2, guidance_scale=1.0, seed=3))
    h.run_until(has(p.VideoDone, video_id="w"))
    assert h.of(p.VideoDone)[-1].status == DONE.COMPLETED
    assert len(h.chunks("v")) == 2  # still: the held piece came back after the cancel
    h.close()


def test_no_denoise_chunk_starts_while_the_voice_is_low_and_the_decode_goes_on():
    from voxline.engines.video_stage import VideoJob, VideoStage

    now, low = [0.0], [False]
    model = FakeVideoModel(decode_ahead=1)
    stage = VideoStage(model, first_frame_first=False, voice_low=lambda: low[0],
                       clock=lambda: now[0])
    job = VideoJob(1, "a", model.begin_video(video("s1", "a", frames=6)))  # 3 chunks
    stage.add(job)
    stage.update(job, stage.execute(stage.schedule()))  # chunk 0 denoised
    low[0] = True
    assert not stage.has_work() and stage.schedule() is None  # chunk 1 held: no busy loop
    decoder = stage.decoder
    assert decoder.has_work()  # frames already denoised are due at the player
    item = decoder.schedule()
    assert decoder.update(item, decoder.execute(item)).index == 0
    now[0] = 1.5
    assert stage.schedule() is None and job.holds == 1  # one hold, however often asked
    low[0], now[0] = False, 2.0
    assert stage.has_work() and stage.schedule() is job  # resumes as the pressure goes
    assert (job.holds, job.held_s, job.held_since) == (1, 2.0, None)
    stage.update(job, stage.execute(job))
    low[0], now[0] = True, 3.0
    item = decoder.schedule()
    decoder.update(item, decoder.execute(item))
    assert stage.schedule() is None and job.holds == 2
    assert job.held_seconds(3.5) == 2.5


class GatedTTS(ToneTTS):
    """ToneTTS whose segments wait for `gate` (set: they go at once)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()

    def synthesize(self, text: str, *, speed: float = 1.0, seed: int | None = None):
        assert self.gate.wait(30)
        yield from super().synthesize(text, speed=speed, seed=seed)


class GatedRender(CountingRender):
    """CountingRender whose chunk `gated`'s denoise waits for `gate`; counts starts."""

    def __init__(self, chunks: int, gated: int) -> None:
        super().__init__(chunks)
        self.gated = gated
        self.gate = threading.Event()
        self.started = 0

    def denoise_next(self) -> OnePiece:
        self.started += 1
        if self.made == self.gated:
            assert self.gate.wait(30)
        return super().denoise_next()


class GatedVideoModel(FakeVideoModel):
    def begin_video(self, msg: p.CreateVideo) -> GatedRender:
        render = GatedRender(msg.num_frames // 2, gated=1)
        self.renders[msg.prompt] = render
        return render


def test_a_video_chunk_waits_while_a_spoken_reply_runs_low_then_the_video_completes(caplog):
    """A real core: a spoken reply (flow-controlled by playout reports) and a video. A
    report leaves the reply 100 ms of unplayed audio while its next segment is slow: the
    video's chunk in flight finishes and decodes, the next one waits (the loop idle, not
    spinning) until the reply's audio comes, then the video completes."""
    caplog.set_level(logging.INFO, logger="voxline.engines.video_stage")
    tts, model = GatedTTS(), GatedVideoModel()
    h = Harness(model, core=dict(generation_lead_ms=1000, video_voice_reserve_ms=500),
                tts=tts)
    text = " ".join(f"This is sentence number {i}." for i in range(40))
    h.send(p.OpenStream("s1"), p.Speak("s1", "r1", text), p.PlayoutProgress("s1", "r1", 0.0))
    stream = h.core.streams["s1"]
    h.run_until(lambda _o: h.core.responses.active(stream).held)  # a lead ahead of playout
    tts.gate.clear()
    h.send(video("s1", "v", frames=6))  # 3 chunks
    render = model.renders["a train"]
    h.run_until(lambda _o: has(p.VideoChunk, video_id="v", index=0)(_o) and render.started == 2)
    audio_ms = sum(a.duration_ms for a in h.of(p.AudioChunk))
    h.send(p.PlayoutProgress("s1", "r1", audio_ms - 100))  # the reply's buffer runs low
    reported = len(h.outputs)
    render.gate.set()
    h.run_until(has(p.VideoChunk, video_id="v", index=1))  # the decode is not held
    for _ in range(5):
        assert not h.core.has_work()  # the video is held and the loop would sleep
        h.outputs.extend(h.core.step())
    assert render.started == 2 and [c.index for c in h.chunks("v")] == [0, 1]
    tts.gate.set()  # the reply's next audio comes: its lead recovers
    h.run_until(has(p.VideoDone, video_id="v"))
    assert [(d.video_id, d.status) for d in h.of(p.VideoDone)] == [("v", DONE.COMPLETED)]
    assert [c.index for c in h.chunks("v")] == [0, 1, 2]
    after = h.outputs[reported:]
    last_chunk = next(i for i, o in enumerate(after) if isinstance(o, p.VideoChunk)
                      and o.index == 2)
    assert any(isinstance(o, p.AudioChunk) for o in after[:last_chunk])
    assert "video v: its denoise waited" in caplog.text and "in 1 hold(s)" in caplog.text
    h.close()


@pytest.mark.parametrize("fields", [
    {"video_voice_reserve_ms": -1},
    {"video_voice_reserve_ms": 20000},
    {"video": "helios:/ckpt", "generation_lead_s": 0.4},  # the reserve (500 ms) past the lead
])
def test_a_bad_voice_reserve_is_refused_naming_the_field(fields):
    from pydantic import ValidationError

    from voxline.config import Settings

    with pytest.raises(ValidationError, match="video_voice_reserve_ms"):
        Settings(**fields)
    assert Settings(generation_lead_s=0.4).video_voice_reserve_ms == 500  # no video: unused


def test_a_gpu_video_model_is_warmed_with_a_two_chunk_realtime_video_before_ready():
    """On CUDA the start-up warm-up renders one real-time video at the default size through
    the model's own path (compile, prompt encoder, the streams' memory); off CUDA nothing."""
    from voxline.engines.stage_registry import STAGES

    warm_up = next(reg.warm_up for reg in STAGES if reg.name == "video")
    asked: list[p.CreateVideo] = []

    class Pieces(OnePiece):
        def __init__(self, frames):
            super().__init__(frames)
            self.left = 3

        def next_piece(self):
            self.left -= 1
            return self.frames, self.left == 0

    class Model(FakeVideoModel):
        device = "cuda:0"

        def begin_video(self, msg):
            asked.append(msg)
            render = super().begin_video(msg)
            made = render.denoise_next
            render.denoise_next = lambda: Pieces(made().frames)
            return render

    model = Model()
    warm_up(model)
    assert [(m.width, m.height, m.num_frames, m.realtime) for m in asked] == [(640, 384, 65, True)]
    render = model.renders["a warm-up clip"]
    assert render.finished and render.made == render.total_chunks
    cpu = FakeVideoModel()
    warm_up(cpu)  # no device attribute: a CPU model, nothing rendered
    assert cpu.renders == {}
