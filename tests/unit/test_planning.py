"""One scheduling cycle (plan_cycle): the order jobs are considered in, queues taking turns, quotas,
reservations and backfill, preemption and reclaim, the holds kept between cycles, the reason every
waiting job is given, and invariants over random queue trees, clusters, running and queued jobs."""
from __future__ import annotations

from dataclasses import replace

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dispatcher.policy.placing import ClusterState, Place, QueuedJob
from dispatcher.policy.planning import plan_cycle
from dispatcher.policy.plans import PREEMPTION_HOLD_S, Active, Candidate, ClassPolicy, CyclePlan, Hold, Preempt
from dispatcher.policy.quotas import QueueQuota, QuotaTree
from sluice.quantity import add

CPU = 1000  # milli-units per core
GPU = 1000
GI = 2**30 * 1000
G = "nvidia.com/gpu"
NOW = 1_000_000.0

CLASSES = {
    "critical": ClassPolicy("critical", priority=100, can_preempt=True),
    "standard": ClassPolicy("standard", priority=50),
    "favoured": ClassPolicy("favoured", priority=50, weight=4.0),
    "big": ClassPolicy("big", priority=50, reservation_after_s=600),
    "batch": ClassPolicy("batch", priority=10, preemptible=True),
    "scavenger": ClassPolicy("scavenger", priority=0, preemptible=True),
}


def res(**amounts: int) -> dict[str, int]:
    """Resources in milli-units; gpu= is nvidia.com/gpu."""
    return {(G if k == "gpu" else k): v for k, v in amounts.items()}


def head(job_id: int, queue: str, cls: str = "standard", priority: int = 0, waited: float = 0.0,
         preempted_by: int | None = None, pods: int = 1, selector: dict | None = None, tiers: tuple = (),
         sites: tuple = (), **per_pod: int) -> Candidate:
    """A queued job of `pods` identical pods, each asking for `per_pod` milli-units."""
    pod = res(**per_pod)
    job = QueuedJob(job_id, {r: v * pods for r, v in pod.items()}, pod, dict(selector or {}), tiers, sites)
    return Candidate(job, queue, cls, CLASSES[cls].priority, priority, waited, preempted_by)


def running(job_id: int, queue: str, cluster: str, cls: str = "standard", priority: int = 0,
            **requests: int) -> Active:
    return Active(job_id, queue, cls, CLASSES[cls].priority, priority, cluster, res(**requests),
                  CLASSES[cls].preemptible)


def cluster(name: str, active: list[Active] = (), tier: str = "onprem", site: str = "dc1",
            labels: dict | None = None, unavailable: str = "", largest: dict | None = None,
            **allocatable: int) -> ClusterState:
    """A cluster of `allocatable`, less what `active` runs on it; its largest node holds all that is free
    unless `largest` says otherwise."""
    alloc = res(**allocatable)
    free = dict(alloc)
    for a in active:
        if a.cluster == name:
            for r, v in a.requests.items():
                free[r] = free.get(r, 0) - v
    return ClusterState(name, tier, site, dict(labels or {}), free, dict(largest if largest is not None else free),
                        unavailable, alloc)


def heads_of(candidates) -> dict[str, list[Candidate]]:
    """Per queue, in the store's order: class, then priority, then age."""
    out: dict[str, list[Candidate]] = {}
    for c in sorted(candidates, key=lambda c: (-c.class_priority, -c.priority, c.job.id)):
        out.setdefault(c.queue, []).append(c)
    return out


def run(candidates, active=(), clusters=(), queues=None, holds=None, now=NOW, classes=CLASSES) -> CyclePlan:
    """plan_cycle over flat queues without quotas unless `queues` is given."""
    candidates = list(candidates)
    if queues is None:
        names = sorted({c.queue for c in candidates} | {a.queue for a in active})
        queues = [QueueQuota(n) for n in names]
    return plan_cycle(heads_of(candidates), list(active), list(clusters), list(queues), classes,
                      dict(holds or {}), now)


def placed(plan: CyclePlan) -> dict[int, str]:
    return {p.job_id: p.cluster for p in plan.places}


def order(plan: CyclePlan) -> list[int]:
    return [p.job_id for p in plan.places]


def victims(plan: CyclePlan) -> list[int]:
    return sorted(p.victim for p in plan.preemptions)


# -- order -------------------------------------------------------------------------------------------

def test_a_higher_class_goes_first_whatever_its_queues_share():
    act = [running(1, "busy", "c", cpu=8 * CPU)]
    plan = run([head(10, "idle", "standard", cpu=8 * CPU), head(11, "busy", "critical", cpu=8 * CPU)],
               act, [cluster("c", act, cpu=16 * CPU)])
    assert placed(plan) == {11: "c"}
    assert plan.waits == {10: "no cluster fits: c: needs 8 cpu, 0 free"}
    assert plan.preemptions == []


def test_a_higher_class_goes_first_within_one_queue_too():
    plan = run([head(1, "a", "batch", cpu=4 * CPU), head(2, "a", "critical", cpu=4 * CPU),
                head(3, "a", "standard", cpu=4 * CPU)], clusters=[cluster("c", cpu=64 * CPU)])
    assert order(plan) == [2, 3, 1]


def test_within_a_class_the_queue_with_the_lower_share_goes_first():
    act = [running(1, "a", "c", cpu=8 * CPU)]
    plan = run([head(10, "a", cpu=CPU), head(20, "b", cpu=CPU)], act, [cluster("c", act, cpu=32 * CPU)])
    assert order(plan) == [20, 10]


def test_the_share_is_the_dominant_resource():
    # a uses a quarter of the cpu; b a little cpu but half of the gpus: a goes first.
    act = [running(1, "a", "c", cpu=8 * CPU), running(2, "b", "c", cpu=CPU, gpu=4 * GPU)]
    plan = run([head(10, "b", cpu=CPU), head(20, "a", cpu=CPU)], act, [cluster("c", act, cpu=32 * CPU, gpu=8 * GPU)])
    assert order(plan) == [20, 10]


def test_the_share_is_weighted_by_the_queue():
    # a uses twice what b uses, but weighs four times as much.
    act = [running(1, "a", "c", cpu=8 * CPU), running(2, "b", "c", cpu=4 * CPU)]
    queues = [QueueQuota("a", weight=4.0), QueueQuota("b")]
    plan = run([head(10, "b", cpu=CPU), head(20, "a", cpu=CPU)], act, [cluster("c", act, cpu=32 * CPU)], queues)
    assert order(plan) == [20, 10]


def test_the_share_is_weighted_by_the_class():
    # Same class priority; the favoured class weighs four times as much.
    act = [running(1, "a", "c", cpu=8 * CPU), running(2, "b", "c", cpu=4 * CPU)]
    plan = run([head(10, "b", cpu=CPU), head(20, "a", "favoured", cpu=CPU)], act, [cluster("c", act, cpu=32 * CPU)])
    assert order(plan) == [20, 10]


def test_parents_are_compared_before_their_children():
    # vision uses nothing itself, but research (its parent) uses more than ops: ops goes first.
    queues = [QueueQuota("research"), QueueQuota("vision", "research"), QueueQuota("nlp", "research"),
              QueueQuota("ops")]
    act = [running(1, "nlp", "c", cpu=12 * CPU), running(2, "ops", "c", cpu=4 * CPU)]
    plan = run([head(10, "vision", cpu=CPU), head(20, "ops", cpu=CPU)], act, [cluster("c", act, cpu=32 * CPU)],
               queues)
    assert order(plan) == [20, 10]


def test_a_parent_with_many_children_gets_its_share_not_one_per_child():
    # research has ten busy children, ops is alone: with equal weights the two subtrees split the cluster.
    kids = [f"team{n}" for n in range(10)]
    queues = [QueueQuota("research")] + [QueueQuota(k, "research") for k in kids] + [QueueQuota("ops")]
    jobs = [head(100 * (n + 1) + i, k, cpu=CPU) for n, k in enumerate(kids) for i in range(20)]
    jobs += [head(5000 + i, "ops", cpu=CPU) for i in range(20)]
    plan = run(jobs, clusters=[cluster("c", cpu=20 * CPU)], queues=queues)
    ops = sum(1 for i in order(plan) if i >= 5000)
    assert len(plan.places) == 20
    assert ops == 10, f"ops got {ops} of 20"


def test_with_a_half_life_the_queue_that_used_less_lately_goes_first():
    queues = [QueueQuota("org", usage_half_life_s=3600.0), QueueQuota("a", "org"), QueueQuota("b", "org")]
    jobs = heads_of([head(1, "a", cpu=4 * CPU), head(2, "b", cpu=4 * CPU)])
    clusters = [cluster("c", cpu=4 * CPU)]
    assert order(plan_cycle(jobs, [], clusters, queues, CLASSES, {}, NOW)) == [1]  # no history: age decides
    plan = plan_cycle(jobs, [], clusters, queues, CLASSES, {}, NOW, history={"a": {"cpu": 4 * CPU * 3600.0}})
    assert order(plan) == [2]


def test_between_queues_of_equal_share_priority_then_age_decides():
    plan = run([head(5, "a", cpu=CPU), head(9, "b", priority=3, cpu=CPU), head(7, "c", cpu=CPU)],
               clusters=[cluster("x", cpu=64 * CPU)])
    assert order(plan) == [9, 5, 7]


def test_within_a_queue_priority_then_age():
    plan = run([head(1, "a", cpu=CPU), head(3, "a", priority=2, cpu=CPU), head(2, "a", cpu=CPU),
                head(4, "a", priority=2, cpu=CPU)], clusters=[cluster("x", cpu=64 * CPU)])
    assert order(plan) == [3, 4, 1, 2]


def test_queues_take_turns_so_a_small_queue_is_not_stuck_behind_a_flood():
    flood = [head(i, "flood", cpu=CPU) for i in range(1, 1001)]
    late = [head(2000 + i, "late", cpu=CPU) for i in range(10)]
    plan = run(flood + late, clusters=[cluster("c", cpu=20 * CPU)])
    ids = order(plan)
    assert len(ids) == 20
    # The ten late jobs are interleaved into the first decisions, not queued behind the thousand.
    for k in range(1, 11):
        assert sum(1 for i in ids[:2 * k] if i >= 2000) == k, ids
    assert len(plan.waits) == 990 and set(plan.waits) | set(ids) == {c.job.id for c in flood + late}


