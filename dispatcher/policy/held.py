"""Room held for queued jobs, and the clusters as each job sees them with it: free less what is held for
others. A reservation keeps room from every job but one that ends before it starts (may_use); a job that
holds room itself yields only to holds before its own (hold_order), so the first holder can always start."""
from __future__ import annotations

from dispatcher.policy.placing import Clusters, ClusterState, Place, QueuedJob, matching, take
from dispatcher.policy.plans import Hold
from sluice.packing import expand
from sluice.quantity import fits

HELD_BACK = "reserved capacity for job "  # how held_back's reasons begin


def job_view(state: dict[str, ClusterState], holds: dict[int, Hold], job: QueuedJob, now: float
             ) -> dict[str, ClusterState]:
    """The clusters as one job sees them: free less what is held for other jobs (but reservations it
    ends before, may_use). A job that holds room itself yields only to holds before its own (hold_order), so
    the first holder can always start: holds never deadlock."""
    own = holds.get(job.id)
    view = dict(state)
    for hold in holds.values():
        if hold.job_id == job.id or hold.cluster not in view or may_use(hold, job, now):
            continue
        if own is None or hold_order(hold) < hold_order(own):
            view[hold.cluster] = less_held(view[hold.cluster], [hold])
    return view


def hold_order(hold: Hold) -> tuple:
    """Which of two holds yields: room freed by preemption goes to the job that evicted for it before any
    reservation (else the eviction is wasted, and more follow); then the older hold goes first."""
    return hold.kind != "preemption", hold.since, hold.job_id


class HeldView:
    """The clusters as every job that holds no room itself sees them (free less every hold), kept in step
    with the cycle's state: a cycle has a few holds and may consider thousands of jobs, which then share
    one view and its rankings (Clusters.best) instead of each making its own."""

    def __init__(self, state: Clusters):
        self._state = state
        self._holds: tuple = ()
        self._views: dict[tuple[int, ...], list] = {}  # per set of holds left out: [view, held room, mark]

    def seen_by(self, holds: dict[int, Hold], job: QueuedJob, now: float) -> Clusters:
        """The clusters as `job`, holding no room itself, sees them (job_view): less every hold but those it
        may use (may_use)."""
        return self.view(holds, tuple(i for i, h in holds.items() if may_use(h, job, now))) if holds else self._state

    def view(self, holds: dict[int, Hold], skip: tuple[int, ...] = ()) -> Clusters:
        """The clusters less every hold but those of the jobs in `skip` (holds a job may use, may_use)."""
        state = self._state
        key = tuple(map(id, holds.values()))  # holds are frozen: a hold made, moved or given up is a new object
        if key != self._holds:
            self._holds, self._views = key, {}
        found = self._views.get(skip)
        if found is None:
            held: dict[str, list[Hold]] = {}
            for hold in holds.values():
                if hold.cluster in state and hold.job_id not in skip:
                    held.setdefault(hold.cluster, []).append(hold)
            view = Clusters([less_held(c, held) for c in state.values()], include=lambda c: not c.paid)
            self._views[skip] = [view, held, state.changes(0)[1]]
            return view
        view, held, mark = found
        changed, found[2] = state.changes(mark)
        for name in changed:
            view[name] = less_held(state[name], held)
        return view


def held_back(job: QueuedJob, state: Clusters, holds: dict[int, Hold]) -> str | None:
    """Why a job that fits nowhere in its view waits, where it is the room held for another job: it would
    start on a cluster but for that job's hold there (state: the clusters as no hold keeps them)."""
    if not holds:
        return None
    unheld = state.best(job)
    if not isinstance(unheld, Place):
        return None
    blocker = next((h for h in holds.values() if h.job_id != job.id and h.cluster == unheld.cluster), None)
    return None if blocker is None else f"{HELD_BACK}{blocker.job_id} on {blocker.cluster}"


def less_held(cluster: ClusterState, held: dict[str, list[Hold]] | list[Hold]) -> ClusterState:
    """The cluster less what the holds on it keep, taken off its nodes pod by pod where their pods are
    known (else the whole job may take every whole node in view, room held for a gang included)."""
    for hold in held if isinstance(held, list) else held.get(cluster.name, ()):
        keeps = kept(hold)
        # Pods that fit no node yet (a reservation's; a preemption's until its victims stop) keep the nodes
        # nearest to them: a small job admitted there would take what frees up first.
        cluster = take(cluster, keeps, hold.pods if keeps is hold.requests else (), drain=True)
    return cluster


def kept_for_others(job: QueuedJob, cluster: ClusterState, seen: ClusterState) -> tuple[int, ...]:
    """The indices of the cluster's nodes on which the room held for other jobs leaves none of `job`'s pods
    room, where some was free (`seen`: the cluster as the job sees it, less those holds). Placement never
    packs the job there; the cluster, which knows nothing of holds, is told to keep its pods off them."""
    if seen is cluster or not cluster.node_names or len(seen.node_free) != len(cluster.node_free):
        return ()
    if job.pods:
        pods = expand(job.pods)
    elif job.largest_pod == job.requests:
        pods = [job.requests]
    else:  # its pods are not known one by one: no node can be said to hold none of them
        return ()
    return tuple(i for i, (free, left) in enumerate(zip(cluster.node_free, seen.node_free))
                 if left != free and not any(fits(pod, left) for pod in pods))


def may_use(hold: Hold, job: QueuedJob, now: float) -> bool:
    """Whether `job` may use the room `hold` keeps: a reservation whose expected start the job's maxRuntime
    ends by (it is stopped by then: the reserved job starts no later for it)."""
    return hold.starts_by is not None and job.max_runtime_s is not None and now + job.max_runtime_s <= hold.starts_by


def kept(hold: Hold) -> dict[str, int]:
    """What a hold keeps from a job that does not end before it starts (may_use)."""
    return hold.requests if hold.short is None else hold.short


def unpaid(state: dict[str, ClusterState]) -> dict[str, ClusterState]:
    return {name: s for name, s in state.items() if not s.paid}


def reservation_cluster(job: QueuedJob, state: dict[str, ClusterState]) -> str | None:
    """Where a starving job should wait: a cluster with no reservation yet that could hold it empty, with
    the most room now. One reservation per cluster: the jobs behind it wait their turn, not pile up."""
    possible = [c for c in matching(job, state.values())
                if not c.unavailable and c.name not in job.avoid and fits(job.requests, c.allocatable)]
    if not possible:
        return None
    dominant = max(job.requests, key=lambda r: job.requests[r] / max(1, max(c.allocatable.get(r, 0) for c in possible)))
    return max(possible, key=lambda c: (c.free.get(dominant, 0), c.name)).name
