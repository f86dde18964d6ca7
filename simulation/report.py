"""Decision-quality figures of one simulated run: waits, completion, bounded slowdown, utilization, fair share.

Pure: outcomes in, dicts and text out. Times are seconds of virtual time (the trace's, first submit at 0);
amounts are Sluice milli-units. Every figure that has nothing to be computed from (no job finished, say)
is None, never NaN, so the JSON stays valid.

How a job's time is read from its JobOutcome: it waited from submit_s to start_s (its first start). A job
that waited before it was queued (startAfter, dependencies, a slot of its array) arrives at submit_s when
its holds ended: the scheduler is not answerable for the time before, and every figure (waits,
completion, slowdown, fair share's waiting work) counts from then; `held` and `held_s` say what it waited
for and how long. Its
`runs`, when given, are every attempt's hold of its requests, those cut short by preemption included:
the queue's share counts them all, and between one run's end and the next start its work waits again.
Without them, its last run, the one that finished, held its requests over [max(start_s, end_s - run_s),
end_s], and runs cut short by preemption are not counted as use (pass `busy` to policy_figures to count
them in utilization).

Queue shares are shares of dominant-resource seconds, as Sluice's fair share is dominant-resource based
(dispatcher/policy/quotas.py): a job holding requests R for t seconds counts max over resources r of
R[r] / capacity[r], times t. With one resource kind (cpu for SWF, GPUs for Philly) this is its share of
that resource's seconds.
"""
from __future__ import annotations

import bisect
import functools
import json
import math
import operator
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["JobOutcome", "policy_figures", "window_shares", "fair_share_violations", "busy_from_outcomes",
           "render_table", "to_json", "format_seconds", "BOUNDED_SLOWDOWN_FLOOR_S"]

_HELD = (("time", "startAfter"), ("dependencies", "dependencies"), ("array", "array"))  # holding.HOLDS: JSON keys
BOUNDED_SLOWDOWN_FLOOR_S = 10.0  # the literature's threshold: jobs shorter than this count as this long
_WAITING_EPSILON_S = 1e-6  # float sums over a window may fall short of its length by rounding


@dataclass
class JobOutcome:
    id: int
    queue: str
    submit_s: float
    start_s: float | None  # its first start; None: never started
    end_s: float | None  # when it finished; None: it did not (unrunnable, or still waiting or running at the end)
    run_s: float  # its work: how long it runs undisturbed (the trace's run time, unless cut short by a limit)
    # ... and, without `runs`, how long its finishing run took
    requests: dict[str, int]  # the whole job's requests, milli-units
    cluster: str | None = None  # where it ran last
    preemptions: int = 0
    unrunnable: str | None = None  # why it could never run anywhere (too big for every cluster, say)
    runs: tuple[tuple[float, float], ...] = ()  # every attempt's (start, end); (): the finishing run only
    held: str | None = None  # what it waited for last before it was queued: time, dependencies or array
    held_s: float = 0.0  # how long it waited before it was queued (its trace submit is submit_s - held_s)


# -- the run's figures -------------------------------------------------------------------------------

