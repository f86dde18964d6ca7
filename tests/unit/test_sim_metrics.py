"""The sim's kube-state-metrics series, and unusable (cordoned, not Ready) nodes in the sim.

The capacity a Prometheus query would compute from the series is recomputed here from the parsed
exposition alone, and must equal SimCluster.capacity() exactly.
"""
from __future__ import annotations

import random
import urllib.error
import urllib.request
from collections import defaultdict

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.backends.sim.cluster import SimCluster, SimConfig
from agent.backends.sim.metrics import SimMetricsServer, registry_for, resource_label, resource_unit

CPU = 1000
GIB = 2**30 * 1000
NODE = {"cpu": 8 * CPU, "memory": 32 * GIB, "nvidia.com/gpu": 2 * 1000}


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def job(pods: int = 1, cpu: str = "1", gpu: str | None = None, duration: str = "60s", exit_code: str = "0",
        **pod_sets: tuple) -> dict:
    """A job document; extra pod sets as name=(count, cpu, duration)."""
    sets = {"worker": (pods, cpu, duration), **pod_sets}
    limits = {} if gpu is None else {"nvidia.com/gpu": gpu}
    return {"spec": {"queue": "default", "podSets": [
        {"name": name, "count": count, "template": {
            "metadata": {"annotations": {"sluice.io/sim-duration": dur, "sluice.io/sim-exit-code": exit_code}},
            "spec": {"containers": [{"name": "main", "image": "img", "resources": {
                "requests": {"cpu": c, "memory": "1Gi"}, "limits": limits}}]}}}
        for name, (count, c, dur) in sets.items()]}}


Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse(text: str) -> Samples:
    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((sample.labels, sample.value))
    return samples


def exposition(sim: SimCluster) -> Samples:
    return parse(generate_latest(registry_for(sim)).decode())


def milli(value: float) -> int:
    return round(value * 1000)


def capacity_from_series(samples: Samples) -> dict[str, dict[str, int]]:
    """What a PromQL reader computes from the series alone (keys are resource labels)."""
    unschedulable = {labels["node"] for labels, value in samples["kube_node_spec_unschedulable"] if value == 1}
    ready = {labels["node"] for labels, value in samples["kube_node_status_condition"]
             if labels["condition"] == "Ready" and labels["status"] == "true" and value == 1}
    node_alloc: dict[str, dict[str, int]] = defaultdict(dict)
    for labels, value in samples["kube_node_status_allocatable"]:
        node_alloc[labels["node"]][labels["resource"]] = milli(value)
    shape = {resource for amounts in node_alloc.values() for resource in amounts}
    usable = {node for node in node_alloc if node not in unschedulable and node in ready}
    live = {labels["pod"] for labels, value in samples["kube_pod_status_phase"]
            if labels["phase"] in ("Pending", "Running") and value == 1}

    allocatable = {resource: sum(node_alloc[node].get(resource, 0) for node in usable) for resource in shape}
    free = dict(allocatable)
    used: dict[str, dict[str, int]] = {node: {} for node in usable}
    for labels, value in samples["kube_pod_container_resource_requests"]:
        node, resource = labels["node"], labels["resource"]
        if labels["pod"] not in live or not (node == "" or node in usable):
            continue
        free[resource] = free.get(resource, 0) - milli(value)
        if node:
            used[node][resource] = used[node].get(resource, 0) + milli(value)
    largest = {resource: max((node_alloc[node].get(resource, 0) - used[node].get(resource, 0) for node in usable),
                             default=0) for resource in shape}

    def shaped(amounts: dict[str, int]) -> dict[str, int]:
        return {resource: amount for resource, amount in amounts.items() if amount or resource in shape}

    return {"allocatable": allocatable, "free": shaped(free), "largest_free_node": shaped(largest)}


def capacity_by_label(sim: SimCluster) -> dict[str, dict[str, int]]:
    report = sim.capacity()
    return {part: {resource_label(name): amount for name, amount in getattr(report, part).items()}
            for part in ("allocatable", "free", "largest_free_node")}


