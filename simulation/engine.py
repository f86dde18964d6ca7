"""A replay in virtual time: jobs arrive when the trace says, a policy decides, jobs end after their run.

Time jumps from one event to the next (an arrival, an end, a node joining or leaving an elastic cluster
(world.py), the end of a waiting job's holds (waiting.py: its startAfter, its dependencies, a slot of its
array), or a moment when a queued job's verdict can change by time alone: a reservation or burst
threshold reached, a preemption hold expiring), so a replay
costs O(decisions), not O(virtual seconds); nothing sleeps. At each moment the policy decides once the
moment's events are in. The policies:

- `sluice`: the production cycle (scheduler.cycle.plan_and_apply) on a MemoryCycle, with parking, holds,
  deeper reads and refills carried from cycle to cycle as the scheduler's loop carries them (a cycle
  run at once for the jobs behind a queue's heads plans only the queues that lost heads, and holders);
- `fifo`: strict arrival order over every queue, no backfill: the first job that does not fit stops
  everyone behind it;
- `easy-backfill`: as Slurm's backfill: the first waiting job gets a reservation at the earliest time
  the expected ends of what runs (requested run times) free enough room; a later job may start now
  when it fits and does not delay that reservation (it ends before it, or uses only room the reserved
  job will not need).

Every policy knows of a job's run time only its requested time (Sluice's maxRuntime, EASY's estimate),
and nothing where the trace gives none: EASY then counts a running job as never ending and a waiting
one as never ending before a reservation. A first job whose start no known end dates gets no
reservation, and later jobs start where they fit (as Slurm's backfill does with unlimited time limits).

The baselines use the unpaid clusters only (they know no burst policy) and the same node packing; an
elastic one grows for them as for the dispatcher (a job that starts nowhere now goes where it would once
the cluster has all its nodes).
"""
from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from dispatcher.policy.placing import TIER_ORDER, allowed_on
from dispatcher.policy.plans import PREEMPTION_HOLD_S, Hold
from dispatcher.scheduler.cycle import plan_and_apply
from dispatcher.scheduler.mapping import PolicyConfig
from dispatcher.scheduler.parking import Parking
from dispatcher.scheduler.settings import SchedulerSettings
from simulation import POLICIES
from simulation.memory_cycle import MemoryCycle
from simulation.waiting import Waiting
from simulation.world import DONE, QUEUED, UNRUNNABLE, SimCluster, SimJob, World
from sluice.objects import ClusterObject
from sluice.quantity import add, fits, subtract

EPOCH = datetime(2026, 1, 1, tzinfo=UTC).timestamp()  # virtual time 0, a Thursday midnight UTC
MAX_CYCLES_PER_MOMENT = 1_000  # a policy that keeps deciding at one moment is cut off (it would loop)
# The replay's clock stops here, about 6,300 years in: the cycle is given datetimes, which end with the year
# 9999. Each of a trace's times is at most traces.MAX_SECONDS, but jobs that run one after another add up.
CLOCK_END_S = 2e11
CLOCK_ENDED = f"the replay's clock ended {CLOCK_END_S:,.0f} s (about 6,300 years) in"


@dataclass
class Replayed:
    """What a replay leaves: every job as it ended, and the busy resources over time."""

    policy: str
    jobs: list[SimJob]
    busy: list[tuple[float, dict[str, int]]]  # (virtual time, what started jobs hold from then on)
    cycles: int
    burst_spend: float
    reservations: int
    capacity: list[tuple[float, dict[str, int]]]  # (virtual time, every cluster's allocatable from then on)


def _first(pair: tuple) -> float:
    return pair[0]


