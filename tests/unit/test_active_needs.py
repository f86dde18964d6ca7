"""The cycle sees only the active attempts it may need, and plans exactly as over all of them.

`run_cycle` no longer reads every dispatched and running job: queue usage comes summed per queue
(`usage`), and one by one only the attempts `planning.needed` selects under `active_needs` (jobs with
an expected end when a burst may be weighed; preemption victims only once a search for them starts,
plan_cycle's `victims`). These properties compare that path with the plain definition, `plan_cycle` over every
active attempt, on random queue trees, classes, clusters (some paid), running jobs, heads and holds.
"""
from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.policy.bursting import BurstRule
from dispatcher.policy.placing import ClusterState, QueuedJob
from dispatcher.policy.planning import active_needs, needed, plan_cycle
from dispatcher.policy.plans import Active, Candidate, ClassPolicy, Hold
from dispatcher.policy.quotas import QueueQuota
from sluice.quantity import add
from tests.unit.test_planning import NOW, borrowed_scenes, heads_of, scenes


def usage_of(active: list[Active]) -> dict[str, dict[str, int]]:
    usage: dict[str, dict[str, int]] = {}
    for a in active:
        usage[a.queue] = add(usage.get(a.queue, {}), a.requests)
    return usage


def as_the_cycle_plans(heads, active, clusters, queues, classes, holds, rules=()):
    """What run_cycle does: usage summed, the needed attempts first, the victims when a search asks."""
    usage = usage_of(active)
    needs = active_needs(heads, clusters, queues, classes, usage, holds)
    first = [a for a in active if needed(a, needs, victims=False)]
    return plan_cycle(heads, first, clusters, queues, classes, holds, NOW, list(rules), {}, usage=usage,
                      victims=(lambda: [a for a in active if needed(a, needs)]) if needs.victims else None)


@st.composite
def burst_scenes(draw):
    """scenes(), with some clusters paid, classes that may burst, expected ends and a burst policy."""
    queues, classes, clusters, active, candidates, holds = draw(scenes())
    classes = {name: replace(cls, burst_allowed=draw(st.booleans())) for name, cls in classes.items()}
    clusters = [replace(c, paid=draw(st.booleans()) if c.tier == "cloud" else False, price={"cpu": 0.1})
                for c in clusters]
    if draw(st.booleans()):  # the unpaid clusters full: victims, reclaim, bursts and reservations are weighed
        clusters = [c if c.paid else replace(c, free={r: 0 for r in c.free}, largest_free_node={r: 0 for r in c.free})
                    for c in clusters]
    active = [replace(a, preemptible=classes[a.service_class].preemptible,
                      ends_at=draw(st.sampled_from((None, NOW - 5, NOW + 60, NOW + 600)))) for a in active]
    rules = draw(st.sampled_from(((), (BurstRule("p"),), (BurstRule("p", after_s=300.0),))))
    return queues, classes, clusters, active, candidates, holds, rules


@settings(max_examples=300, deadline=None)
@given(scenes())
def test_usage_and_the_needed_attempts_plan_as_every_active_attempt_does(scene):
    queues, classes, clusters, active, candidates, holds = scene
    heads = heads_of(candidates)
    expected = plan_cycle(heads, active, clusters, queues, classes, holds, NOW)
    assert as_the_cycle_plans(heads, active, clusters, queues, classes, holds) == expected


@settings(max_examples=600, deadline=None)
@given(burst_scenes())
def test_with_paid_clusters_and_expected_ends_too(scene):
    queues, classes, clusters, active, candidates, holds, rules = scene
    heads = heads_of(candidates)
    expected = plan_cycle(heads, active, clusters, queues, classes, holds, NOW, list(rules), {})
    assert as_the_cycle_plans(heads, active, clusters, queues, classes, holds, rules) == expected


@settings(max_examples=150, deadline=None)
@given(borrowed_scenes())
def test_reclaim_from_a_borrower_too(scene):
    queues, classes, clusters, active, me = scene
    heads = {"a": [me]}
    expected = plan_cycle(heads, active, clusters, queues, classes, {}, NOW)
    assert as_the_cycle_plans(heads, active, clusters, queues, classes, {}) == expected


CPU = 1000
GI = 2**30 * 1000
CLASSES = {"critical": ClassPolicy("critical", 100, can_preempt=True),
           "standard": ClassPolicy("standard", 50),
           "batch": ClassPolicy("batch", 10, preemptible=True)}


def _full(name: str) -> ClusterState:
    return ClusterState(name, "onprem", "dc1", {}, {"cpu": 0}, {"cpu": 0}, "", {"cpu": 8 * CPU})


def test_without_a_class_that_can_preempt_or_a_guarantee_no_victim_is_needed():
    heads = {"a": [Candidate(QueuedJob(1, {"cpu": CPU}, {"cpu": CPU}), "a", "standard", 50, 0)]}
    needs = active_needs(heads, [_full("x")], [QueueQuota("a")], CLASSES, {"a": {"cpu": 8 * CPU}})
    assert not needs.victims and not needs.timed
    batch = Active(7, "b", "batch", 10, 0, "x", {"cpu": CPU}, True)
    assert not needed(batch, needs)


