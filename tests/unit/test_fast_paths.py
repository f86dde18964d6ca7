"""The cycle's fast paths give the answers of their plain definitions, over random inputs:

- `Clusters.best` (per-shape rankings, re-ranked where capacity changed) chooses as `decide` does,
  placement after placement;
- `plan_cycle`'s order (a heap per parent of the queue tree) is the order of the definition: at every
  step, of all queue heads, the one with the least (class first, weighted shares from the root down,
  priority, age) key, recomputed from scratch.
"""
from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.policy.placing import Clusters, ClusterState, Place, QueuedJob, decide, take
from dispatcher.policy.planning import plan_cycle
from dispatcher.policy.plans import Active, Candidate, ClassPolicy
from dispatcher.policy.quotas import QueueQuota, QuotaTree

CPU = 1000
CLASSES = {"high": ClassPolicy("high", priority=100), "low": ClassPolicy("low", priority=10),
           "light": ClassPolicy("light", priority=10, weight=3.0)}

shapes = st.tuples(st.integers(1, 6), st.integers(1, 3), st.sampled_from([(), ("onprem",), ("cloud",)]))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 16), st.integers(1, 4), st.sampled_from(["onprem", "cloud", "edge"])),
                min_size=1, max_size=6),
       st.lists(shapes, min_size=1, max_size=40))
def test_best_chooses_as_decide_does(cluster_specs, jobs):
    clusters = [ClusterState(f"c{i}", tier, "dc", {}, {"cpu": cpu * CPU, "memory": cpu * CPU},
                             {"cpu": cpu * CPU // nodes, "memory": cpu * CPU // nodes}, "",
                             {"cpu": cpu * CPU, "memory": cpu * CPU})
                for i, (cpu, nodes, tier) in enumerate(cluster_specs)]
    fast = Clusters(clusters)
    plain = {c.name: c for c in clusters}
    for n, (cpu, pods, tiers) in enumerate(jobs):
        job = QueuedJob(n, {"cpu": cpu * pods * CPU // 2}, {"cpu": cpu * CPU // 2}, tiers=tiers)
        expected = decide(job, plain)
        got = fast.best(job)
        assert got == expected
        if isinstance(got, Place):
            fast[got.cluster] = take(fast[got.cluster], job.requests)


def reference_order(heads: dict[str, list[Candidate]], tree: QuotaTree, room: int) -> list[int]:
    """The definition: at every step the least key over every queue's head, keys made afresh; a job is
    placed (and charged) while the single cluster has room, then only considered."""
    turn = {q: 0 for q in heads}
    out = []
    while any(turn[q] < len(jobs) for q, jobs in heads.items()):
        def key(q):
            c = heads[q][turn[q]]
            return (-c.class_priority, tree.fair_key(q, CLASSES[c.service_class].weight), -c.priority, c.job.id)
        q = min((q for q, jobs in heads.items() if turn[q] < len(jobs)), key=key)
        c = heads[q][turn[q]]
        turn[q] += 1
        if c.job.requests["cpu"] <= room:
            room -= c.job.requests["cpu"]
            tree.charge(q, c.job.requests)
            out.append(c.job.id)
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 3)), min_size=1, max_size=8),
       st.lists(st.tuples(st.integers(0, 7), st.sampled_from(sorted(CLASSES)), st.integers(0, 3), st.integers(1, 4)),
                min_size=1, max_size=40),
       st.integers(4, 60))
