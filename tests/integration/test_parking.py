"""Parked queues (scheduler.Parking), against a real Postgres and the real notifications.

The property: a cycle that leaves parked queues out decides exactly what a cycle planning every queue
would have decided, in the same database at the same moment. Each step of a random story (submits,
cancels, capacity freed or taken, jobs ending, a quota changed, time passing past a reservation time)
is followed by both: first the plain cycle (every queue, no parking) inside a transaction that is
rolled back, then the parked cycle for real; the jobs' states, clusters and reasons, and the holds,
must be the same.
"""
from __future__ import annotations

import json
import random
import threading
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.orm import sessionmaker

from dispatcher.scheduler.mapping import PolicyConfig
from dispatcher.scheduler.parking import Parking
from dispatcher.scheduler.postgres_cycle import LostLeadership, run_cycle
from dispatcher.scheduler.settings import SchedulerSettings
from dispatcher.services import administering, submitting
from dispatcher.services import reporting as reports
from dispatcher.store import channels, database, lifecycle
from dispatcher.store import clusters as cluster_store
from dispatcher.store.listening import Notifier
from dispatcher.store.tokens import Principal
from sluice.objects import ClusterObject, QueueObject, ServiceClassObject, SimulatedSpec
from tests.integration.test_spine import job_doc

ADMIN = Principal("root", "admin")
QUEUES = ("q0", "q1", "q2", "q3")
CLASSES = (ServiceClassObject("standard", priority=500),
           ServiceClassObject("patient", priority=400, reservation_after_s=30),
           ServiceClassObject("batch", priority=100, preemptible=True))
NODE = {"cpu": 8000, "memory": 32 << 30}
SETTINGS = SchedulerSettings(per_queue=4)  # few heads: jobs deeper in a queue come up as others leave


def _queues(q1_max_cpu: int) -> list:
    return [QueueObject("org"), *(QueueObject(q, parent="org", max={"cpu": q1_max_cpu} if q == "q1" else {})
                                  for q in QUEUES)]


class Story:
    """A small world: two clusters whose free capacity the test sets, four queues, three classes."""

    def __init__(self, db_url: str):
        self.db = database.connect(database.DatabaseSettings(url=db_url, pool_size=3, pool_overflow=0))
        self.sessions = sessionmaker(self.db.engine, expire_on_commit=False)
        self.now = datetime.now(UTC)
        self.free = {"c0": dict(NODE), "c1": dict(NODE)}
        with self.sessions.begin() as session:
            administering.apply(session, "test", [*CLASSES, *_queues(16000), *(
                ClusterObject(c, tier="onprem", site="dc", simulated=SimulatedSpec(1, NODE)) for c in self.free)])
            self.report(session)
        self.parking, self.config = Parking(), PolicyConfig()
        self.holds: dict = {}
        self.synced = threading.Event()
        self.notifier = Notifier(self.db.engine, (channels.WAKE_CHANNEL,))
        self.notifier.subscribe(channels.WAKE_CHANNEL, self._woken)
        self.notifier.start()

    def _woken(self, payload: str) -> None:
        if payload == "test-sync":
            self.synced.set()
        else:
            self.parking.touch(payload)

    def sync(self) -> None:
        """Wait until every notification committed so far reached the parking (they arrive in order)."""
        self.synced.clear()
        with self.sessions.begin() as session:
            channels.notify(session, channels.WAKE_CHANNEL, "test-sync")
        assert self.synced.wait(10)

    def take_all(self, session) -> None:
        """Every cluster full from now on: nothing can start."""
        self.free = {name: {"cpu": 0, "memory": 0} for name in self.free}
        self.report(session)

    def report(self, session) -> None:
        for name, free in self.free.items():
            cluster_store.record_capacity(session, name, {"allocatable": NODE, "free": free,
                                                          "largestFreeNode": free}, 0, self.now)

    def close(self) -> None:
        self.notifier.stop()
        self.db.close()

    def jobs(self, conn) -> list[tuple]:
        return [tuple(r) for r in conn.execute(text("SELECT id, state, cluster, reason FROM jobs ORDER BY id"))]

    def plain(self) -> tuple[list[tuple], dict]:
        """What a cycle planning every queue decides now: run and rolled back."""
        with self.db.engine.connect() as conn:
            outer = conn.begin()
            shadow = sessionmaker(bind=conn, join_transaction_mode="create_savepoint", expire_on_commit=False)
            result = run_cycle(shadow, SETTINGS, self.now, holds=dict(self.holds))
            jobs = self.jobs(conn)
            outer.rollback()
        return jobs, result.holds

    def parked(self):
        result = run_cycle(self.sessions, SETTINGS, self.now, holds=self.holds, config=self.config,
                           parking=self.parking)
        self.holds = result.holds
        with self.db.engine.connect() as conn:
            return self.jobs(conn), result


