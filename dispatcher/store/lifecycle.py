"""The life of a job in the store: the only code that writes a job's state and its job events.

Every write checks the state machine (policy/states.py, the single authority) and compare-and-sets on the
state it expects: a submit inserts jobs QUEUED with their first event; `transition` moves one job;
`apply_transitions` writes a batch of agent reports already judged against the locked rows; `dispatch`
(and `DispatchAhead`, the same statement sent while a cycle still plans) moves queued jobs to DISPATCHED
with their attempts, events and outbox commands. The caller owns the transaction: these functions may
flush, never commit (except `dispatch(commit=True)`, on the caller's word).
"""
from __future__ import annotations

import contextlib
import functools
import json
from dataclasses import dataclass
from datetime import datetime

import psycopg
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from dispatcher.errors import Conflict, Unauthenticated
from dispatcher.policy import states
from dispatcher.policy.plans import DISPATCH_PART, Dispatched
from dispatcher.policy.states import DISPATCHED, QUEUED, RUNNING
from dispatcher.store import copy_codec, submit_keys, tokens
from dispatcher.store.channels import (
    EVENTS_CHANNEL,
    NOTIFY_SQL,
    OUTBOX_CHANNEL,
    WAKE_CHANNEL,
    notes_params,
    notify,
)
from dispatcher.store.database import at_once, driver
from dispatcher.store.models import Job, JobEvent
from dispatcher.store.outbox import lock_clusters
from dispatcher.store.tokens import Principal
from dispatcher.wakes import submit_wake

SUBMITTED = "submitted"  # the reason of a job no scheduling cycle has looked at yet


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
    pods: list | None = None  # [[count, per-pod requests], ...] per pod set; None for a job of one pod
    reason: str | None = None  # its reason when not SUBMITTED (what submit found worth saying)
    # A job that waits (submit_waiting): its state (WAITING, or QUEUED), hold, and array.
    state: str = QUEUED
    hold: str | None = None
    start_after: datetime | None = None
    array_id: int | None = None  # set by submit_waiting from array_of
    array_of: int | None = None  # the place, in its submit, of its array's element 0
    array_index: int | None = None


@dataclass(frozen=True, slots=True)
class NewDependency:
    """Job `job` (its place in the submit) depends on `on`: the place of a job of the same submit when
    `within`, else a job id."""

    job: int
    on: int
    within: bool
    condition: str


@dataclass(frozen=True, slots=True)
class NewArray:
    first: int  # the place of element 0 in the submit: its job id is the array's
    count: int
    parallelism: int | None
    first_index: int
    waiting: bool  # some elements wait for a slot


COPY_FROM = 100  # jobs in one write from which they go by binary COPY; fewer go in one statement


def submit(session: Session, jobs: list[NewJob], *, copy_from: int = COPY_FROM,
           keys: list[submit_keys.NewKey] = ()) -> list[int]:
    """Insert queued jobs with their first event, and the idempotency keys of the submits they came in;
    returns their ids, in order. Raises submit_keys.KeyUsed, having written nothing the caller may commit,
    when a key was used before.

    The ids are drawn from the jobs' identity sequence in the given order, so the jobs of one call keep
    it, and each job's `submitted` event takes its id in the same order. Both ways below write the same
    rows and queue the same notifications.
    """
    if not jobs:
        return []
    if len(jobs) < copy_from:
        return _insert(session, jobs, keys)
    return _copy(session, jobs, keys)


def _insert(session: Session, jobs: list[NewJob], keys: list[submit_keys.NewKey]) -> list[int]:
    """One statement (one round trip), from one JSON array: for a few jobs, where COPY's four extra round
    trips would cost more than it saves."""
    with _keys_checked():
        return [row[0] for row in driver(session).execute(_inserting(False), _insert_params(jobs, keys))]


