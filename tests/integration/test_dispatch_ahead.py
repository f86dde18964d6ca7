"""A cycle that places many jobs sends them to Postgres in parts while it is still planning
(store.lifecycle.DispatchAhead): each job still moves exactly once, a search for victims that starts after
parts were sent reads them in the same transaction and never takes a job just sent for one, a part that
fails writes nothing, and the first part holds every cluster's outbox lock."""
from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.orm import sessionmaker

from dispatcher.policy.placing import Place
from dispatcher.scheduler.postgres_cycle import run_cycle
from dispatcher.scheduler.settings import SchedulerSettings
from dispatcher.store import lifecycle
from sluice.objects import ServiceClassObject
from tests.integration.test_cycle_commit import World

PART = 2  # jobs a part: small enough that every cycle here sends several


@pytest.fixture
def parts(monkeypatch):
    monkeypatch.setattr(lifecycle.DispatchAhead, "AHEAD", PART)


@pytest.fixture
def world(db_url, parts):
    w = World(db_url, clusters=("c0", "c1"), classes=(
        ServiceClassObject("batch", priority=100, preemptible=True),
        ServiceClassObject("standard", priority=500),
        ServiceClassObject("critical", priority=1000, can_preempt=True)))
    yield w
    w.db.close()


def moves(world: World) -> dict[int, tuple[int, int, int, int]]:
    """Per job: its attempt number, and how many attempts, DISPATCHED events and dispatch commands it has."""
    with world.db.engine.connect() as conn:
        return {r[0]: tuple(r[1:]) for r in conn.execute(text(
            """SELECT j.id, j.attempt,
                      (SELECT count(*) FROM attempts a WHERE a.job_id = j.id),
                      (SELECT count(*) FROM job_events e WHERE e.job_id = j.id AND e.to_state = 'DISPATCHED'),
                      (SELECT count(*) FROM outbox o WHERE o.job_id = j.id AND o.kind = 'dispatch')
               FROM jobs j"""))}


def test_a_cycle_sends_its_places_in_parts_and_each_job_moves_once(world):
    ids = world.submit(*["1"] * 20)  # 16 fit (two clusters of 8 cpus)
    result = run_cycle(world.sessions, SchedulerSettings(), world.now)
    assert result.dispatched == 16 and result.waiting == 4
    assert len(result.first_waits) == 16
    jobs, moved = world.jobs(), moves(world)
    dispatched = [i for i in ids if jobs[i][0] == "DISPATCHED"]
    assert len(dispatched) == 16
    assert all(moved[i] == (1, 1, 1, 1) for i in dispatched), moved
    for i in set(ids) - set(dispatched):
        assert jobs[i][0] == "QUEUED" and jobs[i][1] != lifecycle.SUBMITTED  # its reason, in the same commit
        assert moved[i] == (0, 0, 0, 0)
    with world.db.engine.connect() as conn:  # each cluster's commands in the order their jobs were placed
        for cluster in ("c0", "c1"):
            order = [r[0] for r in conn.execute(text(
                "SELECT job_id FROM outbox WHERE cluster = :c ORDER BY id"), {"c": cluster})]
            assert order == sorted(order) and order


def test_a_cycle_in_a_transaction_it_did_not_begin_takes_back_its_parts_with_it(world):
    world.submit(*["1"] * 6)
    with world.db.engine.connect() as conn:
        outer = conn.begin()
        shadow = sessionmaker(bind=conn, join_transaction_mode="create_savepoint", expire_on_commit=False)
        assert run_cycle(shadow, SchedulerSettings(), world.now).dispatched == 6
        outer.rollback()
    assert {state for state, _ in world.jobs().values()} == {"QUEUED"}
    assert world.count("attempts") == 0 and world.count("outbox") == 0


def test_a_search_for_victims_after_parts_were_sent_evicts_only_what_ran_before_the_cycle(world):
    batch = world.submit("4", "4", service_class="batch")
    assert run_cycle(world.sessions, SchedulerSettings(), world.now).dispatched == 2
    # Four small critical jobs fit in what is free and go in parts; then a big one fits nowhere free, and
    # its search reads the victims while those parts are out: the small ones show as active by then.
    small = world.submit("1", "1", "1", "1", service_class="critical")
    [big] = world.submit("8", service_class="critical")
    sent = []
    real_placed = lifecycle.DispatchAhead.placed

    def placed(self, places, bursts):
        real_placed(self, places, bursts)
        sent.append(self.sent)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lifecycle.DispatchAhead, "placed", placed)
        result = run_cycle(world.sessions, SchedulerSettings(), world.now)
    assert max(sent) >= 4  # the small ones had gone ahead
    moved, jobs = moves(world), world.jobs()
    assert all(moved[i] == (1, 1, 1, 1) for i in small), moved
    assert all(jobs[i][0] == "DISPATCHED" for i in small)  # none of them evicted
    assert {i: jobs[i] for i in batch} == {i: ("QUEUED", f"preempted by job {big}") for i in batch}
    assert jobs[big][0] == "QUEUED" and moved[big] == (0, 0, 0, 0)  # it holds the room its victims free
    assert result.dispatched == 4 and result.preempted == 2 and result.holds[big].victims == tuple(reversed(batch))


def test_a_part_that_fails_writes_nothing(world):
    first, second, third = world.submit("1", "1", "1")
    with pytest.raises(psycopg.errors.ForeignKeyViolation):  # jobs.cluster: a cluster that does not exist
        with world.sessions.begin() as session:
            ahead = lifecycle.DispatchAhead(session, ["c0", "nowhere"])
            try:
                ahead.placed([Place(first, "c0"), Place(second, "nowhere")], {})
                ahead.placed([Place(first, "c0"), Place(second, "nowhere"), Place(third, "c0")], {})
                ahead.end()
            finally:
                ahead.close()
    assert {state for state, _ in world.jobs().values()} == {"QUEUED"}
    assert world.count("attempts") == 0 and world.count("outbox") == 0
    assert world.count("job_events") == 3  # their QUEUED events only


def test_the_first_part_holds_the_outbox_lock_of_every_cluster_the_cycle_may_place_on(world):
    first, second = world.submit("1", "1")
    with world.sessions.begin() as session:
        ahead = lifecycle.DispatchAhead(session, ["c0", "c1"])
        try:
            ahead.placed([Place(first, "c0"), Place(second, "c0")], {})  # nothing for c1
            assert [d.job_id for d in ahead.end()] == [first, second]
        finally:
            ahead.close()
        with psycopg.connect(world.db.engine.url.render_as_string(hide_password=False).replace("+psycopg", ""),
                             autocommit=True) as other:
            for cluster in ("c0", "c1"):  # as another writer of the outbox (store.outbox.lock_clusters) asks
                assert other.execute("SELECT pg_try_advisory_xact_lock(7303, hashtext(%s))", (cluster,)).fetchone() \
                    == (False,)
        session.rollback()
