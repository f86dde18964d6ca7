"""Group commit of Submit calls (dispatcher/services/group_commit.py Submitter), against a real Postgres.

Concurrent calls are written in one transaction; each call still gets its own ids (in its own order)
or its own error, and a call that fails in Postgres itself fails alone.
"""
from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime

import psycopg
import pytest
from sqlalchemy.orm import sessionmaker

from dispatcher import wakes
from dispatcher.errors import InvalidRequest, NotFound, PermissionDenied
from dispatcher.services import administering, group_commit, submitting
from dispatcher.store import clusters as cluster_store
from dispatcher.store import database
from dispatcher.store.tokens import Principal
from sluice.objects import default_objects, load_objects
from tests.integration.test_spine import job_doc

ADMIN = Principal("root", "admin")
ALICE = Principal("alice", "user")
BOB = Principal("bob", "user")


@pytest.fixture
def store(db_url):
    db = database.connect(database.DatabaseSettings(url=db_url))
    sessions = sessionmaker(db.engine, expire_on_commit=False)
    with sessions.begin() as session:
        administering.apply(session, "root", [*default_objects(), *load_objects(
            "apiVersion: sluice.io/v1\nkind: Queue\nmetadata: {name: vision}\nspec: {members: [alice]}\n---\n"
            "apiVersion: sluice.io/v1\nkind: Queue\nmetadata: {name: doomed}\n")])
        node = {"cpu": 64_000, "memory": 256 << 30}
        for cluster in cluster_store.list_clusters(session):  # every cluster has reported: sizes are judged
            report = {"allocatable": node, "free": node, "largestFreeNode": node}
            cluster_store.record_capacity(session, cluster.name, report, 0, datetime.now(UTC))
    yield sessions, db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    db.close()


def _specs(names: list[str], queue: str = "default", cpu: str = "1") -> list:
    docs = []
    for name in names:
        doc = job_doc(name=name, cpu=cpu)
        doc["spec"]["queue"] = queue
        docs.append(json.dumps(doc))
    return submitting.parse(docs)


class Calls:
    """Submit calls on threads of their own; each keeps its ids or its error."""

    def __init__(self, submitter: group_commit.Submitter):
        self.submitter = submitter
        self.results: dict[str, list[int] | Exception] = {}
        self.threads: list[threading.Thread] = []

    def start(self, label: str, principal: Principal, specs: list) -> None:
        def call():
            try:
                self.results[label] = self.submitter.submit(principal, specs)
            except Exception as exc:  # noqa: BLE001 - the error is the answer under test
                self.results[label] = exc
        thread = threading.Thread(target=call, name=label)
        thread.start()
        self.threads.append(thread)

    def join(self) -> None:
        for t in self.threads:
            t.join(30)
        assert not any(t.is_alive() for t in self.threads)


