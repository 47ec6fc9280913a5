"""EngineCore stream logic with hand-built models: turns, async chunks, cancel, truncate."""

from __future__ import annotations

import numpy as np
from core_driver import CoreDriver
from fakes import CountingLM, EnergyVAD, FixedASR, ToneTTS, tone

from voxline.engines import protocol as p
from voxline.engines.core import EngineCore, Models
from voxline.engines.speech_model import SentenceSpeechModel


class Harness(CoreDriver):
    """An EngineCore over the hand-built models."""

    def __init__(self, stop_after: int = 12, asr_text: str = "hello there friend",
                 step_seconds: float = 0.0, **core_kwargs) -> None:
        super().__init__()
        self.lm = CountingLM(stop_after=stop_after, step_seconds=step_seconds)
        self.tts = ToneTTS()
        self.asr = FixedASR(asr_text)
        stage = SentenceSpeechModel(self.tts)
        self.core = EngineCore(Models(EnergyVAD(), self.asr, self.lm, stage), self.woke.set,
                               **core_kwargs)


def has(cls, **fields):
    return lambda outs: any(
        isinstance(o, cls) and all(getattr(o, k) == v for k, v in fields.items()) for o in outs)


def speech_turn(seconds: float = 0.8) -> bytes:
    audio = np.concatenate([np.zeros(8000, np.float32), tone(seconds), np.zeros(16000, np.float32)])
    return audio.astype("<f4").tobytes()


def test_server_vad_turn_gives_speech_events_and_final_transcript():
    h = Harness()
    h.send(p.OpenStream("s1"), p.AppendAudio("s1", speech_turn()))
    h.run_until(has(p.TranscriptFinal))
    started, = h.of(p.VoiceStarted)
    stopped, = h.of(p.VoiceStopped)
    final, = h.of(p.TranscriptFinal)
    assert started.item_id == stopped.item_id == final.item_id
    assert 450 <= started.audio_start_ms <= 520  # the tone starts at 500 ms
    assert 1250 <= stopped.audio_end_ms <= 1350  # and ends at 1300 ms
    assert final.text == "hello there friend"
    assert [i.text for i in h.core.streams["s1"].conversation.items] == ["hello there friend"]
    h.close()


def test_response_streams_audio_before_the_llm_finishes_and_completes():
    h = Harness(stop_after=24, step_seconds=0.02)
    h.send(p.OpenStream("s1"), p.AddItem("s1", "u1", "user", "say something long"),
           p.CreateResponse("s1", "r1", "a1"))
    h.run_until(has(p.ResponseFinished))
    kinds = h.kinds()
    first_audio = kinds.index("AudioChunk")
    last_text = len(kinds) - 1 - kinds[::-1].index("ReplyTextDelta")
    assert first_audio < last_text, "TTS must start on the first segment (async chunk)"
    done, = h.of(p.ResponseFinished)
    assert done.status == p.ResponseStatus.COMPLETED and done.output_tokens == 24
    deltas = "".join(o.text for o in h.of(p.ReplyTextDelta))
    assert done.text == deltas.strip()
    spoken = " ".join(o.text for o in h.of(p.AudioChunk))
    assert spoken.split() == deltas.split()  # every word spoken exactly once, in order
    items = h.core.streams["s1"].conversation.items
    assert [i.item_id for i in items] == ["u1", "a1"] and items[1].text == done.text
    h.close()


def test_cancel_stops_the_response_and_never_sends_a_stale_chunk():
    h = Harness(stop_after=200)
    h.send(p.OpenStream("s1"), p.AddItem("s1", "u1", "user", "talk"),
           p.CreateResponse("s1", "r1", "a1"))
    h.run_until(has(p.AudioChunk))
    h.send(p.CancelResponse("s1"))
    h.outputs.extend(h.core.step())
    done, = h.of(p.ResponseFinished)
    assert done.status == p.ResponseStatus.CANCELLED
    n = len(h.outputs)
    assert not h.core.llm.has_work()  # the batch slot is free right away
    # a new response starts; nothing of r1 may follow its ResponseDone
    h.send(p.CreateResponse("s1", "r2", "a2", p.ResponseConfig(max_output_tokens=3)))
    h.run_until(lambda outs: len([o for o in outs if isinstance(o, p.ResponseFinished)]) == 2)
    assert all(getattr(o, "response_id", "r2") == "r2" for o in h.outputs[n:])
    h.close()


