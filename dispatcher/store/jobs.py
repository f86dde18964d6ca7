"""Jobs, their events and attempts: every read and write of them goes through here.

Every change of a job's state goes through `transition` (or the batched `dispatch`), which checks the
state machine, compare-and-sets on the expected state and writes the job event in the same
transaction. The caller owns the transaction: these functions may flush, never commit.
"""
from __future__ import annotations

import functools
import json
import logging
import struct
from dataclasses import dataclass
from datetime import datetime

import orjson
import psycopg
from sqlalchemy import Row, func, select, text, update
from sqlalchemy.orm import Session, defer

from dispatcher.errors import Conflict, NotFound
from dispatcher.policy import states
from dispatcher.store.database import driver, named
from dispatcher.store.models import Attempt, Job, JobEvent

log = logging.getLogger(__name__)

WAKE_CHANNEL = "sluice_wake"  # new work or freed capacity: the scheduler should run a cycle
# Payloads of WAKE_CHANNEL: a queue's name (a queued job was cancelled, or went back to its queue), a
# submit's (submit_wake: the name, a space, its best new job's order), ROOM (room may have freed: a
# cluster's capacity changed or an attempt ended; no job became queued), or "" (anything may have
# changed). Queue names never start with "+" and hold no space.
ROOM = "+room"
EVENTS_CHANNEL = "sluice_events"  # job events were written
OUTBOX_CHANNEL = "sluice_outbox"  # payload: cluster name with new commands
SUBMITTED = "submitted"  # the reason of a job no scheduling cycle has looked at yet


def notify(session: Session, channel: str, payload: str = "") -> None:
    """Queue a NOTIFY; Postgres delivers it when (and only if) the transaction commits."""
    notify_many(session, [(channel, payload)])


def submit_wake(queue: str, class_priority: int, priority: int, job_id: int) -> str:
    """The wake-up of a submit to `queue`: its name, then the place of its best new job in the queue's
    order (class priority and priority, higher first, then id), which scheduling.Parking compares with
    the heads it parked."""
    return f"{queue} {class_priority} {priority} {job_id}"


def notify_many(session: Session, notes: list[tuple[str, str]]) -> None:
    """Queue several NOTIFYs, (channel, payload) each, in one round trip; delivered as notify's are."""
    if notes:
        driver(session).execute(_NOTIFY, _notes(notes))


# NOTIFY each (channel, payload) of the arrays %(c)s and %(p)s (psycopg's parameters: see
# database.driver); also a part of a statement that writes first, to save a round trip.
_NOTIFY = "SELECT pg_notify(n.c, n.p) FROM unnest(%(c)s::text[], %(p)s::text[]) AS n(c, p)"


def _notes(notes: list[tuple[str, str]]) -> dict:
    return {"c": [c for c, _ in notes], "p": [p for _, p in notes]}


@dataclass(slots=True)  # not frozen: a frozen dataclass sets each field through object.__setattr__
class NewJob:
    name: str | None
    queue: str
    service_class: str
    class_priority: int
    priority: int
    max_retries: int
    spec: dict
    requests: dict
    largest_pod: dict
    placement: dict
    labels: dict
    submitted_by: str


COPY_FROM = 100  # jobs in one write from which they go by binary COPY; fewer go in one statement


class ExactJSON(dict):
    """A job document to encode exactly as `json` does: its call held a document orjson would not decode
    (NaN, Infinity, a lone surrogate, an integer past 64 bits...), so its values may be ones orjson
    would write otherwise (NaN as null) or refuse. Postgres then takes or refuses it as before."""


