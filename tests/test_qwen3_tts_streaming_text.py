"""One talker stream per reply: Qwen3SpeechModel fed text as it is written.

A `more_text` job takes later segments into the same talker stream (the model's
streaming-text layout: one text token per frame), over one decoder state for the whole
reply. Random-weight tiny checkpoint (see test_qwen3_tts_stage): exact on frames and
states, but its audio is noise.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from fakes import CountingLM, EnergyVAD, FixedASR
from test_qwen3_tts_stage import Harness, audio, make_stage, of, write_test_checkpoint

from voxline.engines import protocol as p
from voxline.engines.core import EngineCore, Models
from voxline.engines.models.qwen3_tts import TalkerGenerator, TalkerSampling
from voxline.engines.models.qwen3_tts.generation import awaits_text
from voxline.engines.speech_model import SpeechJob

# EOS masked: the tiny random talker would stop after a few frames on some texts; here
# every stream runs to its frame limit (well past the text, into tts_eos and tts_pad).
NO_EOS = TalkerSampling.greedy(min_frames=10_000)
SEGMENTS = ["Hello there, how are you today?", "The quick brown fox.", "Fine, thank you!"]
WHOLE = " ".join(SEGMENTS)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_test_checkpoint(tmp_path_factory.mktemp("qwen3-streaming-text") / "model")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Recorder:
    """Wraps a stage's talker generator and decoder: every frame made (per job), every
    decoder state made, and the state each decode ran on."""

    def __init__(self, stage) -> None:
        self.frames: dict[int, list[torch.Tensor]] = {}
        self.stepped: list[set[int]] = []  # job ids stepped, per talker step
        self.streams: dict[int, int] = {}  # talker streams started, per job
        self.states: list[object] = []
        self.decoded_on: list[int] = []  # id() of the state of every eager decode
        gen, dec = stage.generator, stage.decoder
        step, start, new_state, decode_batch = gen.step, gen.start, dec.new_state, dec.decode_batch

        def rec_step(streams):
            self.stepped.append({s.stream_id for s in streams})
            results = step(streams)
            for r in results:
                if r.frame is not None:
                    self.frames.setdefault(r.stream.stream_id, []).append(r.frame.cpu())
            return results

        def rec_start(prompt, params, stream_id=None):
            self.streams[stream_id] = self.streams.get(stream_id, 0) + 1
            return start(prompt, params, stream_id=stream_id)

        def rec_new_state(*args):
            state = new_state(*args)
            self.states.append(state)
            return state

        def rec_decode_batch(states, codes):
            self.decoded_on += [id(s) for s in states]
            return decode_batch(states, codes)

        self.full_decode = lambda frames: dec.decode(new_state(), frames.T).numpy()
        gen.step, gen.start = rec_step, rec_start
        dec.new_state, dec.decode_batch = rec_new_state, rec_decode_batch

    full_decode: object  # frames [T, G] -> a one-shot decode on a fresh state (unrecorded)

    def of(self, job_id: int) -> torch.Tensor:
        return torch.stack(self.frames[job_id])


def one_prompt_frames(stage, text: str) -> torch.Tensor:
    """The frames of a single talker prompt holding the whole text (greedy)."""
    prompt, sampling = stage.prepare(SpeechJob(0, text))
    gen = TalkerGenerator(stage.model.talker, max_streams=1, max_len=512)
    (frames,) = gen.generate([prompt], sampling)
    return frames


def drain(stage, outs: list) -> None:
    while stage.has_work():
        outs += stage.step()


@pytest.mark.parametrize("when", ["before_start", "while_talking"])
def test_text_there_before_the_talker_needs_it_gives_the_one_prompt_frames(model_dir, when):
    stage = make_stage(model_dir, max_frames=60, sampling=NO_EOS)
    rec = Recorder(stage)
    outs: list = []
    stage.start(SpeechJob(1, SEGMENTS[0], more_text=True))
    if when == "while_talking":
        outs += stage.step()  # prefill; the first segment alone has text for many frames
        outs += stage.step()
    for seg in SEGMENTS[1:]:
        stage.append_text(1, seg)
        if when == "while_talking":
            outs += stage.step()
    stage.end_text(1)
    drain(stage, outs)
    want = one_prompt_frames(stage, WHOLE)
    got = rec.of(1)
    assert len(want) == 60, "the talker goes past the text (trailing tts_eos / pad)"
    assert torch.equal(got, want), "greedy frames are token-identical to one whole-text prompt"
    assert rec.streams == {1: 1} and len(rec.states) == 1
    wav = audio(outs)
    assert np.abs(wav - rec.full_decode(want)).max() <= 1e-4
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    assert " ".join(o.text for o in outs if o.text) == WHOLE  # every segment placed once


def test_text_arriving_late_holds_the_talker_and_never_resets_the_decoder(model_dir):
    stage = make_stage(model_dir, initial_chunk_frames=2, chunk_frames=4, max_frames=60,
                       sampling=NO_EOS)
    rec = Recorder(stage)
    outs: list[tuple[int, object]] = []
    stage.start(SpeechJob(1, SEGMENTS[0], more_text=True))
    i = 0

    def steps(n: int) -> None:
        nonlocal i
        for _ in range(n):
            outs.extend((i, o) for o in stage.step())
            i += 1

    # The first segment runs out of text after its tokens are fed; the stream then waits.
    steps(40)
    (entry,) = stage._jobs.values()
    assert awaits_text(entry.stream, stage.generator.eos), "the talker waits for text"
    made, talker_steps = len(rec.frames[1]), len(rec.stepped)
    assert 5 < made < 40
    steps(10)
    assert len(rec.frames[1]) == made and len(rec.stepped) == talker_steps, "held back"
    assert entry.pending == [], "frames made before the wait are all decoded"
    # Nothing to do until text comes (the engine does not spin), the job still open.
    assert not stage.has_work() and 1 in stage._jobs
    assert not any(o.finished for _, o in outs)
    for seg in SEGMENTS[1:]:
        stage.append_text(1, seg)
        steps(3)
    stage.end_text(1)
    while stage.has_work():
        steps(1)

    got = [o for _, o in outs]
    frames = rec.of(1)
    assert len(frames) > made + 20
    # One talker stream and one decoder state for the whole reply, every decode on it.
    assert rec.streams == {1: 1} and len(rec.states) == 1
    assert set(rec.decoded_on) == {id(rec.states[0])}
    # One continuous waveform: the chunks equal a one-shot decode of every frame.
    full = rec.full_decode(frames)
    assert np.abs(audio(got) - full).max() <= 1e-4 and np.abs(full).max() > 1e-3
    # Holding the talker back changed nothing: the frames are those of the whole text.
    assert torch.equal(frames, one_prompt_frames(stage, WHOLE))
    assert [o.finished for o in got] == [False] * (len(got) - 1) + [True]
    assert " ".join(o.text for o in got if o.text) == WHOLE


def test_text_after_the_talker_stopped_gets_a_new_stream_on_the_same_decoder(model_dir):
    stage = make_stage(model_dir, max_frames=12, sampling=NO_EOS)  # the first stream stops at the limit
    rec = Recorder(stage)
    outs: list = []
    stage.start(SpeechJob(1, SEGMENTS[0], more_text=True))
    for _ in range(30):
        outs += stage.step()
    (entry,) = stage._jobs.values()
    assert entry.stream is None and not stage.has_work(), "stopped, waiting for text, no slot"
    assert 1 in stage._jobs
    assert len(rec.frames[1]) == 12
    stage.append_text(1, SEGMENTS[1])
    stage.end_text(1)
    drain(stage, outs)
    frames = rec.of(1)
    assert rec.streams == {1: 2} and len(frames) > 12
    assert len(rec.states) == 1 and set(rec.decoded_on) == {id(rec.states[0])}
    full = rec.full_decode(frames)
    assert np.abs(audio(outs) - full).max() <= 1e-4
    assert " ".join(o.text for o in outs if o.text) == " ".join(SEGMENTS[:2])


def test_cancel_mid_reply_frees_the_stream_and_ignores_later_text(model_dir):
    stage = make_stage(model_dir, max_streams=1, max_frames=60, sampling=NO_EOS)
    outs: list = []
    stage.start(SpeechJob(1, SEGMENTS[0], more_text=True))
    for _ in range(6):
        outs += stage.step()
    assert of([(0, o) for o in outs], 1)
    stage.cancel(1)
    stage.append_text(1, SEGMENTS[1])  # late text for a cancelled job: ignored
    stage.end_text(1)
    assert not stage.has_work()
    # Its only talker slot is free again: another job runs to the end.
    stage.start(SpeechJob(2, SEGMENTS[2]))
    rest: list = []
    drain(stage, rest)
    assert {o.job_id for o in rest} == {2} and rest[-1].finished


def test_appending_to_a_closed_job_is_an_error(model_dir):
    stage = make_stage(model_dir)
    stage.start(SpeechJob(1, SEGMENTS[0]))
    with pytest.raises(ValueError, match="text has ended"):
        stage.append_text(1, "more")
    stage.start(SpeechJob(2, "", more_text=True))  # nothing yet: waits, holding no slot
    stage.step()
    stage.append_text(2, SEGMENTS[2])
    stage.end_text(2)
    outs: list = []
    drain(stage, outs)
    assert of([(0, o) for o in outs], 2)[-1].finished
    assert "".join(o.text for o in outs if o.job_id == 2) == SEGMENTS[2]


# --------------------------------------------------------------------------- engine


class ReplyHarness(Harness):
    """The engine with the Qwen3 stage and an LM that writes a long reply slowly, so
    clauses reach the talker while it runs; records the stage's jobs and appends."""

    def __init__(self, stage) -> None:
        self.woke = threading.Event()
        self.stage = stage
        self.lm = CountingLM(stop_after=24, step_seconds=0.02)
        self.core = EngineCore(Models(EnergyVAD(), FixedASR(), self.lm, stage), self.woke.set)
        self.outputs: list[p.EngineOutput] = []
        self.rec = Recorder(stage)
        self.starts: list[SpeechJob] = []
        self.appends: list[tuple[int, str]] = []
        start, append = stage.start, stage.append_text

        def rec_start(job: SpeechJob) -> None:
            self.starts.append(job)
            start(job)

        def rec_append(job_id: int, text: str) -> None:
            self.appends.append((job_id, text))
            append(job_id, text)

        stage.start, stage.append_text = rec_start, rec_append