def policy_figures(outcomes: Iterable[JobOutcome], *, capacity: dict[str, int], entitled: dict[str, float],
                   busy: list[tuple[float, dict[str, int]]] | None = None,
                   capacity_over_time: list[tuple[float, dict[str, int]]] | None = None) -> dict:
    """The figures of one policy's run, camelCase keys (see the module docstring for how times are read).

    capacity: the total of every cluster, milli-units. entitled: each queue's entitled fraction of the whole
    (0 to 1; every queue of the outcomes must have one). busy: what was in use over time, as a step function
    [(time, amounts in use from then on)], sorted by time; when given, utilization counts it (including runs
    lost to preemption), else the finishing runs of the outcomes. capacity_over_time: what the clusters had
    over time, as the same step function (elastic clusters grow and shrink); utilization is then of it.

    - waits (start - submit) are over the jobs that started; percentiles are nearest-rank (the smallest
      wait at least p % of waits are at or below); completion (end - submit, the JCT) and slowdown are over
      the jobs that finished.
    - boundedSlowdown: mean over finished jobs of max(1, (end - submit) / max(run, 10 s)) -- the average
      bounded slowdown with a 10 s threshold of Feitelson, Rudolph, Schwiegelshohn, Sevcik and Wong,
      "Theory and practice in parallel job scheduling" (JSSPP 1997), and Feitelson, "Metrics for parallel
      job scheduling and their convergence" (JSSPP 2001); end - submit is the paper's wait + run.
    - utilization: resource-seconds used / (capacity x makespan, or the capacity-seconds over the
      makespan) of the resource kind in `capacity` whose figure is highest (the bottleneck: cpu for an SWF
      trace, nvidia.com/gpu for Philly), named in utilizationResource.
    - queues: per queue, share (its fraction of all dominant-resource seconds used), entitledShare, mean
      wait and job count.
    - heldJobs: how many jobs waited before they were queued, by what they waited for last (startAfter,
      dependencies, array: a slot of their array), and meanHeldSeconds, their mean time so held.
    """
    outcomes = list(outcomes)
    _check_capacity(capacity)
    queues = sorted({o.queue for o in outcomes} | set(entitled))
    _check_entitled(entitled, {o.queue for o in outcomes})
    for outcome in outcomes:
        _check_outcome(outcome)
    finished = [o for o in outcomes if o.end_s is not None]
    started = [o for o in outcomes if o.start_s is not None]
    waits = sorted(o.start_s - o.submit_s for o in started)
    first_submit = min((o.submit_s for o in outcomes), default=None)
    last_end = max((o.end_s for o in finished), default=None)
    makespan = None if last_end is None else last_end - first_submit
    unrunnable = Counter(o.unrunnable for o in outcomes if o.unrunnable is not None)
    waited = [o for o in outcomes if o.held is not None]
    held_by = Counter(o.held for o in waited)

    if busy is not None:
        used = _busy_resource_seconds(busy, first_submit or 0.0, last_end or 0.0)
    else:
        used = {}
        for o in outcomes:
            held = sum(end - start for start, end in _runs(o))
            for resource, amount in o.requests.items():
                used[resource] = used.get(resource, 0.0) + amount * held
    utilization, resource = None, None
    if makespan:
        had = {r: amount * makespan for r, amount in capacity.items()} if capacity_over_time is None else \
            _busy_resource_seconds(capacity_over_time, first_submit, last_end)
        by_resource = {r: used.get(r, 0.0) / had[r] for r in sorted(capacity) if had.get(r)}
        if by_resource:  # none when no cluster had a node while jobs were there (an elastic one never grew)
            resource = max(by_resource, key=by_resource.__getitem__)  # on a tie, the first name alphabetically
            utilization = by_resource[resource]

    dominant_seconds = {q: 0.0 for q in queues}
    for o in outcomes:
        dominant_seconds[o.queue] += _dominant(o.requests, capacity) * sum(end - start for start, end in _runs(o))
    total_dominant = sum(dominant_seconds.values())
    queue_waits: dict[str, list[float]] = {q: [] for q in queues}
    for o in started:
        queue_waits[o.queue].append(o.start_s - o.submit_s)
    queue_jobs = Counter(o.queue for o in outcomes)
    per_queue = {}
    for queue in queues:
        per_queue[queue] = {
            "share": dominant_seconds[queue] / total_dominant if total_dominant else None,
            "entitledShare": entitled.get(queue),
            "meanWaitSeconds": _mean(queue_waits[queue]),
            "jobs": queue_jobs[queue],
        }
    return {
        "jobs": len(outcomes),
        "finished": len(finished),
        "unfinished": len(outcomes) - len(finished) - sum(unrunnable.values()),
        "makespanSeconds": makespan,
        "meanWaitSeconds": _mean(waits),
        "p50WaitSeconds": _nearest_rank(waits, 50),
        "p95WaitSeconds": _nearest_rank(waits, 95),
        "p99WaitSeconds": _nearest_rank(waits, 99),
        "meanCompletionSeconds": _mean([o.end_s - o.submit_s for o in finished]),
        "boundedSlowdown": _mean([max(1.0, (o.end_s - o.submit_s) / max(o.run_s, BOUNDED_SLOWDOWN_FLOOR_S))
                                  for o in finished]),
        "utilization": utilization,
        "utilizationResource": resource,
        "preemptions": sum(o.preemptions for o in outcomes),
        "unrunnable": sum(unrunnable.values()),
        "unrunnableReasons": dict(sorted(unrunnable.items())),
        "heldJobs": {key: held_by[hold] for hold, key in _HELD},
        "meanHeldSeconds": _mean([o.held_s for o in waited]),
        "queues": per_queue,
    }


