"""The simulated world a replay runs in: clusters of nodes, the trace's jobs and what each is doing.

Every policy of a replay (Sluice's own cycle and the baselines) acts on this state and on nothing
else. Capacity is counted the way an agent reports it: free = allocatable less every dispatched job's
requests; a job's pods are put on nodes first-fit decreasing when it starts (a gang starts whole or
waits on its cluster, holding its requests, until it packs).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, replace

from dispatcher.capacity import usable
from dispatcher.capacity.usable import ClusterCapacity
from dispatcher.policy.placing import ClusterState, QueuedJob, nodes_within
from dispatcher.policy.plans import Active, ClassPolicy
from sluice.objects import ClusterObject
from sluice.packing import expand, first_fit_decreasing, gang_nodes_to_request, held_per_node
from sluice.quantity import add, fits, subtract

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
    kept_off: frozenset[int] = frozenset()  # this attempt's: the nodes its pods may not bind to (Place.avoid_nodes)
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
    """A cluster of nodes: what each node has free, and the cluster's state as the policy reads it.

    An elastic one (spec.elastic) grows and shrinks as the sim agent's cluster does (agent/backends/sim/
    cluster.py): when dispatched gangs do not pack, it asks for the new nodes that hold them
    (sluice.packing.gang_nodes_to_request), up to maxNodes, each joining provisioningDelay later; a node it
    added that has run no pod for scaleDownAfter leaves (not while others are on their way); the starting
    nodes always stay. The policy sees its headroom (what maxNodes would add), as from a real agent."""

    def __init__(self, obj: ClusterObject):
        if obj.simulated is None:
            raise ValueError(f"cluster {obj.name} has no simulated nodes (spec.simulated) to replay on")
        self.obj = obj
        self.name = obj.name
        self.node_shape = dict(obj.simulated.node)
        self.starting = obj.simulated.nodes
        elastic = obj.elastic or {}
        self.max_nodes: int | None = elastic.get("maxNodes")  # None: it keeps its nodes
        self.provisioning_delay_s = float(elastic.get("provisioningDelay", 0.0))
        self.scale_down_after_s = float(elastic.get("scaleDownAfter", 600.0))
        # Per node slot, in the order nodes came (first fit goes in that order): what it has free, and how many
        # pods run there; a node removed leaves its slot empty (`gone`), so that running pods keep their index.
        self.node_free = [dict(self.node_shape) for _ in range(self.starting)]
        self.pods_on = [0] * self.starting
        self.gone: set[int] = set()
        self.idle_since: dict[int, float] = {}  # added nodes running no pod, since when
        self.joining: list[float] = []  # when each node asked for joins
        self.allocatable = add({}, self.node_shape, self.starting) if self.starting else \
            {r: 0 for r in self.node_shape}
        self.free = dict(self.allocatable)  # less every dispatched job, started or not
        self.pending: list[SimJob] = []  # dispatched gangs that do not pack yet, in dispatch order
        self._terms()
        self._capacity: ClusterCapacity | None = None

    def _terms(self) -> None:
        """What the cluster's object adds to its state, as the dispatcher reads it (usable.terms), for the
        nodes it has now (an elastic one's headroom shrinks as it grows)."""
        self.terms = usable.terms(self.obj.to_document(), self.allocatable)
        self._capacity = None

    @property
    def paid(self) -> bool:
        return bool(self.terms.get("paid"))

    def capacity(self) -> ClusterCapacity:
        """The cluster as a cycle reads it (kept until the cluster changes)."""
        if self._capacity is None:
            slots, nodes = self._usable()
            largest: dict[str, int] = {}
            for n in nodes:
                for r, amount in n.items():
                    if amount > largest.get(r, 0):
                        largest[r] = amount
            largest = {r: min(v, self.free.get(r, 0)) for r, v in largest.items()}
            state = ClusterState(self.name, self.obj.tier, self.obj.site, dict(self.obj.labels), dict(self.free),
                                 largest, "", dict(self.allocatable), **self.terms,
                                 node_free=tuple(nodes_within(nodes, self.free)),
                                 node_names=tuple(map(str, range(len(nodes)) if slots is None else slots)))
            self._capacity = ClusterCapacity(state, "active", "agent", 0.0, dict(self.allocatable))
        return self._capacity

    def _usable(self) -> tuple[list[int] | None, list[dict[str, int]]]:
        """The nodes there now: their slots (None: every slot, none has gone), and what each has free."""
        if not self.gone:
            return None, self.node_free
        slots = [i for i in range(len(self.node_free)) if i not in self.gone]
        return slots, [self.node_free[i] for i in slots]

    def pack(self, job: SimJob) -> list[int] | None:
        """The node of each of the job's pods (in pod order), first-fit decreasing over what the nodes have
        free, as the dispatcher's check and the sim agent pack them; None if they do not all fit at once."""
        slots, free = self._usable()
        kept_off = {i for i, slot in enumerate(range(len(free)) if slots is None else slots)
                    if slot in job.kept_off} if job.kept_off else ()
        _, found = first_fit_decreasing(expand(job.pods), free, kept_off)
        if None in found:
            return None
        return found if slots is None else [slots[i] for i in found]

    def grows_for(self, job: SimJob) -> bool:
        """Whether the job would start here once the nodes this (elastic) cluster may still have joined: what
        the dispatcher counts on in sending a job to a cluster's headroom."""
        if self.max_nodes is None or not fits(job.requests, add(self.free, self.terms.get("headroom", {}))):
            return False
        more = self.max_nodes - (len(self.node_free) - len(self.gone))
        _, found = first_fit_decreasing(expand(job.pods), [*self._usable()[1], *[self.node_shape] * more])
        return None not in found

    def never_holds(self, job: SimJob) -> str | None:
        """Why the cluster, empty and with as many nodes as it may have, could not run the job; None if it could."""
        count = max(self.starting, self.max_nodes or 0)
        allocatable = add({}, self.node_shape, count)
        if not fits(job.requests, allocatable):
            return f"{self.name} has {allocatable} in all"
        if None in first_fit_decreasing(expand(job.pods), [dict(self.node_shape)] * count)[1]:
            return f"its pods do not pack onto {self.name}'s nodes"
        return None

    def dispatch(self, job: SimJob, now: float) -> bool:
        """Take the job's requests; start its pods if they pack (True), else it waits here."""
        self.free = subtract(self.free, job.requests)
        self._capacity = None
        if self._start(job, now):
            return True
        self.pending.append(job)
        self._scale_up(now)
        return False

    def _start(self, job: SimJob, now: float) -> bool:
        nodes = self.pack(job)
        if nodes is None:
            return False
        for i, pod in zip(nodes, expand(job.pods)):
            self.node_free[i] = subtract(self.node_free[i], pod)
            self.pods_on[i] += 1
            self.idle_since.pop(i, None)
        job.placed_on = nodes
        self._capacity = None
        return True

    def release(self, job: SimJob, now: float) -> list[SimJob]:
        """The job ended or was evicted: give back what it held; the pending gangs that now pack start
        (returned)."""
        self.free = add(self.free, job.requests)
        self._capacity = None
        if job.pending:
            self.pending.remove(job)
            return []
        for i, pod in zip(job.placed_on, expand(job.pods)):
            self.node_free[i] = add(self.node_free[i], pod)
            self.pods_on[i] -= 1
            if not self.pods_on[i]:
                self._emptied(i, now)
        job.placed_on = []
        return self._start_pending(now)

    def _start_pending(self, now: float) -> list[SimJob]:
        started = []
        for waiting in list(self.pending):
            if self._start(waiting, now):
                self.pending.remove(waiting)
                started.append(waiting)
        self._scale_up(now)
        return started

    # -- an elastic cluster's nodes --------------------------------------------------------------------

    def next_change(self) -> float:
        """When a node asked for joins, or an idle added node may leave (math.inf: never)."""
        due = min(self.joining, default=math.inf)
        if not self.joining and self.idle_since:
            due = min(due, min(self.idle_since.values()) + self.scale_down_after_s)
        return due

    def change(self, now: float) -> list[SimJob]:
        """The nodes that join by `now`, and the idle ones that leave; returns the pending gangs started."""
        started: list[SimJob] = []
        while self.joining and self.joining[0] <= now:
            self.joining.pop(0)
            self.node_free.append(dict(self.node_shape))
            self.pods_on.append(0)
            self.allocatable = add(self.allocatable, self.node_shape)
            self.free = add(self.free, self.node_shape)
            self._emptied(len(self.node_free) - 1, now)
            self._terms()
            started += self._start_pending(now)
            if not self.joining:  # the idle nodes kept for a gang on its way start their cool-down again
                for i, since in self.idle_since.items():
                    self.idle_since[i] = max(since, now)
        if not self.joining:
            for i, since in list(self.idle_since.items()):
                if since + self.scale_down_after_s <= now:
                    del self.idle_since[i]
                    self.gone.add(i)
                    self.node_free[i] = {r: 0 for r in self.node_shape}
                    self.allocatable = subtract(self.allocatable, self.node_shape)
                    self.free = subtract(self.free, self.node_shape)
                    self._terms()
        return started

    def _emptied(self, slot: int, now: float) -> None:
        """The node runs no pod from now on: one the cluster added starts its cool-down."""
        if self.max_nodes is not None and slot >= self.starting:
            self.idle_since[slot] = now

    def _scale_up(self, now: float) -> None:
        """Ask for the nodes the pending gangs need; each joins provisioningDelay after now."""
        if self.max_nodes is None or not self.pending:
            return
        room = self.max_nodes - (len(self.node_free) - len(self.gone)) - len(self.joining)
        wanted = gang_nodes_to_request((expand(job.pods) for job in self.pending), self.node_shape,
                                       len(self.joining), room, self._usable()[1])
        self.joining += [now + self.provisioning_delay_s] * wanted


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
        # (virtual time, every cluster's allocatable from then on): elastic clusters change it
        self.capacity = [(0.0, self._allocatable())]
        self.version = 0  # bumped by every change of capacity or usage

    def enqueue(self, job: SimJob) -> None:
        job.state = QUEUED
        bisect.insort(self.queued.setdefault(job.queue, []), (job.order, job), key=lambda e: e[0])

    def heads(self, queue: str, n: int) -> list[SimJob]:
        return [job for _, job in self.queued.get(queue, [])[:n]]

    def queued_count(self) -> int:
        return sum(len(q) for q in self.queued.values())

    def dispatch(self, job: SimJob, cluster: str, now: float, avoid_nodes: tuple[str, ...] = ()) -> bool:
        """Start the job on the cluster now (True), or leave it dispatched there until its pods pack; `avoid_nodes`:
        the names of nodes its pods may not bind to (Place.avoid_nodes; the capacity names nodes by slot)."""
        entries = self.queued[job.queue]
        del entries[bisect.bisect_left(entries, job.order, key=lambda e: e[0])]
        job.state, job.cluster, job.attempt = RUNNING, cluster, job.attempt + 1
        job.kept_off = frozenset(map(int, avoid_nodes))
        self.running[job.id] = job
        self.usage[job.queue] = add(self.usage.get(job.queue, {}), job.requests)
        cls = self.classes.get(job.service_class)
        self.actives[job.id] = Active(job.id, job.queue, job.service_class, job.class_priority, job.priority,
                                      cluster, job.requests, cls.preemptible if cls else False,
                                      self.epoch + now + job.max_runtime_s if job.max_runtime_s else None,
                                      job.as_queued().pods)
        self.version += 1
        started = self.clusters[cluster].dispatch(job, now)
        job.pending = not started
        if started:
            self._started(job, now)
        return started

    def _started(self, job: SimJob, now: float) -> None:
        job.pending, job.started, job.ends = False, now, now + job.run_s - job.saved_s
        self.actives[job.id] = replace(self.actives[job.id],  # where its pods are, as an agent reports it
                                       nodes=held_per_node(zip(map(str, job.placed_on), expand(job.pods))))
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
        started = self.clusters[job.cluster].release(job, now)
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

    def next_change(self) -> float:
        """When an elastic cluster's nodes next change (math.inf: never)."""
        return min((c.next_change() for c in self.clusters.values()), default=math.inf)

    def change(self, now: float) -> bool:
        """Carry out the node changes due by `now` (the gangs they let start, started); whether any was due."""
        due = False
        for cluster in self.clusters.values():
            if cluster.next_change() <= now:
                due = True
                self.version += 1
                for job in cluster.change(now):
                    self._started(job, now)
        if due and (total := self._allocatable()) != self.capacity[-1][1]:
            self.capacity.append((now, total))
        return due

    def _allocatable(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for cluster in self.clusters.values():
            total = add(total, cluster.allocatable)
        return total

    def take_started(self) -> list[SimJob]:
        started, self.started = self.started, []
        return started