def test_a_critical_head_needs_the_preemptible_jobs_of_lower_classes_on_unpaid_clusters():
    heads = {"a": [Candidate(QueuedJob(1, {"cpu": CPU}, {"cpu": CPU}), "a", "critical", 100, 0)]}
    paid = replace(_full("cloud"), tier="cloud", paid=True)
    needs = active_needs(heads, [_full("x"), paid], [QueueQuota("a"), QueueQuota("b")], CLASSES, {})
    assert needs.victims and needs.below == 100 and needs.preemptible == {"batch"}
    assert needed(Active(7, "b", "batch", 10, 0, "x", {"cpu": CPU}, True), needs)
    assert not needed(Active(8, "b", "batch", 10, 0, "cloud", {"cpu": CPU}, True), needs)  # paid: never a victim
    assert not needed(Active(9, "b", "standard", 50, 0, "x", {"cpu": CPU}, False), needs)
    assert not needed(Active(7, "b", "batch", 10, 0, "x", {"cpu": CPU}, True), needs, victims=False)


def test_the_victims_are_read_once_where_the_first_search_starts_and_never_when_none_does():
    small = Candidate(QueuedJob(1, {"cpu": CPU}, {"cpu": CPU}), "a", "critical", 100, 0)
    big = Candidate(QueuedJob(2, {"cpu": 2 * CPU}, {"cpu": 2 * CPU}), "a", "critical", 100, 0)
    batch = Active(7, "b", "batch", 10, 0, "x", {"cpu": CPU}, True)
    queues = [QueueQuota("a"), QueueQuota("b")]
    roomy = replace(_full("x"), free={"cpu": CPU}, largest_free_node={"cpu": CPU})
    reads = []

    def victims():
        reads.append(1)
        return [batch]
    plan = plan_cycle({"a": [small]}, [], [roomy], queues, CLASSES, {}, NOW, usage=usage_of([batch]), victims=victims)
    assert [p.job_id for p in plan.places] == [1] and not reads  # it fit: no search, nothing read
    plan = plan_cycle({"a": [small, big]}, [], [_full("x")], queues, CLASSES, {}, NOW, usage=usage_of([batch]),
                      victims=victims)
    assert len(reads) == 1  # two searches, one read
    assert [p.victim for p in plan.preemptions] == [7]
    assert plan.holds[1] == Hold(1, "x", {"cpu": CPU}, "preemption", NOW, (7,))


def test_a_queue_that_could_borrow_within_the_cycle_is_needed_for_reclaim():
    # b uses 2 of its guaranteed 4 cpu now; its 3 queued cpu could take it past the guarantee in this cycle.
    queues = [QueueQuota("a", None, {"cpu": 4 * CPU}), QueueQuota("b", None, {"cpu": 4 * CPU}),
              QueueQuota("c", None, {"cpu": 8 * CPU})]
    heads = {"a": [Candidate(QueuedJob(1, {"cpu": CPU}, {"cpu": CPU}), "a", "standard", 50, 0)],
             "b": [Candidate(QueuedJob(2, {"cpu": 3 * CPU}, {"cpu": 3 * CPU}), "b", "standard", 50, 0)]}
    needs = active_needs(heads, [_full("x")], queues, CLASSES, {"b": {"cpu": 2 * CPU}, "c": {"cpu": CPU}})
    assert needs.queues == {"b"}  # c is well within its guarantee and has nothing queued


def test_the_expected_ends_on_unpaid_clusters_reach_a_burst_decision():
    # x is full until job 7 ends in 60 s; the head may burst to the paid cloud after 600 s of waiting, or
    # at once when no unpaid start is expected within that: with job 7's end known, it waits.
    classes = {**CLASSES, "standard": replace(CLASSES["standard"], burst_allowed=True)}
    heads = {"a": [Candidate(QueuedJob(1, {"cpu": CPU}, {"cpu": CPU}), "a", "standard", 50, 0, 10.0)]}
    ends = Active(7, "b", "standard", 50, 0, "x", {"cpu": 8 * CPU}, False, NOW + 60)
    cloud = ClusterState("cloud", "cloud", "eu", {}, {"cpu": 8 * CPU}, {"cpu": 8 * CPU}, "", {"cpu": 8 * CPU},
                         paid=True, price={"cpu": 0.1})
    queues = [QueueQuota("a"), QueueQuota("b")]
    rules = (BurstRule("p", after_s=600.0),)
    needs = active_needs(heads, [_full("x"), cloud], queues, classes, usage_of([ends]))
    assert needs.timed and needed(ends, needs, victims=False)
    expected = plan_cycle(heads, [ends], [_full("x"), cloud], queues, classes, {}, NOW, list(rules), {})
    assert not expected.places
    assert as_the_cycle_plans(heads, [ends], [_full("x"), cloud], queues, classes, {}, rules) == expected


def test_reclaim_by_a_guarantee_that_does_not_name_every_requested_resource_is_seen():
    # a is guaranteed 6 cpu and no word on memory: its 2 cpu + 1 GiB head may reclaim from b, which borrows.
    queues = [QueueQuota("a", None, {"cpu": 6 * CPU}), QueueQuota("b")]
    heads = {"a": [Candidate(QueuedJob(1, {"cpu": 2 * CPU, "memory": GI}, {"cpu": 2 * CPU, "memory": GI}), "a",
                             "standard", 50, 0)]}
    b = [Active(7, "b", "standard", 50, 0, "x", {"cpu": 4 * CPU, "memory": GI}, False),
         Active(8, "b", "standard", 50, 0, "x", {"cpu": 4 * CPU, "memory": GI}, False)]
    x = ClusterState("x", "onprem", "dc1", {}, {"cpu": 0, "memory": 0}, {"cpu": 0, "memory": 0}, "",
                     {"cpu": 8 * CPU, "memory": 2 * GI})
    needs = active_needs(heads, [x], queues, CLASSES, usage_of(b))
    assert needs.queues == {"b"} and all(needed(a, needs) for a in b)
    plan = as_the_cycle_plans(heads, b, [x], queues, CLASSES, {})
    assert [p.victim for p in plan.preemptions] == [8]
