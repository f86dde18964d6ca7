"""Burst: whether a queued job that fits no unpaid cluster may spill to a paid (cloud) one, which, and at
what cost. Pure: the clock, the spend so far and every input are passed in.

A job bursts only when all of these hold:
- its class allows bursting (ServiceClass `burst.allowed`);
- a BurstPolicy covers its queue (or an ancestor of it) and its class, and selects the cluster
  (`clusterSelector` matches the cluster's labels, and `tier`, `site`, `name` as if they were labels);
- a trigger holds: it has waited at least T (the policy's `after`, or its class's `burst.after` when
  longer), or no start on the unpaid clusters is expected within T (from the expected ends of the
  jobs running there, each known only when the job has a maxRuntime; never, when no unpaid cluster
  could ever hold it);
- it fits the cluster now, or the headroom of an elastic one; starting there (after the provisioning
  delay) must be sooner than the expected unpaid start, when that is known;
- no budget breaks, neither the policy's nor its per-queue one: money per hour (the hourly rate of the
  policy's running bursts, this job's included), money per day (the spend of the current UTC day:
  finished bursts at their cost, running ones at no less than their expected cost, this job's expected
  cost included) and concurrent resources.
Of the clusters left the cheapest expected cost wins, then the sooner start, then the name. The decision
keeps its trigger, every alternative with its verdict, and the expected cost.

hourly rate   = Σ over resources: request (cores, GiB, GPUs) × cluster price per unit-hour × class multiplier
expected cost = hourly rate × expected hours (the job's maxRuntime; DEFAULT_EXPECTED_HOURS without one)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from dispatcher.policy.accounting import cost, resource_hours
from dispatcher.policy.placing import ClusterState, QueuedJob, allowed_on, start_delay, why_not
from sluice.quantity import add, fits, format_duration, format_quantity

DEFAULT_EXPECTED_HOURS = 1.0  # a job without maxRuntime is expected to cost this many hours
EPSILON = 1e-9  # money is compared with this tolerance, so a budget of exactly N jobs admits N


@dataclass(frozen=True)
class Budget:
    per_hour: float | None = None  # money per hour: the rate of running bursts
    per_day: float | None = None  # money per UTC day
    max_resources: dict[str, int] = field(default_factory=dict)  # concurrent, milli-units


@dataclass(frozen=True)
class BurstRule:
    """A BurstPolicy as the scheduler sees it."""

    name: str
    queues: tuple[str, ...] = ()  # () : every queue; a queue covers its descendants
    classes: tuple[str, ...] = ()  # () : every class (that allows bursting)
    selector: dict[str, str] = field(default_factory=dict)
    after_s: float = 0.0
    budget: Budget = Budget()  # the policy's total
    queue_budget: Budget = Budget()  # each queue's own, within the policy


@dataclass(frozen=True)
class Spend:
    """What a policy (or one queue under it) has committed: rate of running bursts, today's spend, resources."""

    rate: float = 0.0
    today: float = 0.0
    resources: dict[str, int] = field(default_factory=dict)

    def plus(self, rate: float, expected: float, requests: dict[str, int]) -> Spend:
        return Spend(self.rate + rate, self.today + expected, add(self.resources, requests))


@dataclass(frozen=True)
class BurstDecision:
    policy: str
    queue: str
    cluster: str
    trigger: str
    rate_per_hour: float
    expected_hours: float
    expected_cost: float
    starts_in_s: float
    alternatives: tuple[tuple[str, str], ...]  # (cluster, verdict) for every paid cluster considered
    requests: dict[str, int]

    def record(self) -> dict:
        """The JSON kept with the attempt (attempts.burst)."""
        return {"policy": self.policy, "queue": self.queue, "cluster": self.cluster, "trigger": self.trigger,
                "ratePerHour": self.rate_per_hour, "expectedHours": self.expected_hours,
                "expectedCost": self.expected_cost, "startsInSeconds": self.starts_in_s,
                "alternatives": [{"cluster": c, "verdict": v} for c, v in self.alternatives],
                "requests": dict(self.requests), "summary": self.summary()}

    def summary(self) -> str:
        return (f"burst to {self.cluster} under policy {self.policy}: {self.trigger}; "
                f"expected cost {self.expected_cost:.2f} ({self.rate_per_hour:.2f}/h)")


