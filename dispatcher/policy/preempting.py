"""The victim search: which running attempts one queued job evicts to start, by its class (preemption) or
its queue's guarantee (reclaim), and the room that frees held for it (planning.py asks it where a job
cannot start otherwise)."""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import replace

from dispatcher.policy.held import HeldView, unpaid
from dispatcher.policy.placing import Clusters, ClusterState, QueuedJob, matching
from dispatcher.policy.plans import Active, Candidate, ClassPolicy, CyclePlan, Hold, Preempt
from dispatcher.policy.quotas import QuotaTree
from sluice.packing import expand, first_fit_decreasing
from sluice.quantity import add, fits

VICTIM_SEARCH = 500  # victim sets tried, at most, in looking for one smaller than the greedy choice


class RunningAttempts(dict):
    """Per cluster, the active attempts the cycle sees one by one. Given only those that ETAs and
    reservations need, it reads the preemption victims (`more`) where the first search for them starts:
    reading every attempt a search may evict is costly, and most cycles start none."""

    def __init__(self, active: list[Active], more: Callable[[], list[Active]] | None):
        super().__init__()
        self._more = more
        self.queue_of: dict[int, str] = {}
        self._holding: dict[tuple, dict[int, bool]] = {}
        self._by_queue: dict[str, dict[str, list[Active]]] = {}
        self._add(active)

    def _add(self, active: list[Active]) -> None:
        for a in active:
            self.setdefault(a.cluster, []).append(a)
            self.queue_of[a.job_id] = a.queue
        self._by_queue.clear()

    def by_queue(self, cluster: str) -> dict[str, list[Active]]:
        """The cluster's attempts per queue: a search that only reclaims looks at the queues that borrow."""
        found = self._by_queue.get(cluster)
        if found is None:
            found = self._by_queue[cluster] = {}
            for a in self.get(cluster, ()):
                found.setdefault(a.queue, []).append(a)
        return found

    def evict(self, cluster: str, victim: Active) -> None:
        self[cluster].remove(victim)
        self._by_queue.pop(cluster, None)

    def holding_a_pod(self, shapes: list[dict[str, int]]) -> Callable[[Active], bool]:
        """Whether one of a victim's pods would hold one of these pods: on several nodes, no other victim
        counts towards a packing (_packs), so none other is worth evicting. Kept for the cycle: its
        searches ask it of the same attempts for the same few job shapes."""
        known = self._holding.setdefault(tuple(tuple(shape.items()) for shape in shapes), {})

        def holds(victim: Active) -> bool:
            found = known.get(victim.job_id)
            if found is None:
                found = known[victim.job_id] = any(fits(shape, pod) for shape in shapes
                                                   for _, pod in (victim.pods or ((1, victim.requests),)))
            return found
        return holds

    def victims(self, out: CyclePlan) -> RunningAttempts:
        """Every attempt a search may evict, read now if it was not (skipping those seen already, and the
        jobs this plan placed, which a store may show as active once their dispatch is sent ahead)."""
        if self._more is not None:
            more, self._more = self._more, None
            seen = set(self.queue_of) | {p.job_id for p in out.places}
            self._add([a for a in more() if a.job_id not in seen])
        return self


