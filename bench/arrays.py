"""arrays: a 100,000-element job array against the same backlog of plain jobs (issue 28).

Each variant gets a fresh database with the same classes, one queue and the same on-premises clusters
(room for every job at once), and runs in a process of its own (spawn):

- plain: 100,000 one-pod jobs in one Submit (the fast path: `group_commit.Submitter`, binary COPY);
- array: ONE document with `spec.array: {count: 100000}`, the same pod, in one Submit (the same
  Submitter, which hands it to `services.waiting.submit`);
- limited: the same array with `parallelism` (1,000), its elements ending `duration_s` after they were
  dispatched, so that the leader's release pass must queue the next ones as slots free.

The documents are parsed and written as the gRPC SubmitStream does with one submit (`Submitter.whole`, its
requests of at most 10,000 documents, then `Submitter.submit_whole`): the submit time is the call's server
side without the transport. Then `VACUUM (ANALYZE) jobs`, untimed, as after any bulk load (the dispatch
benchmark's loader does the same), so that both variants start from the same table state. Then the leader's
loop (dispatcher/scheduler/loop.py) without its lock and waits: the release pass (`services.waiting.release`) once every
`release_interval_s`, then `run_cycle` with `now` read once. Between cycles an agents' stand-in does, for
every cluster, what its agent link would: reads its new dispatch commands with their documents
(`outbox.pending_many`: for an array element the query builds the document with jsonb_set), acks them,
reports capacity and applied_through (`backlog.Agents`), and in the limited variant reports RUNNING and
SUCCEEDED once an element has run its time (`reporting.apply_many`). Each of those is timed apart from the
cycles: the cycle time and the dispatch rate (jobs dispatched / seconds in `run_cycle`) are the scheduler's
alone, as the dispatch benchmark measures them.
"""
from __future__ import annotations

import heapq
import json
import logging
import multiprocessing
import statistics
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import psycopg
from sqlalchemy import text
from sqlalchemy.orm import sessionmaker

from bench import backlog, workload
from bench.figures import Figure, Run
from bench.postgres import Postgres
from bench.systems import percentiles
from dispatcher import wakes
from dispatcher.scheduler.mapping import PolicyConfig
from dispatcher.scheduler.parking import Parking
from dispatcher.scheduler.postgres_cycle import run_cycle
from dispatcher.scheduler.settings import SchedulerSettings
from dispatcher.services import group_commit, reporting, submitting, waiting
from dispatcher.store import channels, database, outbox
from dispatcher.store.listening import Notifier
from dispatcher.store.tokens import Principal
from sluice.wire import AttemptReport

VARIANTS = ("plain", "array", "limited")
QUEUE = "q-0000"  # workload.queue_tree(1): one leaf queue under one parent
REPORT_BATCH_S = 0.1  # the agents' stand-in reports the elements that ended at most this often, together


@dataclass(frozen=True)
class ArraysConfig:
    jobs: int = 100_000  # jobs of the plain backlog, elements of each array
    clusters: int = 10
    parallelism: int = 1_000  # the limited array's
    duration_s: float = 1.0  # a limited array's element runs 0.5 to 1.5 times this (from its dispatch being read)
    limited_jobs: int = 100_000  # elements of the limited array
    rounds: int = 2  # plain, array, plain, array, ... (the machine is noisy), then the limited array once
    drain_time_limit_s: float = 600.0  # per variant: no cycle starts after this
    limited_time_limit_s: float = 240.0  # the limited array: its rate is over what ended by then

    @classmethod
    def quick(cls) -> ArraysConfig:
        return cls(jobs=5_000, clusters=4, parallelism=100, limited_jobs=2_000, rounds=1,
                   drain_time_limit_s=120.0, limited_time_limit_s=60.0)


def documents(kind: str, config: ArraysConfig) -> list[str]:
    """The submit of each variant, as the JSON documents a client sends: one one-pod job per plain job, or
    one document whose `spec.array` makes the elements."""
    doc = workload.job_document(QUEUE, workload.SHAPES[0], "standard", 0)
    if kind == "plain":
        return [json.dumps(doc)] * config.jobs
    if kind == "array":
        doc["spec"]["array"] = {"count": config.jobs}
    else:
        doc["spec"]["array"] = {"count": config.limited_jobs, "parallelism": config.parallelism}
    return [json.dumps(doc)]


