"""Read-only views of a simulated cluster: its pods and nodes as kube-state-metrics would show them, taken
at one instant (SimCluster.view, SimCluster.pods)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SimPod:
    """A read-only view of one simulated pod (for tests and the demo)."""

    name: str
    job_id: int
    attempt: int
    phase: str
    node: str | None


@dataclass(frozen=True)
class SimNodeView:
    """One node as kube-state-metrics would show it."""

    name: str
    allocatable: dict[str, int]  # milli-units per resource
    schedulable: bool  # False when cordoned
    ready: bool  # the Ready condition

    @property
    def usable(self) -> bool:
        """New pods may bind here, and capacity() counts this node."""
        return self.schedulable and self.ready


@dataclass(frozen=True)
class SimPodView:
    """One pod as kube-state-metrics would show it."""

    name: str
    job_id: int
    attempt: int
    phase: str  # Pending, Running, Succeeded or Failed
    node: str | None  # where it runs or ran; None while Pending (the sim binds and starts at once)
    request: dict[str, int]  # effective requests (pod_requests), milli-units per resource


@dataclass(frozen=True)
class SimView:
    """Nodes and pods taken under one lock, at one instant of the clock."""

    nodes: tuple[SimNodeView, ...]
    pods: tuple[SimPodView, ...]  # every pod of every non-final attempt, in creation order
