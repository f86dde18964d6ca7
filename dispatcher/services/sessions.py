"""Interactive sessions: attaching to one (how to reach it; it is not idle meanwhile), and the leader's pass
that ends those nobody attached to for their idle timeout (policy.sessions has the rules)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from dispatcher.errors import InvalidRequest
from dispatcher.policy import sessions
from dispatcher.services import reporting, scoping
from dispatcher.store import job_reads
from dispatcher.store.database import Session
from dispatcher.store.models import Job
from dispatcher.store.tokens import Principal
from sluice.quantity import format_duration, parse_duration

log = logging.getLogger(__name__)
LEADER = Principal("sluice", "admin")  # who ends an idle session


@dataclass(frozen=True)
class Attached:
    job: Job
    address: str  # empty until its agent reported one
    idle_timeout_s: float  # 0: none


def attach(session: Session, who: Principal, job_id: int, now: datetime) -> Attached:
    """Attach to an interactive session `who` may see: it is not idle from now on (until its idle timeout
    passes again), and how to reach it. Refuses a job that is no session."""
    job = scoping.visible_job(session, who, job_id, for_update=True)
    if not sessions.is_interactive(job.priority):
        raise InvalidRequest(f"job {job_id}: not an interactive session (spec.interactive)")
    job_reads.mark_attached(session, job_id, now)
    idle = (job.spec.get("spec") or {}).get("idleTimeout")
    return Attached(job, job_reads.current_address(session, job_id, job.attempt) or "",
                    parse_duration(idle) if idle else 0.0)


def end_idle(session: Session, now: datetime) -> list[int]:
    """End (cancel) the running sessions nobody attached to for their idle timeout; their ids."""
    ended = []
    for job_id, idle, started_at, attached_at in job_reads.sessions_with_idle_timeout(session):
        since = sessions.idle_since(started_at, attached_at)
        timeout = parse_duration(idle)
        if sessions.idle_over(timeout, since, now):
            reporting.cancel(session, [job_id], LEADER,
                             reason=f"ended: nobody attached for {format_duration(timeout)} (spec.idleTimeout)")
            ended.append(job_id)
    if ended:
        log.info("idle sessions ended", extra={"jobs": ended})
    return ended
