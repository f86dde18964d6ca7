"""Reads of jobs, their events and attempts for the API and the agent link (no writes: see lifecycle.py)."""
from __future__ import annotations

from sqlalchemy import func, or_, select, text
from sqlalchemy.orm import Session, defer

from dispatcher.errors import NotFound
from dispatcher.policy import states
from dispatcher.store.database import named
from dispatcher.store.models import Attempt, Job, JobArray, sql_strings
from sluice.spec import MAX_PRIORITY


def get(session: Session, job_id: int, *, for_update: bool = False) -> Job:
    stmt = select(Job).where(Job.id == job_id)
    if for_update:
        stmt = stmt.with_for_update()
    job = session.scalars(stmt).first()
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


def list_jobs(session: Session, *, queue: str | None = None, state: str | None = None, user: str | None = None,
              cluster: str | None = None, name: str | None = None, array_id: int | None = None, after_id: int = 0,
              limit: int = 100,
              visible_to: tuple[str, frozenset[str]] | None = None) -> list[Job]:
    """Jobs in id order, after a cursor: keyset paging stays fast however deep the listing goes.

    The job documents and resource maps stay unloaded: listings never show them. user and cluster match
    exactly; name matches any job whose name contains it, ignoring case. visible_to: (user, queues) lists only
    that user's jobs and those of these queues (services.scoping); None lists every job.
    """
    stmt = (select(Job).options(defer(Job.spec), defer(Job.requests), defer(Job.largest_pod), defer(Job.placement))
            .where(Job.id > after_id).order_by(Job.id).limit(limit))
    if queue:
        stmt = stmt.where(Job.queue == queue)
    if state:
        stmt = stmt.where(Job.state == state)
    if user:
        stmt = stmt.where(Job.submitted_by == user)
    if cluster:
        stmt = stmt.where(Job.cluster == cluster)
    if array_id:
        stmt = stmt.where(Job.array_id == array_id)
    if name:  # the text itself, not a pattern: its % and _ are escaped
        stmt = stmt.where(Job.name.ilike("%" + _like_escaped(name) + "%", escape="\\"))
    if visible_to is not None:
        user, queues = visible_to
        stmt = stmt.where(or_(Job.submitted_by == user, Job.queue.in_(sorted(queues))))
    return list(session.scalars(stmt))


def _like_escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def events(session: Session, *, job_id: int = 0, after_id: int = 0, through_id: int | None = None,
           limit: int = 1000, also: list[int] = (), with_owner: bool = False) -> list:
    """Events after `after_id` (up to `through_id`) in id order, and those of the ids in `also` (gaps below it)
    that exist now. Rows with JobEvent's fields (id, job_id, attempt, from_state, to_state, reason, cluster, at);
    with_owner adds their job's queue and submitted_by (for services.scoping)."""
    where = ["e.id > %(after)s"]
    if also:  # the range bound lets the primary key's index start at the oldest gap (gaps are recent),
        # whatever the planner makes of the OR (on a table not yet analyzed it read the whole table)
        where = ["e.id >= %(oldest)s AND (e.id > %(after)s OR e.id = ANY(%(also)s))"]
    if through_id is not None:
        where.append("e.id <= %(through)s")
    if job_id:
        where.append("e.job_id = %(job)s")
    source = ("e.*, j.queue, j.submitted_by FROM (SELECT {cols} FROM job_events e WHERE {where} ORDER BY e.id "
              "LIMIT %(limit)s) e JOIN jobs j ON j.id = e.job_id ORDER BY e.id" if with_owner else
              "{cols} FROM job_events e WHERE {where} ORDER BY e.id LIMIT %(limit)s")
    return named(session, "SELECT " + source.format(cols=_EVENT_COLUMNS, where=" AND ".join(where)),
                 {"after": after_id, "through": through_id, "oldest": min(also, default=0), "also": list(also),
                  "job": job_id, "limit": limit})


def last_event_id(session: Session) -> int:
    return session.scalar(text("SELECT coalesce(max(id), 0) FROM job_events")) or 0


def missing_event_ids(session: Session, through_id: int, span: int) -> list[int]:
    """The ids of the `span` up to `through_id` that no event has (now): rolled back, or not yet committed."""
    return list(session.scalars(text(
        "SELECT g FROM generate_series(greatest(:through - :span + 1, 1), :through) g "
        "WHERE NOT EXISTS (SELECT 1 FROM job_events WHERE id = g)"), {"through": through_id, "span": span}))


_EVENT_COLUMNS = "e.id, e.job_id, e.attempt, e.from_state, e.to_state, e.reason, e.cluster, e.at"


def queue_position(session: Session, job: Job) -> int:
    """1-based place of a queued job among the queued jobs of its queue, in scheduling order."""
    if job.state != states.QUEUED:
        return 0
    ahead = session.scalar(
        select(func.count()).select_from(Job).where(
            Job.queue == job.queue, Job.state == states.QUEUED,
            text("(jobs.class_priority, jobs.priority, -jobs.id) > (:cp, :p, :negid)"),
        ).params(cp=job.class_priority, p=job.priority, negid=-job.id))
    return int(ahead or 0) + 1