def _dumps(value) -> bytes:
    """Compact JSON, UTF-8: orjson, which writes a document several times faster than `json`; `json` for
    what orjson refuses (an ExactJSON, lone surrogates, integers past 64 bits, nesting past 254 levels),
    so that what orjson cannot write the same still goes to Postgres as it did (ASCII: Postgres refuses
    the escapes of lone surrogates, failing the call)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_PASSTHROUGH_SUBCLASS)
    except TypeError:  # orjson.JSONEncodeError too
        return _json(value).encode()


def submit(session: Session, jobs: list[NewJob], *, copy_from: int = COPY_FROM) -> list[int]:
    """Insert queued jobs with their first event; returns their ids, in order.

    The ids are drawn from the jobs' identity sequence in the given order, so the jobs of one call keep
    it, and each job's `submitted` event takes its id in the same order. Both ways below write the same
    rows and queue the same notifications.
    """
    if not jobs:
        return []
    if len(jobs) < copy_from:
        return _insert(session, jobs)
    return _copy(session, jobs)


def _insert(session: Session, jobs: list[NewJob]) -> list[int]:
    """One statement (one round trip), from one JSON array: for a few jobs, where COPY's four extra round
    trips would cost more than it saves."""
    return submit_if(driver(session), jobs, "true", {})  # in the session's transaction; "true": always


def submit_if(connection: psycopg.Connection, jobs: list[NewJob], guard: str, params: dict) -> list[int] | None:
    """Insert a few queued jobs as `submit` does, in one statement that is its own transaction on an
    autocommit psycopg `connection` (one round trip in all, no BEGIN or COMMIT), but only if the SQL
    condition `guard` (psycopg's %(name)s parameters, taking `params`) holds in that statement's snapshot.
    None, and nothing written or notified, if it does not."""
    return [row[0] for row in connection.execute(_inserting(guard), {**params, **_insert_params(jobs)})] or None


def _insert_params(jobs: list[NewJob]) -> dict:
    batch = _dumps([{"name": j.name, "queue": j.queue, "service_class": j.service_class,
                     "class_priority": j.class_priority, "priority": j.priority, "max_retries": j.max_retries,
                     "spec": j.spec, "requests": j.requests, "largest_pod": j.largest_pod,
                     "placement": j.placement, "labels": j.labels, "submitted_by": j.submitted_by}
                    for j in jobs]).decode()
    return {"batch": batch, "reason": SUBMITTED, "wake": WAKE_CHANNEL, "events": EVENTS_CHANNEL}


@functools.lru_cache(maxsize=8)
def _inserting(guard: str) -> str:
    """The one statement of `_insert` and `submit_if`, run on the psycopg connection (database.driver: a
    statement through SQLAlchemy cost the dispatcher about 100 us more a write): it draws ids for the rows
    of %(batch)s only where `guard` holds (evaluated once, in the statement's snapshot), so nothing at all
    is written otherwise."""
    return (
        """WITH new AS (
               SELECT nextval(pg_get_serial_sequence('jobs', 'id')) AS id, u.* FROM (
                   SELECT * FROM ROWS FROM (jsonb_to_recordset(CAST(%(batch)s AS jsonb)) AS (
                       name text, queue text, service_class text, class_priority int, priority int, max_retries int,
                       spec jsonb, requests jsonb, largest_pod jsonb, placement jsonb, labels jsonb, submitted_by text))
                   WITH ORDINALITY AS r(name, queue, service_class, class_priority, priority, max_retries, spec,
                                        requests, largest_pod, placement, labels, submitted_by, n)
                   WHERE """ + guard + """
                   ORDER BY n) u),
           made AS (
               INSERT INTO jobs (id, name, queue, service_class, class_priority, priority, max_retries, spec,
                                 requests, largest_pod, placement, labels, submitted_by, state, reason)
               SELECT id, name, queue, service_class, class_priority, priority, max_retries, spec, requests,
                      largest_pod, placement, labels, submitted_by, 'QUEUED', %(reason)s FROM new),
           events AS (
               INSERT INTO job_events (job_id, attempt, from_state, to_state, reason)
               SELECT id, 0, '', 'QUEUED', %(reason)s FROM new),
           -- Delivered on commit. The wake-up names each queue that got jobs, with its best new job's
           -- place in the queue's order (submit_wake): the scheduler plans that queue again even while
           -- the others stay parked, unless that job comes after the heads parked (scheduling.Parking).
           notified AS (SELECT count(pg_notify(%(wake)s, concat_ws(' ', q.queue, q.class_priority, q.priority, q.id)))
                               + count(pg_notify(%(events)s, ''))
                        FROM (SELECT DISTINCT ON (queue) queue, class_priority, priority, id FROM new
                              ORDER BY queue, class_priority DESC, priority DESC, id) q)
           SELECT id FROM new, notified ORDER BY n""")


def _copy(session: Session, jobs: list[NewJob]) -> list[int]:
    """One statement draws the ids and queues the notifications; the ids, ascending, go to the jobs in
    order. Then binary COPY writes the jobs and their events: Postgres parses each value once, with no
    batch document to take apart and no sort or CTE to spill past work_mem (measured alone at 8,000 jobs
    a write: about 60 -> 41-46 us of the backend's CPU per job; and each job's small documents are
    encoded once per shape)."""
    best: dict[str, NewJob] = {}
    for j in jobs:
        b = best.get(j.queue)
        if b is None or (j.class_priority, j.priority) > (b.class_priority, b.priority):
            best[j.queue] = j
    # The ids are drawn with the notifications: each wake-up gives 0 for its job's id, as if it came first
    # among the jobs of its class priority and priority (never passed over when it might not be behind).
    notes = [(WAKE_CHANNEL, submit_wake(q, j.class_priority, j.priority, 0)) for q, j in sorted(best.items())]
    notes.append((EVENTS_CHANNEL, ""))
    conn = driver(session)
    ids = sorted(r[0] for r in conn.execute(
        f"""WITH notified AS (SELECT count(*) FROM ({_NOTIFY}) n)
            SELECT nextval(pg_get_serial_sequence('jobs', 'id')) FROM generate_series(1, %(n)s), notified""",
        {"n": len(jobs), **_notes(notes)}))
    with conn.cursor() as cursor:
        with cursor.copy(f"COPY jobs ({', '.join(_COPY_JOB_COLUMNS)}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.write(_copy_jobs(ids, jobs))
        with cursor.copy(f"COPY job_events ({', '.join(_COPY_EVENT_COLUMNS)}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.write(_copy_events(ids))
    return ids


# COPY's binary format: a header, then per row a field count and each field as its length and bytes
# (-1: NULL), then a trailer. jsonb is a version byte (1) and the JSON text; ints are big-endian.
COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
COPY_TRAILER = b"\xff\xff"
_COPY_JOB_COLUMNS = ("id", "name", "queue", "service_class", "class_priority", "priority", "max_retries", "spec",
                     "requests", "largest_pod", "placement", "labels", "submitted_by", "state", "reason")
_COPY_EVENT_COLUMNS = ("job_id", "attempt", "from_state", "to_state", "reason")
_NULL = b"\xff\xff\xff\xff"
_row_and_id = struct.Struct(">hiq").pack  # field count, then an int8 field
_int4 = struct.Struct(">ii").pack
_length = struct.Struct(">i").pack
# What orjson does not write (see _dumps).
_json = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


def _copy_jobs(ids: list[int], jobs: list[NewJob]) -> bytes:
    """The jobs' rows (_COPY_JOB_COLUMNS) in binary COPY format."""
    texts: dict[str | None, bytes] = {None: _NULL}
    values: dict[int, bytes] = {}  # by id(): the small documents jobs of one batch share (submitting interns them)

    def text_field(value: str | None) -> bytes:
        field = texts.get(value)
        if field is None:
            data = value.encode()
            field = texts[value] = _length(len(data)) + data
        return field

    def jsonb_field(value) -> bytes:
        field = values.get(id(value))
        if field is None:
            data = _dumps(value)
            field = values[id(value)] = _length(len(data) + 1) + b"\x01" + data
        return field

    tail = text_field("QUEUED") + text_field(SUBMITTED)
    out = [COPY_HEADER]
    for job_id, j in zip(ids, jobs):
        spec = _dumps(j.spec)
        out.append(b"".join((
            _row_and_id(len(_COPY_JOB_COLUMNS), 8, job_id), text_field(j.name), text_field(j.queue),
            text_field(j.service_class), _int4(4, j.class_priority), _int4(4, j.priority), _int4(4, j.max_retries),
            _length(len(spec) + 1), b"\x01", spec, jsonb_field(j.requests), jsonb_field(j.largest_pod),
            jsonb_field(j.placement), jsonb_field(j.labels), text_field(j.submitted_by), tail)))
    out.append(COPY_TRAILER)
    return b"".join(out)


def _copy_events(ids: list[int]) -> bytes:
    """Each job's `submitted` event (_COPY_EVENT_COLUMNS): attempt 0, from '' to QUEUED."""
    rest = _int4(4, 0) + _length(0) + _length(6) + b"QUEUED" + _length(len(SUBMITTED)) + SUBMITTED.encode()
    count = len(_COPY_EVENT_COLUMNS)
    return b"".join((COPY_HEADER, *[_row_and_id(count, 8, job_id) + rest for job_id in ids], COPY_TRAILER))


def get(session: Session, job_id: int, *, for_update: bool = False) -> Job:
    stmt = select(Job).where(Job.id == job_id)
    if for_update:
        stmt = stmt.with_for_update()
    job = session.scalars(stmt).first()
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


def list_jobs(session: Session, *, queue: str | None = None, state: str | None = None,
              after_id: int = 0, limit: int = 100) -> list[Job]:
    """Jobs in id order, after a cursor: keyset paging stays fast however deep the listing goes.

    The job documents and resource maps stay unloaded: listings never show them.
    """
    stmt = (select(Job).options(defer(Job.spec), defer(Job.requests), defer(Job.largest_pod), defer(Job.placement))
            .where(Job.id > after_id).order_by(Job.id).limit(limit))
    if queue:
        stmt = stmt.where(Job.queue == queue)
    if state:
        stmt = stmt.where(Job.state == state)
    return list(session.scalars(stmt))


def events(session: Session, *, job_id: int = 0, after_id: int = 0, limit: int = 1000,
           also: list[int] = ()) -> list:
    """Events after `after_id` in id order, and those of the ids in `also` (gaps below it) that exist now.
    Rows with JobEvent's fields (id, job_id, attempt, from_state, to_state, reason, cluster, at)."""
    where = ["id > %(after)s"]
    if also:  # the range bound lets the primary key's index start at the oldest gap (gaps are recent),
        # whatever the planner makes of the OR (on a table not yet analyzed it read the whole table)
        where = ["id >= %(oldest)s AND (id > %(after)s OR id = ANY(%(also)s))"]
    if job_id:
        where.append("job_id = %(job)s")
    return named(session, f"SELECT {_EVENT_COLUMNS} FROM job_events WHERE {' AND '.join(where)} "
                          "ORDER BY id LIMIT %(limit)s",
                 {"after": after_id, "oldest": min(also, default=0), "also": list(also), "job": job_id, "limit": limit})


_EVENT_COLUMNS = "id, job_id, attempt, from_state, to_state, reason, cluster, at"


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


def transition(session: Session, job: Job, to: str, reason: str, **values) -> None:
    """Move one job from its current state to `to`, compare-and-set, with its event.

    Raises Conflict when the job changed underneath (zero rows updated is never a silent success).
    """
    states.check(job.state, to)
    stmt = (update(Job).where(Job.id == job.id, Job.state == job.state, Job.attempt == job.attempt)
            .values(state=to, reason=reason, **values).returning(Job.id)
            .execution_options(synchronize_session=False))
    if session.execute(stmt).first() is None:
        raise Conflict(f"job {job.id} is no longer {job.state}")
    session.add(JobEvent(job_id=job.id, attempt=job.attempt, from_state=job.state, to_state=to,
                         reason=reason, cluster=job.cluster))
    session.flush()
    session.expire(job)
    notify(session, EVENTS_CHANNEL)


def lock_for_reports(session: Session, ids: list[int]) -> list[tuple]:
    """(id, state, attempt, cluster, max_retries) of these jobs, locked (in id order) until the transaction ends."""
    return driver(session).execute(
        "SELECT id, state, attempt, cluster, max_retries FROM jobs WHERE id = ANY(%(ids)s) ORDER BY id FOR UPDATE",
        {"ids": ids}).fetchall()


def apply_transitions(session: Session, changed: dict[int, dict], events: list[tuple],
                      attempts: dict[tuple[int, int], list], *,
                      wake: str | None = None) -> list[float]:
    """Write state changes already checked against the jobs' rows, which the caller holds locked, all in
    one statement (one round trip).

    changed: per job, its final {state, reason} and whether it started (started_at), finished
    (finished_at) or went back to the queue (no cluster). events: (job, attempt, from, to, reason,
    cluster) of every transition, in order: each becomes a job event. attempts: per (job, attempt),
    (started, end state, reason, exit code): started marks it RUNNING from now; an end state ("" for
    none) ends it, unless it already ended. wake: the scheduler is woken too, with this payload.
    Returns the seconds from each started attempt's dispatch to now.
    """
    ids = list(changed)
    keys = list(attempts)
    notes = [(EVENTS_CHANNEL, ""), *([(WAKE_CHANNEL, wake)] if wake is not None else [])]
    params = {"ids": ids, **{key: [changed[i][field] for i in ids] for key, field in (
        ("states", "state"), ("reasons", "reason"), ("started", "started"), ("finished", "finished"),
        ("requeued", "requeued"))},
        **dict(zip(("e_jobs", "e_attempts", "e_froms", "e_tos", "e_reasons", "e_clusters"), map(list, zip(*events)))),
        "a_jobs": [k[0] for k in keys], "a_attempts": [k[1] for k in keys],
        **dict(zip(("a_started", "a_states", "a_reasons", "a_codes"),
                   map(list, zip(*attempts.values())) if attempts else ([], [], [], []))),
        **_notes(notes)}
    row = driver(session).execute(_TRANSITIONS, params).fetchone()
    return [float(w) for w in row[0]]


# Start (a.started: RUNNING from now) and end (a.state, unless "": that state, unless it ended already)
# the attempts of the arrays %(a_jobs)s, %(a_attempts)s, ...; each SET sees the row as it was, so an
# attempt that had ended stays as it ended.
_MARK_ATTEMPTS = """
        UPDATE attempts SET
               started_at = CASE WHEN a.started THEN now() ELSE attempts.started_at END,
               state = CASE WHEN a.state <> '' AND attempts.finished_at IS NULL THEN a.state
                            WHEN a.started THEN 'RUNNING' ELSE attempts.state END,
               reason = CASE WHEN a.state <> '' AND attempts.finished_at IS NULL THEN a.reason ELSE attempts.reason END,
               exit_code = CASE WHEN a.state <> '' AND attempts.finished_at IS NULL THEN a.exit_code
                                ELSE attempts.exit_code END,
               finished_at = CASE WHEN a.state <> '' AND attempts.finished_at IS NULL THEN now()
                                  ELSE attempts.finished_at END
        FROM unnest(%(a_jobs)s::bigint[], %(a_attempts)s::int[], %(a_started)s::boolean[], %(a_states)s::text[],
                    %(a_reasons)s::text[], %(a_codes)s::int[]) AS a(job_id, attempt, started, state, reason, exit_code)
        WHERE attempts.job_id = a.job_id AND attempts.attempt = a.attempt
        RETURNING a.started, extract(epoch FROM now() - attempts.dispatched_at) AS waited"""


_TRANSITIONS = f"""
    WITH c AS (
        SELECT * FROM unnest(%(ids)s::bigint[], %(states)s::text[], %(reasons)s::text[], %(started)s::boolean[],
                             %(finished)s::boolean[], %(requeued)s::boolean[])
                      AS c(id, state, reason, started, finished, requeued)),
    moved AS (
        UPDATE jobs SET state = c.state, reason = c.reason,
               started_at = CASE WHEN c.started THEN now() ELSE jobs.started_at END,
               finished_at = CASE WHEN c.finished THEN now() ELSE jobs.finished_at END,
               cluster = CASE WHEN c.requeued THEN NULL ELSE jobs.cluster END
        FROM c WHERE jobs.id = c.id),
    made AS (
        INSERT INTO job_events (job_id, attempt, from_state, to_state, reason, cluster)
        SELECT job_id, attempt, from_state, to_state, reason, cluster
        FROM unnest(%(e_jobs)s::bigint[], %(e_attempts)s::int[], %(e_froms)s::text[], %(e_tos)s::text[],
                    %(e_reasons)s::text[], %(e_clusters)s::text[])
             WITH ORDINALITY AS e(job_id, attempt, from_state, to_state, reason, cluster, n)
        ORDER BY n),
    marked AS ({_MARK_ATTEMPTS})
    SELECT array(SELECT waited FROM marked WHERE started), (SELECT count(*) FROM ({_NOTIFY}) n)"""


def ended_by_report(session: Session, pairs: list[tuple[int, int]]) -> set[tuple[int, int]]:
    """Of these (job, attempt), the attempts that ended SUCCEEDED or FAILED (their cluster reported so)."""
    if not pairs:
        return set()
    jobs, attempts = map(list, zip(*pairs))
    return {(r[0], r[1]) for r in session.execute(text(
        """SELECT a.job_id, a.attempt FROM attempts a
           JOIN unnest(CAST(:jobs AS bigint[]), CAST(:attempts AS int[])) AS p(job_id, attempt)
             ON a.job_id = p.job_id AND a.attempt = p.attempt
           WHERE a.state IN ('SUCCEEDED', 'FAILED') AND a.finished_at IS NOT NULL"""),
        {"jobs": jobs, "attempts": attempts})}


def end_attempt(session: Session, job_id: int, attempt: int, state: str, reason: str,
                exit_code: int | None = None) -> None:
    """End this attempt in `state`, unless it ended already."""
    driver(session).execute(_MARK_ATTEMPTS, {"a_jobs": [job_id], "a_attempts": [attempt], "a_started": [False],
                                             "a_states": [state], "a_reasons": [reason], "a_codes": [exit_code]})


@dataclass(frozen=True)
class Dispatched:
    job_id: int
    attempt: int
    cluster: str
    command_id: int
    created_at: datetime | None = None  # when the job was submitted
    dispatched_at: datetime | None = None  # this dispatch (the transaction's time)


def dispatch(session: Session, decisions: list[tuple[int, str]], bursts: dict[int, dict] | None = None,
             reasons: dict[int, str] | None = None, commit: bool = False) -> list[Dispatched]:
    """Move queued jobs to DISPATCHED on their chosen clusters, all in the caller's transaction.

    One UPDATE for the batch, compare-and-set on QUEUED (a job cancelled meanwhile is skipped), then
    the attempts, events and outbox commands of exactly the jobs that moved. bursts: per job sent to a
    paid cluster, its burst decision (kept with the attempt; its summary is the event's reason).
    reasons: first, set_reasons of other jobs. commit: then COMMIT, in the same round trip (the caller's
    session then has nothing left to commit; nothing may follow in its transaction).
    """
    if not decisions and not commit:
        set_reasons(session, reasons or {})
        return []
    from dispatcher.store.outbox import lock_clusters  # outbox.py builds on this module
    conn = driver(session)
    cursor = None
    with conn.pipeline():  # the statements (and the commit) in one round trip, run in this order
        set_reasons(session, reasons or {})
        if decisions:
            lock_clusters(session, [cluster for _, cluster in decisions])
            cursor = _send_dispatch(conn, decisions, bursts or {})
        if commit:
            conn.execute("COMMIT")
    return [Dispatched(*r) for r in cursor.fetchall()] if cursor is not None else []


def _send_dispatch(conn, decisions: list[tuple[int, str]], bursts: dict[int, dict]):
    """dispatch's statement, sent on psycopg connection `conn`; its cursor (rows: Dispatched's fields)."""
    return conn.execute(
        """WITH d AS (SELECT * FROM unnest(CAST(%(ids)s AS bigint[]), CAST(%(clusters)s AS text[])) AS d(id, cluster)),
           b AS (SELECT * FROM unnest(CAST(%(burst_ids)s AS bigint[]), CAST(%(burst_docs)s AS jsonb[])) AS b(id, doc)),
           moved AS (
               UPDATE jobs SET state = 'DISPATCHED', reason = 'dispatched to ' || d.cluster,
                      cluster = d.cluster, attempt = jobs.attempt + 1, dispatched_at = now(),
                      started_at = NULL, finished_at = NULL
               FROM d WHERE jobs.id = d.id AND jobs.state = 'QUEUED'
               RETURNING jobs.id, jobs.attempt, jobs.cluster, jobs.created_at, jobs.dispatched_at),
           attempts_made AS (
               INSERT INTO attempts (job_id, attempt, cluster, state, burst)
               SELECT m.id, m.attempt, m.cluster, 'DISPATCHED', b.doc FROM moved m LEFT JOIN b ON b.id = m.id),
           events_made AS (
               INSERT INTO job_events (job_id, attempt, from_state, to_state, reason, cluster)
               SELECT m.id, m.attempt, 'QUEUED', 'DISPATCHED',
                      'dispatched to ' || m.cluster || coalesce(': ' || (b.doc ->> 'summary'), ''), m.cluster
               FROM moved m LEFT JOIN b ON b.id = m.id),
           commands AS (
               INSERT INTO outbox (cluster, kind, job_id, attempt, payload)
               SELECT m.cluster, 'dispatch', m.id, m.attempt, '{}'::jsonb
               FROM moved m ORDER BY m.id
               RETURNING id, job_id),
           -- each cluster's link, and the event watchers, once the jobs moved (delivered at commit)
           notified AS (
               SELECT (SELECT count(pg_notify(%(outbox)s, c)) FROM (SELECT DISTINCT cluster AS c FROM moved) c)
                      + (SELECT count(pg_notify(%(events)s, '')) FROM (SELECT FROM moved LIMIT 1) e) AS n)
           SELECT m.id, m.attempt, m.cluster, c.id AS command_id, m.created_at, m.dispatched_at
           FROM moved m JOIN commands c ON c.job_id = m.id CROSS JOIN notified ORDER BY m.id""",
        {"ids": [d[0] for d in decisions], "clusters": [d[1] for d in decisions],
         "burst_ids": [i for i, _ in decisions if i in bursts],
         "burst_docs": [json.dumps(bursts[i]) for i, _ in decisions if i in bursts],
         "outbox": OUTBOX_CHANNEL, "events": EVENTS_CHANNEL})


class DispatchAhead:
    """A cycle's dispatches sent while it is still planning, in parts of AHEAD jobs, so that Postgres
    writes one part on one core while Python plans the next on the other (a deep backlog's cycle places
    tens of thousands of jobs; planning and writing them one after the other left each core idle half
    the time). What is sent is `dispatch`'s statement, in the same transaction, before anything else
    the cycle writes; `end` collects what moved and leaves the rest of the plan to `dispatch`.

    The first part takes the outbox locks of every cluster the cycle may place on (in name order, as
    `lock_clusters` always does: locks taken part by part would not be). `undo` takes back every part
    sent (a savepoint before the first), for a plan that is thrown away and made again.

    A part's rows come back while the next is planned (psycopg's pipeline mode reads them at each
    send); AHEAD keeps a part's rows within what the socket holds, so Postgres never waits on them.
    """

    AHEAD = 2_000

    def __init__(self, session: Session, clusters: list[str]):
        self._session, self._clusters = session, clusters
        self._pipeline = None
        self._cursors: list = []
        self.sent = 0  # how many of the plan's places were sent

    def placed(self, places: list, bursts: dict) -> None:
        """The plan so far (its places, each with .job_id and .cluster; bursts by job id, with .record()):
        sends the places not yet sent, once there are AHEAD of them."""
        if len(places) - self.sent < self.AHEAD:
            return
        conn = driver(self._session)
        if self._pipeline is None:  # the first part (of this plan's making)
            from dispatcher.store.outbox import lock_clusters  # outbox.py builds on this module
            self._pipeline = conn.pipeline()
            self._pipeline.__enter__()
            conn.execute("SAVEPOINT dispatch_ahead")
            lock_clusters(self._session, self._clusters)
        part = [(p.job_id, p.cluster) for p in places[self.sent:]]
        self._cursors.append(_send_dispatch(conn, part, {i: bursts[i].record() for i, _ in part if i in bursts}))
        self.sent = len(places)

    def end(self) -> list[Dispatched]:
        """Waits for every part sent; what they moved."""
        if self._pipeline is not None:
            pipeline, self._pipeline = self._pipeline, None
            pipeline.__exit__(None, None, None)
        return [Dispatched(*r) for cursor in self._cursors for r in cursor.fetchall()]

    def undo(self) -> None:
        """Take back every part sent."""
        self.end()
        if self._cursors:
            driver(self._session).execute("ROLLBACK TO SAVEPOINT dispatch_ahead")
        self._cursors, self.sent = [], 0

    def close(self) -> None:
        """Leave pipeline mode, on the way out of a failed cycle (its transaction is rolled back)."""
        if self._pipeline is not None:
            pipeline, self._pipeline = self._pipeline, None
            try:
                pipeline.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - the cycle's own error is the one that counts
                pass


def set_reasons(session: Session, reasons: dict[int, str]) -> None:
    """Update the pending reason of queued jobs whose reason changed (one statement)."""
    if not reasons:
        return
    driver(session).execute(
        """UPDATE jobs SET reason = r.reason
           FROM unnest(%(ids)s::bigint[], %(reasons)s::text[]) AS r(id, reason)
           WHERE jobs.id = r.id AND jobs.state = 'QUEUED' AND jobs.reason IS DISTINCT FROM r.reason""",
        {"ids": list(reasons), "reasons": list(reasons.values())})


def queue_heads(session: Session, per_queue: int, queues: list[str] | None = None) -> list[tuple]:
    """The first `per_queue` queued jobs of every queue (or of these `queues`), in queue order (one index
    range per queue): (id, queue, service_class, class_priority, priority, requests, largest_pod, placement,
    reason, created (epoch seconds), preempted_by, attempt, max_runtime). requests, largest_pod and
    placement come as JSON text: a cycle's heads repeat a few shapes, which the caller decodes once each."""
    if queues is not None and not queues:
        return []
    return driver(session).execute(*heads_query(per_queue, queues)).fetchall()


_MAX_RUNTIME = "spec -> 'spec' ->> 'maxRuntime'"  # a job document's maxRuntime, as given


def heads_query(per_queue: int, queues: list[str] | None = None) -> tuple[str, dict]:
    """queue_heads' statement and parameters, to send with other reads (database.at_once)."""
    return (f"""SELECT h.* FROM queues q CROSS JOIN LATERAL (
                   SELECT id, queue, service_class, class_priority, priority, requests::text, largest_pod::text,
                          placement::text, reason, extract(epoch FROM created_at)::float8 AS created, preempted_by,
                          attempt, {_MAX_RUNTIME} AS max_runtime
                   FROM jobs WHERE jobs.queue = q.name AND state = 'QUEUED'
                   ORDER BY class_priority DESC, priority DESC, id LIMIT %(n)s) h
                {"" if queues is None else "WHERE q.name = ANY(%(queues)s)"}""",
            {"n": per_queue, "queues": queues})


# What active_attempts reads of each dispatched or running job (the columns of an Active, and its maxRuntime).
_ACTIVE_ATTEMPTS = f"""SELECT id, attempt, queue, service_class, class_priority, priority, cluster, requests,
                             coalesce(started_at, dispatched_at) AS since, {_MAX_RUNTIME} AS max_runtime
                        FROM jobs WHERE state IN ('DISPATCHED', 'RUNNING')"""


def active_attempts(session: Session, *, clusters=None, timed: bool = False, preemptible=(),
                    below: int | None = None, queues=()) -> list:
    """Dispatched or running jobs: what each holds, where, and as which attempt (preemption candidates,
    expected ends, and the attempts a capacity reading may not show yet), as named tuples. Every one
    without filters; with `clusters`, only those on these clusters, and then, if any of the others is
    given, only those that are `timed` (have a maxRuntime), or of a `preemptible` class with a class
    priority `below`, or of one of `queues`. Plain SQL: a cycle asks for them once or twice."""
    where = []
    if clusters is not None:
        if not clusters:
            return []
        where.append("cluster = ANY(%(clusters)s)")
    which = []
    if timed:
        which.append(f"{_MAX_RUNTIME} IS NOT NULL")
    if preemptible and below is not None:
        which.append("(service_class = ANY(%(preemptible)s) AND class_priority < %(below)s)")
    if queues:
        which.append("queue = ANY(%(queues)s)")
    if which:
        where.append(f"({' OR '.join(which)})")
    elif preemptible or queues:  # asked for some, and none can match
        return []
    return named(session, " AND ".join([_ACTIVE_ATTEMPTS, *where]),
                 {"clusters": list(clusters or ()), "preemptible": list(preemptible), "below": below,
                  "queues": list(queues)})


def recently_unschedulable(session: Session, job_ids: list[int], within_s: float) -> dict[int, tuple[str, ...]]:
    """Per job, the clusters where one of its attempts could not start (UNSCHEDULABLE) in the last `within_s`."""
    if not job_ids:
        return {}
    rows = driver(session).execute(
        """SELECT job_id, array_agg(DISTINCT cluster) FROM attempts
           WHERE job_id = ANY(%(ids)s) AND state = 'UNSCHEDULABLE'
             AND finished_at > now() - make_interval(secs => %(s)s)
           GROUP BY job_id""", {"ids": job_ids, "s": within_s}).fetchall()
    return {r[0]: tuple(sorted(r[1])) for r in rows}


def existing_ids(session: Session, job_ids: list[int]) -> set[int]:
    """Which of these job ids exist."""
    if not job_ids:
        return set()
    return set(session.scalars(select(Job.id).where(Job.id.in_(job_ids))))


def job_bursts(session: Session, job_id: int) -> list[tuple[int, dict]]:
    """(attempt, burst decision) of the job's attempts that burst, oldest first."""
    return [(r.attempt, r.burst) for r in session.execute(
        select(Attempt.attempt, Attempt.burst).where(Attempt.job_id == job_id, Attempt.burst.is_not(None))
        .order_by(Attempt.attempt))]


def burst_attempts(session: Session, since: datetime | None) -> list[Row]:
    """Attempts sent to paid clusters by a burst decision that are still running or finished since `since`
    (None: every one)."""
    stmt = select(Attempt.burst, Attempt.state, Attempt.dispatched_at, Attempt.started_at, Attempt.finished_at
                  ).where(Attempt.burst.is_not(None))
    if since is not None:
        stmt = stmt.where(Attempt.finished_at.is_(None) | (Attempt.finished_at >= since))
    return session.execute(stmt).all()


def active_on_cluster(session: Session, cluster: str) -> list[Job]:
    return list(session.scalars(select(Job).where(Job.cluster == cluster, Job.state.in_(states.ACTIVE))))


def in_flight_sums(rows) -> dict[str, dict[str, int]]:
    """Per cluster, the requests summed of the active attempts whose dispatch command came after its latest
    capacity report, from the rows of IN_FLIGHT (snapshot.readings reads them with the cluster rows).

    Those are not yet in the report, so the scheduler subtracts them; every other active attempt is
    already in it. Each attempt is therefore counted exactly once. Every cycle reads them: per cluster,
    one range of ix_outbox_cluster_id above its watermark, then each job by its key (OFFSET 0 keeps the
    planner from a scan of the whole outbox), so it costs what is in flight; the sums are made in Postgres
    (a cluster's free capacity only ever loses their total).
    """
    out: dict[str, dict[str, int]] = {}
    for cluster, resource, amount in rows:
        out.setdefault(cluster, {})[resource] = int(amount)
    return out


IN_FLIGHT = """SELECT c.name, r.key, sum(r.value::bigint)::bigint FROM clusters c
               CROSS JOIN LATERAL (SELECT job_id, attempt FROM outbox
                                   WHERE outbox.cluster = c.name AND outbox.id > c.applied_through
                                     AND outbox.kind = 'dispatch' OFFSET 0) o
               CROSS JOIN LATERAL (SELECT requests FROM jobs
                                   WHERE jobs.id = o.job_id AND jobs.attempt = o.attempt AND jobs.cluster = c.name
                                     AND jobs.state IN ('DISPATCHED', 'RUNNING') OFFSET 0) j
               CROSS JOIN LATERAL jsonb_each_text(j.requests) r
               GROUP BY c.name, r.key"""


# -- totals for /metrics (dispatcher/metrics.py): one GROUP BY each, read at scrape time --------------

def queued_per_class(session: Session) -> list[Row]:
    """(queue, service_class, jobs) of queued jobs."""
    return session.execute(select(Job.queue, Job.service_class, func.count().label("jobs"))
                           .where(Job.state == states.QUEUED).group_by(Job.queue, Job.service_class)).all()


def active_per_cluster(session: Session) -> list[Row]:
    """(queue, cluster, jobs) of dispatched and running jobs."""
    return session.execute(select(Job.queue, Job.cluster, func.count().label("jobs"))
                           .where(Job.state.in_(states.ACTIVE)).group_by(Job.queue, Job.cluster)).all()


def used_per_cluster(session: Session) -> list[Row]:
    """(queue, cluster, resource, milli) summed over the requests of dispatched and running jobs."""
    return session.execute(text(
        """SELECT j.queue, j.cluster, r.key AS resource, sum(r.value::numeric) AS milli
           FROM jobs j CROSS JOIN LATERAL jsonb_each_text(j.requests) r
           WHERE j.state IN ('DISPATCHED', 'RUNNING')
           GROUP BY j.queue, j.cluster, r.key""")).all()


# -- chargeback (dispatcher/accounting.py) ------------------------------------------------------------

def attempt_runs(session: Session, *, ended_after: datetime | None = None) -> list[Row]:
    """(cluster, started_at, finished_at, queue, service_class, submitted_by, requests) of every attempt
    that started running; with `ended_after`, only those still running or finished at or after it."""
    stmt = (select(Attempt.cluster, Attempt.started_at, Attempt.finished_at, Job.queue, Job.service_class,
                   Job.submitted_by, Job.requests)
            .join(Job, Job.id == Attempt.job_id).where(Attempt.started_at.is_not(None))
            .order_by(Attempt.job_id, Attempt.attempt))
    if ended_after is not None:
        stmt = stmt.where(Attempt.finished_at.is_(None) | (Attempt.finished_at >= ended_after))
    return session.execute(stmt).all()


# -- the scheduling cycle's reads of what runs -----------------------------------------------------------

def active_usage(session: Session) -> list[tuple[str, dict, int]]:
    """(queue, requests, jobs): dispatched and running jobs counted per queue and distinct request, so that
    the queues' usage is summed from a few rows (a handful of job shapes per queue), not one per job."""
    return named(session, ACTIVE_USAGE)


ACTIVE_USAGE = """SELECT queue, requests, count(*) AS jobs FROM jobs
                  WHERE state IN ('DISPATCHED', 'RUNNING') GROUP BY queue, requests"""