def preempt(c: Candidate, tree: QuotaTree, state: Clusters, views: HeldView, running: RunningAttempts,
             classes: dict[str, ClassPolicy], out: CyclePlan, now: float, failed: dict[tuple, tuple] | None = None,
             quota: bool = False) -> bool:
    """Evict the fewest eligible jobs on one cluster so that `c` fits there (and, with quota, so that the
    maxima on its queue's path leave room for it); hold that room for `c`.

    failed: searches that found nothing, kept so that the same search is not run again while nothing it
    depends on has changed. It depends on the job's requests, pods and placement (with the clusters it
    avoids), its class priority, whether it may preempt or reclaim, the job that evicted it, its queue
    (reclaim and maxima only), and on the clusters, holds, running jobs and queue usage, which change only
    with a placement, a preemption or a hold made or given up (a job that holds a reservation gives it up
    for the search; a job holding a preemption never searches)."""
    cls = classes.get(c.service_class)
    can_preempt = bool(cls and cls.can_preempt) and not quota  # no class preempts its way past a maximum
    reclaim = tree.below_guarantee(c.queue, c.job.requests)
    if not (can_preempt or reclaim):
        return False
    running = running.victims(out)
    if not any(running.values()):  # nothing runs on any cluster: no victim anywhere
        return False
    search = state_then = None
    if failed is not None and c.job.id not in out.holds:
        job = c.job
        search = (tuple(sorted(job.requests.items())), tuple((n, tuple(sorted(pod.items()))) for n, pod in job.pods),
                  tuple(sorted(job.cluster_selector.items())), job.tiers, job.sites, job.avoid, c.class_priority,
                  can_preempt, reclaim, quota, c.preempted_by, c.queue if reclaim or quota else None)
        state_then = (len(out.places), len(out.preemptions), out.holds.version)
        if failed.get(search) == state_then:
            return False
    evicting = {p.victim for p in out.preemptions}
    excess = tree.excess(c.queue, c.job.requests) if quota else {}
    shapes = [pod for _, pod in c.job.pods] or [c.job.requests]

    evictor, priority = c.preempted_by, c.class_priority

    def by_class(a: Active) -> bool:
        return can_preempt and a.preemptible and a.class_priority < priority

    borrowing: dict[str, bool] = {}  # per queue, for this search

    def lends(queue: str) -> bool:
        """Whether reclaim may take from the queue's attempts."""
        if not reclaim or queue == c.queue:
            return False
        found = borrowing.get(queue)
        if found is None:
            found = borrowing[queue] = tree.borrowing(queue)
        return found

    allowed = _Takings(tree, by_class, c.queue, c.job.requests)
    best: tuple | None = None
    view = views.seen_by(out.holds, c.job, now)  # a job searches holding nothing (above)
    for cluster in matching(c.job, unpaid(view).values()):
        if cluster.unavailable or cluster.name in c.job.avoid or not running.get(cluster.name) \
                or not fits(c.job.requests, cluster.allocatable):  # an avoided cluster would not take it after
            continue
        pool = running[cluster.name] if can_preempt else \
            [a for queue, jobs in running.by_queue(cluster.name).items() if lends(queue) for a in jobs]
        # Eligible: evictable, not evicted already nor the job's own evictor, and taken by class or reclaim (reclaim
        # alone: every job of the pool lends). In any order: _smallest_set sorts them.
        candidates = [a for a in pool if a.evictable and a.job_id not in evicting and a.job_id != evictor
                      and (not can_preempt or (a.preemptible and a.class_priority < priority) or lends(a.queue))]
        holding: list[Active] | None = None  # the victims one of whose pods holds one of the job's
        if cluster.node_free and len(cluster.node_free) > 1 and not excess:
            holds = running.holding_a_pod(shapes)
            holding = list(filter(holds, candidates))
            # Where a victim's nodes are not known, only one of its pods that holds a pod of the job helps _packs.
            candidates = [a for a in candidates if _located(a, cluster) or holds(a)]
        if not candidates:  # evicting nobody is never chosen
            continue
        enough = _Enough(c.job, cluster, excess, tree)
        if holding is not None and len(holding) < len(candidates):
            # Node by node first; where that finds no set reclaim may take (it weighs no queue's borrowing), the
            # victims that each hold a pod, as where no node is named.
            chosen = _smallest_set(enough, candidates, allowed, _nodes_first(shapes, cluster, candidates))
            if chosen is None and holding:
                chosen = _smallest_set(enough, holding, allowed)
        else:
            chosen = _smallest_set(enough, candidates, allowed)
        if chosen is not None and chosen:
            cost = (len(chosen), sum(sum(a.requests.values()) for a in chosen), cluster.name)
            if best is None or cost < best[0]:
                best = (cost, cluster.name, chosen)
    if best is None:
        if search is not None:
            failed[search] = state_then
        return False
    _, cluster, victims = best
    for a in victims:
        tree.charge(a.queue, a.requests, -1)
        running.evict(cluster, a)
        state[cluster] = _given_back(state[cluster], a)
        out.preemptions.append(Preempt(a.job_id, c.job.id, cluster))
    ids = tuple(a.job_id for a in victims)
    out.holds[c.job.id] = Hold(c.job.id, cluster, dict(c.job.requests), "preemption", now, ids, pods=c.job.pods)
    out.waits[c.job.id] = f"preempting jobs {', '.join(map(str, ids))} on {cluster}"
    return True


