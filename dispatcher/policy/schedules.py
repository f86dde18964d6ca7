"""When a schedule starts a job: its due times, catch-up after downtime, the concurrency policy. Pure: the clock
is a parameter and the caller carries the decision out (services/recurring.py).

Due times come from cronsim in the schedule's time zone, as Debian's cron runs them: a fixed time of day that
a clock change skips (02:30 on the night clocks go forward) is due just after the change (03:00), and one
that happens twice (02:30 on the night they go back) is due once, at its first occurrence. An expression with
`*` in the minute or hour runs by real time (every hour of a 25-hour day).

A schedule remembers the last due time it handled (`since`: started, skipped or failed). Of the due times
that passed since then, only the latest is considered, and only if it is no later than `startingDeadline`
(as a Kubernetes CronJob does): a dispatcher down through several due times starts at most one run.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cronsim import CronSim

from dispatcher.policy import states
from sluice.schedules import ScheduleSpec

_FIRST_WINDOW = timedelta(hours=1)  # how far back the latest due time is looked for first (then 4x as far)


@dataclass(frozen=True)
class Run:
    """A job a schedule started, as far as its decisions go."""

    job_id: int
    state: str

    @property
    def final(self) -> bool:
        return self.state in states.FINAL


@dataclass(frozen=True)
class Firing:
    """What to do for a schedule at `now`. due: the due time handled (the schedule's new `since`), None when
    none is; start: start a run for it; cancel: the jobs to cancel first (Replace); status: what was done or
    skipped and why, for people; next_due: the first due time after the one handled (None: never again)."""

    due: datetime | None
    start: bool
    cancel: tuple[int, ...]
    status: str
    next_due: datetime | None


@dataclass(frozen=True)
class Trigger:
    """A run started by hand: refused (why), or started after cancelling `cancel`."""

    refused: str | None
    cancel: tuple[int, ...]


def due_after(spec: ScheduleSpec, after: datetime) -> datetime | None:
    """The first due time strictly after `after` (timezone-aware), in UTC; None when there is none in 50 years."""
    it = CronSim(spec.cron, after.astimezone(spec.zone))
    try:
        return next(it).astimezone(UTC)
    except StopIteration:
        return None


def latest_due(spec: ScheduleSpec, since: datetime, now: datetime) -> datetime | None:
    """The last due time in (since, now], in UTC; None when none is. Looks back from `now` over a window that
    grows fourfold until it holds one, so a schedule down for a year costs a few steps, not a step a minute."""
    first = due_after(spec, since)
    if first is None or first > now:
        return None
    window = _FIRST_WINDOW
    while True:
        anchor = max(since, now - window)
        found = None
        it = CronSim(spec.cron, anchor.astimezone(spec.zone))
        for t in it:
            t = t.astimezone(UTC)
            if t > now:
                break
            found = t
        if found is not None:
            return found
        if anchor == since:  # unreachable: `first` is in (since, now]
            return first
        window *= 4


def local(spec: ScheduleSpec, t: datetime) -> str:
    """A due time as people read it: in the schedule's time zone, to the minute, with its UTC offset."""
    return t.astimezone(spec.zone).isoformat(timespec="minutes")


def run_name(schedule: str, due: datetime) -> str:
    """The name of the job a due time starts: `<schedule>-<due time in minutes since the epoch>`."""
    return f"{schedule}-{int(due.timestamp()) // 60}"


def active(runs: list[Run]) -> list[Run]:
    return [r for r in runs if not r.final]


def fire(spec: ScheduleSpec, since: datetime, now: datetime, runs: list[Run], *, suspended: bool = False) -> Firing:
    """The decision for a schedule whose last handled due time is `since` (its creation, before any), at
    `now`, with its recent runs (oldest first)."""
    latest = latest_due(spec, since, now)
    if latest is None or suspended:  # a suspended schedule handles nothing: resume applies the rule below
        return Firing(None, False, (), "suspended" if suspended else "", due_after(spec, since))
    notes = []
    first = due_after(spec, since)
    if first is not None and first < latest:
        before = latest_due(spec, since, latest - timedelta(seconds=1)) or first
        missed = local(spec, first) if before == first else f"{local(spec, first)} to {local(spec, before)}"
        notes.append(f"missed due times {missed} skipped (only the latest is caught up)")
    due, next_due = local(spec, latest), due_after(spec, latest)
    late = (now - latest).total_seconds()
    if spec.starting_deadline_s is not None and late > spec.starting_deadline_s:
        notes.append(f"due {due}: skipped: {late:.0f}s late, past startingDeadline "
                     f"({spec.starting_deadline_s:g}s)")
        return Firing(latest, False, (), "; ".join(notes), next_due)
    running = active(runs)
    if running and spec.concurrency_policy == "Forbid":
        notes.append(f"due {due}: skipped: {_still(running)} (concurrencyPolicy Forbid)")
        return Firing(latest, False, (), "; ".join(notes), next_due)
    cancel = tuple(r.job_id for r in running) if spec.concurrency_policy == "Replace" else ()
    started = f"due {due}: started"
    if cancel:
        started += f", replacing job {', '.join(map(str, cancel))} (concurrencyPolicy Replace)"
    notes.append(started)
    return Firing(latest, True, cancel, "; ".join(notes), next_due)


def trigger(spec: ScheduleSpec, runs: list[Run]) -> Trigger:
    """A run started now by hand, outside the due times, under the same concurrency policy."""
    running = active(runs)
    if running and spec.concurrency_policy == "Forbid":
        return Trigger(f"{_still(running)} (concurrencyPolicy Forbid)", ())
    return Trigger(None, tuple(r.job_id for r in running) if spec.concurrency_policy == "Replace" else ())


def kept(spec: ScheduleSpec, runs: list[Run]) -> list[int]:
    """The ids of the runs a schedule keeps track of, oldest first: every run not final (concurrency reads
    them), the latest successfulJobsHistoryLimit that succeeded and the latest failedJobsHistoryLimit that
    failed or were cancelled (`schedule get` lists them). Jobs themselves are never deleted."""
    keep: set[int] = set()
    succeeded = failed = 0
    for r in reversed(runs):
        if not r.final:
            keep.add(r.job_id)
        elif r.state == states.SUCCEEDED:
            succeeded += 1
            if succeeded <= spec.successful_jobs_history_limit:
                keep.add(r.job_id)
        else:
            failed += 1
            if failed <= spec.failed_jobs_history_limit:
                keep.add(r.job_id)
    return [r.job_id for r in runs if r.job_id in keep]


def _still(running: list[Run]) -> str:
    return "; ".join(f"job {r.job_id} of this schedule is still {r.state}" for r in running[:3]) + \
        (f" (and {len(running) - 3} more)" if len(running) > 3 else "")
