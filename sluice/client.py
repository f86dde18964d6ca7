"""The Python client: every user-facing call, returning plain dicts shaped as docs/api.md says.

Light on purpose: it imports grpc and the generated stubs, never the dispatcher, SQLAlchemy or the
Kubernetes client.
"""
from __future__ import annotations

import json
import os
import queue
import threading
import time
import uuid
from collections.abc import Iterable, Iterator

import grpc
import orjson

from sluice import transport
from sluice.config import ClientConfig, ConfigError, load
from sluice.spec import JobSpec
from sluice.v1 import jobs_pb2, jobs_pb2_grpc, schedules_pb2, schedules_pb2_grpc
from sluice.wire import STREAM_MARK

SUBMIT_BATCH = 1000  # documents per request; a larger submit goes as several requests of one submit
MAX_SUBMIT = 100_000  # documents in one submit (the dispatcher's limit: it holds a submit's parts in memory)
MAX_CALL = 10_000  # documents one Submit call may carry (the dispatcher's limit per request)
RETRY_WAITS_S = (0.2, 0.5, 1.0, 2.0, 4.0)  # before each retry of a submit that met UNAVAILABLE
STREAM_S = 60.0  # how long a submit stream takes requests; it lives timeout_s longer, so none meets its end
FINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")  # a job in one of them has ended
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


# What gRPC says of a TLS handshake that failed, and what it means for the person reading it.
_HANDSHAKE = (("CERTIFICATE_VERIFY_FAILED", "the dispatcher's certificate is not signed by the CA this client trusts "
                                            "(check `ca:` in the client config, or --ca)"),
              ("WRONG_VERSION_NUMBER", "the dispatcher did not answer in TLS (is it plaintext? then give `insecure: "
                                       "true`, loopback only)"),
              ("Ssl handshake failed", "the TLS handshake with the dispatcher failed"),
              ("Socket closed", "the dispatcher closed the connection (a plaintext client talking to a TLS port?)"))


def rpc_error(exc: grpc.RpcError) -> ClientError:
    """A gRPC error as a ClientError whose message is written for people."""
    code, details = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE:
        for marker, meaning in _HANDSHAKE:
            if marker in details:
                return ClientError(code.name, meaning)
    return ClientError(code.name, details or code.name)


def _time(ts) -> str | None:
    if not ts.seconds and not ts.nanos:
        return None
    return ts.ToDatetime().strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def job_dict(job: jobs_pb2.Job) -> dict:
    return {"id": job.id, "name": job.name or None, "queue": job.queue, "serviceClass": job.service_class,
            "priority": job.priority, "state": job.state, "reason": job.reason, "cluster": job.cluster or None,
            "attempt": job.attempt, "createdAt": _time(job.created_at), "dispatchedAt": _time(job.dispatched_at),
            "startedAt": _time(job.started_at), "finishedAt": _time(job.finished_at), "labels": dict(job.labels),
            "submittedBy": job.submitted_by, "maxRetries": job.max_retries,
            "arrayId": job.array_id or None, "arrayIndex": job.array_index if job.array_id else None,
            "interactive": job.interactive, "startAfter": _time(job.start_after)}


def dependency_dict(edge: jobs_pb2.JobDependency) -> dict:
    return {"jobId": edge.job_id, "name": edge.name or None, "condition": edge.condition, "state": edge.state,
            "status": edge.status}


def event_dict(event: jobs_pb2.JobEvent) -> dict:
    return {"id": event.id, "jobId": event.job_id, "attempt": event.attempt, "from": event.from_state or None,
            "to": event.to_state, "reason": event.reason, "cluster": event.cluster or None, "at": _time(event.at)}


def attempt_dict(attempt: jobs_pb2.JobAttempt) -> dict:
    return {"attempt": attempt.attempt, "cluster": attempt.cluster, "state": attempt.state, "reason": attempt.reason,
            "dispatchedAt": _time(attempt.dispatched_at), "startedAt": _time(attempt.started_at),
            "finishedAt": _time(attempt.finished_at), "address": attempt.address or None}


def describe_dict(reply: jobs_pb2.DescribeJobResponse) -> dict:
    return {**job_dict(reply.job), "queuePosition": reply.queue_position or None,
            "spec": json.loads(reply.job.spec_json or "{}"), "events": [event_dict(e) for e in reply.events],
            "attempts": [attempt_dict(a) for a in reply.attempts],
            "dependsOn": [dependency_dict(d) for d in reply.depends_on],
            "dependants": [dependency_dict(d) for d in reply.dependants]}


