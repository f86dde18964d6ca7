"""The scheduling cycle's store (scheduler.cycle.CycleStore) served from a simulated World.

`plan_and_apply` runs here exactly as `sluice dispatcher serve` runs it on Postgres: the same inputs
(policy, capacities, usage per queue, burst spend), the same heads (the first `per_queue` queued jobs of
each queue in queue order, `backfill_per_queue` where the last cycle said to read deeper), the same
active attempts, and the plan's dispatches, preemptions and reasons carried out, on the World instead
of in a transaction.

A cycle's dispatches reach each cluster in the order the agent gets them, not in the plan's: each
dispatch statement (lifecycle.dispatch, and each part DispatchAhead sends) writes its outbox commands in
job id order, the agent creates the attempts in command order, and a cluster binds pods first fit in
creation order. With several jobs per node that order decides which of them start and which wait.
"""
from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from dispatcher.policy import bursting
from dispatcher.policy.decay import DecayedUsage
from dispatcher.policy.planning import ActiveNeeds, needed
from dispatcher.policy.plans import DISPATCH_PART, Active, Candidate, CyclePlan, Dispatched
from dispatcher.policy.quotas import QuotaTree
from dispatcher.scheduler.cycle import CycleInputs, Heads
from dispatcher.scheduler.mapping import PolicyConfig
from dispatcher.scheduler.settings import SchedulerSettings
from simulation.world import SimJob, World

DAY_S = 86_400.0


class NoSink:
    """Places are carried out by finish(), all at once: nothing is sent while the plan is made. It notes
    where DispatchAhead would have cut the plan's places into parts (each part, and the rest, is one
    dispatch statement, whose commands go out in job id order)."""

    sent = 0

    def __init__(self):
        self.parts: list[int] = []  # the end of each part DispatchAhead would have sent

    def placed(self, places, bursts) -> None:
        if len(places) - (self.parts[-1] if self.parts else 0) >= DISPATCH_PART:
            self.parts.append(len(places))

    def end(self) -> list[Dispatched]:
        return []

    def close(self) -> None:
        pass


def agent_order(places: list, parts: list[int]) -> list:
    """The places in the order their clusters get them: part by part, each in job id order."""
    out, begin = [], 0
    for end in [*parts, len(places)]:
        out += sorted(places[begin:end], key=lambda p: p.job_id)
        begin = end
    return out


