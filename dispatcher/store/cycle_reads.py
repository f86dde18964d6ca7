"""What a scheduling cycle reads: the heads of the queues, what runs (per queue and, when the policy needs
them, one by one), the attempts in flight past each cluster's last report, and recent failures to start.
The cycle's first reads go in one round trip (`first_reads`)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from dispatcher.policy.states import ACTIVE, QUEUED, SUCCEEDED, UNSCHEDULABLE
from dispatcher.store.clusters import CLUSTER_ROWS
from dispatcher.store.database import at_once, driver, named
from dispatcher.store.models import sql_strings

_ACTIVE = sql_strings(ACTIVE)  # the states in which an attempt holds capacity, as a SQL list


def queue_heads(session: Session, per_queue: int, queues: list[str] | None = None) -> list[tuple]:
    """The first `per_queue` queued jobs of every queue (or of these `queues`), in queue order (one index
    range per queue): (id, queue, service_class, class_priority, priority, requests, largest_pod, placement,
    reason, created (epoch seconds), preempted_by, attempt, max_runtime, pods). requests, largest_pod,
    placement and pods (NULL for one pod) come as JSON text: a cycle's heads repeat a few shapes, which the
    caller decodes once each."""
    if queues is not None and not queues:
        return []
    return driver(session).execute(*_heads_query(per_queue, queues)).fetchall()


_MAX_RUNTIME = "spec -> 'spec' ->> 'maxRuntime'"  # a job document's maxRuntime, as given


def _heads_query(per_queue: int, queues: list[str] | None = None) -> tuple[str, dict]:
    """queue_heads' statement and parameters."""
    return (f"""SELECT h.* FROM queues q CROSS JOIN LATERAL (
                   SELECT id, queue, service_class, class_priority, priority, requests::text, largest_pod::text,
                          placement::text, reason, extract(epoch FROM created_at)::float8 AS created, preempted_by,
                          attempt, {_MAX_RUNTIME} AS max_runtime, pods::text
                   FROM jobs WHERE jobs.queue = q.name AND state = '{QUEUED}'
                   ORDER BY class_priority DESC, priority DESC, id LIMIT %(n)s) h
                {"" if queues is None else "WHERE q.name = ANY(%(queues)s)"}""",
            {"n": per_queue, "queues": queues})


# What active_attempts reads of each dispatched or running job (the columns of an Active, and its maxRuntime),
# with or without (NULL) what its pods hold on each node: a look-up in attempts per row, only for victims.
_ACTIVE_ATTEMPTS = f"""SELECT id, attempt, queue, service_class, class_priority, priority, cluster, requests,
                             coalesce(started_at, dispatched_at) AS since, {_MAX_RUNTIME} AS max_runtime, pods,
                             {{nodes}} AS nodes
                        FROM jobs WHERE state IN {_ACTIVE}"""
_NODES = "(SELECT a.nodes FROM attempts a WHERE a.job_id = jobs.id AND a.attempt = jobs.attempt)"


def active_attempts(session: Session, *, clusters=None, timed: bool = False, preemptible=(),
                    below: int | None = None, queues=(), nodes: bool = False) -> list:
    """Dispatched or running jobs: what each holds, where, and as which attempt (preemption candidates,
    expected ends, and the attempts a capacity reading may not show yet), as named tuples. Every one
    without filters; with `clusters`, only those on these clusters, and then, if any of the others is
    given, only those that are `timed` (have a maxRuntime), or of a `preemptible` class with a class
    priority `below`, or of one of `queues`. nodes: with what each one's pods hold on which node (else
    None), as the victim search needs. Plain SQL: a cycle asks for them once or twice."""
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
    return named(session, " AND ".join([_ACTIVE_ATTEMPTS.format(nodes=_NODES if nodes else "NULL::jsonb"), *where]),
                 {"clusters": list(clusters or ()), "preemptible": list(preemptible), "below": below,
                  "queues": list(queues)})