def test_with_little_room_the_small_queue_still_gets_its_fair_part():
    flood = [head(i, "flood", cpu=CPU) for i in range(1, 1001)]
    late = [head(2000 + i, "late", cpu=CPU) for i in range(10)]
    plan = run(flood + late, clusters=[cluster("c", cpu=6 * CPU)])
    assert sorted(placed(plan)) == [1, 2, 3, 2000, 2001, 2002]


def test_a_queue_whose_head_cannot_start_never_blocks_the_others():
    plan = run([head(1, "a", cpu=64 * CPU), head(2, "a", cpu=2 * CPU), head(3, "b", cpu=2 * CPU)],
               clusters=[cluster("c", cpu=8 * CPU)])
    assert placed(plan) == {2: "c", 3: "c"}
    assert plan.waits == {1: "no cluster fits: c: needs 64 cpu, 8 free"}


def test_a_head_over_its_queues_max_never_blocks_the_queue_or_the_others():
    queues = [QueueQuota("a", max=res(cpu=4 * CPU)), QueueQuota("b")]
    plan = run([head(1, "a", cpu=8 * CPU), head(2, "a", cpu=4 * CPU), head(3, "b", cpu=2 * CPU)],
               clusters=[cluster("c", cpu=64 * CPU)], queues=queues)
    assert placed(plan) == {2: "c", 3: "c"}
    assert plan.waits == {1: "queue a: cpu 0/4 in use, needs 8 (guaranteed 0, max 4)"}


def test_a_queue_none_of_whose_heads_started_while_room_of_their_kind_is_left_has_room_behind():
    plan = run([head(1, "wide", cpu=16 * CPU), head(2, "wide", cpu=12 * CPU),  # 8 cpu left: neither fits
                head(3, "gpu", cpu=CPU, gpu=GPU),  # no gpu anywhere: nothing behind it could start either
                head(4, "small", cpu=CPU), head(5, "small", cpu=16 * CPU)],  # one started
               clusters=[cluster("c", cpu=9 * CPU)])
    assert placed(plan) == {4: "c"}
    assert plan.room_behind == {"wide"}
    full = run([head(1, "wide", cpu=16 * CPU)], clusters=[cluster("c", active=[running(9, "x", "c", cpu=8 * CPU)],
                                                                    cpu=8 * CPU)])
    assert full.room_behind == set()  # no cpu left at all
    held = run([head(1, "wide", "big", waited=700, cpu=16 * CPU), head(2, "wide", cpu=16 * CPU)],
               clusters=[cluster("c", active=[running(9, "x", "c", cpu=8 * CPU)], cpu=16 * CPU)])
    assert 1 in held.holds and held.room_behind == set()  # the 8 cpu left are kept for job 1's reservation


def test_one_cycle_admits_many_jobs_of_one_queue():
    plan = run([head(i, "a", cpu=CPU) for i in range(1, 51)], clusters=[cluster("c", cpu=50 * CPU)])
    assert len(plan.places) == 50 and plan.waits == {}


def test_plan_cycle_leaves_its_inputs_alone():
    act = [running(1, "b", "c", "batch", cpu=8 * CPU)]
    clusters = [cluster("c", act, cpu=8 * CPU)]
    heads = heads_of([head(2, "a", "critical", cpu=4 * CPU), head(3, "b", cpu=CPU)])
    holds = {3: Hold(3, "c", res(cpu=CPU), "reservation", NOW - 5)}
    queues = [QueueQuota("a"), QueueQuota("b")]
    before = repr((heads, act, clusters, queues, holds))
    plan = plan_cycle(heads, act, clusters, queues, CLASSES, holds, NOW)
    assert plan.preemptions == [Preempt(1, 2, "c")]
    assert repr((heads, act, clusters, queues, holds)) == before


# -- quotas ------------------------------------------------------------------------------------------

def research(research_max: int = 32, vision_guaranteed: int = 8, vision_max: int = 16) -> list[QueueQuota]:
    return [QueueQuota("research", guaranteed=res(gpu=16 * GPU), max=res(gpu=research_max * GPU)),
            QueueQuota("vision", "research", guaranteed=res(gpu=vision_guaranteed * GPU),
                       max=res(gpu=vision_max * GPU)),
            QueueQuota("nlp", "research", guaranteed=res(gpu=8 * GPU), max=res(gpu=16 * GPU))]


def test_a_queue_never_goes_beyond_its_max_and_the_reason_names_it():
    act = [running(1, "vision", "c", gpu=12 * GPU)]
    plan = run([head(i, "vision", gpu=2 * GPU) for i in (10, 11, 12)], act, [cluster("c", act, gpu=64 * GPU)],
               research())
    assert placed(plan) == {10: "c", 11: "c"}
    assert plan.waits == {12: "queue vision: nvidia.com/gpu 16/16 in use (guaranteed 8, max 16)"}


def test_below_its_max_the_reason_says_what_the_job_needs():
    act = [running(1, "vision", "c", gpu=14 * GPU)]
    plan = run([head(10, "vision", gpu=4 * GPU)], act, [cluster("c", act, gpu=64 * GPU)], research())
    assert plan.waits == {10: "queue vision: nvidia.com/gpu 14/16 in use, needs 4 (guaranteed 8, max 16)"}


def test_an_ancestors_max_holds_and_its_reason_names_the_ancestor():
    # vision is guaranteed 2: 8 more would be borrowed, so it waits for research's max.
    act = [running(1, "nlp", "c", gpu=12 * GPU)]
    plan = run([head(10, "vision", gpu=8 * GPU), head(11, "vision", gpu=4 * GPU)], act,
               [cluster("c", act, gpu=64 * GPU)], research(research_max=16, vision_guaranteed=2))
    assert placed(plan) == {11: "c"}
    assert plan.waits == {10: "queue research (parent of vision): nvidia.com/gpu 12/16 in use, needs 8 "
                              "(guaranteed 16, max 16)"}
    assert plan.preemptions == []


def test_jobs_admitted_in_one_cycle_count_against_the_max_of_later_ones():
    queues = research(research_max=16)
    plan = run([head(i, "vision", gpu=4 * GPU) for i in (1, 2, 3)] + [head(i, "nlp", gpu=4 * GPU) for i in (4, 5, 6)],
               clusters=[cluster("c", gpu=64 * GPU)], queues=queues)
    assert len(plan.places) == 4
    assert all(r.startswith("queue research (parent of ") for r in plan.waits.values())


# -- reservation and backfill ------------------------------------------------------------------------

def reserved_scene():
    """c1 has 16 cpu, 12 of them used by others; c2 is a small cluster of 8 cpu."""
    act = [running(1, "other", "c1", cpu=12 * CPU)]
    return act, [cluster("c1", act, cpu=16 * CPU), cluster("c2", act, cpu=8 * CPU)]


def test_a_job_past_its_reservation_time_that_fits_nowhere_holds_a_cluster_that_could_hold_it():
    act, clusters = reserved_scene()
    plan = run([head(5, "a", "big", waited=700, cpu=16 * CPU)], act, clusters)
    assert plan.holds == {5: Hold(5, "c1", res(cpu=16 * CPU), "reservation", NOW)}
    assert plan.waits == {5: "reserved capacity on c1 (waited past 600s)"}


def test_before_its_reservation_time_a_big_job_holds_nothing():
    act, clusters = reserved_scene()
    plan = run([head(5, "a", "big", waited=500, cpu=16 * CPU), head(6, "b", cpu=2 * CPU)], act, clusters)
    assert plan.holds == {}
    assert plan.waits == {5: "no cluster fits: c1: needs 16 cpu, 4 free; c2: needs 16 cpu, 8 free"}
    assert placed(plan) == {6: "c1"}


def test_a_job_no_cluster_could_ever_hold_reserves_nothing():
    act, clusters = reserved_scene()
    plan = run([head(5, "a", "big", waited=700, cpu=17 * CPU)], act, clusters)
    assert plan.holds == {} and plan.waits[5].startswith("no cluster fits: ")


def test_a_smaller_job_waits_for_the_reservation_instead_of_taking_its_room():
    act, clusters = reserved_scene()
    plan = run([head(5, "a", "big", waited=700, cpu=16 * CPU), head(6, "b", cpu=8 * CPU),
                head(7, "b", cpu=2 * CPU)], act, clusters)
    assert 5 in plan.holds
    assert placed(plan) == {6: "c2"}  # the rest of the fleet is not held
    assert plan.waits[7] == "reserved capacity for job 5 on c1"  # c1 has 4 free, all of it held


def test_backfill_uses_what_the_hold_leaves():
    # The big job fits c1's 28 free cpu in all, but not on one node: it reserves 24, leaving 4.
    c1 = cluster("c1", cpu=28 * CPU, largest=res(cpu=8 * CPU))
    plan = run([head(5, "a", "big", waited=700, pods=2, cpu=12 * CPU), head(6, "b", cpu=3 * CPU),
                head(7, "b", cpu=2 * CPU), head(8, "c", cpu=CPU)], clusters=[c1])
    assert plan.holds[5].cluster == "c1" and plan.holds[5].requests == res(cpu=24 * CPU)
    assert placed(plan) == {6: "c1", 8: "c1"}
    assert plan.waits[7] == "reserved capacity for job 5 on c1"


def test_a_hold_from_an_earlier_cycle_binds_jobs_considered_before_its_holder():
    act, clusters = reserved_scene()
    holds = {5: Hold(5, "c1", res(cpu=16 * CPU), "reservation", NOW - 60)}
    plan = run([head(5, "a", "big", waited=700, cpu=16 * CPU), head(6, "b", "critical", cpu=2 * CPU)], act,
               clusters, holds=holds)
    assert placed(plan) == {6: "c2"}
    assert plan.waits[5] == "reserved capacity on c1: waiting for room"
    assert plan.holds == holds


