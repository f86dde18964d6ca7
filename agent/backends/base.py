"""The contract between the agent's connection loop and a cluster backend, and what every backend
counts the same way (a pod's requests).

A backend owns the cluster-side objects of every attempt. Its source of truth is the cluster itself,
so `inventory()` after a restart tells what exists. Creation is idempotent: creating an attempt that
already exists (or existed) changes nothing.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from sluice.quantity import QuantityError, add, parse_quantity
from sluice.wire import AttemptReport

# Attempt states as the agent sees them. PENDING: objects created, not every pod running yet.
# LOST: the objects vanished without a result (node or cluster loss).
PENDING = "PENDING"
RUNNING = "RUNNING"
SUCCEEDED = "SUCCEEDED"
FAILED = "FAILED"
LOST = "LOST"
UNSCHEDULABLE = "UNSCHEDULABLE"
FINAL_STATES = frozenset({SUCCEEDED, FAILED, LOST, UNSCHEDULABLE})


# The environment variables every pod of an array element sees (both backends set the same).
ENV_ARRAY_ID = "SLUICE_ARRAY_ID"
ENV_ARRAY_INDEX = "SLUICE_ARRAY_INDEX"


@dataclass(frozen=True)
class AttemptStatus(AttemptReport):
    """An attempt's report as the agent keeps it until the dispatcher acks it (`at`: when the cluster
    shows the state was reached, else when the agent observed it)."""


@dataclass(frozen=True)
class CapacityReport:
    """Amounts are milli-units per resource name (cpu 1 core = 1000, memory 1 byte = 1000)."""

    allocatable: dict[str, int] = field(default_factory=dict)
    free: dict[str, int] = field(default_factory=dict)  # allocatable minus requests of non-terminated pods
    largest_free_node: dict[str, int] = field(default_factory=dict)
    # Each usable node's allocatable minus the requests of the pods bound to it: the dispatcher packs gangs onto these.
    node_free: tuple[dict[str, int], ...] = ()
    node_names: tuple[str, ...] = ()  # node_free's node names, in its order (attempts' reports name them)


StatusCallback = Callable[[AttemptStatus], None]


@dataclass(frozen=True)
class IntakeMention:
    """A Job of the cluster's API server for the dispatcher (the kubectl front door): new, changed, still
    open, or being deleted. `document`: the Job (apiVersion, kind, metadata, spec)."""

    uid: str
    namespace: str
    name: str
    document: dict
    deleting: bool = False


@dataclass(frozen=True)
class IntakeAnswer:
    """The dispatcher's answer about one Job: its Sluice job and where that stands (job_id 0: refused, `error`
    says why)."""

    uid: str
    job_id: int = 0
    state: str = ""
    reason: str = ""
    cluster: str = ""  # where its attempt runs or ran
    attempt: int = 0
    error: str = ""


@dataclass(frozen=True)
class AdminResource:
    """A sluice.io custom resource of the management cluster (kind: Queue, ServiceClass, Cluster, BurstPolicy)."""

    kind: str
    name: str
    document: dict
    deleting: bool = False


@dataclass(frozen=True)
class AdminOutcome:
    """How the dispatcher took one resource: accepted (applied, or deleted), or why not; a Queue's figures."""

    kind: str
    name: str
    accepted: bool
    message: str = ""
    deleted: bool = False
    guaranteed: str = ""
    max: str = ""
    used: str = ""


class LogsGone(LookupError):
    """The cluster holds no pods of the attempt (never created, or deleted since), or none that the request
    names: there are no logs to read. Its words say which."""


class Backend(Protocol):
    def start(self, on_status: StatusCallback) -> None:
        """Begin running; every later change of an attempt's state is passed to on_status, in order."""

    def create_attempt(self, job_id: int, attempt: int, spec: dict, avoid_nodes: tuple[str, ...] = ()) -> bool:
        """Create the objects of every pod set of the attempt, its pods kept off the nodes named in avoid_nodes
        (the dispatcher holds the room there for other jobs). False when they already exist(ed)."""

    def delete_attempt(self, job_id: int, attempt: int) -> None:
        """Delete the attempt's objects (cancel, preempt, orphan). No error when absent."""

    def inventory(self) -> list[AttemptStatus]:
        """The current status of every attempt the cluster holds objects (or a record) for."""

    def capacity(self) -> CapacityReport: ...

    def logs(self, job_id: int, attempt: int, *, pod: str = "", pod_set: str = "", tail_lines: int = 0,
             follow: bool = False, stopped: threading.Event | None = None) -> Iterator[tuple[str, str]]:
        """(pod name, line) of the attempt's pods (only `pod`, or the pods of `pod_set`, when given): each
        pod's lines in order, the pods in name order; tail_lines > 0: each pod's last lines only. With follow,
        new lines keep coming until every pod has ended or `stopped` is set. Raises LogsGone."""

    def stop(self) -> None: ...

    # A backend that takes Jobs from its cluster's API server (kubernetes) also has `intake`, with
    # `pending() -> list[IntakeMention]` (what to send now) and `answered(list[IntakeAnswer])`, and
    # `admin_objects`, the same for AdminResource and AdminOutcome (the management cluster's sluice.io objects).


def pod_requests(pod_spec: object) -> dict[str, int]:
    """Effective requests of one pod, milli-units per resource.

    Per resource: max(sum over containers, max over initContainers); a container's limit stands
    in for a missing request. Malformed parts (missing maps, unparsable amounts) count as zero:
    validation happens elsewhere, a backend only has to keep going.
    """
    if not isinstance(pod_spec, dict):
        return {}
    total: dict[str, int] = {}
    for container in _dicts(pod_spec.get("containers")):
        total = add(total, _container_requests(container))
    init_max: dict[str, int] = {}
    for container in _dicts(pod_spec.get("initContainers")):
        for name, amount in _container_requests(container).items():
            init_max[name] = max(init_max.get(name, 0), amount)
    return {name: max(total.get(name, 0), init_max.get(name, 0)) for name in total.keys() | init_max.keys()}


def _dicts(value: object) -> list[dict]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _amounts(mapping: object) -> dict[str, int]:
    if not isinstance(mapping, dict):
        return {}
    out: dict[str, int] = {}
    for name, amount in mapping.items():
        try:
            out[str(name)] = parse_quantity(amount)
        except QuantityError:
            out[str(name)] = 0
    return out


def _container_requests(container: dict) -> dict[str, int]:
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return {}
    return {**_amounts(resources.get("limits")), **_amounts(resources.get("requests"))}


def array_fields(document: object) -> dict[str, int]:
    """`arrayId` and `arrayIndex` of a job document's spec (an element of a job array), those that are
    non-negative integers; {} for a job that is no array element."""
    spec = document.get("spec") if isinstance(document, dict) else None
    if not isinstance(spec, dict):
        return {}
    return {key: spec[key] for key in ("arrayId", "arrayIndex")
            if isinstance(spec.get(key), int) and not isinstance(spec[key], bool) and spec[key] >= 0}


def sluice_environment(document: object) -> dict[str, str]:
    """The environment variables Sluice sets in every container of a job's pods, in a fixed order:
    SLUICE_ARRAY_ID and SLUICE_ARRAY_INDEX for an element of a job array; {} otherwise."""
    fields = array_fields(document)
    names = (("arrayId", ENV_ARRAY_ID), ("arrayIndex", ENV_ARRAY_INDEX))
    return {env: str(fields[key]) for key, env in names if key in fields}
