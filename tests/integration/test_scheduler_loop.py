"""The leader's loop (scheduling.Scheduler._lead): when it runs a cycle, against a real Postgres.

No agent is connected: the clusters' capacity is recorded directly, so the only wake-ups are the
submits' notifications and nothing else (no report, no heartbeat) could start a cycle.
"""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone

from sqlalchemy import text

from dispatcher import administering, submitting
from dispatcher.scheduling import SchedulerSettings, run_cycle
from dispatcher.server import Dispatcher, ServerSettings
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
        cluster_store.record_capacity(session, "c", {"allocatable": NODE, "free": NODE, "largestFreeNode": NODE},
                                      0, datetime.now(timezone.utc))


def _submit(sessions, n: int) -> list[int]:
    with sessions.begin() as session:
        return submitting.submit(session, ADMIN, submitting.parse(
            [json.dumps(job_doc(name=f"j{i}", cpu="1", queue="q")) for i in range(n)]))


def _states(sessions) -> list[str]:
    with sessions() as session:
        return [r[0] for r in session.execute(text("SELECT state FROM jobs ORDER BY id"))]


def test_a_cycle_says_more_may_start_only_when_a_queue_had_more_jobs_than_it_read(db_url):
    d = Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None, schedule=False,
                                  database=DatabaseSettings(url=db_url))).start()
    try:
        _world(d.sessions)
        _submit(d.sessions, 5)
        settings = SchedulerSettings(per_queue=2)
        now = datetime.now(timezone.utc)
        assert [(r.dispatched, r.more) for r in (run_cycle(d.sessions, settings, now) for _ in range(3))] == \
            [(2, True), (2, True), (1, False)]
        assert run_cycle(d.sessions, settings, now).more is False  # nothing queued at all
    finally:
        d.stop()


def test_the_leader_drains_a_queue_deeper_than_its_heads_on_one_wake_up_then_waits_for_the_next(db_url):
    # The safety-net wake-up is a minute away: whatever happens within seconds comes from the loop itself.
    settings = SchedulerSettings(per_queue=2, idle_wait_s=60.0)
    d = Dispatcher(ServerSettings(listen="127.0.0.1:0", metrics_listen=None, scheduler=settings,
                                  database=DatabaseSettings(url=db_url))).start()
    try:
        assert d.scheduler.is_leader.wait(10)
        _world(d.sessions)
        _submit(d.sessions, 5)  # one notification; 5 jobs, 2 read per cycle
        deadline = time.monotonic() + 10
        while _states(d.sessions) != ["DISPATCHED"] * 5:
            assert time.monotonic() < deadline, _states(d.sessions)
            time.sleep(0.05)
        # Then it waits: at most one more cycle (the one that writes reasons when they are due), none after.
        cycles = d.metrics.cycles._value.get()
        time.sleep(2.5)
        settled = d.metrics.cycles._value.get()
        assert settled - cycles <= 1
        time.sleep(1.5)
        assert d.metrics.cycles._value.get() == settled
        # A wake-up after the quiet spell starts a cycle at once.
        began = time.monotonic()
        _submit(d.sessions, 1)
        while _states(d.sessions)[-1] != "DISPATCHED":
            assert time.monotonic() - began < 10
            time.sleep(0.01)
    finally:
        d.stop()
