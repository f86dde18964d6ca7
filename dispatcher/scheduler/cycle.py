"""One scheduling cycle: read its inputs, ask the pure policy (policy/planning.py) for a plan, carry it out.

A cycle reads `now` once. Everything it reads and writes goes through a `CycleStore`, of which there are
two: `postgres_cycle.PostgresCycle` serves it in production, in one transaction per cycle (dispatches,
preemptions, their events and outbox commands, pending reasons, then COMMIT); simulation.memory_cycle serves
it from a simulated world, so that a replay runs the very code production runs. Nothing here touches the
store. The inputs come back as one typed object (`CycleInputs`) from which parking's key is computed, so an
input added to it cannot be left out of that comparison.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Protocol

from dispatcher.capacity.usable import ClusterCapacity
from dispatcher.policy.placing import ClusterState
from dispatcher.policy.planning import ActiveNeeds, active_needs, plan_cycle
from dispatcher.policy.plans import Active, Candidate, CyclePlan, Dispatched, Hold
from dispatcher.scheduler.mapping import PolicyConfig
from dispatcher.scheduler.parking import Parking
from dispatcher.scheduler.settings import SchedulerSettings


@dataclass(frozen=True)
class CycleResult:
    dispatched: int
    preempted: int
    waiting: int
    seconds: float
    holds: dict[int, Hold]
    # Submit-to-dispatch seconds of the jobs dispatched for the first time (a requeued job's submit time
    # says nothing about its later waits).
    first_waits: tuple[float, ...] = ()
    dispatched_by_queue: dict[str, int] = field(default_factory=dict)  # jobs dispatched, per queue
    planned: int | None = None  # queues planned while the others stayed parked (None: every queue)
    more: bool = False  # a queue had more queued jobs than the cycle read: the next cycle may place them
    # Where the next cycle runs at once for `more`, the queues it plans (pass it back as plan_and_apply's
    # `refill`): those read to their limit that lost heads to this plan, and those whose jobs hold room. Every
    # other queue's heads were asked at this moment already, against more room than is left now.
    refill: frozenset[str] = frozenset()
    # A refill that preempted, or made, moved or gave up held room: what it changed may concern the queues it
    # left out, so the next cycle runs at once and plans every queue.
    replan: bool = False
    idle: bool = False  # it planned every queue and left no job queued (it dispatched every one it read)
    # Queues read to the limit none of whose heads started while room was left: the next cycle reads
    # settings.backfill_per_queue of them (pass it back as plan_and_apply's `deeper`); run it soon when
    # this set grew (the room is there now).
    deeper: frozenset[str] = frozenset()


@dataclass(frozen=True)
class CycleInputs:
    """What the policy's verdicts depend on besides the heads and the clock, as a cycle read them."""

    policy: PolicyConfig  # service classes, queue quotas, burst rules
    capacities: tuple[ClusterCapacity, ...]  # each cluster's usable capacity and state
    usage: dict[str, dict[str, int]]  # per queue, the requests of what runs there (and how many jobs)
    spend: dict  # burst spend against budgets
    # Per queue, decayed resource-seconds of its attempts (policy/decay.py); read only when a tree has a half-life.
    history: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def clusters(self) -> list[ClusterState]:
        return [c.state for c in self.capacities]

    def parking_key(self) -> tuple:
        """Comparable with ==: equal keys mean no verdict of a parked head can have changed. Every field
        is in it (a field without an entry in _PARKING_KEYS fails here at once)."""
        return tuple(_PARKING_KEYS[f.name](getattr(self, f.name)) for f in fields(self))


_PARKING_KEYS = {
    "policy": lambda policy: policy.digest,
    # A cluster's unavailability counts by kind, not by its text (which says for how long); an available
    # cluster's state is its own key (copying every state would cost a cycle over many clusters dearly).
    "capacities": lambda capacities: tuple(replace(c.state, unavailable=c.status) if c.state.unavailable else c.state
                                           for c in capacities),
    "usage": lambda usage: usage,  # made afresh each cycle and never changed after
    "spend": lambda spend: spend,
    # It grows every second while jobs run: compared to two significant digits, so that only a real shift replans.
    "history": lambda history: {q: {r: float(f"{v:.2g}") for r, v in amounts.items()}
                                for q, amounts in history.items()},
}


@dataclass(frozen=True)
class Heads:
    """The queued jobs a cycle plans: the first `per_queue` of each queue it reads, as candidates."""

    by_queue: dict[str, list[Candidate]]
    reasons: dict[int, str]  # each head's pending reason as stored
    per_queue: dict[str, int]  # how many were read of each queue
    avoiding: bool  # a head avoids a cluster where it recently could not start

    @property
    def count(self) -> int:
        return sum(self.per_queue.values())


class DispatchSink(Protocol):
    """Where a plan's places go while it is still being made (lifecycle.DispatchAhead in Postgres)."""

    sent: int

    def placed(self, places: list, bursts: dict) -> None: ...
    def end(self) -> list[Dispatched]: ...
    def close(self) -> None: ...


