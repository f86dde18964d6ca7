"""Carrying out what agents report and what users cancel: the job side of the agent link.

Status reports are idempotent (a repeat finds the job already moved and changes nothing) and fenced by
(job, attempt): a stale attempt's report is logged and ignored. On every (re)connection the agent's
inventory is reconciled: attempts it reports are applied; attempts the dispatcher thinks live there,
whose dispatch the agent had acked but which it no longer holds, are lost.
"""
from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from dispatcher import wakes
from dispatcher.capacity import usable
from dispatcher.policy import states
from dispatcher.policy.reporting import JobView, on_report
from dispatcher.services import scoping
from dispatcher.store import channels, job_reads, lifecycle
from dispatcher.store import outbox as outbox_store
from dispatcher.store.database import Session
from dispatcher.store.models import Job
from dispatcher.store.tokens import Principal
from sluice.quantity import format_duration
from sluice.wire import AttemptReport

if TYPE_CHECKING:
    from dispatcher.metrics import DispatcherMetrics

log = logging.getLogger(__name__)


def apply(session: Session, cluster: str, report: AttemptReport, metrics: DispatcherMetrics | None = None) -> bool:
    """Apply one report; True when it freed capacity (the scheduler should look again).
    metrics: observes dispatch-to-running when the report starts the attempt."""
    return apply_many(session, cluster, [report], metrics) > 0


def apply_many(session: Session, cluster: str, reports: list[AttemptReport],
               metrics: DispatcherMetrics | None = None, *, held_by: Principal | None = None) -> int:
    """Apply a cluster's reports in their order, in the caller's transaction, with a few statements for
    all of them: the jobs are locked and read at once (in id order), each report is judged against its
    job as the reports before it left it, and the changes are written together: the jobs' new states,
    one event per transition, the attempts started and ended, and the address a running attempt's report
    carries (a change of it needs no transition). Returns how many attempts ended (freeing capacity: the
    scheduler should look again). held_by: the agent, whose token or certificate must still hold
    (Unauthenticated otherwise, and nothing is applied)."""
    ids = sorted({r.job_id for r in reports})
    views = {row[0]: JobView(*row[1:]) for row in lifecycle.lock_for_reports(session, ids, held_by=held_by)}
    events: list[tuple] = []  # (job, attempt, from, to, reason, cluster), in order
    changed: dict[int, dict] = {}  # job -> its final state and reason, and what else changes
    # (job, attempt) -> [started, end state, reason, exit code, when it started, when it ended (agent's),
    # address, nodes (JSON text) (None: not said)]
    attempts: dict[tuple[int, int], list] = {}
    ended = 0
    for report in reports:
        job = views.get(report.job_id)
        if job is None:
            log.warning("report for an unknown job ignored", extra={"job_id": report.job_id, "cluster": cluster})
            continue
        outcome = on_report(job, cluster, report.attempt, report.state, report.reason, report.exit_code)
        if outcome.stale:
            log.info("stale status report ignored", extra={"job_id": report.job_id, "attempt": report.attempt,
                                                           "cluster": cluster, "state": report.state})
            continue
        if outcome.to is None:
            if (report.address or report.nodes) and outcome.attempt_state == states.RUNNING:  # said again
                _said(attempts.setdefault((report.job_id, job.attempt), [False, "", "", 0, None, None, None, None]),
                      report)
            continue
        events.append((report.job_id, job.attempt, job.state, outcome.to, outcome.reason, job.cluster))
        change = changed.setdefault(report.job_id, {"started": False, "finished": False, "requeued": False})
        change.update(state=outcome.to, reason=outcome.reason)
        attempt = attempts.setdefault((report.job_id, job.attempt), [False, "", "", 0, None, None, None, None])
        if outcome.to == states.RUNNING:
            change["started"] = attempt[0] = True
            attempt[4] = _agent_time(report)
            _said(attempt, report)
        else:
            change["finished" if outcome.to in states.FINAL else "requeued"] = True
            attempt[1:4] = report.state, report.reason, report.exit_code
            attempt[5] = _agent_time(report)
            ended += 1
        views[report.job_id] = replace(job, state=outcome.to, cluster=None if change["requeued"] else job.cluster)
    if not events and not attempts:
        return 0
    # A job back in its queue may start again (""); one that finished only leaves room (ROOM).
    wake = "" if any(c["requeued"] for c in changed.values()) else wakes.ROOM if ended else None
    waits = lifecycle.apply_transitions(session, changed, events, attempts, wake=wake)
    if metrics is not None:
        for waited in waits:
            metrics.observe_dispatch_to_running(waited)
    return ended


def _said(attempt: list, report: AttemptReport) -> None:
    """What a running attempt's report says of where it runs: its address, and what it holds on which nodes."""
    if report.address:
        attempt[6] = report.address
    if report.nodes:
        attempt[7] = json.dumps({node: held for node, held in report.nodes}, sort_keys=True)


def _agent_time(report: AttemptReport) -> datetime | None:
    """When the agent says the report's state was reached; None when it does not say (the store then
    takes the time of arrival). The store bounds it by the attempt's dispatch and its own clock."""
    if not report.at > 0:
        return None
    try:
        return datetime.fromtimestamp(report.at, UTC)
    except (OverflowError, ValueError, OSError):  # past what a datetime holds: in the future, so now
        return None


