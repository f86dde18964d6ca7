"""Pods onto nodes, first fit: what the dispatcher checks before it sends a gang to a cluster, how the
simulated clusters (the sim agent's, and a replay's) bind pods and start gangs, and how many new nodes
their autoscaler asks for. Pure functions over milli-unit resource maps (sluice/quantity.py)."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet

from sluice.quantity import add, fits, subtract


def first_fit(request: dict[str, int], free_per_node: Sequence[dict[str, int]],
              kept_off: AbstractSet[int] = frozenset(), start: int = 0) -> int | None:
    """Index of the first node from `start` whose free resources hold the request, or None; never one of
    `kept_off` (the indices of nodes the pod must not be bound to: room held there for other jobs)."""
    for index in range(start, len(free_per_node)):
        if fits(request, free_per_node[index]) and index not in kept_off:
            return index
    return None


def held_per_node(bound: Iterable[tuple[str, dict[str, int]]]) -> tuple[tuple[str, dict[str, int]], ...]:
    """What pods bound to nodes, (node, request) each, hold on each node, in node name order: what an agent
    says of a running attempt (AttemptStatus.nodes), and evicting it gives back there."""
    held: dict[str, dict[str, int]] = {}
    for node, request in bound:
        held[node] = add(held.get(node, {}), request)
    return tuple(sorted(held.items()))


def expand(pods: Iterable[tuple[int, dict[str, int]]]) -> list[dict[str, int]]:
    """One request per pod from (count, per-pod requests) pod sets, in order."""
    return [request for count, request in pods for _ in range(count)]


def first_fit_decreasing(requests: Sequence[dict[str, int]], free_per_node: Sequence[dict[str, int]],
                         kept_off: AbstractSet[int] = frozenset()) -> tuple[list[dict[str, int]], list[int | None]]:
    """Every pod's request, the largest first, onto the first node that still holds it.

    Largest by each resource in name order (milli-units of different resources are not comparable, a fixed
    order is); equal requests keep their order. Returns the nodes' free resources after the pods that fit,
    and each request's node index, in the order given (None for one that fits nowhere: not all fit at once).
    No pod goes to a node in `kept_off` (first_fit)."""
    names = sorted({name for request in requests for name in request})
    keys = [tuple(-request.get(name, 0) for name in names) for request in requests]
    order = sorted(range(len(requests)), key=keys.__getitem__)
    free = list(free_per_node)
    slots: list[int | None] = [None] * len(requests)
    previous, slot = None, None
    for index in order:
        # A pod equal to the one before cannot fit a node that one passed over (nodes only fill up): its search
        # goes on from that one's node, and ends at once where that one fit nowhere. Without this a gang of
        # thousands of equal pods on as many nodes costs millions of checks.
        if keys[index] != previous:
            previous, slot = keys[index], 0
        if slot is not None:
            slot = first_fit(requests[index], free, kept_off, slot)
        if slot is not None:
            free[slot] = subtract(free[slot], requests[index])
            slots[index] = slot
    return free, slots


def nodes_to_request(requests: Iterable[dict[str, int]], node: dict[str, int], provisioning: int,
                     room: int) -> int:
    """How many new nodes the autoscaler asks for so that the given (unbound) requests fit, each pod on its
    own (`gang_nodes_to_request` with gangs of one pod)."""
    return gang_nodes_to_request(([request] for request in requests), node, provisioning, room)


def gang_nodes_to_request(gangs: Iterable[Sequence[dict[str, int]]], node: dict[str, int], provisioning: int,
                          room: int, free_now: Iterable[dict[str, int]] = ()) -> int:
    """How many new nodes the autoscaler asks for so that the given waiting gangs (their pods' requests)
    fit.

    The gangs' pods are packed first fit, in order, onto the room the usable nodes have now (`free_now`:
    a gang waits for all of its pods, some of which may fit there), then onto `provisioning` empty nodes
    already on their way and then onto fresh empty ones, at most `room` of those. A gang that would not
    fit whole asks for nothing: nodes added for it would only stand idle (a pod larger than an empty node
    never fits; a later, smaller gang may still fit the nodes already counted).
    """
    nodes = [dict(free) for free in free_now] + [dict(node) for _ in range(provisioning)]
    added = 0
    for gang in gangs:
        trial, trial_added = list(nodes), added
        previous, slot = None, 0
        for request in gang:
            # As in first_fit_decreasing: an equal pod's search goes on from the node the one before took.
            slot = first_fit(request, trial, start=slot if request == previous else 0)
            previous = request
            if slot is None:
                if trial_added >= room or not fits(request, node):
                    break
                trial.append(dict(node))
                trial_added += 1
                slot = len(trial) - 1
            trial[slot] = subtract(trial[slot], request)
        else:
            nodes, added = trial, trial_added
    return added
