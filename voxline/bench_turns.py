"""`voxline bench`'s conversations over ``/v1/realtime``: one session, its turns one after
another, each reply's audio timed as a real-time player would hear it, and barge-ins.

A barge-in: on a turn chosen for it, the client starts streaming its next question about
``BARGE_IN_AFTER_S`` after the reply's first audio, while the reply is still playing (the
way a user talks over the bot), and times the barge-in's speech start (its first send) to
the reply's audio stopping: ``output_audio_buffer.cleared`` or ``response.done`` for that
reply, whichever comes first, else its last audio delta. The interrupting question is the
conversation's next turn (its clock starts at that first send); on a conversation's last
turn it is a spare question, and the session ends once the reply has stopped. Gaps in a barged-in reply's
audio after the barge-in are not underruns (the player stops there).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from voxline.codecs.pcm import float_to_pcm16

WIRE_RATE = 24000  # GA default pcm16 in and out, and /v1/audio/speech pcm
CHUNK_MS = 20
TRAILING_SILENCE_S = 1.0  # server VAD needs silence after the question to end the turn
UNDERRUN_GAP_S = 0.1
THINK_S = 0.5  # a multi-turn client's pause between a reply's end and its next question
BARGE_IN_AFTER_S = 1.0  # a barge-in starts this long after the reply's first audio
AUDIO_DELTAS = ("response.output_audio.delta", "response.audio.delta")


@dataclass
class RequestResult:
    ok: bool = False
    error: str | None = None
    ttfa_s: float | None = None  # request start -> first audio byte
    eos_to_first_audio_s: float | None = None  # speech_stopped (or commit) -> first audio
    # the question audio's last chunk sent (before the trailing silence) -> first audio
    speech_end_to_first_audio_s: float | None = None
    rtf: float | None = None  # generation time / audio seconds (< 1: faster than real time)
    audio_s: float = 0.0
    output_tokens: int | None = None  # response.done's usage, where the server counts them
    wall_s: float = 0.0
    underruns: int = 0
    underrun_s: float = 0.0
    underrun_at_s: list[float] = field(default_factory=list)  # audio position of each gap
    barge_in_planned: bool = False  # chosen to be talked over (--barge-in-fraction)
    barge_in: bool = False  # talked over: the reply was still playing when the user spoke
    barge_in_to_stop_s: float | None = None  # barge-in's first send -> the reply's audio stopped
    arrivals: list[tuple[float, float]] = field(default_factory=list, repr=False)

    def finish_audio(self, reference: float | None, until: float | None = None) -> None:
        """Derive RTF and underruns from the (arrival time, seconds) of each audio piece;
        pieces that arrive after `until` (a barge-in) count for no underrun."""
        self.audio_s = sum(d for _, d in self.arrivals)
        if self.arrivals and reference is not None and self.audio_s > 0 and until is None:
            self.rtf = (self.arrivals[-1][0] - reference) / self.audio_s
        heard = self.arrivals if until is None else [a for a in self.arrivals if a[0] <= until]
        gaps = playout_gaps(heard)
        self.underruns, self.underrun_s = len(gaps), sum(g for _, g in gaps)
        self.underrun_at_s = [round(at, 3) for at, _ in gaps]


def playout_gaps(arrivals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """A player that starts at the first piece and plays at real time: its gaps > 100 ms,
    each as (seconds of the reply played before it, its length); shorter gaps still delay
    the playhead."""
    if not arrivals:
        return []
    playhead, played, gaps = arrivals[0][0], 0.0, []
    for at, seconds in arrivals:
        if at > playhead:
            if at - playhead > UNDERRUN_GAP_S:
                gaps.append((played, at - playhead))
            playhead = at
        playhead += seconds
        played += seconds
    return gaps


def playout_end(arrivals: list[tuple[float, float]]) -> float:
    """When a real-time player that starts at the first piece finishes the last one."""
    playhead = arrivals[0][0] if arrivals else time.perf_counter()
    for at, seconds in arrivals:
        playhead = max(playhead, at) + seconds
    return playhead


def capped(response: dict[str, Any]) -> bool:
    """A reply cut at the session's max_output_tokens (status incomplete, that reason): a
    finished turn for the bench, whose cap is what makes it stop."""
    details = response.get("status_details") or {}
    return response.get("status") == "incomplete" and details.get("reason") == "max_output_tokens"


def session_config(turn_detection: dict[str, Any] | None,
                   max_output_tokens: int | None) -> dict[str, Any]:
    """The bench's ``session.update`` body: turn detection, and a reply-length cap if given."""
    config: dict[str, Any] = {"type": "realtime",
                              "audio": {"input": {"turn_detection": turn_detection}}}
    if max_output_tokens is not None:
        config["max_output_tokens"] = max_output_tokens
    return config


def headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


Turn = tuple["np.ndarray | None", "str | None"]  # (spoken question, or None and its text)


class _TurnFailed(Exception):
    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


@dataclass
class _Asking:
    """A question being sent: its sender task, its first send, its end of speech (the last
    chunk of the question audio), and its turn's end (speech_stopped or the commit)."""
    task: asyncio.Task | None = None
    start: float = field(default_factory=time.perf_counter)
    speech_end: float | None = None
    eos: float | None = None
    interrupted: str | None = None  # the response id it talked over (its late events: ignored)


async def realtime_conversation(base: str, turns: list[Turn], opts: argparse.Namespace,
                                barge: list[bool] | None = None,
                                spare: np.ndarray | None = None) -> list[RequestResult]:
    """`turns` one after another in ONE /v1/realtime session, a result per turn.

    Like a person, the client starts its next question only once the previous reply has
    played out at real time (the simulated player of `playout_gaps`) and THINK_S more,
    unless the turn is one of `barge` (then the next question, or `spare` after the last
    turn, talks over the reply: see the module's docstring). A turn's clock starts at its
    first send. A failed turn ends the conversation (see `_fail_from`)."""
    import websockets

    results = [RequestResult() for _ in turns]
    barge = barge or [False] * len(turns)
    url = "ws" + base[len("http"):] + "/v1/realtime"
    turn_detection: dict[str, Any] | None = (
        {"type": "server_vad"} if opts.turn_detection == "server_vad" else None)
    current, started = 0, time.perf_counter()
    asking: _Asking | None = None
    try:
        async with asyncio.timeout(opts.timeout * len(turns)), websockets.connect(
                url, additional_headers=headers(opts.api_key), max_size=None) as ws:
            first = json.loads(await ws.recv())
            if first.get("type") != "session.created":
                raise _TurnFailed(f"unexpected_{first.get('type')}")
            await ws.send(json.dumps({"type": "session.update", "session": session_config(
                turn_detection, getattr(opts, "max_output_tokens", None))}))
            for current, (audio, text) in enumerate(turns):
                res = results[current]
                res.barge_in_planned = barge[current]
                interrupter = None
                if barge[current]:
                    interrupter = turns[current + 1][0] if current + 1 < len(turns) else spare
                started = asking.start if asking is not None else time.perf_counter()
                after = getattr(opts, "barge_in_after", BARGE_IN_AFTER_S)
                try:
                    async with asyncio.timeout(opts.timeout):
                        asking = await _one_turn(ws, res, audio, text, turn_detection, asking,
                                                 interrupter, after)
                except TimeoutError:
                    raise _TurnFailed("timeout") from None
                finally:
                    res.wall_s = time.perf_counter() - started
                if current + 1 < len(turns) and asking is None:  # let the reply play, think
                    await asyncio.sleep(max(0.0, playout_end(res.arrivals) + THINK_S
                                            - time.perf_counter()))
            if asking is not None and asking.task is not None:
                asking.task.cancel()  # the spare question: the session ends here
    except _TurnFailed as exc:
        _fail_from(results, current, exc.error, started)
    except TimeoutError:
        _fail_from(results, current, "timeout", started)
    except websockets.ConnectionClosed as exc:
        _fail_from(results, current, f"closed_{exc.rcvd.code if exc.rcvd else 'abnormal'}", started)
    except (OSError, websockets.InvalidHandshake) as exc:
        _fail_from(results, current, f"connect_{type(exc).__name__}", started)
    finally:
        if asking is not None and asking.task is not None:
            asking.task.cancel()  # a spare question talking over the last reply
    return results


def _fail_from(results: list[RequestResult], current: int, error: str, started: float) -> None:
    """Turn `current` failed with `error` and the conversation ended there: the turns it
    did not reach count as ``after_<error>`` (told apart from failures of their own);
    earlier turns stand."""
    first = results[current]
    first.ok, first.error = False, first.error or error
    for res in results[current + 1:]:
        res.ok, res.error = False, f"after_{first.error}"
    if not results[current].wall_s:
        results[current].wall_s = time.perf_counter() - started


async def _send_audio(ws: Any, audio: np.ndarray, asking: _Asking, manual: bool) -> None:
    """Stream `audio` and the trailing silence at real time; commit and ask when `manual`."""
    pcm = np.concatenate([audio, np.zeros(int(TRAILING_SILENCE_S * WIRE_RATE), np.float32)])
    step = WIRE_RATE * CHUNK_MS // 1000
    t0 = time.perf_counter()
    for n, i in enumerate(range(0, len(pcm), step)):
        piece = base64.b64encode(float_to_pcm16(pcm[i:i + step])).decode()
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": piece}))
        if asking.speech_end is None and i + step >= len(audio):
            asking.speech_end = time.perf_counter()  # the question's last sound is out
        # pace against the clock, not per sleep, so drift does not accumulate
        await asyncio.sleep(max(0.0, t0 + (n + 1) * CHUNK_MS / 1000 - time.perf_counter()))
    if manual:
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        asking.eos = time.perf_counter()
        await ws.send(json.dumps({"type": "response.create"}))