def test_when_capacity_frees_the_holder_is_placed_and_its_hold_dropped():
    holds = {5: Hold(5, "c1", res(cpu=16 * CPU), "reservation", NOW - 60)}
    plan = run([head(5, "a", "big", waited=760, cpu=16 * CPU), head(6, "b", cpu=2 * CPU)],
               clusters=[cluster("c1", cpu=16 * CPU), cluster("c2", cpu=8 * CPU)], holds=holds)
    assert placed(plan) == {5: "c1", 6: "c2"}
    assert plan.holds == {} and plan.waits == {}


def test_holds_of_jobs_no_longer_queued_or_on_clusters_gone_are_dropped():
    holds = {99: Hold(99, "c1", res(cpu=16 * CPU), "reservation", NOW - 60),
             98: Hold(98, "c1", res(cpu=16 * CPU), "preemption", NOW - 1, (3,)),
             5: Hold(5, "gone", res(cpu=16 * CPU), "reservation", NOW - 60)}
    plan = run([head(5, "a", cpu=32 * CPU), head(6, "b", cpu=4 * CPU)], clusters=[cluster("c1", cpu=16 * CPU)],
               holds=holds)
    assert placed(plan) == {6: "c1"}
    assert plan.holds == {}
    assert plan.waits == {5: "no cluster fits: c1: needs 32 cpu, 16 free"}


def test_preemption_holds_expire_but_reservations_do_not():
    clusters = [cluster("c1", cpu=16 * CPU)]
    young = Hold(5, "c1", res(cpu=16 * CPU), "preemption", NOW - PREEMPTION_HOLD_S + 1, (3,))
    old = replace(young, since=NOW - PREEMPTION_HOLD_S)
    reservation = Hold(5, "c1", res(cpu=16 * CPU), "reservation", NOW - 100 * PREEMPTION_HOLD_S)
    jobs = [head(5, "a", cpu=32 * CPU), head(6, "b", cpu=4 * CPU)]
    kept = run(jobs, clusters=clusters, holds={5: young})
    assert kept.holds == {5: young} and placed(kept) == {}
    assert kept.waits == {5: "holding capacity on c1: waiting for preempted jobs 3 to stop",
                          6: "reserved capacity for job 5 on c1"}
    expired = run(jobs, clusters=clusters, holds={5: old})
    assert expired.holds == {} and placed(expired) == {6: "c1"}
    assert run(jobs, clusters=clusters, holds={5: reservation}).holds == {5: reservation}


def test_room_freed_by_preemption_goes_to_its_preemptor_before_an_older_reservation():
    # Job 20 evicted job 3 for 8 cpu; job 7, evicted or starving, reserved c long before: the freed room
    # is job 20's, else the eviction bought nothing and job 20 would evict again.
    holds = {20: Hold(20, "c", res(cpu=8 * CPU), "preemption", NOW - 5, (3,)),
             7: Hold(7, "c", res(cpu=8 * CPU), "reservation", NOW - 1000)}
    act = [running(1, "b", "c", cpu=8 * CPU)]
    plan = run([head(7, "a", "big", waited=2000, cpu=8 * CPU), head(20, "u", "critical", cpu=8 * CPU)], act,
               [cluster("c", act, cpu=16 * CPU)], holds=holds)
    assert placed(plan) == {20: "c"}
    assert list(plan.holds) == [7] and plan.holds[7].since == NOW - 1000
    assert plan.waits == {7: "reserved capacity on c: waiting for room"}


def test_a_job_waiting_on_its_queues_max_keeps_no_reservation():
    # Its reservation would hold c1 for a job that could not use it, keeping everyone else off.
    queues = [QueueQuota("a", max=res(cpu=8 * CPU)), QueueQuota("b")]
    holds = {5: Hold(5, "c1", res(cpu=16 * CPU), "reservation", NOW - 60)}
    plan = run([head(5, "a", "big", waited=700, cpu=16 * CPU), head(6, "b", cpu=4 * CPU)],
               clusters=[cluster("c1", cpu=16 * CPU)], queues=queues, holds=holds)
    assert plan.waits == {5: "queue a: cpu 0/8 in use, needs 16 (guaranteed 0, max 8)"}
    assert plan.holds == {}
    assert placed(plan) == {6: "c1"}


# -- preemption --------------------------------------------------------------------------------------

def test_a_job_that_may_preempt_evicts_lower_class_preemptible_jobs_and_holds_the_room():
    act = [running(1, "b", "c", "batch", cpu=8 * CPU), running(2, "b", "c", "batch", cpu=8 * CPU)]
    plan = run([head(10, "a", "critical", cpu=8 * CPU)], act, [cluster("c", act, cpu=16 * CPU)])
    assert plan.preemptions == [Preempt(2, 10, "c")]  # the younger of two equals
    assert plan.holds == {10: Hold(10, "c", res(cpu=8 * CPU), "preemption", NOW, (2,))}
    assert plan.waits == {10: "preempting jobs 2 on c"}
    assert plan.places == []


def test_the_reason_lists_every_victim():
    act = [running(i, "b", "c", "batch", cpu=4 * CPU) for i in (1, 2, 3, 4)]
    plan = run([head(10, "a", "critical", cpu=12 * CPU)], act, [cluster("c", act, cpu=16 * CPU)])
    assert victims(plan) == [2, 3, 4]
    assert plan.waits == {10: "preempting jobs 4, 3, 2 on c"}
    assert plan.holds[10].victims == (4, 3, 2)


def test_preemption_evicts_the_fewest_jobs():
    # Four small batch jobs or one big one would do: the big one alone goes.
    act = [running(1, "b", "c", "batch", cpu=8 * CPU)] + [running(i, "b", "c", "batch", cpu=2 * CPU)
                                                            for i in (11, 12, 13, 14)]
    plan = run([head(20, "a", "critical", cpu=8 * CPU)], act, [cluster("c", act, cpu=16 * CPU)])
    assert victims(plan) == [1]


def test_preemption_prefers_the_lower_class_and_then_the_lower_priority():
    act = [running(1, "b", "c", "batch", priority=0, cpu=4 * CPU), running(2, "b", "c", "scavenger", cpu=4 * CPU),
           running(3, "b", "c", "batch", priority=5, cpu=4 * CPU),
           running(4, "b", "c", "batch", priority=9, cpu=4 * CPU)]
    plan = run([head(20, "a", "critical", cpu=4 * CPU), head(21, "a", "critical", cpu=4 * CPU)], act,
               [cluster("c", act, cpu=16 * CPU)])
    assert plan.preemptions == [Preempt(2, 20, "c"), Preempt(1, 21, "c")]


def test_preemption_frees_room_on_one_cluster_and_chooses_the_one_with_fewest_victims():
    act = [running(1, "b", "c1", "batch", cpu=4 * CPU), running(2, "b", "c1", "batch", cpu=4 * CPU),
           running(3, "b", "c2", "batch", cpu=8 * CPU)]
    plan = run([head(10, "a", "critical", cpu=8 * CPU)], act,
               [cluster("c1", act, cpu=8 * CPU), cluster("c2", act, cpu=8 * CPU)])
    assert plan.preemptions == [Preempt(3, 10, "c2")]


def test_victims_on_different_clusters_are_never_added_up():
    act = [running(1, "b", "c1", "batch", cpu=4 * CPU), running(2, "b", "c2", "batch", cpu=4 * CPU)]
    plan = run([head(10, "a", "critical", cpu=8 * CPU)], act,
               [cluster("c1", act, cpu=4 * CPU), cluster("c2", act, cpu=4 * CPU)])
    assert plan.preemptions == [] and plan.holds == {}


def test_never_evicts_non_preemptible_or_equal_class_jobs():
    act = [running(1, "b", "c", "standard", cpu=8 * CPU), running(2, "b", "c", "critical", cpu=8 * CPU)]
    plan = run([head(10, "a", "critical", cpu=8 * CPU)], act, [cluster("c", act, cpu=16 * CPU)])
    assert plan.preemptions == [] and plan.holds == {}
    assert plan.waits == {10: "no cluster fits: c: needs 8 cpu, 0 free"}


def test_a_preemptible_job_of_a_higher_class_is_not_evicted_for_class():
    classes = {**CLASSES, "spot-critical": ClassPolicy("spot-critical", priority=200, preemptible=True)}
    act = [Active(1, "b", "spot-critical", 200, 0, "c", res(cpu=8 * CPU), True)]
    plan = run([head(10, "a", "critical", cpu=8 * CPU)], act, [cluster("c", act, cpu=8 * CPU)], classes=classes)
    assert plan.preemptions == []


def test_a_class_that_may_not_preempt_never_does():
    act = [running(1, "b", "c", "scavenger", cpu=8 * CPU)]
    plan = run([head(10, "a", "standard", cpu=8 * CPU)], act, [cluster("c", act, cpu=8 * CPU)])
    assert plan.preemptions == []


def test_a_job_never_evicts_the_job_that_evicted_it():
    act = [running(7, "b", "c", "batch", cpu=8 * CPU)]
    plan = run([head(10, "a", "critical", preempted_by=7, cpu=8 * CPU)], act, [cluster("c", act, cpu=8 * CPU)])
    assert plan.preemptions == []
    act.append(running(8, "b", "c", "batch", cpu=8 * CPU))
    plan = run([head(10, "a", "critical", preempted_by=7, cpu=8 * CPU)], act, [cluster("c", act, cpu=16 * CPU)])
    assert plan.preemptions == [Preempt(8, 10, "c")]


def test_two_preemptors_never_evict_the_same_job():
    act = [running(1, "b", "c", "batch", cpu=8 * CPU), running(2, "b", "c", "batch", cpu=8 * CPU)]
    plan = run([head(10, "a", "critical", cpu=8 * CPU), head(11, "a", "critical", cpu=8 * CPU),
                head(12, "a", "critical", cpu=8 * CPU)], act, [cluster("c", act, cpu=16 * CPU)])
    assert sorted((p.by, p.victim) for p in plan.preemptions) == [(10, 2), (11, 1)]
    assert plan.waits[12] == "no cluster fits: c: needs 8 cpu, 0 free"


