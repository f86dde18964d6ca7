"""What a trace is replayed on: clusters, queues and classes (the objects `sluice up --config` reads), or,
without a config, a mapping built from the trace itself; and each trace job as the replay's SimJob.

The built mapping: one on-premises cluster of the trace's machine size (SWF: its MaxProcs as cpu, on
one node, as the logs count processors; GPU traces: 8-GPU nodes, enough for 1.25 × the trace's mean
demand and at least its largest job), one queue per user group (SWF) or virtual cluster (Philly) with
equal weights, and one service class, `standard`, that reserves room for a job that has waited half an
hour (docs/simulate.md: on the SDSC-SP2 and HPC2N logs this beat reserving at once, as EASY does, which
waits longer, never reserving, which lets wide jobs starve, and reserving after an hour, which let the
last wide job of SDSC-SP2's window wait for fair share and end it later). In a GPU pool each queue is
also guaranteed its equal part of the GPUs (whole GPUs), as the admins of a shared pool set it: a queue
below its part takes GPUs back from queues above theirs, which holds every queue near its share hour by
hour where jobs run for days (docs/simulate.md). An SWF log's queues are user groups, which no guarantee
was ever set for.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from dispatcher.policy.quotas import QueueQuota
from dispatcher.scheduler.mapping import PolicyConfig
from dispatcher.services import admin_objects
from dispatcher.services.admin_objects import class_policy_of, default_class, quota_of, rule_of
from simulation.world import Dependency, SimJob
from sluice.objects import (
    MAX_NODES,
    AdminObject,
    BurstPolicyObject,
    ClusterObject,
    QueueObject,
    ServiceClassObject,
    SimulatedSpec,
)

GPU = "nvidia.com/gpu"
GPUS_PER_NODE = 8
HEADROOM = 1.25  # the built GPU pool holds this many times the trace's mean demand
RESERVATION_AFTER_S = 1800.0  # the built class reserves room for a job that has waited this long (see above)
_NOT_NAME = re.compile(r"[^a-z0-9_.-]+")


class ScenarioError(ValueError):
    """The config and the trace do not go together (a queue the trace needs is missing, ...)."""


@dataclass(frozen=True)
class Scenario:
    objects: tuple[AdminObject, ...]
    built: bool  # made from the trace (no config given)
    clusters: tuple[ClusterObject, ...]
    policy: PolicyConfig
    capacity: dict[str, int]  # every cluster's allocatable (an elastic one's at its most nodes), summed

    def entitled(self) -> dict[str, float]:
        """Each leaf queue's entitled share: its weight among its siblings, times its parent's share."""
        quotas = {q.name: q for q in self.policy.quotas}
        siblings: dict[str | None, float] = {}
        for q in quotas.values():
            siblings[q.parent] = siblings.get(q.parent, 0.0) + q.weight

        def share(q: QueueQuota) -> float:
            own = q.weight / siblings[q.parent]
            return own * share(quotas[q.parent]) if q.parent in quotas else own
        parents = {q.parent for q in quotas.values()}
        return {name: share(q) for name, q in quotas.items() if name not in parents}


def queue_name(text: str) -> str:
    """A trace's group or virtual cluster as a valid queue name."""
    name = _NOT_NAME.sub("-", text.lower()).strip("-_.")
    return name or "default"


def queue_of(job, fmt: str) -> str:
    """The queue a trace job goes to: its user group in an SWF log, its queue otherwise."""
    return queue_name(job.group if fmt == "swf" else job.queue)