def one(samples: Samples, name: str, **labels: str) -> float:
    found = [value for sample_labels, value in samples[name]
             if all(sample_labels.get(key) == want for key, want in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


# -- the exposition -----------------------------------------------------------------------------


def test_server_serves_parsable_kube_state_metrics_on_loopback():
    clock = FakeClock()
    sim = SimCluster(SimConfig(nodes=2, node=NODE), clock=clock)
    sim.create_attempt(7, 2, job(pods=2, cpu="6", gpu="1"))  # binds, one pod on each node
    sim.create_attempt(8, 1, job(pods=1, cpu="6", gpu="1"))  # waits
    sim.set_node("node-1", ready=False)
    server = SimMetricsServer(sim)
    port = server.start()
    try:
        assert port > 0 and server.url == f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(server.url, timeout=5) as response:
            samples = parse(response.read().decode())
    finally:
        server.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=2)

    assert one(samples, "kube_node_status_allocatable", node="node-0", resource="cpu", unit="core") == 8
    assert one(samples, "kube_node_status_allocatable", node="node-0", resource="memory", unit="byte") == 32 * 2**30
    assert one(samples, "kube_node_status_allocatable", node="node-1", resource="nvidia_com_gpu",
               unit="integer") == 2
    assert one(samples, "kube_node_spec_unschedulable", node="node-0") == 0
    assert one(samples, "kube_node_spec_unschedulable", node="node-1") == 0
    assert [one(samples, "kube_node_status_condition", node="node-1", condition="Ready", status=status)
            for status in ("true", "false", "unknown")] == [0, 1, 0]
    assert [one(samples, "kube_node_status_condition", node="node-0", condition="Ready", status=status)
            for status in ("true", "false", "unknown")] == [1, 0, 0]

    pods = ["7-2-worker-0", "7-2-worker-1", "8-1-worker-0"]
    assert {labels["pod"]: labels["node"] for labels, value in samples["kube_pod_info"]} == {
        pods[0]: "node-0", pods[1]: "node-1", pods[2]: ""}
    assert all(labels["namespace"] == "sluice" and value == 1 for labels, value in samples["kube_pod_info"])
    for pod, phase in zip(pods, ["Running", "Running", "Pending"]):
        assert {labels["phase"]: value for labels, value in samples["kube_pod_status_phase"]
                if labels["pod"] == pod} == {p: (1 if p == phase else 0)
                                             for p in ("Pending", "Running", "Succeeded", "Failed", "Unknown")}
    assert one(samples, "kube_pod_container_resource_requests", pod=pods[2], container="main", node="",
               resource="cpu", unit="core") == 6
    assert one(samples, "kube_pod_container_resource_requests", pod=pods[0], node="node-0",
               resource="memory", unit="byte") == 2**30
    assert one(samples, "kube_pod_container_resource_requests", pod=pods[1], node="node-1",
               resource="nvidia_com_gpu", unit="integer") == 1
    assert {labels["pod"]: (labels["label_sluice_io_job_id"], labels["label_sluice_io_attempt"])
            for labels, value in samples["kube_pod_labels"] if value == 1} == {
        pods[0]: ("7", "2"), pods[1]: ("7", "2"), pods[2]: ("8", "1")}
    assert capacity_from_series(samples) == capacity_by_label(sim)


def test_fractional_cpu_is_in_cores():
    sim = SimCluster(SimConfig(nodes=1, node={"cpu": 1500, "memory": GIB}), clock=FakeClock())
    sim.create_attempt(1, 1, job(cpu="250m"))
    samples = exposition(sim)
    assert one(samples, "kube_node_status_allocatable", resource="cpu") == 1.5
    assert one(samples, "kube_pod_container_resource_requests", resource="cpu") == 0.25


def test_resource_names_and_units_follow_kube_state_metrics():
    assert [(resource_label(name), resource_unit(name)) for name in
            ("cpu", "memory", "nvidia.com/gpu", "ephemeral-storage", "hugepages-2Mi", "example.com/fpga", "pods")
            ] == [("cpu", "core"), ("memory", "byte"), ("nvidia_com_gpu", "integer"),
                  ("ephemeral_storage", "byte"), ("hugepages_2Mi", "byte"), ("example_com_fpga", "integer"),
                  ("pods", "integer")]


def test_finished_pods_of_a_live_attempt_stay_listed_with_their_node_and_count_nowhere():
    clock = FakeClock()
    sim = SimCluster(SimConfig(nodes=1, node=NODE), clock=clock)
    sim.create_attempt(1, 1, job(cpu="2", duration="60s", helper=(1, "3", "1s")))
    clock.now += 5  # the helper pod succeeded; the worker still runs, so the attempt is not final
    samples = exposition(sim)
    assert one(samples, "kube_pod_status_phase", pod="1-1-helper-0", phase="Succeeded") == 1
    assert one(samples, "kube_pod_info", pod="1-1-helper-0") == 1
    assert one(samples, "kube_pod_info", pod="1-1-helper-0", node="node-0") == 1
    assert one(samples, "kube_pod_container_resource_requests", pod="1-1-helper-0", resource="cpu") == 3
    assert sim.capacity().free["cpu"] == 6 * CPU
    assert capacity_from_series(samples) == capacity_by_label(sim)
    clock.now += 100  # the attempt ended: its pods are gone from the sim and from the series
    samples = exposition(sim)
    assert samples["kube_pod_info"] == [] and samples["kube_pod_container_resource_requests"] == []


# -- unusable nodes -----------------------------------------------------------------------------


def test_a_cordoned_node_takes_no_new_pods_and_leaves_capacity():
    clock = FakeClock()
    sim = SimCluster(SimConfig(nodes=2, node=NODE), clock=clock)
    sim.create_attempt(1, 1, job(cpu="8"))  # fills node-0
    sim.set_node("node-0", schedulable=False)
    report = sim.capacity()
    assert report.allocatable == NODE
    assert report.free == {"cpu": 8 * CPU, "memory": 32 * GIB, "nvidia.com/gpu": 2000}  # node-0's pod: nowhere
    assert report.largest_free_node == NODE
    sim.set_node("node-1", schedulable=False)
    sim.create_attempt(2, 1, job(cpu="1"))
    assert {p.name: p.node for p in sim.pods()} == {"1-1-worker-0": "node-0", "2-1-worker-0": None}
    report = sim.capacity()
    assert report.allocatable == {"cpu": 0, "memory": 0, "nvidia.com/gpu": 0}
    assert report.free == {"cpu": -CPU, "memory": -GIB, "nvidia.com/gpu": 0}  # the pending pod counts
    assert report.largest_free_node == {"cpu": 0, "memory": 0, "nvidia.com/gpu": 0}
    assert one(exposition(sim), "kube_node_spec_unschedulable", node="node-1") == 1
    assert capacity_from_series(exposition(sim)) == capacity_by_label(sim)
    sim.set_node("node-1")  # uncordoned: the waiting pod binds at once
    assert {p.name: p.node for p in sim.pods()}["2-1-worker-0"] == "node-1"
    assert sim.capacity().free["cpu"] == 7 * CPU
    assert sim.max_overcommit == {}


def test_a_node_that_is_not_ready_takes_no_new_pods_and_leaves_capacity():
    clock = FakeClock()
    sim = SimCluster(SimConfig(nodes=2, node=NODE), clock=clock)
    sim.set_node("node-0", ready=False)
    sim.create_attempt(1, 1, job(pods=2, cpu="4"))
    assert [p.node for p in sim.pods()] == ["node-1", "node-1"]
    report = sim.capacity()
    assert report.allocatable["cpu"] == 8 * CPU and report.free["cpu"] == 0
    assert report.largest_free_node["cpu"] == 0
    sim.create_attempt(2, 1, job(cpu="1"))
    assert sim.pods()[-1].node is None
    sim.set_node("node-0", ready=True)
    assert sim.pods()[-1].node == "node-0"
    assert capacity_from_series(exposition(sim)) == capacity_by_label(sim)


def test_pods_on_an_unusable_node_keep_running():
    clock = FakeClock()
    sim = SimCluster(SimConfig(nodes=1, node=NODE), clock=clock)
    sim.create_attempt(1, 1, job(cpu="1", duration="10s"))
    sim.set_node("node-0", schedulable=False, ready=False)
    assert [p.phase for p in sim.pods()] == ["Running"]
    clock.now += 20
    assert [s.state for s in sim.inventory()] == ["SUCCEEDED"]


@pytest.mark.parametrize("name", ["node-2", "node-01", "node--1", "node-", "node-²", "n-0", ""])
def test_set_node_refuses_an_unknown_node(name):
    sim = SimCluster(SimConfig(nodes=2, node=NODE), clock=FakeClock())
    with pytest.raises(KeyError):
        sim.set_node(name, schedulable=False)


# -- agreement under a random workload ----------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_series_agree_with_capacity_under_a_random_workload(seed):
    rng = random.Random(seed)
    clock = FakeClock()
    sim = SimCluster(SimConfig(nodes=4, node=NODE), clock=clock)
    usable = {f"node-{index}": True for index in range(4)}
    created: list[int] = []
    for step in range(150):
        running_before = {p.name for p in sim.pods() if p.phase == "Running"}
        action = rng.random()
        if action < 0.35:
            sim.create_attempt(step, 1, job(pods=rng.randint(1, 4), cpu=rng.choice(["500m", "1", "2", "4", "8"]),
                                            gpu=rng.choice([None, "0", "1", "2"]),
                                            duration=f"{rng.randint(0, 30)}s", exit_code=rng.choice("000002"),
                                            helper=(rng.randint(0, 1), "1", f"{rng.randint(0, 10)}s")))
            created.append(step)
        elif action < 0.45 and created:
            sim.delete_attempt(rng.choice(created), 1)
        elif action < 0.6:
            name = f"node-{rng.randrange(4)}"
            schedulable, ready = rng.random() < 0.6, rng.random() < 0.7
            sim.set_node(name, schedulable=schedulable, ready=ready)
            usable[name] = schedulable and ready
        else:
            clock.now += rng.uniform(0, 5)
        samples = exposition(sim)
        assert capacity_from_series(samples) == capacity_by_label(sim), f"step {step}"
        newly_running = [p for p in sim.pods() if p.phase == "Running" and p.name not in running_before]
        assert all(usable[p.node] for p in newly_running), f"step {step}: bound to an unusable node"
        assert sim.max_overcommit == {}
    for name in usable:
        sim.set_node(name)
    clock.now += 100_000
    for _ in range(20):
        clock.now += 100
        sim.capacity()
    assert sim.capacity().free == sim.capacity().allocatable == {name: 4 * amount for name, amount in NODE.items()}
    assert sim.duplicates == 0
