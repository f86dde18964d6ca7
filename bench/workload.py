"""What the benchmarks run: admin objects (classes, a queue tree, clusters) and job documents.

Every job document goes through the project's own parser (sluice.spec) once per shape, so the rows
the backlog loader writes hold exactly what `Submit` would have stored for the same document.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from sluice.objects import ClusterObject, QueueObject, ServiceClassObject, SimulatedSpec
from sluice.quantity import parse_resources
from sluice.spec import JobSpec, job_from_document

CLASSES = (  # as `sluice up` defines them (sluice.objects.default_objects)
    ServiceClassObject("critical", priority=1000, can_preempt=True),
    ServiceClassObject("standard", priority=500, burst_allowed=True, burst_after_s=600.0),
    ServiceClassObject("batch", priority=100, preemptible=True),
)
CLASS_MIX = ("standard",) * 14 + ("batch",) * 5 + ("critical",)  # 70 % / 25 % / 5 %
NODE = parse_resources({"cpu": "64", "memory": "256Gi"})  # one simulated node


@dataclass(frozen=True)
class Shape:
    name: str
    pods: int
    cpu: str
    memory: str


# Three job shapes, taken in turn: on average 3 cpu and 6 GiB per job.
SHAPES = (Shape("single", 1, "1", "2Gi"), Shape("pair", 2, "2", "4Gi"), Shape("gang", 4, "1", "1Gi"))
MAX_JOB = parse_resources({"cpu": "4", "memory": "8Gi"})  # the largest shape's whole request


def job_document(queue: str, shape: Shape, service_class: str, priority: int, *, duration: str = "1s",
                 name: str | None = None) -> dict:
    metadata: dict = {"labels": {"bench": shape.name}}
    if name is not None:
        metadata["name"] = name
    return {"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": metadata,
            "spec": {"queue": queue, "serviceClass": service_class, "priority": priority, "maxRetries": 2,
                     "podSets": [{"name": "worker", "count": shape.pods, "template": {
                         "metadata": {"annotations": {"sluice.io/sim-duration": duration}},
                         "spec": {"containers": [{"name": "main", "image": "bench/work:1", "resources": {
                             "requests": {"cpu": shape.cpu, "memory": shape.memory}}}]}}}]}}


def parsed(doc: dict) -> JobSpec:
    return job_from_document(doc)


def queue_names(queues: int) -> list[str]:
    return [f"q-{i:04d}" for i in range(queues)]


def queue_tree(queues: int, parents: int = 10) -> list[QueueObject]:
    """`parents` organisations, each the parent of an equal share of the leaf queues (jobs go to leaves).
    No guarantees or maxima: every quota check runs, none binds."""
    parents = max(1, min(parents, queues))
    out = [QueueObject(f"org-{p:02d}") for p in range(parents)]
    out += [QueueObject(name, parent=f"org-{i % parents:02d}") for i, name in enumerate(queue_names(queues))]
    return out


def cluster_names(clusters: int) -> list[str]:
    return [f"c-{i:03d}" for i in range(clusters)]


def nodes_for(jobs: int, clusters: int, headroom: float = 1.25) -> int:
    """Nodes per cluster so that `clusters` clusters hold every job at once (with some headroom)."""
    cpu_per_job = sum(parse_resources({"cpu": s.cpu})["cpu"] * s.pods for s in SHAPES) / len(SHAPES)
    return max(1, math.ceil(jobs * cpu_per_job * headroom / clusters / NODE["cpu"]))


def cluster_objects(clusters: int, nodes: int) -> list[ClusterObject]:
    """On-premises clusters across 10 sites, each `nodes` simulated nodes of NODE."""
    return [ClusterObject(name, labels={"zone": f"z{i % 3}"}, tier="onprem", site=f"dc-{i % 10}",
                          simulated=SimulatedSpec(nodes, dict(NODE)))
            for i, name in enumerate(cluster_names(clusters))]


def capacity(nodes: int, used: dict[str, int] | None = None) -> dict:
    """A capacity report as the sim agent of a cluster of `nodes` x NODE writes it (agents.capacity_document):
    allocatable, free (allocatable less what is used) and the largest free node (a whole empty node while
    one is left: the sim binds first fit)."""
    used = used or {}
    allocatable = {r: amount * nodes for r, amount in NODE.items()}
    free = {r: allocatable[r] - used.get(r, 0) for r in allocatable}
    largest = {r: max(0, min(NODE[r], free[r])) for r in NODE}
    return {"allocatable": allocatable, "free": free, "largestFreeNode": largest}
