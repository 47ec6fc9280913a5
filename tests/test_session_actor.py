"""SessionActor as a pure state machine: hand-fed engine outputs and an explicit clock."""

from __future__ import annotations

import numpy as np

from voxline.engines import protocol as ep
from voxline.realtime.openai.client_events import parse_command
from voxline.sessions import events as ev
from voxline.sessions.actor import SessionActor


def make_actor(lead_ms: float = 200.0) -> SessionActor:
    actor = SessionActor("sess_1", "s1", lead_ms=lead_ms)
    actor.start(0.0)
    actor.take_events()
    assert isinstance(actor.take_commands()[0], ep.OpenStream)
    return actor


def one_second_chunk(response_id: str, text: str = "Hello there.") -> ep.AudioChunk:
    audio = (0.1 * np.sin(np.arange(22050) / 10)).astype("<f4")
    return ep.AudioChunk("s1", response_id, audio.tobytes(), 22050, 1000.0, text)


def start_response(actor: SessionActor, now: float = 0.0) -> ep.CreateResponse:
    actor.receive(parse_command('{"type": "response.create"}'), now)
    cmd, = actor.take_commands()
    assert isinstance(cmd, ep.CreateResponse)
    return cmd


def names(events) -> list[str]:
    return [type(e).__name__ for e in events]


def test_audio_is_paced_and_response_done_waits_for_the_last_frame():
    actor = make_actor(lead_ms=200)
    cmd = start_response(actor)
    assert names(actor.take_events()) == ["ResponseCreated", "OutputItemAdded", "ItemAdded",
                                          "ContentPartAdded"]
    actor.on_engine(ep.ReplyTextDelta("s1", cmd.response_id, "Hello there."), 0.1)
    actor.on_engine(one_second_chunk(cmd.response_id), 0.1)
    actor.on_engine(ep.ResponseFinished("s1", cmd.response_id, ep.ResponseStatus.COMPLETED,
                                    "Hello there.", 10, 3), 0.1)
    first = actor.take_events()
    deltas = [e for e in first if isinstance(e, ev.AudioDelta)]
    assert len(deltas) == 5  # 200 ms lead / 40 ms frames
    assert "ResponseDone" not in names(first)
    t, sent, done = 0.1, len(deltas), None
    for _ in range(1000):
        t = max(t + 0.001, actor.next_deadline(t) or t + 0.01)
        actor.tick(t)
        events = actor.take_events()
        sent += sum(isinstance(e, ev.AudioDelta) for e in events)
        done = next((e for e in events if isinstance(e, ev.ResponseDone)), None)
        if done is not None:
            break
    assert sent == 25 and 0.85 <= t <= 0.95  # one second of audio, 200 ms ahead
    assert done is not None and done.response.status == "completed" and done.response.usage.output_tokens == 3


def test_barge_in_cancels_then_truncates_to_what_was_heard():
    actor = make_actor(lead_ms=200)
    cmd = start_response(actor)
    actor.on_engine(ep.ReplyTextDelta("s1", cmd.response_id, "Hello there."), 0.0)
    actor.on_engine(one_second_chunk(cmd.response_id), 0.0)
    for t in np.arange(0.0, 0.5, 0.02):
        actor.tick(float(t))
    actor.take_events()
    actor.on_engine(ep.VoiceStarted("s1", 4000, "item_user"), 0.5)
    cmds = actor.take_commands()
    assert [type(c) for c in cmds] == [ep.CancelResponse]
    actor.tick(0.6)
    assert not [e for e in actor.take_events() if isinstance(e, ev.AudioDelta)]  # silence at once
    actor.on_engine(ep.ResponseFinished("s1", cmd.response_id, ep.ResponseStatus.CANCELLED,
                                    "Hello there.", 10, 3), 0.61)
    done = [e for e in actor.take_events() if isinstance(e, ev.ResponseDone)][0]
    assert done.response.status == "cancelled"
    assert done.response.status_details.reason == "turn_detected"
    trunc, = actor.take_commands()
    assert isinstance(trunc, ep.TruncateItem) and trunc.item_id == cmd.item_id
    assert 450 <= trunc.audio_end_ms <= 520  # played from t=0 until the barge-in at 0.5 s


