"""Flow control for long replies: generation runs only a bounded lead ahead of playout.

A real `SessionActor` (pacing, playout reports) and a real `EngineCore` over the fakes
run together on a simulated clock: at each instant the engine does all the work it can
(it is infinitely fast, the worst case for running ahead), then the clock moves to the
actor's next deadline. Every `AudioChunk` the engine makes is checked against what the
listener had heard at that instant, so the bound is asserted from the whole history.
"""

from __future__ import annotations

import threading

import pytest
from conftest import TIME_FACTOR
from fakes import CountingLM, EnergyVAD, FixedASR, ToneTTS

from voxline.engines import protocol as ep
from voxline.engines.core import EngineCore, Models
from voxline.engines.speech_model import SentenceSpeechModel
from voxline.realtime.openai.client_events import parse_command
from voxline.sessions import events as ev
from voxline.sessions.actor import SessionActor
from voxline.sessions.playout_lead import REPORT_EVERY_MS, PlayoutReports

LEAD_MS = 2000.0
PACER_BOUND_MS = 5000.0  # the actor's output_buffer_full bound, shrunk from 300 s


class Simulation:
    """One session on one engine, on a clock the test moves."""

    def __init__(self, lead_ms: float | None, tokens: int = 400) -> None:
        self.woke = threading.Event()
        self.lm = CountingLM(max_slots=2, max_len=8192, stop_after=tokens)
        models = Models(EnergyVAD(), FixedASR(), self.lm, SentenceSpeechModel(ToneTTS()))
        self.core = EngineCore(models, self.woke.set, generation_lead_ms=lead_ms)
        self.actor = SessionActor("sess_1", "s1", playout=PlayoutReports())
        self.actor.pacer.max_queued_ms = PACER_BOUND_MS
        self.now = 0.0
        self.events: list[ev.ServerEvent] = []
        self.reports: list[ep.PlayoutProgress] = []
        # per chunk the engine made: (now, audio generated so far, audio heard by now)
        self.chunks: list[tuple[float, float, float]] = []
        self.segment_ms = 0.0  # the longest chunk (one segment: the TTS speaks whole ones)
        self.generated_ms = 0.0
        self.actor.start(self.now)
        self.settle()

    def close(self) -> None:
        self.core.close()

    def send(self, event_json: str) -> None:
        self.actor.receive(parse_command(event_json), self.now)
        self.settle()

    def heard_ms(self) -> float:
        r = self.actor.response
        return self.actor.pacer.heard_ms(r.item_id, self.now) if r is not None else 0.0

    def _forward(self) -> None:
        for cmd in self.actor.take_commands():
            if isinstance(cmd, ep.PlayoutProgress):
                self.reports.append(cmd)
            self.core.add_input(cmd)
        self.events.extend(self.actor.take_events())

    def _deliver(self, out: ep.EngineOutput) -> None:
        if isinstance(out, ep.AudioChunk):
            self.generated_ms += out.duration_ms
            self.segment_ms = max(self.segment_ms, out.duration_ms)
            self.chunks.append((self.now, self.generated_ms, self.heard_ms()))
        self.actor.on_engine(out, self.now)

    def settle(self) -> None:
        """Let the engine do everything it can at this instant (its stages run on threads:
        wait for each plan in flight to land)."""
        while True:
            self._forward()
            if self.core.has_work():
                for out in self.core.step():
                    self._deliver(out)
            elif any(not slot.worker.idle for slot in self.core.table):
                assert self.woke.wait(10 * TIME_FACTOR), "an engine step never landed"
                self.woke.clear()
            else:
                return

    def advance(self) -> None:
        """Move the clock to the actor's next deadline and tick."""
        deadline = self.actor.next_deadline(self.now)
        assert deadline is not None, "stalled: no audio due and the reply not done"
        self.now = max(deadline, self.now + 1e-4)
        self.actor.tick(self.now)
        self.settle()

    def run_until(self, done, limit_s: float = 120.0) -> None:
        while not done():
            assert self.now < limit_s, "the reply did not end in simulated time"
            self.advance()

    def response_done(self) -> ev.ResponseDone | None:
        return next((e for e in self.events if isinstance(e, ev.ResponseDone)), None)

    def errors(self) -> list[ev.ErrorEvent]:
        return [e for e in self.events if isinstance(e, ev.ErrorEvent)]

    def start_long_reply(self) -> None:
        self.send('{"type": "conversation.item.create", "item": {"type": "message", '
                  '"role": "user", "content": [{"type": "input_text", "text": "a story"}]}}')
        self.send('{"type": "response.create"}')