@pytest.fixture
def engine(model_dir):
    h = ReplyHarness(make_stage(model_dir, max_frames=120, max_len=512, sampling=NO_EOS))
    h.core.add_input(p.OpenStream("s1", p.StreamConfig(turn_detection=None)))
    yield h
    h.core.close()


def test_engine_speaks_a_reply_as_one_stream_as_the_llm_writes_it(engine):
    h = engine
    h.core.add_input(p.AddItem("s1", "u1", "user", "talk"))
    h.core.add_input(p.CreateResponse("s1", "r1", "a1"))
    h.run_until(lambda outs: any(isinstance(o, p.ResponseFinished) for o in outs), timeout=60)
    (done,) = h.of(p.ResponseFinished, "r1")
    chunks = h.of(p.AudioChunk, "r1")
    assert done.status == p.ResponseStatus.COMPLETED and chunks
    (job,) = h.starts  # one speech job for the whole reply ...
    assert job.more_text and len(h.appends) >= 2  # ... fed clause by clause
    assert h.rec.streams == {job.job_id: 1} and len(h.rec.states) == 1  # one decoder state
    frames = h.rec.of(job.job_id)
    wav = np.concatenate([np.frombuffer(c.audio, np.float32) for c in chunks])
    full = h.rec.full_decode(frames)
    assert np.abs(wav - full).max() <= 1e-4, "one continuous waveform"
    text = " ".join([job.text] + [t for _, t in h.appends])
    assert text == done.text
    item = h.core.streams["s1"].conversation.find("a1")
    assert " ".join(s.text for s in item.spans) == done.text


