"""API tokens: random secrets handed out once, stored only as their SHA-256; agents' client certificates
revoked by serial number; and who a caller is (Principal), with the one rule of queue membership."""
from __future__ import annotations

import hashlib
import secrets
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, or_, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from dispatcher.errors import NotFound
from dispatcher.store import channels
from dispatcher.store.models import ApiToken, RevokedCertificate

ROLES = ("admin", "user", "agent")
REFUSED = "invalid, expired or revoked token"  # the one answer to a token that does not hold, whatever the cause
CERTIFICATE_REFUSED = "the agent's client certificate is revoked or expired"


@dataclass(frozen=True)
class Principal:
    subject: str
    role: str
    cluster: str | None = None  # agent tokens are bound to one cluster
    queues: frozenset[str] = frozenset()  # queues an identity provider's groups make this user a member of
    token_id: int | None = None  # the api_tokens row of a Sluice token; None for an identity provider's
    certificate: str | None = None  # the serial number (hex) of the client certificate an agent presented
    expires_at: datetime | None = None  # None: never expires

    def belongs(self, queue: str, members: Collection[str]) -> bool:
        """Whether this caller is a member of `queue`, whose Queue object lists `members`: listed by name,
        or granted the queue by an identity provider's group. Submitting to a queue that lists members,
        cancelling and reading others' jobs in it all ask this."""
        return self.subject in members or queue in self.queues


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create(session: Session, role: str, subject: str, cluster: str | None = None,
           expires_at: datetime | None = None) -> str:
    return issue(session, role, subject, cluster, expires_at)[1]


def issue(session: Session, role: str, subject: str, cluster: str | None = None,
          expires_at: datetime | None = None) -> tuple[int, str]:
    """A new token: (id, secret). The secret is returned only here."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    secret = "sl_" + secrets.token_urlsafe(32)
    row = ApiToken(token_hash=hash_token(secret), role=role, subject=subject, cluster=cluster, expires_at=expires_at)
    session.add(row)
    session.flush()
    return row.id, secret


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def revoke(session: Session, token_id: int) -> tuple[ApiToken, bool]:
    """Revoke a token; returns it and whether this call revoked it (False: it already was)."""
    row = session.scalars(select(ApiToken).where(ApiToken.id == token_id).with_for_update()).first()
    if row is None:
        raise NotFound(f"token {token_id} not found")
    if row.revoked_at is not None:
        return row, False
    row.revoked_at = func.now()
    session.flush()
    channels.notify(session, channels.TOKENS_CHANNEL, str(token_id))  # every replica drops its cached tokens
    session.refresh(row)
    return row, True


def authenticate(session: Session, secrets: list[str]) -> dict[str, Principal]:
    """Whom each of these tokens names, for those that hold (neither revoked nor expired), by secret."""
    by_hash = {hash_token(secret): secret for secret in secrets}
    rows = session.scalars(select(ApiToken).where(
        ApiToken.token_hash.in_(list(by_hash)), ApiToken.revoked_at.is_(None),
        or_(ApiToken.expires_at.is_(None), ApiToken.expires_at > func.now())))
    return {by_hash[row.token_hash]: Principal(row.subject, row.role, row.cluster, token_id=row.id,
                                               expires_at=row.expires_at) for row in rows}


# A row when the token %(token)s is neither revoked nor expired now, its row then locked (FOR SHARE) until
# the transaction ends: a revocation waits for the work it would have refused, or that work sees it.
HELD_SQL = ("SELECT 1 FROM api_tokens WHERE id = %(token)s AND revoked_at IS NULL "
            "AND (expires_at IS NULL OR expires_at > now()) FOR SHARE")
# A row when the client certificate with serial %(serial)s is not revoked (as this transaction sees it).
CERTIFICATE_HELD_SQL = "SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM revoked_certificates WHERE serial = %(serial)s)"


def held(who: Principal) -> tuple[str, dict] | None:
    """The statement and parameters that answer a row while `who`'s token or certificate still holds; None
    for an identity provider's token (its expiry is all there is to check: Authenticator.confirm)."""
    if who.token_id is not None:
        return HELD_SQL, {"token": who.token_id}
    if who.certificate is not None:
        return CERTIFICATE_HELD_SQL, {"serial": who.certificate}
    return None


def revoke_certificate(session: Session, serial: str, cluster: str | None = None,
                       not_after: datetime | None = None) -> tuple[RevokedCertificate, bool]:
    """Revoke an agent's client certificate by serial number (lowercase hex); (the revocation, whether this
    call made it). Every replica drops its cached identities when this commits, and links open with it end."""
    made = session.execute(insert(RevokedCertificate).values(serial=serial, cluster=cluster, not_after=not_after)
                           .on_conflict_do_nothing().returning(RevokedCertificate.serial)).first() is not None
    if made:
        channels.notify(session, channels.TOKENS_CHANNEL, f"certificate {serial}")
    return session.get(RevokedCertificate, serial, populate_existing=True), made


def certificate_revoked(session: Session, serial: str) -> bool:
    return session.get(RevokedCertificate, serial) is not None


def revoked_certificates(session: Session) -> list[RevokedCertificate]:
    return list(session.scalars(select(RevokedCertificate).order_by(RevokedCertificate.revoked_at)))
