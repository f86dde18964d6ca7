"""Issue 24, defect 3: a gang goes only where first-fit decreasing packs every pod onto the nodes' free
capacity at once (ClusterState.node_free, QueuedJob.pods); the reason says so, `take` takes the pods off
the nodes they were packed onto, and a one-pod job or a cluster without per-node figures is judged as before."""
from __future__ import annotations

from dataclasses import replace

from dispatcher.policy.placing import (
    Clusters,
    ClusterState,
    Place,
    QueuedJob,
    Wait,
    decide,
    plan,
    start_delay,
    take,
    verdicts,
    why_not,
)
from sluice.packing import expand, first_fit, first_fit_decreasing

CPU = 1000


def nodes_cluster(name: str, *node_cpus: int, tier: str = "onprem") -> ClusterState:
    nodes = tuple({"cpu": n * CPU} for n in node_cpus)
    return ClusterState(name, tier, "dc1", {}, {"cpu": sum(node_cpus) * CPU}, {"cpu": max(node_cpus) * CPU},
                        node_free=nodes)


def gang(job_id: int, count: int, cpu: int) -> QueuedJob:
    return QueuedJob(job_id, {"cpu": count * cpu * CPU}, {"cpu": cpu * CPU}, pods=((count, {"cpu": cpu * CPU}),))


def test_first_fit_decreasing_places_the_largest_pods_first():
    free, placed = first_fit_decreasing(expand([(2, {"cpu": 2}), (1, {"cpu": 6})]), [{"cpu": 6}, {"cpu": 4}])
    assert placed == [1, 1, 0] and free == [{"cpu": 0}, {"cpu": 0}]
    free, placed = first_fit_decreasing(expand([(3, {"cpu": 5})]), [{"cpu": 8}, {"cpu": 8}])
    assert placed == [0, 1, None] and free == [{"cpu": 3}, {"cpu": 3}]


def test_three_pods_of_5_cpu_wait_on_two_nodes_of_8_and_go_where_they_pack():
    tight = nodes_cluster("a-tight", 8, 8)  # 16 free, largest node 8: the aggregate checks pass
    roomy = nodes_cluster("b-roomy", 5, 5, 5, 1)
    job = gang(1, 3, 5)
    assert why_not(job, tight) == "needs 3 pods of 5 cpu at once, only 2 fit on its nodes"
    assert why_not(job, roomy) is None
    assert decide(job, {"a-tight": tight}) == Wait(1, "no cluster fits: a-tight: needs 3 pods of 5 cpu at once, "
                                                      "only 2 fit on its nodes")
    assert plan([job], [tight, roomy]) == [Place(1, "b-roomy")]
    assert Clusters([tight, roomy]).best(job) == Place(1, "b-roomy")
    assert dict(verdicts(job, [tight, roomy]))["a-tight"] == "needs 3 pods of 5 cpu at once, only 2 fit on its nodes"


def test_a_gang_that_packs_fits_and_a_one_pod_job_is_judged_as_before():
    two = nodes_cluster("c", 8, 8)
    assert why_not(gang(1, 2, 5), two) is None  # one pod per node
    assert why_not(gang(2, 3, 2), two) is None  # the whole gang on one node
    one = QueuedJob(3, {"cpu": 8 * CPU}, {"cpu": 8 * CPU})  # no pods given: one pod
    assert why_not(one, two) is None
    unknown = replace(two, node_free=())  # no per-node figures: the aggregate checks alone
    assert why_not(gang(4, 3, 5), unknown) is None


def test_take_takes_the_gang_off_the_nodes_it_was_packed_onto():
    cluster = nodes_cluster("d", 8, 8, 5)
    after = take(cluster, {"cpu": 15 * CPU}, ((3, {"cpu": 5 * CPU}),))
    assert after.node_free == ({"cpu": 3 * CPU}, {"cpu": 3 * CPU}, {"cpu": 0})
    assert after.free == {"cpu": 6 * CPU}
    assert why_not(gang(5, 2, 3), after) is None and why_not(gang(6, 3, 3), after) is not None
    single = take(cluster, {"cpu": 6 * CPU})  # one pod: first fit
    assert single.node_free == ({"cpu": 2 * CPU}, {"cpu": 8 * CPU}, {"cpu": 5 * CPU})


def test_after_a_take_the_largest_free_node_is_what_the_nodes_have_left():
    # Two whole free nodes of 8 and 8 free cpu scattered: a second 8-cpu pod no longer fits after the first.
    cluster = nodes_cluster("g", 8, 2, 2, 2, 2)
    one_pod = QueuedJob(1, {"cpu": 8 * CPU}, {"cpu": 8 * CPU})
    after = take(cluster, one_pod.requests)
    assert after.largest_free_node == {"cpu": 2 * CPU} and after.free == {"cpu": 8 * CPU}
    second = QueuedJob(2, {"cpu": 8 * CPU}, {"cpu": 8 * CPU})
    assert why_not(second, after) == "needs 8 cpu on one node, 2 free on its largest node"
    unknown = take(replace(cluster, node_free=()), one_pod.requests)  # no per-node figures: capped by what is left
    assert unknown.largest_free_node == {"cpu": 8 * CPU}