def test_client_cancel_racing_a_barge_in_is_not_an_error():
    """LiveKit (and OpenAI's own clients) send response.cancel as the server's barge-in
    has already cancelled the reply: until its response.done the reply is still active on
    the wire, so the cancel is a no-op, not an error; so is one just after its response.done."""
    actor = make_actor(lead_ms=200)
    cmd = start_response(actor)
    actor.on_engine(one_second_chunk(cmd.response_id), 0.0)
    actor.tick(0.2)
    actor.take_events()
    actor.on_engine(ep.VoiceStarted("s1", 4000, "item_user"), 0.3)
    assert [type(c) for c in actor.take_commands()] == [ep.CancelResponse]
    actor.take_events()
    actor.receive(parse_command('{"type": "response.cancel"}'), 0.31)
    assert not [e for e in actor.take_events() if isinstance(e, ev.ErrorEvent)]
    assert actor.take_commands() == []  # the engine was told once
    actor.on_engine(ep.ResponseFinished("s1", cmd.response_id, ep.ResponseStatus.CANCELLED,
                                    "", 10, 3), 0.32)
    done = [e for e in actor.take_events() if isinstance(e, ev.ResponseDone)][0]
    assert done.response.status_details.reason == "turn_detected"
    # LiveKit's second cancel often lands after response.done: the reply it names is the
    # one the barge-in ended, so it is done too, not an error
    actor.receive(parse_command('{"type": "response.cancel", "event_id": "late"}'), 0.4)
    assert not [e for e in actor.take_events() if isinstance(e, ev.ErrorEvent)]
    # a cancel naming another response, or once a new response has started and ended, is
    # the documented error
    actor.receive(parse_command('{"type": "response.cancel", "response_id": "resp_x"}'), 0.41)
    err, = [e for e in actor.take_events() if isinstance(e, ev.ErrorEvent)]
    assert err.error.code == "response_cancel_not_active"
    actor.take_commands()  # the barge-in's truncation
    cmd2 = start_response(actor, 0.5)
    actor.on_engine(ep.ResponseFinished("s1", cmd2.response_id, ep.ResponseStatus.COMPLETED,
                                    "", 10, 3), 0.51)
    actor.take_events()
    actor.receive(parse_command('{"type": "response.cancel", "event_id": "late2"}'), 0.6)
    err, = [e for e in actor.take_events() if isinstance(e, ev.ErrorEvent)]
    assert err.error.code == "response_cancel_not_active" and err.error.event_id == "late2"


def test_second_response_create_is_refused_and_names_the_event():
    actor = make_actor()
    start_response(actor)
    actor.take_events()
    actor.receive(parse_command('{"type": "response.create", "event_id": "again"}'), 0.1)
    err, = actor.take_events()
    assert isinstance(err, ev.ErrorEvent)
    assert err.error.code == "conversation_already_has_active_response"
    assert err.error.event_id == "again"
    assert actor.take_commands() == []


def test_fatal_engine_error_ends_the_session():
    actor = make_actor()
    actor.on_engine(ep.StreamError("s1", "engine process exited", "engine_dead", fatal=True), 1.0)
    assert actor.closed is not None and actor.closed.code == "engine_dead"
    err, = actor.take_events()
    assert err.error.type == "server_error"


def test_idle_timeout_triggers_a_response():
    actor = make_actor()
    actor.receive(parse_command(
        '{"type": "session.update", "session": {"type": "realtime", "audio": {"input": '
        '{"turn_detection": {"type": "server_vad", "idle_timeout_ms": 5000}}}}}'), 0.0)
    actor.take_events()
    actor.take_commands()
    assert actor.next_deadline(1.0) == 5.0
    actor.tick(4.9)
    assert actor.take_events() == []
    actor.tick(5.0)
    events = actor.take_events()
    assert names(events)[:5] == ["InputAudioTimeoutTriggered", "InputAudioCommitted",
                                 "ItemAdded", "ItemDone", "ResponseCreated"]
    timeout, committed = events[0], events[1]
    assert committed.item_id == timeout.item_id  # the event names a real item
    assert timeout.item_id in actor.items
    add, create = actor.take_commands()
    assert isinstance(add, ep.AddItem) and add.item_id == timeout.item_id and add.role == "user"
    assert isinstance(create, ep.CreateResponse)


def play(actor: SessionActor, until: float, t: float = 0.0, step: float = 0.01) -> list:
    """Tick the clock from `t` to `until`; the events emitted meanwhile."""
    events = []
    while t < until - 1e-9:
        t = min(until, t + step)
        actor.tick(t)
        events += actor.take_events()
    return events


def audio_response(actor: SessionActor) -> ep.CreateResponse:
    cmd = start_response(actor)
    actor.on_engine(ep.ReplyTextDelta("s1", cmd.response_id, "Hello there."), 0.0)
    actor.on_engine(one_second_chunk(cmd.response_id), 0.0)
    return cmd


