"""The cycle's seam (scheduler.cycle.CycleStore): the very cycle production runs, served from memory.

`plan_and_apply` is what run_cycle runs inside a Postgres transaction; here a store of plain lists
serves it, as a simulation will. The parking key is computed from every field of CycleInputs."""
from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from dispatcher.capacity.usable import ClusterCapacity
from dispatcher.policy.placing import ClusterState, QueuedJob
from dispatcher.policy.plans import Candidate, ClassPolicy, Dispatched
from dispatcher.policy.quotas import QueueQuota
from dispatcher.scheduler.cycle import _PARKING_KEYS, CycleInputs, Heads, plan_and_apply
from dispatcher.scheduler.mapping import PolicyConfig
from dispatcher.scheduler.parking import Parking
from dispatcher.scheduler.settings import SchedulerSettings

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
CPU = "cpu"


class _Sink:
    """Takes nothing ahead: every place is carried out by finish()."""

    sent = 0

    def placed(self, places, bursts) -> None:
        pass

    def end(self) -> list[Dispatched]:
        return []

    def close(self) -> None:
        pass


class MemoryCycle:
    """Queued jobs (id, queue, cpu in milli-units) and clusters' free cpu, in memory."""

    def __init__(self, free: dict[str, int], queued: list[tuple[int, str, int]]):
        self.free, self.queued = dict(free), list(queued)
        self.running: dict[int, tuple[str, str, int]] = {}  # job -> (queue, cluster, cpu)
        self.reasons: dict[int, str] = {}
        self.policy = PolicyConfig(digest="v1", classes={"standard": ClassPolicy("standard")},
                                   quotas=[QueueQuota("a"), QueueQuota("b")])

    def inputs(self, now, *, all_heads):
        capacities = tuple(ClusterCapacity(ClusterState(name, "onprem", "here", {}, {CPU: free}, {CPU: free},
                                                        allocatable={CPU: 64_000}),
                                           "active", "agent", 0.0, {CPU: 64_000})
                           for name, free in sorted(self.free.items()))
        usage: dict[str, dict[str, int]] = {}
        for queue, _cluster, cpu in self.running.values():
            usage.setdefault(queue, {CPU: 0})[CPU] += cpu
        return CycleInputs(self.policy, capacities, usage, {})

    def heads(self, now, queues, deeper=frozenset()):
        by_queue: dict[str, list[Candidate]] = {}
        for job_id, queue, cpu in self.queued:
            if queues is None or queue in queues:
                job = QueuedJob(job_id, {CPU: cpu}, {CPU: cpu})
                by_queue.setdefault(queue, []).append(Candidate(job, queue, "standard", 0, 0))
        per_queue = {q: len(c) for q, c in by_queue.items()}
        return Heads(by_queue, {i: self.reasons.get(i, "") for i, _, _ in self.queued}, per_queue, False)

    def active(self, needs, *, victims):
        return []

    def dispatch_ahead(self, clusters):
        return _Sink()

    def preempt(self, plan):
        return 0

    def finish(self, plan, sent, reasons):
        self.reasons.update(reasons)
        out = []
        for place in plan.places[sent:]:
            job_id, queue, cpu = next(j for j in self.queued if j[0] == place.job_id)
            self.queued.remove((job_id, queue, cpu))
            self.running[job_id] = (queue, place.cluster, cpu)
            self.free[place.cluster] -= cpu
            out.append(Dispatched(job_id, 1, place.cluster, len(self.running), NOW, NOW))
        return out


def test_the_cycle_runs_on_a_store_in_memory():
    store = MemoryCycle({"c1": 4_000, "c2": 2_000}, [(1, "a", 3_000), (2, "a", 2_000), (3, "b", 8_000)])
    result = plan_and_apply(store, SchedulerSettings(), NOW)
    assert result.dispatched == 2 and result.waiting == 1
    assert {job: cluster for job, (_, cluster, _) in store.running.items()} == {1: "c1", 2: "c2"}
    assert [j[0] for j in store.queued] == [3] and "no cluster" in store.reasons[3]


