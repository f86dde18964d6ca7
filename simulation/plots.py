"""Plots of simulated runs, one line per policy: the wait-time CDF and utilization over time.

matplotlib is an optional dependency (`pip install 'sluice[plot]'`), imported only when plots are asked
for; drawing uses the Agg backend through matplotlib's object API, so no display and no pyplot state.
"""
from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from simulation.report import JobOutcome, _PerWindow, busy_from_outcomes

__all__ = ["PlotError", "ready", "write_plots", "WAIT_CDF", "UTILIZATION", "UTILIZATION_BINS"]

WAIT_CDF = "wait_cdf.png"
UTILIZATION = "utilization.png"
UTILIZATION_BINS = 200  # enough to see daily cycles over a few months, few enough to read
_MIN_PLOTTED_WAIT_S = 1.0  # a log axis has no 0: shorter waits are drawn at 1 s


class PlotError(Exception):
    """Plots that cannot be drawn or written; the message says why and what to do."""


def ready(directory: str | os.PathLike) -> Path:
    """The plot directory, made and checked: matplotlib is there and a file can be written in it (asked before
    a long replay, so that it does not fail at its end)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotError("plots need matplotlib, which is not installed: pip install 'sluice[plot]'") from None
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PlotError(f"cannot create the plot directory {directory}: {err.strerror or err}") from None
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as err:
        raise PlotError(f"cannot write into the plot directory {directory}: {err.strerror or err}") from None
    return directory


def write_plots(directory: str | os.PathLike, outcomes_by_policy: dict[str, Iterable[JobOutcome]],
                busy_by_policy: dict[str, list[tuple[float, dict[str, int]]] | None] | None,
                capacity: dict[str, int]) -> list[Path]:
    """Write wait_cdf.png (per policy, the fraction of started jobs that waited at most x seconds, log x)
    and utilization.png (per policy, the share of capacity in use per time bin, of the resource kind most
    used overall) into directory, creating it. busy_by_policy: per policy, what was in use over time as
    report.policy_figures takes it; a policy without one is drawn from its outcomes' finishing runs.
    Returns the paths written."""
    directory = ready(directory)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    if not capacity or any(amount <= 0 for amount in capacity.values()):
        raise PlotError(f"capacity must map resource names to positive milli-units, got {capacity!r}")
    outcomes_by_policy = {policy: list(outcomes) for policy, outcomes in outcomes_by_policy.items()}
    busy_by_policy = {policy: (busy_by_policy or {}).get(policy) or busy_from_outcomes(outcomes)
                      for policy, outcomes in outcomes_by_policy.items()}

    waits = Figure(figsize=(8, 5))
    FigureCanvasAgg(waits)
    axes = waits.add_subplot()
    for policy, outcomes in outcomes_by_policy.items():
        started = sorted(max(_MIN_PLOTTED_WAIT_S, o.start_s - o.submit_s) for o in outcomes if o.start_s is not None)
        if started:
            axes.step(started, [(rank + 1) / len(started) for rank in range(len(started))], where="post",
                      label=policy)
    axes.set_xscale("log")
    axes.set_xlabel(f"wait (seconds; waits under {_MIN_PLOTTED_WAIT_S:g} s drawn at {_MIN_PLOTTED_WAIT_S:g} s)")
    axes.set_ylabel("fraction of started jobs")
    axes.set_ylim(0, 1)
    axes.set_title("Wait time CDF")
    axes.grid(True, which="both", alpha=0.3)
    _legend(axes)

    origin = min((o.submit_s for outcomes in outcomes_by_policy.values() for o in outcomes), default=0.0)
    horizon = max([origin] + [t for busy in busy_by_policy.values() for t, _ in busy[-1:]]
                  + [o.end_s for outcomes in outcomes_by_policy.values() for o in outcomes if o.end_s is not None])
    resource = _most_used(busy_by_policy.values(), capacity, origin, horizon)
    bin_s = max(1.0, (horizon - origin) / UTILIZATION_BINS)
    bins = max(1, math.ceil((horizon - origin) / bin_s))
    unit, unit_s = ("days", 86400.0) if horizon - origin > 3 * 86400 else ("hours", 3600.0)
    usage = Figure(figsize=(10, 5))
    FigureCanvasAgg(usage)
    axes = usage.add_subplot()
    peak = 1.0
    for policy, busy in busy_by_policy.items():
        fractions = [x / (capacity[resource] * bin_s) for x in _binned(busy, resource, origin, bin_s, bins, horizon)]
        peak = max([peak, *fractions])  # above 1 only with a capacity smaller than what the clusters had
        axes.step([(k * bin_s) / unit_s for k in range(bins)], fractions, where="post", label=policy)
    axes.set_xlabel(f"time since the first submit ({unit}; bins of {bin_s / 60:.0f} minutes)")
    axes.set_ylabel(f"{resource} in use (fraction of capacity)")
    axes.set_ylim(0, peak * 1.05)
    axes.set_title(f"Utilization of {resource} over time")
    axes.grid(True, alpha=0.3)
    _legend(axes)

    written = []
    for figure, name in ((waits, WAIT_CDF), (usage, UTILIZATION)):
        path = directory / name
        try:
            figure.savefig(path, dpi=100, bbox_inches="tight")
        except OSError as err:
            raise PlotError(f"cannot write {path}: {err.strerror or err}") from None
        written.append(path)
    return written


def _legend(axes) -> None:
    if axes.get_legend_handles_labels()[0]:
        axes.legend()


def _binned(busy: list[tuple[float, dict[str, int]]], resource: str, origin: float, bin_s: float, bins: int,
            horizon: float) -> list[float]:
    """Resource-seconds of `resource` in use per bin."""
    sums = _PerWindow(origin, bin_s, bins)
    for index, (time, in_use) in enumerate(busy):
        amount = in_use.get(resource, 0)
        if amount:
            until = busy[index + 1][0] if index + 1 < len(busy) else horizon
            sums.add(max(time, origin), min(until, horizon), lambda overlap, amount=amount: amount * overlap)
    return sums.totals()


def _most_used(busies: Iterable[list[tuple[float, dict[str, int]]]], capacity: dict[str, int], origin: float,
               horizon: float) -> str:
    """The resource kind with the most use relative to its capacity over every policy's run."""
    used = {resource: 0.0 for resource in capacity}
    for busy in busies:
        for index, (time, in_use) in enumerate(busy):
            until = busy[index + 1][0] if index + 1 < len(busy) else horizon
            for resource in used:
                used[resource] += in_use.get(resource, 0) * max(0.0, until - time)
    return max(sorted(used), key=lambda resource: used[resource] / capacity[resource])
