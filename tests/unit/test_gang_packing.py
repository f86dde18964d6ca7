"""Issue 24, defect 3: a gang goes only where first-fit decreasing packs every pod onto the nodes' free
capacity at once (ClusterState.node_free, QueuedJob.pods); the reason says so, `take` takes the pods off
the nodes they were packed onto, and a one-pod job or a cluster without per-node figures is judged as before."""
from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

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
from sluice.packing import expand, first_fit, first_fit_decreasing, gang_nodes_to_request

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


# -- equal pods: the search goes on from the node the one before took --------------------------------------

def _plain_first_fit_decreasing(requests, free_per_node, kept_off=frozenset()):
    """The definition, every pod searching from the first node: what the shortcut must decide alike."""
    names = sorted({name for request in requests for name in request})
    free, slots = list(free_per_node), [None] * len(requests)
    for index in sorted(range(len(requests)), key=lambda i: tuple(-requests[i].get(n, 0) for n in names)):
        for node, room in enumerate(free):
            if node not in kept_off and all(a <= 0 or a <= room.get(r, 0) for r, a in requests[index].items()):
                free[node] = {r: room.get(r, 0) - requests[index].get(r, 0) for r in room.keys() | requests[index]}
                slots[index] = node
                break
    return free, slots


def _plain_nodes_to_request(gangs, node, provisioning, room, free_now=()):
    nodes, added = [dict(f) for f in free_now] + [dict(node) for _ in range(provisioning)], 0
    for gang in gangs:
        trial, trial_added = list(nodes), added
        for request in gang:
            slot = next((i for i, f in enumerate(trial) if all(a <= 0 or a <= f.get(r, 0) for r, a in request.items())),
                        None)
            if slot is None:
                if trial_added >= room or not all(a <= 0 or a <= node.get(r, 0) for r, a in request.items()):
                    break
                trial.append(dict(node))
                trial_added, slot = trial_added + 1, len(trial) - 1
            trial[slot] = {r: trial[slot].get(r, 0) - request.get(r, 0) for r in trial[slot].keys() | request}
        else:
            nodes, added = trial, trial_added
    return added


_REQUEST = st.fixed_dictionaries({"cpu": st.sampled_from([0, 1, 2, 3, 5, 8])},
                                 optional={"gpu": st.sampled_from([0, 1, 4, 8]), "mem": st.sampled_from([1, 2, 16])})
_NODE = st.fixed_dictionaries({"cpu": st.integers(0, 10)},
                              optional={"gpu": st.integers(0, 8), "mem": st.integers(0, 20)})
_POD_SETS = st.lists(st.tuples(st.integers(1, 5), _REQUEST), max_size=5)


@settings(max_examples=300, deadline=None, database=None)
@given(pods=_POD_SETS, nodes=st.lists(_NODE, max_size=8),
       kept_off=st.frozensets(st.integers(0, 7), max_size=3))
def test_first_fit_decreasing_decides_as_every_pod_searching_from_the_first_node(pods, nodes, kept_off):
    requests = expand(pods)  # equal pods side by side, as a gang's pod sets give them
    free, slots = first_fit_decreasing(requests, nodes, kept_off)
    plain_free, plain_slots = _plain_first_fit_decreasing(requests, nodes, kept_off)
    assert slots == plain_slots
    assert [{r: a for r, a in f.items() if a} for f in free] == [{r: a for r, a in f.items() if a} for f in plain_free]


@settings(max_examples=300, deadline=None, database=None)
@given(gangs=st.lists(st.one_of(_POD_SETS.map(expand), st.lists(_REQUEST, max_size=6)), max_size=4),
       node=_NODE, provisioning=st.integers(0, 3), room=st.integers(0, 6), free_now=st.lists(_NODE, max_size=4))
def test_nodes_asked_for_are_those_every_pod_searching_from_the_first_node_needs(gangs, node, provisioning, room,
                                                                                   free_now):
    assert gang_nodes_to_request(gangs, node, provisioning, room, free_now) == \
        _plain_nodes_to_request(gangs, node, provisioning, room, free_now)


def test_a_gang_of_thousands_of_equal_pods_packs_onto_as_many_nodes():
    # 71,288 GPUs in pods of 8 (a line of a fuzzed Philly trace, on the machine the built mapping makes for it):
    # with every pod searching from the first node, this is some 40 million checks.
    pods = expand([(8911, {"gpu": 8}), (1, {"gpu": 0})])
    free, slots = first_fit_decreasing(pods, [{"gpu": 8}] * 8911)
    assert slots == list(range(8911)) + [0] and all(f == {"gpu": 0} for f in free)
    assert gang_nodes_to_request([pods], {"gpu": 8}, 0, 9000) == 8911
