"""Queue quotas: the queue tree, what each queue uses, its maximum, its guarantee, and its fair share.

Pure. A job counts against its queue and every ancestor from dispatch until it ends. A maximum caps a
queue (and so every queue below it); a resource a maximum does not name is unlimited. Use within the
guarantee is the queue's own; use beyond it is borrowed from what others leave idle and can be
reclaimed. Fair share is the weighted dominant-resource share, compared level by level from the root.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from sluice.quantity import add, format_quantity


@dataclass(frozen=True)
class QueueQuota:
    name: str
    parent: str | None = None
    guaranteed: dict[str, int] = field(default_factory=dict)
    max: dict[str, int] = field(default_factory=dict)
    weight: float = 1.0


class QuotaTree:
    def __init__(self, queues: list[QueueQuota], capacity: dict[str, int]):
        """capacity: the total allocatable of every cluster, the denominator of shares."""
        self.queues = {q.name: q for q in queues}
        self.capacity = capacity
        self.usage: dict[str, dict[str, int]] = {}
        self._paths: dict[str, list[str]] = {}
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
                    who = f"queue {name}" if level == 0 else f"queue {name} (parent of {queue})"
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
        """The queue uses more than its guarantee of some resource: that excess can be reclaimed."""
        quota = self.queues.get(queue)
        guaranteed = quota.guaranteed if quota else {}
        return any(amount > guaranteed.get(r, 0) for r, amount in self.used(queue).items() if amount > 0)

    def within_guarantee(self, queue: str, requests: dict[str, int]) -> bool:
        """Admitting `requests` keeps the queue inside its guarantee for every resource it asks for."""
        quota = self.queues.get(queue)
        if quota is None:
            return False
        if not self._guaranteed:
            return all(need <= 0 for need in requests.values())
        used = self.used(queue)
        return all(used.get(r, 0) + need <= quota.guaranteed.get(r, 0) for r, need in requests.items() if need > 0)

    def share(self, name: str) -> float:
        """Dominant-resource share of the queue, divided by its weight."""
        found = self._shares.get(name)
        if found is not None:
            return found
        used = self.used(name)
        dominant = max((amount / self.capacity[r] for r, amount in used.items() if self.capacity.get(r)), default=0.0)
        quota = self.queues.get(name)
        share = self._shares[name] = dominant / (quota.weight if quota and quota.weight > 0 else 1.0)
        return share

    def fair_key(self, queue: str, class_weight: float = 1.0) -> tuple[float, ...]:
        """Root first: siblings are compared by their own share before their children are."""
        path = self.path(queue)
        key = [self.share(name) for name in reversed(path)]
        key[-1] /= class_weight if class_weight > 0 else 1.0
        return tuple(key)