def test_while_its_hold_stands_a_preemptor_does_not_preempt_again():
    act = [running(2, "b", "c", "batch", cpu=8 * CPU)]  # job 1, evicted last cycle, has not stopped yet
    c = replace(cluster("c", act, cpu=16 * CPU), free=res(cpu=0), largest_free_node=res(cpu=0))
    hold = Hold(10, "c", res(cpu=8 * CPU), "preemption", NOW - 5, (1,))
    plan = run([head(10, "a", "critical", cpu=8 * CPU)], act, [c], holds={10: hold})
    assert plan.preemptions == []
    assert plan.waits == {10: "holding capacity on c: waiting for preempted jobs 1 to stop"}
    assert plan.holds == {10: hold}


def test_the_room_a_preemption_frees_counts_against_the_preemptors_queue_until_it_starts():
    # Job 10 may only run on-prem; evicting a's own batch job gives back 8 of a's 16: its hold keeps
    # them, so a's other jobs (which may use the cloud) cannot take a's whole maximum meanwhile.
    queues = [QueueQuota("a", max=res(cpu=16 * CPU))]
    act = [running(1, "a", "onprem", "batch", cpu=8 * CPU)]
    clusters = [cluster("onprem", act, cpu=8 * CPU), cluster("cloud", act, tier="cloud", cpu=16 * CPU)]
    plan = run([head(10, "a", "critical", tiers=("onprem",), cpu=8 * CPU), head(11, "a", cpu=8 * CPU),
                head(12, "a", cpu=8 * CPU)], act, clusters, queues)
    assert plan.preemptions == [Preempt(1, 10, "onprem")]
    assert placed(plan) == {11: "cloud"}
    assert plan.waits[12] == "queue a: cpu 16/16 in use (guaranteed 0, max 16)"
    # Next cycle, job 1 has stopped: job 10 starts in the room and the quota held for it.
    nxt = run([head(10, "a", "critical", tiers=("onprem",), cpu=8 * CPU), head(12, "a", cpu=8 * CPU)],
              [running(11, "a", "cloud", cpu=8 * CPU)], [cluster("onprem", cpu=8 * CPU),
                                                          cluster("cloud", tier="cloud", cpu=8 * CPU)],
              queues, holds=plan.holds)
    assert placed(nxt) == {10: "onprem"} and nxt.holds == {}
    assert nxt.waits[12] == "queue a: cpu 16/16 in use (guaranteed 0, max 16)"


def test_once_the_victims_stopped_the_preemptor_starts_and_the_victims_wait_for_it():
    act = [running(2, "b", "c", "batch", cpu=8 * CPU)]
    hold = Hold(10, "c", res(cpu=8 * CPU), "preemption", NOW - 5, (1,))
    plan = run([head(10, "a", "critical", cpu=8 * CPU), head(1, "b", "batch", preempted_by=10, cpu=8 * CPU)],
               act, [cluster("c", act, cpu=16 * CPU)], holds={10: hold})
    assert placed(plan) == {10: "c"}
    assert plan.holds == {} and plan.preemptions == []
    assert plan.waits == {1: "no cluster fits: c: needs 8 cpu, 0 free"}


def test_a_job_holding_a_reservation_still_preempts_and_a_preemption_hold_replaces_the_reservation():
    # 2 cpu free and 8 of preemptible batch: the 10 cpu critical job reserved c earlier (when nothing
    # could be evicted); it must not wait for ever behind its own reservation.
    classes = {**CLASSES, "urgent": ClassPolicy("urgent", priority=100, can_preempt=True, reservation_after_s=60)}
    act = [running(i, "b", "c", "batch", cpu=2 * CPU) for i in (1, 2, 3, 4)]
    job = Candidate(QueuedJob(10, res(cpu=10 * CPU), res(cpu=2 * CPU)), "a", "urgent", 100, 0, 700.0)
    reservation = Hold(10, "c", res(cpu=10 * CPU), "reservation", NOW - 300)
    plan = run([job], act, [cluster("c", act, cpu=10 * CPU)], holds={10: reservation}, classes=classes)
    assert victims(plan) == [1, 2, 3, 4]
    assert plan.holds == {10: Hold(10, "c", res(cpu=10 * CPU), "preemption", NOW, (4, 3, 2, 1))}
    assert plan.waits == {10: "preempting jobs 4, 3, 2, 1 on c"}


def test_preemption_frees_room_its_pods_surely_pack_onto_where_the_cluster_reports_its_nodes():
    # 4 nodes of 8 GPUs, 1 free on each. Evicting the youngest, the 6-GPU job, frees 10 in total but at most
    # 7 on one node; only the 8-GPU job's own room surely holds the 8-GPU pod.
    act = [running(1, "b", "c", "batch", gpu=8 * GPU), running(2, "b", "c", "batch", gpu=4 * GPU),
           running(3, "b", "c", "batch", gpu=3 * GPU), running(4, "b", "c", "batch", gpu=7 * GPU),
           running(5, "b", "c", "batch", gpu=6 * GPU)]
    nodes = ({G: 1 * GPU},) * 4
    c = replace(cluster("c", act, gpu=32 * GPU, largest=res(gpu=GPU)), node_free=nodes)
    plan = run([head(10, "a", "critical", gpu=8 * GPU)], act, [c])
    assert victims(plan) == [1]
    # Without per-node figures, the fewest victims that free enough in total, youngest first, as before.
    plan = run([head(10, "a", "critical", gpu=8 * GPU)], act, [replace(c, node_free=())])
    assert victims(plan) == [5]
    # Where no set surely packs, nobody is evicted: an eviction the job could not start in would only
    # lead to more when its hold expires.
    small = [running(i, "b", "c", "batch", gpu=2 * GPU) for i in range(1, 9)]
    two_nodes = replace(cluster("c", small, gpu=16 * GPU, largest=res(gpu=0)), node_free=({G: 0},) * 2)
    plan = run([head(10, "a", "critical", gpu=8 * GPU)], small, [two_nodes])
    assert plan.preemptions == [] and plan.waits[10].startswith("no cluster fits")
    # On one node, all the victims free is there: four 2-GPU jobs make room for the 8-GPU pod.
    one_node = replace(cluster("c", small[:4], gpu=8 * GPU, largest=res(gpu=0)), node_free=({G: 0},))
    assert victims(run([head(10, "a", "critical", gpu=8 * GPU)], small[:4], [one_node])) == [1, 2, 3, 4]


def test_victims_on_one_named_node_free_it_together_for_a_pod_none_of_them_holds():
    # Two full 8-GPU nodes, four 2-GPU batch jobs on each. Where the cluster names its nodes and the jobs say
    # which they run on, the four on one node free it whole for the 8-GPU pod, though none alone holds it.
    small = [replace(running(i, "b", "c", "batch", gpu=2 * GPU), nodes=(("n0" if i <= 4 else "n1", res(gpu=2 * GPU)),))
             for i in range(1, 9)]
    c = replace(cluster("c", small, gpu=16 * GPU, largest=res(gpu=0)), node_free=({G: 0},) * 2,
                node_names=("n0", "n1"))
    plan = run([head(10, "a", "critical", gpu=8 * GPU), head(11, "a", "standard", gpu=GPU)], small, [c])
    assert victims(plan) == [1, 2, 3, 4]
    # The room they give back is on n0, and the hold keeps it there: the 1-GPU job finds none.
    assert plan.holds[10].kind == "preemption" and 11 not in placed(plan)
    # Two on each node, beside a job that may not be evicted: no node can be freed, so nobody is evicted.
    mixed = [replace(running(i, "b", "c", "batch", gpu=2 * GPU), nodes=(("n0" if i <= 2 else "n1", res(gpu=2 * GPU)),))
             for i in range(1, 5)]
    mixed += [replace(running(i, "s", "c", "standard", gpu=4 * GPU), nodes=((node, res(gpu=4 * GPU)),))
              for i, node in ((5, "n0"), (6, "n1"))]
    c = replace(cluster("c", mixed, gpu=16 * GPU, largest=res(gpu=0)), node_free=({G: 0},) * 2,
                node_names=("n0", "n1"))
    plan = run([head(10, "a", "critical", gpu=8 * GPU)], mixed, [c])
    assert plan.preemptions == []
    # A victim on a node the cluster does not name counts as before: only its own pod's room.
    c = replace(cluster("c", small, gpu=16 * GPU, largest=res(gpu=0)), node_free=({G: 0},) * 2,
                node_names=("m0", "m1"))
    assert run([head(10, "a", "critical", gpu=8 * GPU)], small, [c]).preemptions == []


def test_reclaim_counts_on_named_nodes_while_a_hold_keeps_more_than_is_free():
    # Four 8-GPU nodes: b's 8-GPU jobs fill n0 to n2 and 4 GPUs of n3; b's job 9 has reserved 16 GPUs, more than
    # the 4 free, which leaves every node of the view below zero. a, below its guarantee, must evict three of
    # b's jobs (the 12 GPUs the hold still needs and 8 for its own pod) and finds them node by node.
    queues = [QueueQuota("a", guaranteed=res(gpu=8 * GPU)), QueueQuota("b", guaranteed=res(gpu=4 * GPU))]
    act = [replace(running(i, "b", "c", gpu=8 * GPU), nodes=((f"n{i - 1}", res(gpu=8 * GPU)),)) for i in (1, 2, 3)]
    act.append(replace(running(4, "b", "c", gpu=4 * GPU), nodes=(("n3", res(gpu=4 * GPU)),)))
    c = replace(cluster("c", act, gpu=32 * GPU, largest=res(gpu=4 * GPU)),
                node_free=({G: 0},) * 3 + ({G: 4 * GPU},), node_names=("n0", "n1", "n2", "n3"))
    hold = Hold(9, "c", res(gpu=16 * GPU), "reservation", NOW - 60, pods=((2, res(gpu=8 * GPU)),))
    plan = run([head(9, "b", "big", waited=900, gpu=8 * GPU), head(10, "a", gpu=8 * GPU)], act, [c],
               queues=queues, holds={9: hold})
    assert victims(plan) == [1, 2, 3] and plan.holds[10].kind == "preemption"


