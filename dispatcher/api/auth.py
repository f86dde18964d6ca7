"""Bearer-token authentication for every RPC but the health check; on the agent port, client certificates
(refused once expired or revoked: store.tokens.revoke_certificate).

Sluice's own tokens (`sl_...`) are looked up by their hash; with an identity provider configured
(api/oidc.py), any other bearer token is verified as the provider's JWT. A verified token is cached for a
few minutes so hot RPCs do not pay a database round trip or a signature check each, but never past the
token's expiry, and a revocation on any replica drops every replica's cache (store.channels.TOKENS_CHANNEL).
Open streams (Watch, WatchBatches, the agent link) ask again at least every RECHECK_S, so a revoked or
expired token ends them within seconds.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import grpc

from dispatcher import tls
from dispatcher.api.asynchronous import Coalescer, blocking
from dispatcher.api.oidc import IdentityProvider
from dispatcher.errors import PermissionDenied, Unauthenticated
from dispatcher.store import channels, tokens
from dispatcher.store.database import Sessions
from dispatcher.store.listening import Notifier
from dispatcher.store.tokens import Principal
from sluice.certs import AgentIdentity

# A revocation reaches every replica's cache at once (TOKENS_CHANNEL, and a forget() whenever the listener
# reconnects), and nothing else in a verified token changes, so the cache only bounds how often a thousand
# open links' and watches' tokens are read again.
CACHE_SECONDS = 300.0
RECHECK_S = 1.0  # a watch's queue memberships are read again at most this often while events come
# An open stream's token is checked again when a revocation wakes it (on_revocation) and when the token
# expires; this often besides, at least. Not every second: a thousand idle links would wake a thousand times.
STREAM_CHECK_S = 60.0
MAX_CACHED = 10_000  # verified tokens kept at most (the cache starts over past it)


class Authenticator:
    def __init__(self, sessions: Sessions, notifier: Notifier | None = None,
                 identity: IdentityProvider | None = None):
        self._sessions = sessions
        self._identity = identity
        self._cache: dict[str, tuple[float, Principal]] = {}
        self._lock = threading.Lock()
        self.revocations = 0  # how many times the cache was dropped: a stream seeing it move checks its token
        self._on_revocation: list[Callable[[], None]] = []
        self._lookups = Coalescer(self._sluice_tokens, name="token-lookups")  # the streams' cache misses
        if notifier is not None:  # a revocation on any replica; "" after the listener reconnected
            notifier.subscribe(channels.TOKENS_CHANNEL, lambda _payload: self.forget())

    @staticmethod
    def _credentials(context: grpc.ServicerContext) -> tuple[str, AgentIdentity | None]:
        """The call's bearer token ("" if none) or, without one, its verified client certificate."""
        secret = ""
        for key, value in context.invocation_metadata():
            if key == "authorization" and value.lower().startswith("bearer "):
                secret = value[7:].strip()
        certificate = None if secret else tls.agent_certificate(context)  # verified, on the agent port only
        if not secret and certificate is None:
            raise Unauthenticated("missing bearer token (metadata 'authorization: Bearer <token>')")
        return secret, certificate

    def _cached(self, key, now: float) -> Principal | None:
        with self._lock:
            hit = self._cache.get(key)
        return hit[1] if hit and hit[0] > now else None

    def known(self, context: grpc.ServicerContext, *roles: str) -> Principal | None:
        """require(), answered from the cache alone: None when that would need the store or the identity
        provider (the caller then calls require() where it may block). For the event loop's open streams."""
        secret, certificate = self._credentials(context)
        if (who := self._cached(secret or certificate, time.monotonic())) is None:
            return None
        return self._allowed(who, roles)

    def principal(self, context: grpc.ServicerContext) -> Principal:
        secret, certificate = self._credentials(context)
        now = time.monotonic()
        if (hit := self._cached(secret or certificate, now)) is not None:
            return hit
        if certificate is not None:
            found = self._certified(certificate)
        elif self._own(secret):
            found = self._sluice_tokens([secret])[0]
            if isinstance(found, Unauthenticated):
                raise found
        else:
            found = self._identity.principal(secret)
        return self._remember(secret or certificate, found, now)

    def _own(self, secret: str) -> bool:
        """Whether a bearer token is one of Sluice's own (looked up in the store), not the identity provider's."""
        return self._identity is None or secret.startswith("sl_")

    def _sluice_tokens(self, secrets: list[str]) -> list[Principal | Unauthenticated]:
        """Whom each of Sluice's own tokens names, or the refusal, in one query for all."""
        with self._sessions() as session:
            found = tokens.authenticate(session, secrets)
        return [found.get(secret) or Unauthenticated(tokens.REFUSED) for secret in secrets]

    def _remember(self, key, found: Principal, now: float) -> Principal:
        """Cache a verified identity until CACHE_SECONDS from `now` or its expiry, whichever comes first."""
        until = now + CACHE_SECONDS
        if found.expires_at is not None:
            until = min(until, now + (found.expires_at - datetime.now(UTC)).total_seconds())
        with self._lock:
            if len(self._cache) >= MAX_CACHED:
                self._cache.clear()
            self._cache[key] = (until, found)
        return found

    def _certified(self, certificate: AgentIdentity) -> Principal:
        """The agent a client certificate names, unless it has expired (an open link outlives the handshake
        that checked it) or is revoked."""
        if certificate.not_after <= datetime.now(UTC):
            raise Unauthenticated(f"the agent's client certificate (serial {certificate.serial}) expired at "
                                  f"{certificate.not_after:%Y-%m-%d %H:%M:%S} UTC")
        with self._sessions() as session:
            if tokens.certificate_revoked(session, certificate.serial):
                raise Unauthenticated(f"the agent's client certificate (serial {certificate.serial}) is revoked")
        return Principal(f"agent-{certificate.cluster}", "agent", certificate.cluster, certificate=certificate.serial,
                         expires_at=certificate.not_after)

    def forget(self) -> None:
        """Drop every cached token (after a revocation: this process refuses it at once), and have every open
        stream check its own again."""
        with self._lock:
            self._cache.clear()
            self.revocations += 1
            hooks = list(self._on_revocation)
        for hook in hooks:
            hook()

    def on_revocation(self, hook: Callable[[], None]) -> None:
        """Call hook() after every forget(), on the thread that forgot (the listener's): it must only hand on."""
        with self._lock:
            self._on_revocation.append(hook)

    @staticmethod
    def check_within(who: Principal) -> float:
        """How long an open stream of `who` may go before its token is checked again, revocations aside: until
        just after the token expires, and STREAM_CHECK_S at most."""
        if who.expires_at is None:
            return STREAM_CHECK_S
        left = (who.expires_at - datetime.now(UTC)).total_seconds()
        return min(STREAM_CHECK_S, max(0.1, left + 0.05))  # after the cache's entry ends, not just before

    def require(self, context: grpc.ServicerContext, *roles: str) -> Principal:
        return self._allowed(self.principal(context), roles)

    async def require_on_loop(self, context: grpc.ServicerContext, *roles: str) -> Principal:
        """require() for a stream on the event loop: from the cache at once, else on the executor; Sluice's own
        tokens missing from the cache together with the other streams' (after a restart every agent and every
        watch calls at once, each with a token the new process has not seen) in one query."""
        if (who := self.known(context, *roles)) is not None:
            return who
        secret, certificate = self._credentials(context)
        if certificate is not None or not self._own(secret):
            return await blocking(self.require, context, *roles)
        now = time.monotonic()
        return self._allowed(self._remember(secret, await self._lookups(secret), now), roles)

    @staticmethod
    def _allowed(who: Principal, roles: tuple[str, ...]) -> Principal:
        if who.role not in roles:
            raise PermissionDenied(f"{who.subject} ({who.role}) may not call this; needs {' or '.join(roles)}")
        return who

    @staticmethod
    def confirm(who: Principal) -> None:
        """Raise Unauthenticated if `who`'s identity-provider token or client certificate has expired by now (a
        Sluice token is checked against its row instead, in the transaction of the work it allows: tokens.held)."""
        if who.token_id is None and who.expires_at is not None and who.expires_at <= datetime.now(UTC):
            raise Unauthenticated(tokens.CERTIFICATE_REFUSED if who.certificate else tokens.REFUSED)
