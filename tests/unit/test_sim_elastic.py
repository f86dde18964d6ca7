"""Elastic simulated clusters: scale-up after a provisioning delay, idle added nodes removed after a cool-down.

Everything runs in virtual time on a fake clock; no test sleeps.
"""
from __future__ import annotations

import random
import threading

import pytest

from agent.backends.base import FAILED, PENDING, RUNNING, SUCCEEDED, UNSCHEDULABLE, AttemptStatus
from agent.backends.sim.cluster import SimCluster, SimConfig
from sluice.packing import nodes_to_request
from tests.unit.test_sim_metrics import (
    capacity_by_label,
    capacity_from_series,
    exposition,
)

CPU = 1000  # milli-units per core
GIB = 2**30 * 1000
NODE = {"cpu": 4 * CPU, "memory": 16 * GIB}
START = 1_000_000.0


class FakeClock:
    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def at(self, seconds: float) -> None:
        """Move to START + seconds."""
        self.now = START + seconds


def job(pods: int = 1, cpu: str = "1", duration: str = "10s", gpu: str | None = None) -> dict:
    limits = {} if gpu is None else {"nvidia.com/gpu": gpu}
    return {"spec": {"queue": "default", "podSets": [{"name": "worker", "count": pods, "template": {
        "metadata": {"annotations": {"sluice.io/sim-duration": duration}},
        "spec": {"containers": [{"name": "main", "image": "img", "resources": {
            "requests": {"cpu": cpu, "memory": "1Gi"}, "limits": limits}}]}}}]}}


@pytest.fixture
def elastic():
    """Makes elastic clusters on a fake clock; checks the sim's invariants after the test."""
    clusters: list[SimCluster] = []

    def make(clock: FakeClock, nodes: int = 0, max_nodes: int = 3, delay: float = 30.0,
             cool_down: float = 60.0, **kwargs) -> SimCluster:
        config = SimConfig(nodes=nodes, node=NODE, max_nodes=max_nodes, provisioning_delay=delay,
                           scale_down_after=cool_down, **kwargs)
        cluster = SimCluster(config, clock=clock)
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        assert cluster.max_overcommit == {}
        assert cluster.duplicates == 0


def states(cluster: SimCluster) -> dict[int, str]:
    return {s.job_id: s.state for s in cluster.inventory()}


def node_names(cluster: SimCluster) -> list[str]:
    return [node.name for node in cluster.view().nodes]


def placed(cluster: SimCluster) -> dict[str, str | None]:
    return {pod.name: pod.node for pod in cluster.pods()}


# -- scale-up -------------------------------------------------------------------------------------


def test_a_zero_node_cluster_gets_nodes_after_exactly_the_delay_and_runs_the_job(elastic):
    clock = FakeClock()
    cluster = elastic(clock, nodes=0, max_nodes=3, delay=30)
    assert (cluster.node_count, cluster.provisioning) == (0, 0)
    cluster.create_attempt(1, 1, job(pods=2, cpu="3", duration="10s"))  # 3 cpu each: one node per pod
    assert (cluster.node_count, cluster.provisioning) == (0, 2)
    clock.at(29.999)
    assert states(cluster) == {1: PENDING}
    assert placed(cluster) == {"1-1-worker-0": None, "1-1-worker-1": None}
    assert (cluster.node_count, cluster.provisioning) == (0, 2)
    clock.at(30)
    assert (cluster.node_count, cluster.provisioning) == (2, 0)
    assert placed(cluster) == {"1-1-worker-0": "node-0", "1-1-worker-1": "node-1"}
    (running,) = cluster.inventory()
    assert (running.state, running.at) == (RUNNING, START + 30)
    clock.at(40)
    (done,) = cluster.inventory()
    assert (done.state, done.at) == (SUCCEEDED, START + 40)
    delivered: list[AttemptStatus] = []
    done = threading.Event()

    def on_status(status: AttemptStatus) -> None:
        delivered.append(status)
        if status.state == SUCCEEDED:
            done.set()

    cluster.start(on_status)  # the queued changes, in order, each once
    try:
        assert done.wait(3.0)
    finally:
        cluster.stop()
    assert [(s.state, s.at - START) for s in delivered] == [(PENDING, 0), (RUNNING, 30), (SUCCEEDED, 40)]