def explain_dict(reply: jobs_pb2.ExplainResponse) -> dict:
    return {**job_dict(reply.job), "queuePosition": reply.queue_position or None, "quota": reply.quota,
            "clusters": [{"cluster": c.cluster, "verdict": c.verdict} for c in reply.clusters],
            "bursts": [{"attempt": b.attempt, "policy": b.policy, "queue": b.queue, "cluster": b.cluster,
                        "trigger": b.trigger, "ratePerHour": b.rate_per_hour, "expectedHours": b.expected_hours,
                        "expectedCost": b.expected_cost, "startsInSeconds": b.starts_in_seconds,
                        "alternatives": [{"cluster": a.cluster, "verdict": a.verdict} for a in b.alternatives]}
                       for b in reply.bursts]}


def cluster_dicts(reply: jobs_pb2.ListClustersResponse) -> list[dict]:
    return [{"name": c.name, "tier": c.tier, "site": c.site, "labels": dict(c.labels), "state": c.state,
             "capacitySource": c.capacity_source,
             "capacityAgeSeconds": round(c.capacity_age_seconds, 3) if c.capacity_age_seconds >= 0 else None,
             "allocatable": _resources(c.allocatable), "free": _resources(c.free),
             "largestFreeNode": _resources(c.largest_free_node), "runningJobs": c.running_jobs,
             "price": dict(c.price)}
            for c in reply.clusters]


def queue_dicts(reply: jobs_pb2.ListQueuesResponse) -> list[dict]:
    return [{"name": q.name, "parent": q.parent or None, "guaranteed": _resources(q.guaranteed),
             "max": _resources(q.max), "used": _resources(q.used), "queuedJobs": q.queued_jobs,
             "runningJobs": q.running_jobs, "fairShare": round(q.fair_share, 6),
             "fairShareRank": q.fair_share_rank or None} for q in reply.queues]


def usage_dict(reply: jobs_pb2.UsageResponse, by: str = "queue") -> dict:
    """Resource-hours and cost per group; resourceHours are hours of base units (cpu core-hours, memory
    GiB-hours, others unit-hours), and `total` adds up the groups."""
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


def schedule_dict(s: schedules_pb2.Schedule) -> dict:
    document = json.loads(s.document_json or "{}")
    spec = document.get("spec", {})
    return {"name": s.name, "owner": s.owner, "schedule": spec.get("schedule"), "timeZone": spec.get("timeZone"),
            "concurrencyPolicy": spec.get("concurrencyPolicy"), "suspended": s.suspended,
            "lastScheduledAt": _time(s.last_scheduled_at), "nextDueAt": _time(s.next_due_at),
            "activeJobs": list(s.active_job_ids), "status": s.status, "lastError": s.last_error or None,
            "lastErrorAt": _time(s.last_error_at), "createdAt": _time(s.created_at),
            "runs": [{"id": r.job_id, "name": r.name or None, "state": r.state, "reason": r.reason,
                      "createdAt": _time(r.created_at), "finishedAt": _time(r.finished_at)} for r in s.runs],
            "document": document}


def _resources(r: jobs_pb2.Resources) -> dict[str, str]:
    from sluice.quantity import format_resources
    return format_resources(dict(r.milli))


