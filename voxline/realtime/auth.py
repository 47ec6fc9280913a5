"""API-key checks, one home for HTTP and WebSocket: constant-time comparison.

A client presents the key as ``Authorization: Bearer KEY`` or, from a browser (which
cannot set headers on a WebSocket), as the subprotocol ``openai-insecure-api-key.KEY``.
Where the key would go, a client secret (``ek_...``, from ``/v1/realtime/client_secrets``)
works too until it expires. Client secrets live in memory on the server that issued them;
only their SHA-256 is kept, so a lookup's timing tells nothing about a near miss.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import HTTPConnection

from voxline.sessions.settings import SessionSettings

KEY_SUBPROTOCOL = "openai-insecure-api-key."
SECRET_PREFIX = "ek_"
MAX_LIVE_SECRETS = 10_000  # tokens kept at once; past it the soonest to expire go first


def offered_subprotocols(conn: HTTPConnection) -> list[str]:
    raw = conn.headers.get("sec-websocket-protocol", "")
    return [p.strip() for p in raw.split(",") if p.strip()]


def presented_keys(conn: HTTPConnection) -> list[str]:
    keys = []
    scheme, _, token = conn.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        keys.append(token.strip())
    keys += [p[len(KEY_SUBPROTOCOL):] for p in offered_subprotocols(conn)
             if p.startswith(KEY_SUBPROTOCOL)]
    return keys


def authorized(conn: HTTPConnection, api_key: str | None) -> bool:
    """True when no key is configured or the connection presents it."""
    if not api_key:
        return True
    want = api_key.encode()
    # compare with every candidate, so timing does not tell which one was close
    matches = [hmac.compare_digest(key.encode(), want) for key in presented_keys(conn)]
    return any(matches)


@dataclass(frozen=True)
class ClientSecret:
    value: str
    expires_at: int  # Unix seconds
    settings: SessionSettings | None  # the session config given at creation


class ClientSecrets:
    """Issued tokens by digest; expired ones are dropped when met or when space is needed."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._live: dict[bytes, ClientSecret] = {}

    def issue(self, seconds: int, settings: SessionSettings | None) -> ClientSecret:
        now = self._clock()
        if len(self._live) >= MAX_LIVE_SECRETS:
            self._live = {k: s for k, s in self._live.items() if s.expires_at > now}
            while len(self._live) >= MAX_LIVE_SECRETS:
                del self._live[min(self._live, key=lambda k: self._live[k].expires_at)]
        secret = ClientSecret(SECRET_PREFIX + secrets.token_urlsafe(32), int(now + seconds), settings)
        self._live[_digest(secret.value)] = secret
        return secret

    def check(self, value: str) -> ClientSecret | str:
        """The secret, or why it is refused."""
        key = _digest(value)
        secret = self._live.get(key)
        if secret is None:
            return "unknown client secret"
        if secret.expires_at <= self._clock():
            del self._live[key]
            return "client secret has expired"
        return secret


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()



@dataclass(frozen=True)
class Access:
    """Granted: with the session config of the client secret presented, if any."""

    settings: SessionSettings | None = None


def authenticate(conn: HTTPConnection, api_key: str | None,
                 client_secrets: ClientSecrets) -> Access | str:
    """Access, or why it is refused. A valid client secret is honoured (and its session
    applied) also when the server has no key; an expired or unknown one is refused."""
    tokens = presented_keys(conn)
    for token in tokens:
        if token.startswith(SECRET_PREFIX):
            found = client_secrets.check(token)
            if isinstance(found, str):
                return found
            return Access(found.settings)
    if authorized(conn, api_key):
        return Access()
    return "invalid or missing API key"
