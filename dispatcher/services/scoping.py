"""Which jobs a caller may see (and so cancel): admins every job; users their own and those of the queues
they belong to (Principal.belongs). A job a caller may not see is reported as not found, in the same words
as one that does not exist, so that a refusal does not tell it exists."""
from __future__ import annotations

from dispatcher.errors import NotFound
from dispatcher.store import clusters as cluster_store
from dispatcher.store import job_reads
from dispatcher.store.database import Session
from dispatcher.store.models import Job
from dispatcher.store.tokens import Principal


def readable_queues(session: Session, who: Principal, among: str | None = None) -> frozenset[str] | None:
    """The queues whose every job `who` may see (of queue `among` alone, when given); None: every job of
    every queue (an admin)."""
    if who.role == "admin":
        return None
    queues = [cluster_store.get_queue(session, among)] if among else cluster_store.list_queues(session)
    return frozenset(q.name for q in queues if who.belongs(q.name, q.spec.get("spec", {}).get("members") or ()))


def sees(who: Principal, readable: frozenset[str] | None, queue: str, submitted_by: str) -> bool:
    """Whether `who`, who may see the jobs of `readable` (readable_queues), may see a job of `queue`
    submitted by `submitted_by`."""
    return readable is None or submitted_by == who.subject or queue in readable


def visible_job(session: Session, who: Principal, job_id: int, *, for_update: bool = False) -> Job:
    """The job, if `who` may see it; NotFound, as for a job that does not exist, otherwise."""
    job = job_reads.get(session, job_id, for_update=for_update)
    if not sees(who, readable_queues(session, who, among=job.queue), job.queue, job.submitted_by):
        raise NotFound(f"job {job_id} not found")
    return job