def reconcile(session: Session, inventories: dict[str, list[AttemptReport]],
              metrics: DispatcherMetrics | None = None) -> list[tuple[str, int, int]]:
    """Apply the inventories of agents saying hello, each cluster's by name; return the (cluster, job, attempt)
    they hold that are not live (orphans). Many clusters at once (a restart's every agent saying hello), with a
    few statements for all of them besides one per cluster that holds anything.

    An attempt whose unacked reports the agent still holds is listed with the earliest of them (agent
    connection.py): when a dispatcher applied RUNNING and SUCCEEDED but died before its ack, the next
    hello says RUNNING for an attempt that has ended. One that ended SUCCEEDED or FAILED, which only
    its cluster's own report does, is therefore no orphan: there is nothing of it left to cancel."""
    clusters = sorted(inventories)  # jobs locked cluster by cluster in name order, as the lease's expiry does
    for cluster in clusters:
        if inventories[cluster]:
            apply_many(session, cluster, inventories[cluster], metrics)
    # The active jobs before the unacked dispatches: a dispatch the scheduler commits between the two reads
    # (each sees what had committed when it began) is then unacked, not a held job missing from the inventory.
    active = job_reads.active_attempts(session, clusters)
    unacked = outbox_store.unacked_dispatches(session, clusters)
    for cluster in clusters:
        held = {(r.job_id, r.attempt) for r in inventories[cluster]}
        gone = [AttemptReport(job_id, attempt, states.LOST, "the cluster no longer holds it")
                for job_id, attempt in sorted(active[cluster] - held - unacked[cluster])]
        if gone:
            apply_many(session, cluster, gone, metrics)
    live = job_reads.active_attempts(session, clusters)
    orphans = [(cluster, r.job_id, r.attempt) for cluster in clusters for r in inventories[cluster]
               if (r.job_id, r.attempt) not in live[cluster] and r.state not in states.REPORTED_ENDS]
    known = job_reads.existing_ids(session, sorted({job_id for _, job_id, _ in orphans}))
    for cluster, job_id, attempt in orphans:
        if job_id not in known:  # another installation's, or from before the database was wiped: left alone
            log.warning("the cluster holds objects of a job this dispatcher never had; left in place",
                        extra={"cluster": cluster, "job_id": job_id, "attempt": attempt})
    reported_done = job_reads.ended_by_report(session, [(job_id, attempt) for _, job_id, attempt in orphans])
    return [(cluster, job_id, attempt) for cluster, job_id, attempt in orphans
            if job_id in known and (job_id, attempt) not in reported_done]


def cancel(session: Session, job_ids: list[int], who: Principal, reason: str | None = None) -> list[Job]:
    """Cancel jobs: waiting and queued ones at once; dispatched or running ones also get a cancel command.
    All or nothing: a job the caller may not see (scoping.visible_job) refuses the whole call. reason:
    said instead of 'cancelled by <who>'."""
    out = []
    for job_id in job_ids:
        job = scoping.visible_job(session, who, job_id, for_update=True)
        if job.state in states.FINAL:
            out.append(job)
            continue
        cluster, attempt, was_active = job.cluster, job.attempt, job.state in states.ACTIVE
        if job.state == states.QUEUED:  # the jobs behind it move up: its queue is planned again
            channels.notify(session, channels.WAKE_CHANNEL, job.queue)
        why = reason or f"cancelled by {who.subject}"
        lifecycle.transition(session, job, states.CANCELLED, why)
        if was_active and cluster:
            lifecycle.end_attempt(session, job_id, attempt, states.CANCELLED, why)
            outbox_store.add_cancel(session, cluster, job_id, attempt, why)
        out.append(job)
    return out


def preempt(session: Session, victim_id: int, by: int, cluster: str) -> bool:
    """Evict a job's attempt to make room for job `by`: back to QUEUED (a new attempt later), its pods
    deleted by a cancel command. False when the job already moved on (nothing to evict)."""
    job = job_reads.get(session, victim_id, for_update=True)
    if job.state not in states.ACTIVE or job.cluster != cluster:
        return False
    attempt = job.attempt
    reason = f"preempted by job {by}"
    lifecycle.transition(session, job, states.QUEUED, reason, cluster=None, preempted_by=by)
    lifecycle.end_attempt(session, victim_id, attempt, states.PREEMPTED, reason)
    outbox_store.add_cancel(session, cluster, victim_id, attempt, reason)
    return True


def expire_leases(session: Session, now: datetime, clusters: list, *, heard_since: datetime | None = None) -> int:
    """Jobs on clusters unheard of for longer than their lease are lost: each goes back to the queue as a
    new attempt (or fails, past its retries), and its cluster is sent a cancel of the lost attempt. Before
    that an unreachable cluster only takes no new jobs.
    A silence before `heard_since` does not count: a leader that has just taken over (after a restart of
    every dispatcher, say) cannot tell an agent that went quiet from one that had no dispatcher to talk to,
    and gives each a whole lease from then (as Nomad's failover heartbeat TTL does).
    Returns how many attempts were given up. Every cycle runs this, on the cluster rows it read already
    (store.clusters.CLUSTER_ROWS)."""
    given_up = 0
    for c in clusters:
        if c.last_seen_at is None:
            continue
        name, seen = c.name, c.last_seen_at if heard_since is None else max(c.last_seen_at, heard_since)
        lease = usable.cluster_object(c.spec).lease_duration_s
        silent = (now - seen).total_seconds()
        if silent <= lease:
            continue
        reason = f"cluster {name} unreachable for {silent:.0f}s, longer than its lease ({format_duration(lease)})"
        lost = [AttemptReport(job_id, attempt, states.LOST, reason)
                for job_id, attempt in sorted(job_reads.active_attempts(session, [name])[name])]
        given_up += apply_many(session, name, lost)
        # The cluster may still run them: its link may be up again (an agent frozen, then resumed), or come back
        # later. The cancel reaches it either way, at once on a live link, and its dispatch, if never sent, is not.
        for report in lost:
            outbox_store.add_cancel(session, name, report.job_id, report.attempt, f"lost: {reason}")
    return given_up
