"""The scheduling loop: run by exactly one dispatcher replica at a time (the leader).

Leadership is a Postgres session advisory lock held on a dedicated connection: when the leader dies,
its connection closes, the lock is released and another replica takes it within `leader_retry_s`.
Each cycle reads `now` once, reads the head of the queue and each cluster's usable capacity, asks the
pure policy for decisions, and commits them in one transaction with their events and outbox commands.
New work and freed capacity wake the loop through NOTIFY; the timeout is only a safety net.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone

import psycopg
from sqlalchemy import Engine
from sqlalchemy.orm import sessionmaker

from dispatcher.capacity import snapshot
from dispatcher.notifying import Notifier, libpq_url
from dispatcher.policy.placing import Place, QueuedJob, Wait, plan
from dispatcher.store import jobs as job_store

log = logging.getLogger(__name__)
LEADER_LOCK = 7302


@dataclass(frozen=True)
class SchedulerSettings:
    head_size: int = 1000  # queued jobs considered per cycle, in order (seconds of work, never the backlog)
    reason_interval_s: float = 1.0  # pending reasons are rewritten at most this often (they are for people)
    idle_wait_s: float = 2.0  # safety-net wake-up when no notification comes (clusters going stale)
    leader_retry_s: float = 1.0  # how often a follower tries to become leader
    unreachable_after_s: float = 5.0  # no heartbeat this long: the cluster takes no new jobs


@dataclass(frozen=True)
class CycleResult:
    dispatched: int
    waiting: int
    seconds: float


class LostLeadership(Exception):
    pass


def run_cycle(sessions: sessionmaker, settings: SchedulerSettings, now: datetime, *,
              write_reasons: bool = True, leader_pid: int | None = None) -> CycleResult:
    """One scheduling cycle. With leader_pid, it commits only while that backend holds the leader lock."""
    started = time.perf_counter()
    with sessions.begin() as session:
        if leader_pid is not None and not job_store.holds_advisory_lock(session, leader_pid, LEADER_LOCK):
            raise LostLeadership("the leader lock is no longer held")
        clusters = [c.state for c in snapshot.read(session, now, unreachable_after_s=settings.unreachable_after_s)]
        head = job_store.queued_head(session, settings.head_size)
        jobs = [QueuedJob(r.id, r.requests, r.largest_pod, dict(r.placement.get("clusterSelector", {})),
                          tuple(r.placement.get("tiers", ())), tuple(r.placement.get("sites", ()))) for r in head]
        decisions = plan(jobs, clusters)
        places = [(d.job_id, d.cluster) for d in decisions if isinstance(d, Place)]
        current = {r.id: r.reason for r in head}
        dispatched = job_store.dispatch(session, places)
        if write_reasons:
            job_store.set_reasons(session, {d.job_id: d.reason for d in decisions
                                            if isinstance(d, Wait) and current[d.job_id] != d.reason})
    return CycleResult(len(dispatched), len(jobs) - len(places), time.perf_counter() - started)


class Scheduler:
    """Runs cycles while this process holds the leader lock."""

    def __init__(self, engine: Engine, sessions: sessionmaker, notifier: Notifier, settings: SchedulerSettings):
        self._url = libpq_url(engine)
        self._sessions = sessions
        self._settings = settings
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.is_leader = threading.Event()
        notifier.subscribe(job_store.WAKE_CHANNEL, lambda _p: self._wake.set())
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._url, autocommit=True) as lock_conn:
                    while not self._stop.is_set():
                        got = lock_conn.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK,)).fetchone()[0]
                        if got:
                            break
                        self._stop.wait(self._settings.leader_retry_s)
                    else:
                        return
                    log.info("became the scheduling leader")
                    self.is_leader.set()
                    try:
                        self._lead(lock_conn)
                    finally:
                        self.is_leader.clear()
            except LostLeadership:
                log.warning("lost the leader lock; following again")
            except Exception:
                log.exception("scheduler failed; retrying")
                self._stop.wait(1.0)

    def _lead(self, lock_conn: psycopg.Connection) -> None:
        reasons_at = 0.0
        while not self._stop.is_set():
            self._wake.clear()
            write_reasons = time.monotonic() - reasons_at >= self._settings.reason_interval_s
            if write_reasons:
                reasons_at = time.monotonic()
            result = run_cycle(self._sessions, self._settings, datetime.now(timezone.utc),
                               write_reasons=write_reasons, leader_pid=lock_conn.info.backend_pid)
            if result.dispatched:
                log.debug("cycle", extra={"dispatched": result.dispatched, "seconds": result.seconds})
                continue  # capacity may remain for the next jobs in line
            if not self._wake.wait(self._settings.idle_wait_s):
                lock_conn.execute("SELECT 1")  # still leader: a dead lock connection raises here
