"""An in-process simulated Kubernetes cluster that implements the agent's Backend protocol.

Used by the demo, tests, benchmarks and policy simulation. It models nodes with allocatable
resources, pods that are created Pending, bound to nodes first fit, run for the duration their
template annotates and then succeed or fail, and the attempt states an agent reports.

Guarantees:
- Binding never overcommits a node (checked on every bind; any excess is recorded in
  `max_overcommit`, which must stay empty).
- Creation is idempotent: an attempt created once (in this process or in the ledger) is never
  created again, and `duplicates` counts pods that were created twice anyway (must stay 0).
- Status changes reach `on_status` in order, each once, from one delivery thread and never while
  the state lock is held, so the callback may call back into the cluster.
- State only advances to the injected clock's `now`: every public call first applies the events
  that are due (pod ends, nodes joining or leaving), so with a fake clock the cluster runs in virtual
  time (the thread only delivers).

Pods run nothing, but each has a log (`logs`): a line at each change, after a first line showing the
environment Sluice sets in its containers (`environment: SLUICE_ARRAY_ID=7 SLUICE_ARRAY_INDEX=2` for an
element of a job array; no such line otherwise). A RUNNING attempt's report carries a made-up, stable
address: `<first pod>.<cluster name>.sim`, with `:<port>` when the first container declares ports.

Attempt states: PENDING on create; RUNNING when every pod of the attempt runs (the gang is up);
SUCCEEDED when every pod succeeded; FAILED when any pod fails or outlives maxRuntime, and the attempt's
other pods are deleted then. Gangs start as under a co-scheduler: all of an attempt's pods bind at once,
first-fit decreasing onto the usable nodes (sluice/packing.py, the packing the dispatcher checks), or
none does and the gang holds no node while it waits; a gang that does not fit does not hold back the
attempts after it. A gang still waiting `gang_start_timeout` after it was created is UNSCHEDULABLE, its
pods deleted, with the kubernetes backend's reason (agent/backends/kubernetes/status.py evaluate): `the
gang did not start within 5m: 0 of 3 pods running; pod 7-1-w-2: 0/2 nodes are available: 2 Insufficient
cpu.` Final attempts stay in inventory() for `final_retention` seconds of the clock.

Nodes: `set_node` cordons a node or marks it not Ready. Such a node is not usable: no new pod binds
to it and `capacity()` leaves it out. The pods already on it keep running (the simulator neither
drains nor evicts). `view()` is one consistent picture of nodes and pods, for the kube-state-metrics
exporter (agent/backends/sim/metrics.py).

Elastic clusters (`SimConfig.max_nodes` set) behave like a cluster autoscaler:
- Scale-up: whenever gangs cannot start on the usable nodes, the cluster asks for as many new nodes as
  it takes to hold them, their pods packed first fit in creation order onto the room the usable nodes
  have, then onto empty nodes of the node shape. Nodes already being provisioned count as empty nodes in
  that packing, so the same pods never ask twice; existing plus provisioning nodes never exceed
  `max_nodes`. A gang that would not fit whole even so (a pod larger than an empty node, or more nodes
  than `max_nodes` allows) asks for nothing. A requested node joins, Ready and schedulable, exactly `provisioning_delay`
  after the request, and waiting pods bind to it then. Until it joins it is nowhere: not in view(),
  capacity() or the exported metrics (the `provisioning` property counts it).
- Scale-down: a node the autoscaler added that has had no Running pod for `scale_down_after` is
  removed (not while other nodes are on their way: a waiting gang may count on it; its cool-down starts
  again when the last of them joins); it leaves view(), capacity() and the metrics. The starting
  `nodes` are never removed, so the cluster never shrinks below its starting size. Node names are
  never reused: node-0, node-1, ... in the order nodes were requested.
- `nodes` may be 0: the cluster starts empty, and capacity() lists the node shape's resources as 0
  (its Pending pods make free negative).
- The ledger records pods, not nodes: a restarted sim starts again at `nodes`.

Time scale: `SimConfig.time_scale` multiplies every simulated duration (pod run times, `maxRuntime`,
`provisioning_delay`, `scale_down_after`, `gang_start_timeout`), so a scaled-down run keeps the same shape
as the real one. Reasons quote the unscaled `maxRuntime` and gang start timeout.

The ledger (sim/ledger.py) records pods and attempt ends, so a restarted sim restores them.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import logging
import os
import pathlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from agent.backends.base import (
    FAILED,
    FINAL_STATES,
    LOST,
    PENDING,
    RUNNING,
    SUCCEEDED,
    UNSCHEDULABLE,
    AttemptStatus,
    CapacityReport,
    LogsGone,
    StatusCallback,
    pod_requests,
    sluice_environment,
)
from agent.backends.sim.ledger import read_ledger
from agent.backends.sim.views import SimNodeView, SimPod, SimPodView, SimView
from sluice.objects import DEFAULT_GANG_START_TIMEOUT_S
from sluice.packing import first_fit_decreasing, gang_nodes_to_request, held_per_node
from sluice.quantity import QuantityError, add, format_duration, parse_duration, shortfall, subtract
from sluice.spec import SIM_DURATION_KEY, SIM_EXIT_CODE_KEY, sim_exit_code

logger = logging.getLogger(__name__)

DURATION_ANNOTATION = SIM_DURATION_KEY
EXIT_CODE_ANNOTATION = SIM_EXIT_CODE_KEY
DEFAULT_DURATION = "1s"
LOST_REASON = "simulated cluster restarted; its pods are gone"
RESTORED_REASON = "recorded before the simulated cluster restarted"

# Pod phases. DELETED: removed before it ended (attempt deleted, or a gang member failed).
_POD_PENDING = "Pending"
_POD_RUNNING = "Running"
_POD_SUCCEEDED = "Succeeded"
_POD_FAILED = "Failed"
_POD_DELETED = "Deleted"

# Events. What happens when a running pod's deadline comes:
_END_EXIT = "exit"  # the container exits with its annotated exit code
_END_KILL = "kill"  # maxRuntime passed first
# and what happens to the nodes of an elastic cluster:
_NODE_JOINS = "node-joins"  # a requested node is provisioned: it becomes Ready and schedulable
_NODE_IDLE = "node-idle"  # an added node may have been idle for scale_down_after: remove it if so
# and what happens to an attempt whose gang may not have started:
_GANG_TIMEOUT = "gang-timeout"  # gang_start_timeout after its creation: UNSCHEDULABLE if still waiting


@dataclass(frozen=True)
class SimConfig:
    nodes: int  # starting number of nodes, named node-0 .. node-{nodes-1}; 0 only when elastic
    node: dict[str, int]  # allocatable of each node, milli-units per resource
    ledger_path: pathlib.Path | None = None  # append-only record of created pods and ended attempts
    time_scale: float = 1.0  # multiplies every simulated duration (pod run time, maxRuntime, node delays)
    final_retention: float = 600.0  # seconds of clock a final attempt stays in inventory()
    max_nodes: int | None = None  # elastic: the autoscaler adds nodes up to this many; None: fixed size
    provisioning_delay: float = 0.0  # seconds (scaled) from asking for a node until it is Ready
    scale_down_after: float = 60.0  # seconds (scaled) an added node stays idle before it is removed
    # seconds (scaled) a gang may wait to start whole before it is UNSCHEDULABLE: the kubernetes default
    gang_start_timeout: float = DEFAULT_GANG_START_TIMEOUT_S
    name: str = "sim"  # the cluster's name, in the made-up addresses of its running attempts

    def __post_init__(self) -> None:
        if self.max_nodes is None:
            if self.nodes < 1:
                raise ValueError(f"SimConfig.nodes must be at least 1 unless the cluster is elastic "
                                 f"(max_nodes set), got {self.nodes}")
        else:
            if self.nodes < 0:
                raise ValueError(f"SimConfig.nodes must be at least 0, got {self.nodes}")
            if self.max_nodes < max(self.nodes, 1):
                raise ValueError(f"SimConfig.max_nodes must be at least nodes ({self.nodes}) and at least 1, "
                                 f"got {self.max_nodes}")
        if self.provisioning_delay < 0:
            raise ValueError(f"SimConfig.provisioning_delay must be at least 0 seconds, "
                             f"got {self.provisioning_delay}")
        if self.scale_down_after < 0:
            raise ValueError(f"SimConfig.scale_down_after must be at least 0 seconds, got {self.scale_down_after}")
        if self.gang_start_timeout <= 0:
            raise ValueError(f"SimConfig.gang_start_timeout must be more than 0 seconds, "
                             f"got {self.gang_start_timeout}")


def _dicts(value: object) -> list[dict]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _seconds(value: object, default: float | None) -> float | None:
    if value is None:
        return default
    try:
        return parse_duration(value)
    except QuantityError:
        logger.warning("sim: unparsable duration, using the default", extra={"value": value})
        return default


def _exit_code(value: object) -> tuple[int, str]:
    """(the exit code a pod ends with, why it fails instead: '' unless the annotation asks for a code no
    process can end with; submit refuses such a job, but one accepted before may still come)."""
    try:
        return sim_exit_code(value), ""
    except ValueError as exc:
        return 1, f"{EXIT_CODE_ANNOTATION} {str(value)[:40]!r}: {exc}"


def _address(pod: str, cluster: str, body: dict) -> str:
    """`<pod>.<cluster>.sim`, with `:<port>` when the first pod set's first container declares ports."""
    pod_sets = _dicts(body.get("podSets"))
    template = pod_sets[0].get("template") if pod_sets else None
    pod_spec = template.get("spec") if isinstance(template, dict) else None
    containers = _dicts(pod_spec.get("containers")) if isinstance(pod_spec, dict) else []
    ports = _dicts(containers[0].get("ports")) if containers else []
    port = ports[0].get("containerPort") if ports else None
    host = f"{pod}.{cluster}.sim"
    return f"{host}:{port}" if isinstance(port, int) and not isinstance(port, bool) and port > 0 else host