def succeeded_attempts(session: Session, pairs: set[tuple[int, int]]) -> list:
    """Of these (job, attempt) pairs, the attempts that succeeded (their job ended SUCCEEDED with that attempt):
    id, attempt, requests, largest_pod, as named tuples. A succeeded attempt's pods are Succeeded, which holds
    no room on a node."""
    if not pairs:
        return []
    rows = named(session, f"SELECT id, attempt, requests, largest_pod FROM jobs "
                          f"WHERE id = ANY(%(ids)s) AND state = '{SUCCEEDED}'", {"ids": sorted({j for j, _ in pairs})})
    return [r for r in rows if (r.id, r.attempt) in pairs]


def recently_unschedulable(session: Session, job_ids: list[int], within_s: float) -> dict[int, tuple[str, ...]]:
    """Per job, the clusters where one of its attempts could not start (UNSCHEDULABLE) in the last `within_s`."""
    if not job_ids:
        return {}
    rows = driver(session).execute(
        f"""SELECT job_id, array_agg(DISTINCT cluster) FROM attempts
           WHERE job_id = ANY(%(ids)s) AND state = '{UNSCHEDULABLE}'
             AND finished_at > now() - make_interval(secs => %(s)s)
           GROUP BY job_id""", {"ids": job_ids, "s": within_s}).fetchall()
    return {r[0]: tuple(sorted(r[1])) for r in rows}


def _in_flight_sums(rows) -> dict[str, dict[str, int]]:
    """Per cluster, the requests summed of the active attempts whose dispatch command came after its latest
    capacity report, from the rows of _IN_FLIGHT (read with the cluster rows: `capacity_reads`).

    Those are not yet in the report, so the scheduler subtracts them; every other active attempt is
    already in it. Each attempt is therefore counted exactly once. Every cycle reads them, so it costs what
    is in flight whatever the statistics say: per cluster, the range of ix_outbox_cluster_id from its
    watermark to its last command, written as two row comparisons, which no other index can serve (as
    `cluster = name AND id > watermark` the planner read the outbox by its key from the lowest watermark,
    and Postgres starts a row comparison's range at the cluster's first command when an equality is beside
    it); then each job by its key alone, the other filters behind OFFSET 0 (with statistics from before the
    jobs ran, the planner found each through the index of every active job: 0.9 s a cycle). The sums are
    made in Postgres (a cluster's free capacity only ever loses their total).
    """
    out: dict[str, dict[str, int]] = {}
    for cluster, resource, amount in rows:
        out.setdefault(cluster, {})[resource] = int(amount)
    return out


_TOP_ID = 2**63 - 1  # the largest bigint: the end of a cluster's range of ix_outbox_cluster_id
_IN_FLIGHT = f"""SELECT c.name, r.key, sum(r.value::bigint)::bigint FROM clusters c
               CROSS JOIN LATERAL (SELECT job_id, attempt FROM outbox
                                   WHERE (outbox.cluster, outbox.id) > (c.name, c.applied_through)
                                     AND (outbox.cluster, outbox.id) <= (c.name, {_TOP_ID})
                                     AND outbox.kind = 'dispatch' OFFSET 0) o
               CROSS JOIN LATERAL (SELECT requests, attempt, cluster, state FROM jobs
                                   WHERE jobs.id = o.job_id OFFSET 0) j
               CROSS JOIN LATERAL jsonb_each_text(j.requests) r
               WHERE j.attempt = o.attempt AND j.cluster = c.name AND j.state IN {_ACTIVE}
               GROUP BY c.name, r.key"""


def active_usage(session: Session) -> list[tuple[str, dict, int]]:
    """(queue, requests, jobs): dispatched and running jobs counted per queue and distinct request, so that
    the queues' usage is summed from a few rows (a handful of job shapes per queue), not one per job."""
    return named(session, _ACTIVE_USAGE)


_ACTIVE_USAGE = f"""SELECT queue, requests, count(*) AS jobs FROM jobs
                  WHERE state IN {_ACTIVE} GROUP BY queue, requests"""


