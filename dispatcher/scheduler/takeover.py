"""What a scheduling leader that has just taken over waits for before it starts any job.

When every dispatcher restarts at once (an upgrade, a crash, kill -9), every agent and every watch dials
again together, and the clusters come back one by one. A leader that started jobs meanwhile would pour the
backlog onto the first clusters back, and the dispatches, acks, status reports and watch events of that
flow would take the serving process from the agents still dialling: measured at a thousand clusters, 3-4
agents a second were taken back in beside it, against about 30 a second with no job going (docs/performance.md).
So a new leader starts nothing until the clusters that were reachable before it took over are back, or
`takeover_wait_s` has passed. A leader taking over from another live replica waits about a heartbeat:
the clusters on the other replicas keep reporting throughout.
"""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from dispatcher.capacity.usable import ClusterCapacity
from dispatcher.scheduler.settings import SchedulerSettings


class Takeover:
    """One leader's term: when it began, and the clusters it waits for (found at its first cycle)."""

    def __init__(self, since: datetime, settings: SchedulerSettings):
        self.since = since
        self._until = since + timedelta(seconds=settings.takeover_wait_s)
        self._unreachable_after_s = settings.unreachable_after_s
        self._awaited: frozenset[str] | None = None
        self._over = False

    def hold(self, capacities: list[ClusterCapacity], rows: list, now: datetime) -> list[ClusterCapacity]:
        """The capacities a cycle at `now` may use: every cluster unavailable while the wait lasts.
        `rows`: the cluster rows the cycle read (store.clusters.CLUSTER_ROWS)."""
        if self._over:
            return capacities
        if self._awaited is None:
            self._awaited = awaited(rows, self.since, self._unreachable_after_s)
        back = all(r.last_seen_at is not None and r.last_seen_at >= self.since
                   for r in rows if r.name in self._awaited)
        if back or now >= self._until:
            self._over = True  # for good: a cluster lost later is a cluster lost, not a takeover's
            return capacities
        why = (f"held after the scheduler took over: it waits for the {len(self._awaited)} clusters reachable "
               f"before to reconnect, until {self._until:%H:%M:%S} UTC at most")
        return [c if c.state.unavailable else replace(c, state=replace(c.state, unavailable=why)) for c in capacities]


def awaited(rows: list, since: datetime, unreachable_after_s: float) -> frozenset[str]:
    """The clusters reachable when the store last heard from an agent before `since`: those heard from within
    `unreachable_after_s` of that last report, and not since."""
    before = [r for r in rows if r.last_seen_at is not None and r.last_seen_at < since]
    if not before:
        return frozenset()
    newest = max(r.last_seen_at for r in before)
    return frozenset(r.name for r in before if (newest - r.last_seen_at).total_seconds() <= unreachable_after_s)
