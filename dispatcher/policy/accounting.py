"""Chargeback: what the recorded attempts used and cost, per queue, service class, cluster or user.

Pure: the caller reads the attempts, the clusters' prices and the classes' multipliers, and passes the
clock in. An attempt holds its job's whole request from the moment it starts running until it ends (or,
still running, until now); only the part of that inside the report's window counts. Usage is in hours of
base units: cpu core-hours, memory GiB-hours, every other resource unit-hours (nvidia.com/gpu: GPU-hours).
Cost is, per resource, hours × the cluster's price per unit-hour (docs/api.md: memory per GiB-hour), times
the class's priceMultiplier. A resource the cluster puts no price on costs nothing.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

__all__ = ["CURRENCY", "GROUPINGS", "AttemptRun", "Window", "GroupUsage", "window", "seconds_in_window",
           "base_amount", "resource_hours", "cost", "usage"]

# docs/api.md: money is a plain number in the currency named once in the config. No setting names it yet.
CURRENCY = "USD"
GROUPINGS = ("queue", "class", "cluster", "user", "array")
NO_ARRAY = "-"  # the group, by array, of the jobs that are no array's elements
GIB = 2**30
MILLI = 1000


@dataclass(frozen=True)
class AttemptRun:
    """One attempt as accounting sees it: where it ran, for whom, holding what, from when to when."""

    queue: str
    service_class: str
    cluster: str  # where this attempt ran (a job's attempts may run in different clusters)
    user: str  # who submitted the job
    requests: Mapping[str, int]  # the whole job's request, milli-units
    started_at: datetime | None  # None: never started running, so it used nothing
    finished_at: datetime | None  # None: still running
    array: int | None = None  # the array its job is an element of

    def group(self, by: str) -> str:
        if by == "queue":
            return self.queue
        if by == "class":
            return self.service_class
        if by == "cluster":
            return self.cluster
        if by == "user":
            return self.user
        if by == "array":
            return NO_ARRAY if self.array is None else str(self.array)
        raise ValueError(f"cannot group by {by!r}; one of {', '.join(GROUPINGS)}")


@dataclass(frozen=True)
class Window:
    start: datetime | None  # None: all time
    end: datetime  # now


@dataclass(frozen=True)
class GroupUsage:
    group: str
    resource_hours: dict[str, float]  # resource -> hours of base units
    cost: float  # in CURRENCY
    attempts: int  # attempts that ran inside the window


def window(now: datetime, since_s: float | None) -> Window:
    """The last `since_s` seconds up to now; None or 0: everything up to now."""
    return Window(now - timedelta(seconds=since_s) if since_s else None, now)


def _interval(run: AttemptRun, win: Window) -> tuple[datetime, datetime] | None:
    """The part of the attempt's running time inside the window, or None when they do not meet."""
    if run.started_at is None:
        return None
    end = min(run.finished_at or win.end, win.end)
    start = run.started_at if win.start is None else max(run.started_at, win.start)
    if start > end:
        return None
    return start, end


def seconds_in_window(run: AttemptRun, win: Window) -> float:
    """Seconds the attempt ran inside the window; 0 when it never started or ran outside it."""
    found = _interval(run, win)
    return 0.0 if found is None else (found[1] - found[0]).total_seconds()


def base_amount(resource: str, milli: int) -> float:
    """An amount in the unit prices are quoted in: GiB for memory, whole units (cores, GPUs) otherwise."""
    if resource == "memory":
        return milli / MILLI / GIB
    return milli / MILLI


def resource_hours(requests: Mapping[str, int], seconds: float) -> dict[str, float]:
    """Hours of base units held by a request for `seconds`."""
    return {resource: base_amount(resource, milli) * seconds / 3600.0 for resource, milli in requests.items()}


def cost(hours: Mapping[str, float], prices: Mapping[str, float], multiplier: float = 1.0) -> float:
    """Σ hours × price per unit-hour, × the class multiplier; unpriced resources cost nothing."""
    return sum(amount * prices.get(resource, 0.0) for resource, amount in hours.items()) * multiplier


def usage(runs: list[AttemptRun], *, by: str, win: Window, prices: Mapping[str, Mapping[str, float]],
          multipliers: Mapping[str, float]) -> list[GroupUsage]:
    """Usage and cost per group, the most expensive first (then by name).

    prices: per cluster, price per unit-hour per resource (a cluster not named has no prices);
    multipliers: per service class (a class not named multiplies by 1). Groups whose attempts never ran
    inside the window are left out.
    """
    if by not in GROUPINGS:
        raise ValueError(f"cannot group by {by!r}; one of {', '.join(GROUPINGS)}")
    hours_of: dict[str, dict[str, float]] = {}
    cost_of: dict[str, float] = {}
    attempts_of: dict[str, int] = {}
    for run in runs:
        if _interval(run, win) is None:
            continue
        group = run.group(by)
        hours = resource_hours(run.requests, seconds_in_window(run, win))
        totals = hours_of.setdefault(group, {})
        for resource, amount in hours.items():
            totals[resource] = totals.get(resource, 0.0) + amount
        cost_of[group] = cost_of.get(group, 0.0) + cost(hours, prices.get(run.cluster, {}),
                                                        multipliers.get(run.service_class, 1.0))
        attempts_of[group] = attempts_of.get(group, 0) + 1
    found = [GroupUsage(g, hours_of[g], cost_of[g], attempts_of[g]) for g in hours_of]
    return sorted(found, key=lambda u: (-u.cost, u.group))
