"""One scheduling cycle's decisions: who goes first, what starts where, who waits and why, who is
preempted and what is held. Pure: the clock and every input are passed in.

Order: higher class first; within a class, the queue with the lowest weighted dominant-resource share
(compared from the root of the queue tree down; with the share of its decayed usage history added where
the tree has a usage half-life, quotas.py); within a queue, priority then age. Queues take turns,
so a queue whose head cannot start never stops the others, and one cycle may admit many jobs of one
queue. A job that cannot start:
- over a queue maximum: waits, naming the queue, resource and numbers; unless its queue is below its
  guarantee and borrowers fill an ancestor's maximum: then it reclaims from them, as below;
- no room, and its class may preempt (or its queue is below its guarantee and others borrow): evicts
  the smallest set of eligible jobs on one cluster (reclaim taking no more from a queue than it borrows,
  or its last job where the job's guarantee holds it whole: preempting.py; where the
  cluster reports its nodes, only victims whose own room surely packs the job) and holds that
  room for itself (on the cluster and its nodes, and in its queue's quota, until it starts or the hold
  expires); a job that holds a reservation tries this too (the preemption hold replaces the
  reservation), one that holds a preemption waits for its victims;
- no room on the unpaid clusters, and a burst policy lets it (policy/bursting.py): starts on the
  cheapest paid cluster that fits, within the policy's budgets; the decision is kept;
- no room, and it has waited past its class's reservation time: holds room on its best cluster, so
  smaller jobs may only use what the hold leaves (backfill); where its pods fit no node yet, the hold
  keeps all that is free on the nodes nearest to holding them, so that they fill up for it;
- otherwise waits with the reason placement gave (and why it does not burst, where it might).
Preemption and reservations use only the unpaid clusters: free capacity is taken before money is spent,
and evicting work is tried before paying for more.
No preemption loops: a victim never evicts the job that evicted it, and every reclaim raises the queues'
guaranteed use (the sum per resource of each queue's use up to its guarantee) or keeps it and lowers what
they borrow (preempting.py).
A head that cannot start whatever the cycle does before its turn, and whose stored reason already says
what stops it, takes no turn: its reason stands (out_of_reach.py; the plan is the same).
"""
from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from dispatcher.policy import bursting
from dispatcher.policy.bursting import BurstDecision, BurstRule, Running, Spend
from dispatcher.policy.held import HeldView, held_back, job_view, kept_for_others, reservation_cluster, unpaid
from dispatcher.policy.out_of_reach import OutOfReach, Replan
from dispatcher.policy.placing import Clusters, ClusterState, Place, QueuedJob, decide, shape_key, take
from dispatcher.policy.plans import (
    PREEMPTION_HOLD_S,
    Active,
    Candidate,
    ClassPolicy,
    CyclePlan,
    Hold,
    Holds,
    class_weight,
    may_reserve,
)
from dispatcher.policy.preempting import RunningAttempts, preempt
from dispatcher.policy.quotas import QueueQuota, QuotaTree
from sluice.quantity import add


@dataclass(frozen=True)
class ActiveNeeds:
    """Which active attempts one cycle must see one by one (`needed`); every other one counts only in its
    queue's usage, which plan_cycle takes whole (`usage`). Only unpaid clusters matter: preemption and the
    expected unpaid start of a burst look nowhere else."""

    clusters: frozenset[str] = frozenset()  # the unpaid clusters
    below: int | None = None  # a class that can preempt, of this class priority at most, is queued ...
    preemptible: frozenset[str] = frozenset()  # ... so preemptible jobs of these classes below it may be evicted
    queues: frozenset[str] = frozenset()  # reclaim may be asked: jobs of these queues may borrow in this cycle
    timed: bool = False  # a burst may be weighed: jobs with an expected end (ends_at) tell the unpaid start
    reserving: bool = False  # a reservation is held or may be made: the same expected ends tell when it starts
    named: bool = False  # an unpaid cluster names its nodes: a victim's nodes (Active.nodes) count there

    @property
    def ends(self) -> bool:
        """Whether the attempts with an expected end are needed (for a burst's or a reservation's start)."""
        return self.timed or self.reserving

    @property
    def victims(self) -> bool:
        """Whether any active job could be a preemption victim in this cycle."""
        return bool(self.clusters) and (bool(self.below is not None and self.preemptible) or bool(self.queues))


