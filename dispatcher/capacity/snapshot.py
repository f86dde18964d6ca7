"""Each cluster's usable capacity, as the scheduler and `sluice clusters` see it.

Two sources, each with its own rule for the attempts it does not show yet, so that every active
attempt is counted exactly once, never twice, never not at all:

- **prometheus** (when the cluster has a reading younger than the staleness bound):
  free = reading.free - Σ requests of active attempts on the cluster whose (job, attempt) the reading
  does not show + Σ requests of attempts the reading shows that have succeeded since. An attempt whose
  pods the series show is inside reading.free (while its pods are Pending or Running) or has ended there;
  any other active attempt is not in it yet. A succeeded attempt's pods are Succeeded, which holds no
  room: without the last term, room freed by a job that ends would stay idle until the next scrape (and
  jobs shorter than the scrape interval would leave most of the cluster idle). Attempts ended otherwise
  (cancelled, preempted, lost) may still have pods terminating: their room counts from the next reading.
- **agent** (otherwise, the agent's own report):
  free = report.free - Σ requests of active attempts dispatched by a command with an id above the
  report's applied_through. The agent read applied_through before its snapshot, so every command at
  or below it is inside the report.

The largest free node is reduced the same way, conservatively (an unseen pod may land on it), and so is
each node's free capacity (`nodeFree`, from agents that report it; the Prometheus reading has none): no
node shows more free than the cluster has free.

An elastic cluster also shows its headroom: per resource, maxNodes × its node shape less what it has
now (allocatable). Pods waiting for new nodes are already inside `free` (it goes below zero), so
free + headroom is what the cluster could still take at its maximum size.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import datetime

from dispatcher.capacity.usable import DEFAULT_STALENESS_S, KEPT_DOCUMENTS, ClusterCapacity, terms
from dispatcher.policy.placing import ClusterState, nodes_within
from dispatcher.store import cycle_reads
from dispatcher.store.database import Session
from sluice.quantity import add, subtract


def _less(capacity: dict, requests: dict[str, int], back: Sequence[tuple[dict, dict]] = ()
          ) -> tuple[dict[str, int], dict[str, int], tuple[dict[str, int], ...]]:
    """Free capacity, the largest free node and each node's free capacity, less `requests` (what is not in
    the report yet), plus what the attempts in `back` held ((requests, largest pod) of each that succeeded
    since the reading): the node of each one's largest pod has at least that pod's room free again."""
    free, largest = dict(capacity.get("free", {})), dict(capacity.get("largestFreeNode", {}))
    for held, pod in back:
        free = add(free, held)
        largest.update((k, max(largest.get(k, 0), v)) for k, v in pod.items())
    if requests or back:
        free = subtract(free, requests)
        largest = {k: min(v, free.get(k, 0)) for k, v in largest.items()}
    # Pending pods are in `free` but on no node yet: capping each node by it keeps them from being packed twice.
    nodes = tuple(nodes_within(list(capacity.get("nodeFree", ())), free))
    return free, largest, nodes


def read(session: Session, now: datetime, *, unreachable_after_s: float,
         staleness_s: float = DEFAULT_STALENESS_S, read: cycle_reads.CapacityReads | None = None
         ) -> list[ClusterCapacity]:
    """Every cluster's usable capacity (from `read`, when the caller read it already). The active
    attempts are read one by one only on the clusters whose capacity comes from a fresh Prometheus reading
    (the attempts it may not show yet)."""
    read = read if read is not None else cycle_reads.capacity_reads(session)
    after_report, rows = read.in_flight, read.clusters

    reported = {c.name: (_document(c.capacity), _document(c.prometheus_capacity)) for c in rows}

    def fresh(c) -> bool:
        prom_age = (now - c.prometheus_at).total_seconds() if c.prometheus_at else None
        return bool(reported[c.name][1]) and prom_age is not None and prom_age <= staleness_s

    # Per cluster with a fresh reading, the (job, attempt) pairs it shows.
    seen = {c.name: {tuple(pair) for pair in reported[c.name][1].get("attempts", [])} for c in rows if fresh(c)}
    active: dict[str, list] = {}
    for row in cycle_reads.active_attempts(session, clusters=list(seen)):
        active.setdefault(row.cluster, []).append(row)
    # Of what the readings show, what is no longer active: those attempts that succeeded since (their pods
    # Succeeded) hold nothing now, though the reading still counts them until the next scrape.
    live = {(r.id, r.attempt) for attempts in active.values() for r in attempts}
    succeeded = cycle_reads.succeeded_attempts(session, set().union(*seen.values()) - live) if seen else []
    out = []
    for c in rows:
        prom_age = (now - c.prometheus_at).total_seconds() if c.prometheus_at else None
        back: list[tuple[dict, dict]] = []
        if c.name in seen:
            capacity, source, age = reported[c.name][1], "prometheus", prom_age
            unseen: dict[str, int] = {}
            for r in active.get(c.name, ()):
                if (r.id, r.attempt) not in seen[c.name]:
                    unseen = add(unseen, r.requests)
            back = [(r.requests, r.largest_pod) for r in succeeded if (r.id, r.attempt) in seen[c.name]]
        else:
            capacity = reported[c.name][0] or {}
            source = "agent" if capacity else "none"
            age = (now - c.capacity_at).total_seconds() if c.capacity_at else -1.0
            unseen = after_report.get(c.name, {})
        free, largest, nodes = _less(capacity, unseen, back)
        heard = (now - c.last_seen_at).total_seconds() if c.last_seen_at else None
        status = c.state
        unavailable = ""
        if heard is None:
            status, unavailable = "unreachable", "unreachable (its agent has never connected)"
        elif heard > unreachable_after_s:
            status, unavailable = "unreachable", f"unreachable (no heartbeat from its agent for {heard:.0f}s)"
        elif c.state != "active":
            unavailable = c.state
        elif not capacity:
            unavailable = "no capacity reported yet"
        allocatable = dict(capacity.get("allocatable", {}))
        out.append(ClusterCapacity(
            ClusterState(c.name, c.tier, c.site, dict(c.labels), free, largest, unavailable, allocatable,
                         node_free=nodes, node_names=tuple(capacity.get("nodeNames", ())),
                         **terms(c.spec, allocatable)),
            status, source, age, allocatable))
    return out


@functools.lru_cache(maxsize=2 * KEPT_DOCUMENTS)  # a cluster's agent report and its Prometheus reading
def _document(text: str | None) -> dict | None:
    """A capacity document of CLUSTER_ROWS, from its JSON text; shared: callers never change it."""
    return None if text is None else json.loads(text)
