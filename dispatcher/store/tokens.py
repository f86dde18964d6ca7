"""API tokens: random secrets handed out once, stored only as their SHA-256."""
from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from dispatcher.errors import NotFound
from dispatcher.store.models import ApiToken

ROLES = ("admin", "user", "agent")


@dataclass(frozen=True)
class Principal:
    subject: str
    role: str
    cluster: str | None = None  # agent tokens are bound to one cluster


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
    session.refresh(row)
    return row, True


def authenticate(session: Session, secret: str) -> Principal | None:
    row = session.scalars(select(ApiToken).where(
        ApiToken.token_hash == hash_token(secret), ApiToken.revoked_at.is_(None),
        or_(ApiToken.expires_at.is_(None), ApiToken.expires_at > func.now()))).first()
    return None if row is None else Principal(row.subject, row.role, row.cluster)
