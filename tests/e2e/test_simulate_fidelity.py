"""Fidelity of `sluice simulate` (issue #24): one small trace replayed in virtual time and run for real.

The trace (built below, seeded): 176 jobs in 11 bursts of 16 over three queues of weights 2:1:1 and two
clusters of different shapes (east: 2 nodes of 8 cpu; west: 4 nodes of 4 cpu), each job one pod of 1, 2, 3,
4 or 6 cpu, run times 0.5-3 s (hundredths of a second, so ends rarely coincide). A burst asks for about 1.6
times what the clusters hold, so its jobs wait for each other's ends; jobs of 6 cpu fit east only. Each burst
arrives SPARE_S (1.5 s) or more after the one before it has ended in the replay (submitAt rounded up to the
half second: 0, 5, 12.5, ..., 65 as it stands), and the test holds that every burst has ended, in the replay,
at least a second before the next arrives: each burst is its own experiment, and the real run waits between
them no longer than that needs.

- Replayed: `simulation.run.simulate(trace, objects, ["sluice"])`: each job's first start and cluster.
- For real: `sluice up` as `--config` would start it (tests/e2e/real_stack.py: each burst submitted at
  its submitAt on the wall clock, each job's `startedAt` and cluster read back once all have ended).

What must agree, and the tolerances (why):

- Order of starts: for every pair of jobs whose replayed starts differ by more than ORDER_TOLERANCE_S
  (0.25 s), the real starts are in the same order, in at least ORDER_AGREEMENT (99%) of those pairs.
  The replay starts a job at the very instant an end frees its room (or a burst arrives); the real stack
  starts it after the agent's end report, a scheduling cycle, the dispatch command and the sim's bind,
  measured at 15-85 ms on a shared 2-core machine; a job that waited for several ends in a row gathers
  those delays. 0.25 s is three times the largest lag measured; pairs closer than that (mostly jobs
  started by the same cycle, exact ties in the replay) are ties as far as a real clock can tell. The 1%
  is for a stall of the shared machine (a checkpoint, another tenant) that reorders a few close pairs.
- Cluster: the same for every job whose placement is not a race, in at least CLUSTER_AGREEMENT (97%).
  A placement is a race when, in the replay, room was freed on both clusters within CLUSTER_RACE_S
  before the job started: the replay sees both ends at once and picks the tighter cluster, while the
  real dispatcher may run a cycle between the two end reports and use the room it saw first. Raced
  placements are counted and shown, not asserted. The 3% is for a stall as above: one job sent
  elsewhere sends the rest of its burst down another, equally valid path.

Found with this test: the replay carried out a cycle's places in the plan's (fair-share) order, but the
dispatch statement writes the outbox commands in job id order, the agent creates the pods in that order
and a cluster binds them first fit, so with several jobs per node different jobs bound and different
ones waited Pending (about 1 job in 100 on another cluster, and starts a second or more apart in the
wrong order). simulation/memory_cycle.py now dispatches in the agent's order; since then every compared
pair and every cluster has agreed.
"""
from __future__ import annotations

import math
import random

import pytest

from simulation.run import simulate
from sluice.objects import load_objects
from tests.e2e.real_stack import run_for_real, trace_file

N_BURSTS = 11
PER_BURST = 16
SPARE_S = 1.5  # a burst arrives at least this long after the one before it has ended in the replay
APART_S = 60.0  # bursts this far apart cannot touch: how long each one lasts alone
QUEUES = {"alpha": 2, "beta": 1, "gamma": 1}  # weights
CPUS = (1, 2, 3, 4, 6)
ORDER_TOLERANCE_S = 0.25
CLUSTER_RACE_S = 0.25
ORDER_AGREEMENT = 0.99
CLUSTER_AGREEMENT = 0.97

OBJECTS = """
apiVersion: sluice.io/v1
kind: ServiceClass
metadata: {name: standard}
spec: {priority: 500}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: east}
spec: {tier: onprem, site: dc-1, simulated: {nodes: 2, node: {cpu: "8", memory: 32Gi}}}
---
apiVersion: sluice.io/v1
kind: Cluster
metadata: {name: west}
spec: {tier: onprem, site: dc-2, simulated: {nodes: 4, node: {cpu: "4", memory: 16Gi}}}
""" + "".join(f"""---
apiVersion: sluice.io/v1
kind: Queue
metadata: {{name: {name}}}
spec: {{weight: {weight}, serviceClasses: [standard]}}
""" for name, weight in QUEUES.items())


def trace_documents(arrivals: list[float], seed: int = 24) -> list[dict]:
    """The trace's jobs as Sluice job documents with submitAt (burst b at arrivals[b]) and runFor (seconds);
    the sim agent's duration annotation says runFor too. What each job is does not depend on `arrivals`."""
    rng = random.Random(seed)
    docs = []
    for at in arrivals:
        for _ in range(PER_BURST):
            n = len(docs)
            run = round(rng.uniform(0.5, 3.0), 2)
            cpu = rng.choice(CPUS)
            queue = rng.choices(list(QUEUES), weights=list(QUEUES.values()))[0]
            docs.append({
                "apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": f"j{n:03d}"},
                "submitAt": at, "runFor": run,
                "spec": {"queue": queue, "podSets": [{"name": "w", "count": 1, "template": {
                    "metadata": {"annotations": {"sluice.io/sim-duration": f"{run}s"}},
                    "spec": {"containers": [{"name": "m", "image": "x", "resources": {
                        "requests": {"cpu": str(cpu), "memory": "1Gi"}}}]}}}]},
            })
    return docs