def submit_if_unchanged(connection: psycopg.Connection, jobs: list[NewJob], version: int,
                        keys: list[submit_keys.NewKey] = ()) -> list[int] | None:
    """Insert a few queued jobs as `submit` does, in one statement that is its own transaction on an
    autocommit psycopg `connection` (one round trip in all, no BEGIN or COMMIT), but only if the version of
    the classes, queues and clusters (submit_config, kept by triggers) is still `version` in that
    statement's snapshot. None, and nothing written or notified, if it is not."""
    with _keys_checked():
        return [row[0] for row in connection.execute(_inserting(True),
                                                     {"version": version, **_insert_params(jobs, keys)})] or None


@contextlib.contextmanager
def _keys_checked():
    """A key used before fails the insert on submit_keys' primary key: raised as submit_keys.KeyUsed."""
    try:
        yield
    except psycopg.errors.UniqueViolation as exc:
        if submit_keys.is_key_conflict(exc):
            raise submit_keys.KeyUsed("submit: idempotency key already used") from exc
        raise


def _insert_params(jobs: list[NewJob], keys: list[submit_keys.NewKey]) -> dict:
    batch = copy_codec.dumps([{"name": j.name, "queue": j.queue, "service_class": j.service_class,
                               "class_priority": j.class_priority, "priority": j.priority,
                               "max_retries": j.max_retries, "spec": j.spec, "requests": j.requests,
                               "largest_pod": j.largest_pod, "placement": j.placement, "labels": j.labels,
                               "submitted_by": j.submitted_by,
                               **({} if j.pods is None else {"pods": j.pods}),
                               **({} if j.reason is None else {"reason": j.reason})} for j in jobs]).decode()
    return {"batch": batch, "reason": SUBMITTED, "wake": WAKE_CHANNEL, "events": EVENTS_CHANNEL,
            "keys": submit_keys.params(keys)}


@functools.lru_cache(maxsize=2)
def _inserting(checked: bool) -> str:
    """The one statement of `_insert` and `submit_if_unchanged`, run on the psycopg connection (no
    SQLAlchemy statement handling on the submit path): it draws ids for the rows of %(batch)s only where
    the guard holds (evaluated once, in the statement's snapshot), so nothing at all is written otherwise."""
    guard = "(SELECT version FROM submit_config WHERE id = 1) = %(version)s" if checked else "true"
    return (
        """WITH new AS (
               SELECT nextval(pg_get_serial_sequence('jobs', 'id')) AS id, u.* FROM (
                   SELECT * FROM ROWS FROM (jsonb_to_recordset(CAST(%(batch)s AS jsonb)) AS (
                       name text, queue text, service_class text, class_priority int, priority int, max_retries int,
                       spec jsonb, requests jsonb, largest_pod jsonb, placement jsonb, labels jsonb, submitted_by text,
                       pods jsonb, reason text))
                   WITH ORDINALITY AS r(name, queue, service_class, class_priority, priority, max_retries, spec,
                                        requests, largest_pod, placement, labels, submitted_by, pods, job_reason, n)
                   WHERE """ + guard + f"""
                   ORDER BY n) u),
           made AS (
               INSERT INTO jobs (id, name, queue, service_class, class_priority, priority, max_retries, spec,
                                 requests, largest_pod, placement, labels, submitted_by, pods, state, reason)
               SELECT id, name, queue, service_class, class_priority, priority, max_retries, spec, requests,
                      largest_pod, placement, labels, submitted_by, pods, '{QUEUED}', coalesce(job_reason, %(reason)s)
               FROM new),
           events AS (
               INSERT INTO job_events (job_id, attempt, from_state, to_state, reason)
               SELECT id, 0, '', '{QUEUED}', %(reason)s FROM new),
           -- Delivered on commit. The wake-up names each queue that got jobs, with its best new job's
           -- place in the queue's order (wakes.submit_wake): the scheduler plans that queue again even
           -- while the others stay parked, unless that job comes after the heads parked (scheduler.parking).
           notified AS (SELECT count(pg_notify(%(wake)s, concat_ws(' ', q.queue, q.class_priority, q.priority, q.id)))
                               + count(pg_notify(%(events)s, ''))
                        FROM (SELECT DISTINCT ON (queue) queue, class_priority, priority, id FROM new
                              ORDER BY queue, class_priority DESC, priority DESC, id) q),
           keyed AS (""" + submit_keys.FROM_NEW + """)
           SELECT id FROM new, notified ORDER BY n""")


