"""ORM rows to protobuf messages: the only place the two meet."""
from __future__ import annotations

import json
from datetime import datetime

from google.protobuf.timestamp_pb2 import Timestamp

from dispatcher.policy import sessions
from dispatcher.store.models import ApiToken, Attempt, AuditRecord, Job, JobEvent, RevokedCertificate
from sluice.quantity import format_resources
from sluice.v1 import admin_pb2, jobs_pb2, schedules_pb2


def timestamp(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def schedule(view) -> schedules_pb2.Schedule:
    """A services.recurring.ScheduleView as its message."""
    return schedules_pb2.Schedule(
        name=view.name, owner=view.owner, document_json=json.dumps(view.document), suspended=view.suspended,
        last_scheduled_at=timestamp(view.last_scheduled_at), next_due_at=timestamp(view.next_due_at),
        active_job_ids=view.active_job_ids, status=view.status, last_error=view.last_error or "",
        last_error_at=timestamp(view.last_error_at), created_at=timestamp(view.created_at),
        runs=[schedules_pb2.ScheduleRun(job_id=r.job_id, name=r.name or "", state=r.state, reason=r.reason,
                                        created_at=timestamp(r.created_at), finished_at=timestamp(r.finished_at))
              for r in view.runs])


def resources(milli: dict | None) -> jobs_pb2.Resources:
    return jobs_pb2.Resources(milli={k: int(v) for k, v in (milli or {}).items()})


def job(row: Job, *, with_spec: bool = True) -> jobs_pb2.Job:
    return jobs_pb2.Job(
        id=row.id, name=row.name or "", queue=row.queue, service_class=row.service_class,
        priority=sessions.own_priority(row.priority), interactive=row.priority != sessions.own_priority(row.priority),
        array_id=row.array_id or 0, array_index=row.array_index or 0, start_after=timestamp(row.start_after),
        state=row.state, reason=row.reason, cluster=row.cluster or "", attempt=row.attempt,
        created_at=timestamp(row.created_at), dispatched_at=timestamp(row.dispatched_at),
        started_at=timestamp(row.started_at), finished_at=timestamp(row.finished_at),
        labels={str(k): str(v) for k, v in (row.labels or {}).items()},
        spec_json=json.dumps(row.spec) if with_spec else "", submitted_by=row.submitted_by,
        max_retries=row.max_retries)


def dependency(job_id: int, name: str | None, condition: str, met: bool | None, state: str) -> jobs_pb2.JobDependency:
    return jobs_pb2.JobDependency(job_id=job_id, name=name or "", condition=condition, state=state,
                                  status="waiting" if met is None else "met" if met else "failed")


def event(row: JobEvent) -> jobs_pb2.JobEvent:
    return jobs_pb2.JobEvent(id=row.id, job_id=row.job_id, attempt=row.attempt, from_state=row.from_state,
                             to_state=row.to_state, reason=row.reason, cluster=row.cluster or "",
                             at=timestamp(row.at))


def attempt(row: Attempt) -> jobs_pb2.JobAttempt:
    return jobs_pb2.JobAttempt(attempt=row.attempt, cluster=row.cluster, state=row.state, reason=row.reason or "",
                               dispatched_at=timestamp(row.dispatched_at), started_at=timestamp(row.started_at),
                               finished_at=timestamp(row.finished_at), address=row.address or "")


def token(row: ApiToken) -> admin_pb2.Token:
    return admin_pb2.Token(id=row.id, role=row.role, subject=row.subject, cluster=row.cluster or "",
                           created_at=timestamp(row.created_at), expires_at=timestamp(row.expires_at),
                           revoked_at=timestamp(row.revoked_at))


def revoked_certificate(row: RevokedCertificate) -> admin_pb2.RevokedCertificate:
    return admin_pb2.RevokedCertificate(serial=row.serial, cluster=row.cluster or "",
                                        not_after=timestamp(row.not_after), revoked_at=timestamp(row.revoked_at))


def audit_record(row: AuditRecord) -> admin_pb2.AuditRecord:
    return admin_pb2.AuditRecord(id=row.id, at=timestamp(row.at), actor=row.actor, action=row.action, kind=row.kind,
                                 name=row.name, details_json=json.dumps(row.details))


def burst_decision(attempt: int, record: dict) -> jobs_pb2.BurstDecision:
    return jobs_pb2.BurstDecision(
        attempt=attempt, policy=record["policy"], queue=record["queue"], cluster=record["cluster"],
        trigger=record["trigger"], rate_per_hour=record["ratePerHour"], expected_hours=record["expectedHours"],
        expected_cost=record["expectedCost"], starts_in_seconds=record["startsInSeconds"],
        alternatives=[jobs_pb2.ClusterVerdict(cluster=a["cluster"], verdict=a["verdict"])
                      for a in record["alternatives"]])


def burst_budget(row) -> jobs_pb2.BurstBudget:
    """A budgets.BudgetRow; an absent limit is sent as -1."""
    def limit(value: float | None) -> float:
        return -1.0 if value is None else value
    return jobs_pb2.BurstBudget(
        policy=row.policy, queue=row.queue, spent_in_window=row.spent_in_window, attempts=row.attempts,
        spent_today=row.committed.today, budget_per_day=limit(row.budget.per_day), rate_per_hour=row.committed.rate,
        budget_per_hour=limit(row.budget.per_hour), resources_in_use=format_resources(row.committed.resources),
        max_resources=format_resources(row.budget.max_resources))
