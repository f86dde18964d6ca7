"""Admin objects as stored documents, what refers to them, and the audit log.

Writing objects goes through clusters.apply_object; this module reads them back as their canonical
documents (the `spec` column holds the whole document), locks and deletes them, counts the rows that
refer to one, and records every admin change. The caller owns the transaction.
"""
from __future__ import annotations

from sqlalchemy import delete, func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dispatcher.errors import Conflict
from dispatcher.store.models import AuditRecord, Base, BurstPolicy, Cluster, Job, Queue, ServiceClass

MODELS = {"Queue": Queue, "ServiceClass": ServiceClass, "Cluster": Cluster, "BurstPolicy": BurstPolicy}
JOB_COLUMNS = {"Queue": Job.queue, "ServiceClass": Job.service_class, "Cluster": Job.cluster}
ADMIN_LOCK = 7304  # transaction-scoped advisory lock: one admin change at a time


def serialize(session: Session) -> None:
    """Hold the admin lock until the transaction ends: a change is checked against the objects as they
    are, not as another concurrent change left them half a moment ago."""
    session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADMIN_LOCK})


def documents(session: Session, kind: str | None = None, name: str | None = None) -> list[tuple[str, dict]]:
    """(kind, document) of every stored admin object, or of one kind, or of one object; by kind, then name."""
    out = []
    for model_kind, model in MODELS.items():
        if kind is not None and kind != model_kind:
            continue
        stmt = select(model.spec).order_by(model.name)
        if name is not None:
            stmt = stmt.where(model.name == name)
        out.extend((model_kind, doc) for doc in session.scalars(stmt))
    return out


def lock(session: Session, kind: str, name: str) -> dict | None:
    """The object's document, its row locked until the transaction ends (new references to it wait)."""
    model = MODELS[kind]
    return session.scalar(select(model.spec).where(model.name == name).with_for_update())


def job_states(session: Session, kind: str, name: str) -> dict[str, int]:
    """Jobs per state that name this queue, service class or cluster."""
    column = JOB_COLUMNS.get(kind)
    if column is None:
        return {}
    return dict(session.execute(select(Job.state, func.count()).where(column == name).group_by(Job.state)).all())


def references(session: Session, kind: str, name: str) -> dict[str, int]:
    """Rows per table whose foreign key names this object: they keep it from being deleted."""
    target = MODELS[kind].__table__.c.name
    out = {}
    for table in sorted(Base.metadata.sorted_tables, key=lambda t: t.name):  # a stable order to name them in
        for fk in table.foreign_keys:
            if fk.column is target:
                n = session.scalar(select(func.count()).select_from(table).where(fk.parent == name))
                if n:
                    out[table.name] = out.get(table.name, 0) + n
    return out


def delete_object(session: Session, kind: str, name: str) -> None:
    model = MODELS[kind]
    try:
        with session.begin_nested():
            session.execute(delete(model).where(model.name == name))
    except IntegrityError as exc:  # a reference committed after the caller's checks
        raise Conflict(f"{kind} {name} is still referred to: {exc.orig}") from exc


def record(session: Session, actor: str, action: str, kind: str, name: str, details: dict) -> None:
    session.add(AuditRecord(actor=actor, action=action, kind=kind, name=name, details=details))
    session.flush()


def audit(session: Session, *, limit: int, after_id: int = 0) -> list[AuditRecord]:
    """Records after `after_id`, oldest first; with after_id 0, the newest `limit`, oldest first."""
    if after_id:
        stmt = select(AuditRecord).where(AuditRecord.id > after_id).order_by(AuditRecord.id).limit(limit)
        return list(session.scalars(stmt))
    return list(reversed(session.scalars(select(AuditRecord).order_by(AuditRecord.id.desc()).limit(limit)).all()))
