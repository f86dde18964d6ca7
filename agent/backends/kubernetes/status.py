"""What an attempt's Kubernetes objects mean, and what the cluster can still take.

Pure: objects (the API's JSON dicts) and `now` in, a `Verdict` or a capacity report out. The backend
calls `evaluate` whenever an attempt's objects change and on every tick (the time-based rules).

An attempt's state, in this order of precedence:

1. FAILED: a pod failed past its restart policy (phase Failed; or restartPolicy OnFailure and a
   container restarted more than `restart_limit` times), with the container's reason and exit code in
   the reason (`pod 7-1-worker-0 failed: container main exited with code 3 (Error)`); a pod that ran
   past its `activeDeadlineSeconds` (`exceeded maxRuntime 2h`); a container that cannot start because
   of its image (`InvalidImageName` at once; `ErrImagePull`, `ImagePullBackOff` and the
   `CreateContainer*Error`s once they lasted `pull_grace_s`), with the kubelet's message; a Job with a
   Failed condition. The attempt's unfinished objects are then deleted.
2. LOST: objects of a live attempt deleted by someone else (a pod terminating, or fewer pods than
   the gang once had). The rest is deleted. Not an adopted Job being deleted: that is its owner
   cancelling the job, which the intake tells the dispatcher (docs/user-guide.md).
3. SUCCEEDED: every pod of the gang Succeeded.
4. RUNNING: every pod of the gang exists and is Running (or already Succeeded).
5. UNSCHEDULABLE: none of the above `gang_timeout_s` after the attempt was created; every object is
   deleted. The reason says how many pods ran and quotes the scheduler's message for a waiting pod.
6. PENDING otherwise.

A verdict says when the objects show it was reached (`Verdict.at`): RUNNING at the last pod's start,
SUCCEEDED at the last pod's end, FAILED at the failed container's end (or the Job's Failed condition);
None where they do not say (the agent then stamps the time it looked). A RUNNING verdict also says how
to reach the attempt's first pod (`Verdict.address`, `first_pod`): its `status.podIP`, with `:<port>`
when its first container declares ports (the first one's containerPort); "" while the pod has no IP.

A user's Job that an attempt adopted (objects.py `adoption`) is evaluated as any Job of workload `jobs`,
whatever its completionMode (NonIndexed: its pods have no index, the first by name is the first pod) and
its own backoffLimit (which became the job's maxRetries: Sluice retries as a new attempt). Any failed pod
fails the attempt, even where the Job controller would replace it. Failure outranks success, and Sluice
deletes none of an adopted Job's pods (the backend suspends the Job, whose controller then deletes only its
active ones), so a replacement that succeeds cannot turn the attempt SUCCEEDED, not even for an agent
restarted later.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from agent.backends.base import (
    FAILED,
    LOST,
    PENDING,
    RUNNING,
    SUCCEEDED,
    UNSCHEDULABLE,
    CapacityReport,
)
from agent.backends.base import pod_requests as tolerant_pod_requests
from agent.backends.kubernetes import objects as ko
from sluice.packing import held_per_node
from sluice.quantity import (
    QuantityError,
    add,
    format_duration,
    parse_quantity,
    subtract,
)
from sluice.spec import SpecError
from sluice.spec import pod_requests as spec_requests

# Waiting reasons that mean the container will not start by itself.
FATAL_WAITING = frozenset({"InvalidImageName", "ErrImageNeverPull"})
# ... and those that may clear up (a registry hiccup, a Secret created late): FAILED after the grace.
STUCK_WAITING = frozenset({"ErrImagePull", "ImagePullBackOff", "CreateContainerConfigError",
                           "CreateContainerError", "RunContainerError"})

CLEANUP_NONE = "none"
CLEANUP_UNFINISHED = "unfinished"  # delete the objects that still run or wait; keep the ended ones (their story)
CLEANUP_ALL = "all"


@dataclass(frozen=True)
class Verdict:
    state: str
    reason: str = ""
    exit_code: int = 0
    cleanup: str = CLEANUP_NONE
    at: float | None = None  # seconds since the epoch the objects give for it; None: they do not say
    address: str = ""  # RUNNING: how to reach the first pod (`10.1.2.3:8888`); "": not known
    nodes: tuple[tuple[str, dict[str, int]], ...] = ()  # RUNNING: what its running pods hold on each node


def _meta(obj: dict) -> dict:
    return obj.get("metadata") or {}


def _status(obj: dict) -> dict:
    return obj.get("status") or {}


def name_of(obj: dict) -> str:
    return _meta(obj).get("name", "?")


def terminating(obj: dict) -> bool:
    return bool(_meta(obj).get("deletionTimestamp"))


def phase(pod: dict) -> str:
    return _status(pod).get("phase") or "Pending"


def finished_pod(pod: dict) -> bool:
    return phase(pod) in ("Succeeded", "Failed")


def finished_job(job: dict) -> bool:
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
               for c in _status(job).get("conditions") or [])


def parse_time(text: object) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _container_statuses(pod: dict) -> list[dict]:
    status = _status(pod)
    return (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])


def pod_started_at(pod: dict) -> float | None:
    """When the pod's first container started (running or since ended), else the kubelet's startTime."""
    times = [parse_time(state.get("startedAt")) for c in _container_statuses(pod)
             for state in ((c.get("state") or {}).get("running") or {}, (c.get("state") or {}).get("terminated") or {})]
    times = [t for t in times if t is not None]
    return min(times) if times else parse_time(_status(pod).get("startTime"))


def pod_finished_at(pod: dict) -> float | None:
    """When the pod's last container ended; None while one has not (or the status does not say)."""
    ends = [parse_time(((c.get("state") or {}).get("terminated") or {}).get("finishedAt"))
            for c in _container_statuses(pod)]
    return max(ends) if ends and None not in ends else None