def test_the_delay_is_scaled_by_time_scale(elastic):
    clock = FakeClock()
    cluster = elastic(clock, nodes=0, delay=30, time_scale=0.5)
    cluster.create_attempt(1, 1, job(duration="10s"))
    clock.at(14.999)
    assert states(cluster) == {1: PENDING}
    clock.at(15)
    assert states(cluster) == {1: RUNNING}
    clock.at(20)
    assert states(cluster) == {1: SUCCEEDED}


def test_a_zero_delay_node_is_there_at_the_next_look(elastic):
    clock = FakeClock()
    cluster = elastic(clock, nodes=0, delay=0)
    cluster.create_attempt(1, 1, job())
    assert placed(cluster) == {"1-1-worker-0": "node-0"}
    assert (cluster.node_count, cluster.provisioning) == (1, 0)


def test_provisioning_nodes_count_as_room_so_nodes_are_never_asked_twice(elastic):
    clock = FakeClock()
    cluster = elastic(clock, nodes=0, max_nodes=10, delay=30)
    cluster.create_attempt(1, 1, job(cpu="1"))
    assert cluster.provisioning == 1
    clock.at(5)
    cluster.create_attempt(2, 1, job(cpu="2"))  # fits beside job 1 on the node on its way
    assert cluster.provisioning == 1
    cluster.create_attempt(3, 1, job(cpu="2"))  # does not: one more node
    assert cluster.provisioning == 2
    clock.at(30)  # the first node joins (the second joins at 35)
    assert placed(cluster) == {"1-1-worker-0": "node-0", "2-1-worker-0": "node-0", "3-1-worker-0": None}
    assert (cluster.node_count, cluster.provisioning) == (1, 1)
    clock.at(35)
    assert placed(cluster)["3-1-worker-0"] == "node-1"
    assert (cluster.node_count, cluster.provisioning) == (2, 0)


def test_scale_up_never_exceeds_max_nodes_and_a_job_too_big_waits_pending(elastic):
    clock = FakeClock()
    cluster = elastic(clock, nodes=1, max_nodes=3, delay=30)
    cluster.create_attempt(1, 1, job(pods=4, cpu="4", duration="100s"))  # wants 4 whole nodes
    # A gang starts whole or not at all (issue 24): 3 nodes at most never hold it, so none is asked for.
    assert placed(cluster)["1-1-worker-0"] is None
    assert (cluster.node_count, cluster.provisioning) == (1, 0)
    cluster.create_attempt(2, 1, job(pods=3, cpu="4", duration="100s"))  # fits at the maximum: 2 more
    assert (cluster.node_count, cluster.provisioning) == (1, 2)
    for moment in (30, 60, 99):
        clock.at(moment)
        assert states(cluster) == {1: PENDING, 2: RUNNING}
        assert (cluster.node_count, cluster.provisioning) == (3, 0)
    assert node_names(cluster) == ["node-0", "node-1", "node-2"]


def test_a_pod_bigger_than_a_node_never_triggers_scale_up(elastic):
    clock = FakeClock()
    cluster = elastic(clock, nodes=0, max_nodes=5, delay=30)
    cluster.create_attempt(1, 1, job(cpu="5"))  # more cpu than a node has
    cluster.create_attempt(2, 1, job(cpu="1", gpu="1"))  # a resource the node shape lacks
    assert (cluster.node_count, cluster.provisioning) == (0, 0)
    cluster.create_attempt(3, 1, job(cpu="1", duration="10s"))  # the only one a node can hold
    assert cluster.provisioning == 1
    clock.at(40)
    assert (cluster.node_count, cluster.provisioning) == (1, 0)
    assert states(cluster) == {1: PENDING, 2: PENDING, 3: SUCCEEDED}
    clock.at(299)  # the added node went idle at 40 and is gone; the waiting pods still ask for nothing
    assert (cluster.node_count, cluster.provisioning) == (0, 0)
    assert states(cluster) == {1: PENDING, 2: PENDING, 3: SUCCEEDED}
    clock.at(300)  # the gang start timeout (issue 24): given up, as on kubernetes, and still no node asked
    assert states(cluster) == {1: UNSCHEDULABLE, 2: UNSCHEDULABLE, 3: SUCCEEDED}
    assert (cluster.node_count, cluster.provisioning) == (0, 0)


