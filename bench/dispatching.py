"""dispatch, cycle, floor and memory: the deep-backlog benchmarks, over one loaded backlog.

1. Load the backlog in steps (binary COPY into the migrated schema), and at each size of `sizes` run
   cycles with every cluster full: nothing can start. The first plans every queue's heads; the later
   ones take turns (cycling.WAIT_KINDS): after a submit to one queue, after nothing, and planning every
   queue. Their times against the backlog size show whether a cycle scans the backlog (cycle).
2. Copy the full backlog (CREATE DATABASE ... TEMPLATE) for the floor.
3. Give every cluster room for the whole backlog and run cycles until it is all dispatched: jobs
   decided and committed per second of cycle time (dispatch); the cycle process's RSS throughout
   (memory).
4. The floor: the same claim-and-record in plain SQL over the copy, batches of 1,000 (floor), and
   dispatch as a ratio of it.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

from bench import backlog, cycling, floor, workload
from bench.figures import Figure, Run, Target
from bench.postgres import Postgres
from dispatcher.scheduler.settings import SchedulerSettings

GiB = 1 << 30


@dataclass(frozen=True)
class BacklogConfig:
    jobs: int = 1_000_000
    queues: int = 1_000
    clusters: int = 100
    sizes: tuple[int, ...] = (1_000, 100_000, 1_000_000)  # backlog sizes for the cycle-time figure
    wait_cycles: int = 16  # per size: the first (writes every pending reason), then 5 of each kind
    wait_time_limit_s: float = 900.0  # per size: no cycle starts after this
    drain_time_limit_s: float = 1200.0  # no drain cycle starts after this (the rate is of what it dispatched)
    floor_time_limit_s: float = 900.0

    @classmethod
    def quick(cls) -> BacklogConfig:
        return cls(jobs=20_000, queues=100, clusters=10, sizes=(1_000, 5_000, 20_000), wait_cycles=7,
                   wait_time_limit_s=120.0, drain_time_limit_s=300.0, floor_time_limit_s=120.0)


def run(pg: Postgres, config: BacklogConfig, run: Run, wanted: set[str], *, profile_path: str | None = None) -> None:
    nodes = workload.nodes_for(config.jobs, config.clusters)
    names = workload.cluster_names(config.clusters)
    sizes = tuple(sorted({s for s in config.sizes if s <= config.jobs} | {config.jobs})) if "cycle" in wanted \
        else (config.jobs,)
    shown = {**asdict(config), "sizes": list(sizes), "nodes_per_cluster": nodes,
             "node": {"cpu": "64", "memory": "256Gi"}, "queue_tree": f"{min(10, config.queues)} parents, "
             f"{config.queues} leaf queues, no quotas",
             "classes": "critical 5% / standard 70% / batch 25%, priority 0-9",
             "shapes": [asdict(s) for s in workload.SHAPES], "per_queue": SchedulerSettings().per_queue,
             "floor_batch": floor.BATCH}
    run.configs[", ".join(sorted(wanted & {"dispatch", "cycle", "floor", "memory"}))] = shown
    print(f"backlog: {config.jobs:,} jobs in {config.queues:,} queues, {config.clusters} clusters of {nodes} nodes",
          flush=True)
    db = pg.create("backlog")
    backlog.register(pg.url(db), queues=config.queues, clusters=config.clusters, nodes=nodes)
    rows = backlog.Rows(config.queues)
    loaded, load_seconds, copy_seconds = 0, 0.0, 0.0
    waits: dict[int, dict] = {}
    wait_rss = 0
    for size in sizes:
        began = time.perf_counter()
        took = backlog.load(pg.libpq(db), rows, loaded, size)
        load_seconds += time.perf_counter() - began
        copy_seconds += took["copy"]
        print(f"  loaded {size:,} queued jobs ({size - loaded:,} in {time.perf_counter() - began:.1f}s: "
              + ", ".join(f"{k} {v:.1f}s" for k, v in took.items()) + ")", flush=True)
        loaded = size
        if "cycle" in wanted or ("memory" in wanted and size == config.jobs):
            wait_profile = f"{profile_path}.wait" if profile_path and size == config.jobs else None
            result = cycling.in_child(pg.url(db), names, nodes, mode="wait", max_cycles=config.wait_cycles,
                                      time_limit_s=config.wait_time_limit_s, queues_count=config.queues,
                                      profile_path=wait_profile, timeout_s=config.wait_time_limit_s + 1800)
            cycles = result["cycles"]
            waits[size] = {"first": cycles[0]["seconds"], "waiting": cycles[0]["waiting"], **{
                kind: statistics.median([c["seconds"] for c in cycles if c["kind"] == kind] or [float("nan")])
                for kind in cycling.WAIT_KINDS}}
            print(f"  {size:,} queued, every cluster full: first cycle {cycles[0]['seconds']:.3f}s (writes "
                  f"{cycles[0]['waiting']:,} pending reasons), then "
                  + ", ".join(f"{c['kind']} {c['seconds']:.3f}s" for c in cycles[1:]), flush=True)
            if size == config.jobs:
                wait_rss = result["rss_peak"]
    run.add(Figure("load", "backlog load (binary COPY: jobs + submit events)", config.jobs / copy_seconds, "jobs/s",
                   note=f"{config.jobs:,} jobs; {load_seconds:.0f}s with encoding, index rebuilds and VACUUM ANALYZE"))
    if "cycle" in wanted:
        what = {"submit": "after a submit to one queue (the others parked)", "nothing": "after nothing happened",
                "every": "planning every queue's heads"}
        for kind in cycling.WAIT_KINDS:
            for size in sizes:
                run.add(Figure("cycle", f"cycle time, {size:,} queued, nothing fits, {what[kind]} (median)",
                               waits[size][kind] * 1000, "ms",
                               note=f"{waits[size]['waiting']:,} heads; first cycle {waits[size]['first']:.2f}s"
                               if kind == "every" else ""))
            small, big = waits[sizes[0]][kind], waits[sizes[-1]][kind]
            run.add(Figure("cycle", f"cycle time ratio {sizes[-1]:,} / {sizes[0]:,} queued, {what[kind]}", big / small,
                           "x", Target("<=", 2.0) if kind == "submit" else None))
            if len(sizes) > 2 and kind == "every":
                mid = waits[sizes[-2]][kind]
                run.add(Figure("cycle", f"cycle time ratio {sizes[-1]:,} / {sizes[-2]:,} queued, {what[kind]} "
                               "(the same heads)", big / mid, "x"))
    floor_db = None
    if "floor" in wanted or "dispatch" in wanted:
        floor_db = pg.create("floor", template=db)
    dispatch_rate = None
    dispatched = config.jobs  # the floor claims as many jobs as the drain dispatched (all, unless time ran out)
    if "dispatch" in wanted or "memory" in wanted:
        began = time.perf_counter()
        result = cycling.in_child(pg.url(db), names, nodes, mode="drain", max_cycles=10_000,
                                  time_limit_s=config.drain_time_limit_s, profile_path=profile_path,
                                  timeout_s=config.drain_time_limit_s + 900)
        wall = time.perf_counter() - began
        cycles = result["cycles"]
        dispatched = sum(c["dispatched"] for c in cycles)
        cycle_seconds = sum(c["seconds"] for c in cycles)
        cycle_cpu = sum(c["cpu"] for c in cycles)
        dispatch_rate = dispatched / cycle_seconds
        print(f"  drain: {dispatched:,} dispatched in {len(cycles)} cycles, {cycle_seconds:.1f}s of cycles "
              f"({wall:.1f}s wall, agents' heartbeats {result['heartbeat_s']:.1f}s); the cycle process used "
              f"{cycle_cpu:.1f}s of CPU in them", flush=True)
        for n, c in enumerate(cycles):
            print(f"    cycle {n + 1}: {c['dispatched']:,} dispatched in {c['seconds']:.2f}s (cpu {c['cpu']:.2f}s), "
                  f"rss {c['rss'] / 2**20:.0f} MiB", flush=True)
        limited = " (stopped by the time limit)" if result.get("stopped_by_time_limit") else ""
        if limited:
            run.notes.append(f"dispatch stopped by its {config.drain_time_limit_s:,.0f} s limit after "
                             f"{dispatched:,} of {config.jobs:,} jobs; the floor claimed as many")
        if "dispatch" in wanted:
            run.add(Figure("dispatch", f"dispatch from a {config.jobs:,}-job backlog", dispatch_rate, "jobs/s",
                           Target(">=", 10_000), note=f"{dispatched:,} jobs in {len(cycles)} cycles, "
                           f"{cycle_seconds:.1f}s of cycle time, {cycle_cpu:.1f}s of it on the cycle process's CPU"
                           f"{limited}"))
            busy = [c for c in cycles if c["dispatched"]]
            first = busy[0] if busy else cycles[0]
            run.add(Figure("dispatch", "dispatch, first cycle (no active attempts yet)",
                           first["dispatched"] / first["seconds"], "jobs/s",
                           note=f"{first['dispatched']:,} jobs in {first['seconds']:.2f}s"))
        if "memory" in wanted:
            peak = max(result["rss_peak"], wait_rss)
            run.add(Figure("memory", f"cycle process peak RSS, {config.jobs:,} queued", peak / GiB, "GiB",
                           Target("<=", 1.0), note=f"waiting cycles {wait_rss / GiB:.2f} GiB; draining (active "
                           f"attempts growing to {dispatched:,}) {result['rss_peak'] / GiB:.2f} GiB"))
    if floor_db is not None:
        print("  floor plan:\n" + "\n".join("    " + line for line in floor.plan(pg.libpq(floor_db), config.clusters)
                                            .splitlines()[:8]), flush=True)
        result = floor.drain(pg.libpq(floor_db), config.clusters, limit=dispatched,
                             time_limit_s=config.floor_time_limit_s)
        print(f"  floor: {result['jobs']:,} claimed in {result['batches']:,} batches, {result['seconds']:.1f}s",
              flush=True)
        if "floor" in wanted or "dispatch" in wanted:
            run.add(Figure("floor", f"plain-SQL claim-and-record, batches of {floor.BATCH:,}", result["rate"], "jobs/s",
                           note=f"{result['jobs']:,} jobs in {result['seconds']:.1f}s"))
        if dispatch_rate is not None:
            run.add(Figure("dispatch", "dispatch / floor", dispatch_rate / result["rate"], "x", Target(">=", 0.3)))
        pg.drop(floor_db)
    pg.drop(db)