def _step(story: Story, rnd: random.Random) -> str:
    what = rnd.choice(("submit", "submit", "cancel", "free", "take", "end", "quota", "time", "nothing"))
    with story.sessions.begin() as session:
        if what == "submit":
            queue = rnd.choice(QUEUES)
            docs = []
            for _ in range(rnd.randint(1, 3)):
                doc = job_doc(cpu=rnd.choice(("1", "2", "4", "8")), serviceClass=rnd.choice(CLASSES).name)
                doc["spec"]["queue"] = queue
                docs.append(doc)
            submitting.submit(session, ADMIN, submitting.parse([json.dumps(d) for d in docs]))
        elif what == "cancel":
            ids = session.scalars(text("SELECT id FROM jobs WHERE state = 'QUEUED' ORDER BY id")).all()
            if ids:
                reports.cancel(session, [rnd.choice(ids)], ADMIN)
        elif what in ("free", "take"):
            name = rnd.choice(sorted(story.free))
            cpu = rnd.choice((0, 2000, 4000, 8000)) if what == "free" else 0
            story.free[name] = {"cpu": cpu, "memory": NODE["memory"]}
        elif what == "end":  # a running job ends (cancelled: out of its queue's usage at once)
            ids = session.scalars(text("SELECT id FROM jobs WHERE state = 'DISPATCHED' ORDER BY id")).all()
            if ids:
                reports.cancel(session, [rnd.choice(ids)], ADMIN)
        elif what == "quota":
            administering.apply(session, "test", _queues(rnd.choice((4000, 8000, 16000))))
        elif what == "time":
            story.now += timedelta(seconds=rnd.choice((5, 20, 40)))
        story.report(session)  # every cluster's heartbeat, with its free capacity now
    story.sync()
    return what


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_cycle_that_leaves_parked_queues_out_decides_what_planning_every_queue_decides(db_url, seed):
    rnd = random.Random(seed)
    story = Story(db_url)
    left_out = 0
    try:
        for n in range(80):
            what = _step(story, rnd)
            expected_jobs, expected_holds = story.plain()
            got_jobs, result = story.parked()
            assert got_jobs == expected_jobs, f"step {n} ({what})"
            assert result.holds == expected_holds, f"step {n} ({what})"
            if result.planned is not None:
                left_out += 1
    finally:
        story.close()
    assert left_out >= 5  # the story did park queues (else it proved nothing)


def test_a_waiting_backlog_is_planned_once_then_only_where_something_happens(db_url):
    story = Story(db_url)
    try:
        with story.sessions.begin() as session:
            story.take_all(session)
            for queue in QUEUES:
                docs = [job_doc(name=f"{queue}-{i}", cpu="1") for i in range(3)]
                for d in docs:
                    d["spec"]["queue"] = queue
                submitting.submit(session, ADMIN, submitting.parse([json.dumps(d) for d in docs]))
        story.sync()
        _, first = story.parked()
        assert first.planned is None and first.waiting == 12  # every queue, every head
        _, second = story.parked()
        assert second.planned == 0 and second.waiting == 12 and second.dispatched == 0  # nothing changed

        with story.sessions.begin() as session:  # one queue gets a job: only it is planned
            doc = job_doc(name="late", cpu="1")
            doc["spec"]["queue"] = "q2"
            submitting.submit(session, ADMIN, submitting.parse([json.dumps(doc)]))
        story.sync()
        with story.db.engine.connect() as conn:
            assert conn.execute(text("SELECT reason FROM jobs WHERE name = 'late'")).scalar() == lifecycle.SUBMITTED
        jobs, third = story.parked()
        assert third.planned == 1 and third.waiting == 13
        with story.db.engine.connect() as conn:  # its reason is written like any other
            assert conn.execute(text("SELECT reason FROM jobs WHERE name = 'late'")).scalar() != lifecycle.SUBMITTED

        story.free["c1"] = dict(NODE)  # room appears: every queue is planned again, and jobs start
        with story.sessions.begin() as session:
            story.report(session)
        _, fourth = story.parked()
        assert fourth.planned is None and fourth.dispatched == 8

        story.parking.touch()  # a wake-up naming no queue (as after the listener reconnects): all of them
        _, fifth = story.parked()
        assert fifth.planned is None
    finally:
        story.close()