class _Enough:
    """Whether evicting a set of jobs makes the job fit the cluster's free room (and, where the cluster reports
    its nodes, pack onto them: _packs) and gives back `excess` of each maximum."""

    def __init__(self, job: QueuedJob, cluster: ClusterState, excess: dict[str, dict[str, int]], tree: QuotaTree):
        self._need, self._cluster, self._excess, self._tree = job.requests, cluster, excess, tree
        self._pods = expand(job.pods) if job.pods else [job.requests]
        # What victims must free beyond the free room, per resource: a set that frees less is never enough.
        self.short = {r: v - cluster.free.get(r, 0) for r, v in job.requests.items()
                      if v > 0 and v > cluster.free.get(r, 0)}

    def covers(self, victims) -> bool:
        """The first of __call__'s checks, alone: whether the victims free at least `short`."""
        return all(sum(a.requests.get(r, 0) for a in victims) >= v for r, v in self.short.items())

    def __call__(self, victims: list[Active]) -> bool:
        room = dict(self._cluster.free)
        for a in victims:
            room = add(room, a.requests)
        if not fits(self._need, room):
            return False
        if self._cluster.node_free and not _packs(self._pods, self._cluster, victims):
            return False
        for name, over in self._excess.items():
            freed: dict[str, int] = {}
            for a in victims:
                if name in self._tree.path(a.queue):
                    freed = add(freed, a.requests)
            if not fits(over, freed):
                return False
        return True


def _packs(pods: list[dict[str, int]], cluster: ClusterState, victims: list[Active]) -> bool:
    """Whether the pods surely pack onto the cluster's nodes once the victims are gone. On one node, all
    they free is there; a victim whose nodes the cluster names gives its pods' room back on those nodes.
    Where a victim's nodes are not known, each of its pods counts as room of its own, which is at most what
    it frees beside a node's free room, so a packing found here exists on the real nodes; an eviction that
    merely frees enough in total could leave the job unable to start, its hold expiring, and more
    evictions after it."""
    if len(cluster.node_free) == 1:
        room = dict(cluster.node_free[0])
        for a in victims:
            room = add(room, a.requests)
        bins = [room]
    else:
        bins = _node_room(cluster)
        for a in victims:
            bins = _on_nodes(bins, cluster, a)
    return None not in first_fit_decreasing(pods, bins)[1]


def _node_room(cluster: ClusterState) -> list[dict[str, int]]:
    """What each node has free, none below zero: a hold that keeps more than is free leaves every node of the
    view below zero (placing.take), but what it still needs is in the cluster's free room, which _Enough
    weighs first; a node's own room is what its victims' room adds to."""
    return [{r: max(v, 0) for r, v in node.items()} for node in cluster.node_free]


def _located(victim: Active, cluster: ClusterState) -> bool:
    """Whether the cluster names every node the victim's pods hold room on."""
    return bool(victim.nodes) and all(node in cluster.node_names for node, _ in victim.nodes)


def _on_nodes(bins: list[dict[str, int]], cluster: ClusterState, victim: Active) -> list[dict[str, int]]:
    """The nodes' room (`bins`, in the cluster's node order and beyond) with the victim's given back: on its
    nodes where the cluster names them, else each of its pods as room of its own."""
    if _located(victim, cluster):
        bins = list(bins)
        for node, held in victim.nodes:
            i = cluster.node_names.index(node)
            bins[i] = add(bins[i], held)
        return bins
    return [*bins, *(expand(victim.pods) if victim.pods else [victim.requests])]