def _copy(session: Session, jobs: list[NewJob], keys: list[submit_keys.NewKey]) -> list[int]:
    """One statement draws the ids and queues the notifications; the ids, ascending, go to the jobs in
    order. Then binary COPY writes the jobs and their events: Postgres parses each value once, with no
    batch document to take apart and no sort or CTE to spill past work_mem."""
    conn = driver(session)
    ids = _draw_ids(conn, len(jobs), jobs)
    with conn.cursor() as cursor:
        with cursor.copy(f"COPY jobs ({', '.join(copy_codec.JOB_COLUMNS)}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.write(copy_codec.encode_jobs(ids, jobs, QUEUED, SUBMITTED))
        with cursor.copy(f"COPY job_events ({', '.join(copy_codec.EVENT_COLUMNS)}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.write(copy_codec.encode_events(ids, QUEUED, SUBMITTED))
    with _keys_checked():
        submit_keys.record(conn, keys, ids)
    return ids


def draw_ids(session: Session, jobs: list[NewJob]) -> list[int]:
    """The ids of a submit's jobs, drawn before submit_waiting writes them (their reasons name them)."""
    return _draw_ids(driver(session), len(jobs), [j for j in jobs if j.state == QUEUED])


def submit_waiting(session: Session, ids: list[int], jobs: list[NewJob], dependencies: list[NewDependency],
                   arrays: list[NewArray], keys: list[submit_keys.NewKey] = ()) -> list[int]:
    """Insert the jobs of a submit that has waiting jobs or arrays, by the ids draw_ids gave them, each in
    its own state (WAITING with its hold, or QUEUED), with its first event, the dependencies and arrays among
    them and the submit's idempotency keys; their ids, in order. By COPY, whatever the size: an array's
    elements share a document."""
    conn = driver(session)
    for j in jobs:
        if j.array_of is not None:
            j.array_id = ids[j.array_of]
    with conn.cursor() as cursor:
        columns = ", ".join(copy_codec.JOB_COLUMNS + copy_codec.HOLD_COLUMNS)
        with cursor.copy(f"COPY jobs ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.write(copy_codec.encode_held_jobs(ids, jobs, SUBMITTED))
        with cursor.copy(f"COPY job_events ({', '.join(copy_codec.EVENT_COLUMNS)}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.write(copy_codec.encode_first_events(ids, jobs, SUBMITTED))
    if dependencies:
        conn.execute("""INSERT INTO job_dependencies (job_id, depends_on, condition)
                        SELECT * FROM unnest(%(jobs)s::bigint[], %(on)s::bigint[], %(conditions)s::text[])""",
                     {"jobs": [ids[d.job] for d in dependencies],
                      "on": [ids[d.on] if d.within else d.on for d in dependencies],
                      "conditions": [d.condition for d in dependencies]})
    if arrays:
        conn.execute("""INSERT INTO job_arrays (id, count, parallelism, first_index, waiting)
                        SELECT * FROM unnest(%(ids)s::bigint[], %(counts)s::int[], %(parallelism)s::int[],
                                             %(firsts)s::int[], %(waiting)s::bool[])""",
                     {"ids": [ids[a.first] for a in arrays], "counts": [a.count for a in arrays],
                      "parallelism": [a.parallelism for a in arrays], "firsts": [a.first_index for a in arrays],
                      "waiting": [a.waiting for a in arrays]})
    with _keys_checked():
        submit_keys.record(conn, keys, ids)
    return ids


def _draw_ids(conn, count: int, queued: list[NewJob]) -> list[int]:
    """`count` new job ids, ascending, drawn in the statement that queues the submit's notifications: a
    wake-up for each queue that gets queued jobs (its best job's place in its order, with id 0, as if it
    came first among its class priority and priority) and the event feed's."""
    best: dict[str, NewJob] = {}
    for j in queued:
        b = best.get(j.queue)
        if b is None or (j.class_priority, j.priority) > (b.class_priority, b.priority):
            best[j.queue] = j
    notes = [(WAKE_CHANNEL, submit_wake(q, j.class_priority, j.priority, 0)) for q, j in sorted(best.items())]
    notes.append((EVENTS_CHANNEL, ""))
    return sorted(r[0] for r in conn.execute(
        f"""WITH notified AS (SELECT count(*) FROM ({NOTIFY_SQL}) n)
            SELECT nextval(pg_get_serial_sequence('jobs', 'id')) FROM generate_series(1, %(n)s), notified""",
        {"n": count, **notes_params(notes)}))


def release(session: Session, ids: list[int], reason: str = SUBMITTED) -> list[int]:
    """Queue these WAITING jobs (compare-and-set: one that left WAITING meanwhile is skipped), each with its
    event, and wake the scheduler for their queues; the ids queued."""
    if not ids:
        return []
    rows = driver(session).execute(
        f"""WITH moved AS (
                UPDATE jobs SET state = '{QUEUED}', hold = NULL, reason = %(reason)s
                WHERE id = ANY(%(ids)s) AND state = '{states.WAITING}' RETURNING id, queue),
            events AS (
                INSERT INTO job_events (job_id, attempt, from_state, to_state, reason)
                SELECT id, 0, '{states.WAITING}', '{QUEUED}', %(reason)s FROM moved)
            SELECT id, queue FROM moved""", {"ids": sorted(ids), "reason": reason}).fetchall()
    for queue in sorted({queue for _, queue in rows}):
        notify(session, WAKE_CHANNEL, queue)
    if rows:
        notify(session, EVENTS_CHANNEL)
    return [job_id for job_id, _ in rows]


def fail_waiting(session: Session, reasons: dict[int, str]) -> list[int]:
    """End these WAITING jobs FAILED, each with its reason and event (compare-and-set, as release); the ids
    failed."""
    if not reasons:
        return []
    ids = sorted(reasons)
    rows = driver(session).execute(
        f"""WITH r AS (SELECT * FROM unnest(%(ids)s::bigint[], %(reasons)s::text[]) AS r(id, reason)),
            moved AS (
                UPDATE jobs SET state = '{states.FAILED}', hold = NULL, reason = r.reason, finished_at = now()
                FROM r WHERE jobs.id = r.id AND jobs.state = '{states.WAITING}' RETURNING jobs.id, r.reason),
            events AS (
                INSERT INTO job_events (job_id, attempt, from_state, to_state, reason)
                SELECT id, 0, '{states.WAITING}', '{states.FAILED}', reason FROM moved)
            SELECT id FROM moved""", {"ids": ids, "reasons": [reasons[i] for i in ids]}).fetchall()
    if rows:
        notify(session, EVENTS_CHANNEL)
    return [row[0] for row in rows]


def transition(session: Session, job: Job, to: str, reason: str, **values) -> None:
    """Move one job from its current state to `to`, compare-and-set, with its event.

    Raises Conflict when the job changed underneath (zero rows updated is never a silent success). A move
    to a final state sets finished_at to the transaction's time.
    """
    states.check(job.state, to)
    if to in states.FINAL:
        values.setdefault("finished_at", func.now())
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


def refuse_queued(session: Session, ids: list[int], reason: str) -> list[int]:
    """Cancel those of these jobs still QUEUED (locked, in id order), each with its event and a wake-up of
    its queue; the ids cancelled."""
    jobs = list(session.scalars(select(Job).where(Job.id.in_(ids), Job.state == QUEUED).order_by(Job.id)
                                .with_for_update()))
    for job in jobs:
        queue = job.queue
        transition(session, job, states.CANCELLED, reason)
        notify(session, WAKE_CHANNEL, queue)
    return [job.id for job in jobs]


def lock_for_reports(session: Session, ids: list[int], *, held_by: Principal | None = None) -> list[tuple]:
    """(id, state, attempt, cluster, max_retries) of these jobs, locked (in id order) until the transaction ends.
    held_by: the reports are applied only while this agent's token or certificate holds (tokens.held, in
    the same round trip); Unauthenticated otherwise."""
    check = tokens.held(held_by) if held_by is not None else None
    if check is None:
        return driver(session).execute(_LOCK_FOR_REPORTS, {"ids": ids}).fetchall()
    held, rows = at_once(session, check, (_LOCK_FOR_REPORTS, {"ids": ids}))
    if not held:
        raise Unauthenticated(tokens.REFUSED if held_by.token_id is not None else tokens.CERTIFICATE_REFUSED)
    return rows


_LOCK_FOR_REPORTS = ("SELECT id, state, attempt, cluster, max_retries FROM jobs WHERE id = ANY(%(ids)s) "
                     "ORDER BY id FOR UPDATE")


def apply_transitions(session: Session, changed: dict[int, dict], events: list[tuple],
                      attempts: dict[tuple[int, int], list], *,
                      wake: str | None = None) -> list[float]:
    """Write state changes already checked against the jobs' rows, which the caller holds locked, all in
    one statement (one round trip).

    changed: per job, its final {state, reason} and whether it started (started_at), finished
    (finished_at) or went back to the queue (no cluster). events: (job, attempt, from, to, reason,
    cluster) of every transition, in order: each becomes a job event. attempts: per (job, attempt),
    (started, end state, reason, exit code, started at, ended at, address, nodes): started marks it RUNNING;
    an end state ("" for none) ends it, unless it already ended. The times are the agent's (None: not
    said, taken as now), bounded: a start not before the attempt's dispatch, an end not before its
    start, neither after now. The job's started_at and finished_at, and the times of its events (a
    move to RUNNING at the start, any other at the end), are the attempt's. address: how to reach its
    first pod, and nodes: what its pods hold on each node (JSON text), each written unless None (or the
    attempt ended); an attempt may come with them alone (a running one's, said again), which changes
    nothing else and makes no event. wake: the scheduler
    is woken too, with this payload. Returns the seconds from each started attempt's dispatch to now.
    Raises IllegalTransition, writing nothing, when an event's move is not in the state table.
    """
    for _job, _attempt, from_state, to_state, *_rest in events:
        states.check(from_state, to_state)
    ids = list(changed)
    keys = list(attempts)
    # Only starts carry an address or nodes: only then does the statement take those columns.
    addressed = any(a[6] is not None or a[7] is not None for a in attempts.values())
    notes = [*([(EVENTS_CHANNEL, "")] if events else []), *([(WAKE_CHANNEL, wake)] if wake is not None else [])]
    params = {"ids": ids, **{key: [changed[i][field] for i in ids] for key, field in (
        ("states", "state"), ("reasons", "reason"), ("started", "started"), ("finished", "finished"),
        ("requeued", "requeued"))},
        **dict(zip(_EVENT_COLUMNS, map(list, zip(*events)) if events else ([],) * len(_EVENT_COLUMNS))),
        "a_jobs": [k[0] for k in keys], "a_attempts": [k[1] for k in keys],
        **dict(zip(_ATTEMPT_COLUMNS if addressed else _ATTEMPT_COLUMNS[:-2],
                   map(list, zip(*attempts.values())) if attempts else ([],) * len(_ATTEMPT_COLUMNS))),
        **notes_params(notes)}
    row = driver(session).execute(_TRANSITIONS_ADDRESSED if addressed else _TRANSITIONS, params).fetchone()
    return [float(w) for w in row[0]]


_EVENT_COLUMNS = ("e_jobs", "e_attempts", "e_froms", "e_tos", "e_reasons", "e_clusters")
_ATTEMPT_COLUMNS = ("a_started", "a_states", "a_reasons", "a_codes", "a_started_at", "a_ended_at", "a_addresses",
                    "a_nodes")


# Start (a.started: RUNNING) and end (a.state, unless "": that state, unless it ended already) the
# attempts of the arrays %(a_jobs)s, %(a_attempts)s, ...; each SET sees the row as it was, so an attempt
# that had ended stays as it ended. The agent's times (a.started_at, a.ended_at; NULL: not said, so now)
# are bounded by the dispatch, the start and now: a cluster's clock is not the dispatcher's.
_START = "LEAST(now(), GREATEST(attempts.dispatched_at, coalesce(a.started_at, now())))"


def _mark_attempts(addressed: bool) -> str:
    """The attempts' UPDATE; addressed: with %(a_addresses)s and %(a_nodes)s too (NULL: not said), written to
    attempts that have not ended, and said alone only where they change (no row written for a repeat)."""
    address_set, address_in, address_as, address_only = "", "", "", ""
    if addressed:
        address_set = """
               address = CASE WHEN a.address IS NOT NULL AND attempts.finished_at IS NULL THEN a.address
                              ELSE attempts.address END,
               nodes = CASE WHEN a.nodes IS NOT NULL AND attempts.finished_at IS NULL THEN a.nodes::jsonb
                            ELSE attempts.nodes END,"""
        address_in, address_as = ", %(a_addresses)s::text[], %(a_nodes)s::text[]", ", address, nodes"
        address_only = """
              AND (a.started OR a.state <> '' OR (attempts.finished_at IS NULL
                   AND (a.address IS DISTINCT FROM attempts.address
                        OR (a.nodes IS NOT NULL AND a.nodes::jsonb IS DISTINCT FROM attempts.nodes))))"""
    return f"""
        UPDATE attempts SET{address_set}
               started_at = CASE WHEN a.started THEN {_START} ELSE attempts.started_at END,
               state = CASE WHEN a.state <> '' AND attempts.finished_at IS NULL THEN a.state
                            WHEN a.started THEN '{RUNNING}' ELSE attempts.state END,
               reason = CASE WHEN a.state <> '' AND attempts.finished_at IS NULL THEN a.reason ELSE attempts.reason END,
               exit_code = CASE WHEN a.state <> '' AND attempts.finished_at IS NULL THEN a.exit_code
                                ELSE attempts.exit_code END,
               finished_at = CASE WHEN a.state <> '' AND attempts.finished_at IS NULL THEN LEAST(now(), GREATEST(
                                      CASE WHEN a.started THEN {_START}
                                           ELSE coalesce(attempts.started_at, attempts.dispatched_at) END,
                                      coalesce(a.ended_at, now())))
                                  ELSE attempts.finished_at END
        FROM unnest(%(a_jobs)s::bigint[], %(a_attempts)s::int[], %(a_started)s::boolean[], %(a_states)s::text[],
                    %(a_reasons)s::text[], %(a_codes)s::int[], %(a_started_at)s::timestamptz[],
                    %(a_ended_at)s::timestamptz[]{address_in})
             AS a(job_id, attempt, started, state, reason, exit_code, started_at, ended_at{address_as})
        WHERE attempts.job_id = a.job_id AND attempts.attempt = a.attempt{address_only}
        RETURNING a.job_id, a.attempt, a.started, attempts.started_at, attempts.finished_at,
                  extract(epoch FROM now() - attempts.dispatched_at) AS waited"""


_MARK_ATTEMPTS = _mark_attempts(addressed=False)


# The jobs take their attempts' times (marked's RETURNING: the rows as updated), and so do their events.
def _transitions(addressed: bool) -> str:
    return f"""
    WITH c AS (
        SELECT * FROM unnest(%(ids)s::bigint[], %(states)s::text[], %(reasons)s::text[], %(started)s::boolean[],
                             %(finished)s::boolean[], %(requeued)s::boolean[])
                      AS c(id, state, reason, started, finished, requeued)),
    marked AS ({_mark_attempts(addressed)}),
    moved AS (
        UPDATE jobs SET state = c.state, reason = c.reason,
               started_at = CASE WHEN c.started THEN coalesce(m.started_at, now()) ELSE jobs.started_at END,
               finished_at = CASE WHEN c.finished THEN coalesce(m.finished_at, now()) ELSE jobs.finished_at END,
               cluster = CASE WHEN c.requeued THEN NULL ELSE jobs.cluster END
        FROM c LEFT JOIN marked m ON m.job_id = c.id WHERE jobs.id = c.id),
    made AS (
        INSERT INTO job_events (job_id, attempt, from_state, to_state, reason, cluster, at)
        SELECT e.job_id, e.attempt, e.from_state, e.to_state, e.reason, e.cluster,
               coalesce(CASE WHEN e.to_state = '{RUNNING}' THEN m.started_at ELSE m.finished_at END, now())
        FROM unnest(%(e_jobs)s::bigint[], %(e_attempts)s::int[], %(e_froms)s::text[], %(e_tos)s::text[],
                    %(e_reasons)s::text[], %(e_clusters)s::text[])
             WITH ORDINALITY AS e(job_id, attempt, from_state, to_state, reason, cluster, n)
             LEFT JOIN marked m ON m.job_id = e.job_id AND m.attempt = e.attempt
        ORDER BY e.n)
    SELECT array(SELECT waited FROM marked WHERE started), (SELECT count(*) FROM ({NOTIFY_SQL}) n)"""


_TRANSITIONS = _transitions(addressed=False)
_TRANSITIONS_ADDRESSED = _transitions(addressed=True)


def end_attempt(session: Session, job_id: int, attempt: int, state: str, reason: str,
                exit_code: int | None = None) -> None:
    """End this attempt in `state`, unless it ended already."""
    driver(session).execute(_MARK_ATTEMPTS, {"a_jobs": [job_id], "a_attempts": [attempt], "a_started": [False],
                                             "a_states": [state], "a_reasons": [reason], "a_codes": [exit_code],
                                             "a_started_at": [None], "a_ended_at": [None]})


def dispatch(session: Session, decisions: list[tuple[int, str]], bursts: dict[int, dict] | None = None,
             reasons: dict[int, str] | None = None, commit: bool = False,
             avoid_nodes: dict[int, tuple[str, ...]] | None = None) -> list[Dispatched]:
    """Move queued jobs to DISPATCHED on their chosen clusters, all in the caller's transaction.

    One UPDATE for the batch, compare-and-set on QUEUED (a job cancelled meanwhile is skipped), then
    the attempts, events and outbox commands of exactly the jobs that moved. bursts: per job sent to a
    paid cluster, its burst decision (kept with the attempt; its summary is the event's reason).
    reasons: first, set_reasons of other jobs. commit: then COMMIT, in the same round trip (the caller's
    session then has nothing left to commit; nothing may follow in its transaction). avoid_nodes: per job,
    the nodes its pods must not be bound to (Place.avoid_nodes), sent with its dispatch command.
    """
    if not decisions and not commit:
        set_reasons(session, reasons or {})
        return []
    conn = driver(session)
    cursor = None
    with conn.pipeline():  # the statements (and the commit) in one round trip, run in this order
        set_reasons(session, reasons or {})
        if decisions:
            lock_clusters(session, [cluster for _, cluster in decisions])
            cursor = _send_dispatch(conn, decisions, bursts or {}, avoid_nodes or {})
        if commit:
            conn.execute("COMMIT")
    return [Dispatched(*r) for r in cursor.fetchall()] if cursor is not None else []


def _send_dispatch(conn, decisions: list[tuple[int, str]], bursts: dict[int, dict],
                   avoid_nodes: dict[int, tuple[str, ...]]):
    """dispatch's statement, sent on psycopg connection `conn`; its cursor (rows: Dispatched's fields)."""
    avoided = [(i, nodes) for i, _ in decisions if (nodes := avoid_nodes.get(i))]
    return conn.execute(
        f"""WITH d AS (SELECT * FROM unnest(CAST(%(ids)s AS bigint[]), CAST(%(clusters)s AS text[])) AS d(id, cluster)),
           b AS (SELECT * FROM unnest(CAST(%(burst_ids)s AS bigint[]), CAST(%(burst_docs)s AS jsonb[])) AS b(id, doc)),
           a AS (SELECT * FROM unnest(CAST(%(avoid_ids)s AS bigint[]), CAST(%(avoid_docs)s AS jsonb[])) AS a(id, doc)),
           moved AS (
               UPDATE jobs SET state = '{DISPATCHED}', reason = 'dispatched to ' || d.cluster,
                      cluster = d.cluster, attempt = jobs.attempt + 1, dispatched_at = now(),
                      started_at = NULL, finished_at = NULL
               FROM d WHERE jobs.id = d.id AND jobs.state = '{QUEUED}'
               RETURNING jobs.id, jobs.attempt, jobs.cluster, jobs.created_at, jobs.dispatched_at),
           attempts_made AS (
               INSERT INTO attempts (job_id, attempt, cluster, state, burst)
               SELECT m.id, m.attempt, m.cluster, '{DISPATCHED}', b.doc FROM moved m LEFT JOIN b ON b.id = m.id),
           events_made AS (
               INSERT INTO job_events (job_id, attempt, from_state, to_state, reason, cluster)
               SELECT m.id, m.attempt, '{QUEUED}', '{DISPATCHED}',
                      'dispatched to ' || m.cluster || coalesce(': ' || (b.doc ->> 'summary'), ''), m.cluster
               FROM moved m LEFT JOIN b ON b.id = m.id),
           commands AS (
               INSERT INTO outbox (cluster, kind, job_id, attempt, payload)
               SELECT m.cluster, 'dispatch', m.id, m.attempt, coalesce(a.doc, '{{}}'::jsonb)
               FROM moved m LEFT JOIN a ON a.id = m.id ORDER BY m.id
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
         "avoid_ids": [i for i, _ in avoided],
         "avoid_docs": [json.dumps({"avoidNodes": list(nodes)}) for _, nodes in avoided],
         "outbox": OUTBOX_CHANNEL, "events": EVENTS_CHANNEL})


class DispatchAhead:
    """A cycle's dispatches sent while it is still planning, in parts of AHEAD jobs, so that Postgres
    writes one part on one core while Python plans the next on the other (a deep backlog's cycle places
    tens of thousands of jobs; planning and writing them one after the other left each core idle half
    the time). What is sent is `dispatch`'s statement, in the same transaction, before anything else
    the cycle writes; `end` collects what moved and leaves the rest of the plan to `dispatch`.

    The first part takes the outbox locks of every cluster the cycle may place on (in name order, as
    `lock_clusters` always does: locks taken part by part would not be).

    A part's rows come back while the next is planned (psycopg's pipeline mode reads them at each
    send); AHEAD keeps a part's rows within what the socket holds, so Postgres never waits on them.
    """

    AHEAD = DISPATCH_PART

    def __init__(self, session: Session, clusters: list[str]):
        self._session, self._clusters = session, clusters
        self._pipeline = None
        self._cursors: list = []
        self.sent = 0  # how many of the plan's places were sent

    def placed(self, places: list, bursts: dict) -> None:
        """The plan so far (its places, each with .job_id, .cluster and .avoid_nodes; bursts by job id, with .record()):
        sends the places not yet sent, once there are AHEAD of them."""
        if len(places) - self.sent < self.AHEAD:
            return
        conn = driver(self._session)
        if self._pipeline is None:  # the first part (of this plan's making)
            self._pipeline = conn.pipeline()
            self._pipeline.__enter__()
            lock_clusters(self._session, self._clusters)
        part = places[self.sent:]
        self._cursors.append(_send_dispatch(conn, [(p.job_id, p.cluster) for p in part],
                                            {p.job_id: bursts[p.job_id].record() for p in part if p.job_id in bursts},
                                            {p.job_id: p.avoid_nodes for p in part if p.avoid_nodes}))
        self.sent = len(places)

    def end(self) -> list[Dispatched]:
        """Waits for every part sent; what they moved."""
        if self._pipeline is not None:
            pipeline, self._pipeline = self._pipeline, None
            pipeline.__exit__(None, None, None)
        return [Dispatched(*r) for cursor in self._cursors for r in cursor.fetchall()]

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
        f"""UPDATE jobs SET reason = r.reason
           FROM unnest(%(ids)s::bigint[], %(reasons)s::text[]) AS r(id, reason)
           WHERE jobs.id = r.id AND jobs.state = '{QUEUED}' AND jobs.reason IS DISTINCT FROM r.reason""",
        {"ids": list(reasons), "reasons": list(reasons.values())})