def test_nodes_to_request_packs_first_fit_onto_provisioning_then_fresh_nodes():
    node = {"cpu": 4 * CPU}
    cpu = [{"cpu": amount * CPU} for amount in (3, 2, 1, 2, 5)]  # 5 never fits
    assert nodes_to_request(cpu, node, provisioning=0, room=10) == 2  # [3, 1] [2, 2]
    assert nodes_to_request(cpu, node, provisioning=1, room=10) == 1
    assert nodes_to_request(cpu, node, provisioning=2, room=10) == 0
    assert nodes_to_request(cpu, node, provisioning=0, room=1) == 1  # capped; the 1-cpu still fits
    assert nodes_to_request(cpu, node, provisioning=0, room=0) == 0
    assert nodes_to_request([{}], node, provisioning=0, room=1) == 1
    assert nodes_to_request([], node, provisioning=0, room=5) == 0


# -- scale-down -----------------------------------------------------------------------------------


def test_idle_added_nodes_are_removed_after_the_cool_down_never_below_the_start(elastic):
    clock = FakeClock()
    cluster = elastic(clock, nodes=1, max_nodes=3, delay=10, cool_down=60)
    cluster.create_attempt(1, 1, job(pods=3, cpu="4", duration="20s"))
    clock.at(10)
    assert node_names(cluster) == ["node-0", "node-1", "node-2"]
    clock.at(30)  # the job ends: node-1 and node-2 are idle from now
    assert states(cluster) == {1: SUCCEEDED}
    clock.at(89.999)
    assert cluster.node_count == 3
    clock.at(90)
    assert node_names(cluster) == ["node-0"]
    assert cluster.capacity().allocatable == NODE
    clock.at(100_000)
    assert node_names(cluster) == ["node-0"]  # the starting node stays, idle or not
    # names are never reused
    cluster.create_attempt(2, 1, job(pods=2, cpu="4", duration="20s"))
    assert cluster.provisioning == 1
    clock.at(100_010)
    assert node_names(cluster) == ["node-0", "node-3"]
    assert sorted(placed(cluster).values()) == ["node-0", "node-3"]


def test_a_pod_during_the_cool_down_restarts_it_and_a_zero_start_scales_to_zero(elastic):
    clock = FakeClock()
    cluster = elastic(clock, nodes=0, max_nodes=1, delay=0, cool_down=60)
    cluster.create_attempt(1, 1, job(duration="10s"))
    assert placed(cluster) == {"1-1-worker-0": "node-0"}
    clock.at(50)  # idle since 10
    cluster.create_attempt(2, 1, job(duration="20s"))
    assert placed(cluster) == {"2-1-worker-0": "node-0"}
    clock.at(70)  # the first cool-down would have ended here; job 2 ended here too: a new one starts
    assert states(cluster) == {1: SUCCEEDED, 2: SUCCEEDED}
    assert cluster.node_count == 1
    clock.at(129.999)
    assert cluster.node_count == 1
    clock.at(130)
    assert (cluster.node_count, cluster.provisioning) == (0, 0)
    report = cluster.capacity()
    assert report.allocatable == {"cpu": 0, "memory": 0}
    assert report.free == report.largest_free_node == {"cpu": 0, "memory": 0}


def test_a_busy_added_node_is_never_removed(elastic):
    clock = FakeClock()
    cluster = elastic(clock, nodes=0, max_nodes=1, delay=0, cool_down=60)
    cluster.create_attempt(1, 1, job(duration="1h"))
    cluster.set_node("node-0", ready=False)  # unusable, yet its pod keeps running
    clock.at(3599)
    assert cluster.node_count == 1
    assert placed(cluster) == {"1-1-worker-0": "node-0"}


# -- capacity, view and set_node while nodes come and go -----------------------------------------


