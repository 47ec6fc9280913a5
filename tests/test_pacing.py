from __future__ import annotations

import pytest

from voxline.sessions.pacing import OutFrame, OutputPacer


def frames(n: int, ms: float = 40.0, item: str = "a", resp: str = "r") -> list[OutFrame]:
    return [OutFrame(resp, item, bytes([i]), ms) for i in range(n)]


def test_releases_at_real_time_with_a_bounded_lead():
    pacer = OutputPacer(lead_ms=120)
    for f in frames(50):
        pacer.push(f)
    sent = pacer.due(0.0)
    assert len(sent) == 3  # 120 ms lead = three 40 ms frames
    assert pacer.due(0.0) == []
    assert pacer.next_deadline(0.0) == pytest.approx(0.0 + 0.12 - 0.12)
    # over one simulated second, about one second of audio more is released
    t, total = 0.0, len(sent)
    while t < 1.0:
        t = max(t + 0.001, pacer.next_deadline(t) or t)
        total += len(pacer.due(t))
        assert pacer.buffered_ms(t) <= 120 + 40
    assert 26 <= total <= 29
    assert [f.payload[0] for f in sent] == [0, 1, 2]


def test_heard_ms_and_interrupt():
    pacer = OutputPacer(lead_ms=200)
    for f in frames(20, item="x"):
        pacer.push(f)
    pacer.due(10.0)  # 200 ms sent at t=10
    assert pacer.heard_ms("x", 10.0) == pytest.approx(0.0, abs=1e-6)
    assert pacer.heard_ms("x", 10.1) == pytest.approx(100.0)
    pacer.interrupt(10.1)
    assert pacer.heard_ms("x", 11.0) == pytest.approx(100.0)  # unplayed audio is forgotten
    assert not pacer.pending()
    assert pacer.buffered_ms(10.1) == 0.0
    assert pacer.next_deadline(10.1) is None


def test_underrun_restarts_the_play_clock():
    pacer = OutputPacer(lead_ms=80)
    pacer.push(frames(1)[0])
    pacer.due(0.0)
    # the next frame arrives long after the first finished playing: sent at once
    pacer.push(frames(1)[0])
    assert len(pacer.due(5.0)) == 1
    assert pacer.buffered_ms(5.0) == pytest.approx(40.0)


def test_rejects_bad_lead():
    with pytest.raises(ValueError, match="lead_ms"):
        OutputPacer(lead_ms=0)


def test_the_queue_is_bounded_and_refuses_a_frame_past_it():
    import pytest

    from voxline.sessions.pacing import OutputBufferFull

    pacer = OutputPacer(lead_ms=200, max_queued_ms=100)
    pacer.push(OutFrame("r", "i", b"a", 60))
    with pytest.raises(OutputBufferFull, match="limit is 0 s"):
        pacer.push(OutFrame("r", "i", b"b", 60))
    assert pacer.queued_ms == 60  # nothing of the refused frame was kept
    assert [f.payload for f in pacer.due(0.0)] == [b"a"] and pacer.queued_ms == 0
    pacer.push(OutFrame("r", "i", b"c", 60))  # room again once sent
    pacer.clear(0.0)
    assert pacer.queued_ms == 0
