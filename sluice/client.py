"""The Python client: every user-facing call, returning plain dicts shaped as ../shared/API.md says.

Light on purpose: it imports grpc and the generated stubs, never the dispatcher, SQLAlchemy or the
Kubernetes client.
"""
from __future__ import annotations

import json
from typing import Iterable, Iterator

import grpc
import orjson

from sluice.config import ClientConfig
from sluice.spec import JobSpec
from sluice.v1 import jobs_pb2, jobs_pb2_grpc

SUBMIT_BATCH = 1000
_json = json.JSONEncoder(separators=(",", ":")).encode


def _encode(document) -> str:
    """Compact JSON: orjson, several times faster, unless it would write the document otherwise than `json`
    does: it writes NaN and infinities as null (`json` as NaN, which the dispatcher refuses), so any null
    sends the document through `json`, as does anything orjson refuses (keys that are not strings,
    integers past 64 bits, lone surrogates)."""
    try:
        data = orjson.dumps(document)
    except TypeError:  # orjson.JSONEncodeError too
        return _json(document)
    return _json(document) if b"null" in data else data.decode()


class ClientError(Exception):
    """A call the dispatcher refused or could not answer; `code` is the gRPC status name."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def user_error(self) -> bool:
        return self.code in ("INVALID_ARGUMENT", "NOT_FOUND", "PERMISSION_DENIED", "FAILED_PRECONDITION",
                             "UNAUTHENTICATED", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED")


def _time(ts) -> str | None:
    if not ts.seconds and not ts.nanos:
        return None
    return ts.ToDatetime().strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def job_dict(job: jobs_pb2.Job) -> dict:
    return {"id": job.id, "name": job.name or None, "queue": job.queue, "serviceClass": job.service_class,
            "priority": job.priority, "state": job.state, "reason": job.reason, "cluster": job.cluster or None,
            "attempt": job.attempt, "createdAt": _time(job.created_at), "dispatchedAt": _time(job.dispatched_at),
            "startedAt": _time(job.started_at), "finishedAt": _time(job.finished_at), "labels": dict(job.labels),
            "submittedBy": job.submitted_by, "maxRetries": job.max_retries}


def event_dict(event: jobs_pb2.JobEvent) -> dict:
    return {"id": event.id, "jobId": event.job_id, "attempt": event.attempt, "from": event.from_state or None,
            "to": event.to_state, "reason": event.reason, "cluster": event.cluster or None, "at": _time(event.at)}


def _resources(r: jobs_pb2.Resources) -> dict[str, str]:
    from sluice.quantity import format_resources
    return format_resources(dict(r.milli))


class Client:
    def __init__(self, config: ClientConfig):
        self.config = config
        self._channel = grpc.insecure_channel(config.address, options=[
            ("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)])
        self._jobs = jobs_pb2_grpc.JobsStub(self._channel)
        self._metadata = [("authorization", f"Bearer {config.token}")]

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request):
        try:
            return method(request, metadata=self._metadata, timeout=self.config.timeout_s)
        except grpc.RpcError as exc:
            raise ClientError(exc.code().name, exc.details() or exc.code().name) from None

    def submit(self, jobs: Iterable[JobSpec | dict]) -> list[int]:
        """Submit jobs in batches; each batch is committed before its ids come back."""
        # Compact JSON: fewer bytes to send and for the server to decode. The documents are only serialised
        # here, so a JobSpec's pod templates need no copies.
        docs = [_encode(j.to_document(share_templates=True) if isinstance(j, JobSpec) else j) for j in jobs]
        ids: list[int] = []
        for start in range(0, len(docs), SUBMIT_BATCH):
            reply = self._call(self._jobs.Submit, jobs_pb2.SubmitRequest(specs_json=docs[start:start + SUBMIT_BATCH]))
            ids.extend(reply.ids)
        return ids

    def get(self, job_id: int) -> dict:
        return job_dict(self._call(self._jobs.Get, jobs_pb2.GetJobRequest(id=job_id)))

    def describe(self, job_id: int) -> dict:
        reply = self._call(self._jobs.Describe, jobs_pb2.GetJobRequest(id=job_id))
        return {**job_dict(reply.job), "queuePosition": reply.queue_position or None,
                "spec": json.loads(reply.job.spec_json or "{}"), "events": [event_dict(e) for e in reply.events]}

    def explain(self, job_id: int) -> dict:
        reply = self._call(self._jobs.Explain, jobs_pb2.GetJobRequest(id=job_id))
        return {**job_dict(reply.job), "queuePosition": reply.queue_position or None, "quota": reply.quota,
                "clusters": [{"cluster": c.cluster, "verdict": c.verdict} for c in reply.clusters],
                "bursts": [{"attempt": b.attempt, "policy": b.policy, "queue": b.queue, "cluster": b.cluster,
                            "trigger": b.trigger, "ratePerHour": b.rate_per_hour, "expectedHours": b.expected_hours,
                            "expectedCost": b.expected_cost, "startsInSeconds": b.starts_in_seconds,
                            "alternatives": [{"cluster": a.cluster, "verdict": a.verdict} for a in b.alternatives]}
                           for b in reply.bursts]}

    def list(self, *, queue: str = "", state: str = "", limit: int = 0) -> list[dict]:
        """Jobs in id order; limit 0 lists every job (paging through the server's pages)."""
        out: list[dict] = []
        token = ""
        while True:
            page = min(limit - len(out), 1000) if limit else 1000
            reply = self._call(self._jobs.List, jobs_pb2.ListJobsRequest(queue=queue, state=state, limit=page,
                                                                       page_token=token))
            out.extend(job_dict(j) for j in reply.jobs)
            token = reply.next_page_token
            if not token or (limit and len(out) >= limit):
                return out

    def cancel(self, job_ids: list[int]) -> list[dict]:
        return [job_dict(j) for j in self._call(self._jobs.Cancel, jobs_pb2.CancelRequest(ids=job_ids)).jobs]

    def watch(self, job_id: int = 0, after_event_id: int = 0) -> Iterator[dict]:
        """Job events as they happen; resume after a known event id. Ends only on error or close.

        The events come from WatchBatches (those the server reads together in one message); a dispatcher
        older than it answers UNIMPLEMENTED before any event, and the same events then come from Watch."""
        request = jobs_pb2.WatchRequest(job_id=job_id, after_event_id=after_event_id)
        try:
            try:
                for batch in self._jobs.WatchBatches(request, metadata=self._metadata):
                    for event in batch.events:
                        yield event_dict(event)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                for event in self._jobs.Watch(request, metadata=self._metadata):
                    yield event_dict(event)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED:
                return
            raise ClientError(exc.code().name, exc.details() or exc.code().name) from None

    def clusters(self) -> list[dict]:
        reply = self._call(self._jobs.ListClusters, jobs_pb2.ListClustersRequest())
        return [{"name": c.name, "tier": c.tier, "site": c.site, "labels": dict(c.labels), "state": c.state,
                 "capacitySource": c.capacity_source,
                 "capacityAgeSeconds": round(c.capacity_age_seconds, 3) if c.capacity_age_seconds >= 0 else None,
                 "allocatable": _resources(c.allocatable), "free": _resources(c.free),
                 "largestFreeNode": _resources(c.largest_free_node), "runningJobs": c.running_jobs}
                for c in reply.clusters]

    def queues(self) -> list[dict]:
        reply = self._call(self._jobs.ListQueues, jobs_pb2.ListQueuesRequest())
        return [{"name": q.name, "parent": q.parent or None, "guaranteed": _resources(q.guaranteed),
                 "max": _resources(q.max), "used": _resources(q.used), "queuedJobs": q.queued_jobs,
                 "runningJobs": q.running_jobs} for q in reply.queues]

    def usage(self, *, since_s: float = 0, by: str = "queue") -> dict:
        """Resource-hours and cost per group over the last `since_s` seconds (0: all time).

        resourceHours are hours of base units (cpu core-hours, memory GiB-hours, others unit-hours);
        `total` adds up the groups.
        """
        reply = self._call(self._jobs.Usage, jobs_pb2.UsageRequest(since_seconds=since_s, by=by))
        groups = [{"group": r.group, "resourceHours": _ordered_resources(dict(r.resource_hours)), "cost": r.cost,
                   "attempts": r.attempts} for r in reply.rows]
        total_hours: dict[str, float] = {}
        for g in groups:
            for resource, hours in g["resourceHours"].items():
                total_hours[resource] = total_hours.get(resource, 0.0) + hours
        return {"by": reply.by or by, "since": _time(reply.window_start), "until": _time(reply.window_end),
                "currency": reply.currency, "groups": groups,
                "total": {"resourceHours": _ordered_resources(total_hours), "cost": sum(g["cost"] for g in groups),
                          "attempts": sum(g["attempts"] for g in groups)},
                "burst": [{"policy": b.policy, "queue": b.queue or None, "spentInWindow": b.spent_in_window,
                           "attempts": b.attempts, "spentToday": b.spent_today,
                           "budgetPerDay": None if b.budget_per_day < 0 else b.budget_per_day,
                           "ratePerHour": b.rate_per_hour,
                           "budgetPerHour": None if b.budget_per_hour < 0 else b.budget_per_hour,
                           "resourcesInUse": dict(b.resources_in_use), "maxResources": dict(b.max_resources)}
                          for b in reply.burst]}


def _ordered_resources(amounts: dict) -> dict:
    """cpu, memory, then the other resources by name."""
    first = [r for r in ("cpu", "memory") if r in amounts]
    return {r: amounts[r] for r in first + sorted(r for r in amounts if r not in first)}
