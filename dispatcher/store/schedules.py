"""Schedules in the store: the only code that reads and writes the `schedules` table.

A schedule's firing is a compare-and-set (`advance`): the row changes only if its last handled due time and
its recent job ids are still those the decision was made from, so two dispatchers racing on one due time
can never both start a job for it (the loser's update matches no row once the winner committed, and its
transaction, job insert included, is rolled back). The jobs a schedule started are read by primary key
(`runs`): nothing about schedules is kept on the jobs table but each job's labels.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete as sql_delete
from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from dispatcher.store.models import Job, Schedule


@dataclass(frozen=True)
class RunRow:
    """A job a schedule started, as `schedule get` shows it."""

    job_id: int
    name: str | None
    state: str
    reason: str
    created_at: datetime
    finished_at: datetime | None


def create(session: Session, *, name: str, owner: str, owner_role: str, spec: dict, suspended: bool,
           next_due_at: datetime | None, created_at: datetime, status: str = "") -> Schedule | None:
    """Insert a schedule; None, having written nothing, when one of that name exists. created_at: the clock of
    the caller's decisions (its first due time is the first after it)."""
    stmt = (pg_insert(Schedule).values(name=name, owner=owner, owner_role=owner_role, spec=spec,
                                       suspended=suspended, next_due_at=next_due_at, status=status,
                                       created_at=created_at)
            .on_conflict_do_nothing(index_elements=["name"]).returning(Schedule.name))
    if session.execute(stmt).first() is None:
        return None
    return get(session, name)


def get(session: Session, name: str) -> Schedule | None:
    return session.execute(select(Schedule).where(Schedule.name == name)
                           .execution_options(populate_existing=True)).scalar_one_or_none()


def list_schedules(session: Session, owner: str | None = None) -> list[Schedule]:
    """Every schedule by name, or only those of `owner`."""
    stmt = select(Schedule).order_by(Schedule.name)
    if owner is not None:
        stmt = stmt.where(Schedule.owner == owner)
    return list(session.scalars(stmt))


def due_names(session: Session, now: datetime, limit: int) -> list[str]:
    """The schedules, not suspended, with a due time at or before `now`, earliest first (ix_schedules_next_due_at)."""
    return list(session.scalars(select(Schedule.name)
                                .where(Schedule.suspended.is_(False), Schedule.next_due_at <= now)
                                .order_by(Schedule.next_due_at).limit(limit)))


def runs(session: Session, job_ids: list[int]) -> dict[int, RunRow]:
    """The jobs of these ids, by primary key (ids no job has are left out)."""
    if not job_ids:
        return {}
    rows = session.execute(select(Job.id, Job.name, Job.state, Job.reason, Job.created_at, Job.finished_at)
                           .where(Job.id.in_(job_ids)))
    return {r.id: RunRow(r.id, r.name, r.state, r.reason, r.created_at, r.finished_at) for r in rows}


def advance(session: Session, name: str, *, seen_at: datetime | None, seen_ids: list[int],
            due: datetime | None, next_due: datetime | None, job_ids: list[int], status: str,
            error: str | None = None, error_at: datetime | None = None) -> bool:
    """Record what a firing (or a trigger, with due = seen_at) did, compare-and-set on the last handled due time
    and the recent job ids it decided from: False, with nothing written, when either changed meanwhile."""
    values: dict = {"last_scheduled_at": due, "next_due_at": next_due, "recent_job_ids": job_ids, "status": status}
    if error is not None:
        values.update(last_error=error, last_error_at=error_at)
    stmt = (update(Schedule)
            .where(Schedule.name == name, Schedule.last_scheduled_at.is_not_distinct_from(seen_at),
                   Schedule.recent_job_ids == seen_ids)
            .values(**values).returning(Schedule.name).execution_options(synchronize_session=False))
    return session.execute(stmt).first() is not None


def set_suspended(session: Session, name: str, suspended: bool, status: str) -> bool:
    stmt = (update(Schedule).where(Schedule.name == name).values(suspended=suspended, status=status)
            .returning(Schedule.name).execution_options(synchronize_session=False))
    return session.execute(stmt).first() is not None


def delete(session: Session, name: str) -> bool:
    return session.execute(sql_delete(Schedule).where(Schedule.name == name).returning(Schedule.name)).first() \
        is not None

