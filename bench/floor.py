"""The floor under dispatch: Postgres alone doing the same claim-and-record, no Python policy.

Per transaction: claim the next BATCH queued jobs, queue by queue in scheduling order (the head index
ix_jobs_queue_head, FOR UPDATE SKIP LOCKED as a claiming worker would), move them to DISPATCHED on a
cluster (chosen by id, round robin), and insert their attempts, DISPATCHED events and dispatch
commands (no payload: the agent link reads the document from the job), all in one statement. These
are the rows and indexes store.lifecycle.dispatch writes for a cycle, without its reads (heads, active
attempts, capacity), its policy, its advisory locks and NOTIFYs.
"""
from __future__ import annotations

import time

import psycopg

BATCH = 1000

CLAIM = """
WITH picked AS (
    SELECT id FROM jobs WHERE state = 'QUEUED'
    ORDER BY queue, class_priority DESC, priority DESC, id
    LIMIT %(batch)s FOR UPDATE SKIP LOCKED),
moved AS (
    UPDATE jobs SET state = 'DISPATCHED', cluster = 'c-' || lpad((jobs.id %% %(clusters)s)::text, 3, '0'),
           attempt = jobs.attempt + 1, dispatched_at = now(), started_at = NULL, finished_at = NULL,
           reason = 'dispatched to c-' || lpad((jobs.id %% %(clusters)s)::text, 3, '0')
    WHERE jobs.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING jobs.id, jobs.attempt, jobs.cluster),
attempts AS (
    INSERT INTO attempts (job_id, attempt, cluster, state)
    SELECT id, attempt, cluster, 'DISPATCHED' FROM moved),
events AS (
    INSERT INTO job_events (job_id, attempt, from_state, to_state, cluster, reason)
    SELECT id, attempt, 'QUEUED', 'DISPATCHED', cluster, 'dispatched to ' || cluster FROM moved)
INSERT INTO outbox (cluster, kind, job_id, attempt, payload)
SELECT cluster, 'dispatch', id, attempt, '{}'::jsonb FROM moved
"""


def plan(libpq_url: str, clusters: int) -> str:
    """EXPLAIN of one claim (rolled back): shows which index chooses the batch."""
    with psycopg.connect(libpq_url) as conn:
        rows = conn.execute("EXPLAIN " + CLAIM, {"batch": BATCH, "clusters": clusters}).fetchall()
        conn.rollback()
    return "\n".join(r[0] for r in rows)


def drain(libpq_url: str, clusters: int, *, limit: int, time_limit_s: float) -> dict:
    """Claim batches until `limit` jobs moved, the queue is empty, or the time is up."""
    moved = 0
    batches = []
    deadline = time.monotonic() + time_limit_s
    with psycopg.connect(libpq_url) as conn:
        began = time.perf_counter()
        while moved < limit and time.monotonic() < deadline:
            t = time.perf_counter()
            cur = conn.execute(CLAIM, {"batch": min(BATCH, limit - moved), "clusters": clusters})
            conn.commit()
            if cur.rowcount <= 0:
                break
            moved += cur.rowcount
            batches.append(time.perf_counter() - t)
        seconds = time.perf_counter() - began
    return {"jobs": moved, "seconds": seconds, "batches": len(batches), "rate": moved / seconds if seconds else 0.0,
            "batch_p50_s": sorted(batches)[len(batches) // 2] if batches else None}
