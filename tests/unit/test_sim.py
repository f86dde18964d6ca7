"""The simulated cluster backend: states, gang waiting, placement, capacity, ledger, invariants."""
from __future__ import annotations

import random
import threading
import time

import pytest

from agent.backends.base import FAILED, LOST, PENDING, RUNNING, SUCCEEDED, UNSCHEDULABLE, AttemptStatus, pod_requests
from agent.backends.sim.cluster import SimCluster, SimConfig
from agent.backends.sim.ledger import ledger_duplicates
from sluice.packing import first_fit

CPU = 1000  # milli-units per core
NODE = {"cpu": 4 * CPU, "memory": 16 * 2**30 * 1000}
SCALE = 0.01  # "1s" in a spec runs for 10 ms
WAIT = 3.0  # seconds a test waits for a status before failing


def job(pods: int = 1, cpu: str = "1", duration: str = "1s", exit_code: str = "0",
        max_runtime: str | None = None, **pod_sets: tuple) -> dict:
    """A Sluice job document; extra pod sets as name=(count, cpu, duration, exit_code)."""
    sets = {"worker": (pods, cpu, duration, exit_code), **pod_sets}
    spec: dict = {"queue": "default", "podSets": [
        {"name": name, "count": count, "template": {
            "metadata": {"annotations": {"sluice.io/sim-duration": dur, "sluice.io/sim-exit-code": code}},
            "spec": {"containers": [{"name": "main", "image": "img",
                                     "resources": {"requests": {"cpu": c, "memory": "1Gi"}}}]}}}
        for name, (count, c, dur, code) in sets.items()]}
    if max_runtime is not None:
        spec["maxRuntime"] = max_runtime
    return {"apiVersion": "sluice.io/v1", "kind": "Job", "metadata": {"name": "x", "labels": {}}, "spec": spec}


class Recorder:
    """Collects statuses and lets a test wait for a given state of a given attempt."""

    def __init__(self) -> None:
        self.statuses: list[AttemptStatus] = []
        self._cond = threading.Condition()

    def __call__(self, status: AttemptStatus) -> None:
        with self._cond:
            self.statuses.append(status)
            self._cond.notify_all()

    def states(self, job_id: int, attempt: int = 1) -> list[str]:
        with self._cond:
            return [s.state for s in self.statuses if (s.job_id, s.attempt) == (job_id, attempt)]

    def wait_for(self, job_id: int, state: str, attempt: int = 1, timeout: float = WAIT) -> AttemptStatus:
        def found() -> AttemptStatus | None:
            return next((s for s in self.statuses
                         if (s.job_id, s.attempt, s.state) == (job_id, attempt, state)), None)
        with self._cond:
            assert self._cond.wait_for(found, timeout), f"job {job_id} never reached {state}: {self.statuses}"
            return found()


@pytest.fixture
def sim():
    clusters: list[SimCluster] = []

    def make(nodes: int = 2, node: dict | None = None, **kwargs) -> tuple[SimCluster, Recorder]:
        cluster = SimCluster(SimConfig(nodes=nodes, node=node or NODE, time_scale=SCALE, **kwargs))
        recorder = Recorder()
        cluster.start(recorder)
        clusters.append(cluster)
        return cluster, recorder

    yield make
    for cluster in clusters:
        cluster.stop()
        assert cluster.max_overcommit == {}
        assert cluster.duplicates == 0


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- states ---------------------------------------------------------------------------------------


def test_states_pending_running_succeeded(sim):
    cluster, rec = sim()
    assert cluster.create_attempt(1, 1, job(pods=3, duration="5s")) is True
    done = rec.wait_for(1, SUCCEEDED)
    assert rec.states(1) == [PENDING, RUNNING, SUCCEEDED]
    assert done.exit_code == 0
    assert cluster.pods_created == 3
    assert [s.state for s in cluster.inventory()] == [SUCCEEDED]


def test_failure_reports_exit_code_and_reason_and_frees_the_gang(sim):
    cluster, rec = sim()
    spec = job(pods=2, duration="50s", failing=(1, "1", "2s", "3"))
    cluster.create_attempt(12, 1, spec)
    failed = rec.wait_for(12, FAILED)
    assert failed.exit_code == 3
    assert failed.reason == "pod 12-1-failing-0 exited with code 3"
    assert rec.states(12) == [PENDING, RUNNING, FAILED]
    # the still-running workers were deleted with the attempt
    assert cluster.capacity().free == cluster.capacity().allocatable
    assert cluster.pods() == []