def busy_from_outcomes(outcomes: Iterable[JobOutcome]) -> list[tuple[float, dict[str, int]]]:
    """What the finishing runs of the outcomes held over time, as policy_figures' `busy` step function."""
    changes: dict[float, dict[str, int]] = {}
    for o in outcomes:
        for time, sign in ((t, sign) for run in _runs(o) for t, sign in zip(run, (1, -1))):
            delta = changes.setdefault(time, {})
            for resource, amount in o.requests.items():
                delta[resource] = delta.get(resource, 0) + sign * amount
    steps: list[tuple[float, dict[str, int]]] = []
    in_use: dict[str, int] = {}
    for time in sorted(changes):
        for resource, amount in changes[time].items():
            in_use[resource] = in_use.get(resource, 0) + amount
        steps.append((time, {r: a for r, a in in_use.items() if a}))
    return steps


# -- fair share over windows -------------------------------------------------------------------------

def window_shares(outcomes: Iterable[JobOutcome], *, window_s: float = 3600, capacity: dict[str, int],
                  entitled: dict[str, float]) -> list[dict]:
    """Per window of window_s seconds from the first submit to the last event in which some job that can run
    was present (submitted, not finished: windows of an idle stretch are left out), per queue that ran or had
    work waiting in it: what share of the window's used dominant-resource seconds the queue got, and what
    it can be held to.

    A window's dict: startSeconds, endSeconds, windows, usedCapacitySeconds (dominant-resource seconds used: 1
    is the whole capacity for one second), queues: {QUEUE: {share, entitledShare, attainableShare, fairShare,
    waitingThroughout, waitingAnyTime}}. share is None in a window where nothing ran. `windows` is how many
    windows in a row the dict stands for, each with these figures: 1, or a stretch in which nothing arrived,
    started or ended (a job that runs for years), whose windows are all alike; endSeconds is the last one's end.

    A queue cannot be held to more than its own jobs could have used, nor to its entitlement while it had no
    work. Its demand in a window is, over its jobs present then (submitted, not finished; unrunnable jobs
    never count), each job's dominant share times the smaller of its run time and its time present in the
    window. Moment by moment, it is due its entitled share of what ran, or the dominant shares of all its
    jobs present then where they are less: a queue whose work arrives ten minutes before the hour ends is
    due its share of those ten minutes, not of the hour. So:
    - attainableShare = min(entitledShare, demand / used in the window, what it was due moment by moment /
      used in the window): the entitlement, capped by demand and by when the demand was there.
    - fairShare: the weighted max-min share (entitled shares as weights, each capped by its demand, what a
      queue cannot use shared among the others in proportion), i.e. what a work-conserving fair-share
      scheduler hands out when some queues are idle. While the entitled shares of the queues present sum
      to at most 1, it is never below attainableShare.
    Waiting means submitted and not yet first started (a preempted job's second wait is not visible in a
    JobOutcome); waitingThroughout is work waiting for the whole window, waitingAnyTime for any of it.
    """
    outcomes = list(outcomes)
    if not (isinstance(window_s, int | float) and math.isfinite(window_s) and window_s > 0):
        raise ValueError(f"window_s must be a positive number of seconds, got {window_s!r}")
    _check_capacity(capacity)
    _check_entitled(entitled, {o.queue for o in outcomes})
    for outcome in outcomes:
        _check_outcome(outcome)
    if not outcomes:
        return []
    origin = min(o.submit_s for o in outcomes)
    horizon = max(max(t for t in (o.submit_s, o.start_s, o.end_s, *(r[1] for r in o.runs)) if t is not None)
                  for o in outcomes)
    count = max(1, math.ceil((horizon - origin) / window_s))
    kept, repeats = _like_windows_once(outcomes, origin, window_s, count,
                                       _windows_present(outcomes, origin, window_s, count, horizon))
    queues = sorted({o.queue for o in outcomes})
    used = {q: _PerWindow(origin, window_s, count, kept) for q in queues}
    demand = {q: _PerWindow(origin, window_s, count, kept) for q in queues}
    waiting_time = {q: _PerWindow(origin, window_s, count, kept) for q in queues}
    waiting_any = {q: _PerWindow(origin, window_s, count, kept) for q in queues}
    waits: dict[str, list[tuple[float, float]]] = {q: [] for q in queues}
    for o in outcomes:
        if o.unrunnable is not None:
            continue
        size = _dominant(o.requests, capacity)
        runs = _runs(o)
        for start, end in runs:
            used[o.queue].add(start, end, lambda overlap, size=size: size * overlap)
        run = o.run_s
        demand[o.queue].add(o.submit_s, horizon if o.end_s is None else o.end_s,
                            lambda overlap, size=size, run=run: size * min(run, overlap))
        if not o.runs:  # known: it waited until its first start
            waits[o.queue].append((o.submit_s, horizon if o.start_s is None else o.start_s))
            continue
        # It waited until its first run, between runs (evicted, queued again), and after its last if unfinished.
        waited_from = o.submit_s
        for start, end in runs:
            waits[o.queue].append((waited_from, start))
            waited_from = end
        if o.end_s is None:
            waits[o.queue].append((waited_from, horizon))
    for queue, intervals in waits.items():
        for start, end in _merged(intervals):
            waiting_time[queue].add(start, end, _identity)
            waiting_any[queue].add(start, end, _one)
    totals = {q: (used[q].totals(), demand[q].totals(), waiting_time[q].totals(), waiting_any[q].totals())
              for q in queues}
    due = _due_moment_by_moment(outcomes, capacity, entitled, origin, window_s, count, horizon, kept)
    windows = []
    for k, window in enumerate(kept):
        start = origin + window * window_s
        end = min(start + window_s, horizon) if horizon > start else start + window_s  # of its first window
        used_total = sum(totals[q][0][k] for q in queues)
        present = [q for q in queues if totals[q][0][k] > 0 or totals[q][1][k] > 0 or totals[q][3][k] > 0]
        caps = {q: (totals[q][1][k] / used_total if used_total else 0.0) for q in present}
        fair = _water_fill({q: entitled[q] for q in present}, caps) if used_total else {}
        window_queues = {}
        for q in present:
            window_queues[q] = {
                "share": totals[q][0][k] / used_total if used_total else None,
                "entitledShare": entitled[q],
                "attainableShare": min(entitled[q], caps[q], due[q][k] / used_total) if used_total else None,
                "fairShare": fair.get(q) if used_total else None,
                "waitingThroughout": totals[q][2][k] >= (end - start) - _WAITING_EPSILON_S,
                "waitingAnyTime": totals[q][3][k] > 0,
            }
        windows.append({"startSeconds": start, "endSeconds": end + (repeats[k] - 1) * window_s, "windows": repeats[k],
                        "usedCapacitySeconds": used_total, "queues": window_queues})
    return windows