def truncate(actor: SessionActor, item_id: str, ms: int, event_id: str, now: float) -> None:
    actor.receive(parse_command(
        f'{{"type": "conversation.item.truncate", "event_id": "{event_id}", '
        f'"item_id": "{item_id}", "content_index": 0, "audio_end_ms": {ms}}}'), now)


def test_client_cancel_then_truncate_gives_one_truncation_and_no_error():
    actor = make_actor(lead_ms=200)
    cmd = audio_response(actor)
    events = actor.take_events() + play(actor, 0.04)
    assert sum(isinstance(e, ev.AudioDelta) for e in events) == 6  # 240 ms sent
    actor.receive(parse_command('{"type": "response.cancel"}'), 0.05)
    assert [type(c) for c in actor.take_commands()] == [ep.CancelResponse]
    actor.on_engine(ep.ResponseFinished("s1", cmd.response_id, ep.ResponseStatus.CANCELLED,
                                    "Hello there.", 10, 3), 0.06)
    assert actor.take_commands() == []  # the client owns playback: no truncation of our own
    truncate(actor, cmd.item_id, 200, "t1", 0.07)
    trunc, = actor.take_commands()
    assert isinstance(trunc, ep.TruncateItem) and trunc.audio_end_ms == 200
    actor.on_engine(ep.TruncationApplied("s1", cmd.item_id, 200, "Hello"), 0.08)
    events = actor.take_events()
    assert names(events).count("ItemTruncated") == 1 and "ErrorEvent" not in names(events)
    # a truncate past the audio sent is the client's mistake, named with its event id
    truncate(actor, cmd.item_id, 900, "t2", 0.09)
    err, = actor.take_events()
    assert err.error.event_id == "t2" and err.error.param == "audio_end_ms"
    assert "conversation.item.truncate" in err.error.message and actor.take_commands() == []


def test_truncate_after_server_barge_in_is_accepted_and_clamped_by_the_engine():
    actor = make_actor(lead_ms=200)
    cmd = audio_response(actor)
    play(actor, 0.5)  # 700 ms sent, 500 played
    actor.on_engine(ep.VoiceStarted("s1", 4000, "item_user"), 0.5)
    actor.take_commands()
    actor.on_engine(ep.ResponseFinished("s1", cmd.response_id, ep.ResponseStatus.CANCELLED,
                                    "Hello there.", 10, 3), 0.51)
    server_cut, = actor.take_commands()
    assert isinstance(server_cut, ep.TruncateItem) and 450 <= server_cut.audio_end_ms <= 520
    actor.on_engine(ep.TruncationApplied("s1", cmd.item_id, server_cut.audio_end_ms, "Hello"), 0.52)
    actor.take_events()
    truncate(actor, cmd.item_id, 690, "late", 0.6)  # what the client received, past our cut
    assert "ErrorEvent" not in names(actor.take_events())
    assert [c.audio_end_ms for c in actor.take_commands()] == [690]  # the engine clamps it


def test_client_truncate_during_barge_in_replaces_the_server_cut():
    actor = make_actor(lead_ms=200)
    cmd = audio_response(actor)
    play(actor, 0.5)
    actor.on_engine(ep.VoiceStarted("s1", 4000, "item_user"), 0.5)
    truncate(actor, cmd.item_id, 650, "t1", 0.5)  # pipecat / openai-agents do this at once
    assert [type(c) for c in actor.take_commands()] == [ep.CancelResponse, ep.TruncateItem]
    actor.on_engine(ep.ResponseFinished("s1", cmd.response_id, ep.ResponseStatus.CANCELLED,
                                    "Hello there.", 10, 3), 0.51)
    assert actor.take_commands() == []
    assert "ErrorEvent" not in names(actor.take_events())


def test_output_audio_buffer_started_is_paired_with_stopped_or_cleared():
    actor = make_actor(lead_ms=200)
    actor.receive(parse_command('{"type": "output_audio_buffer.clear", '
                                        '"event_id": "c0"}'), 0.0)
    err, = actor.take_events()  # nothing has played yet
    assert err.error.event_id == "c0"
    cmd = audio_response(actor)
    actor.on_engine(ep.ResponseFinished("s1", cmd.response_id, ep.ResponseStatus.COMPLETED,
                                    "Hello there.", 10, 3), 0.0)
    events = actor.take_events() + play(actor, 1.5)
    order = [n for n in names(events) if n.startswith("OutputAudioBuffer") or n == "ResponseDone"]
    assert order == ["OutputAudioBufferStarted", "ResponseDone", "OutputAudioBufferStopped"]
    stopped = next(e for e in events if isinstance(e, ev.OutputAudioBufferStopped))
    assert stopped.response_id == cmd.response_id
    assert actor.next_deadline(1.5) is None
    # barge-in clears, and the cleared buffer is not reported as stopped later
    second = audio_response(actor)
    events = actor.take_events() + play(actor, 1.8, t=1.5)
    actor.on_engine(ep.VoiceStarted("s1", 4000, "item_user"), 1.8)
    events += actor.take_events() + play(actor, 3.0, t=1.8)
    order = [n for n in names(events) if n.startswith("OutputAudioBuffer")]
    assert order == ["OutputAudioBufferStarted", "OutputAudioBufferCleared"]
    assert all(e.response_id == second.response_id for e in events
               if isinstance(e, ev.OutputAudioBufferCleared))
    actor.receive(parse_command('{"type": "output_audio_buffer.clear"}'), 3.0)
    cleared, = actor.take_events()  # the client may always clear: it names the last response
    assert isinstance(cleared, ev.OutputAudioBufferCleared)


