"""Accepting jobs: the server's authoritative validation, then one insert for the whole batch.

A batch is all-or-nothing: any invalid document rejects the call and nothing is created.

Concurrent calls share a transaction (group commit, `Submitter`): the first caller in writes every call
waiting at that moment in one transaction, validated against what that transaction reads, and each call
is answered after the commit with its own ids or its own error. Under load that turns N commits, N
reads of the classes, queues and clusters, and N pairs of notifications into one of each.
"""
from __future__ import annotations

import json
import threading

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from dispatcher.capacity import snapshot
from dispatcher.errors import DispatcherError, InvalidRequest, NotFound, PermissionDenied
from dispatcher.policy.placing import ClusterState, QueuedJob, impossible
from dispatcher.store import jobs as job_store
from dispatcher.store.models import Cluster, Queue, ServiceClass
from dispatcher.store.tokens import Principal
from sluice.spec import JobSpec, SpecError, job_from_document

MAX_BATCH = 10_000  # jobs per Submit call
MAX_SPEC_BYTES = 1 << 20  # one job document


def parse(specs_json: list[str]) -> list[JobSpec]:
    if not specs_json:
        raise InvalidRequest("submit: no jobs given")
    if len(specs_json) > MAX_BATCH:
        raise InvalidRequest(f"submit: {len(specs_json)} jobs in one call, at most {MAX_BATCH}")
    out = []
    for n, text in enumerate(specs_json, 1):
        if len(text) > MAX_SPEC_BYTES:
            raise InvalidRequest(f"job {n}: document is {len(text)} bytes, at most {MAX_SPEC_BYTES}")
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"job {n}: not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise InvalidRequest(f"job {n}: expected a JSON object")
        if "\\u0000" in text and (where := _nul_at(doc)) is not None:  # Postgres cannot store it in jsonb
            raise InvalidRequest(f"job {n}: {where or 'document'}: contains a NUL character (\\u0000)")
        try:
            out.append(job_from_document(doc, document=n if len(specs_json) > 1 else None))
        except SpecError as exc:
            raise InvalidRequest(str(exc)) from exc
    return out