def _latest(times: Iterable[float | None]) -> float | None:
    """The latest of these times; None when any is unknown (the whole is known only when each part is)."""
    found = list(times)
    return max(found) if found and None not in found else None  # type: ignore[type-var]


def _annotated_int(obj: dict, *names: str) -> int | None:
    annotations = _meta(obj).get("annotations") or {}
    for name in names:
        try:
            return int(annotations[name])
        except (KeyError, TypeError, ValueError):
            continue
    return None


def first_pod(pods: Iterable[dict]) -> dict | None:
    """The attempt's first pod: of its first pod set (`sluice.io/pod-set-index`), the one of index 0
    (`sluice.io/pod-index`, or the Job controller's completion index); by name where those are missing."""
    def order(pod: dict) -> tuple:
        pod_set = _annotated_int(pod, ko.ANNOTATION_POD_SET_INDEX)
        index = _annotated_int(pod, ko.ANNOTATION_POD_INDEX, "batch.kubernetes.io/job-completion-index")
        return (pod_set is None, pod_set or 0, index is None, index or 0, name_of(pod))
    return min(pods, key=order, default=None)


def pod_address(pod: dict) -> str:
    """`IP:port` of a pod (its first container's first containerPort), its IP alone without a port, "" without
    an IP (not yet assigned). An IPv6 address is bracketed when a port follows."""
    ip = _status(pod).get("podIP")
    if not isinstance(ip, str) or not ip:
        return ""
    containers = (pod.get("spec") or {}).get("containers") or []
    ports = containers[0].get("ports") if containers and isinstance(containers[0], dict) else None
    port = ports[0].get("containerPort") if isinstance(ports, list) and ports and isinstance(ports[0], dict) else None
    if not isinstance(port, int) or isinstance(port, bool) or port <= 0:
        return ip
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def gang_size(objects: Iterable[dict]) -> int | None:
    sizes = []
    for obj in objects:
        try:
            sizes.append(int((_meta(obj).get("annotations") or {})[ko.ANNOTATION_GANG_SIZE]))
        except (KeyError, ValueError):
            continue
    return max(sizes) if sizes else None


def created_at(objects: Iterable[dict]) -> float | None:
    """When the attempt was created: the earliest `sluice.io/created-at`, else creationTimestamp."""
    times = []
    for obj in objects:
        annotations = _meta(obj).get("annotations") or {}
        at = parse_time(annotations.get(ko.ANNOTATION_CREATED_AT)) or parse_time(_meta(obj).get("creationTimestamp"))
        if at is not None:
            times.append(at)
    return min(times) if times else None


def waiting_problems(pod: dict) -> list[tuple[str, str, str]]:
    """(container, reason, message) for every container waiting on a start problem."""
    out = []
    status = _status(pod)
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in FATAL_WAITING or reason in STUCK_WAITING:
            out.append((container.get("name", "?"), reason, waiting.get("message") or ""))
    return out


def waiting_key(pod: dict, container: str, reason: str) -> str:
    return f"{_meta(pod).get('namespace', '')}/{name_of(pod)}/{container}/{reason}"


def _with_message(text: str, message: object) -> str:
    message = str(message or "").strip()
    return f"{text}: {message}" if message else text