def _wait_for(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _waiting_locks(libpq: str) -> int:
    with psycopg.connect(libpq, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0]


def _rows(libpq: str, ids: list[int]) -> list[tuple]:
    with psycopg.connect(libpq, autocommit=True) as conn:
        return conn.execute("SELECT id, name, queue, xmin::text FROM jobs WHERE id = ANY(%s) ORDER BY id",
                            (ids,)).fetchall()


def test_calls_waiting_together_share_one_transaction_and_keep_their_own_answers(store):
    sessions, libpq = store
    calls = Calls(group_commit.Submitter(sessions))
    with psycopg.connect(libpq) as blocker:  # holds the first write at its first read
        blocker.execute("LOCK TABLE service_classes IN ACCESS EXCLUSIVE MODE")
        calls.start("first", ADMIN, _specs(["first"]))
        _wait_for(lambda: _waiting_locks(libpq) == 1, "the first write to wait for the lock")
        calls.start("a", ADMIN, _specs(["a-1", "a-2", "a-3"]))
        calls.start("b", ALICE, _specs(["b-1", "b-2"], queue="vision"))
        calls.start("denied", BOB, _specs(["bob-1"], queue="vision"))
        calls.start("no-queue", ADMIN, _specs(["x-1"], queue="nowhere"))
        calls.start("too-big", ADMIN, _specs(["ok-1", "huge"], cpu="100000"))
        calls.start("c", BOB, _specs(["c-1"]))
        _wait_for(lambda: len(calls.submitter._queued) == 6, "every other call to queue up")
        blocker.rollback()
    calls.join()
    r = calls.results
    assert isinstance(r["denied"], PermissionDenied) and "bob may not submit to queue 'vision'" in str(r["denied"])
    assert isinstance(r["no-queue"], NotFound) and "queue 'nowhere' not found" in str(r["no-queue"])
    assert isinstance(r["too-big"], InvalidRequest) and "document 1: no cluster could ever run it" in str(r["too-big"])
    names = {"first": ["first"], "a": ["a-1", "a-2", "a-3"], "b": ["b-1", "b-2"], "c": ["c-1"]}
    for label, expected in names.items():
        ids = r[label]
        assert ids == sorted(ids), f"{label}: ids out of the call's order"
        assert [row[1] for row in _rows(libpq, ids)] == expected
    group = r["a"] + r["b"] + r["c"]
    assert len(set(group + r["first"])) == 7
    assert len({row[3] for row in _rows(libpq, group)}) == 1, "the calls that waited together committed apart"
    assert {row[3] for row in _rows(libpq, r["first"])} != {row[3] for row in _rows(libpq, group)}
    with psycopg.connect(libpq, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 7
        assert conn.execute("SELECT count(*) FROM job_events WHERE to_state = 'QUEUED'").fetchone()[0] == 7


def test_calls_queued_behind_a_write_go_together_and_a_lone_call_goes_at_once(store):
    """Calls that queue while a write is under way are written together by the next write; a call that
    finds no write under way is written at once, waiting for no other."""
    sessions, libpq = store
    submitter = group_commit.Submitter(sessions)
    calls = Calls(submitter)
    with psycopg.connect(libpq) as blocker:  # holds the first write, so that the next two queue together
        blocker.execute("LOCK TABLE service_classes IN ACCESS EXCLUSIVE MODE")
        calls.start("first", ADMIN, _specs(["first"]))
        _wait_for(lambda: _waiting_locks(libpq) == 1, "the first write to wait for the lock")
        calls.start("a", ADMIN, _specs(["a"]))
        calls.start("b", ADMIN, _specs(["b"]))
        _wait_for(lambda: len(submitter._queued) == 2, "two calls to queue up")
        blocker.rollback()
    calls.join()
    xmin = {label: {row[3] for row in _rows(libpq, calls.results[label])} for label in ("first", "a", "b")}
    assert xmin["a"] == xmin["b"] != xmin["first"], "the calls queued behind a write were not written together"
    began = time.monotonic()
    first = submitter.submit(ADMIN, _specs(["c"]))
    second = submitter.submit(ADMIN, _specs(["d"]))
    assert time.monotonic() - began < 1.0, "a lone call waited for others"
    assert {row[3] for row in _rows(libpq, first)} != {row[3] for row in _rows(libpq, second)}


def test_a_call_that_fails_in_postgres_fails_alone(store):
    """The group's transaction fails (a queue deleted under it): every call is written again on its own,
    so only the call naming that queue fails, with the error it would have had alone."""
    sessions, libpq = store
    calls = Calls(group_commit.Submitter(sessions))
    with psycopg.connect(libpq) as blocker, psycopg.connect(libpq) as deleter:
        blocker.execute("LOCK TABLE service_classes IN ACCESS EXCLUSIVE MODE")
        calls.start("first", ADMIN, _specs(["first"]))
        _wait_for(lambda: _waiting_locks(libpq) == 1, "the first write to wait for the lock")
        calls.start("doomed", ADMIN, _specs(["d-1"], queue="doomed"))
        calls.start("fine", ADMIN, _specs(["f-1", "f-2"]))
        _wait_for(lambda: len(calls.submitter._queued) == 2, "the other calls to queue up")
        deleter.execute("DELETE FROM queues WHERE name = 'doomed'")  # not committed: the group still sees it
        blocker.rollback()
        _wait_for(lambda: "first" in calls.results, "the first call")
        _wait_for(lambda: _waiting_locks(libpq) == 1, "the group's insert to wait for the deleted queue")
        deleter.commit()
    calls.join()
    r = calls.results
    assert isinstance(r["doomed"], NotFound) and "queue 'doomed' not found" in str(r["doomed"])
    assert [row[1] for row in _rows(libpq, r["fine"])] == ["f-1", "f-2"]
    assert len(_rows(libpq, r["first"])) == 1
    with psycopg.connect(libpq, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 3


def test_many_concurrent_calls_each_get_exactly_their_jobs(store):
    sessions, libpq = store
    calls = Calls(group_commit.Submitter(sessions))
    for t in range(12):
        calls.start(f"t{t}", ADMIN, _specs([f"t{t}-{i}" for i in range(1 + t % 4)]))
    calls.join()
    seen: set[int] = set()
    for t in range(12):
        ids = calls.results[f"t{t}"]
        assert [row[1] for row in _rows(libpq, ids)] == [f"t{t}-{i}" for i in range(1 + t % 4)]
        seen |= set(ids)
    assert len(seen) == sum(1 + t % 4 for t in range(12))


def test_a_cluster_that_grew_is_seen_by_the_next_call(store):
    """The clusters read by one write are reused by the next only while their digest is unchanged."""
    sessions, _ = store
    submitter = group_commit.Submitter(sessions)
    with pytest.raises(InvalidRequest, match="no cluster could ever run it"):
        submitter.submit(ADMIN, _specs(["big"], cpu="100"))
    assert submitter.submit(ADMIN, _specs(["small"]))  # the clusters unchanged: read from the last write
    node = {"cpu": 128_000, "memory": 256 << 30}
    with sessions.begin() as session:
        cluster_store.record_capacity(session, "onprem", {"allocatable": node, "free": node, "largestFreeNode": node},
                                      0, datetime.now(UTC))
    with pytest.raises(InvalidRequest, match="no cluster could ever run it"):
        submitter.submit(ADMIN, _specs(["bigger"], cpu="200"))
    assert submitter.submit(ADMIN, _specs(["big"], cpu="100"))


@pytest.mark.parametrize("doc, where", [
    ({"metadata": {"name": "a\u0000b"}}, "metadata.name"),
    ({"metadata": {"labels": {"team\u0000": "x"}}}, "metadata.labels.team\\u0000"),
    ({"spec": {"podSets": [{"template": {"metadata": {"annotations": {"k": "\u0000"}}}}]}},
     "spec.podSets[0].template.metadata.annotations.k"),
])
def test_a_nul_character_is_refused_with_where_it_is(doc, where):
    base = job_doc()
    for key, value in doc.items():
        if key == "spec":
            base["spec"]["podSets"][0]["template"]["metadata"]["annotations"].update(
                value["podSets"][0]["template"]["metadata"]["annotations"])
        else:
            base["metadata"].update(value)
    with pytest.raises(InvalidRequest) as err:
        submitting.parse([json.dumps(job_doc(name="fine")), json.dumps(base)])
    assert str(err.value) == f"document 2: {where}: contains a NUL character (\\u0000)"


def test_a_write_wakes_the_scheduler_and_the_watchers_once(store):
    sessions, libpq = store
    with psycopg.connect(libpq, autocommit=True) as listener:
        listener.execute("LISTEN sluice_wake")
        listener.execute("LISTEN sluice_events")
        ids = group_commit.Submitter(sessions).submit(ADMIN, _specs(["a", "b", "c"]))
        got = sorted((n.channel, n.payload) for n in listener.notifies(timeout=2, stop_after=3))
    # The wake-up names the queue that got jobs (the scheduler plans it even while others are parked),
    # with its best new job's order: all three alike, so the first.
    with psycopg.connect(libpq) as conn:
        [(class_priority,)] = conn.execute("SELECT class_priority FROM jobs WHERE id = %s", (ids[0],)).fetchall()
    assert got == [("sluice_events", ""), ("sluice_wake", wakes.submit_wake("default", class_priority, 0, ids[0]))]