# ---------------------------------------------------------------------------------------------
# Mutable simulation state (only touched under SimCluster._cond)


def _node_name(index: int) -> str:
    return f"node-{index}"


@dataclass(eq=False)
class _Pod:
    name: str
    attempt: _Attempt
    request: dict[str, int]
    duration: float  # scaled seconds from bind to exit
    exit_code: int
    problem: str = ""  # why the pod fails at its exit, whatever its exit code (a bad annotation)
    phase: str = _POD_PENDING
    node: int | None = None
    ran_on: int | None = None  # the node it was bound to; kept after it ends (node is cleared)
    pod_set: str = ""
    log: list[str] = field(default_factory=list)  # what `sluice logs` shows of it: a line at each change


@dataclass(eq=False)
class _Node:
    used: dict[str, int] = field(default_factory=dict)  # requests of the pods bound here
    running: int = 0  # pods bound here
    schedulable: bool = True  # False: cordoned
    ready: bool = True  # the Ready condition
    idle_since: float | None = None  # added nodes only: when the last pod left (or it joined empty)


@dataclass(eq=False)
class _Attempt:
    job_id: int
    attempt: int
    max_runtime: float | None = None  # scaled seconds
    max_runtime_text: str = ""
    pods: list[_Pod] = field(default_factory=list)
    state: str = PENDING
    reason: str = ""
    exit_code: int = 0
    at: float = 0.0
    running: int = 0  # pods bound and not yet ended
    succeeded: int = 0
    logged: list[_Pod] = field(default_factory=list)  # every pod it had, kept with their logs after they end
    address: str = ""  # how to reach its first pod while it runs (made up, but stable)
    kept_off: frozenset[int] = frozenset()  # the nodes its pods may not be bound to (DispatchAttempt.avoid_nodes)

    @property
    def key(self) -> tuple[int, int]:
        return (self.job_id, self.attempt)

    def status(self) -> AttemptStatus:
        running = self.state == RUNNING
        return AttemptStatus(self.job_id, self.attempt, self.state, self.reason, self.exit_code, self.at,
                             address=self.address if running else "", nodes=self.nodes() if running else ())

    def nodes(self) -> tuple[tuple[str, dict[str, int]], ...]:
        """What its pods hold on each node they are bound to."""
        return held_per_node((_node_name(pod.node), pod.request) for pod in self.pods if pod.node is not None)


