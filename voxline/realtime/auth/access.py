"""API-key checks, one home for HTTP and WebSocket: constant-time comparison.

A client presents the key as ``Authorization: Bearer KEY`` or, from a browser (which
cannot set headers on a WebSocket), as the subprotocol ``openai-insecure-api-key.KEY``.
Where the key would go, a client secret (``ek_...``, from ``/v1/realtime/client_secrets``)
works too until it expires. A client secret is stateless: an HMAC-signed token
(`signed_tokens`) carrying its expiry and the session config it was issued with, so every
server holding the same signing keys (the ``client_secret_keys`` setting) accepts it,
whichever one issued it. Without that setting each server signs with a key generated at
start-up, which suits one server. A token cannot be revoked before its expiry.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import HTTPConnection

from voxline.errors import ProtocolError
from voxline.realtime.auth.signed_tokens import SigningKeys, sign, verify
from voxline.realtime.openai.client_events import parse_command
from voxline.sessions import commands as cmd
from voxline.sessions.capabilities import MOONSHINE, TranscriptionSupport, check_supported
from voxline.sessions.settings import SessionSettings
from voxline.sessions.transcription_sessions import check_session_kind

KEY_SUBPROTOCOL = "openai-insecure-api-key."
SECRET_PREFIX = "ek_"
MAX_FORGOTTEN = 10_000  # expired tokens remembered as refused; past it the oldest go first


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


def settings_from_session(doc: Any, base: SessionSettings | None = None, *,
                          tools_supported: bool = False,
                          transcription: TranscriptionSupport = MOONSHINE) -> SessionSettings:
    """A GA `session` object as settings, checked as `session.update` would (ProtocolError)."""
    update = parse_command({"type": "session.update", "session": doc})
    assert isinstance(update, cmd.SessionUpdate)
    base = base or SessionSettings()
    settings = check_session_kind(base, base.apply(update.changes), conversation_started=False)
    check_supported(settings, "session", tools_supported=tools_supported,
                    transcription=transcription)
    return settings


# A client secret's session was checked against the ASR of the server that issued it.
ISSUER_CHECKED = TranscriptionSupport("the issuing server's ASR", languages=None, prompt=True)


@dataclass(frozen=True)
class ClientSecret:
    value: str
    expires_at: int  # Unix seconds
    settings: SessionSettings | None  # the session config given at creation


class ClientSecrets:
    """Issues and verifies signed ``ek_`` tokens: ``ek_`` + `signed_tokens.sign` of
    ``{"exp": unix seconds, "n": nonce, "session": the GA session object or null}``.

    The session is carried as the client sent it (compact) and parsed again on use; it
    was checked when the token was issued. A token this server has refused as expired is
    afterwards answered as unknown, as when tokens lived in its memory and were dropped.
    """

    def __init__(self, keys: SigningKeys | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._keys = keys or SigningKeys.generate()
        self._clock = clock
        self._forgotten: OrderedDict[bytes, None] = OrderedDict()

    def issue(self, seconds: int, settings: SessionSettings | None,
              session: dict[str, Any] | None = None) -> ClientSecret:
        """A token valid for `seconds`; `session` is the GA object `settings` came from."""
        expires_at = int(self._clock() + seconds)
        payload = {"exp": expires_at, "n": secrets.token_urlsafe(8), "session": session}
        return ClientSecret(SECRET_PREFIX + sign(payload, self._keys), expires_at, settings)

    def check(self, value: str) -> ClientSecret | str:
        """The secret, or why it is refused."""
        payload = verify(value.removeprefix(SECRET_PREFIX), self._keys)
        expires_at = payload.get("exp") if payload else None
        if not isinstance(expires_at, int) or _digest(value) in self._forgotten:
            return "unknown client secret"
        if expires_at <= self._clock():
            self._forget(value)
            return "client secret has expired"
        doc = payload.get("session") if payload else None
        try:
            # tools were allowed or refused by the server that issued the token
            settings = None if doc is None else settings_from_session(
                doc, tools_supported=True, transcription=ISSUER_CHECKED)
        except ProtocolError as exc:  # signed by a server of another version
            return f"client secret carries an unusable session: {exc}"
        return ClientSecret(value, expires_at, settings)

    def _forget(self, value: str) -> None:
        self._forgotten[_digest(value)] = None
        while len(self._forgotten) > MAX_FORGOTTEN:
            self._forgotten.popitem(last=False)


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
