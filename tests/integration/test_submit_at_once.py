"""A small write in one round trip (dispatcher/services/group_commit.py Submitter._write_at_once, store.lifecycle
submit_if): validated against what the last write read, inserted by one statement that first checks that
the classes, the queues and the clusters are unchanged (the version in submit_config, which triggers
change at the commit of any change to them: migration 0008); otherwise the write goes the long way and
every call gets the answer a fresh read gives."""
from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime

import psycopg
import pytest
from sqlalchemy import text

from dispatcher import wakes
from dispatcher.errors import InvalidRequest, PermissionDenied
from dispatcher.services import administering, group_commit, submitting
from dispatcher.store import clusters as cluster_store
from dispatcher.store import lifecycle
from sluice.objects import load_objects
from tests.integration.test_spine import job_doc
from tests.integration.test_submit_groups import ADMIN, ALICE, BOB, _specs, store  # noqa: F401 - a fixture


@pytest.fixture
def at_once(monkeypatch):
    """How each small write went: True at once, False the long way (after trying, or not)."""
    ways: list[bool] = []
    original = group_commit.Submitter._write_at_once

    def spy(self, group):
        went = original(self, group)
        ways.append(went)
        return went
    monkeypatch.setattr(group_commit.Submitter, "_write_at_once", spy)
    return ways


def _apply(sessions, yaml: str) -> None:
    with sessions.begin() as session:
        administering.apply(session, "root", load_objects(yaml))


def _count(libpq: str, sql: str) -> int:
    with psycopg.connect(libpq, autocommit=True) as conn:
        return conn.execute(sql).fetchone()[0]


def test_the_second_small_write_goes_at_once_and_writes_what_the_long_way_does(store, at_once):
    sessions, libpq = store
    submitter = group_commit.Submitter(sessions)
    docs = [job_doc(name="x", cpu="2"), job_doc(name=None, cpu="500m", priority=-3, maxRetries=0)]
    docs[1]["metadata"] = {"labels": {"team": "vision"}}
    docs[1]["spec"]["podSets"][0]["template"]["metadata"]["annotations"]["note"] = "é ✓ \"quoted\" \\ \n"
    with psycopg.connect(libpq, autocommit=True) as listener:
        listener.execute("LISTEN sluice_wake")
        listener.execute("LISTEN sluice_events")
        first = submitter.submit(ALICE, submitting.parse([json.dumps(d) for d in docs]))
        list(listener.notifies(timeout=2, stop_after=2))
        second = submitter.submit(ALICE, submitting.parse([json.dumps(d) for d in docs]))
        notes = sorted((n.channel, n.payload) for n in listener.notifies(timeout=2, stop_after=2))
    assert at_once == [False, True]
    with psycopg.connect(libpq) as conn:
        [(class_priority,)] = conn.execute("SELECT class_priority FROM jobs WHERE id = %s", (second[0],)).fetchall()
    wake = wakes.submit_wake("default", class_priority, 0, second[0])  # the best new job: the first
    assert notes == [("sluice_events", ""), ("sluice_wake", wake)]
    assert second == sorted(second) and min(second) > max(first)
    columns = """name, queue, service_class, class_priority, priority, max_retries, spec, requests, largest_pod,
                 placement, labels, submitted_by, state, reason, cluster, attempt"""
    with psycopg.connect(libpq, autocommit=True) as conn:
        rows = {ids[0]: conn.execute(f"SELECT {columns} FROM jobs WHERE id = ANY(%s) ORDER BY id", (ids,)).fetchall()
                for ids in (first, second)}
        events = conn.execute("SELECT job_id, attempt, from_state, to_state, reason FROM job_events "
                              "WHERE job_id = ANY(%s) ORDER BY id", (second,)).fetchall()
    assert rows[first[0]] == rows[second[0]]
    assert events == [(i, 0, "", "QUEUED", "submitted") for i in second]


def test_a_membership_taken_away_is_seen_by_the_next_write(store, at_once):
    sessions, libpq = store
    submitter = group_commit.Submitter(sessions)
    assert submitter.submit(ALICE, _specs(["a-1"], queue="vision"))
    _apply(sessions, "apiVersion: sluice.io/v1\nkind: Queue\nmetadata: {name: vision}\nspec: {members: [carol]}\n")
    with pytest.raises(PermissionDenied, match="alice may not submit to queue 'vision'"):
        submitter.submit(ALICE, _specs(["a-2"], queue="vision"))
    assert at_once == [False, False]  # the statement found the queue changed and wrote nothing
    assert _count(libpq, "SELECT count(*) FROM jobs") == 1
    assert _count(libpq, "SELECT last_value FROM jobs_id_seq") == 1  # no id drawn for the refused write