def test_input_transcription_deltas_only_append():
    actor = make_actor()
    actor.receive(parse_command(
        '{"type": "session.update", "session": {"type": "realtime", "audio": {"input": '
        '{"transcription": {"model": "moonshine"}}}}}'), 0.0)
    actor.take_events()
    actor.on_engine(ep.VoiceStarted("s1", 0, "item_u"), 0.0)
    for i, hyp in enumerate(["What is the capital?", "What is the capital", "What is the",
                             "What is the capital of", "What is the capital of"]):
        actor.on_engine(ep.TranscriptPartial("s1", "item_u", hyp), 0.1 * i)
    actor.on_engine(ep.VoiceStopped("s1", 2000, "item_u"), 1.0)
    actor.on_engine(ep.TranscriptFinal("s1", "item_u", "What is the capital of France?"), 1.1)
    events = actor.take_events()
    deltas = [e.delta for e in events if isinstance(e, ev.InputTranscriptionDelta)]
    assert "".join(deltas) == "What is the capital of France?"
    assert deltas[0] == "What is the"  # nothing before two hypotheses agree
    done, = [e for e in events if isinstance(e, ev.InputTranscriptionCompleted)]
    assert done.transcript == "What is the capital of France?"


def test_settings_the_server_would_ignore_are_refused():
    actor = make_actor()
    for session, param in [
        ({"truncation": "disabled"}, "session.truncation"),
        ({"audio": {"input": {"transcription": {"model": "m", "language": "fr"}}}},
         "session.audio.input.transcription.language"),
        ({"audio": {"input": {"transcription": {"model": "m", "prompt": "names"}}}},
         "session.audio.input.transcription.prompt"),
        ({"tools": [{"type": "function", "name": "f"}]}, "session.tools"),
        ({"tool_choice": "required"}, "session.tool_choice"),
    ]:
        before = actor.settings
        actor.receive(parse_command({"type": "session.update", "event_id": "u",
                                     "session": {"type": "realtime", **session}}), 0.0)
        err, = actor.take_events()
        assert isinstance(err, ev.ErrorEvent) and err.error.param == param, (param, err)
        assert "not supported" in err.error.message and err.error.event_id == "u"
        assert actor.settings == before and actor.take_commands() == []
    # what clients send by default is accepted: no tools, English, semantic VAD, tracing
    actor.receive(parse_command({"type": "session.update", "session": {
        "type": "realtime", "tools": [], "tool_choice": "auto", "tracing": "auto",
        "audio": {"input": {"transcription": {"model": "gpt-4o-mini-transcribe",
                                              "language": "en"},
                            "turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}}}),
        0.0)
    assert names(actor.take_events()) == ["SessionUpdated"]
    update, = actor.take_commands()
    assert update.config.turn_detection.eagerness == "high"  # judged by the words
    actor.receive(parse_command({"type": "response.create", "event_id": "r", "response": {
        "tools": [{"type": "function", "name": "f"}]}}), 0.0)
    err, = actor.take_events()
    assert err.error.param == "response.tools" and actor.response is None


def test_a_reply_far_ahead_of_playout_is_cut_with_an_error():
    actor = make_actor(lead_ms=200)
    actor.pacer.max_queued_ms = 1500
    cmd = start_response(actor)
    actor.take_events()
    actor.on_engine(one_second_chunk(cmd.response_id), 0.0)
    actor.on_engine(one_second_chunk(cmd.response_id), 0.0)  # 2 s queued > 1.5 s
    err = [e for e in actor.take_events() if isinstance(e, ev.ErrorEvent)]
    assert err and err[0].error.code == "output_buffer_full"
    assert [type(c) for c in actor.take_commands()] == [ep.CancelResponse]


def test_speculation_outcomes_become_metric_counters_and_nothing_on_the_wire():
    from voxline.realtime.ops.metrics import Metrics

    actor = make_actor()
    actor.take_events()
    metrics = Metrics()
    for outcome in ("started", "discarded", "started", "committed"):
        actor.on_engine(ep.Speculation("s1", outcome), 0.0)
    assert actor.take_events() == []  # the client sees only ordinary events
    for name, value in actor.observations:
        metrics.observe(name, value)
    assert metrics.value("voxline_speculation_started_total") == 2
    assert metrics.value("voxline_speculation_committed_total") == 1
    assert metrics.value("voxline_speculation_discarded_total") == 1


def test_the_stream_config_names_the_reply_the_session_asks_for_at_a_turn_end():
    actor = make_actor()
    actor.take_events()
    actor.take_commands()
    actor.receive(parse_command({"type": "session.update", "session": {
        "type": "realtime", "instructions": "Be terse.", "audio": {"output": {"voice": "ash"}}}}),
        0.0)
    update, = actor.take_commands()
    auto = update.config.auto_response
    assert auto is not None and auto.voice == "ash" and auto.instructions is None
    # the speech_stopped response carries exactly that config, so the engine can release it
    actor.on_engine(ep.VoiceStarted("s1", 100, "item_u"), 0.0)
    actor.on_engine(ep.VoiceStopped("s1", 900, "item_u"), 1.0)
    create, = [c for c in actor.take_commands() if isinstance(c, ep.CreateResponse)]
    assert create.config == auto
    # no auto response, no speculation
    actor.receive(parse_command({"type": "session.update", "session": {
        "type": "realtime", "audio": {"input": {"turn_detection": {
            "type": "server_vad", "create_response": False}}}}}), 2.0)
    update, = actor.take_commands()
    assert update.config.auto_response is None


def test_a_reply_generated_in_full_but_cut_off_while_it_plays_is_cancelled():
    """We pace playout, so a response is in progress until its audio has played: a barge-in
    then cuts what the client hears, and response.done says so (pipecat relies on it)."""
    actor = make_actor(lead_ms=200)
    cmd = start_response(actor)
    actor.on_engine(ep.ReplyTextDelta("s1", cmd.response_id, "Hello there."), 0.1)
    actor.on_engine(one_second_chunk(cmd.response_id), 0.1)
    actor.on_engine(ep.ResponseFinished("s1", cmd.response_id, ep.ResponseStatus.COMPLETED,
                                    "Hello there.", 10, 3), 0.1)
    actor.take_events()
    actor.on_engine(ep.VoiceStarted("s1", 400, "item_u"), 0.4)  # mid-playout
    actor.tick(0.41)
    done, = [e for e in actor.take_events() if isinstance(e, ev.ResponseDone)]
    assert done.response.status == "cancelled"
    assert done.response.status_details.reason == "turn_detected"


def test_a_stop_missed_by_a_tick_just_short_of_the_play_end_is_due_at_once():
    """The clock loop's timer may fire a hair before the audio's play end: that tick
    finds a little still buffered, and by the next read of the clock nothing is. The
    stop it owes must still be due, not wait for the next input (a 120 s hang once in
    ten live e2e runs, stops 34-39)."""
    actor = make_actor(lead_ms=200)
    cmd = audio_response(actor)
    actor.on_engine(ep.ResponseFinished("s1", cmd.response_id, ep.ResponseStatus.COMPLETED,
                                        "Hello there.", 10, 3), 0.0)
    events = actor.take_events() + play(actor, 0.95)  # all sent, the last frames playing
    assert "ResponseDone" in names(events) and "OutputAudioBufferStopped" not in names(events)
    end = actor.pacer.play_end
    actor.tick(end - 1e-7)  # 0.1 us short: still buffered
    assert "OutputAudioBufferStopped" not in names(actor.take_events())
    assert actor.next_deadline(end + 1e-4) == end  # past: the clock loop ticks at once
    actor.tick(end + 1e-4)
    stopped, = actor.take_events()
    assert isinstance(stopped, ev.OutputAudioBufferStopped)
    assert stopped.response_id == cmd.response_id
    assert actor.next_deadline(end + 1e-3) is None


def test_no_deadline_while_the_response_playing_waits_for_more_audio():
    """All audio sent so far has played but the response is still in progress: nothing
    is owed, so the clock loop sleeps until the engine sends more (no busy loop)."""
    actor = make_actor(lead_ms=200)
    audio_response(actor)
    actor.take_events()
    play(actor, 1.2)
    assert actor.playing is not None and actor.pacer.play_end < 1.2
    assert actor.next_deadline(1.2) is None
