"""Queue quotas: the queue tree, what each queue uses, its maximum, its guarantee, and its fair share.

Pure. A job counts against its queue and every ancestor from dispatch until it ends. A maximum caps a
queue (and so every queue below it); a resource a maximum does not name is unlimited. Use within the
guarantee is the queue's own; use beyond it is borrowed from what others leave idle and can be
reclaimed. Fair share is the weighted dominant-resource share, compared level by level from the root.

A guarantee speaks only for the resources it names (`within`, used by every check): a queue borrows
when it uses more than its guarantee of a resource the guarantee names, or, with no guarantee at all,
when it uses anything. A job may reclaim (`below_guarantee`) when its queue has a guarantee, borrows
nothing now, and uses less than its guarantee of every named resource the job asks for (and it asks
for one): the job may take the queue past its guarantee, as jobs come in whole pieces, or a queue
guaranteed 31 GPUs that runs 8-GPU jobs could never reclaim its fourth. What reclaim takes from a queue
is no more than it borrows (`borrowed`), or, for a job its own queue's guarantee holds whole
(`holds_whole`), a borrower's last job, taking from guarantees no more than the job adds to its own
queue's guaranteed use, and less where the borrower borrowed (policy/preempting.py): every reclaim
raises the guaranteed use that is served, or keeps it and lowers what is borrowed, so reclaims never
loop. What it asks of unnamed resources is not limited by the guarantee. To count every use of, say,
GPUs as borrowed, name them at 0 (`nvidia.com/gpu: 0`).

A root queue's usageHalfLife H gives its whole tree memory: each queue's share adds, to its current
dominant share, the dominant share of its decayed history (decayed resource-seconds / (H/ln2) /
capacity, policy/decay.py), so a queue that ran all day yields to one that was idle at equal usage.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dispatcher.policy import decay
from sluice.quantity import add, format_quantity

OVER_MAX = "queue "  # how over_max's reasons begin


@dataclass(frozen=True)
class QueueQuota:
    name: str
    parent: str | None = None
    guaranteed: dict[str, int] = field(default_factory=dict)
    max: dict[str, int] = field(default_factory=dict)
    weight: float = 1.0
    usage_half_life_s: float | None = None  # on a root: its tree's fair share remembers usage (policy/decay.py)


def within(guaranteed: dict[str, int], amounts: dict[str, int]) -> bool:
    """Whether `amounts` stay within a guarantee: the one rule of borrowing and reclaim. A guarantee speaks
    only for the resources it names (one named at 0 makes every use of it borrowed); without any, every use is."""
    if not guaranteed:
        return not any(amount > 0 for amount in amounts.values())
    return all(amounts.get(r, 0) <= limit for r, limit in guaranteed.items())


def rolled_up(queues: list[QueueQuota], amounts: dict[tuple[str, str], dict[str, float]]
              ) -> dict[tuple[str, str], dict[str, float]]:
    """Amounts per (queue, part), e.g. per queue and cluster, summed into each ancestor's (queue, part) as well:
    what each queue of the tree uses, counted as QuotaTree.charge counts it."""
    tree = QuotaTree(queues, {})
    out: dict[tuple[str, str], dict[str, float]] = {}
    for (queue, part), amount in amounts.items():
        for name in tree.path(queue):
            out[(name, part)] = add(out.get((name, part), {}), amount)
    return out


class QuotaTree:
    def __init__(self, queues: list[QueueQuota], capacity: dict[str, int],
                 history: dict[str, dict[str, float]] | None = None):
        """capacity: the total allocatable of every cluster, the denominator of shares. history: per queue,
        decayed resource-seconds of its jobs (policy/decay.py), counted in shares where its tree has a half-life."""
        self.queues = {q.name: q for q in queues}
        self.capacity = capacity
        self.usage: dict[str, dict[str, int]] = {}
        self._paths: dict[str, list[str]] = {}
        self.history: dict[str, dict[str, float]] = {}  # like usage: each queue's and its descendants'
        for queue, amounts in (history or {}).items():
            for name in self.path(queue):
                summed = self.history.setdefault(name, {})
                for r, amount in amounts.items():
                    summed[r] = summed.get(r, 0.0) + amount
        self._shares: dict[str, float] = {}  # share() of queues whose usage has not changed since
        self._capped = any(q.max for q in queues)  # without any maximum, nothing is ever over one
        self._guaranteed = any(q.guaranteed for q in queues)  # without any guarantee, no request is within one

    def path(self, name: str) -> list[str]:
        """The queue and its ancestors, leaf first (a broken or cyclic tree just stops)."""
        found = self._paths.get(name)
        if found is not None:
            return found
        out: list[str] = []
        start = name
        while name and name not in out:
            out.append(name)
            queue = self.queues.get(name)
            name = queue.parent if queue else None
        self._paths[start] = out
        return out

    def used(self, name: str) -> dict[str, int]:
        return self.usage.get(name, {})

    def charge(self, queue: str, requests: dict[str, int], times: int = 1) -> None:
        """Count a job against its queue and every ancestor (times=-1 releases it)."""
        for name in self.path(queue):
            self.usage[name] = add(self.used(name), requests, times)
            self._shares.pop(name, None)

    def over_max(self, queue: str, requests: dict[str, int]) -> str | None:
        """Why admitting `requests` to `queue` would break a maximum on its path; None if it would not."""
        if not self._capped:
            return None
        for level, name in enumerate(self.path(queue)):
            quota = self.queues.get(name)
            if quota is None:
                continue
            used = self.used(name)
            for resource, need in sorted(requests.items()):
                limit = quota.max.get(resource)
                if need > 0 and limit is not None and used.get(resource, 0) + need > limit:
                    who = f"{OVER_MAX}{name}" if level == 0 else f"{OVER_MAX}{name} (parent of {queue})"
                    have = used.get(resource, 0)
                    more = "" if have >= limit else f", needs {format_quantity(resource, need)}"
                    return (f"{who}: {resource} {format_quantity(resource, have)}/{format_quantity(resource, limit)}"
                            f" in use{more} (guaranteed {format_quantity(resource, quota.guaranteed.get(resource, 0))},"
                            f" max {format_quantity(resource, limit)})")
        return None

    def excess(self, queue: str, requests: dict[str, int]) -> dict[str, dict[str, int]]:
        """Per queue on the path whose maximum admitting `requests` would break: by how much, per resource."""
        out: dict[str, dict[str, int]] = {}
        for name in self.path(queue):
            quota = self.queues.get(name)
            if quota is None:
                continue
            used = self.used(name)
            over = {r: used.get(r, 0) + need - quota.max[r] for r, need in requests.items()
                    if need > 0 and r in quota.max and used.get(r, 0) + need > quota.max[r]}
            if over:
                out[name] = over
        return out

    def borrowing(self, queue: str) -> bool:
        """The queue uses more than its guarantee (see `within`): that use can be reclaimed."""
        quota = self.queues.get(queue)
        return not within(quota.guaranteed if quota else {}, self.used(queue))

    def below_guarantee(self, queue: str, requests: dict[str, int]) -> bool:
        """The queue borrows nothing and uses less than its guarantee of every resource it names that
        `requests` ask for (they ask for one): a job of these requests may reclaim."""
        quota = self.queues.get(queue)
        if quota is None or not self._guaranteed or not quota.guaranteed:
            return False
        used = self.used(queue)
        named = [r for r, need in requests.items() if need > 0 and r in quota.guaranteed]
        return bool(named) and within(quota.guaranteed, used) and all(
            used.get(r, 0) < quota.guaranteed[r] for r in named)

    def holds_whole(self, queue: str, requests: dict[str, int]) -> bool:
        """The queue's guarantee holds `requests` whole on top of what it uses: it stays within it in every
        resource the guarantee names (and `requests` ask for one of them)."""
        quota = self.queues.get(queue)
        if quota is None or not quota.guaranteed:
            return False
        used = self.used(queue)
        return any(need > 0 and r in quota.guaranteed for r, need in requests.items()) and all(
            used.get(r, 0) + requests.get(r, 0) <= limit for r, limit in quota.guaranteed.items())

    def borrowed(self, queue: str) -> dict[str, int] | None:
        """What reclaim may take from the queue, per resource its guarantee names: what it uses beyond it;
        None: no limit (a queue with no guarantee borrows all it uses)."""
        quota = self.queues.get(queue)
        if quota is None or not quota.guaranteed:
            return None
        used = self.used(queue)
        return {r: max(0, used.get(r, 0) - limit) for r, limit in quota.guaranteed.items()}

    def half_life(self, name: str) -> float | None:
        """The usage half-life of the queue's tree (set on its root), or None: no memory."""
        path = self.path(name)
        root = self.queues.get(path[-1]) if path else None
        return root.usage_half_life_s if root else None

    def share(self, name: str) -> float:
        """Dominant-resource share of the queue, plus (in a tree with a half-life H) the dominant share its
        history stands for, decayed resource-seconds / (H/ln2) / capacity; divided by its weight."""
        found = self._shares.get(name)
        if found is not None:
            return found
        used = self.used(name)
        dominant = max((amount / self.capacity[r] for r, amount in used.items() if self.capacity.get(r)), default=0.0)
        half_life = self.half_life(name) if self.history else None
        if half_life:
            past = self.history.get(name, {})
            dominant += max((decay.rate(amount, half_life) / self.capacity[r] for r, amount in past.items()
                             if self.capacity.get(r)), default=0.0)
        quota = self.queues.get(name)
        share = self._shares[name] = dominant / (quota.weight if quota and quota.weight > 0 else 1.0)
        return share

    def fair_key(self, queue: str, class_weight: float = 1.0) -> tuple[float, ...]:
        """Root first: siblings are compared by their own share before their children are."""
        path = self.path(queue)
        key = [self.share(name) for name in reversed(path)]
        key[-1] /= class_weight if class_weight > 0 else 1.0
        return tuple(key)
