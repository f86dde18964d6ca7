"""`sluice explain JOB`: why a job is where it is, cluster by cluster, from the same policy code the
scheduler runs (quota verdict from the queue tree, fit verdict per cluster from placement), and the
burst decisions recorded for its attempts that went to paid clusters. Why a waiting job does not
burst is part of its reason, written by the scheduler. And each queue's fair share, as a cycle ranks
the queues by it (`sluice queues`, the console)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dispatcher.capacity import snapshot
from dispatcher.policy import states
from dispatcher.policy.placing import verdicts
from dispatcher.policy.quotas import QuotaTree
from dispatcher.scheduler.mapping import candidate
from dispatcher.scheduler.stored_policy import decayed_history, queue_quotas
from dispatcher.store import cycle_reads, job_reads
from dispatcher.store.database import Session
from dispatcher.store.models import Job
from sluice.quantity import add


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


def fair_shares(session: Session, now: datetime, quotas: list, *, unreachable_after_s: float) -> dict[str, float]:
    """Each queue's fair share as a cycle computes it (QuotaTree.share): its dominant share of every cluster's
    allocatable, with its tree's decayed history where the root has a half-life, divided by its weight.
    Among siblings, the one with the smallest share is served first."""
    capacity: dict[str, int] = {}
    for c in snapshot.read(session, now, unreachable_after_s=unreachable_after_s):
        capacity = add(capacity, c.state.allocatable)
    tree = QuotaTree(quotas, capacity, decayed_history(session, now, quotas))
    for row in cycle_reads.active_usage(session):
        tree.charge(row.queue, row.requests, row.jobs)
    return {q.name: tree.share(q.name) for q in quotas}
