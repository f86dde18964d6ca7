"""Queue quotas: the tree path, charging and releasing up the tree, maxima at a queue and at its
ancestors (with the exact reasons people read), unlimited resources, borrowing, the guarantee, and
the weighted dominant-resource share compared root first."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.policy.quotas import QueueQuota, QuotaTree

CPU = 1000  # milli-units per core
GPU = 1000
GI = 2**30 * 1000  # one Gi of memory in milli-units
G = "nvidia.com/gpu"


def res(**amounts: int) -> dict[str, int]:
    """Resources in milli-units; gpu= is nvidia.com/gpu."""
    return {(G if k == "gpu" else k): v for k, v in amounts.items()}


def org_tree(capacity: dict[str, int] | None = None, research_max: dict | None = None) -> QuotaTree:
    """org -> research -> {vision, nlp}; org -> ops."""
    return QuotaTree([
        QueueQuota("org"),
        QueueQuota("research", "org", guaranteed=res(gpu=16 * GPU),
                   max=research_max if research_max is not None else res(gpu=16 * GPU)),
        QueueQuota("vision", "research", guaranteed=res(gpu=8 * GPU, cpu=32 * CPU), max=res(gpu=16 * GPU)),
        QueueQuota("nlp", "research", guaranteed=res(gpu=8 * GPU), max=res(gpu=12 * GPU)),
        QueueQuota("ops", "org", guaranteed=res(cpu=16 * CPU), max=res(cpu=64 * CPU, memory=256 * GI)),
    ], capacity if capacity is not None else res(cpu=128 * CPU, memory=1024 * GI, gpu=32 * GPU))


# -- the path up the tree ----------------------------------------------------------------------------

def test_the_path_is_the_queue_then_its_ancestors_leaf_first():
    tree = org_tree()
    assert tree.path("vision") == ["vision", "research", "org"]
    assert tree.path("ops") == ["ops", "org"]
    assert tree.path("org") == ["org"]


def test_an_unknown_queue_is_its_own_path_and_an_unknown_parent_ends_it():
    tree = QuotaTree([QueueQuota("orphan", "gone")], {})
    assert tree.path("nobody") == ["nobody"]
    assert tree.path("orphan") == ["orphan", "gone"]


def test_a_cyclic_tree_stops_instead_of_looping():
    tree = QuotaTree([QueueQuota("a", "b"), QueueQuota("b", "c"), QueueQuota("c", "a"), QueueQuota("self", "self")], {})
    assert tree.path("a") == ["a", "b", "c"]
    assert tree.path("c") == ["c", "a", "b"]
    assert tree.path("self") == ["self"]
    tree.charge("a", res(cpu=CPU))  # every queue on the cycle counted once
    assert [tree.used(q)["cpu"] for q in ("a", "b", "c")] == [CPU, CPU, CPU]


def test_an_empty_queue_name_has_no_path():
    assert QuotaTree([], {}).path("") == []


# -- charging and releasing --------------------------------------------------------------------------

def test_a_charge_counts_against_the_queue_and_every_ancestor_but_not_siblings():
    tree = org_tree()
    tree.charge("vision", res(gpu=4 * GPU, cpu=8 * CPU))
    for q in ("vision", "research", "org"):
        assert tree.used(q) == res(gpu=4 * GPU, cpu=8 * CPU), q
    assert tree.used("nlp") == {}
    assert tree.used("ops") == {}
    tree.charge("nlp", res(gpu=2 * GPU))
    assert tree.used("research") == res(gpu=6 * GPU, cpu=8 * CPU)
    assert tree.used("vision") == res(gpu=4 * GPU, cpu=8 * CPU)


def test_a_release_undoes_its_charge_all_the_way_up():
    tree = org_tree()
    tree.charge("vision", res(gpu=4 * GPU))
    tree.charge("vision", res(gpu=2 * GPU))
    tree.charge("vision", res(gpu=4 * GPU), -1)
    assert [tree.used(q).get(G, 0) for q in ("vision", "research", "org")] == [2 * GPU] * 3
    tree.charge("vision", res(gpu=2 * GPU), -1)
    assert [tree.used(q).get(G, 0) for q in ("vision", "research", "org")] == [0, 0, 0]


# -- maxima and their reasons ------------------------------------------------------------------------

def test_at_its_own_max_a_queue_says_so_with_its_guarantee_and_max():
    tree = org_tree(research_max=res(gpu=32 * GPU))
    tree.charge("vision", res(gpu=16 * GPU))
    assert tree.over_max("vision", res(gpu=GPU)) == \
        "queue vision: nvidia.com/gpu 16/16 in use (guaranteed 8, max 16)"


def test_below_its_max_the_reason_says_what_the_job_needs():
    tree = org_tree(research_max=res(gpu=32 * GPU))
    tree.charge("vision", res(gpu=14 * GPU))
    assert tree.over_max("vision", res(gpu=2 * GPU)) is None  # exactly at the max is allowed
    assert tree.over_max("vision", res(gpu=4 * GPU)) == \
        "queue vision: nvidia.com/gpu 14/16 in use, needs 4 (guaranteed 8, max 16)"


def test_an_ancestor_at_its_max_is_named_as_the_parent_of_the_queue():
    tree = org_tree()
    tree.charge("nlp", res(gpu=12 * GPU))
    tree.charge("vision", res(gpu=4 * GPU))
    assert tree.over_max("vision", res(gpu=GPU)) == \
        "queue research (parent of vision): nvidia.com/gpu 16/16 in use (guaranteed 16, max 16)"


def test_an_ancestor_below_its_max_says_what_the_job_needs():
    tree = org_tree()
    tree.charge("nlp", res(gpu=10 * GPU))
    assert tree.over_max("vision", res(gpu=8 * GPU)) == \
        "queue research (parent of vision): nvidia.com/gpu 10/16 in use, needs 8 (guaranteed 16, max 16)"


def test_a_grandparent_is_named_as_the_parent_of_the_queue_too():
    tree = QuotaTree([QueueQuota("org", max=res(cpu=10 * CPU)), QueueQuota("team", "org"),
                      QueueQuota("proj", "team")], {})
    tree.charge("proj", res(cpu=9 * CPU))
    assert tree.over_max("proj", res(cpu=2 * CPU)) == \
        "queue org (parent of proj): cpu 9/10 in use, needs 2 (guaranteed 0, max 10)"


def test_the_queue_itself_is_checked_before_its_ancestors():
    tree = org_tree()
    tree.charge("nlp", res(gpu=12 * GPU))  # nlp and research are both full enough to refuse
    tree.charge("vision", res(gpu=4 * GPU))
    assert tree.over_max("nlp", res(gpu=GPU)).startswith("queue nlp: nvidia.com/gpu 12/12 in use")


def test_resources_are_checked_in_name_order_and_quantities_read_as_kubernetes_writes_them():
    tree = org_tree()
    tree.charge("ops", res(cpu=64 * CPU, memory=255 * GI))
    assert tree.over_max("ops", res(memory=2 * GI, cpu=1500)) == \
        "queue ops: cpu 64/64 in use (guaranteed 16, max 64)"
    assert tree.over_max("ops", res(memory=2 * GI)) == \
        "queue ops: memory 255Gi/256Gi in use, needs 2Gi (guaranteed 0, max 256Gi)"
    tree.charge("ops", res(cpu=64 * CPU), -1)
    assert tree.over_max("ops", res(cpu=64500)) == \
        "queue ops: cpu 0/64 in use, needs 64500m (guaranteed 16, max 64)"


def test_a_resource_a_max_does_not_name_is_unlimited():
    tree = org_tree()
    tree.charge("vision", res(cpu=100_000 * CPU, memory=10_000 * GI))
    assert tree.over_max("vision", res(cpu=100_000 * CPU, memory=10_000 * GI, example=10**9)) is None
    unlimited = QuotaTree([QueueQuota("free")], {})
    assert unlimited.over_max("free", res(gpu=10**6 * GPU)) is None
    assert unlimited.over_max("not-declared", res(gpu=10**6 * GPU)) is None


def test_a_request_of_zero_is_never_over_even_beyond_the_max():
    tree = org_tree(research_max=res(gpu=32 * GPU))
    tree.charge("vision", res(gpu=20 * GPU))  # already above its max (the max was lowered)
    assert tree.over_max("vision", res(gpu=0, cpu=CPU)) is None
    assert tree.over_max("vision", {}) is None
    assert tree.over_max("vision", res(gpu=GPU)).startswith("queue vision: nvidia.com/gpu 20/16 in use (")


def test_a_max_of_zero_refuses_any_of_that_resource():
    tree = QuotaTree([QueueQuota("cpu-only", max=res(gpu=0))], {})
    assert tree.over_max("cpu-only", res(gpu=500)) == \
        "queue cpu-only: nvidia.com/gpu 0/0 in use (guaranteed 0, max 0)"
    assert tree.over_max("cpu-only", res(cpu=CPU)) is None


def test_excess_says_by_how_much_each_maximum_on_the_path_would_be_passed():
    tree = org_tree()
    tree.charge("nlp", res(gpu=10 * GPU))
    tree.charge("vision", res(gpu=4 * GPU))
    assert tree.excess("vision", res(gpu=2 * GPU)) == {}
    assert tree.excess("vision", res(gpu=4 * GPU, cpu=100 * CPU)) == {"research": res(gpu=2 * GPU)}
    assert tree.excess("nlp", res(gpu=4 * GPU)) == {"nlp": res(gpu=2 * GPU), "research": res(gpu=2 * GPU)}
    assert tree.excess("stray", res(gpu=100 * GPU)) == {}


# -- borrowing and the guarantee ---------------------------------------------------------------------

def test_a_queue_borrows_when_it_uses_more_than_its_guarantee_of_any_resource():
    tree = org_tree()
    assert not tree.borrowing("vision")
    tree.charge("vision", res(gpu=8 * GPU, cpu=32 * CPU))
    assert not tree.borrowing("vision")  # exactly the guarantee is its own
    tree.charge("vision", res(gpu=GPU))
    assert tree.borrowing("vision")
    tree.charge("vision", res(gpu=GPU), -1)
    tree.charge("vision", res(memory=GI))  # a resource its guarantee does not name: not limited by it
    assert not tree.borrowing("vision")


def test_a_guarantee_speaks_only_for_the_resources_it_names():
    tree = QuotaTree([QueueQuota("a", guaranteed=res(cpu=6 * CPU)), QueueQuota("gpus", guaranteed=res(cpu=CPU, gpu=0)),
                      QueueQuota("none")], {})
    tree.charge("a", res(cpu=4 * CPU, memory=64 * GI))
    assert not tree.borrowing("a")  # memory is not named: using it borrows nothing
    assert tree.below_guarantee("a", res(cpu=2 * CPU, memory=GI))
    assert not tree.below_guarantee("a", res(memory=GI))  # asks for nothing the guarantee names
    assert tree.borrowed("a") == {"cpu": 0}  # reclaim may take none of it
    # Naming a resource at 0 makes every use of it borrowed, and no request of it below the guarantee.
    tree.charge("gpus", res(gpu=GPU))
    assert tree.borrowing("gpus") and tree.borrowed("gpus") == {"cpu": 0, G: GPU}
    assert not tree.below_guarantee("gpus", res(cpu=CPU))  # it borrows gpus now
    # A queue with no guarantee borrows whatever it uses, all of it reclaimable, and is below nothing.
    assert not tree.borrowing("none")
    tree.charge("none", res(memory=1))
    assert tree.borrowing("none") and tree.borrowed("none") is None
    assert not tree.below_guarantee("none", res(cpu=CPU))


def test_an_undeclared_queue_borrows_whatever_it_uses():
    tree = org_tree()
    assert not tree.borrowing("stray")
    tree.charge("stray", res(cpu=1))
    assert tree.borrowing("stray")


def test_a_released_queue_no_longer_borrows():
    tree = org_tree()
    tree.charge("nlp", res(gpu=12 * GPU))
    assert tree.borrowing("nlp")
    tree.charge("nlp", res(gpu=4 * GPU), -1)
    assert not tree.borrowing("nlp")


def test_below_guarantee_counts_what_the_queue_already_uses_and_lets_a_whole_job_take_it_past():
    tree = org_tree()
    assert tree.below_guarantee("vision", res(gpu=8 * GPU, cpu=32 * CPU))
    tree.charge("vision", res(gpu=6 * GPU))
    assert tree.below_guarantee("vision", res(gpu=2 * GPU))
    # 6 of 8 GPUs used: a job of 3 may still reclaim, and takes the queue past its guarantee by one,
    # which is then all that reclaim may take back from it.
    assert tree.below_guarantee("vision", res(gpu=3 * GPU))
    tree.charge("vision", res(gpu=3 * GPU))
    assert tree.borrowing("vision") and tree.borrowed("vision")[G] == GPU
    assert not tree.below_guarantee("vision", res(gpu=GPU))
    tree.charge("vision", res(gpu=GPU), -1)  # exactly at its guarantee of GPUs: nothing more to reclaim
    assert not tree.borrowing("vision") and not tree.below_guarantee("vision", res(gpu=GPU))
    assert tree.below_guarantee("vision", res(cpu=CPU))  # still below its guarantee of cpu


def test_below_guarantee_limits_only_the_resources_the_guarantee_names():
    tree = org_tree()
    assert tree.below_guarantee("vision", res(gpu=GPU, memory=GI))  # memory is not named: not limited
    assert tree.below_guarantee("vision", res(gpu=GPU, memory=0))
    assert not tree.below_guarantee("vision", res(memory=GI))  # nothing it asks for is named
    assert not tree.below_guarantee("stray", res(cpu=1))  # an undeclared queue is guaranteed nothing
    assert not tree.below_guarantee("org", res(cpu=1))


def test_the_guarantee_is_the_queues_own_not_its_parents():
    tree = org_tree()
    tree.charge("nlp", res(gpu=8 * GPU))
    assert not tree.below_guarantee("nlp", res(gpu=GPU))  # research still has 8 of its 16 free
    assert tree.below_guarantee("research", res(gpu=8 * GPU))


# -- share and fair key ------------------------------------------------------------------------------

def test_the_share_is_the_dominant_resource_over_total_capacity():
    tree = org_tree(capacity=res(cpu=100 * CPU, memory=1000 * GI, gpu=10 * GPU))
    assert tree.share("vision") == 0.0
    tree.charge("vision", res(cpu=10 * CPU, memory=500 * GI, gpu=GPU))
    assert tree.share("vision") == pytest.approx(0.5)  # memory dominates
    tree.charge("vision", res(gpu=6 * GPU))
    assert tree.share("vision") == pytest.approx(0.7)  # now gpu does
    assert tree.share("research") == pytest.approx(0.7)


def test_a_resource_no_cluster_has_does_not_count_in_the_share():
    tree = org_tree(capacity=res(cpu=100 * CPU, example=0))
    tree.charge("ops", res(cpu=25 * CPU, gpu=8 * GPU, example=5))
    assert tree.share("ops") == pytest.approx(0.25)
    assert QuotaTree([], {}).share("anything") == 0.0


def test_the_share_is_divided_by_the_queue_weight():
    tree = QuotaTree([QueueQuota("heavy", weight=4.0), QueueQuota("light", weight=0.5),
                      QueueQuota("broken", weight=0.0)], res(cpu=100 * CPU))
    for q in ("heavy", "light", "broken"):
        tree.charge(q, res(cpu=40 * CPU))
    assert tree.share("heavy") == pytest.approx(0.1)
    assert tree.share("light") == pytest.approx(0.8)
    assert tree.share("broken") == pytest.approx(0.4)  # a weight of zero counts as one


def test_the_fair_key_lists_shares_root_first():
    tree = org_tree(capacity=res(gpu=32 * GPU))
    tree.charge("nlp", res(gpu=8 * GPU))
    tree.charge("vision", res(gpu=4 * GPU))
    assert tree.fair_key("vision") == pytest.approx((12 / 32, 12 / 32, 4 / 32))
    assert tree.fair_key("ops") == pytest.approx((12 / 32, 0.0))
    assert tree.fair_key("org") == pytest.approx((12 / 32,))


def test_siblings_are_compared_before_their_children():
    # vision itself uses nothing, but research (its parent) uses more than ops does: ops goes first.
    tree = QuotaTree([QueueQuota("research"), QueueQuota("vision", "research"), QueueQuota("nlp", "research"),
                      QueueQuota("ops")], res(cpu=100 * CPU))
    tree.charge("nlp", res(cpu=40 * CPU))
    tree.charge("ops", res(cpu=10 * CPU))
    assert tree.fair_key("ops") < tree.fair_key("vision")
    assert tree.fair_key("vision") < tree.fair_key("nlp")


def test_the_class_weight_divides_only_the_queues_own_share():
    tree = QuotaTree([QueueQuota("research", weight=2.0), QueueQuota("vision", "research")], res(cpu=100 * CPU))
    tree.charge("vision", res(cpu=40 * CPU))
    assert tree.fair_key("vision") == pytest.approx((0.2, 0.4))
    assert tree.fair_key("vision", 4.0) == pytest.approx((0.2, 0.1))
    assert tree.fair_key("vision", 0.0) == pytest.approx((0.2, 0.4))  # a class weight of zero counts as one


# -- decayed usage in the share ----------------------------------------------------------------------

H = 3600.0
LN2 = 0.6931471805599453


def test_without_a_half_life_history_changes_no_share():
    tree = QuotaTree([QueueQuota("a")], res(cpu=100 * CPU), {"a": {"cpu": 1e12}})
    assert tree.share("a") == 0.0


def test_with_a_half_life_the_share_adds_the_decayed_dominant_share_of_history():
    queues = [QueueQuota("org", usage_half_life_s=H), QueueQuota("a", "org", weight=2.0), QueueQuota("b", "org")]
    # a queue that always used a quarter of the cpu (and a tenth of the memory) remembers a quarter
    always = {"cpu": 25 * CPU * H / LN2, "memory": 100 * GI * H / LN2}
    tree = QuotaTree(queues, res(cpu=100 * CPU, memory=1000 * GI), {"a": always})
    assert tree.share("b") == 0.0
    assert tree.share("a") == pytest.approx(0.25 / 2)  # divided by its weight, as today
    assert tree.share("org") == pytest.approx(0.25)  # history counts up the tree, as usage does
    tree.charge("a", res(cpu=10 * CPU))
    assert tree.share("a") == pytest.approx((0.10 + 0.25) / 2)


def test_an_idle_queue_goes_before_one_with_a_long_history_at_equal_usage():
    queues = [QueueQuota("org", usage_half_life_s=H), QueueQuota("busy", "org"), QueueQuota("idle", "org")]
    tree = QuotaTree(queues, res(cpu=100 * CPU), {"busy": {"cpu": 50 * CPU * H}})
    for q in ("busy", "idle"):
        tree.charge(q, res(cpu=10 * CPU))
    assert tree.fair_key("idle") < tree.fair_key("busy")


def test_each_tree_uses_its_own_half_life():
    queues = [QueueQuota("remembers", usage_half_life_s=H), QueueQuota("forgets")]
    history = {"remembers": {"cpu": 10 * CPU * H / LN2}, "forgets": {"cpu": 10 * CPU * H / LN2}}
    tree = QuotaTree(queues, res(cpu=100 * CPU), history)
    assert tree.share("remembers") == pytest.approx(0.1) and tree.share("forgets") == 0.0


# -- invariants over random trees --------------------------------------------------------------------

amounts = st.integers(0, 8).map(lambda n: n * 500)


@st.composite
def trees(draw):
    queues = []
    for n in range(draw(st.integers(1, 6))):
        parent = draw(st.one_of(st.none(), st.sampled_from([q.name for q in queues]))) if queues else None
        guaranteed = draw(st.fixed_dictionaries({}, optional={"cpu": amounts, G: amounts}))
        maximum = {r: g + draw(amounts) for r, g in guaranteed.items() if draw(st.booleans())}
        queues.append(QueueQuota(f"q{n}", parent, guaranteed, maximum, draw(st.sampled_from((0.5, 1.0, 2.0)))))
    charges = draw(st.lists(st.tuples(st.sampled_from([q.name for q in queues]),
                                      st.fixed_dictionaries({}, optional={"cpu": amounts, G: amounts})),
                            max_size=8))
    return queues, charges


@settings(max_examples=150, deadline=None)
@given(trees(), st.fixed_dictionaries({}, optional={"cpu": amounts, G: amounts}))
def test_quota_invariants_over_random_trees(generated, request):
    queues, charges = generated
    tree = QuotaTree(queues, res(cpu=64 * CPU, gpu=16 * GPU))
    for queue, requests in charges:
        tree.charge(queue, requests)
    by_name = {q.name: q for q in queues}
    for queue, _ in charges:
        path = tree.path(queue)
        assert path[0] == queue and len(path) == len(set(path))
        # A queue's use is the sum of its own jobs and its children's.
        for name in path:
            expected: dict[str, int] = {}
            for q, requests in charges:
                if name in tree.path(q):
                    for r, v in requests.items():
                        expected[r] = expected.get(r, 0) + v
            assert {r: v for r, v in tree.used(name).items() if v} == {r: v for r, v in expected.items() if v}
        # over_max is None exactly when no queue on the path would pass a max it names.
        breaks = [name for name in path for r, need in request.items()
                  if need > 0 and r in by_name[name].max and tree.used(name).get(r, 0) + need > by_name[name].max[r]]
        reason = tree.over_max(queue, request)
        if breaks:
            first = breaks[0]
            assert reason.startswith(f"queue {first}: " if first == queue else f"queue {first} (parent of {queue}): ")
        else:
            assert reason is None
        # Below the guarantee means borrowing nothing now, and what reclaim may take is what is borrowed.
        if tree.below_guarantee(queue, request):
            assert not tree.borrowing(queue)
        borrowed = tree.borrowed(queue)
        if borrowed is not None:
            guaranteed = by_name[queue].guaranteed if queue in by_name else {}
            assert borrowed == {r: max(0, tree.used(queue).get(r, 0) - g) for r, g in guaranteed.items()}
            assert tree.borrowing(queue) == any(borrowed.values())
        key = tree.fair_key(queue)
        assert len(key) == len(path) and all(k >= 0 for k in key)
