"""Replays in virtual time (simulation/engine.py): the production cycle and the baselines on small traces
whose right answers can be worked out by hand."""
from __future__ import annotations

import math
import re
import time

import pytest

from dispatcher.scheduler.settings import SchedulerSettings
from simulation.engine import replay
from simulation.run import simulate
from simulation.scenario import ScenarioError, built_objects, scenario, sim_jobs
from simulation.traces import Trace, TraceJob, read_trace
from simulation.world import World
from sluice.objects import (
    BurstPolicyObject,
    ClusterObject,
    QueueObject,
    ServiceClassObject,
    SimulatedSpec,
    load_objects,
)
from tests.shared_traces import shared_trace

CPU = "cpu"


def job(i: int, submit: float, run: float, cpus: int, *, queue: str = "a", requested: float | None = None,
        pods: int = 1) -> TraceJob:
    return TraceJob(i, submit, run, requested, ((pods, {CPU: cpus * 1000 // pods}),), "u", queue, queue, "", f"j{i}")


def trace(*jobs: TraceJob, fmt: str = "philly", machine: int | None = None) -> Trace:
    ordered = tuple(sorted(jobs, key=lambda j: (j.submit_s, j.id)))
    return Trace("t", fmt, ordered, 0, 0, {CPU: machine * 1000} if machine else None, len(jobs))


def objects(*queues: str, cpus: int = 8, nodes: int = 1, reservation: float | None = 0.0, extra=()) -> list:
    return [ServiceClassObject("standard", priority=500, reservation_after_s=reservation),
            *(QueueObject(q) for q in queues),
            ClusterObject("c1", tier="onprem", site="s", simulated=SimulatedSpec(nodes, {CPU: cpus * 1000 // nodes})),
            *extra]


def starts(result, policy: str) -> dict[int, float]:
    return {o.id: o.start_s for o in result.outcomes[policy]}


def test_fifo_stops_at_the_first_job_that_does_not_fit_and_easy_backfills_around_it():
    t = trace(job(1, 0, 100, 6, requested=100), job(2, 1, 100, 7, requested=100),  # 2 waits for 1's end at 100
              job(3, 2, 50, 2, requested=50),  # fits now and ends (52) before 2's reservation (100): backfilled
              job(4, 60, 500, 2, requested=500))  # fits at 60 but would hold 2 cpu past 100, when 2 needs 7 of 8
    result = simulate(t, objects("a"), ["fifo", "easy-backfill", "sluice"])
    assert starts(result, "fifo") == {1: 0, 2: 100, 3: 200, 4: 200}
    assert starts(result, "easy-backfill") == {1: 0, 2: 100, 3: 2, 4: 200}
    # Sluice's reservation lets the short job use the reserved room, as EASY does.
    assert starts(result, "sluice") == starts(result, "easy-backfill")
    assert result.figures["sluice"]["reservations"] >= 1


def test_a_replay_of_weeks_takes_no_wall_time_to_speak_of():
    t = trace(*(job(i, i * 3600.0, 7 * 86400.0 if i % 2 else 60.0, 4, requested=8 * 86400.0) for i in range(1, 41)))
    started = time.perf_counter()
    result = simulate(t, objects("a"), ["sluice"])
    assert time.perf_counter() - started < 10  # nothing sleeps: virtual weeks cost what the decisions cost
    assert result.figures["sluice"]["makespanSeconds"] > 14 * 86400


def test_fair_share_starts_the_queue_that_uses_less():
    # Queue a floods first; b's job comes later but starts before a's queued ones once room frees.
    t = trace(*(job(i, 0, 100, 4, queue="a") for i in range(1, 5)), job(9, 10, 100, 4, queue="b"))
    result = simulate(t, objects("a", "b", reservation=None), ["sluice", "fifo"])
    assert starts(result, "sluice")[9] == 100 and starts(result, "fifo")[9] == 200


def test_a_gang_waits_until_its_pods_pack_onto_nodes():
    # Three nodes of 8 cpu; 5 cpu on one of them leaves 19 free, but only two 5-cpu pods fit until it ends.
    t = trace(job(1, 0, 100, 5, requested=100), job(2, 1, 10, 15, pods=3, requested=10))
    for policy in ("fifo", "easy-backfill", "sluice"):
        result = simulate(t, objects("a", cpus=24, nodes=3), [policy])
        assert starts(result, policy)[2] == 100, policy


def test_a_gang_that_never_packs_is_unrunnable():
    # The case: 3 pods x 5 cpu never fit 2 nodes x 8 cpu at once, though 15 < 16.
    result = simulate(trace(job(1, 0, 10, 15, pods=3)), objects("a", cpus=16, nodes=2), ["sluice"])
    assert result.figures["sluice"]["unrunnable"] == 1
    assert "do not pack" in next(iter(result.figures["sluice"]["unrunnableReasons"]))


def test_a_job_no_cluster_could_ever_hold_is_unrunnable_with_why():
    t = trace(job(1, 0, 10, 64), job(2, 0, 10, 2))
    result = simulate(t, objects("a"), ["sluice", "fifo"])
    for policy in ("sluice", "fifo"):
        figures = result.figures[policy]
        assert figures["unrunnable"] == 1 and figures["finished"] == 1
        (reason,) = figures["unrunnableReasons"]
        assert "c1" in reason


def critical_over_batch(checkpoint_s: float | None = None):
    """Four 2-cpu batch jobs fill an 8-cpu cluster from 0 for 1,000 s; a critical 4-cpu job arrives at 10."""
    config = [ServiceClassObject("critical", priority=1000, can_preempt=True),
              ServiceClassObject("batch", priority=100, preemptible=True),
              QueueObject("batch", service_classes=("batch",)), QueueObject("urgent", service_classes=("critical",)),
              ClusterObject("c1", tier="onprem", site="s", simulated=SimulatedSpec(1, {CPU: 8000}))]
    t = trace(*(job(i, 0, 1000, 2, queue="batch") for i in range(1, 5)), job(9, 10, 50, 4, queue="urgent"))
    return simulate(t, config, ["sluice"], checkpoint_s=checkpoint_s)


def test_preemption_in_a_replay_evicts_batch_work_for_a_critical_job():
    result = critical_over_batch()
    assert starts(result, "sluice")[9] == 10
    assert result.figures["sluice"]["preemptions"] == 2
    evicted = [o for o in result.outcomes["sluice"] if o.preemptions]
    assert len(evicted) == 2 and all(o.end_s >= 60 + 1000 for o in evicted)  # they ran again from the start


def test_an_evicted_job_that_checkpoints_resumes_from_its_last_checkpoint():
    result = critical_over_batch(checkpoint_s=4)
    assert result.trace["checkpointInterval"] == 4
    evicted = [o for o in result.outcomes["sluice"] if o.preemptions]
    assert len(evicted) == 2
    for o in evicted:  # 10 s ran, 8 s of it saved by checkpoints at 4 s and 8 s: 992 s left after the restart
        assert o.runs == ((0.0, 10.0), (60.0, 1052.0)) and o.end_s == 1052.0 and o.run_s == 1000
    kept = [o for o in result.outcomes["sluice"] if o.id in (1, 2, 3, 4) and not o.preemptions]
    assert all(o.runs == ((0.0, 1000.0),) for o in kept)


def test_a_built_gpu_pool_guarantees_each_queue_its_equal_part_in_whole_gpus():
    gpu = "nvidia.com/gpu"
    jobs = [TraceJob(i, 3600 * (i - 1), 3600, None, ((1, {gpu: 8000}),), "u", q, q, "", f"j{i}")
            for i, q in enumerate(("a", "b", "c"), start=1)]
    built = built_objects(trace(*jobs))
    cluster = next(o for o in built if isinstance(o, ClusterObject))
    pool = cluster.simulated.nodes * cluster.simulated.node[gpu]
    assert pool == 16000  # 8 GPUs busy over 2 h of 3 h on average, x 1.25 headroom: two 8-GPU nodes
    assert {o.name: o.guaranteed for o in built if isinstance(o, QueueObject)} == {
        q: {gpu: 5000} for q in ("a", "b", "c")}  # 16 / 3 GPUs, in whole GPUs
    swf = built_objects(trace(job(1, 0, 10, 4, queue="g1"), fmt="swf", machine=8))
    assert all(o.guaranteed == {} for o in swf if isinstance(o, QueueObject))


def test_a_gpu_pool_too_big_for_a_cluster_is_not_built_but_refused_in_words():
    # One row of 10^20 GPUs: the pool built for it would have taken the machine's memory.
    huge = TraceJob(1, 0, 60, None, ((1, {"nvidia.com/gpu": 10 ** 23}),), "u", "a", "a", "", "j1")
    with pytest.raises(ScenarioError, match=r"largest job asks for 1e\+20 GPUs.* more than the 10,000 nodes a "
                                            r"Cluster may have.*--config"):
        built_objects(trace(huge))


def test_on_philly_the_built_guarantees_hold_every_queue_near_its_share_hour_by_hour():
    # Philly's first 2,000 jobs, its jobs checkpointing every 30 minutes: the built mapping's guarantees
    # (equal parts of the pool) against the same queues with none. Measured: 0 of 683 (queue, hour)
    # windows short against 909 of 1,541, and a mean wait of 2h 04m against 5d 15h.
    trace = read_trace(shared_trace("philly-2017.csv"), window=(0, 2000))
    built = built_objects(trace)
    assert all(q.guaranteed for q in built if isinstance(q, QueueObject))
    guaranteed = simulate(trace, None, ["sluice"], checkpoint_s=1800).figures["sluice"]
    plain = [QueueObject(o.name) if isinstance(o, QueueObject) else o for o in built]
    unguaranteed = simulate(trace, plain, ["sluice"], checkpoint_s=1800).figures["sluice"]
    assert guaranteed["fairShareViolations"] <= 0.01 * guaranteed["fairShareJudged"]
    assert unguaranteed["fairShareViolations"] >= 0.3 * unguaranteed["fairShareJudged"]
    assert guaranteed["preemptions"] > 0 and unguaranteed["preemptions"] == 0
    assert guaranteed["meanWaitSeconds"] < unguaranteed["meanWaitSeconds"] / 10


def test_a_queue_below_its_guarantee_reclaims_a_whole_node_from_a_borrowers_small_jobs():
    # Two 8-cpu nodes: b's eight 2-cpu jobs fill them. a (guaranteed 8) submits one 8-cpu job: the replay's
    # cluster names its nodes as the sim agents do, so the four jobs on one node are evicted together and
    # a's job starts at once, not when b's jobs end.
    config = [ServiceClassObject("standard", priority=500),
              QueueObject("a", guaranteed={CPU: 8000}), QueueObject("b", guaranteed={CPU: 4000}),
              ClusterObject("c1", tier="onprem", site="s", simulated=SimulatedSpec(2, {CPU: 8000}))]
    t = trace(*(job(i, 0, 3600, 2, queue="b") for i in range(1, 9)), job(9, 60, 100, 8, queue="a"))
    result = simulate(t, config, ["sluice"])
    assert starts(result, "sluice")[9] == 60
    evicted = {o.id for o in result.outcomes["sluice"] if o.preemptions}
    assert len(evicted) == 4 and result.figures["sluice"]["preemptions"] == 4


def test_a_job_placed_while_room_is_held_is_kept_off_the_held_node_and_the_preemptor_starts():
    # node-0 holds b's eight 1-cpu jobs; node-1 b's 6-cpu job, c's 1-cpu job and 1 cpu free. At 60 a (below its
    # guarantee) asks for 8 cpus and b for 1: a evicts the eight on node-0 and holds it; b's job takes node-1's
    # free cpu. The cluster binds first fit, and would put b's job on node-0, freed first, so that a's job never
    # fits there and evicts again when its hold ends: it is told to keep off node-0.
    config = [ServiceClassObject("standard", priority=500),
              QueueObject("a", guaranteed={CPU: 8000}), QueueObject("b", guaranteed={CPU: 4000}),
              QueueObject("c", guaranteed={CPU: 1000}),
              ClusterObject("c1", tier="onprem", site="s", simulated=SimulatedSpec(2, {CPU: 8000}))]
    t = trace(*(job(i, 0, 3600, 1, queue="b") for i in range(1, 9)), job(9, 0, 3600, 6, queue="b"),
              job(10, 0, 3600, 1, queue="c"), job(11, 60, 100, 8, queue="a"), job(12, 60, 3600, 1, queue="b"))
    result = simulate(t, config, ["sluice"])
    assert starts(result, "sluice")[11] == 60 and starts(result, "sluice")[12] == 60
    assert result.figures["sluice"]["preemptions"] == 8


def test_burst_spends_on_the_paid_cluster_within_its_budget():
    config = [ServiceClassObject("standard", priority=500, burst_allowed=True),
              QueueObject("a"),
              ClusterObject("onprem", tier="onprem", site="s", simulated=SimulatedSpec(1, {CPU: 4000})),
              ClusterObject("cloud", tier="cloud", site="k", price={CPU: 1.0},
                            simulated=SimulatedSpec(1, {CPU: 4000})),
              BurstPolicyObject("burst", cluster_selector={"tier": "cloud"}, budget_per_day=100.0)]
    t = trace(job(1, 0, 3600, 4), job(2, 1, 3600, 4))
    result = simulate(t, config, ["sluice", "fifo"])
    sluice = {o.id: o for o in result.outcomes["sluice"]}
    assert sluice[2].cluster == "cloud" and sluice[2].start_s == 1
    assert result.figures["sluice"]["burstSpend"] == pytest.approx(4.0)  # 4 cpu x 1 h x 1.0
    assert starts(result, "fifo")[2] == 3600  # the baselines know no burst policy


def test_an_elastic_cloud_cluster_grows_for_the_bursts_and_shrinks_when_they_end():
    # As `sluice up` runs it with sim agents: the cloud starts empty, asks for the nodes a burst needs, which
    # join 2 minutes later, and gives each back after 10 idle minutes.
    cloud = ClusterObject("cloud", tier="cloud", site="k", price={CPU: 1.0}, simulated=SimulatedSpec(0, {CPU: 4000}),
                          elastic={"maxNodes": 2, "provisioningDelay": 120.0, "scaleDownAfter": 600.0,
                                   "node": {CPU: 4000}})
    config = [ServiceClassObject("standard", priority=500, burst_allowed=True),
              QueueObject("a"),
              ClusterObject("onprem", tier="onprem", site="s", simulated=SimulatedSpec(1, {CPU: 4000})),
              cloud, BurstPolicyObject("burst", cluster_selector={"tier": "cloud"}, budget_per_day=100.0)]
    # 2 and 3 burst at once; 4 comes when both new nodes are busy and the cloud is at its most: it waits for
    # onprem; 5 comes after 3 ended and before its node leaves: it starts there at once.
    t = trace(job(1, 0, 3600, 4), job(2, 1, 600, 4), job(3, 2, 900, 4), job(4, 300, 60, 4), job(5, 1100, 60, 4))
    result = simulate(t, config, ["sluice", "fifo"])
    sluice = {o.id: o for o in result.outcomes["sluice"]}
    assert {i: (o.cluster, o.start_s) for i, o in sluice.items()} == {
        1: ("onprem", 0), 2: ("cloud", 121), 3: ("cloud", 122), 4: ("cloud", 721), 5: ("cloud", 1100)}
    busy = dict(result.replays["sluice"].busy)
    assert busy[121] == {CPU: 8000} and busy[122] == {CPU: 12000}  # the cloud's nodes count in what is busy
    assert result.figures["sluice"]["burstSpend"] == pytest.approx(4 * (600 + 900 + 60 + 60) / 3600)
    assert starts(result, "fifo")[2] == 3600  # the baselines use no paid cluster


def test_an_elastic_clusters_added_node_leaves_after_its_idle_time_and_its_room_is_headroom_again():
    cloud = ClusterObject("cloud", tier="cloud", site="k", price={CPU: 1.0}, simulated=SimulatedSpec(0, {CPU: 4000}),
                          elastic={"maxNodes": 2, "provisioningDelay": 120.0, "scaleDownAfter": 600.0,
                                   "node": {CPU: 4000}})
    world = World([cloud], {}, 0.0)
    one, two = sim_jobs(trace(job(1, 0, 100, 4), job(2, 0, 100, 4)), scenario(trace(), [cloud, QueueObject("a")]))
    for j in (one, two):
        world.enqueue(j)
    assert world.dispatch(one, "cloud", 0) is False and world.next_change() == 120  # a node is asked for
    assert world.clusters["cloud"].capacity().state.headroom == {CPU: 8000}  # one on its way is still headroom
    assert world.change(120) and world.take_started() == [one]
    assert world.clusters["cloud"].capacity().state.headroom == {CPU: 4000}
    world.stop(one, 220, requeue=False)
    assert world.next_change() == 820
    assert world.dispatch(two, "cloud", 500) is True  # the idle node takes it: its cool-down is off
    assert world.next_change() == math.inf
    world.stop(two, 600, requeue=False)
    assert world.next_change() == 1200 and world.change(1200)
    state = world.clusters["cloud"].capacity().state
    assert (state.allocatable, state.free, state.headroom, state.node_free) == ({CPU: 0}, {CPU: 0}, {CPU: 8000}, ())


def test_utilization_counts_an_elastic_clusters_nodes_while_they_are_there():
    # Its only GPUs are on a cloud with no node to begin with: the replay failed on a capacity of 0 GPUs.
    gpu = "nvidia.com/gpu"
    config = [ServiceClassObject("standard", priority=500, burst_allowed=True), QueueObject("a"),
              ClusterObject("onprem", tier="onprem", site="s", simulated=SimulatedSpec(1, {CPU: 4000})),
              ClusterObject("cloud", tier="cloud", site="k", price={gpu: 2.5}, simulated=SimulatedSpec(0, {gpu: 8000}),
                            elastic={"maxNodes": 4, "provisioningDelay": 300.0, "scaleDownAfter": 600.0,
                                     "node": {gpu: 8000}}),
              BurstPolicyObject("burst", cluster_selector={"tier": "cloud"}, budget_per_day=1000.0)]
    jobs = [TraceJob(i, at, 3600, None, ((gpus // 8, {gpu: 8000}),), "u", "a", "a", "", f"j{i}")
            for i, at, gpus in ((1, 0, 8), (2, 10, 16))]
    result = simulate(trace(*jobs), config, ["sluice"])
    figures = result.figures["sluice"]
    assert starts(result, "sluice") == {1: 300, 2: 310}  # each waits for its nodes
    assert result.scenario.capacity == {CPU: 4000, gpu: 32000}  # shares are of the clusters at their most
    assert result.trace["clusters"]["cloud"] == {"nodes": 0, "node": {gpu: "8"}, "maxNodes": 4}
    # 8 GPUs from 300 s, 24 from 310 s to the last end (3,910 s); busy the same but for 10 s of 8 GPUs.
    assert figures["utilizationResource"] == gpu
    assert figures["utilization"] == pytest.approx((8 * 3600 + 16 * 3600) / (8 * 10 + 24 * 3600))
    assert figures["burstSpend"] == pytest.approx(2.5 * 24)


def test_the_baselines_grow_an_elastic_pool_as_the_dispatcher_does():
    # A pool with no node to begin with: the baselines left every job unstarted ("nothing it waited for came").
    grows = ClusterObject("pool", tier="onprem", site="s", simulated=SimulatedSpec(0, {CPU: 8000}),
                          elastic={"maxNodes": 2, "provisioningDelay": 300.0, "scaleDownAfter": 600.0,
                                   "node": {CPU: 8000}})
    config = [ServiceClassObject("standard", priority=500), QueueObject("a"), grows]
    t = trace(job(1, 0, 3600, 8), job(2, 10, 3600, 8), job(3, 20, 60, 8))  # 3 waits for a node to be free
    result = simulate(t, config, ["sluice", "fifo", "easy-backfill"])
    for policy in ("sluice", "fifo", "easy-backfill"):
        assert starts(result, policy) == {1: 300, 2: 310, 3: 3900}, policy


def test_a_job_too_big_for_a_cluster_now_runs_where_its_growth_holds_it():
    grows = ClusterObject("c1", tier="onprem", site="s", simulated=SimulatedSpec(1, {CPU: 4000}),
                          elastic={"maxNodes": 3, "provisioningDelay": 60.0, "scaleDownAfter": 600.0,
                                   "node": {CPU: 4000}})
    config = [ServiceClassObject("standard", priority=500), QueueObject("a"), grows]
    result = simulate(trace(job(1, 0, 100, 12, pods=3), job(2, 0, 100, 16, pods=4)), config, ["sluice"])
    sluice = {o.id: o for o in result.outcomes["sluice"]}
    assert sluice[1].start_s == 60 and sluice[1].unrunnable is None
    assert sluice[2].unrunnable == "needs {'cpu': 16000}: c1 has {'cpu': 12000} in all"


def test_the_built_mapping_has_one_cluster_of_the_machine_size_and_a_queue_per_group():
    t = trace(job(1, 0, 10, 4, queue="g1"), job(2, 0, 10, 4, queue="g2"), fmt="swf", machine=128)
    built = built_objects(t)
    cluster = next(o for o in built if isinstance(o, ClusterObject))
    assert cluster.simulated.nodes * cluster.simulated.node[CPU] == 128_000
    assert sorted(o.name for o in built if isinstance(o, QueueObject)) == ["g1", "g2"]
    assert scenario(t).entitled() == {"g1": 0.5, "g2": 0.5}
    # What is printed for the user to save reads back as the same objects.
    import yaml
    again = load_objects(yaml.safe_dump_all([o.to_document() for o in built]))
    assert again == built


def test_a_config_without_the_trace_queues_is_refused_naming_them():
    with pytest.raises(ScenarioError, match="queues the config does not define: b"):
        scenario(trace(job(1, 0, 10, 1, queue="a"), job(2, 0, 10, 1, queue="b")), objects("a"))
    with pytest.raises(ScenarioError, match="spec.simulated is required"):
        scenario(trace(job(1, 0, 10, 1)), [QueueObject("a"), ClusterObject("c", tier="onprem", site="s")])


@pytest.mark.parametrize(("queues", "says"), [
    # A cycle of parents made the replay fail with an unexpected error; a missing parent replayed anyway.
    ([QueueObject("a", parent="b"), QueueObject("b", parent="a")], "the queues form a cycle: a -> b -> a"),
    ([QueueObject("a", parent="nope")], "queue a: spec.parent: queue 'nope' not found"),
    ([QueueObject("top", guaranteed={CPU: 2000}), QueueObject("a", parent="top", guaranteed={CPU: 4000})],
     "queue a: spec.guaranteed.cpu 4 exceeds its parent top's guaranteed 2"),
    ([QueueObject("a", service_classes=("gold",))], "queue a: spec.serviceClasses[0]: service class 'gold' not found"),
])
def test_a_config_sluice_up_would_refuse_is_refused_in_its_words(queues, says):
    config = [ServiceClassObject("standard", priority=500), *queues,
              ClusterObject("c1", tier="onprem", site="s", simulated=SimulatedSpec(1, {CPU: 8000}))]
    with pytest.raises(ScenarioError, match=rf"{re.escape(says)}.*`sluice up --config` would refuse this config"):
        scenario(trace(job(1, 0, 10, 1)), config)


def test_every_policy_replays_the_same_jobs_from_scratch():
    t = trace(*(job(i, i, 30, 3) for i in range(1, 20)))
    scene = scenario(t, objects("a"))
    first = replay(sim_jobs(t, scene), list(scene.clusters), scene.policy, "sluice")
    second = replay(sim_jobs(t, scene), list(scene.clusters), scene.policy, "sluice")
    assert [(j.first_start, j.finished) for j in first.jobs] == [(j.first_start, j.finished) for j in second.jobs]


def test_fair_share_with_memory_starts_the_queue_that_was_idle():
    """Queue a ran alone for hours; then both flood at once. Without memory their current shares tie and
    the older job (a's) goes first; with a half-life, b (idle until now) goes first."""
    jobs = [job(1, 0, 4 * 3600, 8, queue="a"), job(2, 4 * 3600 + 10, 100, 8, queue="a"),
            job(3, 4 * 3600 + 20, 100, 8, queue="b"), job(4, 4 * 3600 - 5, 30, 1, queue="c")]
    plain = simulate(trace(*jobs), objects("a", "b", "c", reservation=None), ["sluice"])
    root = [QueueObject("root", usage_half_life_s=3600.0), QueueObject("a", parent="root"),
            QueueObject("b", parent="root"), QueueObject("c", parent="root")]
    remembering = [o for o in objects("a", "b", "c", reservation=None) if not isinstance(o, QueueObject)] + root
    memory = simulate(trace(*jobs), remembering, ["sluice"])
    assert starts(plain, "sluice")[2] < starts(plain, "sluice")[3]
    assert starts(memory, "sluice")[3] < starts(memory, "sluice")[2]


def test_a_cycles_dispatches_reach_the_cluster_in_job_id_order_as_the_outbox_sends_them():
    # Two nodes of 4 cpu. Fair share plans 1, 3, 2, 4 (a, b, a, b), which would pack 1+3 and 1+3; but the
    # dispatch statement writes the outbox commands in job id order, the agent creates the pods in that
    # order and the cluster binds them first fit: 1 and 2 share node 0, 3 takes node 1, and 4 (3 cpu) fits
    # on neither until 1 ends (at 10) and leaves 3 cpu on node 0, though the cycle sent it at 0.
    t = trace(job(1, 0, 10, 1, queue="a"), job(2, 0, 20, 1, queue="a"),
              job(3, 0, 30, 3, queue="b"), job(4, 0, 5, 3, queue="b"))
    result = simulate(t, objects("a", "b", cpus=8, nodes=2), ["sluice"])
    assert starts(result, "sluice") == {1: 0, 2: 0, 3: 0, 4: 10}


def test_a_submit_behind_the_heads_of_a_parked_queue_costs_no_cycle_though_room_is_held():
    # Each job needs the whole cluster. Job 2 reserves it at once (reservation after 0 s); the queue is read to
    # its 2 heads (2 and 3), so jobs 4 to 12 arrive behind them: the heads a cycle would read are the same.
    t = trace(*(job(i, i, 1000, 8) for i in range(1, 13)))
    scene = scenario(t, objects("a"))
    replayed = replay(sim_jobs(t, scene), list(scene.clusters), scene.policy, "sluice",
                      settings=SchedulerSettings(per_queue=2))
    assert [j.first_start for j in replayed.jobs] == [1 + 1000 * n for n in range(12)]
    # Arrivals 1-3 and the 11 ends that start the next job decide; a start takes a head, so one more cycle
    # reads the next one (none at the last end, when the queue is short of 2). Arrivals 4-12 decide nothing.
    assert replayed.cycles == 3 + 11 * 2


def test_backfill_reads_deeper_into_a_queue_whose_heads_cannot_use_the_room_left():
    # 4 of 8 cpu run until 1000; jobs 2-5 need 8 and wait; job 6 (2 cpu) is behind the 2 heads a cycle reads.
    t = trace(job(1, 0, 1000, 4), *(job(i, 1, 100, 8) for i in range(2, 6)), job(6, 2, 100, 2))
    scene = scenario(t, objects("a", reservation=None))
    shallow = replay(sim_jobs(t, scene), list(scene.clusters), scene.policy, "sluice",
                     settings=SchedulerSettings(per_queue=2, backfill_per_queue=2))
    deeper = replay(sim_jobs(t, scene), list(scene.clusters), scene.policy, "sluice",
                    settings=SchedulerSettings(per_queue=2, backfill_per_queue=8))
    assert shallow.jobs[5].first_start == 1400  # among the heads from 1300, behind 5, which takes the node
    assert deeper.jobs[5].first_start == 2  # the next cycle after its heads waited with room left


def test_easy_backfill_looks_again_after_each_start_for_jobs_of_the_same_shape():
    # c1 has 3 cpu left beside job 1 until 1000, when job 2 (8 cpu) is reserved there; c2 has 2 cpu. Jobs 3
    # and 4 (2 cpu each, ending in time) have one shape: 3 takes c1's room, and 4 starts on c2, not on c1.
    c2 = ClusterObject("c2", tier="onprem", site="s", simulated=SimulatedSpec(1, {CPU: 2000}))
    t = trace(job(1, 0, 1000, 5, requested=1000), job(2, 1, 100, 8, requested=100),
              job(3, 2, 100, 2, requested=100), job(4, 2, 100, 2, requested=100))
    result = simulate(t, objects("a", extra=[c2]), ["easy-backfill"])
    assert starts(result, "easy-backfill") == {1: 0, 2: 1000, 3: 2, 4: 2}
    assert {o.id: o.cluster for o in result.outcomes["easy-backfill"]}[4] == "c2"


def test_backfill_reads_deeper_where_a_reservation_keeps_room_a_short_job_may_use():
    # 4 of 8 cpu run until 1000; job 2 (8 cpu) reserves the cluster at once, expected to start at 1000, and
    # job 3 waits behind it; job 4 (2 cpu, 100 s) is behind the 2 heads a cycle reads. The held room is no
    # room for the heads, but job 4 ends before the reservation starts: it may use it, as EASY would start it.
    t = trace(job(1, 0, 1000, 4, requested=1000), job(2, 1, 100, 8, requested=100),
              job(3, 2, 100, 8, requested=100), job(4, 3, 100, 2, requested=100))
    scene = scenario(t, objects("a"))
    shallow = replay(sim_jobs(t, scene), list(scene.clusters), scene.policy, "sluice",
                     settings=SchedulerSettings(per_queue=2, backfill_per_queue=2))
    deeper = replay(sim_jobs(t, scene), list(scene.clusters), scene.policy, "sluice",
                    settings=SchedulerSettings(per_queue=2, backfill_per_queue=8))
    assert shallow.jobs[3].first_start == 1200  # after jobs 2 and 3
    assert deeper.jobs[3].first_start == 3  # read at once, in the held room
    assert deeper.jobs[1].first_start == 1000  # and the reservation is not delayed


def test_no_policy_knows_a_run_time_the_trace_does_not_give():
    # The first test's jobs without requested times. EASY cannot date job 2's start (job 1 may run for ever):
    # job 2 gets no reservation and job 4 starts where it fits, as Slurm's backfill does without time limits;
    # Sluice keeps job 2's room from job 4, which may not end in time.
    t = trace(job(1, 0, 100, 6), job(2, 1, 100, 7), job(3, 2, 50, 2), job(4, 60, 500, 2))
    result = simulate(t, objects("a"), ["easy-backfill", "sluice"])
    assert starts(result, "easy-backfill") == {1: 0, 2: 560, 3: 2, 4: 60}
    assert starts(result, "sluice") == {1: 0, 2: 100, 3: 200, 4: 200}
    assert result.figures["easy-backfill"]["reservations"] == 0
    # Told each job's run time, both plan with it, as with requested times.
    exact = simulate(t, objects("a"), ["easy-backfill", "sluice"], exact_runtimes=True)
    assert starts(exact, "easy-backfill") == starts(exact, "sluice") == {1: 0, 2: 100, 3: 2, 4: 200}
    assert exact.trace["exactRuntimes"] is True and exact.trace["requestedTimes"] == 0


def test_a_job_that_runs_past_its_requested_time_is_stopped_there_whatever_the_policy_knows():
    t = trace(job(1, 0, 500, 8, requested=100), job(2, 1, 50, 8))
    for exact in (False, True):
        result = simulate(t, objects("a"), ["easy-backfill", "sluice"], exact_runtimes=exact)
        assert starts(result, "sluice") == starts(result, "easy-backfill") == {1: 0, 2: 100}


def test_easy_dates_a_reservation_by_the_ends_it_knows_and_starts_no_job_of_unknown_length_before_it():
    # 8 cpu. Job 1 (3 cpu) runs for ever as far as EASY knows; job 2 (3 cpu) is expected to end at 100, when
    # job 3 (5 cpu) fits. Job 4 (2 cpu, 50 s asked) ends before that: backfilled. Job 5 (2 cpu, 30 s, none
    # asked) would end in time too, but nothing says so: it waits for room job 3 does not need.
    t = trace(job(1, 0, 1000, 3), job(2, 0, 100, 3, requested=100), job(3, 1, 100, 5, requested=100),
              job(4, 2, 50, 2, requested=50), job(5, 60, 30, 2))
    result = simulate(t, objects("a"), ["easy-backfill"])
    assert starts(result, "easy-backfill") == {1: 0, 2: 0, 3: 100, 4: 2, 5: 200}
    assert result.figures["easy-backfill"]["reservations"] == 2  # job 3's, and job 5's once first (job 3 ends at 200)
    exact = simulate(t, objects("a"), ["easy-backfill"], exact_runtimes=True)
    assert starts(exact, "easy-backfill")[5] == 60


def test_a_reservation_made_in_the_cycle_that_starts_jobs_on_its_cluster_counts_on_their_ends():
    # Job 1 holds the 8 cpu until 100. At 100 job 2 (2 cpu, 1,000 s) starts and job 3 (8 cpu) reserves the
    # cluster: it starts when job 2 ends, at 1,100, so job 4 (1 cpu, 50 s) may use the held room at once,
    # as EASY starts it. Not counting job 2's end, the reservation could not be dated and kept everything.
    t = trace(job(1, 0, 100, 8, requested=100), job(2, 1, 1000, 2, requested=1000),
              job(3, 2, 100, 8, requested=100), job(4, 3, 50, 1, requested=50))
    result = simulate(t, objects("a"), ["sluice", "easy-backfill"])
    assert starts(result, "sluice") == starts(result, "easy-backfill") == {1: 0, 2: 100, 3: 1100, 4: 100}


def test_a_parked_queues_head_reserves_at_its_reservation_time_as_the_leaders_loop_plans_it():
    """The loop runs a cycle every idle_wait_s, which plans a parked queue again once its head's reservation
    time comes; the replay runs that cycle too, though the cycles since planned other queues only."""
    t = trace(job(1, 0, 7200, 6, queue="a", requested=7200),  # 2 of 8 cpus left until 7200
              job(2, 10, 100, 7, queue="b", requested=100),  # waits: its queue is parked, reserving at 3610
              job(3, 20, 20_000, 1, queue="c", requested=20_000))  # a cycle for queue c alone starts it
    result = simulate(t, objects("a", "b", "c", reservation=3600.0), ["sluice"])
    assert starts(result, "sluice") == {1: 0, 2: 7200, 3: 20}
    assert result.figures["sluice"]["reservations"] == 1  # made at 3610, with no other event then
