"""The simulated world a replay runs in: clusters of nodes, the trace's jobs and what each is doing.

Every policy of a replay (Sluice's own cycle and the baselines) acts on this state and on nothing
else. Capacity is counted the way an agent reports it: free = allocatable less every dispatched job's
requests; a job's pods are put on nodes first-fit decreasing when it starts (a gang starts whole or
waits on its cluster, holding its requests, until it packs).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from dispatcher.capacity import snapshot
from dispatcher.capacity.snapshot import ClusterCapacity
from dispatcher.policy.placing import ClusterState, QueuedJob
from dispatcher.policy.plans import Active, ClassPolicy
from sluice.objects import ClusterObject
from sluice.packing import expand, first_fit_decreasing
from sluice.quantity import add, subtract

QUEUED, RUNNING, DONE, UNRUNNABLE = "queued", "running", "done", "unrunnable"
WAITING = "waiting"  # not queued yet: for its startAfter, its dependencies or a slot of its array (waiting.py)


@dataclass(frozen=True)
class Dependency:
    """The job may be queued only once the jobs `on` have done `condition`, and think_s after that."""

    on: tuple[int, ...]  # SimJob ids: one job, or the replayed elements of an array
    condition: str  # holding.CONDITIONS
    think_s: float = 0.0
    label: int = 0  # the trace's id of that job (an array's: its first element's), as reasons name it
    array: bool = False


@dataclass(eq=False)
class SimJob:
    """One trace job as the replay moves it: queued, running (on a cluster, until `ends`), done."""

    id: int
    submit: float  # virtual seconds
    run_s: float
    queue: str
    service_class: str
    class_priority: int
    pods: tuple[tuple[int, dict[str, int]], ...]
    requests: dict[str, int]
    largest_pod: dict[str, int]
    # Its requested time: all any policy knows of how long it runs (Sluice's maxRuntime, EASY's estimate); None
    # when the trace does not say.
    max_runtime_s: float | None
    priority: int = 0
    trace_id: int = 0  # its id in the trace (ids here number the jobs in submit order, as a dispatcher does)
    state: str = QUEUED
    cluster: str | None = None
    attempt: int = 0
    started: float | None = None  # this attempt's start
    first_start: float | None = None
    ends: float | None = None
    finished: float | None = None
    preemptions: int = 0
    preempted_by: int | None = None
    reason: str = ""  # why it waits, as the last decision about it said
    pending: bool = False  # dispatched, waiting on its cluster until its pods pack onto nodes
    placed_on: list[int] = field(default_factory=list)  # node index per pod while it runs
    queued_job: QueuedJob | None = None
    shape_key: tuple | None = None
    checkpoint_s: float | None = None  # it saves its progress this often: an eviction loses only what ran since
    saved_s: float = 0.0  # the work its checkpoints kept through evictions: a new attempt runs only the rest
    runs: list[tuple[float, float]] = field(default_factory=list)  # each ended attempt's (start, end)
    hold_until: float | None = None  # virtual time its startAfter ends; None: it has none
    depends_on: tuple[Dependency, ...] = ()
    array_id: int | None = None  # the trace id of its array's first element, when it is an element
    parallelism: int | None = None  # its array's: elements queued or running at once
    eligible: float | None = None  # when it was first queued: its submit, or when its holds ended
    held_by: str | None = None  # the hold it waited for last before it was queued (holding.HOLDS), if any

    def waits(self) -> bool:
        """Whether it may wait before it is queued (waiting.py releases it)."""
        return self.hold_until is not None or bool(self.depends_on) or self.parallelism is not None

    def shape(self) -> tuple:
        """Its pods' requests, hashable: jobs of one shape fit or do not fit the same room."""
        if self.shape_key is None:
            self.shape_key = tuple((n, tuple(sorted(pod.items()))) for n, pod in self.pods)
        return self.shape_key

    @property
    def order(self) -> tuple[int, int, int]:
        """Its place in its queue (cycle_reads.queue_heads' order)."""
        return -self.class_priority, -self.priority, self.id

    def as_queued(self) -> QueuedJob:
        if self.queued_job is None:
            gang = self.pods if sum(count for count, _ in self.pods) > 1 else ()
            self.queued_job = QueuedJob(self.id, self.requests, self.largest_pod, max_runtime_s=self.max_runtime_s,
                                        pods=gang)
        return self.queued_job


