"""Jobs that wait before they are queued: for a time (startAfter), for other jobs (dependsOn), for a slot of
their array (its parallelism). Pure: the store reads the facts; these functions say what a waiting job
waits for next, whether a dependency is met or can no longer be, and the words its user reads.

A WAITING job waits for one thing at a time, in the order of HOLDS: its time first, then its
dependencies, then its array's slot; once none is left it is QUEUED, and only then does any scheduling
cycle read it. A dependency that can no longer be met fails the job (FAILED, with a reason that graph the
dependency); dependants of a job failed so fail in turn.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from dispatcher.policy import states
from sluice.spec import CONDITIONS

TIME, DEPENDENCIES, ARRAY = "time", "dependencies", "array"
HOLDS = (TIME, DEPENDENCIES, ARRAY)
__all__ = ["CONDITIONS", "HOLDS", "next_hold", "met", "waiting_reason", "failed_reason", "cycle_in"]
_WANTS = {"succeeded": "to succeed", "failed": "to fail", "finished": "to finish"}


def next_hold(*, after: str | None, start_after: datetime | None, now: datetime, unmet: bool,
              array_limited: bool) -> str | None:
    """What a job waits for once its hold `after` is over (None: what it waits for at first), or None:
    nothing, it is queued. unmet: some of its dependencies are not met yet; array_limited: it is an element
    of an array with a parallelism, whose slot it takes only once its other holds are over."""
    start = 0 if after is None else HOLDS.index(after) + 1
    for hold in HOLDS[start:]:
        if (hold == TIME and start_after is not None and start_after > now
                or hold == DEPENDENCIES and unmet or hold == ARRAY and array_limited):
            return hold
    return None


@dataclass(frozen=True)
class Target:
    """What a dependency's job has done: its state, or an array's, summed over its elements."""

    job_id: int
    state: str  # a job's state; for an array, a final state once every element ended, else RUNNING
    failed: bool  # it (or any of the array's elements) ended other than SUCCEEDED
    array: bool = False


def array_target(array_id: int, counts: dict[str, int]) -> Target:
    """An array as one dependency's target, from the number of its elements in each state."""
    failed = any(counts.get(s) for s in states.FINAL - {states.SUCCEEDED})
    ended = not any(n for state, n in counts.items() if state not in states.FINAL)
    return Target(array_id, (states.FAILED if failed else states.SUCCEEDED) if ended else states.RUNNING,
                  failed, array=True)


def met(condition: str, target: Target) -> bool | None:
    """Whether a dependency on `target` is met (True), can no longer be (False), or not yet known (None).
    `failed` is met by a job that ended FAILED or CANCELLED; an array has succeeded when every element has,
    and cannot any more once one has not."""
    if condition == "succeeded" and target.failed:
        return False
    if target.state not in states.FINAL:
        return None
    if condition == "succeeded":
        return True
    if condition == "failed":
        return target.failed
    return True  # finished


def waiting_reason(hold: str, *, start_after: datetime | None = None, unmet: Iterable[tuple[int, str]] = (),
                   array_id: int | None = None, parallelism: int | None = None) -> str:
    """The reason a waiting job shows: 'waiting until 2026-12-01T03:00:00Z', 'waiting for job 12 to
    succeed', 'waiting for a slot of array 41 (10 at once)'. unmet: (job id, condition) of its dependencies
    not met yet."""
    if hold == TIME:
        return f"waiting until {start_after.isoformat().replace('+00:00', 'Z')} (startAfter)"
    if hold == DEPENDENCIES:
        unmet = sorted(unmet)
        if not unmet:
            return "waiting for its dependencies"
        job_id, condition = unmet[0]
        more = f" (and {len(unmet) - 1} more)" if len(unmet) > 1 else ""
        return f"waiting for job {job_id} {_WANTS[condition]}{more}"
    return f"waiting for a slot of array {array_id} ({parallelism} at once)"


def failed_reason(target: Target, condition: str) -> str:
    """Why a job fails when a dependency can no longer be met."""
    what = f"array {target.job_id}" if target.array else f"job {target.job_id}"
    ended = "had an element that did not succeed" if target.array and target.failed else f"ended {target.state}"
    return f"dependency {what} {ended}; this job needed it {_WANTS[condition]}"


def cycle_in(graph: dict[int, list[int]]) -> list[int] | None:
    """A cycle in a graph of jobs (each job's dependencies), as the jobs along it with the first repeated at
    the end; None if there is none."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path: list[str] = []
        on_path: set[str] = set()
        stack = [(start, iter(sorted(graph.get(start, ()))))]
        path.append(start)
        on_path.add(start)
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
            elif child in on_path:
                return path[path.index(child):] + [child]
            elif child not in done:
                stack.append((child, iter(sorted(graph.get(child, ())))))
                path.append(child)
                on_path.add(child)
    return None