def built_objects(trace) -> list[AdminObject]:
    """The mapping made from the trace when no config is given (see the module's docstring)."""
    queues = sorted({queue_of(j, trace.format) for j in trace.jobs}) or ["default"]
    gpus = [j for j in trace.jobs if j.requests.get(GPU, 0) > 0]
    if gpus:
        span = max(1.0, max(j.submit_s for j in trace.jobs) - min(j.submit_s for j in trace.jobs))
        demand = sum(j.requests[GPU] / 1000 * j.run_s for j in gpus) / span
        biggest = max(j.requests[GPU] for j in gpus) / 1000
        need = max(demand * HEADROOM, biggest) / GPUS_PER_NODE  # nodes, before rounding up
        if need > MAX_NODES:
            raise ScenarioError(f"a GPU pool built for this trace (its largest job asks for {biggest:,g} GPUs, "
                                f"its mean demand is {demand:,.0f} GPUs) would need more than the {MAX_NODES:,} "
                                f"nodes a Cluster may have, of {GPUS_PER_NODE} GPUs each: give the clusters to replay "
                                f"on with --config")
        nodes = max(math.ceil(need), 1)
        node = {GPU: GPUS_PER_NODE * 1000}
    else:
        cpus = trace.machine.get("cpu") if trace.machine else None
        cpus = cpus or max((j.requests.get("cpu", 0) for j in trace.jobs), default=1000)
        nodes, node = 1, {"cpu": cpus}
    part = (nodes * GPUS_PER_NODE * 1000 // len(queues)) // 1000 * 1000 if gpus else 0
    return [
        ServiceClassObject("standard", priority=500, reservation_after_s=RESERVATION_AFTER_S),
        *(QueueObject(q, guaranteed={GPU: part} if part else {}) for q in queues),
        ClusterObject("onprem", tier="onprem", site="site-1", simulated=SimulatedSpec(nodes, node)),
    ]


def scenario(trace, objects: list[AdminObject] | None = None) -> Scenario:
    """The scenario of a replay: `objects` as `sluice up --config` reads them, else built from the trace."""
    built = objects is None
    objects = built_objects(trace) if built else list(objects)
    clusters = tuple(o for o in objects if isinstance(o, ClusterObject))
    if not clusters:
        raise ScenarioError("the config names no Cluster: a replay needs at least one (with spec.simulated nodes)")
    for c in clusters:
        if c.simulated is None:
            raise ScenarioError(f"Cluster {c.name}: spec.simulated is required to replay on it (nodes and node)")
    queues = [o for o in objects if isinstance(o, QueueObject)]
    classes = [o for o in objects if isinstance(o, ServiceClassObject)]
    if not classes:
        classes = [ServiceClassObject("standard", priority=500)]
        objects.append(classes[0])
    if refused := admin_objects.problems(objects):
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        raise ScenarioError(f"{refused[0]}{more}: `sluice up --config` would refuse this config too")
    names = {q.name for q in queues}
    needed = sorted({queue_of(j, trace.format) for j in trace.jobs} - names)
    if needed:
        raise ScenarioError(f"the trace's jobs go to queues the config does not define: {', '.join(needed[:10])}"
                            + (f" and {len(needed) - 10} more" if len(needed) > 10 else "")
                            + " (run without --config to see the mapping built from the trace)")
    policy = PolicyConfig(digest="simulation", classes={c.name: class_policy_of(c) for c in classes},
                          quotas=[quota_of(q) for q in queues],
                          rules=[rule_of(o) for o in objects if isinstance(o, BurstPolicyObject)])
    capacity: dict[str, int] = {}
    for c in clusters:  # an elastic cluster at its most nodes: the whole that shares are of
        nodes = max(c.simulated.nodes, (c.elastic or {}).get("maxNodes", 0))
        for r, amount in c.simulated.node.items():
            if amount > 0:
                capacity[r] = capacity.get(r, 0) + amount * nodes
    if not capacity:
        raise ScenarioError("the clusters' simulated nodes have nothing to run jobs on (every node is empty)")
    return Scenario(tuple(objects), built, clusters, policy, capacity)


def sim_jobs(trace, scene: Scenario, checkpoint_s: float | None = None, exact_runtimes: bool = False
             ) -> list[SimJob]:
    """Fresh SimJobs for one replay, ids 1.. in submit order (as a dispatcher numbers submits), each saving
    its progress every checkpoint_s (None: never), with what it waits for (startAfter, dependencies on the
    replayed jobs, its array's parallelism). A job's requested time is what the trace says (none where it
    says none); exact_runtimes: its run time, for every job (perfect estimates)."""
    queues = {q.name: q for q in scene.objects if isinstance(q, QueueObject)}
    priorities = {name: c.priority for name, c in scene.policy.classes.items()}
    out = []
    shared: dict[tuple, dict[str, int]] = {}  # one dict per distinct amount, as the cycle's reads share them
    pod_sets: dict[tuple, tuple] = {}  # and one tuple per distinct set of pods

    def one(amounts: dict[str, int]) -> dict[str, int]:
        return shared.setdefault(tuple(sorted(amounts.items())), amounts)

    def one_set(pods) -> tuple[tuple[int, dict[str, int]], ...]:
        return pod_sets.setdefault(tuple((n, tuple(sorted(pod.items()))) for n, pod in pods),
                                   tuple((n, one(pod)) for n, pod in pods))

    ids = {j.id: i for i, j in enumerate(trace.jobs, start=1)} if any(j.depends_on for j in trace.jobs) else {}
    for i, j in enumerate(trace.jobs, start=1):
        queue = queue_of(j, trace.format)
        service_class = getattr(j, "service_class", None) or default_class(list(queues[queue].service_classes),
                                                                           priorities)
        requests: dict[str, int] = {}
        largest: dict[str, int] = {}
        for count, pod in j.pods:
            for r, amount in pod.items():
                requests[r] = requests.get(r, 0) + amount * count
                largest[r] = max(largest.get(r, 0), amount)
        run = j.run_s if j.requested_s is None else min(j.run_s, j.requested_s)  # killed at its limit
        out.append(SimJob(i, j.submit_s, run, queue, service_class, priorities[service_class], one_set(j.pods),
                          one(requests), one(largest), run if exact_runtimes else j.requested_s or None,
                          trace_id=j.id, checkpoint_s=checkpoint_s))
        if j.waits:
            _holds(out[-1], j, ids)
    return out


def _holds(job: SimJob, traced, ids: dict[int, int]) -> None:
    """What the trace job waits for, on its SimJob. ids: trace id -> SimJob id of every replayed job."""
    if traced.start_after_s:
        job.hold_until = job.submit + traced.start_after_s
    dependencies = (Dependency(tuple(ids[i] for i in d.on if i in ids), d.condition, d.think_s, d.label, d.array)
                    for d in traced.depends_on)
    job.depends_on = tuple(d for d in dependencies if d.on)
    if traced.array is not None and traced.array.parallelism is not None:
        job.array_id, job.parallelism = traced.array.id, traced.array.parallelism
