"""Fidelity of `sluice simulate` on an elastic cloud cluster: a small trace replayed in virtual time and run
for real (`sluice up` with sim agents, real Postgres, real gRPC), the two agreeing on each job's cluster and
start.

The clusters: onprem, one node of 4 cpu; cloud, elastic, no node to begin with, at most 2 nodes of 4 cpu,
each joining 2 s after it is asked for and leaving after 3 s without a running pod; every job 4 cpu and
allowed to burst at once. What each job meets (seconds from the trace's start):

- a (0, 6 s) takes onprem; b (0.5, 3 s) and c (1, 3 s) burst to cloud, whose nodes join at 2.5 and 3;
- d (4, 1 s) finds the cloud at its 2 nodes, both busy: it is sent there and starts when b's node is free
  (5.5), and no third node is asked for;
- the cloud's nodes leave at 9 and 9.5; e (10, 2 s) takes onprem again, and f (10.5, 2 s) bursts to a
  cloud that must ask for a node anew: it starts at 12.5.

Tolerance: START_TOLERANCE_S (0.5 s) per start. The replay starts a job the instant its room or node is
there; the real stack after a cycle, the dispatch command and the agent's create (tens of ms on this
machine), and a node asked for at a real dispatch joins 2 s after that, so the lag does not add up.
"""
from __future__ import annotations

import pytest

from simulation.run import simulate
from sluice.objects import load_objects
from tests.e2e.real_stack import run_for_real, trace_file

START_TOLERANCE_S = 0.5
JOBS = {"a": (0.0, 6.0), "b": (0.5, 3.0), "c": (1.0, 3.0), "d": (4.0, 1.0), "e": (10.0, 2.0), "f": (10.5, 2.0)}
EXPECTED = {"a": ("onprem", 0.0), "b": ("cloud", 2.5), "c": ("cloud", 3.0), "d": ("cloud", 5.5),
            "e": ("onprem", 10.0), "f": ("cloud", 12.5)}

OBJECTS = """
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: standard}
spec: {priority: 500, burst: {allowed: true, after: 0s}}
---
apiVersion: sluice.io/v1
kind: Queue
metadata: {name: q}
spec: {serviceClasses: [standard]}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: onprem}
spec: {tier: onprem, site: dc-1, simulated: {nodes: 1, node: {cpu: "4", memory: 16Gi}}}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: cloud}
spec:
  tier: cloud
  site: cloud-1
  price: {cpu: 1.0}
  simulated: {nodes: 0, node: {cpu: "4", memory: 16Gi}}
  elastic: {maxNodes: 2, provisioningDelay: 2s, scaleDownAfter: 3s}
---
apiVersion: sluice.io/v1
kind: BurstPolicy
metadata: {name: cloud-burst}
spec: {clusterSelector: {tier: cloud}, after: 0s, budget: {perDay: 1000}}
"""


def documents() -> list[dict]:
    return [{"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": name}, "submitAt": at, "runFor": run,
             "spec": {"queue": "q", "serviceClass": "standard", "podSets": [{"name": "w", "count": 1, "template": {
                 "metadata": {"annotations": {"sluice.io/sim-duration": f"{run}s"}},
                 "spec": {"containers": [{"name": "m", "image": "x", "resources": {
                     "requests": {"cpu": "4", "memory": "1Gi"}}}]}}}]}}
            for name, (at, run) in JOBS.items()]


@pytest.mark.slow
def test_an_elastic_cluster_replays_as_it_runs(db_url, tmp_path):
    docs = documents()
    trace = trace_file(docs, tmp_path / "elastic.yaml")
    objects = load_objects(OBJECTS, source="test_simulate_elastic_fidelity")
    names = {j.id: j.name for j in trace.jobs}
    sim = {names[o.id]: (o.cluster, o.start_s) for o in simulate(trace, objects, ["sluice"]).outcomes["sluice"]}
    assert sim == EXPECTED, sim  # the design above, in the replay

    real, _ = run_for_real(docs, objects, db_url, tmp_path / "data")
    print("\nreal (start, cluster):", {n: (round(s, 3), c) for n, (s, c) in sorted(real.items())})
    assert {n: c for n, (_, c) in real.items()} == {n: c for n, (c, _) in EXPECTED.items()}
    late = {n: round(real[n][0] - start, 3) for n, (_, start) in EXPECTED.items()
            if abs(real[n][0] - start) > START_TOLERANCE_S}
    assert not late, late