def ended_by_report(session: Session, pairs: list[tuple[int, int]]) -> set[tuple[int, int]]:
    """Of these (job, attempt), the attempts that ended SUCCEEDED or FAILED (their cluster reported so)."""
    if not pairs:
        return set()
    jobs, attempts = map(list, zip(*pairs))
    return {(r[0], r[1]) for r in session.execute(text(
        f"""SELECT a.job_id, a.attempt FROM attempts a
           JOIN unnest(CAST(:jobs AS bigint[]), CAST(:attempts AS int[])) AS p(job_id, attempt)
             ON a.job_id = p.job_id AND a.attempt = p.attempt
           WHERE a.state IN {sql_strings((states.SUCCEEDED, states.FAILED))} AND a.finished_at IS NOT NULL"""),
        {"jobs": jobs, "attempts": attempts})}


def existing_ids(session: Session, job_ids: list[int]) -> set[int]:
    """Which of these job ids exist."""
    if not job_ids:
        return set()
    return set(session.scalars(select(Job.id).where(Job.id.in_(job_ids))))


def attempt_cluster(session: Session, job_id: int, attempt: int) -> str | None:
    """The cluster an attempt of a job was dispatched to; None when the job has no such attempt."""
    return session.scalar(select(Attempt.cluster).where(Attempt.job_id == job_id, Attempt.attempt == attempt))


def attempts(session: Session, job_id: int) -> list[Attempt]:
    """The job's attempts, oldest first."""
    return list(session.scalars(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.attempt)))


def job_bursts(session: Session, job_id: int) -> list[tuple[int, dict]]:
    """(attempt, burst decision) of the job's attempts that burst, oldest first."""
    return [(r.attempt, r.burst) for r in session.execute(
        select(Attempt.attempt, Attempt.burst).where(Attempt.job_id == job_id, Attempt.burst.is_not(None))
        .order_by(Attempt.attempt))]


def active_attempts(session: Session, clusters: list[str]) -> dict[str, set[tuple[int, int]]]:
    """The (job, attempt) live on each of these clusters (every cluster named is in the answer)."""
    live: dict[str, set[tuple[int, int]]] = {cluster: set() for cluster in clusters}
    for row in named(session, f"SELECT cluster, id, attempt FROM jobs WHERE cluster = ANY(%(clusters)s) "
                              f"AND state IN {sql_strings(states.ACTIVE)}", {"clusters": list(clusters)}):
        live[row.cluster].add((row.id, row.attempt))
    return live



def queued_shapes(session: Session) -> list[tuple[dict, dict, dict, list[int]]]:
    """(requests, largest pod, placement, ids) of the queued jobs, one row per distinct shape and placement."""
    return [tuple(row) for row in named(
        session, f"""SELECT requests, largest_pod, placement, array_agg(id ORDER BY id) FROM jobs
                     WHERE state = '{states.QUEUED}' GROUP BY requests, largest_pod, placement""")]


def newest_named(session: Session, name: str, submitted_by: str) -> int | None:
    """The id of the newest job of this name that this user submitted (a dependency by name)."""
    return session.scalar(select(Job.id).where(Job.name == name, Job.submitted_by == submitted_by)
                          .order_by(Job.id.desc()).limit(1))


def array_elements(session: Session, array_ids: list[int]) -> list[int]:
    """The elements of these arrays not yet ended, in id order; NotFound for an id that is no array."""
    if not array_ids:
        return []
    found = set(session.scalars(select(JobArray.id).where(JobArray.id.in_(array_ids))))
    for array_id in array_ids:
        if array_id not in found:
            raise NotFound(f"array {array_id} not found")
    return list(session.scalars(select(Job.id).where(Job.array_id.in_(array_ids),
                                                     Job.state.not_in(states.FINAL)).order_by(Job.id)))



def mark_attached(session: Session, job_id: int, now) -> None:
    session.execute(text("UPDATE jobs SET attached_at = :now WHERE id = :id"), {"now": now, "id": job_id})


def current_address(session: Session, job_id: int, attempt: int) -> str | None:
    return session.scalar(select(Attempt.address).where(Attempt.job_id == job_id, Attempt.attempt == attempt))


def sessions_with_idle_timeout(session: Session) -> list[tuple]:
    """(id, idleTimeout as given, started_at, attached_at) of the running interactive sessions that have an
    idle timeout (an interactive job's priority is above MAX_PRIORITY: policy.sessions)."""
    return [tuple(r) for r in session.execute(text(
        f"""SELECT id, spec -> 'spec' ->> 'idleTimeout', started_at, attached_at FROM jobs
            WHERE state = '{states.RUNNING}' AND priority > {MAX_PRIORITY} AND spec -> 'spec' ? 'idleTimeout'
            ORDER BY id"""))]
