"""The victim search's shortcut (preempting._smallest_set): a size of set none of whose sets frees enough
is passed over, counted against the search's budget as if each set had been tried, and a set is asked
whether it frees enough before anything dearer. It chooses what the plain search chooses, written out
here as its definition after the greedy choice: every set in order of size, then in the victims'
order, within the budget."""
from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.policy.placing import ClusterState, QueuedJob
from dispatcher.policy.plans import Active
from dispatcher.policy.preempting import VICTIM_SEARCH, _Enough, _greedy, _smallest_set, _Takings
from dispatcher.policy.quotas import QueueQuota, QuotaTree

G = "nvidia.com/gpu"


def plain(enough, eligible: list[Active], allowed: _Takings) -> list[Active] | None:
    if enough([]):
        return []
    order = sorted(eligible, key=lambda a: (a.class_priority, a.priority, -a.job_id))
    chosen = _greedy(enough, order, allowed)
    if chosen is None and not enough(order):
        return None
    budget = VICTIM_SEARCH
    for size in range(1, len(order) + 1 if chosen is None else len(chosen)):
        for combo in itertools.combinations(order, size):
            budget -= 1
            if budget < 0:
                return chosen
            if allowed.allow(combo) and enough(list(combo)):
                return list(combo)
    return chosen


victim = st.tuples(st.sampled_from(("a", "b", "c")), st.integers(1, 8), st.integers(0, 16), st.integers(0, 3),
                   st.integers(1, 4))


@settings(max_examples=300, deadline=None)
@given(victims=st.lists(victim, min_size=1, max_size=14), need_gpu=st.integers(1, 16), need_cpu=st.integers(0, 24),
       free_gpu=st.integers(-2, 8), nodes=st.integers(0, 3), guaranteed=st.integers(0, 12))
def test_the_search_chooses_what_the_plain_search_chooses(victims, need_gpu, need_cpu, free_gpu, nodes, guaranteed):
    active = [Active(i, queue, "batch", 10, priority, "c", {G: gpu, "cpu": cpu}, pods=((pods, {G: -(-gpu // pods),
                     "cpu": -(-cpu // pods)}),) if pods > 1 else ())
              for i, (queue, gpu, cpu, priority, pods) in enumerate(victims, 1)]
    free = {G: free_gpu, "cpu": 4}
    node_free = tuple({G: max(0, free_gpu) // nodes, "cpu": 4 // nodes} for _ in range(nodes)) if nodes > 1 else ()
    capacity = {G: 64, "cpu": 128}
    cluster = ClusterState("c", "onprem", "dc", {}, free, dict(free), allocatable=capacity, node_free=node_free)
    queues = [QueueQuota("root"), *(QueueQuota(q, "root", guaranteed={G: guaranteed}) for q in ("a", "b", "c", "mine"))]
    tree = QuotaTree(queues, capacity)
    for a in active:
        tree.charge(a.queue, a.requests)
    job = QueuedJob(100, {G: need_gpu, "cpu": need_cpu}, {G: need_gpu, "cpu": need_cpu})
    enough = _Enough(job, cluster, {}, tree)
    expected = plain(enough, active, _Takings(tree, lambda a: False, "mine", job.requests))
    got = _smallest_set(enough, active, _Takings(tree, lambda a: False, "mine", job.requests))
    assert got == expected


def test_sets_too_small_to_free_enough_use_up_the_budget_as_if_each_were_tried():
    # Ten GPUs are needed, from fourteen victims of 1 (evicted first) and two of 4: the greedy set is ten of 1.
    # No 3 victims free 10, and there are more sets of 3 or fewer (696) than the budget: the plain search
    # stops among them and keeps the greedy set, though two of 1 and the two of 4 would do; so does this one.
    active = [Active(i, "a", "batch", 10, 0 if i <= 14 else 3, "c", {G: 1 if i <= 14 else 4}) for i in range(1, 17)]
    cluster = ClusterState("c", "onprem", "dc", {}, {G: 0}, {G: 0}, allocatable={G: 64})
    tree = QuotaTree([QueueQuota("a"), QueueQuota("mine")], {G: 64})
    job = QueuedJob(100, {G: 10}, {G: 10})
    enough = _Enough(job, cluster, {}, tree)
    expected = plain(enough, active, _Takings(tree, lambda a: True, "mine", job.requests))
    got = _smallest_set(enough, active, _Takings(tree, lambda a: True, "mine", job.requests))
    assert got == expected and len(got) == 10
