"""The management cluster's side of admin objects kept as Kubernetes resources: the agent of the cluster whose
object says `spec.kubernetes.adminObjects: true` hands every sluice.io Queue, ServiceClass, Cluster and
BurstPolicy its API server holds to the dispatcher, which applies them as `sluice admin apply` would (all or
nothing), and writes each outcome into the resource's status (docs/admin-guide.md, "Admin objects as
Kubernetes resources"):

- `status.accepted`, `status.message`, `status.observedGeneration` and an `Accepted` condition;
- for a Queue, `status.guaranteed`, `status.max` and `status.used`, the columns of `kubectl get queues.sluice.io`;
- the finalizer `sluice.io/admin-object` once its object is in Sluice: deleting the resource deletes the object
  first, and while Sluice refuses (the object is in use) the resource stays, its status saying why. A resource
  that went before its finalizer was on (deleted at once after it was applied) has its object deleted all the
  same, asked again at every send until Sluice has.

The whole set is sent when anything changed and every `refresh_s` (a Queue's used figures move on their own).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from agent.backends.base import AdminOutcome, AdminResource
from agent.backends.kubernetes.api import CUSTOM_RESOURCES, KubeApi, KubeError

log = logging.getLogger(__name__)

FINALIZER = "sluice.io/admin-object"
KINDS = dict(zip(CUSTOM_RESOURCES, ("Queue", "ServiceClass", "Cluster", "BurstPolicy")))
PLURALS = {kind: plural for plural, kind in KINDS.items()}


class AdminObjects:
    """The sluice.io resources of this cluster's API server, and the writing of their outcomes."""

    def __init__(self, api: KubeApi, *, refresh_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self._api = api
        self._refresh_s = refresh_s
        self._clock = clock
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str], dict] = {}  # (kind, name) -> the resource as last seen
        # Resources deleted before their finalizer was on (or forced off): their objects are deleted all the same.
        self._gone: dict[tuple[str, str], dict] = {}
        self._listed: set[str] = set()  # the plurals listed at least once
        self._changed = True
        self._sent_at = float("-inf")

    def replace(self, plural: str, items: list[dict]) -> None:
        kind = KINDS[plural]
        listed = {(kind, (obj.get("metadata") or {}).get("name", "")): obj for obj in items}
        with self._lock:
            for key in [k for k in self._objects if k[0] == kind]:
                if key not in listed:
                    self._gone[key] = self._objects[key]
                del self._objects[key]
            self._objects.update(listed)
            self._listed.add(plural)
            self._changed = True

    def observe(self, plural: str, event: str, obj: dict) -> None:
        key = (KINDS[plural], (obj.get("metadata") or {}).get("name", ""))
        with self._lock:
            before = self._objects.get(key)
            if event == "DELETED":
                if self._objects.pop(key, None) is not None:
                    self._gone[key] = obj
            else:
                self._objects[key] = obj
                self._gone.pop(key, None)
            # Only what the dispatcher reads counts as a change: not this agent's own status writes.
            self._changed = self._changed or _signature(before) != _signature(obj if event != "DELETED" else None)

    def pending(self) -> list[AdminResource]:
        """Every resource, when any changed or refresh_s passed since the last time (and each kind was listed:
        a set missing a kind would be applied without it); else nothing."""
        now = self._clock()
        with self._lock:
            if len(self._listed) < len(KINDS) or (not self._changed and now - self._sent_at < self._refresh_s):
                return []
            self._changed, self._sent_at = False, now
            out = []
            for key, obj in sorted({**self._objects, **self._gone}.items()):
                deleting = key in self._gone or bool((obj.get("metadata") or {}).get("deletionTimestamp"))
                out.append(AdminResource(*key, obj, deleting))
            return out

    def answered(self, outcomes: list[AdminOutcome]) -> None:
        for outcome in outcomes:
            with self._lock:
                if outcome.deleted:
                    self._gone.pop((outcome.kind, outcome.name), None)
                obj = self._objects.get((outcome.kind, outcome.name))
            if obj is None:
                continue
            try:
                self._write(obj, outcome)
            except KubeError as exc:
                log.info("kubernetes: a Sluice object's status not written; trying again", extra={
                    "kind": outcome.kind, "name": outcome.name, "error": str(exc)})
                with self._lock:
                    self._changed = True

    def _write(self, obj: dict, outcome: AdminOutcome) -> None:
        plural, metadata = PLURALS[outcome.kind], obj.get("metadata") or {}
        finalizers = list(metadata.get("finalizers") or [])
        deleting = bool(metadata.get("deletionTimestamp"))
        if outcome.deleted:
            wanted = [f for f in finalizers if f != FINALIZER]
        elif outcome.accepted and not deleting and FINALIZER not in finalizers:
            wanted = [*finalizers, FINALIZER]
        else:
            wanted = finalizers
        if wanted != finalizers:
            obj = self._api.patch_custom(plural, outcome.name, {"metadata": {
                "resourceVersion": metadata.get("resourceVersion"), "finalizers": wanted}})
            if outcome.deleted and not wanted:
                return  # its last finalizer came off: the resource is gone
        status = _status(obj, outcome)
        current = obj.get("status") or {}
        if any(current.get(k) != v for k, v in status.items() if k != "conditions") or _condition_changed(
                current, status["conditions"][0]):
            self._api.patch_custom(plural, outcome.name, {"status": status}, status=True)


def _signature(obj: dict | None) -> tuple | None:
    if obj is None:
        return None
    metadata = obj.get("metadata") or {}
    return metadata.get("generation"), bool(metadata.get("deletionTimestamp")), repr(metadata.get("labels"))


def _status(obj: dict, outcome: AdminOutcome) -> dict:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    generation = (obj.get("metadata") or {}).get("generation") or 0
    status: dict = {"accepted": outcome.accepted, "message": outcome.message, "observedGeneration": generation,
                    "conditions": [{"type": "Accepted", "status": "True" if outcome.accepted else "False",
                                    "reason": "Applied" if outcome.accepted else "Refused",
                                    "message": outcome.message or "-", "observedGeneration": generation,
                                    "lastTransitionTime": now}]}
    if outcome.kind == "Queue" and outcome.accepted:
        status.update(guaranteed=outcome.guaranteed, max=outcome.max, used=outcome.used)
    return status


def _condition_changed(current: dict, condition: dict) -> bool:
    mine = next((c for c in current.get("conditions") or [] if c.get("type") == "Accepted"), None)
    if mine is not None and mine.get("status") == condition["status"]:
        condition["lastTransitionTime"] = mine.get("lastTransitionTime", condition["lastTransitionTime"])
    return mine is None or any(mine.get(k) != condition[k] for k in ("status", "reason", "message",
                                                                        "observedGeneration"))
