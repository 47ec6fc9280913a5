"""SIP peers for the tests: Debian's baresip (a real user agent we did not write) driven
through its console, and a raw UDP socket for requests no polite user agent sends."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
import uuid
import wave
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from aiosipua import SipMessage, SipResponse
from conftest import TIME_FACTOR
from live_server import free_port

RATE = 8000

BARESIP_CONFIG = """\
poll_method		epoll
sip_listen		127.0.0.1:{sip_port}
audio_source		aufile,{source}
audio_alert		aufile,{source}
ausrc_srate		8000
auplay_srate		8000
ausrc_channels		1
auplay_channels		1
rtp_ports		{rtp_low}-{rtp_high}
module_path		/usr/lib/baresip/modules
module			g711.so
module			opus.so
module			aufile.so
module			stdio.so
module			sndfile.so
snd_path		{dump}
module_app		account.so
module_app		menu.so
"""


def write_wav(path: Path, audio: np.ndarray, rate: int = RATE) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as w:
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768


@dataclass
class Baresip:
    """One baresip process calling a voxline SIP port; what it heard is dumped to WAV."""

    proc: asyncio.subprocess.Process
    folder: Path
    output: list[str] = field(default_factory=list)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            for part in line.decode(errors="replace").replace("\r", "\n").split("\n"):
                if part.strip() and not part.startswith("["):
                    self.output.append(part)

    async def until(self, text: str, timeout: float = 20.0) -> str:
        for _ in range(int(timeout * TIME_FACTOR / 0.05)):
            found = [line for line in self.output if text in line]
            if found:
                return found[0]
            await asyncio.sleep(0.05)
        raise AssertionError(f"baresip never said {text!r}: {self.output[-10:]}")

    async def keys(self, text: str) -> None:
        """Type on baresip's console: digits in a call are sent as RFC 4733 events."""
        assert self.proc.stdin is not None
        for key in text:
            self.proc.stdin.write(key.encode())
            await self.proc.stdin.drain()
            await asyncio.sleep(0.3)  # one key at a time, as a person presses them

    async def hangup(self) -> None:
        await self.keys("/hangup\n")
        await self.until("terminated")

    def heard(self) -> np.ndarray:
        """What baresip received and decoded, 8 kHz float."""
        dumps = sorted(self.folder.glob("dump/*-dec.wav"))
        try:
            return read_wav(dumps[-1])
        except (IndexError, EOFError, wave.Error):  # none yet, or written at the call's end
            return np.zeros(0, np.float32)


@contextlib.asynccontextmanager
async def baresip_call(sip_port: int, speech: np.ndarray,
                       auth: tuple[str, str] | None = None,
                       codec: str = "PCMU") -> AsyncIterator[Baresip]:
    """baresip dials sip:bot@127.0.0.1:`sip_port` and plays `speech` (8 kHz) as G.711;
    when the file ends baresip hangs up by itself."""
    exe = shutil.which("baresip")
    if exe is None:
        raise RuntimeError("baresip is not installed: apt-get install baresip-core")
    folder = Path(tempfile.mkdtemp(prefix="voxline-baresip-"))
    (folder / "dump").mkdir()
    write_wav(folder / "speech.wav", speech)
    rtp_low = free_port() & ~1
    (folder / "config").write_text(BARESIP_CONFIG.format(
        sip_port=free_port(), source=folder / "speech.wav", dump=folder / "dump",
        rtp_low=rtp_low, rtp_high=rtp_low + 4))
    creds = f";auth_user={auth[0]};auth_pass={auth[1]}" if auth else ""
    (folder / "accounts").write_text(
        f"<sip:caller@127.0.0.1>;regint=0;audio_codecs={codec}{creds}\n")
    proc = await asyncio.create_subprocess_exec(
        exe, "-f", str(folder), "-e", f"/dial sip:bot@127.0.0.1:{sip_port}",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, cwd=folder)
    peer = Baresip(proc, folder)
    reader = asyncio.create_task(peer._read())
    try:
        yield peer
    finally:
        if proc.returncode is None:
            proc.terminate()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------- a raw SIP socket


def sdp_offer(rtp_port: int, codecs: str = "0 8 101", direction: str = "sendrecv",
              version: int = 1) -> str:
    maps = {"0": "a=rtpmap:0 PCMU/8000", "8": "a=rtpmap:8 PCMA/8000",
            "9": "a=rtpmap:9 G722/8000", "101": "a=rtpmap:101 telephone-event/8000",
            "111": "a=rtpmap:111 opus/48000/2", "13": "a=rtpmap:13 CN/8000"}
    lines = ["v=0", f"o=- 1 {version} IN IP4 127.0.0.1", "s=-", "c=IN IP4 127.0.0.1", "t=0 0",
             f"m=audio {rtp_port} RTP/AVP {codecs}"]
    lines += [maps[c] for c in codecs.split()] + [f"a={direction}"]
    return "\r\n".join(lines) + "\r\n"


