"""Pods onto nodes, first fit: what the dispatcher checks before it sends a gang to a cluster, and how the
simulated cluster binds pods. Pure functions over milli-unit resource maps (sluice/quantity.py)."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from sluice.quantity import fits, subtract


def first_fit(request: dict[str, int], free_per_node: Sequence[dict[str, int]]) -> int | None:
    """Index of the first node whose free resources hold the request, or None."""
    for index, free in enumerate(free_per_node):
        if fits(request, free):
            return index
    return None


def largest_first(pods: Iterable[tuple[int, dict[str, int]]]) -> list[dict[str, int]]:
    """One request per pod from (count, per-pod requests) pod sets, the largest first (by each resource in
    name order: resources in milli-units of different kinds are not comparable, a fixed order is)."""
    sets = [(count, request) for count, request in pods if count > 0]
    names = sorted({name for _, request in sets for name in request})
    sets.sort(key=lambda s: tuple(s[1].get(name, 0) for name in names), reverse=True)
    return [request for count, request in sets for _ in range(count)]


def first_fit_decreasing(pods: Iterable[tuple[int, dict[str, int]]], free_per_node: Sequence[dict[str, int]]
                         ) -> tuple[list[dict[str, int]], list[int | None]]:
    """Every pod, largest first (`largest_first`), onto the first node that still holds it.

    Returns the nodes' free resources after the pods that fit, and each pod's node index in that order
    (None for a pod that fits nowhere: the gang does not fit at once)."""
    free = list(free_per_node)
    placed: list[int | None] = []
    for request in largest_first(pods):
        slot = first_fit(request, free)
        if slot is not None:
            free[slot] = subtract(free[slot], request)
        placed.append(slot)
    return free, placed