def test_engine_cancel_and_truncate_mid_reply(engine):
    h = engine
    h.core.add_input(p.AddItem("s1", "u1", "user", "talk"))
    h.core.add_input(p.CreateResponse("s1", "r1", "a1"))
    # Mid-reply: three segments have started to play (the tiny codec's audio is short).
    h.run_until(lambda outs: len([c for c in h.of(p.AudioChunk, "r1") if c.text]) >= 3,
                timeout=60)
    h.core.add_input(p.CancelResponse("s1"))
    h.outputs.extend(h.core.step())
    (done,) = h.of(p.ResponseFinished, "r1")
    assert done.status == p.ResponseStatus.CANCELLED
    n = len(h.outputs)
    h.run_until(lambda outs: not h.core.has_work() and not h.stage.has_work(), timeout=10)
    assert not [o for o in h.outputs[n:] if isinstance(o, p.AudioChunk)]
    # The listener heard (about) all the audio sent: the item keeps what that audio
    # spoke and loses the text the LLM wrote that was never spoken.
    heard = h.of(p.AudioChunk, "r1")
    heard_ms = int(sum(c.duration_ms for c in heard))
    spoken = " ".join(c.text for c in heard if c.text)
    assert spoken and done.text.startswith(spoken) and len(spoken) < len(done.text)
    h.core.add_input(p.TruncateItem("s1", "a1", heard_ms))
    h.run_until(lambda outs: any(isinstance(o, p.TruncationApplied) for o in outs))
    (trunc,) = [o for o in h.outputs if isinstance(o, p.TruncationApplied)]
    assert trunc.audio_end_ms == heard_ms
    assert trunc.text and spoken.startswith(trunc.text)
    assert h.core.streams["s1"].conversation.find("a1").text == trunc.text
    # The next reply is a new stream of its own and runs to the end.
    h.core.add_input(p.AddItem("s1", "u2", "user", "and"))
    h.core.add_input(p.CreateResponse("s1", "r2", "a2"))
    h.run_until(lambda outs: any(isinstance(o, p.ResponseFinished) and o.response_id == "r2"
                                 for o in outs), timeout=60)
    assert len(h.starts) == 2 and h.starts[1].more_text


