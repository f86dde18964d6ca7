"""What the admin objects mean, with no store: the checks `apply` makes across them, each one as the policy
reads it, and a job's service class when it names none. The dispatcher applies and schedules by these, and
`sluice simulate` builds its replay from them, so a replay takes what `sluice up --config` would take."""
from __future__ import annotations

from collections.abc import Iterator

from dispatcher.errors import InvalidRequest
from dispatcher.policy.bursting import Budget, BurstRule
from dispatcher.policy.plans import ClassPolicy
from dispatcher.policy.quotas import QueueQuota
from sluice.objects import AdminObject, BurstPolicyObject, QueueObject, ServiceClassObject
from sluice.quantity import format_quantity

Key = tuple[str, str]  # (kind, name)


def quota_of(q: QueueObject) -> QueueQuota:
    """A Queue object as the policy reads it."""
    return QueueQuota(q.name, q.parent, dict(q.guaranteed), dict(q.max), q.weight, q.usage_half_life_s)


def class_policy_of(c: ServiceClassObject) -> ClassPolicy:
    """A ServiceClass object as the policy reads it."""
    return ClassPolicy(c.name, c.priority, c.preemptible, c.can_preempt, c.weight, c.reservation_after_s,
                       c.burst_allowed, c.burst_after_s, c.price_multiplier)


def rule_of(p: BurstPolicyObject) -> BurstRule:
    """A BurstPolicy object as the policy reads it."""
    return BurstRule(p.name, p.queues, p.service_classes, dict(p.cluster_selector), p.after_s,
                     Budget(p.budget_per_hour, p.budget_per_day, dict(p.max_resources)),
                     Budget(p.queue_budget_per_hour, p.queue_budget_per_day, dict(p.queue_max_resources)))


def default_class(listed: list[str], classes: dict[str, int]) -> str:
    """A job's class when it names none: its queue's first listed class; else `standard`; else the
    lowest-priority class there is. `classes`: each class's priority, by name."""
    if listed:
        return listed[0]
    if "standard" in classes:
        return "standard"
    if not classes:
        raise InvalidRequest("job: spec.serviceClass: required, no service classes are defined")
    return min(classes, key=lambda name: (classes[name], name))


def problems(objects: list[AdminObject]) -> list[str]:
    """What refuses these objects applied together on their own (nothing stored beside them), as apply
    words it: a queue's parent missing, queues in a cycle, guarantees above a parent's, a service class or
    queue named but not there. `sluice simulate --config` replays only what `sluice up --config` would take."""
    return [message for _, message in object_problems({(o.kind, o.name): o for o in objects})]


def object_problems(objects: dict[Key, AdminObject]) -> Iterator[tuple[tuple[Key, ...], str]]:
    """Every cross-object problem: (the objects involved, the one it is about first; the message)."""
    queues = {name: o for (kind, name), o in objects.items() if kind == "Queue"}
    classes = {name for kind, name in objects if kind == "ServiceClass"}
    for q in queues.values():
        key = ("Queue", q.name)
        if q.parent is not None and q.parent not in queues:
            yield (key,), f"queue {q.name}: spec.parent: queue {q.parent!r} not found"
        for i, name in enumerate(q.service_classes):
            if name not in classes:
                yield (key,), f"queue {q.name}: spec.serviceClasses[{i}]: service class {name!r} not found"
        parent = queues.get(q.parent)  # type: ignore[arg-type]
        for resource, amount in (parent.guaranteed.items() if parent else ()):
            if q.guaranteed.get(resource, 0) > amount:
                yield (key, ("Queue", parent.name)), (
                    f"queue {q.name}: spec.guaranteed.{resource} {format_quantity(resource, q.guaranteed[resource])} "
                    f"exceeds its parent {parent.name}'s guaranteed {format_quantity(resource, amount)}")
    for q in queues.values():
        path, parent = [q.name], q.parent
        while parent in queues and parent not in path:
            path.append(parent)
            parent = queues[parent].parent
        if parent == q.name:
            cycle = " -> ".join([*path, q.name])
            yield tuple(("Queue", n) for n in path), f"queue {q.name}: spec.parent: the queues form a cycle: {cycle}"
    children: dict[str, list] = {}
    for q in queues.values():
        if q.parent in queues:
            children.setdefault(q.parent, []).append(q)
    for name, kids in sorted(children.items()):
        for resource, amount in queues[name].guaranteed.items():
            total = sum(k.guaranteed.get(resource, 0) for k in kids)
            if total > amount:
                parts = ", ".join(f"{k.name} {format_quantity(resource, k.guaranteed[resource])}"
                                  for k in sorted(kids, key=lambda k: k.name) if k.guaranteed.get(resource))
                yield (("Queue", name), *(("Queue", k.name) for k in kids)), (
                    f"queue {name}: its children's spec.guaranteed.{resource} sum to "
                    f"{format_quantity(resource, total)} ({parts}), above its own guaranteed "
                    f"{format_quantity(resource, amount)}")
    for (kind, name), policy in objects.items():
        if kind != "BurstPolicy":
            continue
        for field, names, known, word in (("queues", policy.queues, queues, "queue"),
                                          ("serviceClasses", policy.service_classes, classes, "service class")):
            for i, ref in enumerate(names):
                if ref not in known:
                    yield ((kind, name),), f"burst policy {name}: spec.{field}[{i}]: {word} {ref!r} not found"