def _nodes_first(shapes: list[dict[str, int]], cluster: ClusterState, victims: list[Active]) -> dict[int, int]:
    """Per victim on the cluster's named nodes, its node's rank: first the node where the fewest victims,
    taken in the search's order, free room for the job's largest pod; a node none of them can free enough
    on, last. Victims are then taken node by node, not spread over many nodes where none frees a whole
    pod's room. A victim whose nodes are not named ranks before every node (-1: its own pod holds one of
    the job's, or it would not be a candidate)."""
    pod = max(shapes, key=lambda shape: sorted(shape.items()))
    names = cluster.node_names
    on: dict[str, list[tuple[Active, dict[str, int]]]] = {}
    for a in sorted(victims, key=_victim_order):
        if _located(a, cluster):
            for node, held in a.nodes:
                on.setdefault(node, []).append((a, held))
    need: dict[str, tuple[float, int]] = {}
    for i, (name, room) in enumerate(zip(names, _node_room(cluster))):
        count: float = 0 if fits(pod, room) else math.inf
        for k, (_, freed) in enumerate(on.get(name, ()) if count else (), 1):
            room = add(room, freed)
            if fits(pod, room):
                count = k
                break
        need[name] = (count, i)
    rank = {name: r for r, name in enumerate(sorted(names, key=need.__getitem__))}
    return {a.job_id: min(rank[node] for node, _ in a.nodes) for a in victims if _located(a, cluster)}


def _given_back(cluster: ClusterState, victim: Active) -> ClusterState:
    """The cluster once the victim is gone: its requests free again, and on its named nodes their room."""
    free = add(cluster.free, victim.requests)
    if not (cluster.node_free and _located(victim, cluster)):
        return replace(cluster, free=free)
    nodes = tuple(_on_nodes(list(cluster.node_free), cluster, victim))
    largest = {r: min(free.get(r, 0), max(node.get(r, 0) for node in nodes)) for r in free}
    return replace(cluster, free=free, node_free=nodes, largest_free_node=largest)


class _Taken:
    """What a set of victims takes from each queue, and from guarantees (_Takings)."""

    def __init__(self) -> None:
        self.by_queue: dict[str, dict[str, int]] = {}
        self.largest: dict[str, dict[str, int]] = {}  # per queue, its largest victim in each resource
        self.below: dict[str, dict[str, int]] = {}  # per queue, how far it is taken below its guarantee


class _Takings:
    """Reclaim takes from each queue no more than it borrows (QuotaTree.borrowed). For a job whose own
    queue's guarantee still holds it whole, a borrower's last victim may go into the borrower's guarantee:
    the borrower still borrowed, before the last of its victims, some of a resource they take, and what
    the victims take from guarantees is, in each resource, no more than the job adds to its own queue's
    guaranteed use, and less in a resource a victim's queue borrowed (an even swap there only moves the
    shortfall from queue to queue: docs/simulate.md has what it did to Philly's fair share). Every reclaim
    then raises the queues' guaranteed use (per resource, each queue's use up to its guarantee, summed)
    or keeps it and lowers what they borrow, which no round of reclaims can do for ever. A victim its
    class lets be preempted takes nothing from anyone."""

    def __init__(self, tree: QuotaTree, by_class: Callable[[Active], bool], queue: str, requests: dict[str, int]):
        self._tree, self._by_class = tree, by_class
        self._caps: dict[str, dict[str, int] | None] = {}
        guaranteed = tree.queues[queue].guaranteed if queue in tree.queues else {}
        # What the job adds to its queue's guaranteed use, when its guarantee holds it whole; else None.
        self._gain = {r: requests.get(r, 0) for r in guaranteed} if tree.holds_whole(queue, requests) else None

    def adding(self, taken: _Taken, victim: Active) -> bool:
        """Whether a set that takes `taken` may take the victim too; if so, it is counted in."""
        if self._by_class(victim):
            return True
        queue = victim.queue
        if queue not in self._caps:
            self._caps[queue] = self._tree.borrowed(queue)
        cap, before = self._caps[queue], taken.by_queue.get(queue, {})
        after = add(before, victim.requests)
        below: dict[str, int] = {}
        if cap is not None:
            below = {r: after.get(r, 0) - limit for r, limit in cap.items() if after.get(r, 0) > max(limit, 0)}
        largest = taken.largest.get(queue, {})
        largest = {r: max(largest.get(r, 0), victim.requests.get(r, 0)) for r in set(largest) | set(victim.requests)}
        if below:
            if self._gain is None or not _borrowed_before_the_last(cap, after, largest):
                return False
            into: dict[str, int] = {}  # what the set takes from guarantees, per resource
            borrowed: set[str] = set()  # of those, the resources taken from a queue that borrowed them
            for name, amounts in {**taken.below, queue: below}.items():
                for r, amount in amounts.items():
                    into[r] = into.get(r, 0) + amount
                    if self._caps[name].get(r, 0) > 0:
                        borrowed.add(r)
            if any(amount > self._gain.get(r, 0) or (amount == self._gain.get(r, 0) and r in borrowed)
                   for r, amount in into.items() if amount > 0):
                return False
        taken.by_queue[queue], taken.largest[queue], taken.below[queue] = after, largest, below
        return True

    def allow(self, victims) -> bool:
        """Whether reclaim may take every one of these victims together."""
        taken = _Taken()
        return all(self.adding(taken, a) for a in victims)


