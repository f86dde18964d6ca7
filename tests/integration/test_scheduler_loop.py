"""The leader's loop (scheduler.Scheduler._lead): when it runs a cycle, against a real Postgres.

No agent is connected: the clusters' capacity is recorded directly, so the only wake-ups are the
submits' notifications and nothing else (no report, no heartbeat) could start a cycle.
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from datetime import UTC, datetime

from sqlalchemy import text

from dispatcher import wakes
from dispatcher.scheduler.postgres_cycle import run_cycle
from dispatcher.scheduler.settings import SchedulerSettings
from dispatcher.server import Dispatcher, ServerSettings
from dispatcher.services import administering, submitting
from dispatcher.store import channels
from dispatcher.store import clusters as cluster_store
from dispatcher.store.database import DatabaseSettings
from dispatcher.store.tokens import Principal
from sluice.objects import ClusterObject, QueueObject, ServiceClassObject, SimulatedSpec
from tests.integration.test_spine import job_doc

ADMIN = Principal("root", "admin")
NODE = {"cpu": 64000, "memory": 256 << 30}


def _world(sessions) -> None:
    with sessions.begin() as session:
        administering.apply(session, "test", [ServiceClassObject("standard", priority=500), QueueObject("q"),
                                              ClusterObject("c", tier="onprem", site="dc",
                                                            simulated=SimulatedSpec(1, NODE))])
    _heard(sessions, NODE)


def _heard(sessions, free: dict) -> None:
    """The cluster's capacity report, as its agent's heartbeat records it (a cluster unheard of for 5 s
    takes no jobs)."""
    with sessions.begin() as session:
        cluster_store.record_capacity(session, "c", {"allocatable": NODE, "free": free, "largestFreeNode": free},
                                      0, datetime.now(UTC))


def _submit(sessions, n: int) -> list[int]:
    with sessions.begin() as session:
        return submitting.submit(session, ADMIN, submitting.parse(
            [json.dumps(job_doc(name=f"j{i}", cpu="1", queue="q")) for i in range(n)]))


def _states(sessions) -> list[str]:
    with sessions() as session:
        return [r[0] for r in session.execute(text("SELECT state FROM jobs ORDER BY id"))]


def _until_dispatched(sessions, n: int, limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while _states(sessions) != ["DISPATCHED"] * n:
        assert time.monotonic() < deadline, _states(sessions)
        time.sleep(0.02)


@contextmanager
def _leading(db_url: str, settings: SchedulerSettings):
    """A dispatcher that leads, in the small world (the safety-net wake-up a minute away: whatever
    happens within seconds comes from the loop itself)."""
    d = Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None, scheduler=settings,
                                  database=DatabaseSettings(url=db_url))).start()
    try:
        assert d.scheduler.is_leader.wait(10)
        _world(d.sessions)
        yield d
    finally:
        d.stop()


def test_a_cycle_says_whether_more_may_start_and_whether_it_left_any_job_queued(db_url):
    d = Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None, schedule=False,
                                  database=DatabaseSettings(url=db_url))).start()
    try:
        _world(d.sessions)
        _submit(d.sessions, 5)
        settings = SchedulerSettings(per_queue=2)
        now = datetime.now(UTC)
        # (dispatched, more: a queue had more jobs than it read, idle: it left no job queued)
        assert [(r.dispatched, r.more, r.idle) for r in (run_cycle(d.sessions, settings, now) for _ in range(3))] \
            == [(2, True, False), (2, True, False), (1, False, True)]
        last = run_cycle(d.sessions, settings, now)  # nothing queued at all
        assert (last.more, last.idle) == (False, True)
        _heard(d.sessions, {"cpu": 0, "memory": 0})
        _submit(d.sessions, 1)
        assert (run_cycle(d.sessions, settings, now).idle, run_cycle(d.sessions, settings, now).idle) == (False, False)
    finally:
        d.stop()


def test_only_a_queue_read_to_the_limit_that_lost_a_head_has_more_to_start(db_url):
    d = Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None, schedule=False,
                                  database=DatabaseSettings(url=db_url))).start()
    try:
        _world(d.sessions)
        with d.sessions.begin() as session:
            administering.apply(session, "test", [QueueObject("small")])
            submitting.submit(session, ADMIN, submitting.parse(  # q: 3 jobs of the whole node, read to its 2 heads
                [json.dumps(job_doc(name=f"big{i}", cpu="64", queue="q")) for i in range(3)]
                + [json.dumps(job_doc(name="fits", cpu="1", queue="small"))]))
        _heard(d.sessions, {"cpu": 8000, "memory": 256 << 30})
        result = run_cycle(d.sessions, SchedulerSettings(per_queue=2), datetime.now(UTC))
        # The next cycle would read q's same two heads: nothing new can start there.
        assert (result.dispatched, result.more) == (1, False)
    finally:
        d.stop()


def test_the_leader_drains_a_queue_deeper_than_its_heads_on_one_wake_up_then_waits_for_the_next(db_url):
    with _leading(db_url, SchedulerSettings(per_queue=2, idle_wait_s=60.0)) as d:
        _submit(d.sessions, 5)  # one notification; 5 jobs, 2 read per cycle
        _until_dispatched(d.sessions, 5)
        # Then it waits: at most one more cycle (the one that writes reasons when they are due), none after.
        cycles = _cycles(d)
        time.sleep(2.5)
        settled = _cycles(d)
        assert settled - cycles <= 1
        time.sleep(1.5)
        assert _cycles(d) == settled
        # A wake-up after the quiet spell starts a cycle at once.
        _submit(d.sessions, 1)
        _until_dispatched(d.sessions, 6)


def _cycles(d) -> float:
    return d.metrics.registry.get_sample_value("sluice_scheduling_cycles_total")


def _settled(d, quiet_s: float = 1.5, limit_s: float = 10.0) -> float:
    """The cycle count once it stayed the same for quiet_s."""
    deadline = time.monotonic() + limit_s
    last = _cycles(d)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = _cycles(d)
        if now == last:
            return now
        last = now
    raise AssertionError("the scheduler kept cycling")


def test_room_freed_while_nothing_is_queued_runs_no_cycle_and_anything_else_does(db_url):
    with _leading(db_url, SchedulerSettings(idle_wait_s=60.0)) as d:
        with d.sessions.begin() as session:
            channels.notify(session, channels.WAKE_CHANNEL)  # the world changed: one cycle finds nothing queued
        before = _settled(d)
        for _ in range(5):  # what heartbeats and finished attempts send
            with d.sessions.begin() as session:
                channels.notify(session, channels.WAKE_CHANNEL, wakes.ROOM)
            time.sleep(0.1)
        assert _settled(d) == before
        with d.sessions.begin() as session:  # anything else (here: an admin apply's) runs a cycle
            channels.notify(session, channels.WAKE_CHANNEL)
        assert _settled(d) > before
        _heard(d.sessions, NODE)
        _submit(d.sessions, 1)
        _until_dispatched(d.sessions, 1)


def test_room_freed_while_a_job_waits_runs_a_cycle_that_places_it(db_url):
    with _leading(db_url, SchedulerSettings(idle_wait_s=60.0)) as d:
        _heard(d.sessions, {"cpu": 0, "memory": 0})
        _submit(d.sessions, 1)
        _settled(d)
        assert _states(d.sessions) == ["QUEUED"]
        _heard(d.sessions, NODE)
        with d.sessions.begin() as session:  # room: as an agent's heartbeat sends it
            channels.notify(session, channels.WAKE_CHANNEL, wakes.ROOM)
        _until_dispatched(d.sessions, 1)


def test_a_leader_waiting_out_room_wake_ups_stops_when_asked(db_url):
    with _leading(db_url, SchedulerSettings(idle_wait_s=60.0)) as d:
        _settled(d)  # idle: nothing queued
        with d.sessions.begin() as session:
            channels.notify(session, channels.WAKE_CHANNEL, wakes.ROOM)
        time.sleep(0.3)
        d.scheduler.stop()  # joins the loop for up to 10 s: it must not wait out the minute
        assert not d.scheduler.is_leader.is_set()


def test_a_queue_whose_heads_cannot_use_the_room_left_is_read_deeper_next_cycle(db_url):
    d = Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None, schedule=False,
                                  database=DatabaseSettings(url=db_url))).start()
    try:
        _world(d.sessions)
        _heard(d.sessions, {"cpu": 4000, "memory": 256 << 30})
        with d.sessions.begin() as session:  # 3 wide jobs, then one that fits the 4 cpu left
            [*_, small] = submitting.submit(session, ADMIN, submitting.parse(
                [json.dumps(job_doc(name=f"wide{i}", cpu="8", queue="q")) for i in range(3)]
                + [json.dumps(job_doc(name="small", cpu="2", queue="q"))]))
        settings = SchedulerSettings(per_queue=2, backfill_per_queue=4)
        first = run_cycle(d.sessions, settings, datetime.now(UTC))
        assert (first.dispatched, first.deeper) == (0, frozenset({"q"}))  # read to its 2 heads, room left
        second = run_cycle(d.sessions, settings, datetime.now(UTC), deeper=first.deeper)
        assert second.dispatched == 1 and _states(d.sessions)[small - 1] == "DISPATCHED"
        assert second.deeper == frozenset()  # one of its heads started
    finally:
        d.stop()


def _taking_over(db_url: str, settings: SchedulerSettings) -> Dispatcher:
    """A leader of the small world whose cluster was last heard from before it started: every dispatcher
    restarted, the cluster's agent not back yet."""
    before = Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None, schedule=False,
                                       database=DatabaseSettings(url=db_url))).start()
    try:
        _world(before.sessions)
    finally:
        before.stop()
    d = Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None, scheduler=settings,
                                  database=DatabaseSettings(url=db_url))).start()
    assert d.scheduler.is_leader.wait(10)
    return d