def _pod_failure(pod: dict, now: float, restart_limit: int, pull_grace_s: float,
                 waiting_since: Mapping[str, float]) -> Verdict | None:
    name, status = name_of(pod), _status(pod)
    statuses = _container_statuses(pod)
    if phase(pod) == "Failed":
        terminated = [(c.get("name", "?"), (c.get("state") or {}).get("terminated") or {}) for c in statuses]
        ended = ([(n, t) for n, t in terminated if t and t.get("exitCode", 0) != 0]
                 or [(n, t) for n, t in terminated if t])
        exit_code = int(ended[0][1].get("exitCode", 0)) if ended else 0
        if status.get("reason") == "DeadlineExceeded":
            limit = (_meta(pod).get("annotations") or {}).get(ko.ANNOTATION_MAX_RUNTIME)
            reason = f"exceeded maxRuntime {limit}" if limit else f"pod {name} exceeded its activeDeadlineSeconds"
            return Verdict(FAILED, reason, exit_code, CLEANUP_UNFINISHED)
        if ended:
            container, terminated_state = ended[0]
            reason = (f"pod {name} failed: container {container} exited with code {exit_code} "
                      f"({terminated_state.get('reason') or 'Error'})")
            return Verdict(FAILED, _with_message(reason, terminated_state.get("message")), exit_code,
                           CLEANUP_UNFINISHED, parse_time(terminated_state.get("finishedAt")))
        reason = f"pod {name} failed: {status.get('reason') or 'Failed'}"
        return Verdict(FAILED, _with_message(reason, status.get("message")), 0, CLEANUP_UNFINISHED)
    for container in statuses:
        last = (container.get("lastState") or {}).get("terminated") or {}
        if container.get("restartCount", 0) > restart_limit and last.get("exitCode", 0) != 0:
            code = int(last.get("exitCode", 1))
            reason = (f"pod {name} failed: container {container.get('name', '?')} restarted "
                      f"{container.get('restartCount')} times, last exit code {code} ({last.get('reason') or 'Error'})")
            return Verdict(FAILED, reason, code, CLEANUP_UNFINISHED, parse_time(last.get("finishedAt")))
    for container, reason, message in waiting_problems(pod):
        since = waiting_since.get(waiting_key(pod, container, reason), now)
        if reason in FATAL_WAITING or now - since >= pull_grace_s:
            text = f"pod {name} failed: container {container} cannot start: {reason}"
            return Verdict(FAILED, _with_message(text, message), 0, CLEANUP_UNFINISHED)
    return None


def evaluate(pods: list[dict], jobs: list[dict], *, now: float, gang_timeout_s: float, pull_grace_s: float,
             restart_limit: int = ko.RESTART_LIMIT, waiting_since: Mapping[str, float] | None = None,
             was_complete: bool = False) -> Verdict:
    """The state of one attempt from its pods and Jobs (see the module docstring).

    waiting_since: when each start problem (`waiting_key`) was first seen; was_complete: the attempt
    once had every pod of its gang (so a pod missing now was deleted, not yet to be created)."""
    waiting_since = waiting_since or {}
    live = [p for p in pods if not terminating(p)]
    for pod in sorted(live, key=name_of):
        failure = _pod_failure(pod, now, restart_limit, pull_grace_s, waiting_since)
        if failure is not None:
            return failure
    for job in sorted(jobs, key=name_of):
        for condition in _status(job).get("conditions") or []:
            if condition.get("type") == "Failed" and condition.get("status") == "True":
                if condition.get("reason") == "DeadlineExceeded":
                    limit = (_meta(job).get("annotations") or {}).get(ko.ANNOTATION_MAX_RUNTIME)
                    if limit:
                        return Verdict(FAILED, f"exceeded maxRuntime {limit}", 0, CLEANUP_UNFINISHED)
                text = f"job {name_of(job)} failed: {condition.get('reason') or 'Failed'}"
                return Verdict(FAILED, _with_message(text, condition.get("message")), 0, CLEANUP_UNFINISHED,
                               parse_time(condition.get("lastTransitionTime")))
    expected = gang_size(pods + jobs) or len(pods)
    # A user's Job the attempt adopted, being deleted, is its owner cancelling the job (the intake's doing), not a loss.
    gone = [name_of(o) for o in pods + jobs if terminating(o) and not ko.adopted(o)]
    if gone:
        return Verdict(LOST, f"{', '.join(sorted(gone))} deleted outside Sluice", 0, CLEANUP_ALL)
    if was_complete and len(live) < expected:
        return Verdict(LOST, f"{expected - len(live)} of {expected} pods deleted outside Sluice", 0, CLEANUP_ALL)
    succeeded = [p for p in live if phase(p) == "Succeeded"]
    if expected and len(succeeded) >= expected:
        return Verdict(SUCCEEDED, at=_latest(pod_finished_at(p) for p in succeeded))
    started = [p for p in live if phase(p) in ("Running", "Succeeded")]
    if expected and len(started) >= expected:
        first = first_pod(started)
        return Verdict(RUNNING, at=_latest(pod_started_at(p) for p in started),
                       address=pod_address(first) if first is not None else "", nodes=nodes_held(started))
    begun = created_at(pods + jobs)
    if begun is not None and now - begun >= gang_timeout_s:
        reason = (f"the gang did not start within {format_duration(gang_timeout_s)}: "
                  f"{len(started)} of {expected} pods running")
        for pod in sorted(live, key=name_of):
            if phase(pod) == "Pending":
                scheduled = next((c for c in _status(pod).get("conditions") or []
                                  if c.get("type") == "PodScheduled"), {})
                if scheduled.get("status") == "False" and scheduled.get("message"):
                    reason += f"; pod {name_of(pod)}: {scheduled['message']}"
                    break
        return Verdict(UNSCHEDULABLE, reason, 0, CLEANUP_ALL)
    return Verdict(PENDING)