def _borrowed_before_the_last(borrowed: dict[str, int], taken: dict[str, int], largest: dict[str, int]) -> bool:
    """Whether a queue that victims take `taken` from (`largest`: the largest of them, per resource) still
    borrowed some of a resource they take before the last of them went, whichever went last."""
    return any(limit > 0 and taken.get(r, 0) > 0 and taken[r] - largest[r] < limit for r, limit in borrowed.items())


def _victim_order(a: Active) -> tuple:
    """The order victims are taken in: lowest class and priority, then youngest, first."""
    return a.class_priority, a.priority, -a.job_id


def _smallest_set(enough: _Enough, eligible: list[Active], allowed: _Takings,
                  first: dict[int, int] | None = None) -> list[Active] | None:
    """The fewest victims that are `enough`, lowest class and priority (then youngest) first: chosen greedily
    in that order (passing over any that the set may not take with the others: `allowed`) and pruned of
    any victim the rest can do without, then replaced by the first smaller set in that order that is
    allowed and enough, while that search stays small (it looks for any set when the greedy one found
    none). None when no set found is enough. first: per victim, a rank that goes before that order
    (_nodes_first: node by node)."""
    if enough([]):
        return []
    order = sorted(eligible, key=lambda a: (first.get(a.job_id, -1) if first else 0, *_victim_order(a)))
    chosen = _greedy(enough, order, allowed)
    if chosen is None and not enough(order):  # more victims never make less room: no set of them is enough
        return None
    budget = VICTIM_SEARCH
    for size in range(1, len(order) + 1 if chosen is None else len(chosen)):
        if not _may_cover(order, size, enough.short):  # every set of this size fails: counted as tried
            budget -= math.comb(len(order), size)
            if budget < 0:
                return chosen
            continue
        for combo in itertools.combinations(order, size):
            budget -= 1
            if budget < 0:
                return chosen
            if enough.covers(combo) and allowed.allow(combo) and enough(list(combo)):
                return list(combo)
    return chosen


def _greedy(enough: _Enough, order: list[Active], allowed: _Takings) -> list[Active] | None:
    """The victims taken in order until they are enough, then pruned of any the rest can do without; None
    when even all that may be taken together are not enough."""
    chosen: list[Active] = []
    taken = _Taken()  # what the chosen take (the chosen are allowed)
    for a in order:
        if not allowed.adding(taken, a):
            continue
        chosen.append(a)
        if enough(chosen):
            break
    else:
        return None
    for a in reversed(list(chosen)):
        rest = [b for b in chosen if b is not a]
        if enough(rest) and allowed.allow(rest):  # a victim gone may leave the rest none of what it borrows
            chosen = rest
    return chosen


def _may_cover(victims: list[Active], size: int, short: dict[str, int]) -> bool:
    """Whether some `size` of the victims free `short`: the largest of them do, in every resource."""
    return all(sum(sorted((a.requests.get(r, 0) for a in victims), reverse=True)[:size]) >= v
               for r, v in short.items())
