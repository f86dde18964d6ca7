"""Decayed usage: what a queue used lately, each resource-second weighed 2^(-age / half-life).

Pure. With a half-life H (a Queue tree's usageHalfLife), fair share adds to a queue's current share the
share its history stands for: decayed resource-seconds / (H / ln 2) / capacity (`rate`). H / ln 2 is
the decayed weight of all past time (the integral of 2^(-a/H) over a >= 0), so a queue that always used
a share s has a history share of s. `decayed_run` is the closed form of one run (what the store sums
over attempts); `DecayedUsage` is the same sum kept event by event (what a simulation advances).
"""
from __future__ import annotations

import math

LN2 = math.log(2)


def _check(half_life_s: float) -> None:
    if not half_life_s > 0:
        raise ValueError(f"half_life_s must be greater than 0, got {half_life_s!r}")


def decayed_run(requests: dict[str, int], start: float, end: float | None, *, now: float,
                half_life_s: float) -> dict[str, float]:
    """The decayed resource-seconds, seen at `now`, of `requests` held from `start` to `end` (None: still
    running), per resource: requests x H/ln2 x (2^(-(now-end)/H) - 2^(-(now-start)/H)). Time after `now`
    does not count."""
    _check(half_life_s)
    end = now if end is None else min(end, now)
    start = min(start, end)
    weight = half_life_s / LN2 * (2.0 ** (-(now - end) / half_life_s) - 2.0 ** (-(now - start) / half_life_s))
    return {r: amount * weight for r, amount in requests.items()}


def rate(decayed_s: float, half_life_s: float) -> float:
    """The constant use whose decayed resource-seconds over all past time are `decayed_s`."""
    return decayed_s * LN2 / half_life_s


class DecayedUsage:
    """Per queue and resource, decayed resource-seconds, advanced event by event in O(queues x resources)."""

    def __init__(self, half_life_s: float, now: float = 0.0):
        _check(half_life_s)
        self.half_life_s = half_life_s
        self._at = now
        self._values: dict[str, dict[str, float]] = {}

    def advance(self, now: float, running: dict[str, dict[str, int]]) -> None:
        """Move to `now`, counting `running` (per queue, the requests held) as held unchanged since the last step."""
        if now < self._at:
            raise ValueError(f"DecayedUsage moves only forward: at {self._at}, asked for {now}")
        keep = 2.0 ** (-(now - self._at) / self.half_life_s)
        gain = self.half_life_s / LN2 * (1.0 - keep)  # one unit held over the step, decayed to `now`
        for queue in self._values.keys() | running.keys():
            values, held = self._values.setdefault(queue, {}), running.get(queue, {})
            for r in values.keys() | held.keys():
                values[r] = values.get(r, 0.0) * keep + held.get(r, 0) * gain
        self._at = now

    def value(self, queue: str) -> dict[str, float]:
        return dict(self._values.get(queue, {}))

    def history(self) -> dict[str, dict[str, float]]:
        """Every queue's value: what plan_cycle takes as `history`."""
        return {queue: dict(values) for queue, values in self._values.items()}
