"""Bearer-token authentication for every RPC but the health check; on the agent port, client certificates.

Tokens are looked up by their hash; a verified token is cached for a few seconds so hot RPCs do not
pay a database round trip each (a revoked token stops working within that time).
"""
from __future__ import annotations

import threading
import time

import grpc

from dispatcher import tls
from dispatcher.errors import PermissionDenied, Unauthenticated
from dispatcher.store import tokens
from dispatcher.store.database import Sessions
from dispatcher.store.tokens import Principal

CACHE_SECONDS = 5.0


class Authenticator:
    def __init__(self, sessions: Sessions):
        self._sessions = sessions
        self._cache: dict[str, tuple[float, Principal]] = {}
        self._lock = threading.Lock()

    def principal(self, context: grpc.ServicerContext) -> Principal:
        secret = ""
        for key, value in context.invocation_metadata():
            if key == "authorization" and value.lower().startswith("bearer "):
                secret = value[7:].strip()
        if not secret:
            cluster = tls.cluster_of(context)  # an agent's client certificate, verified on the agent port
            if cluster is not None:
                return Principal(f"agent-{cluster}", "agent", cluster)
            raise Unauthenticated("missing bearer token (metadata 'authorization: Bearer <token>')")
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(secret)
        if hit and hit[0] > now:
            return hit[1]
        with self._sessions() as session:
            found = tokens.authenticate(session, secret)
        if found is None:
            raise Unauthenticated("invalid, expired or revoked token")
        with self._lock:
            self._cache[secret] = (now + CACHE_SECONDS, found)
        return found

    def forget(self) -> None:
        """Drop every cached token (after a revocation: this process refuses it at once)."""
        with self._lock:
            self._cache.clear()

    def require(self, context: grpc.ServicerContext, *roles: str) -> Principal:
        who = self.principal(context)
        if who.role not in roles:
            raise PermissionDenied(f"{who.subject} ({who.role}) may not call this; needs {' or '.join(roles)}")
        return who
