"""The job state machine: which changes of state are allowed. Pure; the store enforces it."""
from __future__ import annotations

WAITING, QUEUED, DISPATCHED, RUNNING = "WAITING", "QUEUED", "DISPATCHED", "RUNNING"
SUCCEEDED, FAILED, CANCELLED = "SUCCEEDED", "FAILED", "CANCELLED"
STATES = (WAITING, QUEUED, DISPATCHED, RUNNING, SUCCEEDED, FAILED, CANCELLED)
FINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
ACTIVE = frozenset({DISPATCHED, RUNNING})  # an attempt holds capacity on a cluster
# How an attempt ends besides SUCCEEDED and FAILED: an agent reports LOST or UNSCHEDULABLE; the dispatcher
# ends a preempted one (the job goes back to QUEUED) or a cancelled one (CANCELLED).
LOST, UNSCHEDULABLE, PREEMPTED = "LOST", "UNSCHEDULABLE", "PREEMPTED"
REPORTED_ENDS = frozenset({SUCCEEDED, FAILED, LOST, UNSCHEDULABLE})  # an attempt's end as its agent reports it

# A return to QUEUED starts a new attempt (lost, preempted, failed with retries left, unschedulable).
# WAITING: held until a time, other jobs or a slot of its array (policy/holding.py); no cycle reads it.
TRANSITIONS: dict[str, frozenset[str]] = {
    WAITING: frozenset({QUEUED, FAILED, CANCELLED}),
    QUEUED: frozenset({DISPATCHED, CANCELLED}),
    DISPATCHED: frozenset({RUNNING, SUCCEEDED, FAILED, CANCELLED, QUEUED}),
    RUNNING: frozenset({SUCCEEDED, FAILED, CANCELLED, QUEUED}),
    SUCCEEDED: frozenset(),
    FAILED: frozenset(),
    CANCELLED: frozenset(),
}


class IllegalTransition(ValueError):
    pass


def check(from_state: str, to_state: str) -> None:
    if to_state not in TRANSITIONS.get(from_state, frozenset()):
        raise IllegalTransition(f"a job cannot go from {from_state} to {to_state}")


def retry_decision(attempt: int, max_retries: int) -> bool:
    """Whether an attempt that failed, was lost or could not be scheduled gets another attempt."""
    return attempt <= max_retries