@pytest.fixture
def sim():
    made: list[Simulation] = []

    def make(lead_ms: float | None, **kw) -> Simulation:
        made.append(Simulation(lead_ms, **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_without_flow_control_a_long_reply_overflows_the_pacer(sim):
    # the cliff this feature removes: the engine runs ahead until the pacer refuses
    s = sim(None)
    s.start_long_reply()
    s.run_until(lambda: s.response_done() is not None)
    assert [e.error.code for e in s.errors()] == ["output_buffer_full"]


def test_a_reply_longer_than_the_pacer_bound_completes_within_the_lead(sim):
    s = sim(LEAD_MS)
    s.start_long_reply()
    s.run_until(lambda: s.response_done() is not None)

    done = s.response_done()
    assert s.errors() == []
    assert done.response.status == "completed"
    assert s.generated_ms > 2 * PACER_BOUND_MS  # long enough that it would have overflowed
    sent = sum(len(e.delta) for e in s.events if isinstance(e, ev.AudioDelta))
    assert sent / 48 == pytest.approx(s.generated_ms, abs=100)  # 24 kHz PCM16: all of it
    # never ahead of the listener by more than the lead and the one segment that crossed it
    for _now, generated, heard in s.chunks:
        assert generated <= heard + LEAD_MS + s.segment_ms
    assert s.segment_ms < LEAD_MS  # (the bound is not vacuous)
    # the engine was held and resumed, not just fast: chunks kept coming as playout went
    assert s.chunks[-1][0] > (s.generated_ms - LEAD_MS - s.segment_ms) / 1000
    # reports are monotonic and a step apart, and never ahead of what was heard
    played = [r.played_ms for r in s.reports]
    assert played == sorted(played) and played[0] == 0.0
    assert all(b - a >= REPORT_EVERY_MS for a, b in zip(played, played[1:], strict=False))


def test_a_barge_in_mid_long_reply_discards_at_most_the_lead(sim):
    s = sim(LEAD_MS)
    s.start_long_reply()
    s.run_until(lambda: s.heard_ms() >= 6000)
    heard = s.heard_ms()
    s.actor.on_engine(ep.VoiceStarted("s1", 0, "item_user"), s.now)  # the user talks
    s.settle()
    s.run_until(lambda: s.response_done() is not None)

    done = s.response_done()
    assert done.response.status == "cancelled"
    assert done.response.status_details.reason == "turn_detected"
    discarded = s.generated_ms - heard
    assert 0 < discarded <= LEAD_MS + s.segment_ms
    # the engine stopped generating: the LLM wrote a fraction of the story
    assert s.generated_ms < 8000 + LEAD_MS + s.segment_ms
    assert s.errors() == []


def test_reports_are_off_by_default_and_the_engine_holds_only_reported_replies():
    reports = PlayoutReports.off()
    actor = SessionActor("sess_1", "s1")
    actor.start(0.0)
    actor.take_commands()
    actor.receive(parse_command('{"type": "response.create"}'), 0.0)
    actor.tick(0.5)
    assert not any(isinstance(c, ep.PlayoutProgress) for c in actor.take_commands())
    assert reports.report("s1", actor.response, actor.pacer, 0.5) == []