class SimCluster:
    """A simulated cluster implementing agent.backends.base.Backend."""

    def __init__(self, config: SimConfig, *, clock: Callable[[], float] = time.time) -> None:
        self._config = config
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._node_alloc = dict(config.node)
        # Existing nodes by number (node-<number>), in number order: nodes join in the order they were
        # requested, since every request waits the same provisioning_delay.
        self._nodes: dict[int, _Node] = {index: _Node() for index in range(config.nodes)}
        self._provisioning: set[int] = set()  # numbers of requested nodes that have not joined yet
        self._next_node = config.nodes  # names are never reused
        self._pending: list[_Pod] = []  # creation order; entries that left Pending are skipped
        # heap of (deadline, seq, kind, subject): a _Pod for _END_*, a node number for _NODE_*
        self._events: list[tuple[float, int, str, object]] = []
        self._seq = itertools.count()
        self._attempts: dict[tuple[int, int], _Attempt] = {}  # what inventory() shows
        self._known: set[tuple[int, int]] = set()  # every attempt ever created, here or in the ledger
        self._pod_names: set[str] = set()
        self._retention: collections.deque[tuple[float, _Attempt]] = collections.deque()
        self._outbox: collections.deque[AttemptStatus] = collections.deque()
        self._now = clock()
        self._on_status: StatusCallback | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._duplicates = 0
        self._pods_created = 0
        self._max_overcommit: dict[str, int] = {}
        if config.ledger_path is not None:
            self._restore(config.ledger_path)

    # -- Backend protocol ---------------------------------------------------------------------

    def start(self, on_status: StatusCallback) -> None:
        """Start the delivery thread; changes made before start are delivered first. Once per cluster."""
        with self._cond:
            if self._thread is not None:
                raise RuntimeError("SimCluster.start called twice")
            self._on_status = on_status
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="sim-cluster", daemon=True)
        self._thread.start()

    def create_attempt(self, job_id: int, attempt: int, spec: dict, avoid_nodes: tuple[str, ...] = ()) -> bool:
        key = (int(job_id), int(attempt))
        with self._cond:
            now = self._advance()
            if key in self._known:
                return False
            self._known.add(key)
            record = self._build_attempt(key, spec, now)
            record.kept_off = frozenset(self._nodes_named(avoid_nodes))
            self._ledger_write(f"created {key[0]} {key[1]} {pod.name}\n" for pod in record.pods)
            for pod in record.pods:
                if pod.name in self._pod_names:
                    self._duplicates += 1
                    logger.error("sim: pod created twice", extra={"pod": pod.name})
                self._pod_names.add(pod.name)
            self._pods_created += len(record.pods)
            self._attempts[key] = record
            self._pending.extend(record.pods)
            self._emit(record)
            if not record.pods:
                self._finish(record, FAILED, "the job has no pods to run", 0, now)
            else:
                timeout = now + self._config.gang_start_timeout * self._config.time_scale
                heapq.heappush(self._events, (timeout, next(self._seq), _GANG_TIMEOUT, record))
                self._bind_pending(now)
            self._cond.notify_all()
        return True

    def delete_attempt(self, job_id: int, attempt: int) -> None:
        key = (int(job_id), int(attempt))
        with self._cond:
            now = self._advance()
            record = self._attempts.get(key)
            if record is None or record.state in FINAL_STATES:
                return  # absent, or final: its pods are already gone and its record stays
            self._remove_pods(record, now)
            del self._attempts[key]
            # Changes queued but not yet delivered are dropped: a deleted attempt gets no further status.
            kept = [status for status in self._outbox if (status.job_id, status.attempt) != key]
            self._outbox.clear()
            self._outbox.extend(kept)
            self._ledger_write([f"deleted {key[0]} {key[1]}\n"])
            self._bind_pending(now)
            self._cond.notify_all()

    def inventory(self) -> list[AttemptStatus]:
        with self._cond:
            self._advance()
            return [record.status() for record in self._attempts.values()]

    def logs(self, job_id: int, attempt: int, *, pod: str = "", pod_set: str = "", tail_lines: int = 0,
             follow: bool = False, stopped: threading.Event | None = None) -> Iterator[tuple[str, str]]:
        """Each pod's lines: one at each change (created, started, ended, deleted), for as long as the attempt
        is kept (a final one for final_retention; a deleted one no more)."""
        with self._cond:
            self._advance()
            pods = self._logged_pods(job_id, attempt, pod, pod_set)
            sent = {p.name: max(0, len(p.log) - tail_lines) if tail_lines > 0 else 0 for p in pods}
            if not follow:
                lines = [(p.name, line) for p in pods for line in p.log[sent[p.name]:]]
        if not follow:
            yield from lines
            return
        while stopped is None or not stopped.is_set():
            with self._cond:
                self._advance()
                lines = [(p.name, line) for p in pods for line in p.log[sent[p.name]:]]
                for p in pods:
                    sent[p.name] = len(p.log)
                ended = all(p.phase not in (_POD_PENDING, _POD_RUNNING) for p in pods)
                if not lines and not ended:
                    wait = min(self._events[0][0] - self._now, 0.5) if self._events else 0.5
                    self._cond.wait(max(wait, 0.01))
            yield from lines
            if ended and not lines:
                return

    def _logged_pods(self, job_id: int, attempt: int, pod: str, pod_set: str) -> list[_Pod]:
        record = self._attempts.get((int(job_id), int(attempt)))
        what = f"job {job_id} attempt {attempt}"
        if record is None or not record.logged:
            raise LogsGone(f"the cluster holds no pods of {what} (deleted, or never created here)")
        pods = sorted((p for p in record.logged if pod in ("", p.name) and pod_set in ("", p.pod_set)),
                      key=lambda p: p.name)
        if not pods:
            names = ", ".join(sorted(p.name for p in record.logged))
            asked = f"pod {pod!r}" if pod else f"pod set {pod_set!r}"
            raise LogsGone(f"{what} has no {asked}; its pods: {names}")
        return pods

    def capacity(self) -> CapacityReport:
        """What the cluster can still take. Only usable nodes (schedulable and Ready) count:

            allocatable       = sum over usable nodes of the node's allocatable
            free              = allocatable
                                - requests of the Running pods on usable nodes
                                - requests of every Pending pod (never bound in the sim: it will
                                  take room wherever it lands)
            largest_free_node = max over usable nodes of (allocatable - requests of its Running pods);
                                Pending pods are not subtracted
            node_free         = per usable node, allocatable - requests of its Running pods

        Running pods on a cordoned or not-Ready node count nowhere, like the node itself; Succeeded and
        Failed pods hold nothing. Every resource of the node shape is listed (0 when no node is
        usable); any other resource only when non-zero (a Pending pod asking for a resource no node
        has makes that resource's free negative).
        """
        with self._cond:
            self._advance()
            usable = self._usable_nodes()
            allocatable = {name: amount * len(usable) for name, amount in self._node_alloc.items()}
            free = dict(allocatable)
            for index in usable:
                free = subtract(free, self._nodes[index].used)
            for pod in self._pending:
                if pod.phase == _POD_PENDING:
                    free = subtract(free, pod.request)
            largest: dict[str, int] = {}
            node_free = tuple(self._shaped(room) for room in self._room_on(usable))
            for node in node_free:
                for name, amount in node.items():
                    largest[name] = max(largest.get(name, amount), amount)
            if not usable:
                largest = {name: 0 for name in self._node_alloc}
            return CapacityReport(allocatable=allocatable, free=self._shaped(free),
                                  largest_free_node=self._shaped(largest), node_free=node_free,
                                  node_names=tuple(map(_node_name, usable)))

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            thread = self._thread
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    # -- assertions and views -----------------------------------------------------------------

    @property
    def duplicates(self) -> int:
        """Pods created a second time for an attempt whose pods already existed (must stay 0)."""
        with self._cond:
            return self._duplicates

    @property
    def pods_created(self) -> int:
        with self._cond:
            return self._pods_created

    @property
    def max_overcommit(self) -> dict[str, int]:
        """Per resource, the largest amount any node ever exceeded its allocatable by (must stay {})."""
        with self._cond:
            return dict(self._max_overcommit)

    @property
    def node_count(self) -> int:
        """Nodes that exist now, usable or not; nodes still being provisioned are not counted."""
        with self._cond:
            self._advance()
            return len(self._nodes)

    @property
    def provisioning(self) -> int:
        """Nodes requested by the autoscaler that have not joined yet."""
        with self._cond:
            self._advance()
            return len(self._provisioning)

    def set_node(self, name: str, *, schedulable: bool = True, ready: bool = True) -> None:
        """Cordon or uncordon a node and set its Ready condition (KeyError for an unknown node,
        including one still being provisioned or already removed).

        A node that is unschedulable or not Ready takes no new pods and capacity() leaves it out;
        its pods keep running. When a node becomes usable, waiting pods bind to it at once.
        """
        with self._cond:
            now = self._advance()
            node = self._nodes[self._node_index(name)]
            node.schedulable = schedulable
            node.ready = ready
            self._bind_pending(now)
            self._cond.notify_all()

    def view(self) -> SimView:
        """Nodes and pods at one instant, for the kube-state-metrics exporter."""
        with self._cond:
            self._advance()
            nodes = tuple(SimNodeView(_node_name(index), dict(self._node_alloc), node.schedulable, node.ready)
                          for index, node in self._nodes.items())
            pods = tuple(
                SimPodView(pod.name, pod.attempt.job_id, pod.attempt.attempt, pod.phase,
                           None if pod.ran_on is None else _node_name(pod.ran_on), dict(pod.request))
                for record in self._attempts.values() for pod in record.pods)
            return SimView(nodes, pods)

    def pods(self) -> list[SimPod]:
        """Every pod of every non-final attempt, in creation order."""
        with self._cond:
            self._advance()
            return [
                SimPod(pod.name, pod.attempt.job_id, pod.attempt.attempt, pod.phase,
                       None if pod.node is None else _node_name(pod.node))
                for record in self._attempts.values() for pod in record.pods
            ]

    # -- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        """Advance to the clock, deliver queued changes outside the lock, sleep until the next event."""
        while True:
            with self._cond:
                while True:
                    if self._stopping:
                        return
                    now = self._advance()
                    if self._outbox:
                        batch = list(self._outbox)
                        self._outbox.clear()
                        on_status = self._on_status
                        break
                    timeout = max(self._events[0][0] - now, 0.0) if self._events else None
                    self._cond.wait(timeout)
            for status in batch:
                try:
                    on_status(status)
                except Exception:
                    logger.exception("sim: on_status raised",
                                     extra={"job_id": status.job_id, "attempt": status.attempt})

    # -- state changes (caller holds the lock) ------------------------------------------------

    def _advance(self) -> float:
        """Apply every event due by the clock's now, each at its own deadline; return now."""
        now = max(self._clock(), self._now)
        while self._events and self._events[0][0] <= now:
            deadline, _, kind, subject = heapq.heappop(self._events)
            self._now = max(deadline, self._now)
            if kind == _NODE_JOINS:
                self._node_joins(subject, self._now)
            elif kind == _NODE_IDLE:
                self._node_idle(subject, self._now)
            elif kind == _GANG_TIMEOUT:
                self._gang_timeout(subject, self._now)
            else:
                self._pod_ends(subject, kind, self._now)
        self._now = now
        while self._retention and self._retention[0][0] <= now:
            _, record = self._retention.popleft()
            if self._attempts.get(record.key) is record:
                del self._attempts[record.key]
        if self._outbox:
            self._cond.notify_all()
        return now

    def _build_attempt(self, key: tuple[int, int], spec: object, now: float) -> _Attempt:
        scale = self._config.time_scale
        body = spec.get("spec") if isinstance(spec, dict) else None
        body = body if isinstance(body, dict) else {}
        record = _Attempt(key[0], key[1], at=now)
        max_runtime = _seconds(body.get("maxRuntime"), None)
        if max_runtime is not None:
            record.max_runtime = max_runtime * scale
            record.max_runtime_text = str(body.get("maxRuntime")).strip()
        for pod_set in _dicts(body.get("podSets")):
            template = pod_set.get("template") if isinstance(pod_set.get("template"), dict) else {}
            metadata = template.get("metadata") if isinstance(template.get("metadata"), dict) else {}
            annotations = metadata.get("annotations") if isinstance(metadata.get("annotations"), dict) else {}
            duration = _seconds(annotations.get(DURATION_ANNOTATION, DEFAULT_DURATION),
                                parse_duration(DEFAULT_DURATION))
            exit_code, problem = _exit_code(annotations.get(EXIT_CODE_ANNOTATION, "0"))
            request = pod_requests(template.get("spec"))
            try:
                count = max(int(pod_set.get("count", 1)), 0)
            except (TypeError, ValueError):
                count = 1
            name = str(pod_set.get("name", "pods"))
            for index in range(count):
                record.pods.append(_Pod(f"{key[0]}-{key[1]}-{name}-{index}", record, request,
                                        duration * scale, exit_code, problem=problem, pod_set=name))
        record.logged = list(record.pods)
        if record.pods:
            record.address = _address(record.pods[0].name, self._config.name, body)
        environment = " ".join(f"{name}={value}" for name, value in sluice_environment(spec).items())
        for pod in record.pods:
            if environment:  # what a container of this pod would find in its environment
                self._log(pod, now, f"environment: {environment}")
            self._log(pod, now, "created; waiting for a node")
        return record

    def _log(self, pod: _Pod, now: float, text: str) -> None:
        pod.log.append(f"{datetime.fromtimestamp(now, UTC).isoformat(timespec='milliseconds')} {text}")
        self._cond.notify_all()  # a followed log reads it

    def _usable_nodes(self) -> list[int]:
        """Numbers of the nodes that take new pods and count in capacity(): schedulable and Ready."""
        return [index for index, node in self._nodes.items() if node.schedulable and node.ready]

    def _node_index(self, name: str) -> int:
        number = name.removeprefix("node-")
        if not (number.isascii() and number.isdigit()) or f"node-{int(number)}" != name \
                or int(number) not in self._nodes:
            raise KeyError(name)
        return int(number)

    def _nodes_named(self, names: Iterable[str]) -> list[int]:
        """The numbers of the nodes among `names` that this cluster has (a name it never had is no node)."""
        found = []
        for name in names:
            try:
                found.append(self._node_index(name))
            except KeyError:
                pass
        return found

    def _room_on(self, nodes: list[int]) -> list[dict[str, int]]:
        """What each of these nodes has free, in their order."""
        return [subtract(self._node_alloc, self._nodes[index].used) for index in nodes]

    def _waiting_gangs(self) -> dict[_Attempt, list[_Pod]]:
        """The Pending pods, per attempt, in creation order."""
        gangs: dict[_Attempt, list[_Pod]] = {}
        for pod in self._pending:
            if pod.phase == _POD_PENDING:
                gangs.setdefault(pod.attempt, []).append(pod)
        return gangs

    def _shaped(self, amounts: dict[str, int]) -> dict[str, int]:
        """Every resource of the node shape, and other resources only when non-zero.

        A pod asking for zero of a resource the nodes lack leaves a zero behind in the node's usage;
        dropping it keeps reports independent of history.
        """
        return {name: amount for name, amount in amounts.items() if amount or name in self._node_alloc}

    def _bind_pending(self, now: float) -> None:
        """Start waiting gangs in creation order, each whole or not at all: its Pending pods are packed
        first-fit decreasing onto the usable nodes' free room and bound only if every one fits. A gang
        that does not fit holds nothing and keeps waiting, and an elastic cluster asks for nodes for it."""
        usable = self._usable_nodes()
        free = self._room_on(usable)
        still_pending = []
        for record, pods in self._waiting_gangs().items():
            kept_off = {i for i, index in enumerate(usable) if index in record.kept_off} if record.kept_off else ()
            after, slots = first_fit_decreasing([pod.request for pod in pods], free, kept_off)
            if None in slots:
                still_pending.extend(pods)
                continue
            free = after
            for pod, slot in zip(pods, slots):
                self._bind(pod, usable[slot], now)
        self._pending = still_pending
        self._scale_up(now)

    def _gang_timeout(self, record: _Attempt, now: float) -> None:
        """Give up a gang still waiting to start (not deleted, not started): UNSCHEDULABLE, as the kubernetes
        backend reports it, quoting a scheduler-style message for the first pod that did not fit."""
        if record.state != PENDING or self._attempts.get(record.key) is not record or record.running:
            return
        timeout = self._config.gang_start_timeout
        reason = (f"the gang did not start within {format_duration(timeout)}: "
                  f"0 of {len(record.pods)} pods running")
        usable = self._usable_nodes()
        after, slots = first_fit_decreasing([pod.request for pod in record.pods], self._room_on(usable))
        waiting = next((pod for pod, slot in zip(record.pods, slots) if slot is None), None)
        if waiting is not None:
            short: collections.Counter[str] = collections.Counter()
            for node in after:
                lacking = [name for name, need, _ in shortfall(waiting.request, node) if need > 0]
                short.update(f"Insufficient {name}" for name in lacking)
            because = ", ".join(f"{count} {why}" for why, count in sorted(short.items()))
            reason += f"; pod {waiting.name}: 0/{len(usable)} nodes are available" + (f": {because}." if because
                                                                                      else ".")
        self._finish(record, UNSCHEDULABLE, reason, 0, now)

    def _scale_up(self, now: float) -> None:
        """Ask for the nodes the waiting gangs need (gang_nodes_to_request); each joins after the delay."""
        max_nodes = self._config.max_nodes
        if max_nodes is None or not self._pending:
            return
        room = max_nodes - len(self._nodes) - len(self._provisioning)
        gangs = ([pod.request for pod in pods] for pods in self._waiting_gangs().values())
        wanted = gang_nodes_to_request(gangs, self._node_alloc, len(self._provisioning), room,
                                       self._room_on(self._usable_nodes()))
        joins_at = now + self._config.provisioning_delay * self._config.time_scale
        for _ in range(wanted):
            index = self._next_node
            self._next_node += 1
            self._provisioning.add(index)
            heapq.heappush(self._events, (joins_at, next(self._seq), _NODE_JOINS, index))
            logger.debug("sim: node requested", extra={"node": _node_name(index)})

    def _node_joins(self, index: int, now: float) -> None:
        self._provisioning.discard(index)
        self._nodes[index] = _Node()
        logger.debug("sim: node joined", extra={"node": _node_name(index)})
        self._node_emptied(index, now)
        self._bind_pending(now)
        if not self._provisioning:  # the idle nodes kept for a waiting gang start their cool-down again
            for number, node in self._nodes.items():
                if node.idle_since is not None and node.idle_since < now:
                    self._node_emptied(number, now)

    def _node_emptied(self, index: int, now: float) -> None:
        """The node runs no pod from now on: an added node starts its cool-down."""
        if self._config.max_nodes is None or index < self._config.nodes:
            return  # the starting nodes are never removed
        self._nodes[index].idle_since = now
        removal = now + self._config.scale_down_after * self._config.time_scale
        heapq.heappush(self._events, (removal, next(self._seq), _NODE_IDLE, index))

    def _node_idle(self, index: int, now: float) -> None:
        """Remove the node if it stayed idle through the whole cool-down (a pod since then cancels it)."""
        node = self._nodes.get(index)
        if node is None or node.idle_since is None \
                or node.idle_since + self._config.scale_down_after * self._config.time_scale > now:
            return
        if self._provisioning:
            return  # a waiting gang may count on it with the nodes on their way; its cool-down restarts when they join
        del self._nodes[index]
        logger.debug("sim: idle node removed", extra={"node": _node_name(index)})

    def _bind(self, pod: _Pod, index: int, now: float) -> None:
        pod.phase = _POD_RUNNING
        pod.node = index
        pod.ran_on = index
        node = self._nodes[index]
        node.running += 1
        node.idle_since = None
        used = add(node.used, pod.request)
        node.used = used
        for name, amount in used.items():
            excess = amount - self._node_alloc.get(name, 0)
            if excess > 0:
                self._max_overcommit[name] = max(self._max_overcommit.get(name, 0), excess)
                logger.error("sim: node overcommitted", extra={"node": _node_name(index), "resource": name})
        record = pod.attempt
        self._log(pod, now, f"started on node-{index}")
        if record.max_runtime is not None and pod.duration > record.max_runtime:
            heapq.heappush(self._events, (now + record.max_runtime, next(self._seq), _END_KILL, pod))
        else:
            heapq.heappush(self._events, (now + pod.duration, next(self._seq), _END_EXIT, pod))
        record.running += 1
        # The gang is up only when every pod runs at once. A pod that ended before the last one
        # bound means it never was: RUNNING is then skipped and the attempt goes straight to final.
        if record.running == len(record.pods) and record.state == PENDING:
            record.state, record.at = RUNNING, now
            self._emit(record)

    def _pod_ends(self, pod: _Pod, kind: str, now: float) -> None:
        if pod.phase != _POD_RUNNING:
            return  # deleted since its event was scheduled
        self._unbind(pod, now)
        record = pod.attempt
        record.running -= 1
        self._log(pod, now, "killed: the attempt exceeded its maxRuntime" if kind == _END_KILL else
                  f"failed: {pod.problem}" if pod.problem else f"exited with code {pod.exit_code}")
        if kind == _END_KILL:
            pod.phase = _POD_FAILED
            self._finish(record, FAILED, f"exceeded maxRuntime {record.max_runtime_text}", 0, now)
        elif pod.problem:
            pod.phase = _POD_FAILED
            self._finish(record, FAILED, f"pod {pod.name} failed: {pod.problem}", pod.exit_code, now)
        elif pod.exit_code != 0:
            pod.phase = _POD_FAILED
            self._finish(record, FAILED, f"pod {pod.name} exited with code {pod.exit_code}",
                         pod.exit_code, now)
        else:
            pod.phase = _POD_SUCCEEDED
            record.succeeded += 1
            if record.succeeded == len(record.pods):
                self._finish(record, SUCCEEDED, "", 0, now)
        self._bind_pending(now)

    def _finish(self, record: _Attempt, state: str, reason: str, exit_code: int, now: float) -> None:
        self._remove_pods(record, now)
        record.state, record.reason, record.exit_code, record.at = state, reason, exit_code, now
        self._emit(record)
        self._ledger_write([f"ended {record.job_id} {record.attempt} {state} {exit_code} {float(now)!r}\n"])
        self._retention.append((now + self._config.final_retention, record))

    def _remove_pods(self, record: _Attempt, now: float) -> None:
        """Delete every pod of the attempt that has not ended; free what it held."""
        for pod in record.pods:
            if pod.phase == _POD_RUNNING:
                self._unbind(pod, now)
            if pod.phase in (_POD_PENDING, _POD_RUNNING):
                pod.phase = _POD_DELETED
                self._log(pod, now, "deleted")
        record.pods = []

    def _unbind(self, pod: _Pod, now: float) -> None:
        if pod.node is not None:
            node = self._nodes[pod.node]
            node.used = subtract(node.used, pod.request)
            node.running -= 1
            if node.running == 0:
                self._node_emptied(pod.node, now)
            pod.node = None

    def _emit(self, record: _Attempt) -> None:
        self._outbox.append(record.status())

    # -- ledger -------------------------------------------------------------------------------

    def _ledger_write(self, lines: Iterable[str]) -> None:
        path = self._config.ledger_path
        if path is None:
            return
        text = "".join(lines)
        if not text:
            return
        with open(path, "a") as ledger:
            ledger.write(text)
            ledger.flush()
            os.fsync(ledger.fileno())

    def _restore(self, path: pathlib.Path) -> None:
        now = self._now
        restored: dict[tuple[int, int], _Attempt] = {}
        for kind, job_id, attempt, *rest in read_ledger(path):
            key = (job_id, attempt)
            self._known.add(key)
            if kind == "created":
                self._pod_names.add(rest[0])
                restored.setdefault(key, _Attempt(job_id, attempt, state=LOST, reason=LOST_REASON, at=now))
            elif kind == "ended":
                state, exit_code, ended_at = rest
                restored[key] = _Attempt(job_id, attempt, state=state, reason=RESTORED_REASON,
                                         exit_code=exit_code, at=now if ended_at is None else ended_at)
            elif kind == "deleted":
                if key in restored and restored[key].state == LOST:
                    del restored[key]
        for key, record in restored.items():
            self._attempts[key] = record
            self._retention.append((now + self._config.final_retention, record))