def test_a_membership_given_is_seen_by_the_next_write(store, at_once):
    """A call the last read refuses is judged again on a fresh one."""
    sessions, _ = store
    submitter = group_commit.Submitter(sessions)
    with pytest.raises(PermissionDenied):
        submitter.submit(BOB, _specs(["b-1"], queue="vision"))
    _apply(sessions, "apiVersion: sluice.io/v1\nkind: Queue\nmetadata: {name: vision}\nspec: {members: [alice, bob]}\n")
    assert submitter.submit(BOB, _specs(["b-2"], queue="vision"))
    assert at_once == [False, False]


def test_a_class_changed_is_seen_by_the_next_write(store, at_once):
    sessions, libpq = store
    submitter = group_commit.Submitter(sessions)
    submitter.submit(ADMIN, _specs(["a"]))
    with sessions.begin() as session:
        session.execute(text("UPDATE service_classes SET priority = priority + 7 WHERE name = 'standard'"))
    ids = submitter.submit(ADMIN, _specs(["b"]))
    assert at_once == [False, False]
    with psycopg.connect(libpq, autocommit=True) as conn:
        priorities = conn.execute("SELECT class_priority FROM jobs ORDER BY id").fetchall()
        assert priorities[1][0] == priorities[0][0] + 7 and len(ids) == 1


def _report(sessions, allocatable: dict, free: dict) -> None:
    with sessions.begin() as session:
        for cluster in cluster_store.list_clusters(session):
            cluster_store.record_capacity(session, cluster.name, {"allocatable": allocatable, "free": free,
                                                                  "largestFreeNode": free},
                                          0, datetime.now(UTC))


def test_a_cluster_that_shrank_is_seen_by_the_next_write(store, at_once):
    sessions, _ = store
    submitter = group_commit.Submitter(sessions)
    assert submitter.submit(ADMIN, _specs(["fits"], cpu="32"))
    node = {"cpu": 16_000, "memory": 256 << 30}
    _report(sessions, node, node)
    with pytest.raises(InvalidRequest, match="no cluster could ever run it"):
        submitter.submit(ADMIN, _specs(["too-big-now"], cpu="32"))
    assert at_once == [False, False]


def test_a_heartbeat_that_changes_only_free_capacity_leaves_the_version_and_small_writes_at_once(store, at_once):
    sessions, libpq = store
    submitter = group_commit.Submitter(sessions)
    submitter.submit(ADMIN, _specs(["a"]))
    version = _count(libpq, "SELECT version FROM submit_config")
    node = {"cpu": 64_000, "memory": 256 << 30}  # the fixture's allocatable
    _report(sessions, node, {"cpu": 1_000, "memory": 1 << 30})
    submitter.submit(ADMIN, _specs(["b"]))
    assert _count(libpq, "SELECT version FROM submit_config") == version
    _report(sessions, {**node, "cpu": 48_000}, {"cpu": 1_000, "memory": 1 << 30})  # allocatable changed
    assert _count(libpq, "SELECT version FROM submit_config") > version
    submitter.submit(ADMIN, _specs(["c"]))
    submitter.submit(ADMIN, _specs(["d"]))
    assert at_once == [False, True, False, True]


@pytest.mark.parametrize("change", [
    "UPDATE queues SET spec = jsonb_set(spec, '{spec,members}', '[\"carol\"]') WHERE name = 'vision'",
    "INSERT INTO queues (name, spec) VALUES ('new', '{}')",
    "UPDATE service_classes SET priority = priority + 1 WHERE name = 'standard'",
    "UPDATE clusters SET labels = '{\"zone\": \"b\"}'",
    "UPDATE clusters SET tier = 'cloud'",
])
def test_each_change_submit_validates_against_moves_the_version_at_its_commit(store, change):
    _, libpq = store
    with psycopg.connect(libpq, autocommit=True) as reader, psycopg.connect(libpq) as writer:
        version = reader.execute("SELECT version FROM submit_config").fetchone()[0]
        writer.execute(change)
        assert reader.execute("SELECT version FROM submit_config").fetchone()[0] == version  # not committed yet
        writer.commit()
        assert reader.execute("SELECT version FROM submit_config").fetchone()[0] > version