# -- capacity ----------------------------------------------------------------------------------------

_NOT_RESOURCES = frozenset({"pods"})  # a count of pods, not something a pod requests


def amounts(mapping: object) -> dict[str, int]:
    """Milli-units per resource; an unparsable amount is left out."""
    out: dict[str, int] = {}
    if isinstance(mapping, dict):
        for name, value in mapping.items():
            try:
                out[str(name)] = parse_quantity(value)
            except QuantityError:
                continue
    return out


def pod_requests(pod_spec: object) -> dict[str, int]:
    """Effective requests of one pod as the scheduler counts them (sluice.spec.pod_requests), and the
    tolerant sum when the spec is not what Sluice would accept (a pod someone else made)."""
    try:
        return spec_requests({"spec": pod_spec})
    except (SpecError, QuantityError, TypeError, AttributeError):
        return tolerant_pod_requests(pod_spec)


def nodes_held(pods: list[dict]) -> tuple[tuple[str, dict[str, int]], ...]:
    """What the running pods among `pods` hold on each node they are bound to (spec.nodeName), in node name
    order: evicting their attempt gives that room back there."""
    usages = [usage_of(pod) for pod in pods if phase(pod) == "Running"]
    return held_per_node((u.node, u.requests) for u in usages if u.node is not None)


def node_usable(node: dict) -> bool:
    """Schedulable and Ready: new pods may land there."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in _status(node).get("conditions") or [])


@dataclass(frozen=True)
class PodUsage:
    node: str | None  # spec.nodeName; None while unbound
    requests: dict[str, int]  # milli-units
    active: bool  # not terminated (phase Pending or Running)


def usage_of(pod: dict) -> PodUsage:
    return PodUsage((pod.get("spec") or {}).get("nodeName") or None, pod_requests(pod.get("spec") or {}),
                    not finished_pod(pod))


def capacity(nodes: Iterable[dict], pods: Iterable[PodUsage]) -> CapacityReport:
    """allocatable: summed over usable nodes; free: that minus the requests of every active pod bound to a
    usable node or not bound yet; largest_free_node: per resource, the most free on one usable node;
    node_free: each usable node's allocatable less its active pods' requests, in node name order.
    Resources are the nodes' (without `pods`), plus any other resource active pods request."""
    per_node: dict[str, dict[str, int]] = {}
    for node in nodes:
        if node_usable(node):
            allocatable = amounts(_status(node).get("allocatable"))
            per_node[name_of(node)] = {k: v for k, v in allocatable.items() if k not in _NOT_RESOURCES}
    total: dict[str, int] = {}
    for allocatable in per_node.values():
        total = add(total, allocatable)
    free_per_node = dict(per_node)
    used: dict[str, int] = {}
    for pod in pods:
        if not pod.active:
            continue
        if pod.node is None:
            used = add(used, pod.requests)
        elif pod.node in free_per_node:
            used = add(used, pod.requests)
            free_per_node[pod.node] = subtract(free_per_node[pod.node], pod.requests)
    free = {k: v for k, v in subtract(total, used).items() if k in total or v != 0}
    largest: dict[str, int] = {}
    for node, node_free in free_per_node.items():
        for resource in per_node[node]:
            amount = node_free[resource]
            largest[resource] = max(largest.get(resource, amount), amount)
    node_free = tuple({r: free_per_node[node][r] for r in per_node[node]} for node in sorted(per_node))
    return CapacityReport(allocatable=total, free=free, largest_free_node=largest, node_free=node_free,
                          node_names=tuple(sorted(per_node)))