def test_the_cycle_admits_in_the_order_of_the_definition(tree_spec, jobs, room):
    # Up to 3 parents p0..p2 (weights 1..3); queue q<i> under p<parent>; some queues hold jobs of their own
    # children too (a parent queue may be submitted to).
    queues = [QueueQuota(f"p{i}", None, {}, {}, float(i + 1)) for i in range(3)]
    queues += [QueueQuota(f"q{i}", f"p{parent}", {}, {}, float(weight)) for i, (parent, weight) in enumerate(tree_spec)]
    names = [q.name for q in queues]
    heads: dict[str, list[Candidate]] = {}
    for n, (which, cls, priority, cpu) in enumerate(jobs):
        queue = names[which % len(names)]
        job = QueuedJob(n, {"cpu": cpu * CPU}, {"cpu": cpu * CPU})
        heads.setdefault(queue, []).append(Candidate(job, queue, cls, CLASSES[cls].priority, priority))
    for jobs_of in heads.values():
        jobs_of.sort(key=lambda c: (-c.class_priority, -c.priority, c.job.id))
    cluster = ClusterState("c", "onprem", "dc", {}, {"cpu": room * CPU}, {"cpu": room * CPU}, "", {"cpu": room * CPU})
    plan = plan_cycle(heads, [], [cluster], queues, CLASSES, {}, 0.0)
    expected = reference_order(heads, QuotaTree(queues, {"cpu": room * CPU}), room * CPU)
    assert [p.job_id for p in plan.places] == expected


# -- victim searches that found nothing are not run again while nothing they depend on changed ----------

from tests.unit.test_active_needs import burst_scenes  # noqa: E402
from tests.unit.test_planning import NOW, heads_of  # noqa: E402


@settings(max_examples=400, deadline=None)
@given(burst_scenes(), st.integers(1, 3))
def test_a_failed_victim_search_is_remembered_only_while_its_answer_holds(scene, copies):
    """Heads of repeated shapes (each job `copies` times, the copies under new ids), clusters often full:
    the cycle that remembers failed searches decides exactly as the one that runs every search."""
    queues, classes, clusters, active, candidates, holds, rules = scene
    more = [replace(c, job=replace(c.job, id=c.job.id + 1000 * n)) for n in range(copies) for c in candidates]
    heads = heads_of(more)
    plain = plan_cycle(heads, active, clusters, queues, classes, holds, NOW, list(rules), {},
                       remember_failed_searches=False)
    assert plan_cycle(heads, active, clusters, queues, classes, holds, NOW, list(rules), {}) == plain


def test_a_hold_given_up_makes_the_same_search_run_again():
    # A's search fails: x is full and H's hold on it leaves too little even without V. H then starts on y,
    # giving up its hold; B, of A's shape, must search again and evict V.
    from dispatcher.policy.plans import Active, Hold
    classes = {"critical": ClassPolicy("critical", 100, can_preempt=True),
               "batch": ClassPolicy("batch", 10, preemptible=True), "standard": ClassPolicy("standard", 50)}
    x = ClusterState("x", "onprem", "dc", {}, {"cpu": 0}, {"cpu": 0}, "", {"cpu": 8 * CPU})
    y = ClusterState("y", "onprem", "dc", {}, {"cpu": 2 * CPU}, {"cpu": 2 * CPU}, "", {"cpu": 2 * CPU})
    active = [Active(1, "b", "batch", 10, 0, "x", {"cpu": 4 * CPU}, True),
              Active(2, "b", "standard", 50, 0, "x", {"cpu": 4 * CPU}, False)]

    def head(job_id, priority, cpu):
        return Candidate(QueuedJob(job_id, {"cpu": cpu * CPU}, {"cpu": cpu * CPU}), "a", "critical", 100, priority)

    heads = {"a": [head(10, 2, 4), head(11, 1, 2), head(12, 0, 4)]}
    holds = {11: Hold(11, "x", {"cpu": 2 * CPU}, "reservation", NOW - 10)}
    queues = [QueueQuota("a"), QueueQuota("b")]
    plain = plan_cycle(heads, active, [x, y], queues, classes, holds, NOW, remember_failed_searches=False)
    assert [(p.victim, p.by) for p in plain.preemptions] == [(1, 12)]
    assert plan_cycle(heads, active, [x, y], queues, classes, holds, NOW) == plain


