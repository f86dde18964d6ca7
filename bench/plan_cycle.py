"""The pure policy alone: one plan_cycle over many queue heads and clusters, no database.

    python -m bench.plan_cycle [--queues 1000] [--heads 64] [--clusters 100]

Prints jobs planned per second. Not recorded in docs/performance.md by itself (see its "After the
profile" table); never part of the test run.
"""
from __future__ import annotations

import argparse
import time

from dispatcher.policy.placing import ClusterState, QueuedJob
from dispatcher.policy.planning import Candidate, ClassPolicy, plan_cycle
from dispatcher.policy.quotas import QueueQuota

GI = 2**30 * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--clusters", type=int, default=100)
    args = parser.parse_args()
    queues = [QueueQuota(f"p{i}", None, {}, {}, 1.0) for i in range(10)]
    queues += [QueueQuota(f"q{i}", f"p{i % 10}", {}, {}, 1.0) for i in range(args.queues)]
    room = {"cpu": 10**9, "memory": 10**15}
    clusters = [ClusterState(f"c{i}", "onprem", "dc-1", {}, dict(room), {"cpu": 10**8, "memory": 10**14}, "", dict(room))
                for i in range(args.clusters)]
    heads: dict[str, list[Candidate]] = {}
    job_id = 0
    for i in range(args.queues):
        for n in range(args.heads):
            job_id += 1
            pods = 1 + n % 3
            request = {"cpu": 1000 * pods, "memory": 2 * GI * pods}
            heads.setdefault(f"q{i}", []).append(Candidate(
                QueuedJob(job_id, request, {"cpu": 1000, "memory": 2 * GI}), f"q{i}", "standard", 500, n % 10))
    started = time.perf_counter()
    plan = plan_cycle(heads, [], clusters, queues, {"standard": ClassPolicy("standard", 500)}, {}, time.time())
    seconds = time.perf_counter() - started
    print(f"plan_cycle: {len(plan.places):,} of {job_id:,} heads placed in {seconds:.2f}s: "
          f"{len(plan.places) / seconds:,.0f} jobs/s ({args.queues} queues under 10 parents x {args.heads} heads, "
          f"{args.clusters} clusters with room for all)")


if __name__ == "__main__":
    main()
