"""The fault suite: SIGTERM, SIGINT and SIGKILL to the engine process, to the server
process, to the server's process group and to every process of the tree, over a real
`voxline serve` (model-free core) with sessions open. With turns in flight here (`make
test`); idle sessions too under `make soak` (VOXLINE_SOAK=1).

Each case asserts what the clients saw (error event and close code), `/health` turning
503 and back with a working engine, or a clean exit (0 after a drain, replies finished,
1001 with a reason), and that nothing is left: no process of the tree, no shared memory,
no files in its temp dir, no fds or threads beyond the baseline. Times are printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest
from faults import FAULTS, TIME_FACTOR, Outcome, ServeTree, run_fault
from twilio_peer import TwilioPeer
from websockets.asyncio.client import connect

SHUTDOWN_REASON = "server is shutting down"
SOAK = bool(os.environ.get("VOXLINE_SOAK"))

LOADS = [True] + [pytest.param(False, marks=pytest.mark.skipif(
    not SOAK, reason="idle-session variants run under `make soak`"))]


def _expect_engine_restart(out: Outcome) -> None:
    for client in out.clients:
        assert [code for _, code in client.errors] == ["engine_dead"]
        assert client.close is not None and client.close[1] == 1011
    assert out.health_503_at is not None and out.recovered_at is not None
    assert out.new_session_ok


def _expect_drain(out: Outcome) -> None:
    for client in out.clients:
        assert client.errors == []
        assert client.close is not None and client.close[1:] == (1001, SHUTDOWN_REASON)
        if out.load:  # the reply in flight finished before the close
            assert [s for t, s in client.replies_done if t >= 0] == ["completed"]
    assert out.exit_code == 0


def _expect_ignored(out: Outcome) -> None:
    for client in out.clients:
        assert client.errors == [] and client.close is None
        if out.load:
            assert [s for t, s in client.replies_done if t >= 0] == ["completed"]
    assert out.health_503_at is None and out.new_session_ok


@pytest.mark.parametrize("load", LOADS, ids=lambda v: "turns" if v else "idle")
@pytest.mark.parametrize("fault", list(FAULTS))
async def test_fault(fault: str, load: bool) -> None:
    target, sig = FAULTS[fault]
    out = await run_fault(fault, load)
    print("\n" + json.dumps(out.row()))
    if target == "engine":
        if sig == signal.SIGINT:
            _expect_ignored(out)  # Ctrl-C is the server's to handle
        else:
            _expect_engine_restart(out)
        assert out.exit_code is None and out.stop_exit_code == 0  # lived on; stops cleanly
    elif sig == signal.SIGKILL:
        for client in out.clients:
            assert client.errors == [] and client.close is not None
            assert client.close[1] in (1006, None)  # the connection dropped, no close frame
        assert out.exit_code == -signal.SIGKILL
    elif target == "every process" and sig == signal.SIGTERM:
        # the engine stops at once (replies in flight fail); the server then exits cleanly
        for client in out.clients:
            assert [code for _, code in client.errors] == ["engine_dead"]
            assert client.close is not None and client.close[1] == 1011
        assert out.exit_code == 0
    else:
        _expect_drain(out)  # SIGTERM/SIGINT to the server or its group; SIGINT to all
    assert out.left_alive == []
    assert out.new_shm == set()
    if (target, sig) != ("every process", signal.SIGKILL):
        assert out.new_engine_dirs == set()
    else:  # no process was left to remove the engine's pipes: the next start does
        assert out.new_engine_dirs and out.left_after_restart == set()
    if out.fd_growth is not None:  # the server lived on: back to its baseline
        assert out.fd_growth <= 0 and out.thread_growth <= 0



async def test_sigterm_drains_twilio_streams_with_1001_and_a_reason() -> None:
    """A phone call (Twilio Media Streams) is drained like a WebSocket session: on SIGTERM
    it closes with 1001 and the reason (plain uvicorn would close it with 1012)."""
    tree = ServeTree()
    try:
        await tree.wait_healthy()
        async with connect(tree.ws_url.replace("/v1/realtime", "/v1/telephony/twilio")) as ws:
            peer = TwilioPeer(ws)
            await peer.start()
            await asyncio.sleep(0.3)  # the call's session is open
            tree.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(ws.wait_closed(), 30 * TIME_FACTOR)
        assert (ws.close_code, ws.close_reason) == (1001, SHUTDOWN_REASON)
        assert tree.proc.wait(30 * TIME_FACTOR) == 0
    finally:
        tree.kill_all()