def test_a_job_neither_preempts_nor_reserves_on_a_cluster_it_avoids():
    # A's last attempt could not start on x: evicting V there, or holding x for A, would free room A
    # cannot take. B, of A's shape and avoiding nothing, evicts V; the remembered search of A (which found
    # nothing) must not stop B's.
    from dispatcher.policy.held import reservation_cluster as _reservation_cluster
    from dispatcher.policy.plans import Active
    classes = {"critical": ClassPolicy("critical", 100, can_preempt=True),
               "batch": ClassPolicy("batch", 10, preemptible=True)}
    x = ClusterState("x", "onprem", "dc", {}, {"cpu": 0}, {"cpu": 0}, "", {"cpu": 4 * CPU})
    y = ClusterState("y", "onprem", "dc", {}, {"cpu": 0}, {"cpu": 0}, "", {"cpu": 4 * CPU})
    active = [Active(1, "b", "batch", 10, 0, "x", {"cpu": 4 * CPU}, True)]
    a = Candidate(QueuedJob(10, {"cpu": 4 * CPU}, {"cpu": 4 * CPU}, avoid=("x",)), "a", "critical", 100, 1)
    b = Candidate(QueuedJob(11, {"cpu": 4 * CPU}, {"cpu": 4 * CPU}), "a", "critical", 100, 0)
    queues = [QueueQuota("a"), QueueQuota("b")]
    plain = plan_cycle({"a": [a, b]}, active, [x, y], queues, classes, {}, NOW, remember_failed_searches=False)
    assert [(p.victim, p.by) for p in plain.preemptions] == [(1, 11)]
    assert plan_cycle({"a": [a, b]}, active, [x, y], queues, classes, {}, NOW) == plain
    roomier = {"x": replace(x, free={"cpu": 2 * CPU}), "y": y}
    assert _reservation_cluster(b.job, roomier) == "x" and _reservation_cluster(a.job, roomier) == "y"


def test_a_failed_search_is_not_taken_for_a_job_of_the_same_total_in_other_pods():
    # Two nodes, none free, eight 2-GPU batch jobs on them. A (one 8-GPU pod) can evict nothing that surely
    # packs it; B asks for the same 8 GPUs as four 2-GPU pods, which four victims' own room holds.
    from tests.unit.test_planning import GPU, cluster, head, res, run, running
    small = [running(i, "b", "c", "batch", gpu=2 * GPU) for i in range(1, 9)]
    two_nodes = replace(cluster("c", small, gpu=16 * GPU, largest=res(gpu=0)), node_free=({"nvidia.com/gpu": 0},) * 2)
    a = head(10, "a", "critical", priority=1, gpu=8 * GPU)
    b = head(11, "a", "critical", gpu=2 * GPU)
    b = replace(b, job=replace(b.job, requests=res(gpu=8 * GPU), pods=((4, res(gpu=2 * GPU)),)))
    plan = run([a, b], small, [two_nodes])
    assert plan.holds[11].victims and len(plan.holds[11].victims) == 4
    assert plan.waits[10].startswith("no cluster fits")


# -- heads that cannot start are left out, their stored reasons standing (out_of_reach.py) --------------

from tests.unit.test_planning import reclaim_scenes, scenes  # noqa: E402

STALE = ("no cluster fits: c0: needs 1 cpu, 0 free", "no cluster matches its placement", "queue q0: cpu 1/1 in use",
         "queue q1 (parent of q2): cpu 9/9 in use", "reserved capacity for job 100 on c0", "preempted by job 3", "")


