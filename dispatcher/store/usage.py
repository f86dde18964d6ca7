"""Totals over jobs and attempts: for /metrics (read at scrape time), chargeback and burst budgets."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import Row, func, select, text
from sqlalchemy.orm import Session

from dispatcher.policy import states
from dispatcher.store.models import Attempt, Job, sql_strings


def queued_per_class(session: Session) -> list[Row]:
    """(queue, service_class, jobs, oldest) of queued jobs; oldest: the earliest submit time among them."""
    return session.execute(select(Job.queue, Job.service_class, func.count().label("jobs"),
                                  func.min(Job.created_at).label("oldest"))
                           .where(Job.state == states.QUEUED).group_by(Job.queue, Job.service_class)).all()


def active_per_cluster(session: Session) -> list[Row]:
    """(queue, cluster, jobs) of dispatched and running jobs."""
    return session.execute(select(Job.queue, Job.cluster, func.count().label("jobs"))
                           .where(Job.state.in_(states.ACTIVE)).group_by(Job.queue, Job.cluster)).all()


def used_per_cluster(session: Session) -> list[Row]:
    """(queue, cluster, resource, milli) summed over the requests of dispatched and running jobs."""
    return session.execute(text(
        f"""SELECT j.queue, j.cluster, r.key AS resource, sum(r.value::numeric) AS milli
           FROM jobs j CROSS JOIN LATERAL jsonb_each_text(j.requests) r
           WHERE j.state IN {sql_strings(states.ACTIVE)}
           GROUP BY j.queue, j.cluster, r.key""")).all()


# -- chargeback (dispatcher/accounting.py) ------------------------------------------------------------

def attempt_runs(session: Session, *, ended_after: datetime | None = None) -> list[Row]:
    """(cluster, started_at, finished_at, queue, service_class, submitted_by, requests, array_id) of every
    attempt that started running; with `ended_after`, only those still running or finished at or after it."""
    stmt = (select(Attempt.cluster, Attempt.started_at, Attempt.finished_at, Job.queue, Job.service_class,
                   Job.submitted_by, Job.requests, Job.array_id)
            .join(Job, Job.id == Attempt.job_id).where(Attempt.started_at.is_not(None))
            .order_by(Attempt.job_id, Attempt.attempt))
    if ended_after is not None:
        stmt = stmt.where(Attempt.finished_at.is_(None) | (Attempt.finished_at >= ended_after))
    return session.execute(stmt).all()


def burst_attempts(session: Session, since: datetime | None) -> list[Row]:
    """Attempts sent to paid clusters by a burst decision that are still running or finished since `since`
    (None: every one)."""
    stmt = select(Attempt.burst, Attempt.state, Attempt.dispatched_at, Attempt.started_at, Attempt.finished_at
                  ).where(Attempt.burst.is_not(None))
    if since is not None:
        stmt = stmt.where(Attempt.finished_at.is_(None) | (Attempt.finished_at >= since))
    return session.execute(stmt).all()