def test_gang_waits_for_capacity_and_is_never_running_early(sim):
    cluster, rec = sim(nodes=2)
    cluster.create_attempt(1, 1, job(pods=1, cpu="4", duration="20s"))  # fills node-0
    rec.wait_for(1, RUNNING)
    cluster.create_attempt(2, 1, job(pods=2, cpu="4", duration="40s"))  # needs both nodes
    placed = {p.name: p.node for p in cluster.pods() if p.job_id == 2}
    assert placed == {"2-1-worker-0": None, "2-1-worker-1": None}  # all at once or none (issue 24)
    first_done = rec.wait_for(1, SUCCEEDED)
    running = rec.wait_for(2, RUNNING)
    assert running.at >= first_done.at
    rec.wait_for(2, SUCCEEDED)
    assert rec.states(2) == [PENDING, RUNNING, SUCCEEDED]


def test_a_gang_whose_small_pod_would_fit_early_still_starts_whole():
    clock = FakeClock()
    cluster = SimCluster(SimConfig(nodes=1, node=NODE), clock=clock)
    rec = Recorder()
    cluster.create_attempt(1, 1, job(pods=1, cpu="3", duration="30s"))  # leaves 1 cpu free
    # the quick pod would fit the free core, but it waits with the 3-cpu one for job 1 (issue 24)
    cluster.create_attempt(2, 1, job(pods=1, cpu="1", duration="1s", big=(1, "3", "1s", "0")))
    clock.now += 5
    assert {s.job_id: s.state for s in cluster.inventory()} == {1: RUNNING, 2: PENDING}
    clock.now += 30
    assert {s.job_id: s.state for s in cluster.inventory()} == {1: SUCCEEDED, 2: SUCCEEDED}
    cluster.start(rec)  # queued changes are delivered once started
    rec.wait_for(2, SUCCEEDED)
    cluster.stop()
    assert rec.states(1) == [PENDING, RUNNING, SUCCEEDED]
    assert rec.states(2) == [PENDING, RUNNING, SUCCEEDED]


# -- placement and capacity ---------------------------------------------------------------------


def test_first_fit_placement_and_largest_free_node(sim):
    cluster, rec = sim(nodes=3)
    cluster.create_attempt(1, 1, job(pods=2, cpu="3", duration="60s"))
    assert [p.node for p in cluster.pods()] == ["node-0", "node-1"]
    assert cluster.capacity().largest_free_node["cpu"] == 4 * CPU
    cluster.create_attempt(2, 1, job(pods=1, cpu="1", duration="60s"))  # back on node-0
    cluster.create_attempt(3, 1, job(pods=1, cpu="2", duration="60s"))  # node-0 and -1 too full
    nodes = {p.name: p.node for p in cluster.pods()}
    assert nodes["2-1-worker-0"] == "node-0"
    assert nodes["3-1-worker-0"] == "node-2"
    report = cluster.capacity()
    assert report.largest_free_node["cpu"] == 2 * CPU
    assert report.largest_free_node["memory"] == NODE["memory"] - 2**30 * 1000


def test_first_fit_function():
    free = [{"cpu": 1000}, {"cpu": 3000}, {"cpu": 4000}]
    assert first_fit({"cpu": 2000}, free) == 1
    assert first_fit({"cpu": 5000}, free) is None
    assert first_fit({"nvidia.com/gpu": 1000}, free) is None
    assert first_fit({}, free) == 0


def test_capacity_counts_pending_pods(sim):
    cluster, rec = sim(nodes=2)
    cluster.create_attempt(1, 1, job(pods=3, cpu="4", duration="60s"))  # one pod cannot bind: none does
    report = cluster.capacity()
    assert report.allocatable == {"cpu": 8 * CPU, "memory": 2 * NODE["memory"]}
    assert report.free["cpu"] == 8 * CPU - 12 * CPU
    assert report.free["memory"] == 2 * NODE["memory"] - 3 * 2**30 * 1000
    assert report.largest_free_node["cpu"] == 4 * CPU
    assert [p.node for p in cluster.pods()] == [None, None, None]
    assert rec.states(1) in ([], [PENDING])