class _SubmitStream:
    """One Jobs.SubmitStream call, taking one request at a time, read by the caller itself. A gRPC
    response iterator waits without a timeout, so one watchdog thread (`_Watchdog`) cancels a stream whose
    request is overdue (a thread of the stream's own, to wait with a timeout, would cost a hand-off a request)."""

    def __init__(self, stub: jobs_pb2_grpc.JobsStub, metadata: list, timeout_s: float):
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self.usable_until = time.monotonic() + STREAM_S
        self.broken = False
        self._due: float | None = None  # while waiting: when the wait is overdue
        self._overdue = False
        self._lock = threading.Lock()  # the caller's wait and the watchdog's verdict, one at a time
        self._responses = stub.SubmitStream(iter(self._requests.get, None), metadata=metadata,
                                            timeout=STREAM_S + timeout_s)

    def opened(self, deadline: float) -> str:
        """"open" once the server has taken the stream; else why not (a status code name)."""
        _WATCHDOG.watch(self)
        self._wait(deadline)
        try:
            taken = STREAM_MARK in (self._responses.initial_metadata() or ())
        finally:
            self._wait(None)
        if taken:
            return "open"
        if self._overdue:
            return "DEADLINE_EXCEEDED"
        code = self._responses.code()  # ended without taking it
        return code.name if code is not None else "UNKNOWN"

    def call(self, request: jobs_pb2.SubmitRequest, deadline: float) -> jobs_pb2.SubmitResponse:
        self._wait(deadline)
        self._requests.put(request)
        try:
            return next(self._responses)
        except StopIteration:
            self.broken = True
            raise ClientError("UNAVAILABLE", "the submit stream ended before answering") from None
        except grpc.RpcError as exc:
            self.broken = True
            if self._overdue:
                raise ClientError("DEADLINE_EXCEEDED", "Deadline Exceeded") from None
            raise rpc_error(exc) from None
        finally:
            self._wait(None)

    def usable(self, now: float) -> bool:
        """Whether a request may go on it: it has broken, nor ended (a server going away ends its streams),
        nor come near its deadline."""
        return not self.broken and now < self.usable_until and not self._responses.done()

    def _wait(self, due: float | None) -> None:
        with self._lock:
            self._due = due

    def expire(self, now: float) -> bool:
        """The watchdog's look: cancel the stream if its wait is past due; whether it is done with."""
        with self._lock:
            if self._due is not None and self._due <= now:
                self._overdue = True
                self.close()
        if self._responses.done() and not self.broken:
            self.close()  # ended while idle: gRPC's thread taking its requests ends with it
        return self.broken

    def close(self) -> None:
        self.broken = True
        self._requests.put(None)
        self._responses.cancel()


class _Watchdog:
    """One thread for every submit stream of the process: it cancels a stream whose wait is past due, looking
    every TICK_S while any stream is open (a thread per wait, or per stream, costs more than the wait), and
    forgets it once it is closed or has ended."""

    TICK_S = 0.1

    def __init__(self):
        self._lock = threading.Lock()
        self._streams: set[_SubmitStream] = set()
        self._running = False

    def watch(self, stream: _SubmitStream) -> None:
        with self._lock:
            self._streams.add(stream)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="sluice-submit-watchdog", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(self.TICK_S)
            with self._lock:
                streams = list(self._streams)
            now = time.monotonic()
            done = {stream for stream in streams if stream.expire(now)}
            with self._lock:
                self._streams -= done
                if not self._streams:
                    self._running = False
                    return


_WATCHDOG = _Watchdog()