def _reason(sessions, job_id: int, limit_s: float = 10.0) -> str:
    """The job's pending reason, once a cycle wrote one (its first says only that it was submitted)."""
    deadline = time.monotonic() + limit_s
    while True:
        with sessions() as session:
            reason = session.execute(text("SELECT reason FROM jobs WHERE id = :id"), {"id": job_id}).scalar_one()
        if reason not in ("", "submitted") or time.monotonic() > deadline:
            return reason
        time.sleep(0.05)


def test_a_leader_that_took_over_starts_no_job_until_the_clusters_reachable_before_are_back(db_url):
    d = _taking_over(db_url, SchedulerSettings(takeover_wait_s=60.0, unreachable_after_s=60.0))
    try:
        [job_id] = _submit(d.sessions, 1)
        assert "held after the scheduler took over: it waits for the 1 clusters reachable before" \
            in _reason(d.sessions, job_id)
        time.sleep(1.0)  # cycles ran meanwhile (a submit's, reasons due): none started it
        assert _states(d.sessions) == ["QUEUED"]
        _heard(d.sessions, NODE)  # the cluster's agent is back: its hello records its capacity and wakes the leader
        with d.sessions.begin() as session:
            channels.notify(session, channels.WAKE_CHANNEL)
        _until_dispatched(d.sessions, 1)
    finally:
        d.stop()


def test_a_leader_that_took_over_starts_jobs_once_its_wait_is_over_though_a_cluster_is_not_back(db_url):
    began = datetime.now(UTC)
    d = _taking_over(db_url, SchedulerSettings(takeover_wait_s=2.0, unreachable_after_s=60.0))
    try:
        _submit(d.sessions, 1)
        _until_dispatched(d.sessions, 1)
        with d.sessions() as session:
            dispatched_at = session.execute(text("SELECT dispatched_at FROM jobs")).scalar_one()
        assert (dispatched_at - began).total_seconds() >= 2.0
    finally:
        d.stop()