def _nul_at(value, path: str = "") -> str | None:
    """The path of the first key or string holding a NUL character, or None."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        here = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key
        if isinstance(key, str) and "\x00" in key:
            return here.replace("\x00", "\\u0000")
        if (found := _nul_at(item, here)) is not None:
            return found
    return None


def submit(session: Session, principal: Principal, specs: list[JobSpec]) -> list[int]:
    """Validate and insert one call's jobs in the caller's transaction; returns their ids."""
    return job_store.submit(session, _Config.read(session, {s.queue for s in specs}).rows(principal, specs))


class Submitter:
    """Submit calls from many threads, written in shared transactions (group commit).

    A call queues its ticket; if no write is under way it writes every queued ticket itself, else it waits
    for the writer, which hands the next write to the first ticket still queued when it is done.
    """

    def __init__(self, sessions: sessionmaker):
        self._sessions = sessions
        self._lock = threading.Lock()
        self._queued: list[_Ticket] = []
        self._writing = False

    def submit(self, principal: Principal, specs: list[JobSpec]) -> list[int]:
        ticket = _Ticket(principal, specs)
        with self._lock:
            self._queued.append(ticket)
            leads = not self._writing
            self._writing = True
        if not leads:
            ticket.turn.wait()  # answered, or handed the next write
        if not ticket.answered:
            with self._lock:
                group, self._queued = self._queued, []
            try:
                self._write(group)
            finally:
                with self._lock:
                    if self._queued:
                        self._queued[0].turn.set()
                    else:
                        self._writing = False
        return ticket.result()

    def _write(self, group: list[_Ticket]) -> None:
        try:
            with self._sessions.begin() as session:
                config = _Config.read(session, {s.queue for t in group for s in t.specs})
                rows = []
                for t in group:
                    try:
                        t.rows = config.rows(t.principal, t.specs)
                        rows += t.rows
                    except DispatcherError as exc:
                        t.answer(error=exc)
                ids = iter(job_store.submit(session, rows))
            for t in group:
                if not t.answered:
                    t.answer(ids=[next(ids) for _ in t.rows])
        except Exception as exc:
            if len(group) == 1:
                group[0].answer(error=exc)
                return
            for t in group:  # one call's trouble must not fail the others: each alone, with its own error
                if not t.answered:
                    self._write([t])
        finally:
            for t in group:
                if not t.answered:  # never leave a caller waiting
                    t.answer(error=RuntimeError("submit: not written"))


class _Ticket:
    def __init__(self, principal: Principal, specs: list[JobSpec]):
        self.principal, self.specs = principal, specs
        self.rows: list[job_store.NewJob] = []
        self.turn = threading.Event()
        self.answered = False
        self._ids: list[int] = []
        self._error: BaseException | None = None

    def answer(self, *, ids: list[int] | None = None, error: BaseException | None = None) -> None:
        self._ids, self._error, self.answered = ids or [], error, True
        self.turn.set()

    def result(self) -> list[int]:
        if self._error is not None:
            raise self._error
        return self._ids


class _Config:
    """What validating a job reads: the service classes, the queues it names, every cluster's allocatable."""

    def __init__(self, classes: dict[str, int], queues: dict[str, dict], known: list[ClusterState] | None):
        self.classes = classes  # name -> priority
        self.queues = queues  # name -> the Queue object's spec
        self.known = known  # None while any cluster has never reported (then nothing is judged)
        self._impossible: dict[tuple, str | None] = {}

    @classmethod
    def read(cls, session: Session, queues: set[str]) -> "_Config":
        classes = dict(session.execute(select(ServiceClass.name, ServiceClass.priority)).all())
        found = dict(session.execute(select(Queue.name, Queue.spec).where(Queue.name.in_(queues))).all())
        known: list[ClusterState] | None = []
        for name, tier, site, labels, spec, capacity in session.execute(
                select(Cluster.name, Cluster.tier, Cluster.site, Cluster.labels, Cluster.spec, Cluster.capacity)
                .order_by(Cluster.name)):
            if not capacity:
                known = None
                break
            allocatable = dict(capacity.get("allocatable", {}))
            known.append(ClusterState(name, tier, site, dict(labels), allocatable, dict(allocatable),
                                      **snapshot.terms(spec, allocatable)))
        return cls(classes, {name: (spec or {}).get("spec", {}) for name, spec in found.items()}, known or None)

    def rows(self, principal: Principal, specs: list[JobSpec]) -> list[job_store.NewJob]:
        """The rows to insert for one call's jobs; raises for the first that may not be submitted."""
        out = []
        for n, spec in enumerate(specs, 1):
            where = f"job {n}" if len(specs) > 1 else "job"
            qspec = self.queues.get(spec.queue)
            if qspec is None:
                raise NotFound(f"{where}: spec.queue: queue {spec.queue!r} not found")
            members = qspec.get("members") or []
            if principal.role != "admin" and members and principal.subject not in members:
                raise PermissionDenied(f"{where}: {principal.subject} may not submit to queue {spec.queue!r}")
            listed = qspec.get("serviceClasses") or []
            accepted = listed or sorted(self.classes)
            class_name = spec.service_class or self._default_class(listed)
            if class_name not in self.classes:
                raise NotFound(f"{where}: spec.serviceClass: service class {class_name!r} not found")
            if class_name not in accepted:
                raise InvalidRequest(f"{where}: spec.serviceClass: queue {spec.queue!r} accepts only "
                                     f"{', '.join(accepted)}")
            requests, largest = spec.total_requests(), spec.largest_pod()
            why = self.impossible(spec, requests, largest)
            if why:
                raise InvalidRequest(f"{where}: {why}")
            doc = spec.to_document()
            doc["spec"]["serviceClass"] = class_name
            out.append(job_store.NewJob(
                name=spec.name, queue=spec.queue, service_class=class_name, class_priority=self.classes[class_name],
                priority=spec.priority, max_retries=spec.max_retries, spec=doc, requests=requests,
                largest_pod=largest, placement=doc["spec"].get("placement", {}), labels=dict(spec.labels),
                submitted_by=principal.subject))
        return out

    def impossible(self, spec: JobSpec, requests: dict, largest: dict) -> str | None:
        """Why no cluster could ever run the job; judged once per job shape and placement."""
        if self.known is None:
            return None
        p = spec.placement
        key = (tuple(sorted(requests.items())), tuple(sorted(largest.items())),
               tuple(sorted(p.cluster_selector.items())), tuple(p.tiers), tuple(p.sites))
        if key not in self._impossible:
            job = QueuedJob(0, requests, largest, dict(p.cluster_selector), tuple(p.tiers), tuple(p.sites))
            self._impossible[key] = impossible(job, self.known)
        return self._impossible[key]

    def _default_class(self, listed: list[str]) -> str:
        """The queue's first listed class; else `standard`; else the lowest-priority class there is."""
        if listed:
            return listed[0]
        if "standard" in self.classes:
            return "standard"
        if not self.classes:
            raise InvalidRequest("job: spec.serviceClass: required, no service classes are defined")
        return min(self.classes, key=lambda name: (self.classes[name], name))