class Client:
    """A connection to one dispatcher (docs/python-client.md). Every call raises ClientError when the
    dispatcher refuses it or cannot be reached; use it as a context manager, or close() it."""

    def __init__(self, config: ClientConfig):
        self.config = config
        try:
            self._channel = transport.channel(config.address, config.tls, options=[
                ("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)])
        except transport.TransportError as exc:
            raise ClientError("INVALID_ARGUMENT", str(exc)) from None
        self._jobs = jobs_pb2_grpc.JobsStub(self._channel)
        self._schedules = schedules_pb2_grpc.SchedulesStub(self._channel)
        self._metadata = [("authorization", f"Bearer {config.token}")]
        self._submitted = False  # the first Submit goes as a call: a client that submits once opens no stream
        self._stream: _SubmitStream | None = None
        self._stream_lock = threading.Lock()  # one request at a time on the stream; other threads use calls
        self._streams_from = 0.0  # monotonic time from which streams may be tried again

    @classmethod
    def from_config(cls, path: str | os.PathLike | None = None, *, context: str | None = None,
                    ca: str | os.PathLike | None = None) -> Client:
        """A client of the dispatcher the client config file names, as the `sluice` command finds it: `path`,
        else $SLUICE_CONFIG, else ~/.config/sluice/client.yaml; its context `context`, else $SLUICE_CONTEXT,
        else its current one; $SLUICE_ADDRESS and the like override (sluice.config). A config it cannot use
        is a ClientError (INVALID_ARGUMENT) saying why."""
        try:
            config = load(path, ca=ca, context=context)
        except ConfigError as exc:
            raise ClientError("INVALID_ARGUMENT", str(exc)) from None
        return cls(config)

    def close(self) -> None:
        with self._stream_lock:
            if self._stream is not None:
                self._stream.close()
                self._stream = None
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request):
        try:
            return method(request, metadata=self._metadata, timeout=self.config.timeout_s)
        except grpc.RpcError as exc:
            raise rpc_error(exc) from None

    def submit(self, jobs: Iterable[JobSpec | dict], *, key: str | None = None) -> list[int]:
        """Submit jobs, all or none: their ids, in order, once every one is committed. An error naming a
        document gives its place among `jobs` (document 1,500).

        Every submit carries an idempotency key (`key`, else a new one): after UNAVAILABLE, when the
        dispatcher may or may not have committed it, the submit is sent again with the same key, and a
        dispatcher that committed it answers the same ids and creates nothing. The dispatcher keeps keys
        a day, per user."""
        # Compact JSON: fewer bytes to send and for the server to decode. The documents are only serialised
        # here, so a JobSpec's pod templates need no copies.
        docs = [_encode(j.to_document(share_templates=True) if isinstance(j, JobSpec) else j) for j in jobs]
        if len(docs) > MAX_SUBMIT:
            raise ClientError("INVALID_ARGUMENT", f"submit: {len(docs):,} jobs, at most {MAX_SUBMIT:,} in one "
                                                  f"submit; split the file")
        key = key or uuid.uuid4().hex
        for wait in (*RETRY_WAITS_S, None):
            try:
                return list(self._submit_whole(docs, key).ids)
            except ClientError as exc:
                if exc.code != "UNAVAILABLE" or wait is None:
                    raise
            time.sleep(wait)
        raise AssertionError("unreachable")

    def _submit_whole(self, docs: list[str], key: str) -> jobs_pb2.SubmitResponse:
        """One try at a submit: one request when it is small; else its parts on one stream, the last
        committing them all; without a stream, one call carrying all when the dispatcher takes that many."""
        if len(docs) <= SUBMIT_BATCH:
            return self._submit(jobs_pb2.SubmitRequest(specs_json=docs, idempotency_key=key))
        parts = [docs[start:start + SUBMIT_BATCH] for start in range(0, len(docs), SUBMIT_BATCH)]
        with self._stream_lock:
            stream = self._open_stream(time.monotonic() + self.config.timeout_s)
            if stream is not None:
                for n, part in enumerate(parts, 1):
                    reply = stream.call(jobs_pb2.SubmitRequest(specs_json=part, idempotency_key=key,
                                                               more=n < len(parts)),
                                        time.monotonic() + self.config.timeout_s)
                return reply
        if len(docs) <= MAX_CALL:
            return self._call(self._jobs.Submit, jobs_pb2.SubmitRequest(specs_json=docs, idempotency_key=key))
        raise ClientError("RESOURCE_EXHAUSTED", f"submit: {len(docs):,} jobs go as one submit on a submit stream, "
                                                f"and the dispatcher has none free; try again")

    def _submit(self, request: jobs_pb2.SubmitRequest) -> jobs_pb2.SubmitResponse:
        """One Submit request: on this client's stream when it has one free (a stream message costs the
        dispatcher less than a call), else by a call. Answered the same either way: the ids after the commit,
        or the same error; a request that found no stream open, or was refused one, was never sent on it."""
        if self._submitted and self._stream_lock.acquire(blocking=False):
            try:
                deadline = time.monotonic() + self.config.timeout_s
                stream = self._open_stream(deadline)
                if stream is not None:
                    return stream.call(request, deadline)
            finally:
                self._stream_lock.release()
        self._submitted = True
        return self._call(self._jobs.Submit, request)

    def _open_stream(self, deadline: float) -> _SubmitStream | None:
        """The stream to send on (holding _stream_lock), opened if need be; None: use a call."""
        now = time.monotonic()
        if self._stream is not None and not self._stream.usable(now):
            self._stream.close()
            self._stream = None
        if self._stream is None and now >= self._streams_from:
            stream = _SubmitStream(self._jobs, self._metadata, self.config.timeout_s)
            state = stream.opened(deadline)
            if state != "open":
                stream.close()
                if state == "DEADLINE_EXCEEDED":
                    raise ClientError("DEADLINE_EXCEEDED", "Deadline Exceeded")
                # A dispatcher without streams, or with all it allows open: calls, for a while. Any other
                # refusal (a bad token, a server going away) is the call's to report.
                if state in ("UNIMPLEMENTED", "RESOURCE_EXHAUSTED"):
                    self._streams_from = now + (STREAM_S if state == "RESOURCE_EXHAUSTED" else float("inf"))
                return None
            self._stream = stream
        return self._stream

    def get(self, job_id: int) -> dict:
        return job_dict(self._call(self._jobs.Get, jobs_pb2.GetJobRequest(id=job_id)))

    def describe(self, job_id: int) -> dict:
        return describe_dict(self._call(self._jobs.Describe, jobs_pb2.GetJobRequest(id=job_id)))

    def attach(self, job_id: int) -> dict:
        """Attach to an interactive session: {"job", "address" (None until its agent says), "idleTimeoutSeconds"
        (attach again within it to keep the session; None: no idle timeout)}."""
        reply = self._call(self._jobs.Attach, jobs_pb2.GetJobRequest(id=job_id))
        return {"job": job_dict(reply.job), "address": reply.address or None,
                "idleTimeoutSeconds": reply.idle_timeout_seconds or None}

    def explain(self, job_id: int) -> dict:
        return explain_dict(self._call(self._jobs.Explain, jobs_pb2.GetJobRequest(id=job_id)))

    def list(self, *, queue: str = "", state: str = "", limit: int = 0, user: str = "", cluster: str = "",
             name: str = "", array: int = 0) -> list[dict]:
        """Jobs in id order; limit 0 lists every job (paging through the server's pages). user and cluster
        match exactly, name any job whose name contains it (ignoring case); array: only its elements."""
        out: list[dict] = []
        token = ""
        while True:
            page = min(limit - len(out), 1000) if limit else 1000
            reply = self._call(self._jobs.List, jobs_pb2.ListJobsRequest(queue=queue, state=state, limit=page,
                                                                       page_token=token, user=user,
                                                                       cluster=cluster, name=name,
                                                                       array_id=array))
            out.extend(job_dict(j) for j in reply.jobs)
            token = reply.next_page_token
            if not token or (limit and len(out) >= limit):
                return out

    def cancel(self, job_ids: list[int] = (), *, arrays: list[int] = ()) -> list[dict]:
        """Cancel these jobs, and every element not yet ended of these arrays: the jobs as they were."""
        return [job_dict(j) for j in self._call(self._jobs.Cancel, jobs_pb2.CancelRequest(
            ids=list(job_ids), array_ids=list(arrays))).jobs]

    def watch(self, job_id: int = 0, after_event_id: int = 0, *, duration_s: float | None = None
              ) -> Iterator[dict]:
        """Job events (of job `job_id`, else of every job this token may see) as they happen, after the event
        `after_event_id` (0: from the first). Ends on error, on close, or after `duration_s` seconds if given.

        The events come from WatchBatches (those the server reads together in one message); a dispatcher
        older than it answers UNIMPLEMENTED before any event, and the same events then come from Watch."""
        request = jobs_pb2.WatchRequest(job_id=job_id, after_event_id=after_event_id)
        deadline = None if duration_s is None else time.monotonic() + duration_s

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())
        calls = []  # cancelled when the caller stops reading: the server then ends the stream at once
        try:
            try:
                calls.append(self._jobs.WatchBatches(request, metadata=self._metadata, timeout=left()))
                for batch in calls[-1]:
                    for event in batch.events:
                        yield event_dict(event)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                calls.append(self._jobs.Watch(request, metadata=self._metadata, timeout=left()))
                for event in calls[-1]:
                    yield event_dict(event)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED:
                return
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and deadline is not None:
                return
            raise rpc_error(exc) from None
        finally:
            for call in calls:
                call.cancel()

    def wait(self, job_ids: Iterable[int], timeout_s: float | None = None) -> list[dict]:
        """Wait until every job has ended (SUCCEEDED, FAILED or CANCELLED): the jobs as they ended, in the
        order of `job_ids`. ClientError DEADLINE_EXCEEDED, naming the jobs still going, when `timeout_s`
        seconds pass first (None: no limit)."""
        ids = list(job_ids)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        ended: dict[int, dict] = {}
        for job_id in dict.fromkeys(ids):
            job = self.get(job_id)
            if job["state"] in FINAL_STATES:
                ended[job_id] = job
        remaining = set(ids) - set(ended)
        if remaining:
            only = next(iter(remaining)) if len(remaining) == 1 else 0  # one job: its events only
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            for event in self.watch(only, duration_s=left):  # from the first event: none is missed
                if event["jobId"] in remaining and event["to"] in FINAL_STATES:
                    remaining.discard(event["jobId"])
                    ended[event["jobId"]] = self.get(event["jobId"])
                    if not remaining:
                        break
        if remaining:
            going = ", ".join(str(i) for i in sorted(remaining))
            if timeout_s is None:  # the watch ended early: the client was closed
                raise ClientError("CANCELLED", f"wait: closed before job {going} ended")
            raise ClientError("DEADLINE_EXCEEDED", f"wait: after {timeout_s:g}s, not ended yet: job {going}")
        return [ended[i] for i in ids]

    def logs(self, job_id: int, *, attempt: int = 0, pod: str = "", pod_set: str = "", tail: int = 0,
             follow: bool = False) -> Iterator[dict]:
        """A job's pod logs, {"pod", "line", "attempt", "cluster"} a line, as the agent of the cluster that ran
        the attempt reads them (the latest attempt unless `attempt` names one); `tail`: each pod's last lines
        only; `follow`: new lines until the pods end. ClientError NOT_FOUND when the cluster no longer holds
        the pods, UNAVAILABLE when its agent cannot be reached."""
        request = jobs_pb2.LogsRequest(id=job_id, attempt=attempt, pod=pod, pod_set=pod_set, tail_lines=tail,
                                       follow=follow)
        try:
            # A read that does not follow ends on its own; one that follows is ended by the caller (close()).
            for reply in self._jobs.Logs(request, metadata=self._metadata,
                                         timeout=None if follow else self.config.timeout_s):
                for line in reply.lines:
                    yield {"pod": line.pod, "line": line.line, "attempt": reply.attempt, "cluster": reply.cluster}
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED:
                return
            raise rpc_error(exc) from None

    def create_schedule(self, document: dict) -> dict:
        """Create a schedule from its Schedule document (docs/api.md); one of that name must not exist."""
        return schedule_dict(self._call(self._schedules.Create,
                                        schedules_pb2.CreateScheduleRequest(document_json=_encode(document))))

    def schedules(self) -> list[dict]:
        """The schedules this token may see (a user's own; an admin's every one), by name."""
        return [schedule_dict(s) for s in self._call(self._schedules.List,
                                                     schedules_pb2.ListSchedulesRequest()).schedules]

    def schedule(self, name: str) -> dict:
        return schedule_dict(self._call(self._schedules.Get, schedules_pb2.ScheduleRequest(name=name)))

    def suspend_schedule(self, name: str) -> dict:
        return schedule_dict(self._call(self._schedules.Suspend, schedules_pb2.ScheduleRequest(name=name)))

    def resume_schedule(self, name: str) -> dict:
        return schedule_dict(self._call(self._schedules.Resume, schedules_pb2.ScheduleRequest(name=name)))

    def delete_schedule(self, name: str) -> dict:
        """Delete a schedule (as it was, returned); the jobs it started stay."""
        return schedule_dict(self._call(self._schedules.Delete, schedules_pb2.ScheduleRequest(name=name)))

    def trigger_schedule(self, name: str) -> dict:
        """Start one run of a schedule now: {"jobId", "cancelled", "schedule"}."""
        reply = self._call(self._schedules.Trigger, schedules_pb2.ScheduleRequest(name=name))
        return {"jobId": reply.job_id, "cancelled": list(reply.cancelled), "schedule": schedule_dict(reply.schedule)}

    def clusters(self) -> list[dict]:
        return cluster_dicts(self._call(self._jobs.ListClusters, jobs_pb2.ListClustersRequest()))

    def queues(self) -> list[dict]:
        return queue_dicts(self._call(self._jobs.ListQueues, jobs_pb2.ListQueuesRequest()))

    def usage(self, *, since_s: float = 0, by: str = "queue") -> dict:
        """Resource-hours and cost per group over the last `since_s` seconds (0: all time).

        resourceHours are hours of base units (cpu core-hours, memory GiB-hours, others unit-hours);
        `total` adds up the groups.
        """
        return usage_dict(self._call(self._jobs.Usage, jobs_pb2.UsageRequest(since_seconds=since_s, by=by)), by)


def _ordered_resources(amounts: dict) -> dict:
    """cpu, memory, then the other resources by name."""
    first = [r for r in ("cpu", "memory") if r in amounts]
    return {r: amounts[r] for r in first + sorted(r for r in amounts if r not in first)}