class AgentLinks:
    """Every cluster's agent link, between cycles: read the new dispatch commands with their documents (as
    the link sends them), ack them, and, when jobs run for a while, report RUNNING and SUCCEEDED for those
    whose time is up (a sim agent's pods). A job runs duration_s times 0.5 to 1.5 (from a hash of its id:
    jobs that all took exactly the release pass's interval would end in step with it)."""

    def __init__(self, clusters: list[str], duration_s: float | None):
        self.clusters = clusters
        self.duration_s = duration_s
        self.after = {c: 0 for c in clusters}
        self.running: list[tuple[float, str, int, int]] = []  # heap of (ends at, cluster, job, attempt)
        self.read_s = 0.0
        self.read_rows = 0
        self.report_s = 0.0
        self.reported_at = 0.0  # monotonic time of the last reports

    def read(self, session) -> None:
        began = time.perf_counter()
        wants = [(c, self.after[c]) for c in self.clusters]
        acks = []
        now = time.monotonic()
        for (cluster, _), rows in zip(wants, outbox.pending_many(session, wants)):
            for row in rows:
                json.loads(row.spec_json)  # the link parses the document it sends on
                acks.append((cluster, row.id))
                self.after[cluster] = max(self.after[cluster], row.id)
                if row.kind == "dispatch" and self.duration_s is not None:
                    runs = self.duration_s * (0.5 + (row.job_id * 2654435761 & 0xFFFF) / 0xFFFF)
                    heapq.heappush(self.running, (now + runs, cluster, row.job_id, row.attempt))
        if acks:
            outbox.ack_many(session, acks)
        self.read_rows += len(acks)
        self.read_s += time.perf_counter() - began

    def finish(self, session) -> int:
        """Report RUNNING then SUCCEEDED for the jobs that have run their time; how many ended."""
        now = time.monotonic()
        if not self.running or self.running[0][0] > now:
            return 0
        began = time.perf_counter()
        self.reported_at = now
        by_cluster: dict[str, list] = {}
        wall = time.time()
        while self.running and self.running[0][0] <= now:
            _, cluster, job, attempt = heapq.heappop(self.running)
            by_cluster.setdefault(cluster, []).extend((AttemptReport(job, attempt, "RUNNING", at=wall - 0.5),
                                                       AttemptReport(job, attempt, "SUCCEEDED", at=wall)))
        ended = sum(reporting.apply_many(session, cluster, reports) for cluster, reports in by_cluster.items())
        self.report_s += time.perf_counter() - began
        return ended

    def next_due(self) -> float | None:
        return self.running[0][0] if self.running else None


