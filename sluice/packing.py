"""Pods onto nodes, first fit: what the dispatcher checks before it sends a gang to a cluster, and how the
simulated cluster binds pods and starts gangs. Pure functions over milli-unit resource maps
(sluice/quantity.py)."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from sluice.quantity import fits, subtract


def first_fit(request: dict[str, int], free_per_node: Sequence[dict[str, int]]) -> int | None:
    """Index of the first node whose free resources hold the request, or None."""
    for index, free in enumerate(free_per_node):
        if fits(request, free):
            return index
    return None


def expand(pods: Iterable[tuple[int, dict[str, int]]]) -> list[dict[str, int]]:
    """One request per pod from (count, per-pod requests) pod sets, in order."""
    return [request for count, request in pods for _ in range(count)]


def first_fit_decreasing(requests: Sequence[dict[str, int]], free_per_node: Sequence[dict[str, int]]
                         ) -> tuple[list[dict[str, int]], list[int | None]]:
    """Every pod's request, the largest first, onto the first node that still holds it.

    Largest by each resource in name order (milli-units of different resources are not comparable, a fixed
    order is); equal requests keep their order. Returns the nodes' free resources after the pods that fit,
    and each request's node index, in the order given (None for one that fits nowhere: not all fit at once)."""
    names = sorted({name for request in requests for name in request})
    order = sorted(range(len(requests)), key=lambda i: tuple(-requests[i].get(name, 0) for name in names))
    free = list(free_per_node)
    slots: list[int | None] = [None] * len(requests)
    for index in order:
        slot = first_fit(requests[index], free)
        if slot is not None:
            free[slot] = subtract(free[slot], requests[index])
            slots[index] = slot
    return free, slots
