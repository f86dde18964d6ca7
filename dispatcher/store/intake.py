"""Kubernetes Jobs submitted through a cluster's API server, in the store: which Sluice job each (cluster,
Job uid) became, and where those jobs stand (services/intake.py decides what to submit and answer)."""
from __future__ import annotations

from dataclasses import dataclass

from dispatcher.store.database import Session, driver, named


@dataclass(frozen=True)
class Standing:
    """Where a job submitted through the API server stands, as its origin cluster's Job mirrors it."""

    job_id: int
    state: str
    reason: str
    cluster: str  # where its attempt runs or ran ("" before any)
    attempt: int


def lock(session: Session, cluster: str) -> None:
    """Serialise one cluster's intake until the transaction ends: a link that reconnects to another replica
    while its old one is still applying must not submit the same Job twice."""
    driver(session).execute("SELECT pg_advisory_xact_lock(hashtext('sluice-intake:' || %(c)s))", {"c": cluster})


def known(session: Session, cluster: str, uids: list[str]) -> dict[str, int]:
    """The Sluice job of each Job uid of `cluster` that was submitted before."""
    if not uids:
        return {}
    return dict(driver(session).execute(
        "SELECT uid, job_id FROM intake_jobs WHERE cluster = %(c)s AND uid = ANY(%(u)s)", {"c": cluster, "u": uids}))


def record(session: Session, cluster: str, uid: str, job_id: int, namespace: str, name: str) -> None:
    driver(session).execute(
        "INSERT INTO intake_jobs (cluster, uid, job_id, namespace, name) VALUES (%(c)s, %(u)s, %(j)s, %(ns)s, %(n)s)",
        {"c": cluster, "u": uid, "j": job_id, "ns": namespace, "n": name})


def standings(session: Session, job_ids: list[int]) -> dict[int, Standing]:
    if not job_ids:
        return {}
    rows = named(session, """SELECT id, state, reason, coalesce(cluster, '') AS cluster, attempt
                             FROM jobs WHERE id = ANY(%(ids)s)""", {"ids": job_ids})
    return {r.id: Standing(r.id, r.state, r.reason, r.cluster, r.attempt) for r in rows}
