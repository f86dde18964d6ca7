"""What an agent's status report means for the job. Pure: the caller applies the outcome.

Reports carry (job, attempt); a report for any attempt other than the job's live one on that cluster
is stale and changes nothing. A failure, loss or unschedulable gang returns the job to QUEUED as a new
attempt while its retry budget lasts.
"""
from __future__ import annotations

from dataclasses import dataclass

from dispatcher.policy import states


@dataclass(frozen=True)
class JobView:
    state: str
    attempt: int
    cluster: str | None
    max_retries: int


@dataclass(frozen=True)
class Outcome:
    to: str | None  # new job state; None: the job stays as it is
    reason: str
    attempt_state: str  # what the attempt record becomes
    stale: bool = False


def on_report(job: JobView, cluster: str, attempt: int, agent_state: str, reason: str,
              exit_code: int = 0) -> Outcome:
    if attempt != job.attempt or job.cluster != cluster or job.state not in states.ACTIVE:
        return Outcome(None, f"stale report for attempt {attempt} on {cluster}", agent_state, stale=True)
    if agent_state == "PENDING":
        return Outcome(None, "", states.DISPATCHED)
    if agent_state == "RUNNING":
        if job.state == states.RUNNING:
            return Outcome(None, "", states.RUNNING)
        return Outcome(states.RUNNING, f"running on {cluster}", states.RUNNING)
    if agent_state == "SUCCEEDED":
        return Outcome(states.SUCCEEDED, f"succeeded on {cluster}", states.SUCCEEDED)
    what = {
        "FAILED": f"attempt {attempt} failed on {cluster}",
        "LOST": f"attempt {attempt} was lost on {cluster}",
        "UNSCHEDULABLE": f"attempt {attempt} could not be scheduled on {cluster}",
    }.get(agent_state)
    if what is None:
        return Outcome(None, f"unknown agent state {agent_state!r}", agent_state, stale=True)
    detail = f"{what}: {reason}" if reason else what
    if states.retry_decision(attempt, job.max_retries):
        return Outcome(states.QUEUED, f"{detail}; retrying ({attempt} of {job.max_retries + 1} attempts used)",
                       agent_state)
    return Outcome(states.FAILED, detail, agent_state)
