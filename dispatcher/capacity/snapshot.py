"""Each cluster's usable capacity, as the scheduler and `sluice clusters` see it.

free = reported free - requests of active attempts dispatched after the report was taken
(dispatch command id > the report's applied_through). Attempts at or below it are inside the report;
the others are not: each attempt is counted exactly once. The same holds for the largest free node,
conservatively (an in-flight pod may land on it).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from dispatcher.policy.placing import ClusterState
from dispatcher.store import clusters as cluster_store
from dispatcher.store import jobs as job_store
from sluice.quantity import subtract


@dataclass(frozen=True)
class ClusterCapacity:
    state: ClusterState
    status: str  # active | cordoned | draining | unreachable
    source: str  # agent | none
    age_seconds: float  # -1 when never reported
    allocatable: dict[str, int]


def read(session: Session, now: datetime, *, unreachable_after_s: float) -> list[ClusterCapacity]:
    pending: dict[str, list] = {}
    for row in job_store.in_flight(session):
        pending.setdefault(row.cluster, []).append(row)
    out = []
    for c in cluster_store.list_clusters(session):
        capacity = c.capacity or {}
        free = dict(capacity.get("free", {}))
        largest = dict(capacity.get("largestFreeNode", {}))
        for row in pending.get(c.name, ()):
            free = subtract(free, row.requests)
            largest = {r: min(v, free.get(r, 0)) for r, v in largest.items()}
        seen = (now - c.last_seen_at).total_seconds() if c.last_seen_at else None
        status = c.state
        unavailable = ""
        if seen is None:
            status, unavailable = "unreachable", "unreachable (its agent has never connected)"
        elif seen > unreachable_after_s:
            status, unavailable = "unreachable", f"unreachable (no heartbeat from its agent for {seen:.0f}s)"
        elif c.state != "active":
            unavailable = c.state
        elif not capacity:
            unavailable = "no capacity reported yet"
        age = (now - c.capacity_at).total_seconds() if c.capacity_at else -1.0
        out.append(ClusterCapacity(
            ClusterState(c.name, c.tier, c.site, dict(c.labels), free, largest, unavailable,
                         dict(capacity.get("allocatable", {}))),
            status, "agent" if capacity else "none", age, dict(capacity.get("allocatable", {}))))
    return out