def test_a_quiet_cycle_parks_its_queues_until_an_input_changes():
    store = MemoryCycle({"c1": 1_000}, [(1, "a", 3_000), (2, "b", 8_000)])
    parking = Parking()
    first = plan_and_apply(store, SchedulerSettings(), NOW, parking=parking)
    assert first.dispatched == 0 and first.planned is None  # every queue planned, none could start
    second = plan_and_apply(store, SchedulerSettings(), NOW, parking=parking)
    assert second.planned == 0 and second.waiting == 2  # nothing changed: both queues stay parked
    store.free["c1"] = 16_000  # room freed: an input of the cycle, so every queue is planned again
    third = plan_and_apply(store, SchedulerSettings(), NOW, parking=parking)
    assert third.planned is None and third.dispatched == 2


def test_the_parking_key_covers_every_input():
    """A field added to CycleInputs without saying how parking compares it fails here, not in production."""
    assert {f.name for f in dataclasses.fields(CycleInputs)} == set(_PARKING_KEYS)
    inputs = MemoryCycle({"c1": 1_000}, []).inputs(NOW, all_heads=True)
    for field in dataclasses.fields(CycleInputs):
        if field.name == "policy":
            changed = dataclasses.replace(inputs.policy, digest="v2")
        elif field.name == "capacities":
            changed = inputs.capacities[:0]
        else:
            changed = {"something": {CPU: 1}}
        assert dataclasses.replace(inputs, **{field.name: changed}).parking_key() != inputs.parking_key(), field.name


@pytest.mark.parametrize("unavailable", ["unreachable (no heartbeat for 6s)", "unreachable (no heartbeat for 9s)"])
def test_an_unavailable_cluster_counts_by_kind_not_by_its_words(unavailable):
    base = MemoryCycle({"c1": 1_000}, []).inputs(NOW, all_heads=True)
    c = base.capacities[0]
    gone = dataclasses.replace(c, state=dataclasses.replace(c.state, unavailable=unavailable), status="unreachable")
    first = dataclasses.replace(base, capacities=(gone,)).parking_key()
    words = "unreachable (no heartbeat for 7s)"
    other = dataclasses.replace(gone, state=dataclasses.replace(gone.state, unavailable=words))
    assert dataclasses.replace(base, capacities=(other,)).parking_key() == first


def test_the_cycle_counts_the_stores_history_in_fair_share():
    store = MemoryCycle({"c1": 4_000}, [(1, "a", 4_000), (2, "b", 4_000)])
    store.policy = PolicyConfig(digest="v1", classes={"standard": ClassPolicy("standard")},
                                quotas=[QueueQuota("a", usage_half_life_s=3600.0),
                                        QueueQuota("b", usage_half_life_s=3600.0)])
    inputs = store.inputs

    def with_history(now, *, all_heads):
        return dataclasses.replace(inputs(now, all_heads=all_heads), history={"a": {CPU: 4_000 * 3600.0}})
    store.inputs = with_history
    assert plan_and_apply(store, SchedulerSettings(), NOW).dispatched == 1
    assert list(store.running) == [2]  # a ran lately: b's head goes first


def test_history_drifting_by_less_than_a_percent_keeps_queues_parked():
    """History grows every second while jobs run: only a change in its first two digits plans again."""
    base = MemoryCycle({"c1": 1_000}, []).inputs(NOW, all_heads=True)
    history = dataclasses.replace(base, history={"a": {CPU: 1.231e9}})
    assert dataclasses.replace(base, history={"a": {CPU: 1.234e9}}).parking_key() == history.parking_key()
    assert dataclasses.replace(base, history={"a": {CPU: 1.31e9}}).parking_key() != history.parking_key()