@st.composite
def given_up_scenes(draw):
    """Clusters whose room is reserved for heads that may start elsewhere instead, giving that room up in
    the cycle to heads that could not use it at its start; some heads only go to c0."""
    from dispatcher.policy.plans import Hold
    clusters = [ClusterState(f"c{i}", "onprem", "dc", {"zone": f"c{i}"}, {"cpu": free * CPU}, {"cpu": free * CPU}, "",
                             {"cpu": 8 * CPU})
                for i, free in enumerate(draw(st.lists(st.integers(0, 8), min_size=2, max_size=3)))]
    candidates = [Candidate(QueuedJob(100 + n, {"cpu": cpu * CPU}, {"cpu": cpu * CPU}, selector),
                            draw(st.sampled_from("ab")), "high", 100, draw(st.integers(0, 3)))
                  for n, (cpu, selector) in enumerate(draw(st.lists(
                      st.tuples(st.integers(1, 6), st.sampled_from(({}, {"zone": "c0"}))), min_size=2, max_size=8)))]
    holds = {}
    for c in draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=2, unique_by=lambda c: c.job.id)):
        holds[c.job.id] = Hold(c.job.id, draw(st.sampled_from(("c0", "c0", "c1"))), dict(c.job.requests),
                               "reservation", NOW - 10)
    return [QueueQuota("a"), QueueQuota("b")], CLASSES, clusters, [], candidates, holds


@settings(max_examples=300, deadline=None)
@given(st.one_of(scenes(), reclaim_scenes(), given_up_scenes()), st.integers(1, 3), st.data())
def test_a_plan_leaving_out_heads_that_cannot_start_decides_as_one_that_leaves_none_out(scene, copies, data):
    """Reasons stored from an earlier cycle (this plan's own, and stale ones of every kind): the plan that
    may leave heads out makes the same places, preemptions and holds as the plain one, and tells every
    head it does not leave out the same reason."""
    queues, classes, clusters, active, candidates, holds = scene
    more = [replace(c, job=replace(c.job, id=c.job.id + 1000 * n)) for n in range(copies) for c in candidates]
    heads = heads_of(more)
    plain = plan_cycle(heads, active, clusters, queues, classes, holds, NOW, remember_failed_searches=False)
    held = tuple(f"reserved capacity for job {h.job_id} on {h.cluster}" for h in holds.values())
    stored = {c.job.id: data.draw(st.sampled_from((plain.waits.get(c.job.id, ""), *STALE, *held))) for c in more}
    fast = plan_cycle(heads, active, clusters, queues, classes, holds, NOW, reasons=stored)
    assert (fast.places, fast.preemptions, fast.holds) == (plain.places, plain.preemptions, plain.holds)
    for c in more:
        if c.job.id in fast.waits:
            assert fast.waits[c.job.id] == plain.waits[c.job.id]
        elif c.job.id not in {p.job_id for p in fast.places}:  # left out: it waits, and was told why before
            assert c.job.id in plain.waits and stored[c.job.id] and c.job.id not in fast.holds


def test_a_head_left_out_that_a_hold_given_up_lets_start_is_planned_after_all():
    # x has 6 cpu free, 4 of them reserved for job 11; y has 4. Job 10 (4 cpu, only on x) sees 2 at the
    # cycle's start and was told so before. Job 11 goes first and starts on y, the tighter fit, giving up
    # its hold on x: job 10 must start there in this cycle.
    from dispatcher.policy.plans import Hold
    x = ClusterState("x", "onprem", "dc", {"zone": "x"}, {"cpu": 6 * CPU}, {"cpu": 6 * CPU}, "", {"cpu": 8 * CPU})
    y = ClusterState("y", "onprem", "dc", {}, {"cpu": 4 * CPU}, {"cpu": 4 * CPU}, "", {"cpu": 4 * CPU})
    holder = Candidate(QueuedJob(11, {"cpu": 4 * CPU}, {"cpu": 4 * CPU}), "a", "high", 100, 1)
    big = Candidate(QueuedJob(10, {"cpu": 4 * CPU}, {"cpu": 4 * CPU}, {"zone": "x"}), "a", "high", 100, 0)
    heads, holds = {"a": [holder, big]}, {11: Hold(11, "x", {"cpu": 4 * CPU}, "reservation", NOW - 10)}
    plain = plan_cycle(heads, [], [x, y], [QueueQuota("a")], CLASSES, holds, NOW)
    assert [(p.job_id, p.cluster) for p in plain.places] == [(11, "y"), (10, "x")]
    told = {10: "reserved capacity for job 11 on x"}
    assert plan_cycle(heads, [], [x, y], [QueueQuota("a")], CLASSES, holds, NOW, reasons=told) == plain