def active_needs(heads: dict[str, list[Candidate]], clusters: list[ClusterState], queues: list[QueueQuota],
                 classes: dict[str, ClassPolicy], usage: dict[str, dict[str, int]],
                 holds: dict[int, Hold] | None = None) -> ActiveNeeds:
    """What plan_cycle over these heads may look at of the active attempts, beyond `usage` (per queue, the
    requests of every active attempt summed). A job is a victim only of a class that can preempt and is
    above its own, or of reclaim while its queue borrows; a queue's usage in a cycle never exceeds what it
    uses now plus every queued head of it (each is placed or holds room at most once), so a queue that
    would not borrow even then never borrows in the cycle."""
    unpaid = frozenset(c.name for c in clusters if not c.paid)
    candidates = [c for jobs in heads.values() for c in jobs]
    below = max((c.class_priority for c in candidates
                 if c.service_class in classes and classes[c.service_class].can_preempt), default=None)
    preemptible = frozenset(name for name, cls in classes.items() if cls.preemptible)
    unused = QuotaTree(queues, {})  # a head whose queue guarantees nothing it asks for never reclaims
    reclaim = any(unused.below_guarantee(c.queue, c.job.requests) for c in candidates)
    borrowing: frozenset[str] = frozenset()
    if reclaim:
        most = QuotaTree(queues, {})
        for queue, used in usage.items():
            most.charge(queue, used)
        queued: dict[str, dict[str, int]] = {}
        for c in candidates:  # summed in place: a deep backlog has thousands of heads
            summed = queued.setdefault(c.queue, {})
            for r, v in c.job.requests.items():
                summed[r] = summed.get(r, 0) + v
        for queue, requests in queued.items():
            most.charge(queue, requests)
        borrowing = frozenset(q for q in usage if most.borrowing(q))
    timed = any(c.paid for c in clusters) and any(
        c.service_class in classes and classes[c.service_class].burst_allowed for c in candidates)
    # A reservation's expected start, which lets shorter jobs use its room meanwhile, needs them too: where
    # one is held, or a head has waited long enough to make one.
    reserving = any(h.kind == "reservation" for h in (holds or {}).values()) or any(
        may_reserve(c, classes) for c in candidates)
    named = any(c.node_names for c in clusters if not c.paid)
    return ActiveNeeds(unpaid, below, preemptible, borrowing, timed, reserving, named)


def needed(a: Active, needs: ActiveNeeds, *, victims: bool = True) -> bool:
    """Whether the cycle must see this active attempt on its own (victims=False: only for burst ETAs)."""
    if a.cluster not in needs.clusters:
        return False
    if needs.ends and a.ends_at is not None:
        return True
    return victims and ((needs.below is not None and a.preemptible and a.class_priority < needs.below)
                        or a.queue in needs.queues)


@dataclass
class _Burst:
    """The burst policies, and what each (policy, None) and (policy, queue) has committed so far."""

    rules: list[BurstRule]
    spend: dict[tuple[str, str | None], Spend]
    ends: dict[str, list[Running]]  # per cluster, what runs there and when it is expected to end
    paid: bool = True  # whether any cluster is paid (no cluster changes tier within a cycle)
    # Victim searches that found nothing, by what decides them, with the cycle's state then (preempting.preempt);
    # None: every search runs (the plain definition).
    failed: dict[tuple, tuple] | None = None


