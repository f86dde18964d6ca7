"""The pure policy alone: one plan_cycle over many queue heads and clusters, no database.

    python -m bench.plan_cycle [--queues 1000] [--heads 64] [--clusters 100] [--full]

Prints jobs planned per second. --full: every cluster full, a few small preemptible jobs running on each
(never enough to make room), the backlog's class mix (5 % critical, which may preempt): every head
waits, and each critical one would search for victims; timed with and without remembering failed
searches. Not recorded in docs/performance.md by itself (see its "After the
profile" table); never part of the test run.
"""
from __future__ import annotations

import argparse
import time

from dispatcher.policy.placing import ClusterState, QueuedJob
from dispatcher.policy.planning import plan_cycle
from dispatcher.policy.plans import Active, Candidate, ClassPolicy
from dispatcher.policy.quotas import QueueQuota

GI = 2**30 * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--clusters", type=int, default=100)
    parser.add_argument("--full", action="store_true", help="every cluster full: nothing starts, searches fail")
    args = parser.parse_args()
    if args.full:
        return full(args)
    room = {"cpu": 10**9, "memory": 10**19}  # each cluster: far more than the whole backlog asks
    clusters = [ClusterState(f"c{i}", "onprem", "dc-1", {}, dict(room), {"cpu": 10**8, "memory": 10**18}, "",
                             dict(room))
                for i in range(args.clusters)]
    heads, total = _heads(args, {"standard": ClassPolicy("standard", 500)}, ("standard",))
    started = time.perf_counter()
    plan = plan_cycle(heads, [], clusters, _queues(args), {"standard": ClassPolicy("standard", 500)}, {}, time.time())
    seconds = time.perf_counter() - started
    print(f"plan_cycle: {len(plan.places):,} of {total:,} heads placed in {seconds:.2f}s: "
          f"{len(plan.places) / seconds:,.0f} jobs/s ({args.queues} queues under 10 parents x {args.heads} heads, "
          f"{args.clusters} clusters with room for all)")


def full(args) -> None:
    classes = {"critical": ClassPolicy("critical", 1000, can_preempt=True), "standard": ClassPolicy("standard", 500),
               "batch": ClassPolicy("batch", 100, preemptible=True)}
    room = {"cpu": 64_000 * 100, "memory": 256 * GI * 100}
    clusters = [ClusterState(f"c{i}", "onprem", "dc-1", {}, {"cpu": 0, "memory": 0}, {"cpu": 0, "memory": 0}, "",
                             dict(room)) for i in range(args.clusters)]
    active = [Active(10**7 + i * 10 + n, f"q{(i * 10 + n) % args.queues}", "batch", 100, 0, f"c{i}",
                     {"cpu": 100, "memory": GI // 10}, True) for i in range(args.clusters) for n in range(10)]
    heads, total = _heads(args, classes, ("standard",) * 14 + ("batch",) * 5 + ("critical",))
    for remember in (True, False):
        started = time.perf_counter()
        plan = plan_cycle(heads, active, clusters, _queues(args), classes, {}, time.time(),
                          remember_failed_searches=remember)
        seconds = time.perf_counter() - started
        print(f"plan_cycle, every cluster full ({'failed searches remembered' if remember else 'every search run'}): "
              f"{len(plan.waits):,} of {total:,} heads waiting, {len(plan.preemptions)} preempted, in {seconds:.2f}s "
              f"({args.queues} queues x {args.heads} heads, {args.clusters} clusters, {len(active):,} running)")


def _queues(args) -> list[QueueQuota]:
    """10 parents, each over an equal share of the leaf queues; no guarantees or maxima."""
    return [QueueQuota(f"p{i}", None, {}, {}, 1.0) for i in range(10)] + [
        QueueQuota(f"q{i}", f"p{i % 10}", {}, {}, 1.0) for i in range(args.queues)]


def _heads(args, classes: dict[str, ClassPolicy], mix: tuple[str, ...]) -> tuple[dict[str, list[Candidate]], int]:
    """`args.heads` heads per leaf queue in queue order, 1-3 pods of 1 cpu / 2 GiB each, classes from `mix`."""
    heads: dict[str, list[Candidate]] = {}
    job_id = 0
    for i in range(args.queues):
        for n in range(args.heads):
            job_id += 1
            pods = 1 + n % 3
            cls = mix[(job_id * 7) % len(mix)]
            heads.setdefault(f"q{i}", []).append(Candidate(
                QueuedJob(job_id, {"cpu": 1000 * pods, "memory": 2 * GI * pods}, {"cpu": 1000, "memory": 2 * GI}),
                f"q{i}", cls, classes[cls].priority, n % 10))
    for q in heads.values():
        q.sort(key=lambda c: (-c.class_priority, -c.priority, c.job.id))
    return heads, job_id


if __name__ == "__main__":
    main()