class MemoryCycle:
    """A CycleStore over a World, for one replay. `epoch`: the epoch seconds of virtual time 0."""

    def __init__(self, world: World, policy: PolicyConfig, settings: SchedulerSettings, epoch: float):
        self.world, self.policy, self.settings, self.epoch = world, policy, settings, epoch
        self.jobs: dict[int, SimJob] = {}
        self.bursts: list[bursting.BurstRun] = []  # every burst dispatched, for the budgets
        self.burst_of: dict[int, int] = {}  # job -> its index in bursts while it runs there
        self.spent = 0.0
        # Per queue, the heads the last cycle that planned it read (a cycle may plan some queues only): those
        # the loop's next cycles would read, as nothing left them but what a cycle planned.
        self.last_heads: dict[str, list[SimJob]] = {}
        self.now = 0.0  # the virtual time of the cycle being run (set by the replay before each cycle)
        # Fair share's memory (a root Queue's usageHalfLife): one accumulator per half-life, over its queues,
        # advanced by what each queue held since the last cycle (_held), as the store sums attempts.
        tree = QuotaTree(policy.quotas, {})
        self._decayed: list[tuple[DecayedUsage, set[str]]] = []
        for half_life in sorted({h for q in policy.quotas if (h := tree.half_life(q.name))}):
            queues = {q.name for q in policy.quotas if tree.half_life(q.name) == half_life}
            self._decayed.append((DecayedUsage(half_life), queues))
        self._held: dict[str, dict[str, int]] = {}
        self._sink = NoSink()  # the running cycle's

    def _t(self, now: datetime) -> float:
        return now.timestamp() - self.epoch

    def inputs(self, now: datetime, *, all_heads: bool) -> CycleInputs:
        world = self.world
        capacities = tuple(c.capacity() for c in world.clusters.values())
        usage = {q: u for q, u in world.usage.items() if any(u.values())}
        spend = {}
        if self.policy.rules:
            self._burst_starts()
            t = now.timestamp()
            spend = bursting.committed(self.bursts, t - (t - self.epoch) % DAY_S, t)
        history: dict[str, dict[str, float]] = {}
        for decayed, queues in self._decayed:
            decayed.advance(self._t(now), {q: u for q, u in self._held.items() if q in queues})
            history.update((q, v) for q, v in decayed.history().items() if q in queues and any(v.values()))
        return CycleInputs(self.policy, capacities, usage, spend, history)

    def heads(self, now: datetime, queues: list[str] | None, deeper: frozenset[str] = frozenset()) -> Heads:
        t = self._t(now)
        by_queue: dict[str, list[Candidate]] = {}
        reasons: dict[int, str] = {}
        per_queue: dict[str, int] = {}
        read: dict[str, list[SimJob]] = {} if queues is None else self.last_heads
        settings = self.settings
        for queue in (self.world.queued if queues is None else queues):
            jobs = read[queue] = self.world.heads(queue, settings.backfill_per_queue if queue in deeper
                                                  else settings.per_queue)
            if not jobs:
                continue
            per_queue[queue] = len(jobs)
            by_queue[queue] = [Candidate(j.as_queued(), queue, j.service_class, j.class_priority, j.priority,
                                         t - j.submit, j.preempted_by) for j in jobs]
            for j in jobs:
                reasons[j.id] = j.reason
        self.last_heads = read
        return Heads(by_queue, reasons, per_queue, False)

    def active(self, needs: ActiveNeeds, *, victims: bool) -> list[Active]:
        return [a for a in self.world.actives.values() if needed(a, needs, victims=victims)]

    def dispatch_ahead(self, clusters: list[str]) -> NoSink:
        self._sink = NoSink()
        return self._sink

    def preempt(self, plan: CyclePlan) -> int:
        t = self.now
        for p in plan.preemptions:
            victim = self.world.running.get(p.victim)
            if victim is None or victim.cluster != p.cluster:
                continue
            victim.preemptions += 1
            victim.preempted_by = p.by
            victim.reason = f"preempted by job {p.by}"
            self._burst_ended(victim, t)
            self.world.stop(victim, t, requeue=True)
        return len(plan.preemptions)

    def finish(self, plan: CyclePlan, sent: int, reasons: dict[int, str]) -> list[Dispatched]:
        jobs = self.jobs
        for job_id, reason in reasons.items():
            jobs[job_id].reason = reason
        t = self.now
        at = datetime.fromtimestamp(self.epoch + t, UTC)
        out = []
        for place in agent_order(plan.places[sent:], self._sink.parts):
            job = jobs[place.job_id]
            job.reason = ""
            started = self.world.dispatch(job, place.cluster, t, place.avoid_nodes)
            burst = plan.bursts.get(job.id)
            if burst is not None:  # it costs from its start, which a gang waiting for nodes has not made yet
                self.burst_of[job.id] = len(self.bursts)
                self.bursts.append(bursting.BurstRun(burst.policy, job.queue, burst.rate_per_hour,
                                                     burst.expected_cost, dict(job.requests), True,
                                                     self.epoch + t, self.epoch + t if started else None, None))
            out.append(Dispatched(job.id, job.attempt, place.cluster, 0,
                                  datetime.fromtimestamp(self.epoch + job.submit, UTC), at))
        if self._decayed:
            self._held = {q: dict(u) for q, u in self.world.usage.items()}
        return out

    def _burst_starts(self) -> None:
        """The bursts that started since they were dispatched (their gangs waited for nodes) cost from then."""
        for job_id, index in self.burst_of.items():
            run = self.bursts[index]
            if run.started_at is None and self.jobs[job_id].started is not None:
                self.bursts[index] = replace(run, started_at=self.epoch + self.jobs[job_id].started)

    def _burst_ended(self, job: SimJob, t: float) -> None:
        """The job's attempt ends now (asked before the World stops it: `job.started` is its start)."""
        index = self.burst_of.pop(job.id, None)
        if index is not None:
            started = None if job.started is None else self.epoch + job.started  # None: it never started
            run = self.bursts[index]
            self.bursts[index] = replace(run, active=False, started_at=started, finished_at=self.epoch + t)
            if started is not None:
                self.spent += run.rate * (t + self.epoch - started) / 3600.0

    def ended(self, job: SimJob, t: float) -> None:
        """The replay's note that a job finishes now, before the World stops it (its burst stops costing)."""
        self._burst_ended(job, t)