def plan_cycle(heads: dict[str, list[Candidate]], active: list[Active], clusters: list[ClusterState],
               queues: list[QueueQuota], classes: dict[str, ClassPolicy], holds: dict[int, Hold],
               now: float, rules: list[BurstRule] = (),
               spend: dict[tuple[str, str | None], Spend] | None = None, *,
               usage: dict[str, dict[str, int]] | None = None, history: dict[str, dict[str, float]] | None = None,
               victims: Callable[[], list[Active]] | None = None,
               remember_failed_searches: bool = True, reasons: dict[int, str] | None = None,
               placed: Callable[[list[Place], dict[int, BurstDecision]], None] | None = None) -> CyclePlan:
    """spend: per (policy, None) and (policy, queue), what running and today's bursts commit already.

    usage: per queue, the requests of every active attempt summed; when given, `active` need hold only
    the attempts `needed` under active_needs(...) (the same plan results). history: per queue, decayed
    resource-seconds (policy/decay.py), in the fair share of trees with a half-life. victims: when given,
    `active` holds only what burst ETAs and reservations need, and victims() is called where the first
    search for preemption victims starts, for the attempts `needed` under active_needs(...) (the same
    plan results).
    remember_failed_searches=False: every head that may preempt searches for victims, even one whose
    search is known to fail (the same search found nothing since the last change), and every head is
    decided afresh, even one like a head that just had to wait (_Verdicts): the plain definition.
    reasons: the heads' reasons as stored; the plan may leave out the heads it cannot start whatever it
    does before their turn and whose reason says what stops them (out_of_reach.py), with the same places,
    preemptions and holds, and tells them nothing (their reasons stand). Never with paid clusters, where
    time alone moves a burst's verdict, nor with remember_failed_searches=False.
    placed: called with the places and bursts so far after each head is considered (a place is never
    taken back later in the cycle), so that the caller may write them while the rest is planned.
    """
    if victims is not None:
        victims = _read_once(victims)
    plan = functools.partial(_plan, heads, active, clusters, queues, classes, holds, now, rules, spend, usage,
                             history, victims, remember_failed_searches, placed)
    if reasons and remember_failed_searches and not any(c.paid for c in clusters):
        try:
            return plan(reasons)
        except Replan:  # the places so far begin the plan made again: it decides them alike
            pass
    return plan(None)


def _read_once(read: Callable[[], list[Active]]) -> Callable[[], list[Active]]:
    """read(), asked at most once: a plan made again sees the attempts the first one read."""
    found: list[list[Active]] = []

    def once() -> list[Active]:
        if not found:
            found.append(read())
        return found[0]
    return once


def _plan(heads: dict[str, list[Candidate]], active: list[Active], clusters: list[ClusterState],
          queues: list[QueueQuota], classes: dict[str, ClassPolicy], holds: dict[int, Hold], now: float,
          rules: list[BurstRule], spend: dict[tuple[str, str | None], Spend] | None,
          usage: dict[str, dict[str, int]] | None, history: dict[str, dict[str, float]] | None,
          victims: Callable[[], list[Active]] | None, remember_failed_searches: bool,
          placed: Callable[[list[Place], dict[int, BurstDecision]], None] | None, reasons: dict[int, str] | None
          ) -> CyclePlan:
    capacity: dict[str, int] = {}
    for c in clusters:
        capacity = add(capacity, c.allocatable)
    tree = QuotaTree(queues, capacity, history)
    running = RunningAttempts(active, victims)
    if usage is not None:
        for queue, used in usage.items():
            tree.charge(queue, used)
    else:
        for a in active:
            tree.charge(a.queue, a.requests)
    state = Clusters(clusters, include=lambda c: not c.paid)
    queued = {c.job.id: c for jobs in heads.values() for c in jobs}
    out = CyclePlan(holds=Holds({i: h for i, h in holds.items() if i in queued and h.cluster in state
                                  and (h.kind != "preemption" or now - h.since < PREEMPTION_HOLD_S)}))
    # Room a preemption freed counts against its preemptor's queue (and ancestors) until it starts, so
    # that no other job takes the quota the victims gave back in the meantime.
    for job_id, hold in out.holds.items():
        if hold.kind == "preemption":
            tree.charge(queued[job_id].queue, hold.requests)

    burst = _Burst(list(rules), dict(spend or {}),
                   {name: [Running(a.requests, a.ends_at) for a in jobs] for name, jobs in running.items()},
                   any(c.paid for c in clusters), {} if remember_failed_searches else None)
    for job_id, hold in out.holds.items():  # what ended or started since moves a reservation's expected start
        if hold.kind == "reservation":
            starts_by, short = _expected_start(queued[job_id].job, state[hold.cluster], burst, now)
            out.holds[job_id] = replace(hold, starts_by=starts_by, short=short)
    views = HeldView(state)
    left_out = OutOfReach(tree, state, views, classes, out, now, reasons) if reasons else None
    order = _FairOrder(tree, left_out.leave_out(heads) if left_out else heads, classes)
    verdicts = _Verdicts(remember_failed_searches and not burst.paid)
    while (queue := order.next()) is not None:
        evicted = len(out.preemptions)
        c = order.take(queue)
        if not verdicts.recall(c, out, classes):
            _consider(c, tree, state, views, running, classes, out, now, burst)
            verdicts.learn(c, out)
            if left_out is not None:
                left_out.check()
            if placed is not None:
                placed(out.places, out.bursts)
        order.changed(queue)
        for p in out.preemptions[evicted:]:  # their queues' shares went down
            order.changed(running.queue_of[p.victim])
    started = {queued[p.job_id].queue for p in out.places}
    # Room a hold keeps is no room for jobs behind, but a reservation's expected to start later: a job behind
    # that ends by then may use it (held.may_use), as EASY backfill starts short jobs from deep in its queue.
    timed = tuple(i for i, h in out.holds.items() if h.starts_by is not None and h.starts_by > now)
    unheld = views.view(out.holds, timed) if out.holds else state
    room = [kinds for c in unheld.values() if not c.paid and not c.unavailable
            if (kinds := {r for r, v in c.free.items() if v > 0})]
    if room:
        out.room_behind = {q for q, jobs in heads.items() if q not in started and jobs and _room_left(jobs, room)}
    return out