class _Sluice:
    """Sluice's own cycle, as the scheduler's loop runs it."""

    def __init__(self, world: World, policy: PolicyConfig, settings: SchedulerSettings, jobs: dict[int, SimJob]):
        self.store = MemoryCycle(world, policy, settings, EPOCH)
        self.store.jobs = jobs
        self.settings, self.policy = settings, policy
        self.parking = Parking()
        self.holds: dict[int, Hold] = {}
        self.deeper: frozenset[str] = frozenset()
        self.refill: tuple[float, frozenset[str]] = (math.nan, frozenset())  # (moment, what a rerun then plans)
        self.reserved: set[int] = set()  # jobs that ever held a reservation
        # Per queue, its last heads read and when each may start or reserve by time alone (wake).
        self._times: dict[str, tuple[list[SimJob], list[tuple[float, SimJob]]]] = {}
        self._afters: dict[str, tuple[float, ...]] = {}  # per class, those times after a submit

    def arrived(self, job: SimJob) -> bool:
        return self.parking.submitted(job.queue, job.class_priority, job.priority, job.id)

    def ended(self, job: SimJob, t: float) -> None:
        self.store.ended(job, t)

    def burst_spend(self) -> float:
        return self.store.spent

    def decide(self, t: float) -> bool:
        """One cycle at virtual time t; whether another cycle is due at once."""
        self.store.now = t
        refill = self.refill[1] if self.refill[0] == t else frozenset()
        result = plan_and_apply(self.store, self.settings, datetime.fromtimestamp(EPOCH + t, UTC),
                                holds=self.holds, parking=self.parking, deeper=self.deeper, refill=refill)
        deeper_now = bool(result.deeper - self.deeper)  # as the scheduler's loop, at once
        self.holds, self.deeper = result.holds, result.deeper
        self.reserved.update(i for i, h in result.holds.items() if h.kind == "reservation")
        more, rewake = bool(result.dispatched) and result.more, self.parking.rewake()
        # As the loop: a rerun for `more` alone plans the queues that lost heads (and holders) only.
        again = bool(result.preempted) or deeper_now or rewake or result.replan  # these plan every queue next
        self.refill = (t, result.refill if more and not again else frozenset())
        return more or again

    def wake(self, t: float) -> float:
        """The next moment a waiting head's verdict may change by time alone (math.inf: none)."""
        due = math.inf
        for queue, heads in self.store.last_heads.items():
            times = self._times.get(queue)
            if times is None or times[0] is not heads:  # read again since: its heads' times afresh
                times = self._times[queue] = (heads, self._thresholds(heads))
            at = times[1]
            for i in range(bisect.bisect_right(at, t, key=_first), len(at)):
                if at[i][1].state == QUEUED:  # the first of a head still waiting
                    due = min(due, at[i][0])
                    break
        for hold in self.holds.values():
            if hold.kind == "preemption":
                due = min(due, hold.since - EPOCH + PREEMPTION_HOLD_S)
        # A parked head's reservation time that came during a refill (which plans some queues only): the
        # leader's loop, which runs a cycle every idle_wait_s, plans every queue at its next one.
        if self.parking.until - EPOCH <= t:
            due = min(due, t + self.settings.idle_wait_s)
        return due if due > t else math.inf

    def _thresholds(self, heads: list[SimJob]) -> list[tuple[float, SimJob]]:
        """When each head's class or a burst rule may start it, or reserve for it, sorted."""
        classes, rules = self.policy.classes, [rule.after_s for rule in self.policy.rules]
        out = []
        for job in heads:
            afters = self._afters.get(job.service_class)
            if afters is None:
                cls = classes.get(job.service_class)
                every = rules + ([cls.reservation_after_s, cls.burst_after_s] if cls is not None else [])
                afters = self._afters[job.service_class] = tuple(a for a in every if a is not None)
            out += ((job.submit + after, job) for after in afters)
        out.sort(key=_first)
        return out


class _Fifo:
    """Strict arrival order, no backfill."""

    def __init__(self, world: World):
        self.world = world
        self.waiting: list[SimJob] = []  # arrival order
        self.clusters = sorted((c for c in world.clusters.values() if not c.paid),
                               key=lambda c: (TIER_ORDER.get(c.obj.tier, 9), c.name))
        self.reserved: set[int] = set()

    def arrived(self, job: SimJob) -> bool:
        self.waiting.append(job)
        return True

    def ended(self, job: SimJob, t: float) -> None:
        pass  # nothing it decided depends on an end but the room, which decide() reads

    def burst_spend(self) -> float:
        return 0.0  # the baselines know no burst policy

    def _where(self, job: SimJob) -> SimCluster | None:
        """The first cluster the job starts on now, else the first elastic one it starts on once grown."""
        for c in self.clusters:
            if fits(job.requests, c.free) and c.pack(job) is not None:
                return c
        return next((c for c in self.clusters if c.grows_for(job)), None)

    def decide(self, t: float) -> bool:
        while self.waiting:
            where = self._where(self.waiting[0])
            if where is None:
                break
            self.world.dispatch(self.waiting.pop(0), where.name, t)
        if self.waiting:
            self._backfill(t)
        return False

    def wake(self, t: float) -> float:
        return math.inf

    def _backfill(self, t: float) -> None:
        pass  # strict arrival order: nobody passes the first job that does not fit


class _Easy(_Fifo):
    """EASY backfill: the first waiting job's reservation is never delayed by a job started after it."""

    def _shadow(self, head: SimJob, t: float) -> tuple[SimCluster, float, dict[str, int]] | None:
        """Where and when the head can start at the earliest, by what runs' expected ends (a job with no
        requested time has none), and the room left there then beyond the head's needs; None: no known end
        frees enough room."""
        best = None
        for c in self.clusters:
            if not fits(head.requests, c.allocatable):
                continue
            ends = sorted(((j.started + j.max_runtime_s, j) for j in self.world.running.values()
                           if j.cluster == c.name and j.started is not None and j.max_runtime_s is not None),
                          key=lambda e: e[0])
            free = dict(c.free)
            when = t
            for end, j in ends:
                if fits(head.requests, free):
                    break
                free = add(free, j.requests)
                when = max(t, end)
            if not fits(head.requests, free):
                continue
            if best is None or when < best[1]:
                best = (c, when, subtract(free, head.requests))
        return best

    def _room(self) -> bool:
        """Whether any cluster has anything free (a full machine ends the scan for backfill)."""
        return any(amount > 0 for c in self.clusters for amount in c.free.values())

    def _backfill(self, t: float) -> None:
        head = self.waiting[0]
        shadow = self._shadow(head, t)
        if shadow is not None:
            self.reserved.add(head.id)
        where_now: dict[tuple, SimCluster | None] = {}  # per shape, where it would start now (until a start)
        i = 1
        while i < len(self.waiting) and self._room():
            job = self.waiting[i]
            shape = job.shape()
            if shape not in where_now:
                where_now[shape] = self._where(job)
            where = where_now[shape]
            if where is None:
                i += 1
                continue
            if shadow is not None and where is shadow[0]:
                if job.max_runtime_s is not None and t + job.max_runtime_s <= shadow[1]:
                    pass
                elif fits(job.requests, shadow[2]):
                    shadow = (shadow[0], shadow[1], subtract(shadow[2], job.requests))
                else:
                    i += 1
                    continue
            self.world.dispatch(self.waiting.pop(i), where.name, t)
            where_now.clear()


