"""Issue 24, defect 4: the simulated cluster starts a gang like a co-scheduler, every pod at once or none,
holding nothing while they do not all fit; after the kubernetes backend's gang start timeout the attempt is
UNSCHEDULABLE with the same reason, its pods deleted. Driven through the Backend interface on a fake clock."""
from __future__ import annotations

from agent.backends.base import PENDING, RUNNING, SUCCEEDED, UNSCHEDULABLE
from agent.backends.kubernetes import status as kube_status
from agent.backends.sim.cluster import SimCluster, SimConfig
from sluice.objects import DEFAULT_GANG_START_TIMEOUT_S
from tests.unit.test_sim import CPU, NODE, FakeClock, Recorder, job


def kubernetes_reason(gang: int, waiting: str, message: str, timeout_s: float) -> str:
    """What the kubernetes backend (status.evaluate) reports for a gang of Pending pods at its timeout, with
    the scheduler's message on the pod `waiting`."""
    def pod(name: str) -> dict:
        condition = {"type": "PodScheduled", "status": "False", "message": message} if name == waiting else {}
        return {"metadata": {"name": name, "annotations": {"sluice.io/gang-size": str(gang),
                                                           "sluice.io/created-at": "2026-01-01T00:00:00.000000Z"}},
                "status": {"phase": "Pending", "conditions": [condition] if condition else []}}
    pods = [pod(f"1-1-worker-{i}") for i in range(gang)]
    begun = kube_status.created_at(pods)
    return kube_status.evaluate(pods, [], now=begun + timeout_s, gang_timeout_s=timeout_s, pull_grace_s=60.0).reason


def states(cluster: SimCluster) -> dict[int, str]:
    return {s.job_id: s.state for s in cluster.inventory()}


def test_a_gang_binds_no_pod_until_all_fit_then_all_at_once():
    clock = FakeClock()
    cluster = SimCluster(SimConfig(nodes=2, node=NODE), clock=clock)
    cluster.create_attempt(1, 1, job(pods=1, cpu="4", duration="20s"))  # fills node-0
    cluster.create_attempt(2, 1, job(pods=2, cpu="4", duration="40s"))  # needs both nodes
    assert {p.name: p.node for p in cluster.pods() if p.job_id == 2} == {"2-1-worker-0": None, "2-1-worker-1": None}
    assert cluster.capacity().node_free[1]["cpu"] == 4 * CPU  # the waiting gang holds nothing
    cluster.create_attempt(3, 1, job(pods=1, cpu="2", duration="10s"))  # nor does it block what fits
    assert {p.name: p.node for p in cluster.pods() if p.job_id == 3} == {"3-1-worker-0": "node-1"}
    clock.now += 20  # job 1 and job 3 have ended: both nodes are free, the gang starts whole
    assert states(cluster) == {1: SUCCEEDED, 2: RUNNING, 3: SUCCEEDED}
    assert sorted(p.node for p in cluster.pods()) == ["node-0", "node-1"]
    clock.now += 40
    rec = Recorder()
    cluster.start(rec)
    rec.wait_for(2, SUCCEEDED)
    cluster.stop()
    assert rec.states(2) == [PENDING, RUNNING, SUCCEEDED]


def test_a_gang_that_never_fits_is_unschedulable_after_the_kubernetes_gang_start_timeout():
    clock = FakeClock()
    assert SimConfig(nodes=1, node=NODE).gang_start_timeout == DEFAULT_GANG_START_TIMEOUT_S
    cluster = SimCluster(SimConfig(nodes=2, node=NODE, gang_start_timeout=120.0), clock=clock)
    cluster.create_attempt(1, 1, job(pods=3, cpu="3", duration="10s"))  # one pod per node: two fit
    clock.now += 119
    assert states(cluster) == {1: PENDING} and all(p.node is None for p in cluster.pods())
    clock.now += 1
    [status] = cluster.inventory()
    assert status.state == UNSCHEDULABLE and status.exit_code == 0
    assert status.reason == ("the gang did not start within 2m: 0 of 3 pods running; "
                             "pod 1-1-worker-2: 0/2 nodes are available: 2 Insufficient cpu.")
    assert status.reason == kubernetes_reason(3, "1-1-worker-2", "0/2 nodes are available: 2 Insufficient cpu.", 120.0)
    assert cluster.pods() == [] and cluster.capacity().free == cluster.capacity().allocatable


def test_a_gang_that_starts_before_the_timeout_is_not_given_up_and_the_timeout_scales_with_time():
    clock = FakeClock()
    cluster = SimCluster(SimConfig(nodes=2, node=NODE, gang_start_timeout=300.0, time_scale=0.1), clock=clock)
    cluster.create_attempt(1, 1, job(pods=1, cpu="4", duration="200s"))  # 20 s of clock
    cluster.create_attempt(2, 1, job(pods=2, cpu="4", duration="100s"))
    clock.now += 20
    assert states(cluster) == {1: SUCCEEDED, 2: RUNNING}
    clock.now += 15  # past the scaled timeout (30 s): it started in time
    assert states(cluster) == {1: SUCCEEDED, 2: SUCCEEDED}
    cluster.create_attempt(3, 1, job(pods=3, cpu="4", duration="1s"))
    clock.now += 30
    [status] = [s for s in cluster.inventory() if s.job_id == 3]
    # The reason quotes the timeout unscaled, as maxRuntime's does.
    assert status.state == UNSCHEDULABLE and status.reason.startswith("the gang did not start within 5m: ")


def test_an_unschedulable_gang_is_in_the_ledger_as_ended(tmp_path):
    clock = FakeClock()
    ledger = tmp_path / "sim.ledger"
    cluster = SimCluster(SimConfig(nodes=1, node=NODE, gang_start_timeout=60.0, ledger_path=ledger), clock=clock)
    cluster.create_attempt(1, 1, job(pods=2, cpu="3"))
    clock.now += 60
    assert states(cluster) == {1: UNSCHEDULABLE}
    assert "ended 1 1 UNSCHEDULABLE 0 " in ledger.read_text()
    restored = SimCluster(SimConfig(nodes=1, node=NODE, ledger_path=ledger), clock=clock)
    assert states(restored) == {1: UNSCHEDULABLE}


def test_pods_are_kept_off_the_nodes_a_dispatch_names_and_wait_if_only_those_have_room():
    clock = FakeClock()
    cluster = SimCluster(SimConfig(nodes=3, node=NODE), clock=clock)
    # First fit would take node-0; the dispatcher holds node-0 and node-1 for another job.
    cluster.create_attempt(1, 1, job(pods=2, cpu="2", duration="20s"), ("node-0", "node-1"))
    assert {p.node for p in cluster.pods() if p.job_id == 1} == {"node-2"}
    # Only the named nodes have room left for a 4-cpu pod: it waits, holding nothing, until node-2 frees.
    cluster.create_attempt(2, 1, job(pods=1, cpu="4", duration="10s"), ("node-0", "node-1"))
    assert states(cluster)[2] == PENDING and cluster.capacity().node_free[0]["cpu"] == 4 * CPU
    # A name the cluster never had is no node; the others are kept off as before.
    cluster.create_attempt(3, 1, job(pods=1, cpu="1", duration="10s"), ("node-9", "gpu node", "node-0"))
    assert {p.node for p in cluster.pods() if p.job_id == 3} == {"node-1"}
    clock.now += 20  # job 1 ended: node-2 is free, and job 2 starts there
    assert states(cluster)[2] == RUNNING
    assert {p.node for p in cluster.pods() if p.job_id == 2} == {"node-2"}