def test_room_held_for_a_gang_is_kept_on_the_nodes_its_pods_would_take():
    # Job 10's victims freed four whole 8-GPU nodes for its four 8-GPU pods; 8 more GPUs are free, 4 on
    # each of two nodes. Job 11 (one 8-GPU pod) must not take one of the held nodes.
    nodes = ({G: 8 * GPU},) * 4 + ({G: 4 * GPU},) * 2
    c = replace(cluster("c", gpu=64 * GPU, largest=res(gpu=8 * GPU)), free=res(gpu=40 * GPU), node_free=nodes)
    hold = Hold(10, "c", res(gpu=32 * GPU), "preemption", NOW - 5, (3,), pods=((4, res(gpu=8 * GPU)),))
    gang = head(10, "a", pods=4, gpu=8 * GPU)
    plan = run([head(11, "b", priority=5, gpu=8 * GPU), gang], clusters=[c], holds={10: hold})
    assert placed(plan) == {10: "c"}
    assert plan.waits[11].startswith("reserved capacity for job 10")


def test_a_reservation_whose_pods_fit_no_node_yet_keeps_the_nodes_nearest_to_holding_them():
    # Four 8-GPU nodes with 6, 5, 7 and 4 GPUs free; job 10 has reserved room for two 8-GPU pods. Neither
    # fits a node now; the hold keeps what is free on the two nodes nearest to holding one (7 and 6), so
    # that what ends there is kept for it. A 6-GPU job would only fit one of them; a 4-GPU job fits the rest.
    nodes = ({G: 6 * GPU}, {G: 5 * GPU}, {G: 7 * GPU}, {G: 4 * GPU})
    c = replace(cluster("c", gpu=32 * GPU, largest=res(gpu=7 * GPU)), free=res(gpu=22 * GPU), node_free=nodes)
    hold = Hold(10, "c", res(gpu=16 * GPU), "reservation", NOW - 5, pods=((2, res(gpu=8 * GPU)),))
    gang = head(10, "a", priority=0, gpu=8 * GPU)
    gang = replace(gang, job=replace(gang.job, requests=res(gpu=16 * GPU), pods=((2, res(gpu=8 * GPU)),)))
    plan = run([gang, head(11, "b", priority=5, gpu=6 * GPU), head(12, "b", priority=4, gpu=4 * GPU)],
               clusters=[c], holds={10: hold})
    assert placed(plan) == {12: "c"}
    assert plan.waits[11].startswith("reserved capacity for job 10")
    assert plan.waits[10].startswith("reserved capacity on c")


def test_a_reservation_holder_that_finds_no_victims_keeps_its_reservation():
    act = [running(1, "b", "c", "standard", cpu=12 * CPU)]
    reservation = Hold(10, "c", res(cpu=16 * CPU), "reservation", NOW - 300)
    plan = run([head(10, "a", "critical", cpu=16 * CPU)], act, [cluster("c", act, cpu=16 * CPU)],
               holds={10: reservation})
    assert plan.preemptions == [] and plan.holds == {10: reservation}
    assert plan.waits == {10: "reserved capacity on c: waiting for room"}


def test_a_reservation_holder_evicts_for_room_that_no_other_hold_keeps():
    # Job 11's younger reservation keeps 8 of c2's cpu: job 10 gives up its own reservation on c1 to
    # preempt on c2 only where that leaves 11's room alone.
    act = [running(1, "b", "c2", "batch", cpu=8 * CPU), running(2, "b", "c2", "batch", cpu=8 * CPU)]
    holds = {10: Hold(10, "c1", res(cpu=8 * CPU), "reservation", NOW - 300),
             11: Hold(11, "c2", res(cpu=8 * CPU), "reservation", NOW - 100)}
    clusters = [cluster("c1", cpu=4 * CPU), cluster("c2", act, cpu=16 * CPU)]
    plan = run([head(10, "a", "critical", cpu=8 * CPU), head(11, "x", cpu=8 * CPU)], act, clusters, holds=holds)
    assert victims(plan) == [1, 2]
    assert plan.holds[10] == Hold(10, "c2", res(cpu=8 * CPU), "preemption", NOW, (2, 1))
    assert plan.holds[11] == holds[11]


def test_a_reservation_holder_within_its_guarantee_still_reclaims_from_a_borrower():
    act = [running(1, "b", "c", cpu=8 * CPU), running(2, "b", "c", cpu=8 * CPU)]
    reservation = Hold(10, "c", res(cpu=8 * CPU), "reservation", NOW - 300)
    plan = run([head(10, "a", cpu=8 * CPU)], act, [cluster("c", act, cpu=16 * CPU)], reclaim_queues(),
               holds={10: reservation})
    assert victims(plan) == [2]
    assert plan.holds[10].kind == "preemption" and plan.holds[10].victims == (2,)


# -- reclaim -----------------------------------------------------------------------------------------

def reclaim_queues(a_guaranteed: int = 8, b_guaranteed: int = 4) -> list[QueueQuota]:
    return [QueueQuota("a", guaranteed=res(cpu=a_guaranteed * CPU), max=res(cpu=16 * CPU)),
            QueueQuota("b", guaranteed=res(cpu=b_guaranteed * CPU), max=res(cpu=16 * CPU)),
            QueueQuota("c", guaranteed=res(cpu=8 * CPU), max=res(cpu=16 * CPU))]


def test_a_queue_within_its_guarantee_reclaims_from_a_borrower_even_of_a_higher_class():
    act = [running(1, "b", "c", "critical", cpu=8 * CPU), running(2, "b", "c", "standard", cpu=8 * CPU)]
    plan = run([head(10, "a", "batch", cpu=8 * CPU)], act, [cluster("c", act, cpu=16 * CPU)], reclaim_queues())
    assert len(plan.preemptions) == 1 and plan.preemptions[0].by == 10
    victim = plan.preemptions[0].victim
    assert plan.holds == {10: Hold(10, "c", res(cpu=8 * CPU), "preemption", NOW, (victim,))}
    assert plan.waits == {10: f"preempting jobs {victim} on c"}


def test_reclaim_takes_from_a_queue_no_more_than_it_borrows():
    act = [running(1, "c", "x", cpu=8 * CPU), running(2, "b", "x", cpu=4 * CPU), running(3, "b", "x", cpu=4 * CPU)]
    plan = run([head(10, "a", cpu=4 * CPU)], act, [cluster("x", act, cpu=16 * CPU)], reclaim_queues())
    assert victims(plan) == [3]  # b borrows 4 (the younger job), c uses only its own 8
    # 8 cpu would take b below its guarantee of 4: no reclaim, though evicting both would make room.
    plan = run([head(10, "a", cpu=8 * CPU)], act, [cluster("x", act, cpu=16 * CPU)], reclaim_queues())
    assert plan.preemptions == [] and plan.waits == {10: "no cluster fits: x: needs 8 cpu, 0 free"}


def test_reclaim_never_takes_from_the_reclaiming_queue_itself():
    # a is within its cpu guarantee but borrows memory: its own jobs are still not evicted for it.
    queues = [QueueQuota("a", guaranteed=res(cpu=32 * CPU, memory=0))]
    act = [running(1, "a", "x", cpu=8 * CPU, memory=GI), running(2, "a", "x", cpu=8 * CPU)]
    plan = run([head(10, "a", cpu=8 * CPU)], act, [cluster("x", act, cpu=16 * CPU, memory=64 * GI)], queues)
    assert plan.preemptions == []


def test_a_job_that_would_exceed_its_guarantee_does_not_reclaim():
    act = [running(1, "b", "x", cpu=16 * CPU)]
    plan = run([head(10, "a", cpu=12 * CPU)], act, [cluster("x", act, cpu=16 * CPU)], reclaim_queues())
    assert plan.preemptions == []
    assert plan.waits == {10: "no cluster fits: x: needs 12 cpu, 0 free"}
    used = [running(2, "a", "y", cpu=4 * CPU)]
    plan = run([head(10, "a", cpu=8 * CPU)], act + used,
               [cluster("x", act, cpu=16 * CPU), cluster("y", used, cpu=4 * CPU)],
               reclaim_queues())
    assert plan.preemptions == []


def test_a_reclaimer_within_its_guarantee_gets_the_parents_max_back_from_a_borrowing_sibling():
    # research may use 16 gpu; nlp (guaranteed 8) borrowed all of them while vision was idle.
    queues = research(research_max=16)
    act = [running(1, "nlp", "c", gpu=8 * GPU), running(2, "nlp", "c", gpu=4 * GPU),
           running(3, "nlp", "c", gpu=4 * GPU)]
    plan = run([head(10, "vision", gpu=8 * GPU), head(11, "nlp", gpu=4 * GPU)], act,
               [cluster("c", act, gpu=32 * GPU)], queues)
    assert [p.by for p in plan.preemptions] == [10]
    assert victims(plan) == [1]
    assert plan.waits[10] == "preempting jobs 1 on c"
    # The quota freed is held for vision: nlp's next job may not take it back in the meantime.
    assert plan.waits[11] == ("queue research (parent of nlp): nvidia.com/gpu 16/16 in use "
                              "(guaranteed 16, max 16)")
    # Next cycle, job 1 has stopped and is queued again: vision starts, nlp waits for the max.
    act = act[1:]
    nxt = run([head(10, "vision", gpu=8 * GPU), head(1, "nlp", preempted_by=10, gpu=8 * GPU)], act,
              [cluster("c", act, gpu=32 * GPU)], queues, holds=plan.holds)
    assert placed(nxt) == {10: "c"} and nxt.preemptions == [] and nxt.holds == {}
    assert nxt.waits[1].startswith("queue research (parent of nlp): nvidia.com/gpu 16/16 in use")


def borrower_scene(a_guaranteed: int = 8):
    """On x (16 cpu, 4 free): b, guaranteed 4, borrows 1 with a 1-cpu and a 4-cpu job; c uses 7 of its 8."""
    queues = [QueueQuota("a", guaranteed=res(cpu=a_guaranteed * CPU)), QueueQuota("b", guaranteed=res(cpu=4 * CPU)),
              QueueQuota("c", guaranteed=res(cpu=8 * CPU))]
    act = [running(1, "b", "x", cpu=1 * CPU), running(2, "b", "x", cpu=4 * CPU), running(3, "c", "x", cpu=7 * CPU)]
    return queues, act, [cluster("x", act, cpu=16 * CPU)]