def decayed_history(session: Session, now: datetime, half_lives: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per queue of `half_lives` (queue -> its tree's half-life H, seconds), per resource, the decayed
    resource-seconds seen at `now` of every attempt that started (finished_at, or `now` while it runs):
    policy/decay.py's decayed_run summed in one query. An attempt that ended over 10 H ago is left out
    (it would count under 0.1%); ages are clamped to [0, 1000 H] (Postgres raises on float underflow)."""
    if not half_lives:
        return {}
    queues = sorted(half_lives)
    rows = driver(session).execute(_DECAYED_HISTORY, {
        "now": now, "queues": queues, "halves": [float(half_lives[q]) for q in queues]}).fetchall()
    out: dict[str, dict[str, float]] = {}
    for queue, resource, amount in rows:
        out.setdefault(queue, {})[resource] = float(amount)
    return out


_AGE = "least(greatest(extract(epoch FROM %(now)s - {at})::float8, 0) / h.half, 1000)"  # in half-lives
_DECAYED_HISTORY = f"""SELECT j.queue, r.key, sum(r.value::float8 * h.half / ln(2) * (
                              power(2::float8, -{_AGE.format(at="coalesce(a.finished_at, %(now)s)")})
                              - power(2::float8, -{_AGE.format(at="a.started_at")})))
                       FROM unnest(%(queues)s::text[], %(halves)s::float8[]) AS h(queue, half)
                       JOIN jobs j ON j.queue = h.queue
                       JOIN attempts a ON a.job_id = j.id
                       CROSS JOIN LATERAL jsonb_each_text(j.requests) r
                       WHERE a.started_at IS NOT NULL
                         AND (a.finished_at IS NULL OR a.finished_at > %(now)s - make_interval(secs => 10 * h.half))
                       GROUP BY j.queue, r.key"""


# The documents the cycle's policy objects come from (classes, queues, burst policies), as one digest.
_DIGEST_SQL = """md5(concat_ws('|',
           (SELECT string_agg(name || spec::text, ',' ORDER BY name) FROM service_classes),
           (SELECT string_agg(name || spec::text, ',' ORDER BY name) FROM queues),
           (SELECT string_agg(name || spec::text, ',' ORDER BY name) FROM burst_policies)))"""
# Leader fencing with the digest: whether the backend %(pid)s still holds the session advisory lock
# %(key)s (the leader's lock connection), then the digest.
_FENCED_DIGEST = f"""SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
                                    AND pid = %(pid)s AND classid = 0 AND objid = %(key)s AND objsubid = 1),
                            {_DIGEST_SQL}"""


def policy_digest(session: Session) -> str:
    """The digest of the policy documents, read in the caller's transaction."""
    return driver(session).execute(f"SELECT {_DIGEST_SQL}").fetchone()[0]


@dataclass(frozen=True)
class CapacityReads:
    """What usable capacity is computed from: per cluster, the requests of the attempts in flight past its
    last report, and the cluster rows (CLUSTER_ROWS). Read in that order: a report committed in between
    then counts its attempts twice, never not at all (free capacity can only be under-counted)."""

    in_flight: dict[str, dict[str, int]]
    clusters: list


def capacity_reads(session: Session) -> CapacityReads:
    flights, rows = at_once(session, (_IN_FLIGHT, None), (CLUSTER_ROWS, None))
    return CapacityReads(_in_flight_sums(flights), rows)


@dataclass(frozen=True)
class FirstReads:
    """A cycle's first reads, in one round trip: capacity, what runs per queue (active_usage's rows), the
    heads of every queue when asked for, and, for a leader, whether it still holds its lock (fencing) and
    the policy documents' digest (None when not asked)."""

    capacity: CapacityReads
    running: list
    heads: list | None
    leader_held: bool | None
    digest: str | None


def first_reads(session: Session, *, heads_per_queue: int | None, leader: tuple[int, int] | None) -> FirstReads:
    """heads_per_queue: read every queue's heads too (None: not now). leader: (backend pid, lock key) to fence on."""
    also = []
    if heads_per_queue is not None:
        also.append(_heads_query(heads_per_queue))
    if leader is not None:
        also.append((_FENCED_DIGEST, {"pid": leader[0], "key": leader[1]}))
    flights, rows, running, *more = at_once(session, (_IN_FLIGHT, None), (CLUSTER_ROWS, None),
                                            (_ACTIVE_USAGE, None), *also)
    heads = more.pop(0) if heads_per_queue is not None else None
    held, digest = more[0][0] if leader is not None else (None, None)
    return FirstReads(CapacityReads(_in_flight_sums(flights), rows), running, heads, held, digest)