def test_truncate_keeps_only_what_was_heard_and_rolls_context_back():
    h = Harness(stop_after=30)
    h.send(p.OpenStream("s1"), p.AddItem("s1", "u1", "user", "talk"),
           p.CreateResponse("s1", "r1", "a1"))
    h.run_until(has(p.ResponseFinished))
    chunks = h.of(p.AudioChunk)
    assert len(chunks) >= 2
    heard_ms = int(chunks[0].duration_ms)
    h.send(p.TruncateItem("s1", "a1", heard_ms))
    h.run_until(has(p.TruncationApplied))
    trunc, = h.of(p.TruncationApplied)
    assert trunc.text == chunks[0].text.strip()
    # the next response's prompt holds the truncated text, re-prefilled from the cut
    h.lm.calls.clear()
    h.send(p.AddItem("s1", "u2", "user", "and"), p.CreateResponse("s1", "r2", "a2"))
    h.run_until(lambda outs: len([o for o in outs if isinstance(o, p.ResponseFinished)]) == 2)
    slot = h.core.streams["s1"].slot.index
    assert h.lm.cache[slot][: len(h.core.streams["s1"].slot.tokens)] == h.core.streams["s1"].slot.tokens
    a1 = h.core.streams["s1"].conversation.find("a1")
    assert a1.text == trunc.text and a1.audio_ms <= heard_ms + 1
    h.close()


def test_truncate_cuts_at_the_word_heard_and_later_truncates_clamp():
    h = Harness(stop_after=30)
    h.send(p.OpenStream("s1"), p.AddItem("s1", "u1", "user", "talk"),
           p.CreateResponse("s1", "r1", "a1"))
    h.run_until(has(p.ResponseFinished))
    chunks = h.of(p.AudioChunk)
    i = next(i for i, c in enumerate(chunks) if len(c.text.split()) >= 2)
    start_ms = sum(c.duration_ms for c in chunks[:i])
    words = chunks[i].text.strip().split()
    # ToneTTS: 10 ms per character, so the cut falls just after the chunk's first word
    cut = int(start_ms + (len(words[0]) + 1) * 10 + 5)
    heard = " ".join([c.text.strip() for c in chunks[:i]] + [words[0]])
    h.send(p.TruncateItem("s1", "a1", cut))
    h.run_until(has(p.TruncationApplied))
    trunc, = h.of(p.TruncationApplied)
    assert (trunc.audio_end_ms, trunc.text) == (cut, heard)  # mid-sentence, word-level
    a1 = h.core.streams["s1"].conversation.find("a1")
    assert a1.text == heard and a1.audio_ms == cut  # the item's audio ends at the cut
    # a second cut past the first (a client's own cut after the server's) clamps to it
    h.send(p.TruncateItem("s1", "a1", 10_000_000))
    h.run_until(lambda outs: len([o for o in outs if isinstance(o, p.TruncationApplied)]) == 2)
    again = h.of(p.TruncationApplied)[1]
    assert (again.audio_end_ms, again.text) == (cut, heard)
    h.send(p.TruncateItem("s1", "a1", 0))
    h.run_until(lambda outs: len([o for o in outs if isinstance(o, p.TruncationApplied)]) == 3)
    assert (h.of(p.TruncationApplied)[2].audio_end_ms, h.of(p.TruncationApplied)[2].text) == (0, "")
    assert not h.of(p.StreamError)
    h.close()


def test_truncate_or_delete_of_a_reply_cancelled_before_its_first_token():
    h = Harness(stop_after=30, step_seconds=0.05)
    h.send(p.OpenStream("s1"), p.AddItem("s1", "u1", "user", "talk"),
           p.CreateResponse("s1", "r1", "a1"), p.CancelResponse("s1"))
    h.run_until(has(p.ResponseFinished))
    h.send(p.TruncateItem("s1", "a1", 0), p.DeleteItem("s1", "a1"))
    h.run_until(has(p.TruncationApplied))
    assert h.of(p.TruncationApplied)[0].text == ""
    h.outputs.extend(h.core.step())
    assert not h.of(p.StreamError)
    h.close()


