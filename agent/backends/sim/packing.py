"""How a simulated cluster packs pods: first fit onto nodes (shared with the dispatcher: sluice/packing.py),
and how many new nodes an autoscaler asks for. Pure functions over milli-unit resource maps."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from sluice.packing import first_fit, first_fit_decreasing
from sluice.quantity import fits, subtract

# first_fit and first_fit_decreasing are sluice/packing.py's, shared with the dispatcher.
__all__ = ["first_fit", "first_fit_decreasing", "gang_nodes_to_request", "nodes_to_request"]


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
        for request in gang:
            slot = first_fit(request, trial)
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