def test_capacity_and_view_during_provisioning(elastic):
    clock = FakeClock()
    cluster = elastic(clock, nodes=1, max_nodes=2, delay=30)
    cluster.create_attempt(1, 1, job(pods=2, cpu="4", duration="60s"))
    assert cluster.provisioning == 1
    report = cluster.capacity()
    assert report.allocatable == NODE  # the node on its way counts nowhere
    assert report.free == {"cpu": -4 * CPU, "memory": 14 * GIB}
    assert report.largest_free_node == {"cpu": 4 * CPU, "memory": 16 * GIB}  # the gang waits whole
    view = cluster.view()
    assert [node.name for node in view.nodes] == ["node-0"]
    assert [(pod.phase, pod.node) for pod in view.pods] == [("Pending", None), ("Pending", None)]
    with pytest.raises(KeyError):
        cluster.set_node("node-1", schedulable=False)  # not there yet
    clock.at(30)
    report = cluster.capacity()
    assert report.allocatable == {"cpu": 8 * CPU, "memory": 32 * GIB}
    assert report.free == {"cpu": 0, "memory": 30 * GIB}
    view = cluster.view()
    assert [(node.name, node.usable) for node in view.nodes] == [("node-0", True), ("node-1", True)]
    assert [(pod.phase, pod.node) for pod in view.pods] == [("Running", "node-0"), ("Running", "node-1")]
    cluster.set_node("node-1", schedulable=False)
    assert cluster.capacity().allocatable == NODE
    clock.at(150)  # the job ended at 90; node-1 was idle from then
    assert node_names(cluster) == ["node-0"]
    with pytest.raises(KeyError):
        cluster.set_node("node-1")  # removed


def test_a_zero_node_cluster_reports_the_shape_as_zero_and_pending_pods_as_negative(elastic):
    clock = FakeClock()
    cluster = elastic(clock, nodes=0, max_nodes=1, delay=30)
    cluster.create_attempt(1, 1, job(pods=2, cpu="1"))
    report = cluster.capacity()
    assert report.allocatable == {"cpu": 0, "memory": 0}
    assert report.free == {"cpu": -2 * CPU, "memory": -2 * GIB}
    assert report.largest_free_node == {"cpu": 0, "memory": 0}
    assert cluster.view().nodes == ()


def test_a_restarted_elastic_cluster_starts_at_its_configured_size(elastic, tmp_path):
    clock = FakeClock()
    ledger = tmp_path / "ledger"
    first = elastic(clock, nodes=1, max_nodes=3, delay=0, ledger_path=ledger)
    first.create_attempt(1, 1, job(pods=3, cpu="4", duration="1h"))
    assert first.node_count == 3
    second = elastic(clock, nodes=1, max_nodes=3, delay=0, ledger_path=ledger)
    assert (second.node_count, second.provisioning) == (1, 0)
    assert second.create_attempt(1, 1, job()) is False


# -- configuration --------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"nodes": 3, "max_nodes": 2}, r"max_nodes must be at least nodes \(3\)"),
    ({"nodes": 0, "max_nodes": 0}, r"max_nodes must be at least nodes \(0\) and at least 1"),
    ({"nodes": 0}, r"nodes must be at least 1 unless the cluster is elastic"),
    ({"nodes": -1, "max_nodes": 2}, r"nodes must be at least 0"),
    ({"nodes": 1, "max_nodes": 2, "provisioning_delay": -1.0}, r"provisioning_delay must be at least 0"),
    ({"nodes": 1, "max_nodes": 2, "scale_down_after": -1.0}, r"scale_down_after must be at least 0"),
])
def test_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SimConfig(node=NODE, **kwargs)


def test_config_defaults_are_not_elastic():
    config = SimConfig(nodes=2, node=NODE)
    assert (config.max_nodes, config.provisioning_delay, config.scale_down_after) == (None, 0.0, 60.0)
    assert SimConfig(nodes=0, node=NODE, max_nodes=1).nodes == 0
    clock = FakeClock()
    fixed = SimCluster(config, clock=clock)
    fixed.create_attempt(1, 1, job(pods=3, cpu="4"))
    assert (fixed.node_count, fixed.provisioning) == (2, 0)