def _room_left(jobs: list[Candidate], room: list[set[str]]) -> bool:
    """Whether a usable unpaid cluster has some of every resource all of these jobs ask for free (`room`:
    per such cluster with any, the resources it has some of)."""
    first = {r for r, v in jobs[0].job.requests.items() if v > 0}  # what all ask for is part of this
    if any(first <= kinds for kinds in room):
        return True
    common = first.intersection(*({r for r, v in c.job.requests.items() if v > 0} for c in jobs[1:]))
    return any(common <= kinds for kinds in room)


class _Verdicts:
    """The waits decided so far in a cycle, by all that decides them, while nothing they depend on has
    changed (no place, preemption, burst or hold made or given up since): a deep backlog repeats a few job
    shapes, and a head like one that just had to wait waits for the same reason, without deciding again.
    What decides a wait: the job's shape (its requests, largest pod and pod sets, shared per shape as the
    cycle's reads make them, its placement and maxRuntime), its queue, class and class priority, the job
    that evicted it, and whether it waited past its class's reservation time. Never used with paid
    clusters, where the time waited enters a burst's verdict, nor for a job that holds room itself."""

    def __init__(self, on: bool):
        self._on = on
        self._known: dict[tuple, str] = {}
        self._mark: tuple | None = None
        self._key: tuple | None = None

    def recall(self, c: Candidate, out: CyclePlan, classes: dict[str, ClassPolicy]) -> bool:
        """Whether `c` waits for a reason known already (then written to out.waits)."""
        self._key = None
        if not self._on or c.job.id in out.holds:
            return False
        mark = out.mark()
        if mark != self._mark:
            self._known, self._mark = {}, mark
        job = c.job
        self._key = (*shape_key(job), c.queue, c.service_class, c.class_priority, c.preempted_by,
                     may_reserve(c, classes))
        known = self._known.get(self._key)
        if known is None:
            return False
        out.waits[job.id] = known
        return True

    def learn(self, c: Candidate, out: CyclePlan) -> None:
        """After `c` was decided: keep its wait, when deciding it changed nothing."""
        if self._key is not None and c.job.id in out.waits and out.mark() == self._mark:
            self._known[self._key] = out.waits[c.job.id]