class SimCluster:
    """A cluster of nodes: what each node has free, and the cluster's state as the policy reads it."""

    def __init__(self, obj: ClusterObject):
        if obj.simulated is None:
            raise ValueError(f"cluster {obj.name} has no simulated nodes (spec.simulated) to replay on")
        self.obj = obj
        self.name = obj.name
        node = dict(obj.simulated.node)
        self.nodes = [dict(node) for _ in range(obj.simulated.nodes)]
        self.node_free = [dict(node) for _ in range(obj.simulated.nodes)]
        self.allocatable: dict[str, int] = {}
        for n in self.nodes:
            self.allocatable = add(self.allocatable, n)
        self.free = dict(self.allocatable)  # less every dispatched job, started or not
        self.pending: list[SimJob] = []  # dispatched gangs that do not pack yet, in dispatch order
        self.terms = snapshot.terms(obj.to_document(), self.allocatable)
        self.terms.pop("headroom", None)  # elastic growth is not replayed: the cluster keeps its nodes
        self.terms.pop("node_shape", None)
        self.terms.pop("provisioning_delay_s", None)
        self._capacity: ClusterCapacity | None = None

    @property
    def paid(self) -> bool:
        return bool(self.terms.get("paid"))

    def capacity(self) -> ClusterCapacity:
        """The cluster as a cycle reads it (kept until the cluster changes)."""
        if self._capacity is None:
            largest: dict[str, int] = {}
            for n in self.node_free:
                for r, amount in n.items():
                    if amount > largest.get(r, 0):
                        largest[r] = amount
            largest = {r: min(v, self.free.get(r, 0)) for r, v in largest.items()}
            state = ClusterState(self.name, self.obj.tier, self.obj.site, dict(self.obj.labels), dict(self.free),
                                 largest, "", dict(self.allocatable), **self.terms,
                                 node_free=tuple({r: min(v, self.free.get(r, 0)) for r, v in n.items()}
                                                 for n in self.node_free))
            self._capacity = ClusterCapacity(state, "active", "agent", 0.0, dict(self.allocatable))
        return self._capacity

    def pack(self, job: SimJob) -> list[int] | None:
        """The node of each of the job's pods (in pod order), first-fit decreasing over what the nodes have
        free, as the dispatcher's check and the sim agent pack them; None if they do not all fit at once."""
        _, slots = first_fit_decreasing(expand(job.pods), self.node_free)
        return None if None in slots else slots

    def dispatch(self, job: SimJob) -> bool:
        """Take the job's requests; start its pods if they pack (True), else it waits here."""
        self.free = subtract(self.free, job.requests)
        self._capacity = None
        return self._start(job) or (self.pending.append(job) or False)

    def _start(self, job: SimJob) -> bool:
        nodes = self.pack(job)
        if nodes is None:
            return False
        for i, pod in zip(nodes, expand(job.pods)):
            self.node_free[i] = subtract(self.node_free[i], pod)
        job.placed_on = nodes
        self._capacity = None
        return True

    def release(self, job: SimJob) -> list[SimJob]:
        """The job ended or was evicted: give back what it held; the pending gangs that now pack start
        (returned)."""
        self.free = add(self.free, job.requests)
        self._capacity = None
        if job.pending:
            self.pending.remove(job)
            return []
        for i, pod in zip(job.placed_on, expand(job.pods)):
            self.node_free[i] = add(self.node_free[i], pod)
        job.placed_on = []
        started = []
        for waiting in list(self.pending):
            if self._start(waiting):
                self.pending.remove(waiting)
                started.append(waiting)
        return started


class World:
    """The clusters, the jobs queued per queue in queue order, and what runs."""

    def __init__(self, clusters: list[ClusterObject], classes: dict[str, ClassPolicy], epoch: float):
        self.epoch = epoch  # epoch seconds of virtual time 0: the policy reads the clock as a date
        self.clusters = {c.name: SimCluster(c) for c in clusters}
        self.classes = classes
        self.queued: dict[str, list[tuple[tuple[int, int, int], SimJob]]] = {}
        self.running: dict[int, SimJob] = {}
        self.actives: dict[int, Active] = {}
        self.usage: dict[str, dict[str, int]] = {}  # per queue, the requests of what is dispatched there
        self.started: list[SimJob] = []  # jobs started since the replay last took them (take_started)
        self.busy: dict[str, int] = {}  # what the started jobs hold, over every cluster
        self.version = 0  # bumped by every change of capacity or usage

    def enqueue(self, job: SimJob) -> None:
        job.state = QUEUED
        bisect.insort(self.queued.setdefault(job.queue, []), (job.order, job), key=lambda e: e[0])

    def heads(self, queue: str, n: int) -> list[SimJob]:
        return [job for _, job in self.queued.get(queue, [])[:n]]

    def queued_count(self) -> int:
        return sum(len(q) for q in self.queued.values())

    def dispatch(self, job: SimJob, cluster: str, now: float) -> bool:
        """Start the job on the cluster now (True), or leave it dispatched there until its pods pack."""
        entries = self.queued[job.queue]
        del entries[bisect.bisect_left(entries, job.order, key=lambda e: e[0])]
        job.state, job.cluster, job.attempt = RUNNING, cluster, job.attempt + 1
        self.running[job.id] = job
        self.usage[job.queue] = add(self.usage.get(job.queue, {}), job.requests)
        cls = self.classes.get(job.service_class)
        self.actives[job.id] = Active(job.id, job.queue, job.service_class, job.class_priority, job.priority,
                                      cluster, job.requests, cls.preemptible if cls else False,
                                      self.epoch + now + job.max_runtime_s if job.max_runtime_s else None,
                                      job.as_queued().pods)
        self.version += 1
        started = self.clusters[cluster].dispatch(job)
        job.pending = not started
        if started:
            self._started(job, now)
        return started

    def _started(self, job: SimJob, now: float) -> None:
        job.pending, job.started, job.ends = False, now, now + job.run_s - job.saved_s
        self.busy = add(self.busy, job.requests)
        self.started.append(job)
        if job.first_start is None:
            job.first_start = now

    def stop(self, job: SimJob, now: float, *, requeue: bool) -> list[SimJob]:
        """The job's attempt ends (finished, or evicted and queued again); returns the gangs that started
        on its cluster in the room it gave back."""
        del self.running[job.id]
        del self.actives[job.id]
        self.usage[job.queue] = subtract(self.usage[job.queue], job.requests)
        self.version += 1
        if not job.pending:
            self.busy = subtract(self.busy, job.requests)
        started = self.clusters[job.cluster].release(job)
        for other in started:
            self._started(other, now)
        if job.started is not None:
            job.runs.append((job.started, now))
            if requeue and job.checkpoint_s:
                job.saved_s += (now - job.started) // job.checkpoint_s * job.checkpoint_s
        job.pending, job.started, job.ends = False, None, None
        if requeue:
            job.cluster = None
            self.enqueue(job)
        else:
            job.state, job.finished = DONE, now
        return started

    def take_started(self) -> list[SimJob]:
        started, self.started = self.started, []
        return started
