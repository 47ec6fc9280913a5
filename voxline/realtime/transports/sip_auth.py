"""Who may call: the ``sip_allow`` address list, and SIP digest authentication (RFC 3261
§22, RFC 7616 ``qop=auth``) for trunks that authenticate instead.

An INVITE from an allowed address is answered. Otherwise, with a digest user configured,
one without credentials is challenged (401 + ``WWW-Authenticate``); one with valid
credentials is answered; anything else gets 403. Nonces are stateless (a timestamp and
its HMAC under a per-process key), so nothing is stored per challenge and a flood of
unauthenticated INVITEs costs no memory. Digest arithmetic is aiosipua's
(``build_credentials``): the server recomputes the response the caller should have sent.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
import os
import time

from aiosipua import AuthChallenge, SipDigestAuth, SipRequest, build_credentials, parse_auth

NONCE_TTL_S = 300


class Verdict(enum.Enum):
    ANSWER = "answer"
    CHALLENGE = "challenge"  # 401 with a fresh nonce
    FORBIDDEN = "forbidden"  # 403


def allowed_sources(spec: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """``sip_allow``: comma-separated addresses or networks (``10.0.0.0/8``)."""
    return [ipaddress.ip_network(part.strip(), strict=False)
            for part in spec.split(",") if part.strip()]


class CallerCheck:
    """Decides whether an INVITE from `host` is answered, challenged or refused."""

    def __init__(self, allow: str, user: str | None = None, password: str | None = None,
                 realm: str = "voxline") -> None:
        self.allow = allowed_sources(allow)
        self.auth = SipDigestAuth(user, password or "") if user else None
        self.realm = realm
        self._key = os.urandom(16)

    def verdict(self, request: SipRequest, host: str, now: float | None = None) -> Verdict:
        if self._allowed(host):
            return Verdict.ANSWER
        if self.auth is None:
            return Verdict.FORBIDDEN
        header = request.get_header("authorization")
        if not header:
            return Verdict.CHALLENGE
        return Verdict.ANSWER if self._valid(request, header, now) else Verdict.FORBIDDEN

    def challenge(self, now: float | None = None) -> str:
        """A ``WWW-Authenticate`` value with a fresh nonce."""
        return (f'Digest realm="{self.realm}", nonce="{self._nonce(now)}", algorithm=MD5, '
                f'qop="auth"')

    def _allowed(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in net for net in self.allow)

    def _nonce(self, now: float | None) -> str:
        stamp = str(int(time.time() if now is None else now))
        return f"{stamp}.{self._mac(stamp)}"

    def _mac(self, stamp: str) -> str:
        return hmac.new(self._key, stamp.encode(), hashlib.sha256).hexdigest()[:32]

    def _nonce_fresh(self, nonce: str, now: float | None) -> bool:
        stamp, _, mac = nonce.partition(".")
        if not stamp.isdigit() or not hmac.compare_digest(mac, self._mac(stamp)):
            return False
        return 0 <= (time.time() if now is None else now) - int(stamp) <= NONCE_TTL_S

    def _valid(self, request: SipRequest, header: str, now: float | None) -> bool:
        assert self.auth is not None
        try:
            given = parse_auth(header)
        except Exception:  # a malformed header is no credential
            return False
        p = given.params
        if given.scheme.lower() != "digest" or p.get("username") != self.auth.username \
                or p.get("realm") != self.realm or not self._nonce_fresh(p.get("nonce", ""), now):
            return False
        challenge = AuthChallenge("Digest", {"realm": self.realm, "nonce": p["nonce"],
                                             "algorithm": p.get("algorithm", "MD5")})
        if "qop" in p:
            challenge.params["qop"] = p["qop"]
        try:
            nonce_count = int(p.get("nc", "1"), 16)
        except ValueError:
            return False
        expected = build_credentials(self.auth, challenge, request.method, p.get("uri", ""),
                                     nonce_count=nonce_count, cnonce=p.get("cnonce"))
        return expected is not None and hmac.compare_digest(
            expected.params["response"], p.get("response", ""))