def test_the_same_cycle_sees_what_an_earlier_gang_took():
    cluster = nodes_cluster("e", 8, 8, 8)
    state = Clusters([cluster])
    first, second = gang(1, 3, 5), gang(2, 3, 5)
    assert state.best(first) == Place(1, "e")
    state["e"] = take(state["e"], first.requests, first.pods)
    assert state.best(second) == Wait(2, "no cluster fits: e: needs 15 cpu, 9 free")
    small = gang(3, 3, 3)  # 9 cpu left, 3 on each node: packs
    assert state.best(small) == Place(3, "e")
    state["e"] = take(state["e"], small.requests, small.pods)
    assert state["e"].node_free == ({"cpu": 0},) * 3


def test_an_elastic_cluster_takes_a_gang_that_packs_only_with_new_nodes_after_its_delay():
    elastic = replace(nodes_cluster("f", 8, 8), headroom={"cpu": 16 * CPU}, node_shape={"cpu": 8 * CPU},
                      provisioning_delay_s=90.0)
    job = gang(1, 3, 5)
    assert why_not(job, elastic) is None
    assert start_delay(job, elastic) == 90.0 and start_delay(gang(2, 2, 5), elastic) == 0.0
    full = replace(elastic, headroom={})
    assert why_not(job, full) == "needs 3 pods of 5 cpu at once, only 2 fit on its nodes"


def test_the_simulated_cluster_reports_each_usable_nodes_free_capacity():
    from agent.backends.sim.cluster import SimCluster, SimConfig
    sim = SimCluster(SimConfig(nodes=2, node={"cpu": 8 * CPU}), clock=lambda: 0.0)
    pod = {"containers": [{"name": "m", "image": "x", "resources": {"requests": {"cpu": "5"}}}],
           "restartPolicy": "Never"}
    sim.create_attempt(1, 1, {"spec": {"podSets": [{"name": "w", "count": 1, "template": {"spec": pod}}]}})
    assert sim.capacity().node_free == ({"cpu": 3 * CPU}, {"cpu": 8 * CPU})
    sim.set_node("node-1", schedulable=False)
    assert sim.capacity().node_free == ({"cpu": 3 * CPU},)


def test_two_gangs_of_one_total_and_largest_pod_but_other_pods_are_each_decided_on_their_own():
    """A cycle repeats a wait for a head of the same shape without deciding again; pods are part of that
    shape, though the cycle's reads share the requests and largest-pod dicts of both jobs."""
    from dispatcher.policy.planning import plan_cycle
    from dispatcher.policy.plans import Candidate, ClassPolicy
    from dispatcher.policy.quotas import QueueQuota

    total, largest = {"cpu": 16 * CPU}, {"cpu": 8 * CPU}  # shared, as heads_from_rows shares them
    two_of_8 = QueuedJob(1, total, largest, pods=((2, {"cpu": 8 * CPU}),))
    one_of_8_two_of_4 = QueuedJob(2, total, largest, pods=((1, {"cpu": 8 * CPU}), (2, {"cpu": 4 * CPU})))
    cluster = replace(nodes_cluster("c", 8, 4, 4), allocatable={"cpu": 16 * CPU})
    heads = {"q": [Candidate(two_of_8, "q", "batch", 0, 0), Candidate(one_of_8_two_of_4, "q", "batch", 0, 0)]}
    plan = plan_cycle(heads, [], [cluster], [QueueQuota("q", None, {}, {}, 1.0)], {"batch": ClassPolicy("batch")},
                      {}, 0.0)
    assert plan.places == [Place(2, "c")]
    assert "only 1 fit on its nodes" in plan.waits[1]


def test_no_pod_is_packed_onto_a_node_kept_off():
    nodes = [{"cpu": 4000}, {"cpu": 4000}, {"cpu": 1000}]
    assert first_fit({"cpu": 1000}, nodes, kept_off={0}) == 1
    assert first_fit({"cpu": 1000}, nodes, kept_off={0, 1}) == 2
    assert first_fit({"cpu": 2000}, nodes, kept_off={0, 1}) is None
    after, slots = first_fit_decreasing([{"cpu": 1000}, {"cpu": 4000}], nodes, kept_off={1})
    assert slots == [2, 0] and after == [{"cpu": 0}, {"cpu": 4000}, {"cpu": 0}]
