"""The scheduling cycle on Postgres: `PostgresCycle` serves scheduler.cycle's CycleStore from one transaction,
and `run_cycle` runs one cycle in it, as the leader does."""
from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import TYPE_CHECKING

from dispatcher.capacity import snapshot
from dispatcher.policy.planning import ActiveNeeds
from dispatcher.policy.plans import Active, CyclePlan, Dispatched, Hold
from dispatcher.scheduler import stored_policy
from dispatcher.scheduler.cycle import CycleInputs, CycleResult, Heads, plan_and_apply
from dispatcher.scheduler.mapping import PolicyConfig, active_from_rows, heads_from_rows
from dispatcher.scheduler.parking import Parking
from dispatcher.scheduler.settings import SchedulerSettings
from dispatcher.scheduler.takeover import Takeover
from dispatcher.services import budgets, reporting
from dispatcher.store import cycle_reads, database, lifecycle
from sluice.quantity import add

if TYPE_CHECKING:
    from dispatcher.store.database import Session, Sessions

LEADER_LOCK = 7302  # the advisory lock key the scheduling leader holds


class LostLeadership(Exception):
    pass


class PostgresCycle:
    """A CycleStore over one transaction of `session`. With `leader_pid`, its first reads check that this
    backend still holds the leader lock (LostLeadership otherwise), so a deposed leader commits nothing.
    With `takeover`, the leader's term: no cluster's lease counts the silence before it began
    (reporting.expire_leases), and no job starts while the term's wait lasts (scheduler/takeover.py)."""

    def __init__(self, session: Session, settings: SchedulerSettings, config: PolicyConfig,
                 leader_pid: int | None = None, takeover: Takeover | None = None):
        self._session, self._settings, self._config, self._leader_pid = session, settings, config, leader_pid
        self._takeover = takeover
        self._heads_read: list | None = None

    def inputs(self, now: datetime, *, all_heads: bool) -> CycleInputs:
        session, settings = self._session, self._settings
        # One round trip: the in-flight sums and the cluster rows, what runs per queue, (when every queue
        # will be planned, as while jobs keep starting) the heads of every queue, and leader fencing.
        reads = cycle_reads.first_reads(
            session, heads_per_queue=settings.per_queue if all_heads else None,
            leader=(self._leader_pid, LEADER_LOCK) if self._leader_pid is not None else None)
        if reads.leader_held is False:
            raise LostLeadership("the leader lock is no longer held")
        running, self._heads_read = reads.running, reads.heads
        # After the in-flight sums: a lease given up now is counted as in flight this once (never missed).
        takeover = self._takeover
        if reporting.expire_leases(session, now, reads.capacity.clusters,
                                   heard_since=takeover.since if takeover is not None else None):
            running = cycle_reads.active_usage(session)  # some went back to their queues
            self._heads_read = None
        capacities = snapshot.read(session, now, unreachable_after_s=settings.unreachable_after_s,
                                   staleness_s=settings.prometheus_staleness_s, read=reads.capacity)
        if takeover is not None:
            capacities = takeover.hold(capacities, reads.capacity.clusters, now)
        policy = stored_policy.refresh(self._config, session, reads.digest)
        # What runs counts in its queue's usage, summed in Postgres; the cycle sees one by one only the
        # attempts it may need (planning.active_needs): the victims only once a search for them starts.
        usage: dict[str, dict[str, int]] = {}
        for r in running:
            usage[r.queue] = add(usage.get(r.queue, {}), r.requests, r.jobs)
        spend = budgets.spend(session, now) if policy.rules else {}
        history = stored_policy.decayed_history(session, now, policy.quotas)
        return CycleInputs(policy, tuple(capacities), usage, spend, history)

    def heads(self, now: datetime, queues: list[str] | None, deeper: frozenset[str] = frozenset()) -> Heads:
        settings = self._settings
        rows = self._heads_read if self._heads_read is not None and queues is None else \
            cycle_reads.queue_heads(self._session, settings.per_queue, queues)
        deeper = sorted(deeper if queues is None else deeper.intersection(queues))
        if deeper:  # a second read for them (rare: it takes room no head of theirs could use)
            rows = [r for r in rows if r[1] not in deeper] + \
                cycle_reads.queue_heads(self._session, settings.backfill_per_queue, deeper)
        avoid = cycle_reads.recently_unschedulable(self._session, [r[0] for r in rows if r[11] > 0],
                                                   self._settings.avoid_unschedulable_s)
        by_queue, reasons = heads_from_rows(rows, now.timestamp(), avoid)
        return Heads(by_queue, reasons, dict(Counter(r[1] for r in rows)), bool(avoid))

    def active(self, needs: ActiveNeeds, *, victims: bool) -> list[Active]:
        # Where the cycle may search for victims on clusters that name their nodes, with the victims' nodes (the
        # expected ends read first may be victims too).
        nodes = needs.victims and needs.named
        if victims:
            rows = cycle_reads.active_attempts(self._session, clusters=needs.clusters, preemptible=needs.preemptible,
                                               below=needs.below, queues=needs.queues, nodes=nodes)
        else:
            rows = cycle_reads.active_attempts(self._session, clusters=needs.clusters, timed=True, nodes=nodes)
        return active_from_rows(rows, self._config.classes)

    def dispatch_ahead(self, clusters: list[str]) -> lifecycle.DispatchAhead:
        return lifecycle.DispatchAhead(self._session, clusters)

    def preempt(self, plan: CyclePlan) -> int:
        return sum(reporting.preempt(self._session, p.victim, p.by, p.cluster) for p in plan.preemptions)

    def finish(self, plan: CyclePlan, sent: int, reasons: dict[int, str]) -> list[Dispatched]:
        """The reasons, the places not sent ahead and, when the cycle began its transaction (not a caller's,
        joined), the COMMIT, in one round trip."""
        rest = plan.places[sent:]
        return lifecycle.dispatch(self._session, [(p.job_id, p.cluster) for p in rest],
                                  {p.job_id: plan.bursts[p.job_id].record() for p in rest if p.job_id in plan.bursts},
                                  reasons=reasons, commit=database.owns_transaction(self._session),
                                  avoid_nodes={p.job_id: p.avoid_nodes for p in rest if p.avoid_nodes})


def run_cycle(sessions: Sessions, settings: SchedulerSettings, now: datetime, *,
              holds: dict[int, Hold] | None = None, write_reasons: bool = True,
              leader_pid: int | None = None, config: PolicyConfig | None = None,
              parking: Parking | None = None, deeper: frozenset[str] = frozenset(),
              refill: frozenset[str] = frozenset(), takeover: Takeover | None = None) -> CycleResult:
    """One scheduling cycle on Postgres, in one transaction. With leader_pid, it commits only while that
    backend holds the leader lock; takeover, that leader's term (PostgresCycle). With `parking`, queues
    whose heads cannot start are left out while nothing changes for them. `deeper` and `refill`: as
    plan_and_apply takes them."""
    config = config if config is not None else PolicyConfig()
    try:
        with sessions.begin() as session:
            return plan_and_apply(PostgresCycle(session, settings, config, leader_pid, takeover), settings, now,
                                  holds=holds, write_reasons=write_reasons, parking=parking, deeper=deeper,
                                  refill=refill)
    except BaseException:
        if parking is not None:
            parking.touch()  # the commit failed: plan every queue next time
        raise