async def _send_text(ws: Any, text: str | None, asking: _Asking) -> None:
    await ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user",
        "content": [{"type": "input_text", "text": text}]}}))
    asking.eos = time.perf_counter()
    await ws.send(json.dumps({"type": "response.create"}))


async def _one_turn(ws: Any, res: RequestResult, audio: np.ndarray | None, text: str | None,
                    turn_detection: dict[str, Any] | None, asking: _Asking | None = None,
                    interrupter: np.ndarray | None = None,
                    barge_after_s: float = BARGE_IN_AFTER_S) -> _Asking | None:
    """Send one question on `ws` (or go on with `asking`, already being sent: a barge-in)
    and read events until its reply's response.done. With `interrupter`, talk over the
    reply `barge_after_s` after its first audio if it is still playing, and return that
    question being sent (None when the turn ended without a barge-in)."""
    manual = turn_detection is None
    if asking is None:
        asking = _Asking()
        asking.task = asyncio.create_task(_send_audio(ws, audio, asking, manual)
                                          if audio is not None else _send_text(ws, text, asking))
    start, stale = asking.start, asking.interrupted
    rid: str | None = None
    nxt: _Asking | None = None
    barger: asyncio.Task | None = None
    stopped: float | None = None

    async def barge_in() -> None:
        nonlocal nxt
        await asyncio.sleep(barge_after_s)
        assert interrupter is not None and asking.task is not None
        asking.task.cancel()  # the question's trailing silence ends where the user speaks
        nxt = _Asking(interrupted=rid)
        nxt.task = asyncio.create_task(_send_audio(ws, interrupter, nxt, manual))
        res.barge_in = True

    try:
        async for raw in ws:
            now = time.perf_counter()
            event = json.loads(raw)
            kind = event.get("type")
            if stale is not None and _response_id(event) == stale:
                continue  # the talked-over reply's last events
            if kind == "input_audio_buffer.speech_stopped":
                if nxt is not None:
                    nxt.eos = nxt.eos or now
                elif asking.eos is None:
                    asking.eos = now
            elif kind in AUDIO_DELTAS:
                n_bytes = len(base64.b64decode(event.get("delta", "")))
                if n_bytes:
                    rid = rid or event.get("response_id")
                    if res.ttfa_s is None:
                        res.ttfa_s = now - start
                        if asking.eos is not None:
                            res.eos_to_first_audio_s = now - asking.eos
                        if asking.speech_end is not None:
                            res.speech_end_to_first_audio_s = now - asking.speech_end
                        if interrupter is not None:
                            barger = asyncio.create_task(barge_in())
                    res.arrivals.append((now, n_bytes / 2 / WIRE_RATE))
            elif kind == "output_audio_buffer.cleared" and nxt is not None:
                stopped = stopped or now
            elif kind == "error":
                res.error = f"server_{event.get('error', {}).get('code') or 'error'}"
                break
            elif kind == "response.done":
                response = event.get("response", {})
                status = response.get("status")
                tokens = (response.get("usage") or {}).get("output_tokens")
                res.output_tokens = tokens if isinstance(tokens, int) and tokens > 0 else None
                if nxt is not None and status == "cancelled":
                    stopped = stopped or now
                elif status != "completed" and not capped(response):
                    res.error = f"response_{status}"
                if not res.arrivals:
                    res.error = res.error or "no_audio"
                break
        else:
            raise _TurnFailed("closed_before_reply")
        res.ok = res.error is None and bool(res.arrivals)
    finally:
        if barger is not None:
            barger.cancel()  # the reply ended before the barge-in was due: none
        if asking.task is not None:
            asking.task.cancel()
        res.finish_audio(asking.eos, until=nxt.start if nxt is not None else None)
    if res.error is not None:
        if nxt is not None and nxt.task is not None:
            nxt.task.cancel()
        raise _TurnFailed(res.error)
    if nxt is not None:
        last = max((at for at, _ in res.arrivals), default=nxt.start)
        res.barge_in_to_stop_s = max(0.0, (stopped or last) - nxt.start)
    return nxt


def _response_id(event: dict[str, Any]) -> str | None:
    return event.get("response_id") or (event.get("response") or {}).get("id")