@dataclass(frozen=True)
class Running:
    """A job holding capacity on an unpaid cluster, with its expected end (epoch seconds) when known."""

    requests: dict[str, int]
    ends_at: float | None


def hourly_rate(requests: dict[str, int], price: dict[str, float], multiplier: float) -> float:
    return cost(resource_hours(requests, 3600.0), price, multiplier)


def covers(rule: BurstRule, queue_path: list[str], service_class: str) -> bool:
    return (not rule.queues or any(q in rule.queues for q in queue_path)) and \
        (not rule.classes or service_class in rule.classes)


def selects(rule: BurstRule, cluster: ClusterState) -> bool:
    facts = {**cluster.labels, "tier": cluster.tier, "site": cluster.site, "name": cluster.name}
    return all(facts.get(k) == v for k, v in rule.selector.items())


def unpaid_start(job: QueuedJob, clusters: list[ClusterState], running: dict[str, list[Running]],
                 now: float) -> float | None:
    """Seconds until the job is expected to fit an unpaid cluster: 0 if it fits one now, math.inf if none
    could ever hold it, None when it cannot be known: a cluster that could hold it depends on jobs whose
    end is unknown, or takes no jobs for now (unreachable, cordoned, avoided after a failed start)."""
    best = math.inf
    unknown = False
    for c in clusters:
        if c.paid or not allowed_on(job, c) or not fits(job.requests, add(c.allocatable, c.headroom)):
            continue
        if c.unavailable or c.name in job.avoid:
            unknown = True
            continue
        if why_not(job, c) is None:
            return 0.0
        free = dict(c.free)
        eta = None
        for r in sorted(running.get(c.name, []), key=lambda r: (r.ends_at is None, r.ends_at or 0.0)):
            if r.ends_at is None:
                break
            free = add(free, r.requests)
            if fits(job.requests, free):
                eta = max(0.0, r.ends_at - now)
                break
        if eta is None:
            unknown = True
        else:
            best = min(best, eta)
    return None if unknown else best


def _seconds(value: float) -> str:
    return format_duration(float(round(value)))


def _breaks(budget: Budget, spend: Spend, rate: float, expected: float, requests: dict[str, int],
            who: str) -> str | None:
    if budget.per_hour is not None and spend.rate + rate > budget.per_hour + EPSILON:
        return (f"would break {who} budget per hour ({spend.rate:.2f}/h running + {rate:.2f}/h "
                f"> {budget.per_hour:.2f}/h)")
    if budget.per_day is not None and spend.today + expected > budget.per_day + EPSILON:
        return (f"would break {who} budget per day ({spend.today:.2f} spent today + {expected:.2f} "
                f"> {budget.per_day:.2f})")
    for resource, cap in sorted(budget.max_resources.items()):
        used = spend.resources.get(resource, 0)
        need = requests.get(resource, 0)
        if need > 0 and used + need > cap:
            return (f"would break {who} maxResources {resource} ({format_quantity(resource, used)} in use + "
                    f"{format_quantity(resource, need)} > {format_quantity(resource, cap)})")
    return None