def _never_runs(job: SimJob, clusters: list[SimCluster]) -> str | None:
    """Why no cluster, even empty and with all the nodes it may have, could run the job; None if one could."""
    reasons = []
    for c in clusters:
        if not allowed_on(job.as_queued(), c.capacity().state):
            continue
        why = c.never_holds(job)
        if why is None:
            return None
        reasons.append(why)
    return "needs " + str(job.requests) + ": " + "; ".join(reasons) if reasons else "no cluster matches it"


def replay(jobs: list[SimJob], clusters: list[ClusterObject], policy: PolicyConfig, name: str, *,
           settings: SchedulerSettings | None = None, progress: Callable[[int], None] | None = None) -> Replayed:
    """Replay `jobs` (fresh SimJobs, by submit time) on `clusters` under policy `name` (one of POLICIES)."""
    settings = settings or SchedulerSettings()
    world = World(clusters, policy.classes, EPOCH)
    by_id = {j.id: j for j in jobs}
    if name == "sluice":
        strategy = _Sluice(world, policy, settings, by_id)
    elif name == "fifo":
        strategy = _Fifo(world)
    elif name == "easy-backfill":
        strategy = _Easy(world)
    else:
        raise ValueError(f"unknown policy {name!r}: one of {', '.join(POLICIES)}")
    empty = list(world.clusters.values())  # nothing has arrived yet
    for job in jobs:
        job.reason = _never_runs(job, empty) or ""
        if job.reason:
            job.state = UNRUNNABLE
    waiting = Waiting(jobs)  # the jobs that wait before they are queued; unrunnable ones fail their dependants
    arrivals = sorted((j for j in jobs if j.state == QUEUED), key=lambda j: (j.submit, j.id))
    ends: list[tuple[float, int, int]] = []  # (end time, job id, attempt)
    busy: list[tuple[float, dict[str, int]]] = [(0.0, {})]
    next_arrival, cycles, done, wake = 0, 0, 0, math.inf
    while True:
        t = min(arrivals[next_arrival].submit if next_arrival < len(arrivals) else math.inf,
                ends[0][0] if ends else math.inf, wake, waiting.next_time(), world.next_change())
        if t == math.inf or t > CLOCK_END_S:
            break
        # A moment needs a cycle when time, an end, a node joining or leaving, or a submit that is not behind
        # parked heads says so.
        due = world.change(t) or t >= wake
        while ends and ends[0][0] <= t:
            _, job_id, attempt = heapq.heappop(ends)
            job = by_id[job_id]
            if job.state == DONE or job.attempt != attempt or job.ends is None or job.ends > t:
                continue  # an attempt that was evicted, or one that starts later
            strategy.ended(job, t)
            world.stop(job, t, requeue=False)
            waiting.ended(job, t)
            done += 1
            due = True
        while next_arrival < len(arrivals) and arrivals[next_arrival].submit <= t:
            job = arrivals[next_arrival]
            job.eligible = job.submit
            world.enqueue(job)
            due = strategy.arrived(job) or due
            next_arrival += 1
        for job in waiting.due(t):  # its holds are over: it arrives in its queue now
            world.enqueue(job)
            due = strategy.arrived(job) or due
        for _ in range(MAX_CYCLES_PER_MOMENT if due else 0):
            cycles += 1
            if not strategy.decide(t):
                break
        for job in world.take_started():
            if job.ends is not None:  # not stopped again at this same moment
                heapq.heappush(ends, (job.ends, job.id, job.attempt))
        if busy[-1][1] != world.busy:
            busy.append((t, dict(world.busy)))
        wake = strategy.wake(t)
        if progress is not None:
            progress(done)
    waiting.leftover()
    clock_ended = CLOCK_END_S < t < math.inf  # what still runs then is unfinished
    for job in jobs:
        if job.state == QUEUED:
            job.state = UNRUNNABLE
            job.reason = f"never started: {CLOCK_ENDED if clock_ended else job.reason or 'nothing it waited for came'}"
    return Replayed(name, jobs, busy, cycles, strategy.burst_spend(), len(strategy.reserved), world.capacity)
