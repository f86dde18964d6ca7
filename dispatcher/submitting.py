"""Accepting jobs: the server's authoritative validation, then one insert for the whole batch.

A batch is all-or-nothing: any invalid document rejects the call and nothing is created.
"""
from __future__ import annotations

import json

from sqlalchemy.orm import Session

from dispatcher.capacity import snapshot
from dispatcher.errors import InvalidRequest, NotFound, PermissionDenied
from dispatcher.policy.placing import ClusterState, QueuedJob, impossible
from dispatcher.store import clusters as cluster_store
from dispatcher.store import jobs as job_store
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
        try:
            out.append(job_from_document(doc, document=n if len(specs_json) > 1 else None))
        except SpecError as exc:
            raise InvalidRequest(str(exc)) from exc
    return out


def _queued_job(spec: JobSpec, job_id: int = 0) -> QueuedJob:
    return QueuedJob(job_id, spec.total_requests(), spec.largest_pod(), dict(spec.placement.cluster_selector),
                     tuple(spec.placement.tiers), tuple(spec.placement.sites))


def submit(session: Session, principal: Principal, specs: list[JobSpec]) -> list[int]:
    classes = cluster_store.service_classes(session)
    queues = {}
    known = _known_capacity(session)
    rows = []
    for n, spec in enumerate(specs, 1):
        where = f"job {n}" if len(specs) > 1 else "job"
        queue = queues.get(spec.queue)
        if queue is None:
            try:
                queue = queues[spec.queue] = cluster_store.get_queue(session, spec.queue)
            except NotFound as exc:
                raise NotFound(f"{where}: spec.queue: {exc}") from exc
        qspec = queue.spec.get("spec", {})
        members = qspec.get("members") or []
        if principal.role != "admin" and members and principal.subject not in members:
            raise PermissionDenied(f"{where}: {principal.subject} may not submit to queue {queue.name!r}")
        listed = qspec.get("serviceClasses") or []
        accepted = listed or sorted(classes)
        class_name = spec.service_class or _default_class(listed, classes)
        if class_name not in classes:
            raise NotFound(f"{where}: spec.serviceClass: service class {class_name!r} not found")
        if class_name not in accepted:
            raise InvalidRequest(f"{where}: spec.serviceClass: queue {queue.name!r} accepts only {', '.join(accepted)}")
        why = impossible(_queued_job(spec), known) if known is not None else None
        if why:
            raise InvalidRequest(f"{where}: {why}")
        doc = spec.to_document()
        doc["spec"]["serviceClass"] = class_name
        rows.append(job_store.NewJob(
            name=spec.name, queue=spec.queue, service_class=class_name, class_priority=classes[class_name].priority,
            priority=spec.priority, max_retries=spec.max_retries, spec=doc, requests=spec.total_requests(),
            largest_pod=spec.largest_pod(), placement=doc["spec"].get("placement", {}), labels=dict(spec.labels),
            submitted_by=principal.subject))
    return job_store.submit(session, rows)


def _default_class(listed: list[str], classes: dict) -> str:
    """The queue's first listed class; else `standard`; else the lowest-priority class there is."""
    if listed:
        return listed[0]
    if "standard" in classes:
        return "standard"
    if not classes:
        raise InvalidRequest("job: spec.serviceClass: required, no service classes are defined")
    return min(classes.values(), key=lambda c: c.priority).name


def _known_capacity(session: Session) -> list[ClusterState] | None:
    """Every cluster's allocatable, or None while any cluster has never reported (then nothing is judged)."""
    out = []
    for c in cluster_store.list_clusters(session):
        if not c.capacity:
            return None
        allocatable = dict(c.capacity.get("allocatable", {}))
        out.append(ClusterState(c.name, c.tier, c.site, dict(c.labels), allocatable, dict(allocatable),
                                **snapshot.terms(c.spec, allocatable)))
    return out or None