def test_a_job_its_guarantee_holds_whole_may_take_a_borrowers_last_job_into_its_guarantee():
    # b borrows only 1 cpu, with jobs of 1 and 4: its 4-cpu job is the one whose room lets a's 8-cpu job
    # start, and a stays within its guarantee of 8. b is left 3 below its guarantee: less than that job.
    queues, act, clusters = borrower_scene()
    plan = run([head(10, "a", cpu=8 * CPU)], act, clusters, queues)
    assert victims(plan) == [2] and plan.waits[10] == "preempting jobs 2 on x"


def test_a_job_that_would_take_its_queue_past_its_guarantee_takes_only_what_others_borrow():
    queues, act, clusters = borrower_scene(a_guaranteed=6)
    plan = run([head(10, "a", cpu=8 * CPU)], act, clusters, queues)
    assert plan.preemptions == [] and plan.waits[10] == "no cluster fits: x: needs 8 cpu, 4 free"


def test_reclaim_never_takes_more_from_guarantees_than_the_job_adds_to_its_own():
    # a's 2-cpu job would start by evicting b's 4-cpu job, 3 of which are b's guaranteed part: more than
    # the 2 a gains. A round of such reclaims could go on for ever; this one waits.
    queues, act, _ = borrower_scene()
    full = [cluster("x", act, cpu=12 * CPU)]
    plan = run([head(10, "a", cpu=2 * CPU)], act, full, queues)
    assert plan.preemptions == [] and plan.waits[10] == "no cluster fits: x: needs 2 cpu, 0 free"
    # Nor as much: 3 of b's cpu for 3 of a's only moves the shortfall from b to a, in what b borrowed.
    assert run([head(10, "a", cpu=3 * CPU)], act, full, queues).preemptions == []
    assert victims(run([head(10, "a", cpu=4 * CPU)], act, full, queues)) == [2]
    # Nor both of a borrower's jobs: a's 6-cpu job would start with both of b's gone (1 cpu free), but b
    # borrows 1 cpu, so whichever of them went last, b borrowed nothing before it.
    plan = run([head(10, "a", cpu=6 * CPU)], act, [cluster("x", act, cpu=13 * CPU)], queues)
    assert plan.preemptions == [] and plan.waits[10] == "no cluster fits: x: needs 6 cpu, 1 free"


def test_a_borrower_of_cpu_alone_gives_its_last_job_up_memory_and_all():
    # b borrows 1 cpu and no memory; its 4-cpu job takes 2 GiB of b's guaranteed memory with it. a's job
    # adds 6 cpu and 2 GiB to a's guaranteed use: no less than it takes from b's, in either resource.
    queues = [QueueQuota("a", guaranteed=res(cpu=8 * CPU, memory=8 * GI)),
              QueueQuota("b", guaranteed=res(cpu=4 * CPU, memory=8 * GI))]
    act = [running(1, "b", "x", cpu=1 * CPU, memory=GI), running(2, "b", "x", cpu=4 * CPU, memory=2 * GI)]
    x = cluster("x", act, cpu=8 * CPU, memory=16 * GI)
    assert victims(run([head(10, "a", cpu=6 * CPU, memory=2 * GI)], act, [x], queues)) == [2]
    # Asking less memory than the victim frees of b's guarantee, it waits.
    assert run([head(10, "a", cpu=6 * CPU, memory=GI)], act, [x], queues).preemptions == []


def test_a_guarantee_that_does_not_name_memory_still_reclaims_for_a_job_asking_memory():
    queues = [QueueQuota("a", guaranteed=res(cpu=6 * CPU)), QueueQuota("b")]
    act = [running(1, "b", "x", cpu=4 * CPU, memory=4 * GI), running(2, "b", "x", cpu=4 * CPU, memory=4 * GI)]
    plan = run([head(10, "a", cpu=2 * CPU, memory=GI)], act, [cluster("x", act, cpu=8 * CPU, memory=16 * GI)],
               queues)
    assert victims(plan) == [2]
    assert plan.holds[10] == Hold(10, "x", res(cpu=2 * CPU, memory=GI), "preemption", NOW, (2,))


def test_a_queue_using_only_what_its_guarantee_does_not_name_is_not_reclaimed_from():
    queues = [QueueQuota("a", guaranteed=res(cpu=6 * CPU)), QueueQuota("b", guaranteed=res(cpu=8 * CPU))]
    act = [running(1, "b", "x", cpu=8 * CPU, memory=8 * GI)]
    plan = run([head(10, "a", cpu=2 * CPU, memory=GI)], act, [cluster("x", act, cpu=8 * CPU, memory=16 * GI)],
               queues)
    assert plan.preemptions == []


# -- invariants over random inputs -------------------------------------------------------------------

RESOURCES = ("cpu", G)
amounts = st.integers(0, 4).map(lambda n: n * 1000)
def _requests(cpu: int, gpu: int):
    return st.fixed_dictionaries({"cpu": st.integers(0, cpu).map(lambda n: n * 1000)},
                                 optional={G: st.integers(0, gpu).map(lambda n: n * 1000)})


running_requests = _requests(4, 2)
queued_requests = _requests(8, 3)  # often more than one running job frees
classes_st = st.fixed_dictionaries({
    name: st.builds(ClassPolicy, st.just(name), st.just(prio), st.booleans(), st.booleans(),
                    st.sampled_from((0.5, 1.0, 2.0)), st.sampled_from((None, 0.0, 300.0)))
    for name, prio in (("hi", 100), ("mid", 50), ("lo", 10), ("lo2", 10))})
labels_st = st.sampled_from(({}, {}, {"gpu": "a"}, {"gpu": "b"}))
selector_st = st.sampled_from(({}, {}, {}, {"gpu": "a"}))
tiers_st = st.sampled_from(((), (), (), ("onprem",), ("cloud",)))
often = st.sampled_from((True, True, True, False))