def test_a_failed_cycle_leaves_nothing_parked(db_url):
    story = Story(db_url)
    try:
        story.parked()
        assert story.parked()[1].planned == 0  # parked (nothing queued, nothing changed)
        story.parking.touch("q1")
        with pytest.raises(LostLeadership):  # a backend that holds no lock: the cycle fails before its reads
            run_cycle(story.sessions, SETTINGS, story.now, parking=story.parking, leader_pid=-1)
        assert story.parking.take() is None  # every queue is planned by the next cycle
    finally:
        story.close()


def test_time_alone_unparks_a_head_that_reaches_its_reservation_time(db_url):
    story = Story(db_url)
    try:
        with story.sessions.begin() as session:
            story.take_all(session)
            doc = job_doc(name="patient", cpu="1", serviceClass="patient", queue="q0")
            [job_id] = submitting.submit(session, ADMIN, submitting.parse([json.dumps(doc)]))
        story.sync()
        assert story.parked()[1].planned is None
        assert story.parked()[1].planned == 0 and not story.holds
        story.now += timedelta(seconds=40)  # past its class's 30 s: nothing else changed
        with story.sessions.begin() as session:
            story.report(session)
        _, result = story.parked()
        assert result.planned is None and job_id in result.holds
    finally:
        story.close()


def test_a_submit_behind_the_heads_of_a_full_parked_queue_is_left_out_and_decides_what_planning_every_queue_does(
        db_url):
    story = Story(db_url)

    def submit(name: str, priority: int) -> None:
        with story.sessions.begin() as session:
            submitting.submit(session, ADMIN, submitting.parse([json.dumps(
                job_doc(name=name, cpu="1", queue="q0", priority=priority))]))
        story.sync()

    def reason(name: str) -> str:
        with story.db.engine.connect() as conn:
            return conn.execute(text("SELECT reason FROM jobs WHERE name = :n"), {"n": name}).scalar()

    try:
        with story.sessions.begin() as session:
            story.take_all(session)
            submitting.submit(session, ADMIN, submitting.parse([json.dumps(
                job_doc(name=f"head-{i}", cpu="1", queue="q0", priority=5)) for i in range(6)]))
        story.sync()
        assert story.parked()[1].planned is None  # q0 read to its 4 heads; 2 more behind them
        submit("behind", 0)  # after the fourth head: the heads a cycle reads are the same
        expected, _ = story.plain()
        jobs, result = story.parked()
        assert result.planned == 0 and jobs == expected
        assert reason("behind") == lifecycle.SUBMITTED  # not looked at, as every job behind the heads
        submit("ahead", 9)  # before the first head: q0 is planned again
        expected, _ = story.plain()
        jobs, result = story.parked()
        assert result.planned == 1 and jobs == expected
        assert reason("ahead") != lifecycle.SUBMITTED
    finally:
        story.close()