class RawSip:
    """A UDP socket on loopback that sends hand-made SIP requests and reads replies."""

    def __init__(self, server_port: int) -> None:
        self.server = ("127.0.0.1", server_port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.unclaimed: list[SipResponse] = []  # responses read while waiting for others

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes | str) -> None:
        self.sock.sendto(data.encode() if isinstance(data, str) else data, self.server)

    def request(self, method: str, call_id: str, *, cseq: int = 1, body: str = "",
                from_tag: str = "caller1", to_tag: str | None = None,
                content_type: str = "application/sdp", extra: tuple[str, ...] = ()) -> str:
        to = f"<sip:bot@127.0.0.1:{self.server[1]}>" + (f";tag={to_tag}" if to_tag else "")
        head = [f"{method} sip:bot@127.0.0.1:{self.server[1]} SIP/2.0",
                f"Via: SIP/2.0/UDP 127.0.0.1:{self.port};branch=z9hG4bK{uuid.uuid4().hex[:12]}",
                "Max-Forwards: 70", f"From: <sip:caller@127.0.0.1>;tag={from_tag}", f"To: {to}",
                f"Call-ID: {call_id}", f"CSeq: {cseq} {method}",
                f"Contact: <sip:caller@127.0.0.1:{self.port}>"]
        head += extra
        if body:
            head.append(f"Content-Type: {content_type}")
        head.append(f"Content-Length: {len(body.encode())}")
        message = "\r\n".join(head) + "\r\n\r\n" + body
        self.send(message)
        return message

    async def response(self, call_id: str | None = None, *, final: bool = True,
                       timeout: float = 5.0) -> SipResponse:
        """The next response (a final one unless `final` is False) for `call_id`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout * TIME_FACTOR

        def wanted(msg: SipResponse) -> bool:
            return (call_id is None or msg.call_id == call_id) and \
                (not final or msg.status_code >= 200)

        while True:
            for msg in self.unclaimed:
                if wanted(msg):
                    self.unclaimed.remove(msg)
                    return msg
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"no response for {call_id}")
            try:
                data = await asyncio.wait_for(loop.sock_recv(self.sock, 65535), left)
            except TimeoutError:
                raise TimeoutError(f"no response for {call_id}") from None
            msg = SipMessage.parse(data)
            if isinstance(msg, SipResponse):
                self.unclaimed.append(msg)

    async def silence(self, seconds: float) -> bool:
        """True if nothing arrives for `seconds`."""
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.sock_recv(self.sock, 65535), seconds)
        except TimeoutError:
            return True
        return False


async def next_request(raw: RawSip, method: str, timeout: float = 5.0):  # noqa: ANN201
    """The next request `method` the server sent to `raw` (responses are kept for later)."""
    from aiosipua import SipRequest

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout * TIME_FACTOR
    while True:
        left = deadline - loop.time()
        if left <= 0:
            raise TimeoutError(f"no {method} came")
        try:
            data = await asyncio.wait_for(loop.sock_recv(raw.sock, 65535), left)
        except TimeoutError:
            raise TimeoutError(f"no {method} came") from None
        msg = SipMessage.parse(data)
        if isinstance(msg, SipResponse):
            raw.unclaimed.append(msg)
        elif isinstance(msg, SipRequest) and msg.method == method:
            return msg


class RtpSocket:
    """A caller's RTP port on loopback: reads what the server sends, sends crafted RTP."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self._seq = 0
        self._ts = 0

    def close(self) -> None:
        self.sock.close()

    async def packets(self, count: int, timeout: float = 5.0) -> list:  # noqa: ANN401
        """The next `count` RTP packets (aiortp RtpPacket), RTCP skipped."""
        from aiortp.packet import RtpPacket

        loop = asyncio.get_running_loop()
        out = []
        async with asyncio.timeout(timeout * TIME_FACTOR):
            while len(out) < count:
                data = await loop.sock_recv(self.sock, 4096)
                if len(data) >= 12 and not 192 <= data[1] <= 223:  # not RTCP
                    out.append(RtpPacket.parse(data))
        return out

    def flush(self) -> int:
        """Drop what has arrived; returns how many datagrams."""
        dropped = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                self.sock.recv(4096)
                dropped += 1
        return dropped

    def send(self, to_port: int, payload_type: int, payload: bytes) -> None:
        """One RTP packet (20 ms later than the last) to the server's port `to_port`."""
        from aiortp.packet import RtpPacket

        packet = RtpPacket(payload_type=payload_type, sequence_number=self._seq & 0xFFFF,
                           timestamp=self._ts & 0xFFFFFFFF, ssrc=0x1234ABCD, payload=payload)
        self._seq += 1
        self._ts += 160
        self.sock.sendto(packet.serialize(), ("127.0.0.1", to_port))


def rtp_port_of(response: SipResponse) -> int:
    """The RTP port in a response's SDP answer."""
    from aiosipua import parse_sdp

    audio = parse_sdp(response.text).audio
    assert audio is not None
    return audio.port
