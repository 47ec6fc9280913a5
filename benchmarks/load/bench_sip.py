"""SIP against Twilio Media Streams, one server, one run: end of speech → first reply audio
and the reply's jitter, heard by a real SIP phone (Debian's baresip, G.711 μ-law RTP over
127.0.0.1) and by a Twilio Media Streams peer (a WebSocket to `/v1/telephony/twilio`), both
asking the same spoken question of one `voxline serve --sip-port ... --port ...` subprocess
on the CPU default models. Calls alternate between the transports (SIP first on even calls,
Twilio first on odd ones), one call at a time.

    .venv/bin/python benchmarks/load/bench_sip.py [--calls 10] [--warmup 1] [--out sip.json]

What is measured, per call:

- **end of speech → first audio**. SIP: the kernel's receive time on loopback (an AF_PACKET
  socket on `lo` with SO_TIMESTAMPNS, so it needs root or CAP_NET_RAW) of the first RTP
  packet from the server's RTP port to baresip's, minus that of the last packet from
  baresip to the server whose audio has speech in it. Arrival at baresip's socket is what
  "heard" means here: baresip's own jitter buffer and playout come after and are not
  counted. Twilio: the time this process read the first outbound `media` frame, minus the
  time it sent the last inbound `media` frame with speech in it (the frames go out at real
  time, one per 20 ms, and silence frames keep going after the question, as Twilio's do).
  Both include the server VAD's 500 ms of silence that ends the turn. A frame "has speech"
  when a decoded sample exceeds 0.01 full scale; the question WAV is espeak-ng's, trimmed to
  its speech and zero elsewhere, so both transports end the question on the same frame.
- **jitter**: RFC 3550's interarrival jitter of the reply's packets (J += (|D| - J) / 16,
  D the change in arrival time minus the change in media time), its value at the reply's
  end, in ms. The media time is the RTP timestamp for SIP and 20 ms a frame for Twilio
  (its outbound frames carry no timestamp), so a gap where the server's RTP pacer ran dry
  (the timestamp jumps) is not jitter on SIP but is on Twilio; `max gap` (the largest
  arrival gap inside the reply) shows such gaps on both, and the JSON has each call's
  arrival-gap p5 / p50 / p95 (frames that come in bursts show as gaps near 0 and 40 ms).
- **calls ok**: calls whose first reply audio came within `--timeout` seconds.

The reply ends when no reply audio has come for `--reply-gap` seconds (1.5); the phone
then hangs up (baresip's `/hangup`, Twilio's `stop`). The JSON (`--out`) holds every call.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import ctypes
import datetime
import json
import os
import platform
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import httpx  # noqa: E402
from live_server import free_port  # noqa: E402

from voxline.codecs.g711 import float_to_ulaw, ulaw_to_float  # noqa: E402

RATE = 8000
FRAME = 160  # 20 ms at 8 kHz
QUESTION = "What is the capital of France?"
INSTRUCTIONS = "You are a voice assistant on a phone call. Answer in at most eight words."
SPEECH_LEVEL = 0.01  # a frame with a decoded sample above this has speech in it
LEAD_S = 0.4  # silence before the question


def has_speech(ulaw: bytes) -> bool:
    return bool(ulaw) and float(np.abs(ulaw_to_float(ulaw)).max()) > SPEECH_LEVEL


def question_audio(text: str) -> np.ndarray:
    """`LEAD_S` of silence, then espeak-ng's `text` at 8 kHz trimmed to its speech (zeros
    elsewhere) and padded to whole 20 ms frames."""
    from speech import espeak

    spoken = espeak(text, rate=RATE)
    loud = np.flatnonzero(np.abs(spoken) > SPEECH_LEVEL)
    spoken = spoken[loud[0]:loud[-1] + 1]
    spoken = np.concatenate([spoken, np.zeros(-len(spoken) % FRAME, np.float32)])
    return np.concatenate([np.zeros(int(LEAD_S * RATE), np.float32), spoken])


def reply_stats(arrivals: list[float], media: list[float]) -> dict:
    """RFC 3550 interarrival jitter at the end of the reply and its largest arrival gap (ms)."""
    jitter = 0.0
    for i in range(1, len(arrivals)):
        d = (arrivals[i] - arrivals[i - 1]) - (media[i] - media[i - 1])
        jitter += (abs(d) - jitter) / 16
    gaps = np.diff(arrivals) if len(arrivals) > 1 else np.zeros(1)
    return {"jitter_ms": 1000 * jitter, "max_gap_ms": 1000 * float(gaps.max()),
            "frames": len(arrivals),
            "gap_ms_p5_p50_p95": [round(1000 * float(np.percentile(gaps, q)), 2)
                                  for q in (5, 50, 95)]}


@dataclass
class Call:
    transport: str
    ok: bool = False
    first_audio_ms: float | None = None
    jitter_ms: float | None = None
    max_gap_ms: float | None = None
    frames: int = 0  # reply packets / frames
    early_frames: int = 0  # reply audio that came before the end of speech (a cut turn)
    error: str = ""
    extra: dict = field(default_factory=dict)


# ---------------------------------------------------------------- RTP on loopback


@dataclass
class Packet:
    at: float  # kernel receive time, s (CLOCK_REALTIME)
    src: int
    dst: int
    pt: int
    ts: int
    payload: bytes


class LoopbackRtp:
    """Every RTP packet on `lo` (the received copy), timestamped by the kernel: an AF_PACKET
    socket with SO_TIMESTAMPNS and a BPF filter that passes only IPv4 UDP, read in a thread."""

    SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
    SO_ATTACH_FILTER = getattr(socket, "SO_ATTACH_FILTER", 26)

    def __init__(self) -> None:
        self.packets: list[Packet] = []
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        try:
            self.sock.bind(("lo", 0))
            self.sock.setsockopt(socket.SOL_SOCKET, self.SO_TIMESTAMPNS, 1)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            # ldh [12]; jeq IPv4; ldb [23]; jeq UDP; ret all; ret 0
            code = [(0x28, 0, 0, 12), (0x15, 0, 3, 0x0800), (0x30, 0, 0, 23),
                    (0x15, 0, 1, 17), (0x06, 0, 0, 0xFFFF), (0x06, 0, 0, 0)]
            buf = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *c) for c in code))
            self.sock.setsockopt(socket.SOL_SOCKET, self.SO_ATTACH_FILTER,
                                 struct.pack("HL", len(code), ctypes.addressof(buf)))
            self.sock.settimeout(0.2)
        except BaseException:
            self.sock.close()
            raise
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rtp-sniffer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data, anc, _, addr = self.sock.recvmsg(65535, socket.CMSG_SPACE(16))
            except TimeoutError:
                continue
            except OSError:
                return
            if addr[2] != socket.PACKET_HOST:  # lo shows each packet outgoing and incoming
                continue
            at = time.time()
            for level, kind, value in anc:
                if level == socket.SOL_SOCKET and kind == self.SO_TIMESTAMPNS:
                    sec, nsec = struct.unpack("qq", value[:16])
                    at = sec + nsec / 1e9
            ip = data[14:]
            ihl = (ip[0] & 15) * 4
            src, dst = struct.unpack("!HH", ip[ihl:ihl + 4])
            rtp = ip[ihl + 8:]
            if len(rtp) < 12 or rtp[0] >> 6 != 2:
                continue
            head = 12 + 4 * (rtp[0] & 15)
            if rtp[0] & 0x10 and len(rtp) >= head + 4:  # header extension
                head += 4 + 4 * struct.unpack("!H", rtp[head + 2:head + 4])[0]
            pt = rtp[1] & 0x7F
            if pt not in (0, 8):  # G.711 audio only: not RTCP, not telephone-events
                continue
            self.packets.append(Packet(at, src, dst, pt, struct.unpack("!I", rtp[4:8])[0],
                                       bytes(rtp[head:])))

    def between(self, src: range, dst: range, since: float) -> list[Packet]:
        return [p for p in list(self.packets) if p.src in src and p.dst in dst and p.at >= since]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


async def sip_call(sip_port: int, server_rtp: range, sniffer: LoopbackRtp, audio: np.ndarray,
                   opts: argparse.Namespace) -> Call:
    from sip_peer import baresip_call

    call = Call("sip")
    since = time.time()
    tail = np.zeros(int((opts.timeout + 40) * RATE), np.float32)  # the line stays open
    async with baresip_call(sip_port, np.concatenate([audio, tail])) as ua:
        try:
            config = (ua.folder / "config").read_text()
            low, high = map(int, re.search(r"rtp_ports\s+(\d+)-(\d+)", config).groups())
            phone = range(low, high + 1)
            await ua.until("Call established", 30)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + len(audio) / RATE + opts.timeout + 10
            eos = None
            while eos is None:  # the last speech packet, once silence has followed it
                sent = sniffer.between(phone, server_rtp, since)
                speech = [i for i, p in enumerate(sent) if has_speech(p.payload)]
                if speech and speech[-1] < len(sent) - 5:
                    eos = sent[speech[-1]].at
                elif loop.time() > deadline:
                    raise TimeoutError("baresip's speech never reached the server")
                await asyncio.sleep(0.05)
            deadline = loop.time() + opts.timeout
            while True:
                heard = sniffer.between(server_rtp, phone, since)
                reply = [p for p in heard if p.at > eos]
                if reply and time.time() - reply[-1].at > opts.reply_gap:
                    break
                if not reply and loop.time() > deadline:
                    raise TimeoutError(f"no reply audio {opts.timeout:.0f} s after the question")
                await asyncio.sleep(0.05)
            call.ok = True
            call.first_audio_ms = 1000 * (reply[0].at - eos)
            call.early_frames = len(heard) - len(reply)
            ts0 = reply[0].ts
            media = [((p.ts - ts0) % 2**32) / RATE for p in reply]
            stats = reply_stats([p.at for p in reply], media)
            call.jitter_ms, call.max_gap_ms, call.frames = (stats["jitter_ms"],
                                                            stats["max_gap_ms"], stats["frames"])
            steps = np.diff([p.ts for p in reply]) % 2**32
            call.extra["gap_ms_p5_p50_p95"] = stats["gap_ms_p5_p50_p95"]
            call.extra["rtp_timestamp_jumps"] = int((steps > FRAME).sum())  # the pacer ran dry
            call.extra["codec"] = "PCMU" if reply[0].pt == 0 else "PCMA"
            await ua.hangup()
        except (TimeoutError, AssertionError) as exc:
            call.error = f"{type(exc).__name__}: {exc}"
    return call


# ---------------------------------------------------------------- Twilio Media Streams


async def twilio_call_once(base: str, audio: np.ndarray, opts: argparse.Namespace) -> Call:
    from twilio_peer import twilio_call

    call = Call("twilio")
    ulaw = float_to_ulaw(audio)
    frames = [ulaw[i:i + FRAME] for i in range(0, len(ulaw), FRAME)]
    last_speech = max(i for i, f in enumerate(frames) if has_speech(f))
    silence = float_to_ulaw(np.zeros(FRAME, np.float32))
    eos = asyncio.get_running_loop().create_future()

    async with twilio_call(base) as peer:

        async def send() -> None:
            t0 = time.monotonic()
            k = 0
            while True:  # the question, then silence until the call ends (as Twilio does)
                frame = frames[k] if k < len(frames) else silence
                await peer.send("media", media={"track": "inbound", "chunk": str(k + 1),
                                                "timestamp": str(k * 20),
                                                "payload": base64.b64encode(frame).decode()})
                if k == last_speech:
                    eos.set_result(time.monotonic())
                k += 1
                await asyncio.sleep(max(0.0, t0 + k * 0.02 - time.monotonic()))

        await peer.start(instructions=INSTRUCTIONS)
        sender = asyncio.create_task(send())
        try:
            end = await asyncio.wait_for(asyncio.shield(eos), len(frames) * 0.02 + 30)
            deadline = time.monotonic() + opts.timeout
            while True:
                media = [m for m in peer.messages if m["event"] == "media"]
                reply = [m for m in media if m["_at"] > end]
                if reply and time.monotonic() - reply[-1]["_at"] > opts.reply_gap:
                    break
                if not reply and time.monotonic() > deadline:
                    raise TimeoutError(f"no reply audio {opts.timeout:.0f} s after the question")
                await asyncio.sleep(0.05)
            call.ok = True
            call.first_audio_ms = 1000 * (reply[0]["_at"] - end)
            call.early_frames = len(media) - len(reply)
            sizes = [len(base64.b64decode(m["media"]["payload"])) for m in reply]
            starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]) / RATE
            stats = reply_stats([m["_at"] for m in reply], list(starts))
            call.jitter_ms, call.max_gap_ms, call.frames = (stats["jitter_ms"],
                                                            stats["max_gap_ms"], stats["frames"])
            call.extra["gap_ms_p5_p50_p95"] = stats["gap_ms_p5_p50_p95"]
            call.extra["frame_bytes"] = sorted(set(sizes))
            await peer.stop()
        except TimeoutError as exc:
            call.error = f"TimeoutError: {exc}"
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
    return call


# ---------------------------------------------------------------- the server


@contextlib.contextmanager
def voxline_serve(opts: argparse.Namespace) -> Iterator[tuple[str, int, range, Path]]:
    """`voxline serve` with SIP on free loopback ports until the block ends; yields (base URL,
    SIP port, its RTP port range, its log file)."""
    port, sip_port = free_port(), free_port()
    low = free_port() & ~1
    rtp = range(low, low + 21)
    # this checkout's voxline, whatever the venv has installed
    cmd = [sys.executable, "-c", "import sys; from voxline.cli import main; sys.exit(main())",
           "serve", "--host", "127.0.0.1",
           "--port", str(port), "--sip-port", str(sip_port),
           "--sip-rtp-ports", f"{low}-{low + 20}", "--sip-instructions", INSTRUCTIONS,
           "--shutdown-grace", "1", *opts.serve_args]
    log = Path(tempfile.mkstemp(prefix="voxline-bench-sip-", suffix=".log")[1])
    print("server: voxline", " ".join(cmd[3:]), flush=True)
    with log.open("wb") as out:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + opts.startup_timeout
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace").splitlines()[-30:]
                raise RuntimeError("voxline serve did not become healthy:\n" + "\n".join(tail))
            time.sleep(0.5)
        yield base, sip_port, rtp, log
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the server and its engine process
                proc.wait()


# ---------------------------------------------------------------- report


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize(calls: list[Call], transport: str) -> dict:
    mine = [c for c in calls if c.transport == transport]
    ok = [c for c in mine if c.ok]
    first = [c.first_audio_ms for c in ok]
    jitter = [c.jitter_ms for c in ok]
    gaps = [c.max_gap_ms for c in ok]
    return {"transport": transport, "calls": len(mine), "ok": len(ok),
            "first_audio_p50_ms": pct(first, 50), "first_audio_p95_ms": pct(first, 95),
            "jitter_p50_ms": pct(jitter, 50), "jitter_p95_ms": pct(jitter, 95),
            "max_gap_p95_ms": pct(gaps, 95)}


LABELS = {"sip": "SIP (baresip, RTP)", "twilio": "Twilio Media Streams (WS)"}


def table(rows: list[dict]) -> str:
    def f(v: float | None, digits: int = 0) -> str:
        return "-" if v is None else f"{v:.{digits}f}"

    lines = [f"{'transport':27s} {'end of speech -> first audio':>29s} {'jitter (RFC 3550)':>18s}"
             f" {'max gap':>8s} {'calls':>6s}",
             f"{'':27s} {'p50 ms':>14s} {'p95 ms':>14s} {'p50 ms':>9s} {'p95 ms':>8s}"
             f" {'p95 ms':>8s} {'ok':>6s}"]
    for r in rows:
        lines.append(f"{LABELS[r['transport']]:27s} {f(r['first_audio_p50_ms']):>14s} "
                     f"{f(r['first_audio_p95_ms']):>14s} {f(r['jitter_p50_ms'], 2):>9s} "
                     f"{f(r['jitter_p95_ms'], 2):>8s} {f(r['max_gap_p95_ms']):>8s} "
                     f"{r['ok']:>3d}/{r['calls']:<2d}")
    return "\n".join(lines)


def machine() -> str:
    load = os.getloadavg()
    return (f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


async def run(opts: argparse.Namespace, transports: list[str]) -> dict:
    audio = question_audio(QUESTION)
    sniffer = LoopbackRtp() if "sip" in transports else None
    calls: list[Call] = []
    said: list[str] = []
    try:
        with voxline_serve(opts) as (base, sip_port, rtp, log):
            print(f"server ready at {base}, SIP on {sip_port}, RTP {rtp.start}-{rtp.stop - 1}; "
                  f"log {log}", flush=True)
            for i in range(-opts.warmup, opts.calls):
                order = transports if i % 2 == 0 else transports[::-1]
                for transport in order:
                    if transport == "sip":
                        assert sniffer is not None
                        call = await sip_call(sip_port, rtp, sniffer, audio, opts)
                    else:
                        call = await twilio_call_once(base, audio, opts)
                    label = "warm-up" if i < 0 else f"call {i + 1}"
                    print(f"{label:8s} {transport:7s} " + (
                        f"first audio {call.first_audio_ms:7.0f} ms, jitter "
                        f"{call.jitter_ms:5.2f} ms, max gap {call.max_gap_ms:5.0f} ms, "
                        f"{call.frames} frames" if call.ok else f"FAILED {call.error}"),
                        flush=True)
                    if i >= 0:
                        calls.append(call)
                    await asyncio.sleep(opts.pause)
            said = re.findall(r"bot said '(.+?)'", log.read_text(errors="replace"))
    finally:
        if sniffer is not None:
            sniffer.close()
    rows = [summarize(calls, t) for t in transports]
    return {"rows": rows, "calls": [asdict(c) for c in calls], "bot_said": said[-4:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10, help="measured calls per transport")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured calls per transport")
    parser.add_argument("--transports", default="sip,twilio",
                        help="sip, twilio or both (SIP needs root or CAP_NET_RAW)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds from the end of speech to the first reply audio")
    parser.add_argument("--reply-gap", type=float, default=1.5,
                        help="seconds without reply audio that end the reply")
    parser.add_argument("--pause", type=float, default=1.0, help="seconds between calls")
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    parser.add_argument("--out", default=None, help="write the JSON report here")
    parser.add_argument("serve_args", nargs="*",
                        help="more `voxline serve` flags, after --, e.g. -- --threads 2")
    opts = parser.parse_args()
    transports = [t for t in opts.transports.split(",") if t]
    if set(transports) - {"sip", "twilio"}:
        parser.error("--transports: sip and/or twilio")
    command = " ".join([Path(sys.executable).name, *sys.argv])
    print("command:", command)
    print("machine:", machine())
    try:
        report = asyncio.run(run(opts, transports))
    except PermissionError as exc:
        print(f"SIP timing reads RTP on lo with a packet socket ({exc}): run as root, give "
              "python CAP_NET_RAW, or pass --transports twilio", file=sys.stderr)
        return 2
    print()
    print(table(report["rows"]))
    print(f"question: {QUESTION!r}; bot said (last): {report['bot_said'][-1:]}")
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    report = {"command": command, "machine": machine(), "commit": commit,
              "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "question": QUESTION, "instructions": INSTRUCTIONS,
              "definitions": {
                  "first_audio_ms": "arrival of the first reply packet/frame at the phone minus "
                                    "arrival at the server of the last caller packet/frame with "
                                    "speech (SIP: kernel timestamps on lo; Twilio: this "
                                    "process's send/receive times)",
                  "jitter_ms": "RFC 3550 interarrival jitter at the reply's end (media time: "
                               "RTP timestamp for SIP, 20 ms a frame for Twilio)",
                  "max_gap_ms": "largest arrival gap between reply packets/frames"},
              "settings": {k: v for k, v in vars(opts).items() if k != "out"}, **report}
    if opts.out:
        Path(opts.out).write_text(json.dumps(report, indent=2))
        print("wrote", opts.out)
    return 0 if all(r["ok"] == r["calls"] for r in report["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