class _FairOrder:
    """Whose head goes next, in the cycle's order: higher class first, then the queue tree's weighted
    dominant-resource shares from the root down, then priority and age.

    Every parent keeps a heap of its children, each keyed by the best head below it with the shares
    counted from the child's own level down (what siblings share above them never decides between
    them). A placement changes the shares and the head on one path only, so only that path is keyed
    again: a cycle costs O(placements x depth x log(children)), not O(placements x siblings).
    """

    def __init__(self, tree: QuotaTree, heads: dict[str, list[Candidate]], classes: dict[str, ClassPolicy]):
        self._tree, self._heads, self._classes = tree, heads, classes
        self._turn = {q: 0 for q in heads}
        self._parent: dict[str, str | None] = {}
        self._heaps: dict[str | None, list] = {None: []}
        self._version: dict[str, int] = {}
        self._own: dict[str, tuple | None] = {}  # each node's own head's key, as its last rekey made it
        for queue in heads:
            path = tree.path(queue)
            for child, parent in zip(path, path[1:] + [None]):
                self._parent.setdefault(child, parent)
                self._heaps.setdefault(parent, [])
        # Leaves first, then their parents: every node's key is made once its children's are.
        for name in sorted(self._parent, key=lambda n: -len(tree.path(n))):
            self._rekey(name)

    def next(self) -> str | None:
        """The queue whose head goes next, or None when every head has been considered."""
        node = self._top(None)
        while node is not None and not self._ownhold_order(node):
            node = self._top(node)
        return node

    def take(self, queue: str) -> Candidate:
        candidate = self._heads[queue][self._turn[queue]]
        self._turn[queue] += 1
        return candidate

    def changed(self, queue: str) -> None:
        """The queue's head or usage changed: key its path again, leaf to root."""
        for name in self._tree.path(queue):
            if name in self._parent:
                self._rekey(name)

    def _head_key(self, queue: str) -> tuple | None:
        if queue not in self._heads or self._turn[queue] >= len(self._heads[queue]):
            return None
        c = self._heads[queue][self._turn[queue]]
        weight = class_weight(c, self._classes)
        share = self._tree.share(queue) / (weight if weight > 0 else 1.0)
        return -c.class_priority, (share,), -c.priority, c.job.id, queue

    def _lifted(self, name: str) -> tuple | None:
        """The best head below `name` (in its children), keyed from name's level."""
        below = self._top_key(name)
        if below is None:
            return None
        cp, shares, *rest = below
        return (cp, (self._tree.share(name),) + shares, *rest)

    def _ownhold_order(self, node: str) -> bool:
        """Whether the node's own head goes before the best head below it."""
        own = self._own[node]  # keyed again whenever its head or its share changes (changed())
        if own is None:
            return False
        below = self._lifted(node)
        return below is None or own < below

    def _top_key(self, node: str | None) -> tuple | None:
        heap = self._heaps.get(node)
        while heap and heap[0][1] != self._version.get(heap[0][2]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def _top(self, node: str | None) -> str | None:
        return None if self._top_key(node) is None else self._heaps[node][0][2]

    def _rekey(self, name: str) -> None:
        """Put the best head at or below `name`, keyed from name's level, into its parent's heap."""
        own = self._own[name] = self._head_key(name)
        keys = [k for k in (own, self._lifted(name)) if k is not None]
        version = self._version[name] = self._version.get(name, 0) + 1
        if keys:
            heapq.heappush(self._heaps[self._parent[name]], (min(keys), version, name))


def _expected_start(job: QueuedJob, cluster: ClusterState, burst: _Burst, now: float
                    ) -> tuple[float | None, dict[str, int] | None]:
    """When the job is expected to fit the cluster, by the expected ends of what runs there, and what of
    its requests the room freed by then does not cover; (None, None) when unknown."""
    eta = bursting.unpaid_start(job, [cluster], burst.ends, now)  # reservations are on unpaid clusters
    if eta is None or eta == math.inf:
        return None, None
    freed: dict[str, int] = {}
    for r in burst.ends.get(cluster.name, ()):
        if r.ends_at is not None and r.ends_at <= now + eta:
            freed = add(freed, r.requests)
    return now + eta, {r: max(0, need - freed.get(r, 0)) for r, need in job.requests.items()}


def _consider(c: Candidate, tree: QuotaTree, state: Clusters, views: HeldView,
              running: RunningAttempts, classes: dict[str, ClassPolicy], out: CyclePlan, now: float,
              burst: _Burst) -> None:
    own = out.holds.get(c.job.id)
    if own is not None and own.kind == "preemption":
        tree.charge(c.queue, own.requests, -1)  # its own held room does not count against it
    _decide(c, tree, state, views, running, classes, out, now, burst)
    own = out.holds.get(c.job.id)
    if own is not None and own.kind == "preemption":
        tree.charge(c.queue, own.requests)


def _decide(c: Candidate, tree: QuotaTree, state: Clusters, views: HeldView,
            running: RunningAttempts, classes: dict[str, ClassPolicy], out: CyclePlan, now: float,
            burst: _Burst) -> None:
    job = c.job
    over = tree.over_max(c.queue, job.requests)
    if over:
        held = out.holds.get(job.id)
        if held is not None and held.kind == "reservation":
            del out.holds[job.id]  # it could not use the room it reserved: leave that room to others
            held = None
        # A queue within its guarantee may still take back what borrowers hold of an ancestor's maximum.
        if held is not None or not preempt(c, tree, state, views, running, classes, out, now, burst.failed,
                                                 quota=True):
            out.waits[job.id] = over
        return
    if job.id in out.holds:  # it sees the room it holds itself, and only the older holds of others
        view = job_view(state, out.holds, job, now)
        decision = decide(job, unpaid(view))
    else:  # every other job sees the same clusters: the fast, shape-ranked choice
        view = views.seen_by(out.holds, job, now)
        decision = view.best(job)
    if isinstance(decision, Place):
        _place(c, decision.cluster, tree, state, out, burst, now,
               kept_for_others(job, state[decision.cluster], view[decision.cluster]))
        return
    held = out.holds.get(job.id)
    if held is not None and held.kind == "preemption":
        victims = ", ".join(map(str, held.victims))
        out.waits[job.id] = f"holding capacity on {held.cluster}: waiting for preempted jobs {victims} to stop"
        return
    if held is not None:  # a reservation: evicting may start it sooner than waiting for room
        # It searches as a job holding nothing, so the younger preemption hold that replaces the
        # reservation never counts on room another hold keeps.
        del out.holds[job.id]
    if preempt(c, tree, state, views, running, classes, out, now, burst.failed):
        return
    if held is not None:
        out.holds[job.id] = held
    spilled = _burst(c, tree, view, classes, now, burst)
    if isinstance(spilled, BurstDecision):
        _place(c, spilled.cluster, tree, state, out, burst, now)
        out.bursts[job.id] = spilled
        rate, cost = spilled.rate_per_hour, spilled.expected_cost
        for key in ((spilled.policy, None), (spilled.policy, c.queue)):
            burst.spend[key] = burst.spend.get(key, Spend()).plus(rate, cost, job.requests)
        return
    note = f"; {spilled}" if spilled else ""
    if held is not None:
        out.waits[job.id] = f"reserved capacity on {held.cluster}: waiting for room{note}"
        return
    cls = classes.get(c.service_class)
    if may_reserve(c, classes):
        taken = {h.cluster for h in out.holds.values() if h.kind == "reservation"}
        target = reservation_cluster(job, {n: s for n, s in unpaid(state).items() if n not in taken})
        if target is not None:
            starts_by, short = _expected_start(job, state[target], burst, now)
            out.holds[job.id] = Hold(job.id, target, dict(job.requests), "reservation", now, starts_by=starts_by,
                                     short=short, pods=job.pods)
            out.waits[job.id] = f"reserved capacity on {target} (waited past {cls.reservation_after_s:g}s){note}"
            return
    out.waits[job.id] = (held_back(job, state, out.holds) or decision.reason) + note


def _place(c: Candidate, cluster: str, tree: QuotaTree, state: dict[str, ClusterState], out: CyclePlan,
           burst: _Burst, now: float, kept_off: tuple[int, ...] = ()) -> None:
    """kept_off: the indices of the cluster's nodes its pods must not be bound to (held.kept_for_others)."""
    job = c.job
    avoid_nodes = tuple(state[cluster].node_names[i] for i in kept_off) if kept_off else ()
    state[cluster] = take(state[cluster], job.requests, job.pods, kept_off=frozenset(kept_off))
    tree.charge(c.queue, job.requests)
    out.places.append(Place(job.id, cluster, avoid_nodes))
    out.holds.pop(job.id, None)
    # It holds its room until its expected end, as what runs does: a reservation made later in this cycle, or a
    # burst weighed, counts on that end as on theirs.
    ends_at = now + job.max_runtime_s if job.max_runtime_s else None
    burst.ends.setdefault(cluster, []).append(Running(job.requests, ends_at))


def _burst(c: Candidate, tree: QuotaTree, view: dict[str, ClusterState], classes: dict[str, ClassPolicy],
           now: float, burst: _Burst) -> BurstDecision | str | None:
    cls = classes.get(c.service_class)
    if not burst.paid or not any(s.paid for s in view.values()):
        return None
    allowed = bool(cls and cls.burst_allowed)
    eta = bursting.unpaid_start(c.job, list(view.values()), burst.ends, now) if allowed else None
    return bursting.consider(
        c.job, c.queue, tree.path(c.queue), c.service_class, allowed=allowed,
        class_after_s=cls.burst_after_s if cls else None, multiplier=cls.price_multiplier if cls else 1.0,
        waited_s=c.waited_s, unpaid_eta_s=eta, clusters=list(view.values()), rules=burst.rules,
        spend=burst.spend)