def test_manual_commit_and_errors_for_bad_inputs():
    h = Harness()
    h.send(p.OpenStream("m", p.StreamConfig(turn_detection=None)))
    h.send(p.CommitAudio("m", "i1"))  # nothing buffered
    h.send(p.AppendAudio("zzz", b"\0\0\0\0"))  # unknown stream
    h.send(p.OpenStream("m"))  # duplicate
    h.send(p.AppendAudio("m", tone(0.5).tobytes()), p.CommitAudio("m", "i2"))
    h.run_until(has(p.TranscriptFinal))
    codes = [e.code for e in h.of(p.StreamError)]
    assert codes == ["input_audio_buffer_commit_empty", "unknown_stream", "stream_exists"]
    assert h.of(p.TranscriptFinal)[0].item_id == "i2"
    assert not h.of(p.VoiceStarted)  # no server VAD on this stream
    h.close()


def test_second_response_while_one_is_active_is_refused():
    h = Harness(stop_after=50)
    h.send(p.OpenStream("s"), p.AddItem("s", "u", "user", "x"), p.CreateResponse("s", "r1", "a1"),
           p.CreateResponse("s", "r2", "a2"))
    h.outputs.extend(h.core.step())
    errs = h.of(p.StreamError)
    assert errs and errs[0].code == "conversation_already_has_active_response"
    h.close()


def test_streams_are_batched_and_independent():
    h = Harness(stop_after=6)
    for sid in ("a", "b", "c"):
        h.send(p.OpenStream(sid), p.AddItem(sid, "u", "user", "hi " + sid),
               p.CreateResponse(sid, "r-" + sid, "a-" + sid, p.ResponseConfig(audio=False)))
    h.run_until(lambda outs: len([o for o in outs if isinstance(o, p.ResponseFinished)]) == 3)
    assert any(len(slots) == 3 for slots, _ in h.lm.calls)  # one forward served all three
    for sid in ("a", "b", "c"):
        assert all(o.response_id == "r-" + sid for o in h.outputs
                   if getattr(o, "stream_id", None) == sid and hasattr(o, "response_id"))
    assert not h.of(p.AudioChunk)  # audio=False: text only
    h.send(p.CloseStream("b"))
    h.outputs.extend(h.core.step())
    assert h.of(p.StreamClosed)[0].stream_id == "b" and "b" not in h.core.streams
    assert len(h.lm.free) == 4 - 2  # b's slot went back
    h.close()


def test_response_requested_at_speech_stop_waits_for_the_transcript():
    h = Harness(stop_after=4)
    h.send(p.OpenStream("s1"), p.AppendAudio("s1", speech_turn()))
    h.run_until(has(p.VoiceStopped))
    assert not h.of(p.TranscriptFinal)  # ASR still running
    h.send(p.CreateResponse("s1", "r1", "a1"))
    h.run_until(has(p.ResponseFinished))
    kinds = h.kinds()
    assert kinds.index("TranscriptFinal") < kinds.index("ReplyTextDelta")
    lm_prompt = h.lm.calls[0][1][0]
    assert h.lm.render_message("user", "hello there friend")[3:6] == lm_prompt[-8:-5]
    h.close()


def test_speak_synthesizes_text_without_the_llm():
    h = Harness()
    h.send(p.OpenStream("t", p.StreamConfig(turn_detection=None)),
           p.Speak("t", "s1", "First sentence here. And a second one.", speed=1.0))
    h.run_until(has(p.ResponseFinished))
    # the first segment is cut short for early audio (two words at least), then sentences
    assert [c.text for c in h.of(p.AudioChunk)] == ["First sentence", "here.", "And a second one."]
    done, = h.of(p.ResponseFinished)
    assert done.status == p.ResponseStatus.COMPLETED and done.output_tokens == 0
    assert not h.lm.calls and not h.core.streams["t"].conversation.items
    h.close()


def test_long_conversations_keep_the_newest_turns_that_fit():
    h = Harness(stop_after=4)
    h.lm.max_len = 64
    h.send(p.OpenStream("s", p.StreamConfig(turn_detection=None, max_output_tokens=8)))
    for i in range(12):  # far more than 64 tokens of conversation
        h.send(p.AddItem("s", f"u{i}", "user", "one two three four five six"))
    h.send(p.CreateResponse("s", "r", "a"))
    h.run_until(has(p.ResponseFinished))
    done, = h.of(p.ResponseFinished)
    assert done.status == p.ResponseStatus.COMPLETED and done.input_tokens <= 64 - 8
    assert not h.of(p.StreamError)
    assert len(h.core.streams["s"].conversation.items) == 13  # nothing was deleted
    h.close()


def step(h: Harness) -> None:
    h.outputs.extend(h.core.step())


