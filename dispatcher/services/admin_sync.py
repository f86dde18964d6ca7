"""Admin objects kept as Kubernetes resources (queues.sluice.io, serviceclasses.sluice.io, clusters.sluice.io,
burstpolicies.sluice.io) in a management cluster, whose agent hands them over (docs/admin-guide.md, "Admin
objects as Kubernetes resources").

The agent sends every such resource it holds, whenever one changed and every few seconds. They are applied
as `sluice admin apply` applies a file: each checked on its own, then together against the stored objects,
all or nothing; an unchanged set changes nothing (and writes no audit record). A resource being deleted
deletes its object, refused while the object is in use. Each resource is answered with its outcome, which
the agent writes into its status (with a Queue's guaranteed, max and used).
Only a cluster whose object says `spec.kubernetes.adminObjects: true` may do this.
"""
from __future__ import annotations

from dataclasses import dataclass

from dispatcher.errors import DispatcherError, NotFound
from dispatcher.services import administering
from dispatcher.store import admin as admin_store
from dispatcher.store import clusters as cluster_store
from dispatcher.store import cycle_reads
from dispatcher.store.database import Session
from sluice._validate import unstorable_at
from sluice.crds import admin_document, resource_summary
from sluice.objects import QueueObject, object_from_document
from sluice.quantity import add
from sluice.spec import SpecError

MAX_RESOURCES = 2000  # resources in one message at most


@dataclass(frozen=True)
class Resource:
    """A custom resource as the management cluster's API server holds it."""

    kind: str
    name: str
    document: dict
    deleting: bool = False
    unreadable: str = ""  # why its document could not be read (it holds the set back like an invalid one)


@dataclass(frozen=True)
class Outcome:
    kind: str
    name: str
    accepted: bool
    message: str = ""
    deleted: bool = False  # its object is gone from Sluice (the resource may go)
    guaranteed: str = ""  # a Queue's, as `kubectl get queues.sluice.io` shows them
    max: str = ""
    used: str = ""


def sync(session: Session, cluster: str, resources: list[Resource]) -> list[Outcome]:
    """Apply the management cluster's resources, delete those being deleted, and say how each went, in order."""
    k8s = cluster_store.get_cluster(session, cluster).spec.get("spec", {}).get("kubernetes", {})
    if not k8s.get("adminObjects"):
        why = f"cluster {cluster!r} is not a management cluster (its spec.kubernetes.adminObjects is not true)"
        return [Outcome(r.kind, r.name, False, why) for r in resources]
    actor = f"kubernetes:{cluster}"
    outcomes = {(r.kind, r.name): o for r in resources if r.deleting for o in [_delete(session, actor, r)]}
    live = [r for r in resources if not r.deleting]
    objects, errors = [], {}
    for r in live:
        try:
            if r.unreadable:
                raise SpecError("", r.unreadable)
            obj = object_from_document(admin_document(r.document))
            if (obj.kind, obj.name) != (r.kind, r.name):
                raise SpecError("metadata.name", f"the resource {r.kind} {r.name} holds {obj.kind} {obj.name}")
            if (r.kind, r.name) in errors or any((o.kind, o.name) == (r.kind, r.name) for o in objects):
                raise SpecError("metadata.name", f"{r.kind} {r.name} is sent twice")
            objects.append(obj)
        except SpecError as exc:
            errors[(r.kind, r.name)] = str(exc)
    if errors:
        first = next(iter(errors))
        held = f"not applied: {administering.WORDS.get(first[0], first[0])} {first[1]} is invalid (all or nothing)"
        outcomes.update({(r.kind, r.name): Outcome(r.kind, r.name, False, errors.get((r.kind, r.name), held))
                         for r in live})
    elif objects:
        try:
            with session.begin_nested():
                administering.apply(session, actor, objects, numbered=False)
            outcomes.update({(r.kind, r.name): Outcome(r.kind, r.name, True, "applied") for r in live})
        except DispatcherError as exc:
            outcomes.update({(r.kind, r.name): Outcome(r.kind, r.name, False, f"not applied: {exc}") for r in live})
    used = _queue_usage(session) if any(r.kind == "Queue" for r in live) else {}
    return [_with_summary(outcomes[(r.kind, r.name)], r, used) for r in resources]


def _delete(session: Session, actor: str, resource: Resource) -> Outcome:
    if unstorable_at({"kind": resource.kind, "name": resource.name}) is not None:  # no object is named so
        return Outcome(resource.kind, resource.name, True, "deleted", deleted=True)
    try:
        with session.begin_nested():
            administering.delete(session, actor, resource.kind, resource.name)
    except NotFound:
        pass  # deleted already (or never applied): the resource may go
    except DispatcherError as exc:
        return Outcome(resource.kind, resource.name, False, f"not deleted: {exc}")
    return Outcome(resource.kind, resource.name, True, "deleted", deleted=True)


def _queue_usage(session: Session) -> dict[str, dict[str, int]]:
    """Each queue's requests of its dispatched and running jobs, a parent's its children's summed."""
    parents = {doc["metadata"]["name"]: doc.get("spec", {}).get("parent")
               for _, doc in admin_store.documents(session, "Queue")}
    used: dict[str, dict[str, int]] = {}
    for queue, requests, jobs in cycle_reads.active_usage(session):
        seen = set()
        while queue and queue not in seen:  # up the tree (a cycle cannot be stored; guarded all the same)
            seen.add(queue)
            used[queue] = add(used.get(queue, {}), requests, jobs)
            queue = parents.get(queue)
    return used


def _with_summary(outcome: Outcome, resource: Resource, used: dict[str, dict[str, int]]) -> Outcome:
    if resource.kind != "Queue" or resource.deleting or not outcome.accepted:
        return outcome
    queue = object_from_document(admin_document(resource.document))
    assert isinstance(queue, QueueObject)
    return Outcome(outcome.kind, outcome.name, True, outcome.message, guaranteed=resource_summary(queue.guaranteed),
                   max=resource_summary(queue.max), used=resource_summary(used.get(queue.name, {})))