def test_changes_to_two_clusters_in_opposite_orders_do_not_deadlock_on_the_version(store):
    """Each bump waits for the commit, after the transaction's row locks: T1 holds c1 and waits for c2,
    T2 holds c2 and commits, taking the version first. Bumped at each update instead, T2 would wait for
    T1's version lock while T1 waits for T2's row: a deadlock."""
    _, libpq = store
    with psycopg.connect(libpq, autocommit=True) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM clusters ORDER BY name LIMIT 2")]
        version = conn.execute("SELECT version FROM submit_config").fetchone()[0]
    grow = "UPDATE clusters SET capacity = jsonb_set(capacity, '{allocatable,cpu}', %s) WHERE name = %s"
    with psycopg.connect(libpq) as t1, psycopg.connect(libpq) as t2:
        for t in (t1, t2):
            t.execute("SET lock_timeout = '10s'")  # a wait that would never end fails the test instead
        t1.execute(grow, ("1000", names[0]))
        t2.execute(grow, ("2000", names[1]))
        errors = []

        def second_update() -> None:
            try:
                t1.execute(grow, ("1000", names[1]))  # waits for T2's row
                t1.commit()
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
        waiter = threading.Thread(target=second_update)
        waiter.start()
        time.sleep(0.3)
        t2.commit()
        waiter.join(30)
        assert not waiter.is_alive() and errors == []
    assert _count(libpq, "SELECT version FROM submit_config") == version + 3


def test_a_new_queue_goes_the_long_way_and_many_jobs_go_by_copy(store, at_once):
    sessions, _ = store
    submitter = group_commit.Submitter(sessions)
    submitter.submit(ADMIN, _specs(["a"]))
    submitter.submit(ALICE, _specs(["v"], queue="vision"))  # a queue the last write did not read
    submitter.submit(ADMIN, _specs([f"n-{n}" for n in range(lifecycle.COPY_FROM)], queue="vision"))
    submitter.submit(ALICE, _specs(["w"], queue="vision"))
    assert at_once == [False, False, False, True]


def test_a_group_postgres_refuses_at_once_fails_only_the_call_at_fault(store, at_once):
    sessions, libpq = store
    submitter = group_commit.Submitter(sessions)
    submitter.submit(ADMIN, _specs(["a"]))
    bad = job_doc(name="bad")
    bad["spec"]["podSets"][0]["template"]["metadata"]["annotations"]["x"] = float("nan")
    calls = [group_commit._Ticket(ADMIN, _specs(["b-1", "b-2"])),
             group_commit._Ticket(ADMIN, submitting.parse([json.dumps(bad)])),
             group_commit._Ticket(ADMIN, _specs(["c"]))]
    submitter._write(calls)  # one group, as gathered calls are
    # The group's statement raised (so it is not in at_once); then each call alone, at once: the two good
    # ones wrote, the bad one's statement raised too.
    assert at_once == [False, True, True]
    assert [len(t.submitted().ids) for t in (calls[0], calls[2])] == [2, 1]
    with pytest.raises(Exception) as err:
        calls[1].submitted()
    assert isinstance(getattr(err.value, "orig", err.value), psycopg.DataError)
    assert _count(libpq, "SELECT count(*) FROM jobs") == 4


def test_the_connection_is_kept_only_while_writes_follow(store):
    """Small writes keep one autocommit connection while writes follow each other (no pool ping per
    write); it goes back to the pool once nothing is queued, after an error, and after KEEP_S unused."""
    sessions, _ = store
    submitter = group_commit.Submitter(sessions)
    pool = sessions.kw["bind"].pool
    submitter.submit(ADMIN, _specs(["a"]))
    submitter.submit(ADMIN, _specs(["b"]))  # at once; nothing queued after it
    assert pool.checkedout() == 0
    kept = submitter._kept
    with kept:  # the pool's connection is kept (its psycopg connection is what a write uses)
        first = kept._connection
    with kept as driver:
        assert kept._connection is first and pool.checkedout() == 1
        assert driver is first.connection.driver_connection and driver.autocommit
    with pytest.raises(RuntimeError):
        with kept:
            raise RuntimeError("a failed write")
    assert pool.checkedout() == 0
    with kept:
        third = kept._connection
    kept.KEEP_S = 0.0
    time.sleep(0.01)
    with kept:
        assert kept._connection is not third and pool.checkedout() == 1
    kept.release_if_idle()
    assert pool.checkedout() == 0
