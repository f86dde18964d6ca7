"""What the client, the dispatcher and the agents must agree on beyond the protobuf messages."""
from __future__ import annotations

from dataclasses import dataclass

STREAM_MARK = ("sluice-submit-stream", "1")  # the header a server sends once it has taken a submit stream


@dataclass(frozen=True)
class AttemptReport:
    """What an agent reports of one attempt (agents.proto AttemptStatus), as both ends hold it: its state
    as the agent sees it (PENDING, RUNNING, SUCCEEDED, FAILED, LOST, UNSCHEDULABLE), why, its exit code,
    when it got there by the agent's clock, and while it runs the address of its first pod and its nodes."""

    job_id: int
    attempt: int
    state: str
    reason: str = ""
    exit_code: int = 0
    # Seconds since the epoch when the attempt reached `state`, by the cluster's account; 0: not said
    # (older agents, or the dispatcher's own verdicts), which the dispatcher takes as the report's arrival.
    at: float = 0.0
    # How to reach the attempt's first pod (`10.1.2.3:8888`, or an IP alone when it declares no port), said
    # with RUNNING once the cluster knows it; "": not known, or not said (the address stored stays).
    address: str = ""
    # What its pods hold on each node they are bound to, (node, {resource: milli}), said with RUNNING; ():
    # not known, or not said (what is stored stays).
    nodes: tuple[tuple[str, dict[str, int]], ...] = ()