def drain(url: str, libpq: str, clusters: list[str], nodes: int, kind: str, config: ArraysConfig) -> dict:
    """In a fresh process: submit the variant's documents, then the leader's loop until every job is
    dispatched (plain, array) or ended (limited), or the time limit. Per-cycle figures, the submit's
    seconds and the stand-in's."""
    logging.basicConfig(level=logging.WARNING)
    db = database.connect(database.DatabaseSettings(url=url, pool_size=3, pool_overflow=0))
    sessions = sessionmaker(db.engine, expire_on_commit=False)
    settings = SchedulerSettings()
    limited = kind == "limited"
    total = config.limited_jobs if limited else config.jobs
    docs = documents(kind, config)
    out: dict = {"kind": kind, "jobs": total, "cycles": [], "releases": []}
    parking = Parking()
    woken, work = threading.Event(), threading.Event()

    def wake(payload: str) -> None:  # the leader's Scheduler._woken: submits and releases name their queue
        if parking.touch(payload):
            if payload != wakes.ROOM:
                work.set()
            woken.set()
    notifier = Notifier(db.engine, (channels.WAKE_CHANNEL,))
    notifier.subscribe(channels.WAKE_CHANNEL, wake)
    notifier.start()
    try:
        submitter = group_commit.Submitter(sessions)
        began = time.perf_counter()
        whole = submitter.whole("")  # one submit, its requests as a stream's (at most MAX_BATCH documents each)
        for lo in range(0, len(docs), submitting.MAX_BATCH):
            whole.add(docs[lo:lo + submitting.MAX_BATCH], more=lo + submitting.MAX_BATCH < len(docs))
        parsed = time.perf_counter()
        ids = submitter.submit_whole(Principal("bench", "admin"), whole).ids
        out["submit_s"] = time.perf_counter() - began
        out["parse_s"] = parsed - began
        assert len(ids) == total, (len(ids), total)
        # As after any bulk load (autovacuum would, within its minute's nap): the cycle's queue usage read
        # plans by the table's statistics and reads its index alone on all-visible pages. Without this,
        # where autovacuum's first pass falls in each drain moves the cycle time by tens of ms.
        t = time.perf_counter()
        with psycopg.connect(libpq, autocommit=True) as conn:
            conn.execute("VACUUM (ANALYZE) jobs")
        out["vacuum_s"] = time.perf_counter() - t
        agents = backlog.Agents(clusters, nodes)
        links = AgentLinks(clusters, config.duration_s if limited else None)
        holds: dict = {}
        policy = PolicyConfig()
        deeper: frozenset[str] = frozenset()
        reasons_at = released_at = -1e9
        stand_in_s = 0.0
        limit = config.limited_time_limit_s if limited else config.drain_time_limit_s
        started = time.monotonic()
        dispatched = ended = 0
        while True:
            if time.monotonic() - released_at >= settings.release_interval_s:
                released_at = time.monotonic()
                t = time.perf_counter()
                with sessions.begin() as session:
                    released = waiting.release(session, datetime.now(UTC))
                out["releases"].append({"seconds": time.perf_counter() - t, "queued": released.queued,
                                        "at": released_at - started})
            t = time.perf_counter()
            with sessions.begin() as session:
                ended += links.finish(session)
                agents.report(session, datetime.now(UTC))
            stand_in_s += time.perf_counter() - t
            woken.clear()
            work.clear()
            write_reasons = time.monotonic() - reasons_at >= settings.reason_interval_s
            if write_reasons:
                reasons_at = time.monotonic()
            cpu = time.process_time()
            result = run_cycle(sessions, settings, datetime.now(UTC), holds=holds, write_reasons=write_reasons,
                               config=policy, parking=parking, deeper=deeper)
            cpu = time.process_time() - cpu
            holds, deeper = result.holds, result.deeper
            dispatched += result.dispatched
            out["cycles"].append({"seconds": result.seconds, "cpu": cpu, "dispatched": result.dispatched,
                                  "at": time.monotonic() - started})
            t = time.perf_counter()
            with sessions.begin() as session:  # the links send what the cycle dispatched at once (a notification)
                links.read(session)
            stand_in_s += time.perf_counter() - t
            if (ended if limited else dispatched) >= total:
                break
            if time.monotonic() - started > limit:
                out["stopped_by_time_limit"] = True
                break
            if parking.rewake():
                work.set()
                woken.set()
            if not (result.dispatched and result.more):
                # The leader waits for a wake-up or the next release pass; meanwhile the agents report the
                # elements that end (limited). A report that only frees room (ROOM) after a cycle that left
                # nothing queued does not end the wait (Scheduler._lead).
                due = released_at + settings.release_interval_s
                while True:
                    finish = links.next_due()
                    until = min(due, max(finish, links.reported_at + REPORT_BATCH_S)) if finish is not None else due
                    if woken.wait(max(0.0, until - time.monotonic())) and (work.is_set() or not result.idle):
                        break
                    woken.clear()
                    if time.monotonic() >= due:
                        break
                    t = time.perf_counter()
                    with sessions.begin() as session:
                        ended += links.finish(session)
                    stand_in_s += time.perf_counter() - t
                    if ended >= total:
                        break
                if ended >= total and limited:
                    break
        out["wall_s"] = time.monotonic() - started
        out["dispatched"], out["ended"] = dispatched, ended
        out["stand_in_s"], out["outbox_read_s"], out["outbox_rows"] = stand_in_s, links.read_s, links.read_rows
        out["report_s"] = links.report_s
        if limited:
            out["gaps"] = _slot_gaps(sessions)
        with sessions() as session:
            out["states"] = dict(session.execute(text("SELECT state, count(*) FROM jobs GROUP BY 1")).all())
    finally:
        notifier.stop()
        db.close()
    return out


def _slot_gaps(sessions) -> dict:
    """How long slots stayed empty: the k-th element queued by a release pass against the k-th element
    ended (each fills the slot an ending freed), and how long a released element then waited for its
    dispatch, from the jobs' events (transaction start times)."""
    with sessions() as session:
        ends = [r[0] for r in session.execute(text(
            "SELECT at FROM job_events WHERE to_state = 'SUCCEEDED' ORDER BY at"))]
        queued = session.execute(text(
            """SELECT q.at, d.at FROM job_events q
               LEFT JOIN job_events d ON d.job_id = q.job_id AND d.to_state = 'DISPATCHED'
               WHERE q.from_state = 'WAITING' AND q.to_state = 'QUEUED' ORDER BY q.at""")).all()
    slot = [(q - e).total_seconds() for e, (q, _) in zip(ends, queued)]
    dispatch = [(d - q).total_seconds() for q, d in queued if d is not None]
    return {"slot": percentiles(slot), "slot_mean": statistics.fmean(slot) if slot else float("nan"),
            "dispatch": percentiles(dispatch), "released": len(queued)}


