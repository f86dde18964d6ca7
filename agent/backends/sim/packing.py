"""How a simulated cluster packs pods: first fit onto nodes (shared with the dispatcher: sluice/packing.py),
and how many new nodes an autoscaler asks for. Pure functions over milli-unit resource maps."""
from __future__ import annotations

from collections.abc import Iterable

from sluice.packing import first_fit, first_fit_decreasing
from sluice.quantity import fits, subtract

__all__ = ["first_fit", "first_fit_decreasing", "nodes_to_request"]  # the packing itself is sluice/packing.py


def nodes_to_request(requests: Iterable[dict[str, int]], node: dict[str, int], provisioning: int,
                     room: int) -> int:
    """How many new nodes the autoscaler asks for so that the given (unbound) requests fit.

    The requests are packed first fit, in order, onto `provisioning` empty nodes already on their way
    and then onto fresh empty ones, at most `room` of those. A request larger than an empty node is
    skipped: no new node would ever hold it.
    """
    nodes = [dict(node) for _ in range(provisioning)]
    added = 0
    for request in requests:
        if not fits(request, node):
            continue
        slot = first_fit(request, nodes)
        if slot is None:
            if added >= room:
                continue  # a smaller request further on may still fit a node already counted
            nodes.append(dict(node))
            added += 1
            slot = len(nodes) - 1
        nodes[slot] = subtract(nodes[slot], request)
    return added