@st.composite
def scenes(draw):
    """Random queues (a tree with guarantees and maxima), classes, clusters, active attempts that respect
    every maximum and fit their clusters, queued heads in store order, and holds from a previous cycle."""
    classes = draw(classes_st)
    queues: list[QueueQuota] = []
    for n in range(draw(st.integers(1, 5))):
        parent = draw(st.sampled_from([None] + [q.name for q in queues]))
        guaranteed = {r: draw(st.integers(0, 8)) * 1000 for r in RESOURCES if draw(often)}
        maximum = {r: guaranteed.get(r, 0) + draw(st.integers(0, 24)) * 1000 for r in RESOURCES if draw(st.booleans())}
        queues.append(QueueQuota(f"q{n}", parent, guaranteed, maximum, draw(st.sampled_from((0.5, 1.0, 2.0)))))
    names = [q.name for q in queues]
    shells = []
    for n in range(draw(st.integers(1, 3))):
        alloc = {"cpu": draw(st.integers(0, 12)) * 1000, G: draw(st.integers(0, 4)) * 1000}
        shells.append((f"c{n}", draw(st.sampled_from(("onprem", "cloud"))), draw(labels_st), alloc,
                       draw(st.sampled_from(("", "", "", "unreachable")))))
    # Active attempts: accepted only where they fit their cluster and every maximum on their path.
    tree = QuotaTree(queues, {})
    room = {name: dict(alloc) for name, _, _, alloc, _ in shells}
    active: list[Active] = []
    for n in range(draw(st.integers(0, 16))):
        queue, cls = draw(st.sampled_from(names)), draw(st.sampled_from(sorted(classes)))
        where, requests = draw(st.sampled_from(sorted(room))), draw(running_requests)
        if all(v <= room[where].get(r, 0) for r, v in requests.items()) and tree.over_max(queue, requests) is None:
            tree.charge(queue, requests)
            room[where] = {r: room[where].get(r, 0) - requests.get(r, 0) for r in room[where]}
            active.append(Active(1 + n, queue, cls, classes[cls].priority, draw(st.integers(0, 2)), where, requests,
                                 classes[cls].preemptible))
    clusters = []
    for name, tier, labels, alloc, unavailable in shells:
        # What metrics show free may be less than allocatable less the active attempts (other usage).
        free = {r: v - draw(st.sampled_from((0, 0, 0, 1000))) for r, v in room[name].items()}
        largest = {r: v if draw(st.booleans()) else v // 2 for r, v in free.items()}
        clusters.append(ClusterState(name, tier, "dc1", labels, free, largest, unavailable, alloc))
    candidates = []
    for n in range(draw(st.integers(0, 12))):
        cls = draw(st.sampled_from(sorted(classes)))
        requests = draw(queued_requests)
        pods = draw(st.integers(1, 2))
        largest = {r: -(-v // pods) for r, v in requests.items()}
        job = QueuedJob(100 + n, requests, largest, draw(selector_st), draw(tiers_st))
        preempted_by = draw(st.sampled_from([None] + [a.job_id for a in active])) if active else None
        candidates.append(Candidate(job, draw(st.sampled_from(names)), cls, classes[cls].priority,
                                    draw(st.integers(0, 2)), draw(st.sampled_from((0.0, 1000.0))), preempted_by))
    holds = {}
    for job_id in draw(st.lists(st.sampled_from([c.job.id for c in candidates] + [999]), max_size=3, unique=True)):
        requests = next((c.job.requests for c in candidates if c.job.id == job_id), {"cpu": 1000})
        kind = draw(st.sampled_from(("reservation", "preemption")))
        since = NOW - draw(st.sampled_from((1.0, PREEMPTION_HOLD_S + 1)))
        holds[job_id] = Hold(job_id, draw(st.sampled_from([c.name for c in clusters] + ["gone"])), requests, kind,
                             since, (1,) if kind == "preemption" else ())
    return queues, classes, clusters, active, candidates, holds


def _usage_after(queues, active, candidates, plan) -> QuotaTree:
    tree = QuotaTree(queues, {})
    evicted = {p.victim for p in plan.preemptions}
    for a in active:
        if a.job_id not in evicted:
            tree.charge(a.queue, a.requests)
    by_id = {c.job.id: c for c in candidates}
    for p in plan.places:
        tree.charge(by_id[p.job_id].queue, by_id[p.job_id].job.requests)
    return tree


def allowed_on(job: QueuedJob, c: ClusterState) -> bool:
    return ((not job.tiers or c.tier in job.tiers) and (not job.sites or c.site in job.sites)
            and all(c.labels.get(k) == v for k, v in job.cluster_selector.items()))


def check_never_above_any_queues_max(queues, active, candidates, plan):
    tree = _usage_after(queues, active, candidates, plan)
    for q in queues:
        for r, limit in q.max.items():
            assert tree.used(q.name).get(r, 0) <= limit, (q.name, r)


def check_never_above_a_clusters_capacity(clusters, active, candidates, plan):
    by_id = {c.job.id: c for c in candidates}
    evicted = {a.job_id: a for a in active if a.job_id in {p.victim for p in plan.preemptions}}
    for c in clusters:
        used: dict[str, int] = {}
        for p in plan.places:
            if p.cluster == c.name:
                for r, v in by_id[p.job_id].job.requests.items():
                    used[r] = used.get(r, 0) + v
        freed: dict[str, int] = {}
        for p in plan.preemptions:
            if p.cluster == c.name:
                for r, v in evicted[p.victim].requests.items():
                    freed[r] = freed.get(r, 0) + v
        for r, total in used.items():
            if total > 0:
                assert total <= c.free.get(r, 0) + freed.get(r, 0), (c.name, r)
                if not freed:
                    assert total <= c.free.get(r, 0), (c.name, r)


def check_every_candidate_gets_exactly_one_outcome(candidates, plan):
    ids = [c.job.id for c in candidates]
    placed_ids = [p.job_id for p in plan.places]
    assert len(placed_ids) == len(set(placed_ids))
    assert not set(placed_ids) & set(plan.waits)
    assert set(placed_ids) | set(plan.waits) == set(ids)
    assert all(isinstance(r, str) and r for r in plan.waits.values())
    for p in plan.preemptions:  # a preemptor in waiting also has its wait reason
        assert p.by in plan.waits and plan.waits[p.by].startswith("preempting jobs ")


def check_placed_jobs_go_to_one_cluster_they_allow(clusters, candidates, plan):
    by_name = {c.name: c for c in clusters}
    by_id = {c.job.id: c for c in candidates}
    for p in plan.places:
        assert isinstance(p, Place)
        c = by_name[p.cluster]
        assert not c.unavailable and allowed_on(by_id[p.job_id].job, c)


def check_preemptions_are_sound(classes, active, candidates, plan):
    by_id = {c.job.id: c for c in candidates}
    running_on = {a.job_id: a for a in active}
    preemptors = {p.by for p in plan.preemptions}
    evicted = [p.victim for p in plan.preemptions]
    assert len(evicted) == len(set(evicted))
    assert not preemptors & set(evicted)
    assert preemptors <= set(by_id) and not preemptors & set(placed(plan))
    for p in plan.preemptions:
        victim, by = running_on[p.victim], by_id[p.by]
        assert victim.cluster == p.cluster
        assert victim.job_id != by.preempted_by
        by_class = (victim.preemptible and victim.class_priority < by.class_priority
                    and classes[by.service_class].can_preempt)
        assert by_class or victim.queue != by.queue
        hold = plan.holds[p.by]
        assert hold.kind == "preemption" and hold.cluster == p.cluster and p.victim in hold.victims


def check_reclaim_takes_what_is_borrowed_or_a_borrowers_last_job(queues, classes, active, candidates, plan):
    by_id, running_on = {c.job.id: c for c in candidates}, {a.job_id: a for a in active}
    tree = QuotaTree(queues, {})  # a queue's use is its own jobs' and its descendants'
    for a in active:
        tree.charge(a.queue, a.requests)
    # What a queue placed this cycle, or holds by preemption (counted in its quota), may be borrowed too.
    for job_id in [p.job_id for p in plan.places] + [i for i, h in plan.holds.items() if h.kind == "preemption"]:
        tree.charge(by_id[job_id].queue, by_id[job_id].job.requests)
    taken: dict[str, dict[str, int]] = {}
    for p in plan.preemptions:
        victim, by = running_on[p.victim], by_id[p.by]
        if not (victim.preemptible and victim.class_priority < by.class_priority
                and classes[by.service_class].can_preempt):
            taken[victim.queue] = add(taken.get(victim.queue, {}), victim.requests)
    for queue, amounts in taken.items():  # into its guarantee only with some of what it borrowed
        borrowed = tree.borrowed(queue)
        if borrowed is not None and any(amounts.get(r, 0) > most for r, most in borrowed.items()):
            assert any(most > 0 and amounts.get(r, 0) > 0 for r, most in borrowed.items()), queue


def check_holds_belong_to_waiting_jobs(clusters, plan):
    names = {c.name for c in clusters}
    for job_id, hold in plan.holds.items():
        assert hold.job_id == job_id and job_id in plan.waits and hold.cluster in names
        assert hold.kind in ("reservation", "preemption")
        if hold.kind == "preemption":
            assert NOW - hold.since < PREEMPTION_HOLD_S
        else:
            assert plan.waits[job_id].startswith(("reserved capacity", "holding capacity"))


def check_quota_reasons_name_a_queue_on_the_path(queues, candidates, plan):
    tree = QuotaTree(queues, {})
    for c in candidates:
        reason = plan.waits.get(c.job.id, "")
        if reason.startswith("queue "):
            name = reason.split()[1].rstrip(":")
            assert name in tree.path(c.queue)
            assert reason.startswith(f"queue {name}: " if name == c.queue else f"queue {name} (parent of {c.queue}): ")


@st.composite
def reclaim_scenes(draw):
    """One cluster full of jobs of queues with guarantees, some borrowing with jobs larger than what they
    borrow, and jobs of every queue waiting: where reclaim has the most to do."""
    guarantees = draw(st.lists(st.integers(1, 8), min_size=2, max_size=4))
    queues = [QueueQuota(f"q{n}", None, {"cpu": g * CPU}) for n, g in enumerate(guarantees)]
    names = [q.name for q in queues]
    capacity = (sum(guarantees) + draw(st.integers(0, 2))) * CPU  # guarantees that nearly fill it
    active, used = [], 0
    for n, size in enumerate(draw(st.lists(st.integers(1, 8), max_size=12))):
        size = min(size * CPU, capacity - used)  # the last one fills it
        if size > 0:
            used += size
            active.append(Active(1 + n, draw(st.sampled_from(names)), "std", 0, 0, "c", {"cpu": size}))
    free = {"cpu": capacity - used}
    c = ClusterState("c", "onprem", "dc1", {}, free, free, "", {"cpu": capacity})
    candidates = [Candidate(QueuedJob(100 + n, {"cpu": size * CPU}, {"cpu": size * CPU}), queue, "std", 0, 0)
                  for n, (queue, size) in enumerate(draw(st.lists(st.tuples(st.sampled_from(names),
                                                                              st.integers(1, 8)), max_size=10)))]
    return queues, {"std": ClassPolicy("std")}, [c], active, candidates, {}


@settings(max_examples=150, deadline=None)
@given(st.one_of(scenes(), reclaim_scenes()))
def test_plan_invariants_over_random_queues_clusters_and_jobs(scene):
    queues, classes, clusters, active, candidates, holds = scene
    before = repr(scene)
    plan = plan_cycle(heads_of(candidates), active, clusters, queues, classes, holds, NOW)
    assert repr(scene) == before
    check_never_above_any_queues_max(queues, active, candidates, plan)
    check_never_above_a_clusters_capacity(clusters, active, candidates, plan)
    check_every_candidate_gets_exactly_one_outcome(candidates, plan)
    check_placed_jobs_go_to_one_cluster_they_allow(clusters, candidates, plan)
    check_preemptions_are_sound(classes, active, candidates, plan)
    check_reclaim_takes_what_is_borrowed_or_a_borrowers_last_job(queues, classes, active, candidates, plan)
    check_holds_belong_to_waiting_jobs(clusters, plan)
    check_quota_reasons_name_a_queue_on_the_path(queues, candidates, plan)


@st.composite
def borrowed_scenes(draw):
    """Queue a is below its guarantee; the cluster it needs is full of queue b's jobs and b borrows
    (uses more than its guarantee). Both may sit under a parent whose maximum b's borrowing filled."""
    classes = draw(classes_st)
    job_cpu = draw(st.integers(1, 8)) * 1000
    alloc = draw(st.integers(job_cpu // 1000, 16)) * 1000
    # b's jobs fill the cluster; a little may stay free, never enough for a's job.
    free_x = draw(st.integers(0, job_cpu // 1000 - 1)) * 1000
    b_jobs, used = [], 0
    while used < alloc - free_x:
        size = min(draw(st.integers(1, 6)) * 1000, alloc - free_x - used)
        cls = draw(st.sampled_from(sorted(classes)))
        b_jobs.append(Active(len(b_jobs) + 1, "b", cls, classes[cls].priority, draw(st.integers(0, 2)), "x",
                             {"cpu": size}, classes[cls].preemptible))
        used += size
    b_guaranteed = draw(st.integers(0, max(0, used // 1000 - 1))) * 1000
    a_used = draw(st.integers(0, 4)) * 1000  # elsewhere, on a full cluster
    a_guaranteed = a_used + job_cpu + draw(st.integers(0, 4)) * 1000
    capped = draw(st.booleans())
    # A parent's maximum covers its children's guarantees; b may have filled it by borrowing.
    parent_max = {"cpu": a_guaranteed + b_guaranteed + draw(st.integers(0, 2)) * 1000} if capped else {}
    parent_max = {"cpu": max(parent_max["cpu"], a_used + used)} if capped else {}
    queues = [QueueQuota("org", max=parent_max),
              QueueQuota("a", "org", {"cpu": a_guaranteed}, {"cpu": a_guaranteed + draw(amounts)}),
              QueueQuota("b", "org", {"cpu": b_guaranteed}, {}),
              QueueQuota("other", None, {"cpu": 4000}, {})]
    active = list(b_jobs)
    if a_used:
        cls = draw(st.sampled_from(sorted(classes)))
        active.append(Active(100, "a", cls, classes[cls].priority, 0, "y", {"cpu": a_used}, classes[cls].preemptible))
    clusters = [ClusterState("x", "onprem", "dc1", {}, {"cpu": free_x}, {"cpu": free_x}, "", {"cpu": alloc}),
                ClusterState("y", "onprem", "dc1", {}, {"cpu": 0}, {"cpu": 0}, "", {"cpu": a_used})]
    cls = draw(st.sampled_from(sorted(classes)))
    me = Candidate(QueuedJob(500, {"cpu": job_cpu}, {"cpu": job_cpu}), "a", cls, classes[cls].priority,
                   draw(st.integers(0, 2)), draw(st.sampled_from((0.0, 1000.0))),
                   draw(st.sampled_from((None, 100))))
    return queues, classes, clusters, active, me


@settings(max_examples=120, deadline=None)
@given(borrowed_scenes())
def test_a_queue_below_its_guarantee_gets_room_back_wherever_borrowed_jobs_make_it(scene):
    queues, classes, clusters, active, me = scene
    tree = QuotaTree(queues, {})
    for a in active:
        tree.charge(a.queue, a.requests)
    assert tree.below_guarantee("a", me.job.requests) and tree.borrowing("b")
    # Only scenes where some of b's jobs on x, taking no more than b borrows, free the room (and the
    # parent's quota) a's job needs: reclaim never takes a queue below its guarantee.
    org_max = queues[0].max.get("cpu")
    over = tree.used("org").get("cpu", 0) + me.job.requests["cpu"] - org_max if org_max is not None else 0
    needed = max(me.job.requests["cpu"] - clusters[0].free["cpu"], over)
    sums = {0}
    for a in active:
        if a.queue == "b" and a.job_id != me.preempted_by:
            sums |= {s + a.requests["cpu"] for s in sums if s + a.requests["cpu"] <= tree.borrowed("b")["cpu"]}
    assume(any(s >= needed for s in sums))
    plan = plan_cycle({"a": [me]}, active, clusters, queues, classes, {}, NOW)
    mine = [p for p in plan.preemptions if p.by == me.job.id]
    assert me.job.id in placed(plan) or mine, plan.waits
    assert all(p.victim != me.preempted_by for p in mine)
    queue_of = {a.job_id: a.queue for a in active}
    # It takes b's borrowed room on x, unless its class may preempt and found fewer victims of its own.
    assert (me.job.id in placed(plan) or all(queue_of[p.victim] == "b" and p.cluster == "x" for p in mine)
            or classes[me.service_class].can_preempt)
    check_never_above_any_queues_max(queues, active, [me], plan)


def test_a_reservation_lets_in_only_what_does_not_delay_it_as_easy_backfill_does():
    """10 cpu; 6 run until NOW+100 (their maxRuntime). The reserved 7-cpu job starts then, with 3 cpu to
    spare: a 2-cpu job that ends by then (maxRuntime 50) starts now, one of 1 cpu takes spare room for as
    long as it likes, and then one more of 1 cpu would delay the reserved job: it waits."""
    x = ClusterState("x", "onprem", "dc1", {}, {"cpu": 4 * CPU}, {"cpu": 4 * CPU}, "", {"cpu": 10 * CPU})
    running = [Active(1, "a", "big", 50, 0, "x", {"cpu": 6 * CPU}, ends_at=NOW + 100)]
    big = Candidate(QueuedJob(10, {"cpu": 7 * CPU}, {"cpu": 7 * CPU}), "a", "big", 50, 0, waited_s=700)
    short = Candidate(QueuedJob(11, {"cpu": 2 * CPU}, {"cpu": 2 * CPU}, max_runtime_s=50), "b", "big", 50, 0)
    spare = Candidate(QueuedJob(12, {"cpu": 1 * CPU}, {"cpu": 1 * CPU}, max_runtime_s=5000), "c", "big", 50, 0)
    long = Candidate(QueuedJob(13, {"cpu": 1 * CPU}, {"cpu": 1 * CPU}, max_runtime_s=500), "d", "big", 50, 0)
    first = plan_cycle({"a": [big]}, running, [x], [QueueQuota(q) for q in "abcd"], CLASSES, {}, NOW)
    hold = first.holds[10]
    assert hold.kind == "reservation" and hold.starts_by == NOW + 100 and hold.short == {"cpu": CPU}
    plan = plan_cycle({"a": [big], "b": [short], "c": [spare], "d": [long]}, running, [x],
                      [QueueQuota(q) for q in "abcd"], CLASSES, first.holds, NOW + 1)
    assert {p.job_id for p in plan.places} == {11, 12}
    assert "reserved capacity for job 10" in plan.waits[13]
    # Without an expected end for what runs, the reservation keeps all its room, as before.
    unknown = [replace(running[0], ends_at=None)]
    plan = plan_cycle({"a": [big], "b": [short], "c": [spare], "d": [long]}, unknown, [x],
                      [QueueQuota(q) for q in "abcd"], CLASSES, first.holds, NOW + 1)
    assert plan.places == []


def test_an_interactive_session_is_never_evicted_and_comes_before_batch_work_of_its_class():
    from dataclasses import replace

    from dispatcher.policy.sessions import order_priority
    session = replace(running(2, "b", "c", "batch", priority=order_priority(0, True), cpu=8 * CPU), evictable=False)
    act = [running(1, "b", "c", "batch", cpu=8 * CPU), session]
    plan = run([head(10, "a", "critical", cpu=8 * CPU)], act, [cluster("c", act, cpu=16 * CPU)])
    assert victims(plan) == [1]  # the younger job, 2, is a session: the older batch job goes instead
    plan = run([head(10, "a", "critical", cpu=16 * CPU)], act, [cluster("c", act, cpu=16 * CPU)])
    assert victims(plan) == []  # evicting both is the only way, and one is a session
    queued = [head(20, "a", priority=1000, cpu=8 * CPU), head(21, "a", priority=order_priority(-5, True), cpu=8 * CPU)]
    plan = run(queued, [], [cluster("c", [], cpu=8 * CPU)])
    assert [p.job_id for p in plan.places] == [21]


@settings(max_examples=300, deadline=None)
@given(st.one_of(scenes(), reclaim_scenes()))
def test_reclaims_come_to_an_end_while_nothing_ends(scene):
    """Cycle after cycle, with no job ending and no time passing: each victim queues again, each
    preemptor starts once its victims are gone. Every reclaim raises the queues' guaranteed use or keeps
    it and lowers what they borrow, so the evictions stop. (No class preempts here: preemption by class
    ends by class order, not by this rule.)"""
    queues, classes, clusters, active, candidates, holds = scene
    classes = {name: replace(cls, can_preempt=False) for name, cls in classes.items()}
    queued = {c.job.id: c for c in candidates}
    holds = {}
    evictions = 0
    for _ in range(200):
        shown = []
        for c in clusters:
            free = dict(c.allocatable)
            for a in active:
                if a.cluster == c.name:
                    free = {r: v - a.requests.get(r, 0) for r, v in free.items()}
            shown.append(replace(c, free=free, largest_free_node=free))
        plan = plan_cycle(heads_of(queued.values()), active, shown, queues, classes, holds, NOW)
        if not plan.preemptions and not plan.places:
            return
        evictions += len(plan.preemptions)
        by_id = {a.job_id: a for a in active}
        for p in plan.preemptions:
            a = by_id.pop(p.victim)
            queued[a.job_id] = Candidate(QueuedJob(a.job_id, a.requests, a.requests), a.queue, a.service_class,
                                         a.class_priority, a.priority, 0.0, p.by)
        for p in plan.places:
            c = queued.pop(p.job_id)
            cls = classes[c.service_class]
            by_id[c.job.id] = Active(c.job.id, c.queue, c.service_class, c.class_priority, c.priority, p.cluster,
                                     c.job.requests, cls.preemptible)
        active, holds = list(by_id.values()), plan.holds
    raise AssertionError(f"still placing or evicting after 200 cycles ({evictions} evictions)")


def test_jobs_placed_beside_held_nodes_are_kept_off_them_where_the_cluster_names_its_nodes():
    # Job 10's victims are stopping: its hold keeps n0 and n1 whole and all of n2's 6 free GPUs for its three
    # 8-GPU pods. Two 1-GPU jobs fit the 2 GPUs left on n3. The cluster's scheduler knows nothing of the hold and
    # binds first fit, so each is told to keep off the held nodes, and the plan's own state takes them from n3.
    hold = Hold(10, "c", res(gpu=24 * GPU), "preemption", NOW - 10, victims=(1,), pods=((3, res(gpu=8 * GPU)),))
    c = replace(cluster("c", gpu=32 * GPU, largest=res(gpu=8 * GPU)), free=res(gpu=26 * GPU),
                node_free=({G: 8 * GPU}, {G: 8 * GPU}, {G: 6 * GPU}, {G: 4 * GPU}), node_names=("n0", "n1", "n2", "n3"))
    gang = head(10, "a", pods=3, gpu=8 * GPU)
    gang = replace(gang, job=replace(gang.job, pods=((3, res(gpu=8 * GPU)),)))
    heads = [gang, head(11, "b", gpu=GPU), head(12, "b", gpu=GPU)]
    plan = run(heads, [], [c], holds={10: hold})
    assert plan.places == [Place(11, "c", ("n0", "n1", "n2")), Place(12, "c", ("n0", "n1", "n2"))]
    assert plan.holds[10] == hold
    # Without node names nothing can be said to the cluster: the places name no nodes.
    unnamed = replace(c, node_names=())
    assert [p.avoid_nodes for p in run(heads, [], [unnamed], holds={10: hold}).places] == [(), ()]
    # Without the hold, nothing is kept off.
    assert [p.avoid_nodes for p in run(heads[1:], [], [c]).places] == [(), ()]