def _windows_present(outcomes: list[JobOutcome], origin: float, window_s: float, count: int,
                     horizon: float) -> list[tuple[int, int]]:
    """The windows in which some job that can run was present (submitted, not finished), as runs (first, last)
    of window indices, ascending and apart: only these have anything to report, and a trace with a long idle
    stretch has few of them."""
    last_of: dict[int, int] = {}  # the window a job arrived in -> the last window any job arriving then reaches
    for o in outcomes:
        if o.unrunnable is None:
            first, end = _window_of(o.submit_s, origin, window_s, count), horizon if o.end_s is None else o.end_s
            last = _window_of(end, origin, window_s, count, ending=True) if end > o.submit_s else first
            last_of[first] = max(last_of.get(first, first), last)
    runs: list[tuple[int, int]] = []
    for first in sorted(last_of):
        if runs and first <= runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], max(runs[-1][1], last_of[first]))
        else:
            runs.append((first, last_of[first]))
    return runs


def _like_windows_once(outcomes: list[JobOutcome], origin: float, window_s: float, count: int,
                       present: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """The windows to work out, of those `present`, and how many in a row each stands for. A window in which no
    time of any job falls (a submit, start, end, or run's start or end: where every interval summed per
    window begins or ends) is summed from the same intervals, each over the whole window, as the other such
    windows next to it: the first of a stretch of them is worked out and stands for all. A job present for
    years is a few entries, not one per hour."""
    eventful = {count - 1}  # the last window ends at the horizon
    for o in outcomes:
        if o.unrunnable is not None:
            continue
        for t in (o.submit_s, o.start_s, o.end_s, *(edge for run in o.runs for edge in run)):
            if t is not None:
                eventful.add(_window_of(t, origin, window_s, count))
                eventful.add(_window_of(t, origin, window_s, count, ending=True))
    marks = sorted(eventful)
    worked: list[int] = []
    repeats: list[int] = []
    for first, last in present:
        k = first
        for mark in marks[bisect.bisect_left(marks, first):bisect.bisect_right(marks, last)]:
            if mark > k:  # the stretch of like windows before it
                worked.append(k)
                repeats.append(mark - k)
            worked.append(mark)
            repeats.append(1)
            k = mark + 1
        if k <= last:
            worked.append(k)
            repeats.append(last + 1 - k)
    return worked, repeats


def _due_moment_by_moment(outcomes: list[JobOutcome], capacity: dict[str, int], entitled: dict[str, float],
                          origin: float, window_s: float, count: int, horizon: float,
                          kept: list[int]) -> dict[str, list[float]]:
    """Per queue, per window kept: the integral over the window of min(entitled share x dominant shares
    running, dominant shares of the queue's jobs present), in dominant-resource seconds (window_shares)."""
    running: list[tuple[float, float]] = []  # (time, change in the dominant shares running)
    present: dict[str, list[tuple[float, float]]] = {}
    for o in outcomes:
        if o.unrunnable is not None:
            continue
        size = _dominant(o.requests, capacity)
        for start, end in _runs(o):
            running += ((start, size), (end, -size))
        present.setdefault(o.queue, []).extend(((o.submit_s, size), (horizon if o.end_s is None else o.end_s, -size)))
    times, levels = _steps(running)
    out: dict[str, list[float]] = {}
    for queue in {o.queue for o in outcomes}:
        sums = _PerWindow(origin, window_s, count, kept)
        share = entitled[queue]
        demand_times, demand_levels = _steps(present.get(queue, []))
        # Both step functions walked together, over the moments the queue has work present only.
        i = 0
        for j, begin in enumerate(demand_times[:-1]):
            demand, end = demand_levels[j], demand_times[j + 1]
            if demand <= 0:
                continue
            i = max(i, bisect.bisect_right(times, begin) - 1)
            t = begin
            while t < end:
                following = times[i + 1] if i + 1 < len(times) else math.inf
                upto = min(end, following)
                rate = min(share * levels[i], demand) if i >= 0 else 0.0
                if rate > 0:
                    sums.add(t, upto, functools.partial(operator.mul, rate))
                t = upto
                if upto == following:
                    i += 1
        out[queue] = sums.totals()
    return out


def _steps(changes: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """A step function from its changes: the times it changes at, and its level from each of them on."""
    times: list[float] = []
    levels: list[float] = []
    level = 0.0
    for time, change in sorted(changes):
        level += change
        if times and times[-1] == time:
            levels[-1] = level
        else:
            times.append(time)
            levels.append(level)
    return times, [max(0.0, v) for v in levels]  # float sums may leave -1e-17 where nothing runs


def fair_share_violations(windows: list[dict], *, tolerance: float = 0.10, relative: bool = True,
                          against: str = "attainableShare") -> list[dict]:
    """Every (window, queue) where a queue that had work waiting at any time in the window got less than its
    due: share < due x (1 - tolerance) when relative (the default: "within 10 % of its entitled share"
    read as 10 % of that share, so a queue entitled to 5 % may not fall below 4.5 %), or share < due -
    tolerance when not (10 percentage points, which says nothing about queues entitled to less than 10 %).
    due: the queue's attainableShare (its entitlement capped by its own demand; the default) or fairShare
    (its work-conserving max-min share, stricter when other queues are idle); see window_shares.
    Windows where nothing ran are not judged. Each violation: startSeconds, endSeconds, windows (how many in a
    row, each alike: window_shares), queue, share, due.
    """
    if against not in ("attainableShare", "fairShare"):
        raise ValueError(f"against must be 'attainableShare' or 'fairShare', got {against!r}")
    if not (isinstance(tolerance, int | float) and 0 <= tolerance < (1 if relative else math.inf)):
        raise ValueError(f"tolerance must be a number from 0 to below 1, got {tolerance!r}")
    violations = []
    for window in windows:
        for queue, figures in window["queues"].items():
            share, due = figures["share"], figures[against]
            if share is None or due is None or due <= 0 or not figures["waitingAnyTime"]:
                continue
            floor = due * (1 - tolerance) if relative else due - tolerance
            if share < floor:
                violations.append({"startSeconds": window["startSeconds"], "endSeconds": window["endSeconds"],
                                   "windows": window.get("windows", 1), "queue": queue, "share": share, "due": due})
    return violations


# -- output ------------------------------------------------------------------------------------------

_ROWS = (
    ("Jobs", "jobs", "count"),
    ("Finished", "finished", "count"),
    ("Unfinished", "unfinished", "count"),
    ("Unrunnable", "unrunnable", "count"),
    ("Makespan", "makespanSeconds", "duration"),
    ("Mean wait", "meanWaitSeconds", "duration"),
    ("p50 wait", "p50WaitSeconds", "duration"),
    ("p95 wait", "p95WaitSeconds", "duration"),
    ("p99 wait", "p99WaitSeconds", "duration"),
    ("Mean completion (JCT)", "meanCompletionSeconds", "duration"),
    ("Bounded slowdown (10 s)", "boundedSlowdown", "ratio"),
    ("Utilization", "utilization", "utilization"),
    ("Preemptions", "preemptions", "count"),
    ("Reservations made", "reservations", "count"),
    ("Burst spend", "burstSpend", "money"),
    ("Hour windows short of fair share", "fairShareViolations", "count"),
    ("  of (queue, hour) judged", "fairShareJudged", "count"),
    ("Scheduling cycles", "cycles", "count"),
    ("Replay time", "replaySeconds", "duration"),
)


def render_table(trace_info: dict, figures_by_policy: dict[str, dict]) -> str:
    """One table: a column per policy, a row per figure, then the unrunnable reasons and, per queue, its
    share against its entitlement and its mean wait. Durations read like '1h 02m' (format_seconds)."""
    policies = list(figures_by_policy)
    rows: list[list[str]] = [["", *policies]]
    for label, key, kind in _ROWS:
        rows.append([label, *(_cell(figures_by_policy[p], key, kind) for p in policies)])
    if any(any(f.get("heldJobs", {}).values()) for f in figures_by_policy.values()):
        for label, key in (("Held for startAfter", "startAfter"), ("Held for dependencies", "dependencies"),
                           ("Held for an array slot", "array")):
            rows.append([label, *(f"{figures_by_policy[p].get('heldJobs', {}).get(key, 0):,}" for p in policies)])
        rows.append(["Mean held", *(_cell(figures_by_policy[p], "meanHeldSeconds", "duration") for p in policies)])
    reasons = sorted({r for f in figures_by_policy.values() for r in f.get("unrunnableReasons", {})})
    for reason in reasons:
        rows.append([f"  unrunnable: {reason}",
                     *(str(figures_by_policy[p].get("unrunnableReasons", {}).get(reason, 0)) for p in policies)])
    queues = sorted({q for f in figures_by_policy.values() for q in f.get("queues", {})})
    for queue in queues:
        shares, waits = [f"Queue {queue} share / entitled"], [f"Queue {queue} mean wait"]
        for p in policies:
            figures = figures_by_policy[p].get("queues", {}).get(queue, {})
            shares.append(f"{_percent(figures.get('share'))} / {_percent(figures.get('entitledShare'))}")
            waits.append(format_seconds(figures.get("meanWaitSeconds")))
        rows += [shares, waits]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [_trace_line(trace_info)] if trace_info else []
    for number, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
        if number == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines) + "\n"


def to_json(trace_info: dict, figures_by_policy: dict[str, dict]) -> str:
    """{"trace": trace_info, "policies": {NAME: figures}}, indented."""
    return json.dumps({"trace": trace_info, "policies": figures_by_policy}, indent=2, allow_nan=False)


def format_seconds(seconds: float | None) -> str:
    """'-' for None, else the two largest units: '42.0s', '3m 07s', '1h 02m', '2d 05h'."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    for unit, size, smaller, smaller_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if whole >= size:
            return f"{whole // size}{unit} {whole % size // smaller_size:02d}{smaller}"
    return f"{seconds:.1f}s"  # unreachable: whole >= 60 here


def _cell(figures: dict, key: str, kind: str) -> str:
    value = figures.get(key)
    if value is None:
        return "-"
    if kind == "count":
        return f"{value:,}"
    if kind == "duration":
        return format_seconds(value)
    if kind == "ratio":
        return f"{value:,.2f}"
    if kind == "money":
        return f"{value:,.2f}"
    return f"{_percent(value)} {figures.get('utilizationResource')}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _trace_line(trace_info: dict) -> str:
    shown = {k: v for k, v in trace_info.items() if k not in ("clusters", "config")}
    if "clusters" in trace_info:
        shown["clusters"] = " ".join(
            f"{name} ({nodes.get('nodes')}{' to ' + str(nodes['maxNodes']) if 'maxNodes' in nodes else ''} x "
            f"{nodes.get('node')})" for name, nodes in trace_info["clusters"].items())
    return "Trace: " + ", ".join(f"{key} {value}" for key, value in shown.items())


# -- helpers -----------------------------------------------------------------------------------------

def _check_capacity(capacity: dict[str, int]) -> None:
    if not isinstance(capacity, dict) or not capacity:
        raise ValueError(f"capacity must map resource names to amounts in milli-units, got {capacity!r}")
    bad = {r: a for r, a in capacity.items() if isinstance(a, bool) or not isinstance(a, int | float) or a <= 0}
    if bad:
        raise ValueError(f"capacity amounts must be positive milli-units: {bad}")


def _check_entitled(entitled: dict[str, float], queues: set[str]) -> None:
    missing = sorted(queues - set(entitled))
    if missing:
        raise ValueError(f"entitled has no share for queue(s) {', '.join(missing)}: give every queue's entitled "
                         f"fraction of the whole, 0 to 1")
    bad = {q: s for q, s in entitled.items()
           if isinstance(s, bool) or not isinstance(s, int | float) or not 0 <= s <= 1}
    if bad:
        raise ValueError(f"entitled shares must be fractions from 0 to 1: {bad}")


def _check_outcome(o: JobOutcome) -> None:
    if o.start_s is not None and o.start_s < o.submit_s:
        raise ValueError(f"job {o.id}: starts at {o.start_s}s, before its submit at {o.submit_s}s")
    if o.end_s is not None and o.start_s is None:
        raise ValueError(f"job {o.id}: has an end ({o.end_s}s) but no start")
    if o.end_s is not None and o.end_s < o.start_s:
        raise ValueError(f"job {o.id}: ends at {o.end_s}s, before its start at {o.start_s}s")
    if o.run_s < 0:
        raise ValueError(f"job {o.id}: negative run time {o.run_s}s")
    if o.runs:
        edges = [t for run in o.runs for t in run]
        if o.start_s is None or edges[0] != o.start_s or edges != sorted(edges) \
                or (o.end_s is not None and edges[-1] != o.end_s):
            raise ValueError(f"job {o.id}: runs {list(o.runs)} must follow one another from its first start "
                             f"({o.start_s}s) to its end ({o.end_s}s)")


def _runs(o: JobOutcome) -> tuple[tuple[float, float], ...]:
    """When the job held its requests: its runs, or, without them, its finishing run (run_s before its end,
    but never before its first start)."""
    if o.runs:
        return o.runs
    return ((max(o.start_s, o.end_s - o.run_s), o.end_s),) if o.end_s is not None else ()


def _dominant(requests: dict[str, int], capacity: dict[str, int]) -> float:
    return max((amount / capacity[r] for r, amount in requests.items() if r in capacity and amount > 0),
               default=0.0)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _nearest_rank(ordered: list[float], percent: float) -> float | None:
    """The nearest-rank percentile: the value at rank ceil(p/100 x n) of the sorted values."""
    if not ordered:
        return None
    return ordered[max(1, math.ceil(percent / 100 * len(ordered))) - 1]


def _busy_resource_seconds(busy: list[tuple[float, dict[str, int]]], start: float, end: float) -> dict[str, float]:
    """The integral of the step function over [start, end], per resource."""
    times = [time for time, _ in busy]
    if any(later < earlier for earlier, later in zip(times, times[1:])):
        raise ValueError("busy must be sorted by time: [(time, amounts in use from then on)]")
    used: dict[str, float] = {}
    for index, (time, in_use) in enumerate(busy):
        following = busy[index + 1][0] if index + 1 < len(busy) else end
        held = min(following, end) - max(time, start)
        if held > 0:
            for resource, amount in in_use.items():
                used[resource] = used.get(resource, 0.0) + amount * held
    return used


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _water_fill(weights: dict[str, float], caps: dict[str, float]) -> dict[str, float]:
    """Weighted max-min shares of 1 among the queues, none above its cap."""
    shares = {q: 0.0 for q in weights}
    open_queues = {q for q, w in weights.items() if w > 0 and caps.get(q, 0) > 0}
    left = 1.0
    while open_queues and left > 1e-12:
        total = sum(weights[q] for q in open_queues)
        capped = {q for q in open_queues if caps[q] <= left * weights[q] / total}
        if not capped:
            for q in open_queues:
                shares[q] = left * weights[q] / total
            break
        for q in capped:
            shares[q] = caps[q]
            left -= caps[q]
        open_queues -= capped
    return shares


def _identity(overlap: float) -> float:
    return overlap


def _one(overlap: float) -> float:
    return 1.0


def _window_of(time: float, origin: float, width: float, count: int, *, ending: bool = False) -> int:
    """The index of the window a time falls in (the one an interval ending then ends in, if `ending`)."""
    k = math.ceil((time - origin) / width) - 1 if ending else int((time - origin) // width)
    return min(count - 1, max(0, k))


class _PerWindow:
    """Sums a function of each interval's overlap with each window: O(1) per interval, whatever it spans.

    `kept`: the indices of the only windows to keep, ascending (default: all `count`); an interval added must
    lie within a run of kept windows (window_shares keeps those in which some job was present)."""

    def __init__(self, origin: float, width: float, count: int, kept: list[int] | None = None):
        self.origin, self.width, self.count = origin, width, count
        self.position = None if kept is None else {k: i for i, k in enumerate(kept)}
        size = count if kept is None else len(kept)
        self.direct = [0.0] * size
        self.spread = [0.0] * (size + 1)  # differences: the full windows strictly inside an interval

    def add(self, start: float, end: float, of_overlap) -> None:
        if end <= start:
            return
        first = _window_of(start, self.origin, self.width, self.count)
        last = _window_of(end, self.origin, self.width, self.count, ending=True)
        if first == last:
            self.direct[self._at(first)] += of_overlap(end - start)
            return
        at_first, at_last = self._at(first), self._at(last)
        self.direct[at_first] += of_overlap(self.origin + (first + 1) * self.width - start)
        self.direct[at_last] += of_overlap(end - (self.origin + last * self.width))
        if last > first + 1:
            full = of_overlap(self.width)
            self.spread[at_first + 1] += full
            self.spread[at_last] -= full

    def _at(self, k: int) -> int:
        return k if self.position is None else self.position[k]

    def totals(self) -> list[float]:
        """Per window kept, in order."""
        out, running = [], 0.0
        for k in range(len(self.direct)):
            running += self.spread[k]
            out.append(self.direct[k] + running)
        return out
