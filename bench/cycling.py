"""Scheduling cycles over a loaded backlog, in a process of their own (so its RSS is the cycle's alone).

The loop is the leader's (dispatcher/scheduler/ Scheduler._lead) without the lock and the waits:
`run_cycle` with `now` read once per cycle, holds, policy objects and parked queues carried from cycle
to cycle, pending reasons written at most once a second while draining (while waiting, every cycle: the
leader waits for them to be due rather than cycle without). Between cycles the `Agents` stand-in sends
every cluster's heartbeat (outside the timed cycle: in a real deployment that is other processes' work).

While waiting, the cycles after the first take turns (WAIT_KINDS): one job was submitted to a queue
since (through `submitting.submit`, its queue then named to the parking as its notification would),
nothing happened, or every queue is to be planned (as after a wake-up that names no queue).
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import time
from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.orm import sessionmaker

from bench import backlog, workload
from dispatcher.scheduler.mapping import PolicyConfig
from dispatcher.scheduler.parking import Parking
from dispatcher.scheduler.postgres_cycle import run_cycle
from dispatcher.scheduler.settings import SchedulerSettings
from dispatcher.services import submitting
from dispatcher.store import database
from dispatcher.store.tokens import Principal

WAIT_KINDS = ("submit", "nothing", "every")


def rss() -> dict[str, int]:
    """This process's resident set now and at its peak, in bytes (/proc/self/status VmRSS, VmHWM)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out["now" if key == "VmRSS" else "peak"] = int(value.split()[0]) * 1024
    return out


def cycles(url: str, clusters: list[str], nodes: int, *, mode: str, max_cycles: int, time_limit_s: float,
           queues_count: int = 1, profile_path: str | None = None) -> dict:
    """mode "wait": every cluster full, nothing can start (each cycle reads the heads it must, plans, waits);
    mode "drain": every cluster empty with room for the whole backlog, cycles until nothing is left to
    dispatch (or the limits). Returns per-cycle figures and the process's RSS."""
    logging.basicConfig(level=logging.WARNING)
    started_rss = rss()
    db = database.connect(database.DatabaseSettings(url=url, pool_size=2, pool_overflow=0))
    sessions = sessionmaker(db.engine, expire_on_commit=False)
    settings = SchedulerSettings()
    agents = backlog.Agents(clusters, nodes)
    profiler = None
    if profile_path:
        from pyinstrument import Profiler
        profiler = Profiler(interval=0.005)
    out: dict = {"cycles": [], "heartbeat_s": 0.0, "rss_start": started_rss["now"], "pid": os.getpid()}
    holds: dict = {}
    config = PolicyConfig()  # kept between cycles, as the leader keeps them
    parking = Parking()
    queues = workload.queue_names(queues_count)
    submitted: list[int] = []
    reasons_at = 0.0
    deadline = time.monotonic() + time_limit_s
    try:
        for n in range(max_cycles):
            began = time.perf_counter()
            with sessions.begin() as session:
                agents.report(session, datetime.now(UTC), full=mode == "wait")
            out["heartbeat_s"] += time.perf_counter() - began
            kind = "drain" if mode == "drain" else "first" if n == 0 else WAIT_KINDS[(n - 1) % len(WAIT_KINDS)]
            if kind == "submit":
                queue = queues[n % len(queues)]
                doc = workload.job_document(queue, workload.SHAPES[0], "standard", 0)
                with sessions.begin() as session:
                    submitted += submitting.submit(session, Principal("bench", "admin"), [workload.parsed(doc)])
                parking.touch(queue)
            elif kind == "every":
                parking.touch()
            write_reasons = mode == "wait" or time.monotonic() - reasons_at >= settings.reason_interval_s
            if write_reasons:
                reasons_at = time.monotonic()
            if profiler:
                profiler.start()
            cpu = time.process_time()
            result = run_cycle(sessions, settings, datetime.now(UTC), holds=holds, write_reasons=write_reasons,
                               config=config, parking=parking)
            cpu = time.process_time() - cpu
            if profiler:
                profiler.stop()
            holds = result.holds
            mem = rss()
            out["cycles"].append({"seconds": result.seconds, "cpu": cpu, "dispatched": result.dispatched,
                                  "waiting": result.waiting, "reasons": write_reasons, "rss": mem["now"], "kind": kind,
                                  "planned": result.planned})
            if mode == "drain" and result.dispatched == 0:
                break
            if time.monotonic() > deadline:
                out["stopped_by_time_limit"] = True
                break
    finally:
        if submitted:  # the loader gives the next jobs their ids itself: leave none taken
            with sessions.begin() as session:
                session.execute(text("DELETE FROM job_events WHERE job_id = ANY(:ids)"), {"ids": submitted})
                session.execute(text("DELETE FROM jobs WHERE id = ANY(:ids)"), {"ids": submitted})
        db.close()
        if profiler:
            with open(profile_path, "w") as f:
                f.write(profiler.output_text(unicode=False, color=False, show_all=False, timeline=False))
    out["rss_peak"] = rss()["peak"]
    return out


def _child(pipe, args, kwargs) -> None:
    try:
        pipe.send(("ok", cycles(*args, **kwargs)))
    except BaseException as exc:  # the parent reports it; nothing may be left half-sent
        pipe.send(("error", f"{type(exc).__name__}: {exc}"))


def in_child(*args, timeout_s: float, **kwargs) -> dict:
    """Run `cycles` in a fresh interpreter (spawn) and return its result; the child is ended if it overruns."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child, args=(child, args, kwargs), name="bench-cycles")
    process.start()
    child.close()
    try:
        if not parent.poll(timeout_s):
            raise TimeoutError(f"the cycle process did not finish within {timeout_s:.0f}s")
        status, value = parent.recv()
    finally:
        process.join(10)
        if process.is_alive():
            process.terminate()
            process.join(10)
    if status != "ok":
        raise RuntimeError(f"the cycle process failed: {value}")
    return value