def after(outputs: list, output) -> list:
    return outputs[next(i for i, o in enumerate(outputs) if o is output) + 1:]


def test_reopen_while_the_old_stream_is_closing_gets_a_fresh_stream():
    h = Harness(stop_after=200, step_seconds=0.02)
    h.send(p.OpenStream("s1"), p.AddItem("s1", "u1", "user", "talk"),
           p.CreateResponse("s1", "r1", "a1"))
    h.run_until(has(p.ReplyTextDelta))
    old_slot = h.core.streams["s1"].slot.index
    assert h.core._llm_worker.running is not None  # a step writing old_slot is in flight
    # a reconnect: the caller closes its id and opens it again at once
    h.send(p.CloseStream("s1"), p.OpenStream("s1"), p.AddItem("s1", "u2", "user", "again"),
           p.CreateResponse("s1", "r2", "a2", p.ResponseConfig(max_output_tokens=3)))
    assert old_slot not in h.lm.free  # not handed back while the step still writes it
    h.run_until(has(p.ResponseFinished, response_id="r2"))
    assert not h.of(p.StreamError)
    closed, = h.of(p.StreamClosed)
    assert all(getattr(o, "response_id", "r2") == "r2" for o in after(h.outputs, closed))
    new = h.core.streams["s1"]
    assert new.slot.index != old_slot
    assert [i.item_id for i in new.conversation.items] == ["u2", "a2"]
    assert h.lm.cache[new.slot.index][:len(new.slot.tokens)] == new.slot.tokens
    assert sorted(h.lm.free) == sorted(set(range(4)) - {new.slot.index})  # old slot released
    h.close()


def test_a_transcript_of_the_closed_stream_never_reaches_its_successor():
    h = Harness()
    h.send(p.OpenStream("s1"), p.AppendAudio("s1", speech_turn()))
    h.run_until(has(p.VoiceStopped))
    assert h.core.table["asr"].worker.running is not None  # the final transcript is being made
    h.send(p.CloseStream("s1"), p.OpenStream("s1"))
    # the barrier: the closed stream's transcript is back from the ASR worker and routed
    h.run_until(lambda outs: h.core.table["asr"].worker.idle and not h.core.has_work())
    assert h.asr.calls >= 1 and not h.of(p.TranscriptFinal)
    assert not h.core.streams["s1"].conversation.items
    assert h.kinds()[-1] == "StreamClosed" and not h.of(p.StreamError)
    h.close()


def test_close_by_external_id_aborts_every_stream_behind_it():
    h = Harness(stop_after=40, step_seconds=0.01)
    for sid in ("x", "y"):
        h.send(p.OpenStream(sid), p.AddItem(sid, "u", "user", "talk"),
               p.CreateResponse(sid, "r-" + sid, "a-" + sid))
    h.run_until(lambda outs: {o.stream_id for o in outs if isinstance(o, p.AudioChunk)} == {"x", "y"})
    old_x = h.core.streams["x"].internal_id
    h.send(p.CloseStream("x"), p.OpenStream("x"), p.AddItem("x", "u", "user", "talk"),
           p.CreateResponse("x", "r-x2", "a-x2"))
    new_x = h.core.streams["x"].internal_id
    assert new_x != old_x  # a fresh internal stream under the same external id
    step(h)
    h.send(p.CloseStream("x"))  # aborts the new stream; the old one is already closing
    step(h)
    for internal in (old_x, new_x):  # nothing of either is left in any stage
        assert all(r.stream_id != internal for r in h.core.llm.running.values())
        assert not h.core.tts.jobs_of(internal)
        assert not h.core.asr.has_work()
    assert "x" not in h.core.streams
    h.run_until(has(p.ResponseFinished, response_id="r-y"))
    closes = h.of(p.StreamClosed)
    assert [c.stream_id for c in closes] == ["x", "x"]
    assert not any(getattr(o, "stream_id", None) == "x" for o in after(h.outputs, closes[-1]))
    assert not any(isinstance(o, p.ResponseFinished) and o.stream_id == "x" for o in h.outputs)
    assert h.of(p.ResponseFinished)[0].status == p.ResponseStatus.COMPLETED  # y was untouched
    h.run_until(lambda outs: not h.core.has_work())
    assert len(h.lm.free) == 4 - 1  # both x slots are back; y keeps its own
    h.close()


