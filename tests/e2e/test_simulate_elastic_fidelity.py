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

import time
from datetime import datetime

import pytest
import yaml

from simulation.run import simulate
from simulation.traces import read_trace
from sluice.objects import load_objects

START_TOLERANCE_S = 0.5
LEAD_S = 1.0  # the first submit comes this long after the clock's zero is taken
FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
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


def run_for_real(docs: list[dict], objects, db_url, data_dir) -> dict[str, tuple[str, float]]:
    """name -> (cluster, start in seconds after the trace's time 0 on the wall clock)."""
    from devstack.embedded import Embedded, UpSettings
    from sluice.client import Client

    embedded = Embedded(UpSettings(data_dir=data_dir, listen="127.0.0.1:0", make_default=False,
                                   database_url=db_url), objects).start()
    try:
        embedded.wait_connected()
        with Client(embedded.client_settings(timeout_s=30)) as client:
            deadline = time.monotonic() + 15
            while not all(c["state"] == "active" for c in client.clusters()):
                assert time.monotonic() < deadline, f"clusters not active: {client.clusters()}"
                time.sleep(0.05)
            zero_wall, zero = time.time() + LEAD_S, time.monotonic() + LEAD_S
            for doc in docs:
                time.sleep(max(0.0, zero + doc["submitAt"] - time.monotonic()))
                client.submit([{k: v for k, v in doc.items() if k not in ("submitAt", "runFor")}])
            deadline = time.monotonic() + 30
            while True:
                jobs = client.list()
                if len(jobs) == len(docs) and all(j["state"] in FINAL for j in jobs):
                    break
                assert time.monotonic() < deadline, [(j["name"], j["state"], j["reason"]) for j in jobs]
                time.sleep(0.2)
    finally:
        embedded.stop()
    assert all(j["state"] == "SUCCEEDED" for j in jobs), [(j["name"], j["state"], j["reason"]) for j in jobs]

    def offset(stamp: str) -> float:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() - zero_wall
    return {j["name"]: (j["cluster"], offset(j["startedAt"])) for j in jobs}


@pytest.mark.slow
def test_an_elastic_cluster_replays_as_it_runs(db_url, tmp_path):
    docs = documents()
    path = tmp_path / "elastic.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    trace = read_trace(path, "sluice")
    objects = load_objects(OBJECTS, source="test_simulate_elastic_fidelity")
    names = {j.id: j.name for j in trace.jobs}
    sim = {names[o.id]: (o.cluster, o.start_s) for o in simulate(trace, objects, ["sluice"]).outcomes["sluice"]}
    assert sim == EXPECTED, sim  # the design above, in the replay

    real = run_for_real(docs, objects, db_url, tmp_path / "data")
    print("\nreal (cluster, start):", {n: (c, round(s, 3)) for n, (c, s) in sorted(real.items())})
    assert {n: c for n, (c, _) in real.items()} == {n: c for n, (c, _) in EXPECTED.items()}
    late = {n: round(real[n][1] - start, 3) for n, (_, start) in EXPECTED.items()
            if abs(real[n][1] - start) > START_TOLERANCE_S}
    assert not late, late
