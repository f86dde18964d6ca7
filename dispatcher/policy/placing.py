"""Placement: which cluster each queued job goes to this cycle, or why it waits. Pure, no I/O.

Jobs arrive already in scheduling order (class priority, job priority, age). Each job is placed whole on
one cluster or not at all: its total request must fit the cluster's free capacity and its largest pod
must fit the largest free node. When the cluster reports each node's free capacity (`node_free`) and the
job has several pods (`pods`), every pod must also fit at once: first-fit decreasing (sluice/packing.py)
packs them onto the nodes, and `take` takes them off the nodes they were packed onto. An elastic cluster
also offers its headroom (the nodes it may still add, up to its maximum): a job that fits only there
starts after the cluster's provisioning delay, and its largest pod must fit one new node. Tiers are
preferred onprem, then cloud, then edge (edge capacity is kept for the work pinned to it); within a
tier, a cluster where the job starts now before one that must grow first, then the tightest fit
(bin-packing). A job that does not fit never blocks the jobs behind it. Paid clusters are offered only
through a burst policy (policy/bursting.py). A cluster where the job's last attempt could not start
(`avoid`) is left out for a while.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace

from sluice.packing import expand, first_fit, first_fit_decreasing, gang_nodes_to_request
from sluice.quantity import add, fits, format_quantity, shortfall, subtract

TIER_ORDER = {"onprem": 0, "cloud": 1, "edge": 2}


@dataclass(frozen=True)
class ClusterState:
    name: str
    tier: str
    site: str
    labels: dict[str, str]
    free: dict[str, int]
    largest_free_node: dict[str, int]
    unavailable: str = ""  # why it takes no jobs now ("unreachable", "cordoned", ...); "" if it does
    allocatable: dict[str, int] = field(default_factory=dict)  # everything it has, busy or not
    paid: bool = False  # public cloud: used only when a burst policy allows it
    price: dict[str, float] = field(default_factory=dict)  # per unit-hour (memory per GiB-hour)
    headroom: dict[str, int] = field(default_factory=dict)  # elastic: what its nodes to come would add
    node_shape: dict[str, int] = field(default_factory=dict)  # elastic: one new node's allocatable
    provisioning_delay_s: float = 0.0  # elastic: how long a new node takes
    # Each usable node's free capacity, as the agent reports it; () when unknown (then only the aggregate
    # checks above apply). Kept no larger than `free` per resource.
    node_free: tuple[dict[str, int], ...] = ()
    # Each node_free entry's node name, where the agent names them (() from older agents): the victim search
    # finds there the room an active attempt holds on a node (Active.nodes).
    node_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class QueuedJob:
    id: int
    requests: dict[str, int]
    largest_pod: dict[str, int]
    cluster_selector: dict[str, str] = field(default_factory=dict)
    tiers: tuple[str, ...] = ()
    sites: tuple[str, ...] = ()
    max_runtime_s: float | None = None  # its maxRuntime, when it has one
    avoid: tuple[str, ...] = ()  # clusters where its last attempt could not start, left out for a while
    # (count, per-pod requests) per pod set, when the job has more than one pod; () for one pod (or unknown)
    pods: tuple[tuple[int, dict[str, int]], ...] = ()


@dataclass(frozen=True)
class Place:
    job_id: int
    cluster: str
    # Nodes the cluster must keep its pods off: room held there for other jobs leaves none of its pods room
    # (held.kept_for_others), though the cluster's own scheduler would see it free.
    avoid_nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Wait:
    job_id: int
    reason: str


def shape_key(job: QueuedJob) -> tuple:
    """What of a job decides where it fits, for answers a cycle remembers: its requests, largest pod and pod
    sets (by identity: the cycle's reads share one dict per shape), its placement and maxRuntime."""
    selector = tuple(sorted(job.cluster_selector.items())) if job.cluster_selector else ()
    return (id(job.requests), id(job.largest_pod), id(job.pods), selector, job.tiers, job.sites, job.avoid,
            job.max_runtime_s)


def allowed_on(job: QueuedJob, cluster: ClusterState) -> bool:
    if job.tiers and cluster.tier not in job.tiers:
        return False
    if job.sites and cluster.site not in job.sites:
        return False
    return all(cluster.labels.get(k) == v for k, v in job.cluster_selector.items())


def _describe(resources: list[tuple[str, int, int]], where: str) -> str:
    name, need, have = resources[0]
    return f"needs {format_quantity(name, need)} {name}{where}, {format_quantity(name, max(have, 0))} free"


def _short(request: dict[str, int], free: dict[str, int]) -> list[tuple[str, int, int]]:
    # A resource the job asks none of never holds it back, even where free has gone below zero
    # (in-flight dispatches are subtracted before the metrics show them): the same rule as `fits`.
    return [s for s in shortfall(request, free) if s[1] > 0]


def why_not(job: QueuedJob, cluster: ClusterState) -> str | None:
    if cluster.unavailable:
        return cluster.unavailable
    if cluster.name in job.avoid:
        return "its last attempt could not start there (left out for a while)"
    if fits(job.requests, cluster.free) and fits(job.largest_pod, cluster.largest_free_node):
        # What follows finds the same, with lists made for nothing (most answers in a busy cycle).
        return _unpacked(job, cluster)
    short = _short(job.requests, cluster.free)
    if not short:
        short = _short(job.largest_pod, cluster.largest_free_node)
        if not short:
            return _unpacked(job, cluster)
        if not _grows_for(job, cluster):
            return _describe(short, " on one node").replace(" free", " free on its largest node")
    elif not _grows_for(job, cluster):
        if not cluster.headroom:
            return _describe(short, "")
        grown = _short(job.requests, add(cluster.free, cluster.headroom))
        if grown:
            return _describe(grown, "") + " at its maximum size"
        return _describe(_short(job.largest_pod, cluster.node_shape), " on one node").replace(" free", " on a new node")
    return None


def may_fit(job: QueuedJob, cluster: ClusterState) -> bool:
    """Placement's aggregate checks alone (its total, its largest pod on the largest free node, or the
    cluster grown): False means why_not(job, cluster) is not None, found without packing any pod."""
    if cluster.unavailable or cluster.name in job.avoid or not allowed_on(job, cluster):
        return False
    return (fits(job.requests, cluster.free) and fits(job.largest_pod, cluster.largest_free_node)) \
        or _grows_for(job, cluster)


def _unpacked(job: QueuedJob, cluster: ClusterState, grow: bool = True) -> str | None:
    """Why the job's pods do not all fit the cluster's nodes at once (the aggregate checks passed), or None;
    with `grow`, the pods that do not fit may go to an elastic cluster's new nodes.

    No packing when it cannot fail or cannot be judged: one pod (the largest-node check was exact), no
    per-node figures, the whole job on one node, or as many nodes as pods that each hold the largest pod."""
    if not job.pods or not cluster.node_free:
        return None
    count = sum(n for n, _ in job.pods)
    if count <= 1:
        return None
    holding = 0
    for node in cluster.node_free:
        if fits(job.requests, node):
            return None
        if fits(job.largest_pod, node):
            holding += 1
            if holding >= count:
                return None
    requests = expand(job.pods)
    _, slots = first_fit_decreasing(requests, cluster.node_free)
    left = slots.count(None)
    if not left:
        return None
    left_over = [request for request, slot in zip(requests, slots) if slot is None]
    if grow and _grows_for(job, cluster) and _fresh_nodes(left_over, cluster) is not None:
        return None  # the pods that do not fit now go to new nodes: it starts after the provisioning delay
    return f"needs {count} pods{_pods_text(job.pods)} at once, only {count - left} fit on its nodes"


def _fresh_nodes(requests: list[dict[str, int]], cluster: ClusterState) -> int | None:
    """How many new nodes of the cluster's node shape hold these pods (first fit), or None if its headroom
    does not have that many."""
    count = gang_nodes_to_request([requests], cluster.node_shape, 0, len(requests))
    if not count:  # a pod larger than a node (`requests` is never empty)
        return None
    return count if fits(add({}, cluster.node_shape, count), cluster.headroom) else None


def _pods_text(pods: tuple[tuple[int, dict[str, int]], ...]) -> str:
    """" of 5 cpu" when every pod asks the same, else " (2 of 5 cpu, 1 of 1 cpu)"."""
    def shape(request: dict[str, int]) -> str:
        return ", ".join(f"{format_quantity(r, v)} {r}" for r, v in sorted(request.items()) if v > 0) or "nothing"
    shapes = {}
    for count, request in pods:
        if count > 0:
            key = shape(request)
            shapes[key] = shapes.get(key, 0) + count
    if len(shapes) == 1:
        return f" of {next(iter(shapes))}"
    return " (" + ", ".join(f"{n} of {text}" for text, n in shapes.items()) + ")"


def _grows_for(job: QueuedJob, cluster: ClusterState) -> bool:
    """Whether the cluster, grown to its maximum, holds the job (its largest pod on one new node)."""
    return bool(cluster.headroom) and fits(job.requests, add(cluster.free, cluster.headroom)) \
        and fits(job.largest_pod, cluster.node_shape)


def start_delay(job: QueuedJob, cluster: ClusterState) -> float:
    """Seconds until the job could start on a cluster it fits (0, or the time new nodes take)."""
    if fits(job.requests, cluster.free) and fits(job.largest_pod, cluster.largest_free_node) \
            and (not cluster.headroom or _unpacked(job, cluster, grow=False) is None):
        return 0.0  # an elastic cluster's gang that does not pack now waits for new nodes
    return cluster.provisioning_delay_s


def _tightness(job: QueuedJob, cluster: ClusterState) -> float:
    """How little room the job leaves: the smallest leftover share over the resources it asks for."""
    shares = [(cluster.free.get(r, 0) - need) / max(cluster.free.get(r, 0), 1)
              for r, need in job.requests.items() if need > 0]
    return min(shares) if shares else 1.0


def decide(job: QueuedJob, state: dict[str, ClusterState]) -> Place | Wait:
    """Place one job on the best cluster in `state` and take its capacity there, or say why it waits."""
    fitting = [c for c in state.values() if allowed_on(job, c) and why_not(job, c) is None]
    if not fitting:
        return Wait(job.id, _wait_reason(job, list(state.values())))
    best = min(fitting, key=lambda c: _preference(job, c))
    state[best.name] = take(best, job.requests, job.pods)
    return Place(job.id, best.name)


class Clusters(dict):
    """One cycle's clusters by name, with decide()'s choice made fast for many jobs in a row.

    Jobs of one shape (requests, largest pod, placement) rank the clusters alike, so each shape keeps
    its ranking of the clusters that fit (or its reason when none does), and after a change only the
    clusters replaced since are ranked again: every `clusters[name] = ...` is logged. best() answers
    as decide() would over the clusters `include` admits, without taking anything.
    """

    def __init__(self, clusters: list[ClusterState], include=lambda c: True):
        super().__init__((c.name, c) for c in clusters)
        self._include = include
        self._changes: list[str] = []
        self._shapes: dict[tuple, _Ranking] = {}

    def __setitem__(self, name: str, cluster: ClusterState) -> None:
        super().__setitem__(name, cluster)
        self._changes.append(name)

    def changes(self, mark: int) -> tuple[set[str], int]:
        """The clusters replaced since `mark` (a value this returned before; 0: since the start), and the
        mark to pass next time."""
        return set(self._changes[mark:]), len(self._changes)

    def best(self, job: QueuedJob) -> Place | Wait:
        key = (tuple(sorted(job.requests.items())), tuple(sorted(job.largest_pod.items())),
               tuple(sorted(job.cluster_selector.items())), job.tiers, job.sites, job.avoid,
               tuple((n, tuple(sorted(r.items()))) for n, r in job.pods))
        ranking = self._shapes.get(key)
        if ranking is None:
            ranking = self._shapes[key] = _Ranking(job, [c for c in self.values() if self._include(c)])
        else:
            for name in set(self._changes[ranking.seen:]):
                if self._include(self[name]):
                    ranking.update(job, self[name])
        ranking.seen = len(self._changes)
        if ranking.order:
            return Place(job.id, ranking.order[0][-1])
        if ranking.reason is None:
            ranking.reason = _wait_reason(job, [c for c in self.values() if self._include(c)], ranking.why)
        return Wait(job.id, ranking.reason)


class _Ranking:
    """The clusters one job shape fits, best first, by decide()'s order; its reason while none fits."""

    def __init__(self, job: QueuedJob, clusters: list[ClusterState]):
        self.keys: dict[str, tuple] = {}
        self.order: list[tuple] = []
        self.why: dict[str, str | None] = {}  # why_not per cluster the shape may use, for its wait reason
        self.reason: str | None = None
        self.seen = 0
        for c in clusters:
            self.update(job, c)

    def update(self, job: QueuedJob, cluster: ClusterState) -> None:
        old = self.keys.pop(cluster.name, None)
        if old is not None:
            del self.order[bisect.bisect_left(self.order, old)]
        self.reason = None
        if not allowed_on(job, cluster):
            return
        why = self.why[cluster.name] = why_not(job, cluster)
        if why is None:
            new = _preference(job, cluster)
            self.keys[cluster.name] = new
            bisect.insort(self.order, new)


def _preference(job: QueuedJob, c: ClusterState) -> tuple:
    return TIER_ORDER.get(c.tier, 9), start_delay(job, c), _tightness(job, c), c.name


REASON_CLUSTERS = 5  # a wait reason names this many clusters at most; `sluice explain` lists them all
NO_MATCH, NO_FIT = "no cluster matches its placement", "no cluster fits:"  # how a wait for room begins


def _wait_reason(job: QueuedJob, clusters: list[ClusterState], known: dict[str, str | None] | None = None) -> str:
    """known: why_not(job, c) per cluster name, where already asked of these very clusters."""
    candidates = sorted((c for c in clusters if allowed_on(job, c)), key=_rank)
    if not candidates:
        return NO_MATCH + _placement_text(job)
    named = "; ".join(f"{c.name}: {known[c.name] if known and c.name in known else why_not(job, c)}"
                      for c in candidates[:REASON_CLUSTERS])
    more = len(candidates) - REASON_CLUSTERS
    return f"{NO_FIT} {named}" + (f"; and {more} more clusters (sluice explain lists them)" if more > 0 else "")


def take(cluster: ClusterState, requests: dict[str, int],
         pods: tuple[tuple[int, dict[str, int]], ...] = (), *, drain: bool = False,
         kept_off: frozenset[int] = frozenset()) -> ClusterState:
    """The cluster with `requests` less free, and, when it reports its nodes, `pods` (or `requests` as one
    pod) taken off the nodes first-fit decreasing packs them onto, and its largest free node what is left
    on them; without per-node figures, its largest free node can hold no more than what is left.
    drain (room held for a job): a pod that fits no node now takes all that is free, up to its size, on
    the node nearest to holding it, so that room freed there is kept for it until the pod fits.
    kept_off: the indices of nodes the pods must not be bound to (Place.avoid_nodes), as the cluster is told."""
    free = subtract(cluster.free, requests)
    # dataclasses.replace without its __init__ (14 fields set one by one): a busy cycle takes thousands.
    taken = object.__new__(ClusterState)
    taken.__dict__.update(cluster.__dict__, free=free)
    if cluster.node_free:  # the largest free node is known again: the most of each resource left on one node
        nodes = _take_off_nodes(cluster.node_free, requests, pods, free, drain, kept_off)
        taken.__dict__["node_free"] = nodes
        largest = {r: min(free.get(r, 0), max(node.get(r, 0) for node in nodes)) for r in cluster.largest_free_node}
    else:
        largest = {r: min(v, free.get(r, 0)) for r, v in cluster.largest_free_node.items()}
    taken.__dict__["largest_free_node"] = largest
    return taken


def _take_off_nodes(nodes: tuple[dict[str, int], ...], requests: dict[str, int],
                    pods: tuple[tuple[int, dict[str, int]], ...], free: dict[str, int],
                    drain: bool = False, kept_off: frozenset[int] = frozenset()) -> tuple[dict[str, int], ...]:
    if not pods or sum(n for n, _ in pods) <= 1:
        slot = first_fit(requests, nodes, kept_off)  # one pod (or pods unknown): the cheap case of the hot path
        if slot is not None:
            return nodes[:slot] + (subtract(nodes[slot], requests),) + nodes[slot + 1:]
        each, after, slots = [requests], list(nodes), [None]
    else:
        each = expand(pods)
        after, slots = first_fit_decreasing(each, nodes, kept_off)
    if None in slots and drain:
        taken = {s for s in slots if s is not None}
        ranked: list[int] = []
        shape = None
        for pod, slot in zip(each, slots):
            if slot is not None:
                continue
            if pod != shape:  # the nodes by how much of the pod each has free (only the nodes taken change)
                shape = pod
                ranked = [-n for _, n in sorted(_nearness(pod, after), reverse=True)]
            # The node with the most of the pod free (the first of those): it fills up for the pod soonest.
            nearest = next((n for n in ranked if n not in taken), None)
            if nearest is None:
                break
            after[nearest] = subtract(after[nearest], {r: min(after[nearest].get(r, 0), v) for r, v in pod.items()})
            taken.add(nearest)
    if None in slots:  # some of it lands where no node shows it (an elastic cluster's new nodes, a hold)
        after = nodes_within(after, free)
    return tuple(after)


def _nearness(pod: dict[str, int], nodes: list[dict[str, int]]) -> list[tuple[float, int]]:
    """Per node, (the share of the pod it has free, minus its index): the largest is the node nearest to
    holding the pod, the first of equals."""
    asked = [(r, v) for r, v in pod.items() if v]
    if len(asked) == 1:  # one resource: its amount free, up to the pod's, orders the nodes as its share would
        (r, v), = asked
        return [(min(node.get(r, 0), v), -n) for n, node in enumerate(nodes)]
    return [(sum(min(node.get(r, 0), v) / v for r, v in asked), -n) for n, node in enumerate(nodes)]


def nodes_within(nodes: list[dict[str, int]], free: dict[str, int]) -> list[dict[str, int]]:
    """The nodes with no resource above what the whole cluster has free (a node within it is kept as it is)."""
    over = [r for r in {r for node in nodes for r in node} if max(node.get(r, 0) for node in nodes) > free.get(r, 0)]
    if not over:
        return nodes
    return [{r: min(v, free.get(r, 0)) for r, v in node.items()} if any(node.get(r, 0) > free.get(r, 0) for r in over)
            else node for node in nodes]


def verdicts(job: QueuedJob, clusters: list[ClusterState]) -> list[tuple[str, str]]:
    """Per cluster, in preference order: "fits", or why the job cannot start there now."""
    out = []
    for c in sorted(clusters, key=_rank):
        if not allowed_on(job, c):
            out.append((c.name, f"not allowed by its placement{_placement_text(job)}: "
                                f"tier {c.tier}, site {c.site or '-'}"))
        else:
            out.append((c.name, why_not(job, c) or "fits"))
    return out


def matching(job: QueuedJob, clusters) -> list[ClusterState]:
    return [c for c in clusters if allowed_on(job, c)]


def plan(jobs: list[QueuedJob], clusters: list[ClusterState]) -> list[Place | Wait]:
    """One decision per job, in order; capacity taken by earlier placements is not offered again."""
    state = {c.name: c for c in clusters}
    return [decide(job, state) for job in jobs]


def _rank(cluster: ClusterState) -> tuple[int, str]:
    return TIER_ORDER.get(cluster.tier, 9), cluster.name


def _placement_text(job: QueuedJob) -> str:
    parts = []
    if job.sites:
        parts.append("sites " + ",".join(job.sites))
    if job.tiers:
        parts.append("tiers " + ",".join(job.tiers))
    if job.cluster_selector:
        parts.append("selector " + ",".join(f"{k}={v}" for k, v in sorted(job.cluster_selector.items())))
    return f" ({'; '.join(parts)})" if parts else ""


def impossible(job: QueuedJob, allocatable: list[ClusterState]) -> str | None:
    """Why the job could never run, judged against every cluster as if it were empty; None if it could."""
    empty = [replace(c, free=c.free, largest_free_node=c.free, unavailable="", node_free=()) for c in allocatable]
    decision = plan([job], empty)[0]
    if isinstance(decision, Wait):
        return decision.reason.replace("no cluster fits:", "no cluster could ever run it:").replace(" free", " in all")
    return None