def test_vad_backlog_is_bounded_and_an_append_past_it_is_refused_whole():
    h = Harness(max_input_backlog_ms=1000)
    h.send(p.OpenStream("s"))
    h.send(p.AppendAudio("s", tone(0.6).tobytes()), p.AppendAudio("s", tone(0.6).tobytes()))
    internal = h.core.streams["s"].internal_id
    assert h.core.vad.backlog_samples(internal) == 9600  # the refused append kept nothing
    step(h)  # the engine frames the backlog; the stream stays usable
    err, = h.of(p.StreamError)
    assert err.code == "input_audio_buffer_full" and not err.fatal and "1000 ms" in err.message
    assert h.core.vad.backlog_samples(internal) < 512
    h.send(p.AppendAudio("s", tone(0.6).tobytes()))
    step(h)
    assert len(h.of(p.StreamError)) == 1
    h.close()


def test_manual_commit_buffer_is_bounded_and_an_append_past_it_is_refused_whole():
    h = Harness(max_utterance_ms=1000)
    heard: list[int] = []
    transcribe = h.asr.transcribe
    h.asr.transcribe = lambda audio: heard.append(len(audio)) or transcribe(audio)
    h.send(p.OpenStream("m", p.StreamConfig(turn_detection=None)))
    h.send(p.AppendAudio("m", tone(0.6).tobytes()), p.AppendAudio("m", tone(0.6).tobytes()))
    h.send(p.CommitAudio("m", "i1"))
    h.run_until(has(p.TranscriptFinal))
    err, = h.of(p.StreamError)
    assert err.code == "input_audio_buffer_full" and not err.fatal and "commit or clear" in err.message
    assert heard == [9600]  # exactly the accepted audio
    h.send(p.AppendAudio("m", tone(0.9).tobytes()))  # committed: room again
    step(h)
    assert len(h.of(p.StreamError)) == 1
    h.close()


def test_a_response_refused_for_want_of_a_kv_slot_still_ends():
    h = Harness(stop_after=2)
    h.lm.free.clear()  # every KV slot taken
    h.send(p.OpenStream("s1"), p.AddItem("s1", "u1", "user", "hi"),
           p.CreateResponse("s1", "r1", "a1"))
    h.run_until(has(p.ResponseFinished))
    err, = h.of(p.StreamError)
    done, = h.of(p.ResponseFinished)
    assert err.code == "capacity" and "slot" in err.message
    assert done.response_id == "r1" and done.status == p.ResponseStatus.FAILED
    h.lm.free.append(0)  # a slot frees up: the next response runs
    h.send(p.CreateResponse("s1", "r2", "a2"))
    h.run_until(has(p.ResponseFinished, response_id="r2"))
    assert h.of(p.ResponseFinished)[-1].status == p.ResponseStatus.COMPLETED
    h.close()


class CloningSpeech(SentenceSpeechModel):
    """Records, in order, the voices registered and the jobs started on the model."""

    def __init__(self) -> None:
        super().__init__(ToneTTS())
        self.calls: list[str] = []

    def register_voice(self, reference: p.VoiceReference) -> None:
        self.calls.append(f"register {reference.name} ({len(reference.audio)} bytes)")

    def start(self, job) -> None:
        self.calls.append(f"speak {job.text!r} as {job.voice}")
        super().start(job)


def test_register_voice_is_its_own_request_and_reaches_the_model_before_later_speech():
    h = Harness()
    h.core.close()
    speech = CloningSpeech()
    h.core = EngineCore(Models(EnergyVAD(), h.asr, h.lm, speech), h.woke.set)
    ref = p.VoiceReference(np.zeros(160, "<f4").tobytes(), 16000, "hi", "alice")
    h.send(p.OpenStream("v"), p.RegisterVoice("v", ref),
           p.Speak("v", "r1", "Hello there.", voice="alice"))
    h.run_until(has(p.ResponseFinished))
    assert h.kinds()[0] == "VoiceRegistered" and h.of(p.VoiceRegistered)[0].name == "alice"
    assert speech.calls == ["register alice (640 bytes)", "speak 'Hello there.' as alice"]
    assert not h.of(p.StreamError)
    # unnamed: refused naming the field; the stream lives on
    h.send(p.RegisterVoice("v", p.VoiceReference(b"", 16000)))
    h.outputs.extend(h.core.step())
    err, = h.of(p.StreamError)
    assert err.code == p.ErrorCode.INVALID_VALUE and "reference.name" in err.message
    assert not err.fatal and "v" in h.core.streams
    h.close()