def _child(pipe, args) -> None:
    try:
        pipe.send(("ok", drain(*args)))
    except BaseException as exc:  # the parent reports it
        pipe.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _in_child(args: tuple, timeout_s: float) -> dict:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child, args=(child, args), name="bench-arrays")
    process.start()
    child.close()
    try:
        if not parent.poll(timeout_s):
            raise TimeoutError(f"the arrays process did not finish within {timeout_s:.0f}s")
        status, value = parent.recv()
    finally:
        process.join(10)
        if process.is_alive():
            process.terminate()
            process.join(10)
    if status != "ok":
        raise RuntimeError(f"the arrays process failed: {value}")
    return value


def nodes_for(jobs: int, clusters: int, headroom: float = 1.25) -> int:
    """Nodes per cluster (64 cpu each) so that every one-cpu job fits at once."""
    return max(1, -(-int(jobs * headroom) // (clusters * 64)))


def _variant(pg: Postgres, config: ArraysConfig, kind: str) -> dict:
    jobs = config.limited_jobs if kind == "limited" else config.jobs
    nodes = nodes_for(max(config.jobs, config.limited_jobs), config.clusters)
    names = workload.cluster_names(config.clusters)
    db = pg.create("arrays")
    try:
        backlog.register(pg.url(db), queues=1, clusters=config.clusters, nodes=nodes)
        pg.checkpoint()
        limit = config.limited_time_limit_s if kind == "limited" else config.drain_time_limit_s
        result = _in_child((pg.url(db), pg.libpq(db), names, nodes, kind, config), timeout_s=limit + 900)
    finally:
        pg.drop(db)
    busy = [c for c in result["cycles"] if c["dispatched"]]
    result["cycle_p50"], result["cycle_p99"] = percentiles([c["seconds"] for c in busy])
    result["cycle_s"] = sum(c["seconds"] for c in result["cycles"])
    result["busy_s"] = sum(c["seconds"] for c in busy)
    result["rate"] = result["dispatched"] / result["cycle_s"] if result["cycle_s"] else float("nan")
    releases = [r["seconds"] for r in result["releases"]]
    result["release_p50"], result["release_max"] = statistics.median(releases), max(releases)
    result["release_s"] = sum(releases)
    print(f"  {kind}: {jobs:,} jobs; submit {result['submit_s']:.2f}s (parse {result['parse_s']:.2f}s), "
          f"then VACUUM (ANALYZE) jobs {result['vacuum_s']:.1f}s; "
          f"{result['dispatched']:,} dispatched in {len(result['cycles']):,} cycles ({len(busy):,} dispatching), "
          f"{result['cycle_s']:.1f}s of cycles, {result['wall_s']:.1f}s wall; cycle p50/p99 "
          f"{result['cycle_p50'] * 1000:.1f}/{result['cycle_p99'] * 1000:.1f} ms; {result['rate']:,.0f} jobs/s; "
          f"release passes {len(releases)} (p50 {result['release_p50'] * 1000:.1f} ms, max "
          f"{result['release_max'] * 1000:.1f} ms, {sum(r['queued'] for r in result['releases']):,} queued); "
          f"agent links: outbox reads {result['outbox_read_s']:.1f}s for {result['outbox_rows']:,} commands, "
          f"reports {result['report_s']:.1f}s, stand-in in all {result['stand_in_s']:.1f}s; states "
          f"{result['states']}" + (" (stopped by the time limit)" if result.get("stopped_by_time_limit") else ""),
          flush=True)
    return result


def run(pg: Postgres, config: ArraysConfig, run: Run) -> None:
    nodes = nodes_for(max(config.jobs, config.limited_jobs), config.clusters)
    run.configs["arrays"] = {
        **asdict(config), "nodes_per_cluster": nodes, "node": {"cpu": "64", "memory": "256Gi"},
        "job": "1 pod, 1 cpu, 2Gi, class standard, priority 0, one queue",
        "submit": "group_commit.Submitter: whole() of requests of 10,000 documents, then submit_whole (the server "
                  "side of one SubmitStream submit)",
        "after_submit": "VACUUM (ANALYZE) jobs, untimed (as after a bulk load)",
        "loop": "the leader's (release pass every 1 s, run_cycle), a fresh database and process per variant; "
                "agent links' stand-in between cycles, untimed",
        "order": " ".join(["plain", "array"] * config.rounds) + " limited"}
    results: dict[str, list[dict]] = {k: [] for k in VARIANTS}
    for _ in range(config.rounds):
        for kind in ("plain", "array"):
            results[kind].append(_variant(pg, config, kind))
    results["limited"].append(_variant(pg, config, "limited"))

    def med(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in results[kind])
    rows = []
    for kind in VARIANTS:
        jobs = config.limited_jobs if kind == "limited" else config.jobs
        rows.append((kind, jobs, med(kind, "submit_s"), med(kind, "cycle_p50") * 1000, med(kind, "cycle_p99") * 1000,
                     med(kind, "rate")))
    print(f"\n  {'variant':<28} {'jobs':>9} {'submit s':>9} {'cycle p50 ms':>13} {'cycle p99 ms':>13} "
          f"{'dispatch jobs/s':>16}")
    label = {"plain": "plain jobs", "array": "array (one document)",
             "limited": f"array, parallelism {config.parallelism:,}"}
    for kind, jobs, submit_s, p50, p99, rate in rows:
        print(f"  {label[kind]:<28} {jobs:>9,} {submit_s:>9.2f} {p50:>13.1f} {p99:>13.1f} {rate:>16,.0f}")
    plain, array = rows[0], rows[1]
    print(f"  {'array / plain':<28} {'':>9} {array[2] / plain[2]:>9.2f} {array[3] / plain[3]:>13.2f} "
          f"{array[4] / plain[4]:>13.2f} {array[5] / plain[5]:>16.2f}\n", flush=True)
    for key, name, unit, scale, d in (("submit_s", "submit, one call", "s", 1, 2),
                                      ("cycle_p50", "cycle time p50 while dispatching", "ms", 1000, 1),
                                      ("cycle_p99", "cycle time p99 while dispatching", "ms", 1000, 1),
                                      ("rate", "dispatch (jobs / seconds in run_cycle)", "jobs/s", 1, 0)):
        each = "; ".join(f"{k} " + ", ".join(f"{r[key] * scale:,.{d}f}" for r in results[k])
                         for k in ("plain", "array"))
        p, a = med("plain", key) * scale, med("array", key) * scale
        run.add(Figure("arrays", f"{name}, {config.jobs:,} plain jobs", p, unit, note=f"each run: {each}"))
        run.add(Figure("arrays", f"{name}, an array of {config.jobs:,}", a, unit))
        run.add(Figure("arrays", f"{name}, array / plain", a / p, "x"))
    lim = results["limited"][0]
    gaps = lim["gaps"]
    ideal = config.parallelism / config.duration_s
    wall_rate = lim["ended"] / lim["wall_s"]
    print(f"  limited: {lim['ended']:,} of {config.limited_jobs:,} ended in {lim['wall_s']:.1f}s: {wall_rate:,.0f} "
          f"jobs/s against {ideal:,.0f} if every slot were always busy (elements of {config.duration_s / 2:g}-"
          f"{config.duration_s * 1.5:g}s); a freed slot filled (queued) after p50/p99 "
          f"{gaps['slot'][0] * 1000:.0f}/{gaps['slot'][1] * 1000:.0f} ms (mean {gaps['slot_mean'] * 1000:.0f}); "
          f"a released element dispatched after p50/p99 {gaps['dispatch'][0] * 1000:.0f}/"
          f"{gaps['dispatch'][1] * 1000:.0f} ms", flush=True)
    run.add(Figure("arrays", f"an array of {config.limited_jobs:,}, parallelism {config.parallelism:,}: jobs ended "
                   "per second of wall time", wall_rate, "jobs/s",
                   note=f"{lim['ended']:,} ended in {lim['wall_s']:.0f}s, elements of {config.duration_s / 2:g}-"
                   f"{config.duration_s * 1.5:g}s; "
                   f"{ideal:,.0f} with every slot always busy"))
    run.add(Figure("arrays", f"an array of {config.limited_jobs:,}, parallelism {config.parallelism:,}: a freed slot "
                   "refilled (element ended -> next queued), p50", gaps["slot"][0] * 1000, "ms",
                   note=f"p99 {gaps['slot'][1] * 1000:,.0f} ms; release pass p50 {lim['release_p50'] * 1000:.1f} ms, "
                   f"max {lim['release_max'] * 1000:.0f} ms, one a second"))
    run.add(Figure("arrays", f"an array of {config.limited_jobs:,}, parallelism {config.parallelism:,}: dispatch "
                   "(jobs / seconds in run_cycle)", lim["rate"], "jobs/s",
                   note=f"cycle p50/p99 while dispatching {lim['cycle_p50'] * 1000:.1f}/"
                   f"{lim['cycle_p99'] * 1000:.1f} ms"))