def test_a_running_attempt_says_what_its_pods_hold_on_each_node_the_capacity_names(sim):
    cluster, rec = sim(nodes=2)
    cluster.create_attempt(1, 1, job(pods=3, cpu="2", duration="60s"))  # 2 + 2 on node-0, 2 on node-1
    running = rec.wait_for(1, RUNNING)
    assert {node: held["cpu"] for node, held in running.nodes} == {"node-0": 4 * CPU, "node-1": 2 * CPU}
    assert running.nodes == cluster.inventory()[0].nodes
    report = cluster.capacity()
    assert report.node_names == ("node-0", "node-1") and [n["cpu"] for n in report.node_free] == [0, 2 * CPU]


def test_pod_requests_rules():
    spec = {
        "initContainers": [{"resources": {"requests": {"cpu": "6"}}},
                           {"resources": {"limits": {"memory": "1Gi"}}}],
        "containers": [{"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "3", "memory": "2Gi"}}},
                       {"resources": {"requests": {"cpu": "500m"}}},
                       {"name": "no-resources"}],
    }
    assert pod_requests(spec) == {"cpu": 6000, "memory": 2 * 2**30 * 1000}
    assert pod_requests(None) == {}
    assert pod_requests({"containers": "nonsense"}) == {}
    assert pod_requests({"containers": [{"resources": {"requests": {"cpu": "lots"}}}]}) == {"cpu": 0}


# -- idempotence and deletion -------------------------------------------------------------------


def test_create_is_idempotent(sim):
    cluster, rec = sim()
    assert cluster.create_attempt(5, 1, job(pods=2, duration="60s")) is True
    assert cluster.create_attempt(5, 1, job(pods=2, duration="60s")) is False
    assert cluster.pods_created == 2
    cluster.delete_attempt(5, 1)
    assert cluster.create_attempt(5, 1, job(pods=2)) is False  # "existed" counts too
    assert cluster.create_attempt(5, 2, job(pods=2, duration="60s")) is True
    assert cluster.pods_created == 4
    assert cluster.duplicates == 0


def test_delete_frees_capacity_and_stops_reports(sim):
    cluster, rec = sim(nodes=1)
    cluster.create_attempt(1, 1, job(pods=1, cpu="4", duration="30s"))
    cluster.create_attempt(2, 1, job(pods=1, cpu="4", duration="1s"))
    rec.wait_for(1, RUNNING)
    cluster.delete_attempt(1, 1)
    assert 1 not in {s.job_id for s in cluster.inventory()}
    rec.wait_for(2, SUCCEEDED)  # bound as soon as job 1's capacity was freed
    assert cluster.capacity().free == cluster.capacity().allocatable
    time.sleep(0.05)
    assert rec.states(1) == [PENDING, RUNNING]
    cluster.delete_attempt(1, 1)  # absent: no error
    cluster.delete_attempt(99, 1)


def test_delete_of_a_final_attempt_keeps_its_record(sim):
    cluster, rec = sim()
    cluster.create_attempt(1, 1, job())
    rec.wait_for(1, SUCCEEDED)
    cluster.delete_attempt(1, 1)
    assert [(s.job_id, s.state) for s in cluster.inventory()] == [(1, SUCCEEDED)]


def test_max_runtime_fails_the_attempt(sim):
    cluster, rec = sim()
    cluster.create_attempt(1, 1, job(pods=2, duration="10m", max_runtime="5s"))
    failed = rec.wait_for(1, FAILED)
    assert failed.reason == "exceeded maxRuntime 5s"
    assert rec.states(1) == [PENDING, RUNNING, FAILED]
    assert cluster.capacity().free == cluster.capacity().allocatable
    cluster.create_attempt(2, 1, job(duration="1s", max_runtime="5s"))  # shorter than the limit
    rec.wait_for(2, SUCCEEDED)


# -- virtual time -------------------------------------------------------------------------------


def test_final_attempts_stay_in_inventory_for_ten_minutes():
    clock = FakeClock()
    cluster = SimCluster(SimConfig(nodes=1, node=NODE), clock=clock)  # never started: pure virtual time
    cluster.create_attempt(1, 1, job(duration="30s"))
    clock.now += 10
    assert [s.state for s in cluster.inventory()] == [RUNNING]
    clock.now += 20
    (status,) = cluster.inventory()
    assert (status.state, status.at) == (SUCCEEDED, 1_000_030.0)
    clock.now += 599
    assert len(cluster.inventory()) == 1
    clock.now += 1
    assert cluster.inventory() == []
    assert cluster.create_attempt(1, 1, job()) is False


def test_events_apply_at_their_own_deadline():
    clock = FakeClock()
    cluster = SimCluster(SimConfig(nodes=1, node=NODE), clock=clock)
    cluster.create_attempt(1, 1, job(cpu="4", duration="10s"))
    cluster.create_attempt(2, 1, job(cpu="4", duration="10s"))
    clock.now += 25  # job 1 ends at +10, job 2 binds then and ends at +20
    states = {s.job_id: (s.state, s.at - 1_000_000.0) for s in cluster.inventory()}
    assert states == {1: (SUCCEEDED, 10.0), 2: (SUCCEEDED, 20.0)}


def test_array_elements_pods_logs_show_their_environment_and_running_attempts_an_address():
    clock = FakeClock()
    cluster = SimCluster(SimConfig(nodes=1, node=NODE, name="onprem-a"), clock=clock)
    element = job(pods=2, duration="30s")
    element["spec"].update(arrayId=40, arrayIndex=3)
    element["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["ports"] = [{"containerPort": 8888}]
    cluster.create_attempt(43, 1, element)
    cluster.create_attempt(44, 1, job(cpu="1", duration="30s"))
    first = [line for pod, line in cluster.logs(43, 1) if pod == "43-1-worker-1"]
    assert first[0].split(" ", 1)[1] == "environment: SLUICE_ARRAY_ID=40 SLUICE_ARRAY_INDEX=3"
    assert first[1].endswith("created; waiting for a node")
    assert not any("environment" in line for _, line in cluster.logs(44, 1))  # no array element: nothing added
    clock.now += 1
    running = {s.job_id: s for s in cluster.inventory()}
    assert (running[43].state, running[43].address) == (RUNNING, "43-1-worker-0.onprem-a.sim:8888")
    assert running[44].address == "44-1-worker-0.onprem-a.sim"  # no port declared
    clock.now += 30
    assert {s.address for s in cluster.inventory()} == {""}  # ended: an address is for a running attempt


# -- ledger -------------------------------------------------------------------------------------


def test_ledger_restore(tmp_path):
    ledger = tmp_path / "ledger"
    clock = FakeClock()
    first = SimCluster(SimConfig(nodes=2, node=NODE, ledger_path=ledger), clock=clock)
    first.create_attempt(1, 1, job(pods=2, duration="10s"))
    first.create_attempt(2, 1, job(pods=1, duration="1h"))
    first.create_attempt(3, 1, job(pods=1, duration="5s", exit_code="7"))
    first.create_attempt(4, 1, job(pods=1, duration="1h"))
    first.delete_attempt(4, 1)
    clock.now += 20
    assert {s.job_id: s.state for s in first.inventory()} == {1: SUCCEEDED, 2: RUNNING, 3: FAILED}
    # the process dies here, and a new one starts a minute later, reading what the old one recorded
    clock.now += 60
    second = SimCluster(SimConfig(nodes=2, node=NODE, ledger_path=ledger), clock=clock)
    restored = {s.job_id: s for s in second.inventory()}
    assert {job_id: s.state for job_id, s in restored.items()} == {1: SUCCEEDED, 2: LOST, 3: FAILED}
    # Ended attempts keep the time they ended (their charge); the lost one was lost at the restart.
    assert {job_id: s.at - 1_000_000.0 for job_id, s in restored.items()} == {1: 10.0, 2: 80.0, 3: 5.0}
    assert restored[2].reason == "simulated cluster restarted; its pods are gone"
    assert restored[3].exit_code == 7
    for job_id in (1, 2, 3, 4):
        assert second.create_attempt(job_id, 1, job()) is False
    assert second.pods_created == 0
    assert second.create_attempt(2, 2, job()) is True
    assert second.duplicates == 0
    assert ledger_duplicates(ledger) == 0
    lines = ledger.read_text().splitlines()
    assert "created 1 1 1-1-worker-0" in lines
    assert "ended 3 1 FAILED 7 1000005.0" in lines
    # A ledger of an older sim has no end times: its attempts ended when it was read.
    ledger.write_text("created 5 1 5-1-worker-0\nended 5 1 SUCCEEDED 0\n")
    third = SimCluster(SimConfig(nodes=2, node=NODE, ledger_path=ledger), clock=clock)
    assert [(s.state, s.at - 1_000_000.0) for s in third.inventory()] == [(SUCCEEDED, 80.0)]


def test_ledger_duplicates_counts_pod_names_created_twice(tmp_path):
    ledger = tmp_path / "ledger"
    ledger.write_text("created 1 1 1-1-worker-0\ncreated 1 1 1-1-worker-1\nended 1 1 SUCCEEDED 0\n"
                      "created 1 1 1-1-worker-0\ncreated 1 1 1-1-worker-0\ncreated 2 1 2-1-w-0\ncreat")
    assert ledger_duplicates(ledger) == 1
    assert ledger_duplicates(tmp_path / "missing") == 0


# -- invariants ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_random_workload_never_overcommits(seed):
    rng = random.Random(seed)
    clock = FakeClock()
    node = {"cpu": 8 * CPU, "memory": 32 * 2**30 * 1000, "nvidia.com/gpu": 2 * 1000}
    cluster = SimCluster(SimConfig(nodes=4, node=node), clock=clock)
    rec = Recorder()
    cluster.start(rec)
    created = []
    try:
        for step in range(300):
            action = rng.random()
            if action < 0.4:
                job_id = step
                spec = job(pods=rng.randint(1, 6), cpu=str(rng.choice([1, 2, 4, 8])),
                           duration=f"{rng.randint(0, 30)}s", exit_code=rng.choice(["0"] * 5 + ["2"]),
                           max_runtime=rng.choice([None, None, "20s"]))
                spec["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]["limits"] = {
                    "nvidia.com/gpu": str(rng.choice([0, 0, 1, 2]))}
                assert cluster.create_attempt(job_id, 1, spec) is True
                created.append(job_id)
            elif action < 0.5 and created:
                cluster.delete_attempt(rng.choice(created), 1)
            else:
                clock.now += rng.uniform(0, 5)
            report = cluster.capacity()
            assert all(amount >= 0 for amount in report.largest_free_node.values())
            assert all(amount <= node[name] for name, amount in report.largest_free_node.items())
            assert cluster.max_overcommit == {}
        clock.now += 10_000  # let everything still bound finish; pending pods then bind and finish
        for _ in range(20):
            clock.now += 100
            cluster.capacity()
        assert all(s.state in (SUCCEEDED, FAILED, UNSCHEDULABLE) for s in cluster.inventory())
    finally:
        cluster.stop()
    assert cluster.max_overcommit == {}
    assert cluster.duplicates == 0
    assert cluster.capacity().free == cluster.capacity().allocatable
    for job_id in created:  # in order, each change once, nothing after a final state
        states = rec.states(job_id)
        assert states[:1] == [PENDING] or states == []
        assert len(states) == len(set(states))
        finals = [i for i, s in enumerate(states) if s in (SUCCEEDED, FAILED, UNSCHEDULABLE)]
        assert finals in ([], [len(states) - 1])


def test_on_status_may_call_back_into_the_cluster(sim):
    chain_done = threading.Event()
    cluster = SimCluster(SimConfig(nodes=1, node=NODE, time_scale=SCALE))

    def on_status(status: AttemptStatus) -> None:
        cluster.inventory()
        cluster.capacity()
        if status.state == SUCCEEDED and status.job_id < 5:
            assert cluster.create_attempt(status.job_id + 1, 1, job(duration="0.5s")) is True
            assert cluster.create_attempt(status.job_id, 1, job()) is False
        elif status.state == RUNNING and status.job_id == 5:
            cluster.delete_attempt(5, 1)
            chain_done.set()

    cluster.start(on_status)
    try:
        cluster.create_attempt(1, 1, job(duration="0.5s"))
        assert chain_done.wait(WAIT)
    finally:
        cluster.stop()
    assert cluster.pods_created == 5


def test_stop_ends_the_thread_and_start_twice_is_refused():
    cluster = SimCluster(SimConfig(nodes=1, node=NODE))
    cluster.start(lambda status: None)
    with pytest.raises(RuntimeError):
        cluster.start(lambda status: None)
    cluster.stop()
    assert not any(t.name == "sim-cluster" for t in threading.enumerate())