def test_a_submit_behind_the_heads_while_room_is_held_needs_no_cycle(db_url):
    story = Story(db_url)
    woken: list[bool] = []
    story.parking.touch = lambda payload="", touch=story.parking.touch: woken.append(touch(payload)) or woken[-1]
    try:
        with story.sessions.begin() as session:
            story.take_all(session)
            submitting.submit(session, ADMIN, submitting.parse([json.dumps(
                job_doc(name=f"head-{i}", cpu="8", queue="q0", serviceClass="patient")) for i in range(6)]))
        story.sync()
        story.now += timedelta(seconds=40)  # past the class's 30 s: the first head reserves a cluster
        with story.sessions.begin() as session:
            story.report(session)
        assert story.parked()[1].holds
        result = story.parked()[1]  # the hold kept as it was: q0 parks, read to its 4 heads
        assert result.planned is None and result.dispatched == 0
        woken.clear()
        with story.sessions.begin() as session:
            submitting.submit(session, ADMIN, submitting.parse([json.dumps(
                job_doc(name="behind", cpu="1", queue="q0", serviceClass="patient"))]))
        story.sync()
        assert woken == [False]  # no cycle: and one planning every queue would change nothing
        with story.db.engine.connect() as conn:
            assert story.plain() == (story.jobs(conn), story.holds)
    finally:
        story.close()


def test_a_rerun_for_the_heads_behind_plans_only_the_queues_that_lost_heads_and_those_holding_room(db_url):
    story = Story(db_url)

    def submit(queue: str, n: int, cpu: str, service_class: str = "standard") -> list[int]:
        with story.sessions.begin() as session:
            return submitting.submit(session, ADMIN, submitting.parse([json.dumps(
                job_doc(name=f"{queue}-{i}", cpu=cpu, queue=queue, serviceClass=service_class)) for i in range(n)]))

    def reasons(ids: list[int]) -> list[str]:
        with story.db.engine.connect() as conn:
            return conn.execute(text("SELECT reason FROM jobs WHERE id = ANY(:ids) ORDER BY id"),
                                {"ids": ids}).scalars().all()

    try:
        story.free = {"c0": {"cpu": 6000, "memory": NODE["memory"]}, "c1": {"cpu": 0, "memory": NODE["memory"]}}
        with story.sessions.begin() as session:
            story.report(session)
        small = submit("q0", 6, "1")  # read 4 at a time: 2 wait behind the first 4
        wide = submit("q1", 2, "8")  # more than c0 has free
        patient = submit("q2", 1, "8", "patient")  # reserves room once it has waited 30 s
        story.sync()
        story.now += timedelta(seconds=40)
        with story.sessions.begin() as session:
            story.report(session)
        first = run_cycle(story.sessions, SETTINGS, story.now, config=story.config, parking=story.parking)
        assert first.dispatched == 4 and first.more and first.planned is None
        assert set(first.holds) == set(patient)
        assert first.refill == {"q0", "q2"}  # q0 lost heads; q2's job holds room, kept by the cycle that reads it
        written = reasons(wide)

        rerun = run_cycle(story.sessions, SETTINGS, story.now, config=story.config, parking=story.parking,
                          holds=first.holds, refill=first.refill)
        assert rerun.planned == 2 and rerun.dispatched == 0  # q0's last two wait behind the reservation on c0
        assert rerun.holds == first.holds and not rerun.replan
        assert all(r.startswith("reserved capacity for job") for r in reasons(small[4:]))
        assert reasons(wide) == written  # q1 was not asked again at this moment

        story.free["c0"] = dict(NODE)  # q0's four end and c0 empties: the reserved job starts there
        with story.sessions.begin() as session:
            reports.cancel(session, small[:4], ADMIN)  # wakes q0 alone, which the refill plans anyway
            story.report(session)
        story.sync()
        started = run_cycle(story.sessions, SETTINGS, story.now, config=story.config, parking=story.parking,
                            holds=rerun.holds, refill=first.refill)
        assert started.planned == 2 and started.dispatched == 1 and not started.holds
        assert started.replan  # the room it gave up may concern the queues it left out: plan them at once

        story.parking.touch()  # a wake-up naming no queue came in meanwhile: no refill, every queue
        again = run_cycle(story.sessions, SETTINGS, story.now, config=story.config, parking=story.parking,
                          holds=started.holds, refill=first.refill)
        assert again.planned is None
    finally:
        story.close()
