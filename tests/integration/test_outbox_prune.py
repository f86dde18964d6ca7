"""Pruning the outbox (store.outbox.prune): acked commands that nothing reads any more go, against their
plain definition, in a real Postgres; what the agent link and the cycle read of the outbox stays the
same; and the leader prunes between its cycles."""
from __future__ import annotations

import random
import time

import pytest
from sqlalchemy import text

from dispatcher.scheduler.settings import SchedulerSettings
from dispatcher.store import cycle_reads
from dispatcher.store import outbox as outbox_store
from sluice.objects import ClusterObject, QueueObject, ServiceClassObject, SimulatedSpec
from tests.integration.scenarios import store_with
from tests.integration.test_scheduler_loop import _leading, _submit, _until_dispatched

CLUSTERS = ("c0", "c1", "c2")


@pytest.fixture
def sessions(db_url):
    with store_with(db_url, [
            ServiceClassObject("standard", priority=500), QueueObject("q"),
            *(ClusterObject(name, tier="onprem", site="dc", simulated=SimulatedSpec(1, {"cpu": 64000}))
              for name in CLUSTERS)]) as made:
        yield made


def _fill(session, rnd: random.Random, n: int) -> None:
    """n commands of running jobs on random clusters: acked or not, an hour old or new; then a random
    watermark per cluster (applied_through). The third cluster gets no acked command at all."""
    for i in range(n):
        job = session.scalar(text(
            """INSERT INTO jobs (queue, service_class, class_priority, state, cluster, attempt, spec, requests,
                                 largest_pod)
               VALUES ('q', 'standard', 500, 'RUNNING', :c, 1, '{}', '{"cpu": 1000}', '{"cpu": 1000}')
               RETURNING id"""), {"c": CLUSTERS[i % 3]})
        acked = i % 3 != 2 and rnd.random() < 0.7
        session.execute(text(
            """INSERT INTO outbox (cluster, kind, job_id, attempt, created_at, acked_at)
               VALUES (:c, :k, :j, 1, now() - make_interval(secs => :age),
                       CASE WHEN :acked THEN now() END)"""),
            {"c": CLUSTERS[i % 3], "k": rnd.choice(("dispatch", "dispatch", "cancel")), "j": job,
             "age": rnd.choice((7200, 7200, 10)), "acked": acked})
    top = session.scalar(text("SELECT max(id) FROM outbox"))
    for name in CLUSTERS:
        session.execute(text("UPDATE clusters SET applied_through = :w WHERE name = :c"),
                        {"w": rnd.randrange(top + 1), "c": name})


PLAIN = """SELECT o.id FROM outbox o JOIN clusters c ON c.name = o.cluster
           WHERE o.acked_at IS NOT NULL AND o.id <= c.applied_through AND o.created_at < now() - interval '1 hour'
             AND o.id < (SELECT max(id) FROM outbox n WHERE n.cluster = o.cluster AND n.acked_at IS NOT NULL)"""


def _reads(session) -> tuple:
    """What is read of the outbox: commands in flight, the acked watermarks, the unacked commands."""
    return (cycle_reads.capacity_reads(session).in_flight,
            outbox_store.acked_through(session, CLUSTERS),
            {c: [r.id for r in outbox_store.pending(session, c)] for c in CLUSTERS},
            outbox_store.unacked_dispatches(session, CLUSTERS))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_prune_deletes_exactly_what_nothing_reads_and_every_read_stays_the_same(sessions, seed):
    with sessions.begin() as session:
        _fill(session, random.Random(seed), 120)
        doomed = set(session.scalars(text(PLAIN)))
        before = set(session.scalars(text("SELECT id FROM outbox")))
        reads = _reads(session)
        assert 0 < len(doomed) < len(before)
        assert outbox_store.prune(session, 3600, 10_000) == len(doomed)
        assert set(session.scalars(text("SELECT id FROM outbox"))) == before - doomed
        assert _reads(session) == reads
        assert outbox_store.prune(session, 3600, 10_000) == 0  # nothing left to prune


def test_prune_takes_the_oldest_first_and_at_most_its_limit_per_cluster(sessions):
    with sessions.begin() as session:
        _fill(session, random.Random(4), 120)
        doomed = sorted(session.scalars(text(PLAIN)))
        per_cluster = {c: [i for i, c2 in session.execute(text(
            "SELECT id, cluster FROM outbox WHERE id = ANY(:ids) ORDER BY id"), {"ids": doomed}) if c2 == c]
            for c in CLUSTERS}
        assert outbox_store.prune(session, 3600, 2) == sum(min(2, len(v)) for v in per_cluster.values())
        gone = set(doomed) - set(session.scalars(text("SELECT id FROM outbox")))
        assert gone == {i for v in per_cluster.values() for i in v[:2]}


def test_the_leader_prunes_acked_commands_between_cycles(db_url):
    settings = SchedulerSettings(idle_wait_s=60.0, outbox_retention_s=0.0, outbox_prune_interval_s=0.0)
    with _leading(db_url, settings) as d:
        ids = _submit(d.sessions, 3)
        _until_dispatched(d.sessions, 3)
        with d.sessions.begin() as session:  # the agent acked them all and reported after them
            session.execute(text("UPDATE outbox SET acked_at = now()"))
            session.execute(text("UPDATE clusters SET applied_through = (SELECT max(id) FROM outbox)"))
        _submit(d.sessions, 1)  # a wake-up: a cycle, then the pruning
        deadline = time.monotonic() + 10
        while True:
            with d.sessions() as session:
                left = session.execute(text("SELECT job_id, acked_at IS NULL FROM outbox ORDER BY id")).all()
            if len(left) == 2:
                break
            assert time.monotonic() < deadline, left
            time.sleep(0.05)
        # the newest acked command stays (the agent's watermark starts there), and the new, unacked one
        assert [tuple(r) for r in left] == [(ids[-1], False), (ids[-1] + 1, True)]


def test_the_leader_prunes_submit_keys_past_their_retention_between_cycles(db_url):
    settings = SchedulerSettings(idle_wait_s=60.0, outbox_prune_interval_s=0.0, submit_key_retention_s=3600.0)
    with _leading(db_url, settings) as d:
        with d.sessions.begin() as session:
            session.execute(text("INSERT INTO submit_keys (subject, key, digest, ids, created_at) VALUES "
                                 "('alice', 'old', '', '{1}', now() - interval '2 hours'), "
                                 "('alice', 'new', '', '{2}', now())"))
        _submit(d.sessions, 1)  # a wake-up: a cycle, then the pruning
        deadline = time.monotonic() + 10
        while True:
            with d.sessions() as session:
                left = session.execute(text("SELECT key FROM submit_keys ORDER BY key")).scalars().all()
            if left == ["new"]:
                break
            assert time.monotonic() < deadline, left
            time.sleep(0.05)