def test_graphed_generator_and_codec_take_streaming_text_too(model_dir):
    """The graphed path (on the CPU its eager twin): the same held-back stream, frames
    equal to the same stage speaking the whole text as one job, one codec state slot."""
    stage = make_stage(model_dir, graphs=True, max_frames=60, sampling=NO_EOS)
    assert stage.codec is not None
    rec = Recorder(stage)
    opened: list[int] = []
    open_slot = stage.codec.open
    stage.codec.open = lambda: opened.append(open_slot()) or opened[-1]  # type: ignore[method-assign]
    whole: list = []
    stage.start(SpeechJob(1, WHOLE))
    drain(stage, whole)
    outs: list = []
    stage.start(SpeechJob(2, SEGMENTS[0], more_text=True))
    for _ in range(40):
        outs += stage.step()
    made = len(rec.frames[2])
    assert made < 40 and not stage.has_work() and 2 in stage._jobs, "held back for text"
    for seg in SEGMENTS[1:]:
        stage.append_text(2, seg)
        outs += stage.step()
    stage.end_text(2)
    drain(stage, outs)
    assert torch.equal(rec.of(2), rec.of(1)) and len(rec.of(2)) == 60
    assert rec.streams == {1: 1, 2: 1} and len(opened) == 2  # one slot per job
    a, b = audio(outs), audio(whole)  # chunked differently (the wait flushes a chunk)
    assert a.shape == b.shape and np.abs(a - b).max() <= 1e-4


@pytest.mark.parametrize("ref_text", ["Fine, thank you!", None], ids=["icl", "xvector"])
def test_cloned_voices_take_streaming_text_on_one_decoder_state(tmp_path, ref_text):
    """x-vector clones stream like preset voices (one talker stream). In-context clones
    hold their whole text in the prompt, so a later segment starts a new talker stream,
    on the same decoder state, primed once with the reference codes."""
    from test_qwen3_voice_clone_api import clip, reference, write_base_checkpoint

    stage = make_stage(write_base_checkpoint(tmp_path / "base"), max_frames=30,
                       sampling=NO_EOS)
    rec = Recorder(stage)
    primed: list[object] = []
    prime = stage.decoder.prime
    stage.decoder.prime = lambda state, codes: (primed.append(state), prime(state, codes))[1]
    ref = reference(clip(), 16000, ref_text)
    outs: list = []
    stage.start(SpeechJob(1, SEGMENTS[1], more_text=True, reference=ref))
    for _ in range(40):
        outs += stage.step()
    stage.append_text(1, SEGMENTS[2])
    stage.end_text(1)
    drain(stage, outs)
    frames = rec.of(1)
    assert len(rec.states) == 1 and set(rec.decoded_on) == {id(rec.states[0])}
    assert primed == ([rec.states[0]] if ref_text else [])
    assert rec.streams == {1: 2 if ref_text else 1}
    state = stage.decoder.new_state()  # unrecorded from here: the one-shot reference decode
    clone = stage.reference_of(SpeechJob(9, "x", reference=ref))
    if clone.ref_codes is not None:
        prime(state, clone.ref_codes.T)
    want = stage.decoder.decode(state, frames.T).numpy()
    assert np.abs(audio(outs) - want).max() <= 1e-4, "one continuous waveform"
    assert " ".join(o.text for o in outs if o.text) == " ".join(SEGMENTS[1:])
