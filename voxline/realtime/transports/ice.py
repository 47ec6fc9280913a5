"""ICE for WebRTC calls: which host addresses and UDP ports a peer connection offers,
and the STUN/TURN servers it asks.

aioice offers every interface address except 127.0.0.1 and binds any free port, and
aiortc exposes neither choice. `restrict_gathering` sets both on a peer connection's
own ICE connections before it gathers: the host candidates come from our sockets, STUN
asks from those same sockets, and TURN stays aioice's. It touches aioice internals
(`get_component_candidates`, `_protocols`), so pyproject pins aioice's minor version.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
from collections.abc import Sequence
from functools import partial
from typing import Any

from aioice import Candidate
from aioice.candidate import candidate_foundation, candidate_priority
from aioice.ice import Connection, StunProtocol, get_host_addresses, server_reflexive_candidate
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


def default_hosts() -> list[str]:
    """127.0.0.1 (a browser on this machine) and every interface address."""
    return [LOOPBACK, *get_host_addresses(use_ipv4=True, use_ipv6=True)]


def rtc_configuration(urls: Sequence[str], username: str | None = None,
                      credential: str | None = None) -> RTCConfiguration:
    """Only the configured STUN/TURN servers (aiortc would add Google's STUN by default)."""
    servers = [RTCIceServer(urls=url, username=username if url.startswith("turn") else None,
                            credential=credential if url.startswith("turn") else None)
               for url in urls]
    return RTCConfiguration(iceServers=servers)


def ice_connections(pc: RTCPeerConnection) -> list[Connection]:
    """The aioice connections behind a peer connection's transports (media and data)."""
    gatherers = [t.sender.transport.transport.iceGatherer for t in pc.getTransceivers()
                 if t.sender.transport is not None]
    if pc.sctp is not None:
        gatherers.append(pc.sctp.transport.transport.iceGatherer)
    seen: dict[int, Connection] = {}
    for g in gatherers:
        seen.setdefault(id(g._connection), g._connection)
    return list(seen.values())


def restrict_gathering(pc: RTCPeerConnection, hosts: Sequence[str],
                       ports: tuple[int, int] | None = None) -> None:
    """Offer host candidates on `hosts` only, bound in `ports` when given. Call after the
    transports exist (remote offer set, or tracks/channels added) and before
    `setLocalDescription`, which gathers."""
    for conn in ice_connections(pc):
        original = conn.get_component_candidates
        conn.get_component_candidates = partial(  # type: ignore[method-assign]
            _component_candidates, conn, original, list(hosts), ports)


def _bind(loop: asyncio.AbstractEventLoop, conn: Connection, host: str,
          ports: tuple[int, int] | None) -> Any:
    if ports is None:
        return loop.create_datagram_endpoint(lambda: StunProtocol(conn), local_addr=(host, 0))

    async def in_range() -> Any:
        low, high = ports
        choices = list(range(low, high + 1))
        random.shuffle(choices)  # concurrent calls do not all race for the lowest port
        for port in choices:
            try:
                return await loop.create_datagram_endpoint(lambda: StunProtocol(conn),
                                                           local_addr=(host, port))
            except OSError:
                continue
        raise OSError(f"no free UDP port in {low}-{high} on {host}")
    return in_range()


async def _component_candidates(conn: Connection, original: Any, hosts: list[str],
                                 ports: tuple[int, int] | None, component: int,
                                 addresses: list[str], timeout: int = 5) -> list[Candidate]:
    loop = asyncio.get_running_loop()
    protocols: list[StunProtocol] = []
    for host in hosts:
        try:
            transport, protocol = await _bind(loop, conn, host, ports)
        except OSError as exc:
            logger.warning("ICE: cannot bind %s: %s", host, exc)
            continue
        bound = transport.get_extra_info("sockname")
        protocol.local_candidate = Candidate(
            foundation=candidate_foundation("host", "udp", bound[0]), component=component,
            transport="udp", priority=candidate_priority(component, "host"),
            host=bound[0], port=bound[1], type="host")
        protocols.append(protocol)
    conn._protocols += protocols
    candidates = [p.local_candidate for p in protocols]
    if conn.stun_server:
        queries = [asyncio.create_task(server_reflexive_candidate(p, conn.stun_server))
                   for p in protocols if ipaddress.ip_address(p.local_candidate.host).version == 4
                   and not ipaddress.ip_address(p.local_candidate.host).is_loopback]
        if queries:
            done, pending = await asyncio.wait(queries, timeout=timeout)
            for task in pending:
                task.cancel()
            candidates += [t.result()[0] for t in done if t.exception() is None]
    if conn.turn_server:
        candidates += await original(component, [], timeout)  # no addresses: TURN only
    if not candidates:
        logger.warning("ICE: no candidates from hosts %s", ", ".join(hosts))
    return candidates


__all__ = ["LOOPBACK", "default_hosts", "ice_connections", "restrict_gathering",
           "rtc_configuration"]
