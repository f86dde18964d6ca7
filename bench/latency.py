"""latency: from a submit to the job's dispatch and its start, one job at a time at a steady pace, measured
from outside (a client watching every event) and inside (the transactions' start times)."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime

import psycopg

from bench import workload
from bench.figures import Figure, Run, Target
from bench.postgres import Postgres
from bench.systems import SPLIT, System, _start, _stop, objects, percentiles
from sluice import process as tuning


@dataclass(frozen=True)
class LatencyConfig:
    interval_s: float = 0.010  # one job every 10 ms
    seconds: float = 30.0
    sim_clusters: int = 4
    nodes: int = 4
    duration: str = "0.5s"  # each job's simulated run time
    submitters: int = 8  # threads that send the paced calls (a slow call does not delay the next)
    calm_interval_s: float = 0.100  # a second, calmer pass (no target): what one job sees with no queue
    settle_s: float = 60.0  # after the last submit, how long to wait for every job to run
    split: bool = True  # the agents in a process of their own (False: all in one `sluice up` process)
    tls: bool = True  # as deployed; False: plaintext on loopback (--plaintext), the code's cost alone
    replicas: int = 1  # dispatcher processes (split only): the first leads and serves the agents, clients call the last
    # (split only) the leader only schedules; an API replica (--no-schedule) serves agents and clients
    apart: bool = False

    @classmethod
    def quick(cls) -> LatencyConfig:
        return cls(seconds=5.0)


def _watch_events(pipe, config) -> None:
    """Watch every job event; answer each message with what was seen so far, {(job, state): arrival}."""
    tuning.apply()  # a process entry point: before it imports grpc
    from sluice.client import Client

    seen: dict[tuple[int, str], float] = {}
    lags: dict[str, list[float]] = {}  # per state moved to: from its transaction's start to here, wall clock
    client = Client(config)

    def watch() -> None:
        try:
            for event in client.watch():
                key = (event["jobId"], event["to"])
                if key not in seen:
                    seen[key] = time.monotonic()
                    lags.setdefault(event["to"], []).append(
                        time.time() - datetime.fromisoformat(event["at"]).timestamp())
        except Exception:
            pass

    threading.Thread(target=watch, daemon=True).start()
    pipe.send("watching")
    while pipe.recv() != "stop":
        pipe.send((dict(seen), {k: list(v) for k, v in lags.items()}))
    pipe.send("stopped")
    client.close()


def latency(pg: Postgres, config: LatencyConfig, run: Run) -> None:
    run.configs["latency"] = {**asdict(config), "job": f"1 pod, 1 cpu, 2Gi, {config.duration}, class standard",
                              "server": SPLIT if config.split else "sluice up (Embedded) in its own process",
                              "measured": "one monotonic clock: submit call start -> the job's event arriving on "
                                          "a Watch stream (watched from a process of its own)"}
    for interval, target in ((config.interval_s, True), (config.calm_interval_s, False)):
        _latency_at(pg, config, run, interval, target)


def _latency_at(pg: Postgres, config: LatencyConfig, run: Run, interval_s: float, target: bool) -> None:
    with System(pg, "latency", objects(config.sim_clusters, config.nodes), split=config.split,
                replicas=config.replicas, apart=config.apart, tls=config.tls) as system:
        client = system.client()
        # The events are watched from a process of its own: time.monotonic() is the same clock across
        # processes, and the watcher's work (hundreds of events a second) then delays no submit.
        watcher, pipe, _ = _start(_watch_events, (system.config(3600),), "bench-watcher", 60)
        time.sleep(1.0)
        doc = workload.job_document("default", workload.SHAPES[0], "standard", 0, duration=config.duration)
        submitted: dict[int, float] = {}
        calls: list[float] = []

        walls: dict[int, float] = {}  # the submit call's start on the wall clock (the database's clock)

        def submit_one() -> None:
            t, wall = time.monotonic(), time.time()
            job_id = client.submit([doc])[0]
            submitted[job_id], walls[job_id] = t, wall
            calls.append(time.monotonic() - t)

        # The pace is kept whatever one call takes: calls go out from a pool, each at its own time.
        began = time.monotonic() + 0.1
        with ThreadPoolExecutor(max_workers=config.submitters, thread_name_prefix="submit") as pool:
            futures = []
            for n in range(int(config.seconds / interval_s)):
                pause = began + n * interval_s - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                futures.append(pool.submit(submit_one))
            for f in futures:
                f.result()
        deadline = time.monotonic() + config.settle_s
        while True:
            pipe.send("seen?")
            seen, lags = pipe.recv()
            if time.monotonic() > deadline or all((i, "RUNNING") in seen or (i, "SUCCEEDED") in seen
                                                  for i in submitted):
                break
            time.sleep(0.2)
        _stop(watcher, pipe)
        with psycopg.connect(system.libpq) as conn:
            unseen = [i for i in submitted if (i, "DISPATCHED") not in seen]
            in_db = conn.execute("SELECT count(*) FROM job_events WHERE to_state = 'DISPATCHED' AND job_id = ANY(%s)",
                                 (unseen,)).fetchone()[0] if unseen else 0
            db_rows = conn.execute(
                "SELECT extract(epoch FROM a.dispatched_at - j.created_at), "
                """extract(epoch FROM a.started_at - j.created_at),
                          j.id, extract(epoch FROM j.created_at), extract(epoch FROM a.dispatched_at)
                   FROM jobs j JOIN attempts a ON a.job_id = j.id AND a.attempt = 1""").fetchall()
        client.close()
    dispatched = [seen[(i, "DISPATCHED")] - t for i, t in submitted.items() if (i, "DISPATCHED") in seen]
    running = [seen[(i, "RUNNING")] - t for i, t in submitted.items() if (i, "RUNNING") in seen]
    call = sorted(calls)[len(calls) // 2] if calls else 0.0
    pace = f"a job every {interval_s * 1000:g} ms"
    note = f"{pace}: {len(submitted):,} jobs over {config.seconds:g}s, Submit call p50 {call * 1000:.0f} ms"
    if unseen:
        late = len(unseen) - in_db
        note += (f"; {len(unseen)} without a DISPATCHED event on the stream: {in_db} dispatched (in job_events, "
                 f"skipped by Watch), {late} not dispatched {config.settle_s:g}s after the last submit")
        if in_db:
            run.notes.append(f"latency ({pace}): the Watch stream skipped {in_db} DISPATCHED events that job_events "
                             "holds (events committed out of id order pass its cursor)")
    d50, d99 = percentiles(dispatched)
    r50, r99 = percentiles(running)
    run.add(Figure("latency", f"submit->dispatched p50, {pace}", d50 * 1000, "ms", note=note))
    run.add(Figure("latency", f"submit->dispatched p99, {pace}", d99 * 1000, "ms",
                   Target("<=", 50) if target else None, note=note))
    run.add(Figure("latency", f"submit->running p50, {pace}", r50 * 1000, "ms",
                   note=f"{len(running):,} jobs seen RUNNING"))
    run.add(Figure("latency", f"submit->running p99, {pace}", r99 * 1000, "ms",
                   note=f"{len(running):,} jobs seen RUNNING"))
    db_d = [float(r[0]) for r in db_rows if r[0] is not None]
    db_r = [float(r[1]) for r in db_rows if r[1] is not None]
    if db_d and db_r:
        print(f"  database clocks (transaction start times): submit->dispatched p50/p99 "
              f"{percentiles(db_d)[0] * 1000:.1f}/{percentiles(db_d)[1] * 1000:.1f} ms, submit->running "
              f"{percentiles(db_r)[0] * 1000:.1f}/{percentiles(db_r)[1] * 1000:.1f} ms", flush=True)
    # What the cycle's transaction, its commit and the Watch stream add after the dispatch began; and, to
    # compare, what a report's transaction (a few statements) and the stream add to RUNNING.
    for state, what in (("DISPATCHED", "dispatch"), ("RUNNING", "report")):
        if lags.get(state):
            print(f"  {what} transaction start -> {state} event on the stream p50/p99 "
                  f"{percentiles(lags[state])[0] * 1000:.1f}/{percentiles(lags[state])[1] * 1000:.1f} ms", flush=True)
    _anatomy(submitted, walls, seen, db_rows)
    if system.leader_stats.get("cycles"):
        n, total = system.leader_stats["cycles"], system.leader_stats["cycle_seconds"]
        print(f"  the leader ran {n:,.0f} cycles, {total / n * 1000:.1f} ms each on average; its process used "
              f"{system.leader_stats['cpu_seconds'] / len(submitted) * 1000:.2f} ms of CPU per job", flush=True)


def _anatomy(submitted: dict[int, float], walls: dict[int, float], seen: dict, db_rows: list) -> None:
    """Where the slowest 5 % of jobs (submit -> DISPATCHED seen) spent their time, against all jobs: the
    call up to its transaction's start, then up to the dispatching cycle's transaction start, then up to
    the event's arrival on the Watch stream (wall clock: this machine's, which the database shares)."""
    parts = []
    for _, _, job_id, created, dispatched in db_rows:
        if job_id in walls and (job_id, "DISPATCHED") in seen and created is not None and dispatched is not None:
            arrived = walls[job_id] + seen[(job_id, "DISPATCHED")] - submitted[job_id]
            parts.append((arrived - walls[job_id], float(created) - walls[job_id], float(dispatched) - float(created),
                          arrived - float(dispatched)))
    if len(parts) < 20:
        return
    parts.sort()
    def mean(rows, i):
        return sum(r[i] for r in rows) / len(rows) * 1000
    for label, rows in (("all jobs", parts), ("slowest 5%", parts[-max(1, len(parts) // 20):])):
        print(f"  {label}: {mean(rows, 0):.1f} ms = call to its transaction {mean(rows, 1):.1f} + to the dispatch "
              f"transaction {mean(rows, 2):.1f} + to the stream {mean(rows, 3):.1f} (means)", flush=True)


