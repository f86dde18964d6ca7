"""From rows the store read to the policy's frozen inputs: the heads of the queues as candidates and the
attempts that run; and PolicyConfig, the quotas, classes and burst rules a cycle plans with. Nothing here
reads the store (the rows are given), so a replay shares it."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

from dispatcher.policy import sessions
from dispatcher.policy.placing import QueuedJob
from dispatcher.policy.plans import Active, Candidate, ClassPolicy
from dispatcher.policy.quotas import QueueQuota
from sluice.quantity import parse_duration


def _seconds(text: str | None) -> float | None:
    return parse_duration(text) if text else None


def candidate(row, now: datetime, avoid: tuple[str, ...] = ()) -> Candidate:
    """One queued job (a Job row) as the policy reads it: `sluice explain` judges a job the way a cycle does."""
    placement = row.placement or {}
    job = QueuedJob(row.id, row.requests, row.largest_pod, dict(placement.get("clusterSelector", {})),
                    tuple(placement.get("tiers", ())), tuple(placement.get("sites", ())),
                    _seconds(getattr(row, "max_runtime", None)), avoid, _pods(getattr(row, "pods", None)))
    return Candidate(job, row.queue, row.service_class, row.class_priority, row.priority,
                     (now - row.created_at).total_seconds(), row.preempted_by)


def _pods(stored: list | None) -> tuple[tuple[int, dict[str, int]], ...]:
    """A job's stored pods (jobs.pods) as QueuedJob.pods: () for one pod or a job stored without them."""
    return tuple((int(count), requests) for count, requests in stored) if stored else ()


def heads_from_rows(rows: list[tuple], now: float, avoid: dict[int, tuple[str, ...]]
                ) -> tuple[dict[str, list[Candidate]], dict[int, str]]:
    """The heads per queue (cycle_reads.queue_heads' rows), as candidate() makes them, and each one's
    current reason. Heads repeat a few
    shapes: each distinct JSON text is decoded once and its dicts shared (the policy never changes them)."""
    decoded: dict[str, dict] = {}
    shapes: dict[tuple, tuple] = {}
    heads: dict[str, list[Candidate]] = {}
    current: dict[int, str] = {}
    for (job_id, queue, service_class, class_priority, priority, requests, largest_pod, placement, reason, created,
         preempted_by, _attempt, max_runtime, pods) in rows:
        shape = shapes.get((requests, largest_pod, placement, max_runtime, pods))
        if shape is None:
            for document in (requests, largest_pod, placement):
                if document not in decoded:
                    decoded[document] = json.loads(document) if document else {}
            where = decoded[placement] or {}
            shape = shapes[(requests, largest_pod, placement, max_runtime, pods)] = (
                (decoded[requests], decoded[largest_pod], dict(where.get("clusterSelector", {})),
                 tuple(where.get("tiers", ())), tuple(where.get("sites", ())), _seconds(max_runtime)),
                _pods(json.loads(pods) if pods else None))
        job = QueuedJob(job_id, *shape[0], avoid.get(job_id, ()), shape[1])
        heads.setdefault(queue, []).append(Candidate(job, queue, service_class, class_priority, priority,
                                                     now - created, preempted_by))
        current[job_id] = reason
    return heads, current


def active_from_rows(rows, classes: dict[str, ClassPolicy]) -> list[Active]:
    """cycle_reads.active_attempts' rows as the policy reads them, with when each is expected to end."""
    return [Active(r.id, r.queue, r.service_class, r.class_priority, r.priority, r.cluster, r.requests,
                   classes[r.service_class].preemptible if r.service_class in classes else False,
                   r.since.timestamp() + parse_duration(r.max_runtime) if r.max_runtime and r.since else None,
                   _pods(r.pods), evictable=not sessions.is_interactive(r.priority),
                   nodes=tuple((node, held) for node, held in sorted(r.nodes.items())) if r.nodes else ())
            for r in rows]


@dataclass
class PolicyConfig:
    """The service classes, queue quotas and burst rules of the last cycle, kept by the leader and read
    again (and parsed) only when their documents' digest, computed in the cycle's transaction, changed
    (stored_policy.refresh); a replay builds one from its objects."""

    digest: str = ""
    classes: dict[str, ClassPolicy] = field(default_factory=dict)
    quotas: list[QueueQuota] = field(default_factory=list)
    rules: list = field(default_factory=list)