def consider(job: QueuedJob, queue: str, queue_path: list[str], service_class: str, *, allowed: bool,
             class_after_s: float | None, multiplier: float, waited_s: float, unpaid_eta_s: float | None,
             clusters: list[ClusterState], rules: list[BurstRule], spend: dict[tuple[str, str | None], Spend]
             ) -> BurstDecision | str | None:
    """The burst decision for a job that fits no unpaid cluster; or why it does not burst (a reason to
    add to its wait); or None when no paid cluster matches its placement at all (nothing to say)."""
    paid = [c for c in clusters if c.paid and allowed_on(job, c)]
    if not paid:
        return None
    if not allowed:
        return f"class {service_class} may not burst to paid clusters"
    applying = [r for r in rules if covers(r, queue_path, service_class)]
    if not applying:
        return f"no burst policy covers queue {queue} and class {service_class}"
    options: list[tuple[tuple, BurstDecision]] = []
    notes: list[str] = []
    for rule in applying:
        targets = sorted((c for c in paid if selects(rule, c)), key=lambda c: c.name)
        if not targets:
            notes.append(f"burst policy {rule.name} selects no cluster the job may use")
            continue
        after = max(rule.after_s, class_after_s or 0.0)
        if waited_s >= after:
            trigger = f"waited {_seconds(waited_s)} (policy {rule.name} bursts after {_seconds(after)})"
        elif unpaid_eta_s == math.inf:
            trigger = "no unpaid cluster could ever run it"
        elif unpaid_eta_s is not None and unpaid_eta_s > after:
            trigger = f"no on-prem start expected within {_seconds(after)} (expected in {_seconds(unpaid_eta_s)})"
        else:
            notes.append(f"may burst after waiting {_seconds(after)} (waited {_seconds(waited_s)})")
            continue
        hours = (job.max_runtime_s / 3600.0) if job.max_runtime_s else DEFAULT_EXPECTED_HOURS
        alternatives: list[tuple[str, str]] = []
        fitting = []
        for c in targets:
            rate = hourly_rate(job.requests, c.price, multiplier)
            expected = rate * hours
            delay = start_delay(job, c)
            why = why_not(job, c)
            if why is None and unpaid_eta_s is not None and delay > 0 and delay >= unpaid_eta_s:
                why = (f"would start in {_seconds(delay)} (provisioning), no sooner than on-prem "
                       f"(expected in {_seconds(unpaid_eta_s)})")
            why = why or _breaks(rule.budget, spend.get((rule.name, None), Spend()), rate, expected,
                                 job.requests, f"policy {rule.name}'s")
            why = why or _breaks(rule.queue_budget, spend.get((rule.name, queue), Spend()), rate, expected,
                                 job.requests, f"policy {rule.name}'s queue {queue}")
            if why is None:
                fitting.append(((expected, delay, c.name, rule.name), c.name, rate, expected, delay))
                why = f"fits, expected cost {expected:.2f}" + (f", starts in {_seconds(delay)}" if delay else "")
            alternatives.append((c.name, why))
        if not fitting:
            notes.append("burst refused: " + "; ".join(f"{c}: {v}" for c, v in alternatives))
        for key, cluster, rate, expected, delay in fitting:
            options.append((key, BurstDecision(rule.name, queue, cluster, trigger, rate, hours, expected, delay,
                                               tuple(alternatives), dict(job.requests))))
    if options:
        return min(options, key=lambda o: o[0])[1]
    return "; ".join(notes)


@dataclass(frozen=True)
class BurstRun:
    """A recorded burst attempt, as budgets see it (times in epoch seconds)."""

    policy: str
    queue: str
    rate: float  # money per hour while it runs
    expected: float  # its expected cost when it was dispatched
    requests: dict[str, int]
    active: bool
    dispatched_at: float
    started_at: float | None
    finished_at: float | None


def committed(runs: list[BurstRun], day_start: float, now: float) -> dict[tuple[str, str | None], Spend]:
    """What each policy, and each queue under it, has committed: the rate and resources of its active
    bursts, and the spend of the bursts dispatched since day_start (a finished one at its cost, an
    active one at no less than its expected cost)."""
    out: dict[tuple[str, str | None], Spend] = {}
    for run in runs:
        ran_h = 0.0 if run.started_at is None else max(0.0, ((run.finished_at or now) - run.started_at) / 3600.0)
        spent = run.rate * ran_h
        today = (max(spent, run.expected) if run.active else spent) if run.dispatched_at >= day_start else 0.0
        rate = run.rate if run.active else 0.0
        held = run.requests if run.active else {}
        for key in ((run.policy, None), (run.policy, run.queue)):
            out[key] = out.get(key, Spend()).plus(rate, today, held)
    return out