def replayed(trace, objects) -> dict[str, tuple[float, str, float]]:
    """name -> (first start, cluster, end) in the replay."""
    sim = simulate(trace, objects, ["sluice"])
    names = {j.id: j.name for j in trace.jobs}
    out = {}
    for o in sim.outcomes["sluice"]:
        assert o.start_s is not None and o.end_s is not None, f"{names[o.id]} never ran in the replay"
        out[names[o.id]] = (o.start_s, o.cluster, o.end_s)
    return out


def burst_names(docs: list[dict], burst: int) -> list[str]:
    return [d["metadata"]["name"] for d in docs[burst * PER_BURST:(burst + 1) * PER_BURST]]


def burst_arrivals(objects, tmp_path) -> list[float]:
    """Each burst's submitAt: the first at 0, each next one SPARE_S after the one before it has ended, as long
    as that one lasts in a replay with the bursts APART_S apart, rounded up to the half second."""
    apart = [burst * APART_S for burst in range(N_BURSTS)]
    docs = trace_documents(apart)
    sim = replayed(trace_file(docs, tmp_path / "apart.yaml"), objects)
    arrivals = [0.0]
    for burst in range(N_BURSTS - 1):
        lasts = max(sim[n][2] for n in burst_names(docs, burst)) - apart[burst]
        arrivals.append(arrivals[-1] + math.ceil((lasts + SPARE_S) * 2) / 2)
    return arrivals


def races(sim: dict[str, tuple[float, str, float]]) -> set[str]:
    """Jobs whose replayed start came within CLUSTER_RACE_S after ends on both clusters (see the docstring)."""
    ends = [(end, cluster) for _, cluster, end in sim.values()]
    raced = set()
    for name, (start, _, _) in sim.items():
        freed = {cluster for end, cluster in ends if start - CLUSTER_RACE_S <= end <= start}
        if len(freed) > 1:
            raced.add(name)
    return raced


@pytest.mark.slow
def test_simulate_agrees_with_the_real_stack(db_url, tmp_path):
    objects = load_objects(OBJECTS, source="test_simulate_fidelity")
    arrivals = burst_arrivals(objects, tmp_path)
    docs = trace_documents(arrivals)
    trace = trace_file(docs, tmp_path / "fidelity.yaml")
    assert len(trace.jobs) == N_BURSTS * PER_BURST

    sim = replayed(trace, objects)
    # The design holds in the replay: each burst has ended a second before the next arrives.
    for burst in range(N_BURSTS - 1):
        assert max(sim[n][2] for n in burst_names(docs, burst)) <= arrivals[burst + 1] - 1.0, (burst, arrivals)

    real, took = run_for_real(docs, objects, db_url, tmp_path / "data")
    names = sorted(sim)

    # Order of starts.
    compared = agreeing = 0
    disorders = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            gap = sim[b][0] - sim[a][0]
            if abs(gap) <= ORDER_TOLERANCE_S:
                continue
            compared += 1
            if (real[b][0] - real[a][0]) * gap > 0:
                agreeing += 1
            else:
                disorders.append((a, b, round(gap, 2), round(real[b][0] - real[a][0], 2)))
    order = agreeing / compared

    # Clusters.
    raced = races(sim)
    same = [n for n in names if sim[n][1] == real[n][1]]
    settled = [n for n in names if n not in raced]
    settled_same = [n for n in settled if sim[n][1] == real[n][1]]
    cluster_agreement = len(settled_same) / len(settled)

    lags = sorted(real[n][0] - sim[n][0] for n in names)
    print(f"\nfidelity: {len(names)} jobs, real run {took:.1f}s; "
          f"start order: {agreeing}/{compared} pairs apart by more than {ORDER_TOLERANCE_S}s agree ({order:.4f}); "
          f"cluster: {len(same)}/{len(names)} same overall, {len(settled_same)}/{len(settled)} of the jobs "
          f"placed with no race ({cluster_agreement:.4f}), {len(raced)} raced; real start - replayed start: "
          f"median {lags[len(lags) // 2]:.3f}s, p90 {lags[int(len(lags) * 0.9)]:.3f}s, max {lags[-1]:.3f}s")
    if disorders:
        print("out of order (a, b, replayed b-a, real b-a):", disorders[:20])
    moved = [(n, sim[n][1], real[n][1], round(sim[n][0], 2), n in raced) for n in names if sim[n][1] != real[n][1]]
    if moved:
        print("other cluster (job, replayed, real, replayed start, raced):", moved[:30])
    assert order >= ORDER_AGREEMENT
    assert cluster_agreement >= CLUSTER_AGREEMENT
    assert took < 110
