"""`sluice explain JOB`: why a job is where it is, cluster by cluster, from the same policy code the
scheduler runs (quota verdict from the queue tree, fit verdict per cluster from placement), and the
burst decisions recorded for its attempts that went to paid clusters. Why a waiting job does not
burst is part of its reason, written by the scheduler."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dispatcher.capacity import snapshot
from dispatcher.policy import states
from dispatcher.policy.placing import verdicts
from dispatcher.policy.quotas import QuotaTree
from dispatcher.scheduler.mapping import candidate, queue_quotas
from dispatcher.store import cycle_reads, job_reads
from dispatcher.store.database import Session
from dispatcher.store.models import Job


@dataclass(frozen=True)
class Explanation:
    job: Job
    queue_position: int
    quota: str
    clusters: list[tuple[str, str]]
    bursts: list[tuple[int, dict]]  # (attempt, the burst decision kept with it)


def explain(session: Session, job_id: int, now: datetime, *, unreachable_after_s: float) -> Explanation:
    job = job_reads.get(session, job_id)
    tree = QuotaTree(queue_quotas(session), {})
    for row in cycle_reads.active_usage(session):  # summed in Postgres: never a row per running job
        tree.charge(row.queue, row.requests, row.jobs)
    if job.state in states.ACTIVE:  # a running job is judged as if it were asking again
        tree.charge(job.queue, job.requests, -1)
    quota = tree.over_max(job.queue, job.requests) or f"within the quotas of queue {job.queue} and its parents"
    clusters = [c.state for c in snapshot.read(session, now, unreachable_after_s=unreachable_after_s)]
    found = verdicts(candidate(job, now).job, clusters)
    if job.state in states.ACTIVE or job.state in states.FINAL:
        found = [(name, f"runs here ({job.state})" if name == job.cluster and job.state in states.ACTIVE else verdict)
                 for name, verdict in found]
    return Explanation(job, job_reads.queue_position(session, job), quota, found, job_reads.job_bursts(session, job.id))