# -- exported metrics -----------------------------------------------------------------------------


def exported_nodes(cluster: SimCluster) -> dict[str, bool]:
    """Node -> Ready, from the kube-state-metrics exposition alone."""
    return {labels["node"]: value == 1 for labels, value in exposition(cluster)["kube_node_status_condition"]
            if labels["status"] == "true"}


def agrees_with_the_series(cluster: SimCluster) -> bool:
    """capacity() equals what a PromQL reader computes from the series. With no node the series carry
    no node shape, so the shape's zeros are left out of that comparison."""
    from_series, report = capacity_from_series(exposition(cluster)), capacity_by_label(cluster)
    if not cluster.view().nodes:
        report = {part: {name: amount for name, amount in amounts.items() if amount}
                  for part, amounts in report.items()}
    return from_series == report


def test_metrics_show_an_added_node_only_once_ready_and_drop_it_when_removed(elastic):
    clock = FakeClock()
    cluster = elastic(clock, nodes=1, max_nodes=2, delay=30, cool_down=60)
    cluster.create_attempt(1, 1, job(pods=2, cpu="4", duration="100s"))
    assert cluster.provisioning == 1
    assert exported_nodes(cluster) == {"node-0": True}
    clock.at(29.999)
    assert exported_nodes(cluster) == {"node-0": True}
    assert agrees_with_the_series(cluster)
    clock.at(30)
    assert exported_nodes(cluster) == {"node-0": True, "node-1": True}
    assert agrees_with_the_series(cluster)
    clock.at(130 + 59.999)  # the pod on node-1 ended at 130
    assert exported_nodes(cluster) == {"node-0": True, "node-1": True}
    clock.at(190)
    assert exported_nodes(cluster) == {"node-0": True}
    assert all(labels["node"] == "node-0" for labels, _ in exposition(cluster)["kube_node_status_allocatable"])
    assert agrees_with_the_series(cluster)


def test_metrics_of_a_zero_node_cluster(elastic):
    clock = FakeClock()
    cluster = elastic(clock, nodes=0, max_nodes=1, delay=30)
    cluster.create_attempt(1, 1, job())
    samples = exposition(cluster)
    assert samples["kube_node_status_allocatable"] == []
    assert [labels["node"] for labels, _ in samples["kube_pod_info"]] == [""]
    assert agrees_with_the_series(cluster)


# -- invariants -----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_random_workload_stays_within_bounds_and_agrees_with_the_series(elastic, seed):
    rng = random.Random(seed)
    clock = FakeClock()
    start_nodes, max_nodes = rng.choice([(0, 4), (1, 3), (2, 6)])
    cluster = elastic(clock, nodes=start_nodes, max_nodes=max_nodes, delay=rng.choice([0, 5, 30]),
                      cool_down=rng.choice([0, 20, 60]))
    created = []
    for step in range(300):
        action = rng.random()
        if action < 0.35:
            cluster.create_attempt(step, 1, job(pods=rng.randint(1, 5), cpu=str(rng.choice([1, 2, 4, 5])),
                                                duration=f"{rng.randint(0, 40)}s"))
            created.append(step)
        elif action < 0.45 and created:
            cluster.delete_attempt(rng.choice(created), 1)
        else:
            clock.now += rng.uniform(0, 10)
        assert start_nodes <= cluster.node_count <= cluster.node_count + cluster.provisioning <= max_nodes
        assert cluster.max_overcommit == {}
        if step % 10 == 0:  # a scrape and its parse are slow; every tenth step is plenty
            assert agrees_with_the_series(cluster)
    for job_id, state in states(cluster).items():  # some never fit a node, or max_nodes: give up on them
        if state == PENDING:
            cluster.delete_attempt(job_id, 1)
    clock.now += 100_000
    assert all(state in (SUCCEEDED, FAILED) for state in states(cluster).values())
    clock.now += 100_000
    assert (cluster.node_count, cluster.provisioning) == (start_nodes, 0)
    assert node_names(cluster) == [f"node-{index}" for index in range(start_nodes)]