class CycleStore(Protocol):
    """What one cycle reads and writes, within one unit of work."""

    def inputs(self, now: datetime, *, all_heads: bool) -> CycleInputs: ...
    def heads(self, now: datetime, queues: list[str] | None, deeper: frozenset[str] = frozenset()) -> Heads: ...
    def active(self, needs: ActiveNeeds, *, victims: bool) -> list[Active]: ...
    def dispatch_ahead(self, clusters: list[str]) -> DispatchSink: ...
    def preempt(self, plan: CyclePlan) -> int: ...
    def finish(self, plan: CyclePlan, sent: int, reasons: dict[int, str]) -> list[Dispatched]: ...


def plan_and_apply(store: CycleStore, settings: SchedulerSettings, now: datetime, *,
                   holds: dict[int, Hold] | None = None, write_reasons: bool = True,
                   parking: Parking | None = None, deeper: frozenset[str] = frozenset(),
                   refill: frozenset[str] = frozenset()) -> CycleResult:
    """One cycle on `store`. With `parking`, queues whose heads cannot start are left out while nothing
    changes for them. `deeper`: the last cycle's CycleResult.deeper. `refill`: run at once after a cycle with
    `more` and nothing else since (no wake-up, no preemption), its CycleResult.refill: only those queues
    are planned, and any touched since."""
    started = time.perf_counter()
    dirty = parking.take() if parking is not None else None
    refilling = bool(refill) and (parking is None or dirty is not None)
    try:
        everything = not refilling and (parking is None or bool(holds) or parking.plans_all(dirty, now.timestamp()))
        inputs = store.inputs(now, all_heads=everything)
        key = inputs.parking_key()
        if refilling:
            only = sorted(refill | (dirty or set()))
        else:
            only = None if everything else parking.only(dirty, key, now.timestamp())
        heads = store.heads(now, only, deeper)
        policy, clusters, usage = inputs.policy, inputs.clusters, inputs.usage
        needs = active_needs(heads.by_queue, clusters, policy.quotas, policy.classes, usage, holds)
        active = store.active(needs, victims=False) if needs.ends else []
        # A deep backlog's places go to the store while the rest is planned.
        ahead = store.dispatch_ahead([c.name for c in clusters])
        try:
            plan = plan_cycle(heads.by_queue, active, clusters, policy.quotas, policy.classes, holds or {},
                              now.timestamp(), policy.rules, inputs.spend, usage=usage, history=inputs.history,
                              victims=(lambda: store.active(needs, victims=True)) if needs.victims else None,
                              reasons=heads.reasons, placed=ahead.placed)
            dispatched = ahead.end()
        finally:
            ahead.close()
        preempted = store.preempt(plan)
        reasons = {i: r for i, r in plan.waits.items() if heads.reasons.get(i) != r} \
            if write_reasons or plan.preemptions else {}
        dispatched += store.finish(plan, ahead.sent, reasons)
    except BaseException:
        if parking is not None:
            parking.touch()  # what this cycle took may not have been planned: plan every queue next time
        raise
    # The queues read to their limit: more may wait behind their last head.
    full = {q for q, n in heads.per_queue.items()
            if n >= (settings.backfill_per_queue if q in deeper else settings.per_queue)}
    waiting = heads.count - len(plan.places)  # the heads plan_cycle left out wait too, their reasons standing
    if parking is not None:
        # Holds kept as they came (none made, moved or given up) leave the next cycle's plan as this one's.
        # A refill left the other queues as the cycle before left them, which parked none of them.
        quiet = not (plan.places or plan.preemptions or plan.holds != (holds or {}) or needs.timed
                     or heads.avoiding or refilling)
        waiting = parking.settle(key, only, heads.by_queue, plan.waits, quiet, write_reasons, policy.classes,
                                 now.timestamp(), full, plan.holds)
    first_waits = tuple((d.dispatched_at - d.created_at).total_seconds() for d in dispatched
                        if d.attempt == 1 and d.created_at and d.dispatched_at)
    by_queue: dict[str, int] = {}
    if dispatched:
        queue_of = {c.job.id: q for q, candidates in heads.by_queue.items() for c in candidates}
        for d in dispatched:
            queue = queue_of[d.job_id]  # a cycle places only the heads it read
            by_queue[queue] = by_queue.get(queue, 0) + 1
    # Only a queue read to its limit that lost heads to this plan has new ones for the next cycle to read.
    taken = {p.job_id for p in plan.places}
    lost = {q for q in full if any(c.job.id in taken for c in heads.by_queue[q])} if taken else set()
    held = {q for q, candidates in heads.by_queue.items() if any(c.job.id in plan.holds for c in candidates)} \
        if lost and plan.holds else set()
    # A queue this cycle left out (parked, or not refilled) keeps the depth it was read to.
    read_deeper = frozenset(q for q in plan.room_behind if heads.per_queue[q] >= settings.per_queue) | \
        frozenset(q for q in deeper if q not in heads.per_queue
                  and (refilling or q in (parking.waiting if parking else ())))
    if parking is not None:
        for queue in read_deeper - deeper:  # to be planned again, deeper, though nothing else changed
            parking.touch(queue)
    deeper = read_deeper
    return CycleResult(len(dispatched), preempted, waiting, time.perf_counter() - started, plan.holds,
                       first_waits, by_queue, planned=len(heads.by_queue) if only is not None else None,
                       more=bool(lost), refill=frozenset(lost | held),
                       replan=refilling and bool(plan.preemptions or plan.holds != (holds or {})),
                       idle=only is None and not lost and len(dispatched) == heads.count, deeper=deeper)