def test_a_head_that_cannot_start_keeps_its_reason_only_when_it_says_what_stops_it():
    x = ClusterState("x", "onprem", "dc", {}, {"cpu": 2 * CPU}, {"cpu": 2 * CPU}, "", {"cpu": 8 * CPU})
    big = Candidate(QueuedJob(10, {"cpu": 4 * CPU}, {"cpu": 4 * CPU}), "a", "high", 100, 0)
    queues = [QueueQuota("a")]
    told = plan_cycle({"a": [big]}, [], [x], queues, CLASSES, {}, NOW).waits[10]
    assert told == "no cluster fits: x: needs 4 cpu, 2 free"
    emptier = replace(x, free={"cpu": 0}, largest_free_node={"cpu": 0})
    # Told before that no cluster fits: left out, its reason (with its figures) standing.
    assert 10 not in plan_cycle({"a": [big]}, [], [emptier], queues, CLASSES, {}, NOW, reasons={10: told}).waits
    # Told something else before (or nothing): told afresh.
    for before in ("preempted by job 3", "queue a: cpu 4/4 in use", ""):
        plan = plan_cycle({"a": [big]}, [], [emptier], queues, CLASSES, {}, NOW, reasons={10: before})
        assert plan.waits[10] == "no cluster fits: x: needs 4 cpu, 0 free"
    # Over its queue's maximum now: told so, whatever it was told about room.
    capped = [QueueQuota("a", None, {}, {"cpu": 2 * CPU})]
    plan = plan_cycle({"a": [big]}, [], [emptier], capped, CLASSES, {}, NOW, reasons={10: told})
    assert plan.waits[10].startswith("queue a: cpu")


def test_a_head_of_a_lighter_class_left_out_does_not_bring_the_heads_behind_it_forward():
    # Found by the property above: q0's head 100 (class weight 0.5) cannot start and its reason stands; the
    # head behind it, 104, is of a class of weight 1.0, which halves q0's key. Left out, 100 let 104 go before
    # q2's 103, while the plain plan places 103 first: the same places in another order.
    zero = {"cpu": 0, "nvidia.com/gpu": 0}
    queues = [QueueQuota("q0", None, zero, {}, 0.5), QueueQuota("q1", None, zero, {}, 0.5),
              QueueQuota("q2", "q0", zero, {}, 0.5)]
    classes = {"hi": ClassPolicy("hi", 100, weight=0.5), "lo": ClassPolicy("lo", 10, weight=0.5),
               "lo2": ClassPolicy("lo2", 10, weight=1.0)}
    clusters = [ClusterState("c0", "onprem", "dc1", {}, dict(zero), dict(zero), "", dict(zero)),
                ClusterState("c1", "onprem", "dc1", {}, {"cpu": 2000, "nvidia.com/gpu": 0},
                             {"cpu": 1000, "nvidia.com/gpu": 0}, "", {"cpu": 2000, "nvidia.com/gpu": 0})]
    active = [Active(1, "q0", "hi", 100, 0, "c0", {"cpu": 0}, False, None)]

    def head(job_id, requests, queue, cls):
        return Candidate(QueuedJob(job_id, requests, requests), queue, cls, classes[cls].priority, 0, 0.0)
    heads = heads_of([head(100, {"cpu": 0, "nvidia.com/gpu": 1000}, "q0", "lo"), head(101, {"cpu": 0}, "q0", "hi"),
                      head(102, {"cpu": 1000}, "q0", "hi"), head(103, {"cpu": 0}, "q2", "lo"),
                      head(104, {"cpu": 0}, "q0", "lo2")])
    plain = plan_cycle(heads, active, clusters, queues, classes, {}, NOW, remember_failed_searches=False)
    stored = {100: plain.waits[100]}
    fast = plan_cycle(heads, active, clusters, queues, classes, {}, NOW, reasons=stored)
    assert [p.job_id for p in plain.places] == [101, 102, 103, 104]
    assert fast.places == plain.places
