"""What Submit writes (dispatcher/store/lifecycle.py submit: a few jobs in one statement, many by ids from the
sequence then binary COPY), against a real Postgres: the rows, events and notifications exactly, a write
Postgres refuses part-way through a group, and which writes hand on before their insert.
"""
from __future__ import annotations

import json
import time

import psycopg
import pytest

from dispatcher import wakes
from dispatcher.services import group_commit, submitting
from dispatcher.store import lifecycle
from tests.integration.test_spine import job_doc
from tests.integration.test_submit_groups import (  # noqa: F401 - store is a fixture
    ADMIN,
    ALICE,
    Calls,
    _specs,
    _wait_for,
    _waiting_locks,
    store,
)


def _table(libpq: str, sql: str, *args) -> list[tuple]:
    with psycopg.connect(libpq, autocommit=True) as conn:
        return conn.execute(sql, args).fetchall()


def _waiting_statements(libpq: str) -> list[str]:
    """The first two words of each statement waiting for a lock, sorted: which way each write inserts."""
    return sorted(" ".join(query.split()[:2]) for (query,) in _table(
        libpq, "SELECT query FROM pg_stat_activity WHERE wait_event_type = 'Lock'"))


@pytest.mark.parametrize("copy_from", [1, 10**6], ids=["copy", "one-statement"])
def test_the_rows_events_and_notifications_written_are_the_submitted_jobs(store, copy_from):
    """Both ways of writing (binary COPY for many jobs, one statement for a few) write the same."""
    sessions, libpq = store
    docs = [job_doc(name="a", cpu="2", count=3), job_doc(name=None, cpu="500m", priority=-3, maxRetries=0),
            job_doc(name="c", cpu="2", serviceClass="batch")]
    docs[1]["metadata"] = {"labels": {"team": "vision", "tier": ""}}
    docs[2]["spec"]["placement"] = {"tiers": ["onprem", "cloud"], "sites": ["dc-1", "cloud-1"]}
    docs[2]["spec"]["maxRuntime"] = "90m"
    docs[2]["spec"]["podSets"][0]["template"]["metadata"]["annotations"]["note"] = "é ✓ \"quoted\" \\ \n"
    specs = submitting.parse([json.dumps(d) for d in docs])
    with psycopg.connect(libpq, autocommit=True) as listener:
        listener.execute("LISTEN sluice_wake")
        listener.execute("LISTEN sluice_events")
        with sessions.begin() as session:
            rows = submitting.SubmitConfig.read(session, {"default"}).rows(ALICE, specs)
            ids = lifecycle.submit(session, rows, copy_from=copy_from)
        notes = sorted((n.channel, n.payload) for n in listener.notifies(timeout=2, stop_after=2))
    # The wake-up names the queue and its best new job's order; COPY draws the ids with it, so gives 0.
    best = max(range(3), key=lambda i: (rows[i].class_priority, rows[i].priority, -i))
    wake = wakes.submit_wake("default", rows[best].class_priority, rows[best].priority,
                                 0 if copy_from == 1 else ids[best])
    assert notes == [("sluice_events", ""), ("sluice_wake", wake)]
    assert ids == sorted(ids) and len(set(ids)) == 3
    rows = _table(libpq, """SELECT id, name, queue, service_class, class_priority, priority, max_retries, spec,
                                   requests, largest_pod, placement, labels, submitted_by, state, reason, cluster,
                                   attempt, created_at IS NOT NULL, pods
                            FROM jobs ORDER BY id""")
    classes = dict(_table(libpq, "SELECT name, priority FROM service_classes"))
    expected_class = ["standard", "standard", "batch"]
    for row, spec, job_id, class_name in zip(rows, specs, ids, expected_class):
        document = spec.to_document()
        document["spec"]["serviceClass"] = class_name
        assert row == (job_id, spec.name, "default", class_name, classes[class_name], spec.priority,
                       spec.max_retries, document, spec.total_requests(), spec.largest_pod(),
                       document["spec"]["placement"], dict(spec.labels), "alice", "QUEUED", "submitted", None, 0,
                       True, [[3, {"cpu": 2000}]] if spec.name == "a" else None)  # pods: only of a gang
    events = _table(libpq, "SELECT id, job_id, attempt, from_state, to_state, reason, cluster FROM job_events "
                           "ORDER BY id")
    assert [e[1:] for e in events] == [(i, 0, "", "QUEUED", "submitted", None) for i in ids]


@pytest.mark.parametrize("bad_jobs", [lifecycle.COPY_FROM, 1], ids=["copy", "one-statement"])
# (A lone surrogate, which Postgres refuses too, is now refused when the document is parsed: test_api_errors.)
@pytest.mark.parametrize("bad_value", [float("nan")], ids=["nan"])
def test_a_write_postgres_refuses_part_way_through_a_group_fails_only_its_call(store, bad_value, bad_jobs):
    """The group's write fails on one call's document (Python decodes it; Postgres' jsonb refuses it):
    every call is written again alone, the others succeed, and the failed call writes nothing. With a big
    bad call the group and the bad call alone go by COPY; with a small one, each in one statement."""
    sessions, libpq = store
    bad = job_doc(name="bad-2")
    bad["spec"]["podSets"][0]["template"]["metadata"]["annotations"]["x"] = bad_value
    calls = Calls(group_commit.Submitter(sessions))
    with psycopg.connect(libpq) as blocker:  # holds the first write, so the others queue into one group
        blocker.execute("LOCK TABLE service_classes IN ACCESS EXCLUSIVE MODE")
        calls.start("first", ADMIN, _specs(["first"]))
        _wait_for(lambda: _waiting_locks(libpq) == 1, "the first write to wait for the lock")
        calls.start("before", ADMIN, _specs(["b-1", "b-2"]))
        good = [json.dumps(job_doc(name=f"bad-{n}")) for n in range(1, bad_jobs)]
        calls.start("bad", ADMIN, submitting.parse([*good, json.dumps(bad)]))
        calls.start("after", ADMIN, _specs(["a-1"]))
        _wait_for(lambda: len(calls.submitter._queued) == 3, "the other calls to queue up")
        blocker.rollback()
    calls.join()
    r = calls.results
    assert isinstance(getattr(r["bad"], "orig", r["bad"]), psycopg.DataError)  # COPY's own, or SQLAlchemy's of it
    for label, names in {"first": ["first"], "before": ["b-1", "b-2"], "after": ["a-1"]}.items():
        assert [row[0] for row in _table(libpq, "SELECT name FROM jobs WHERE id = ANY(%s) ORDER BY id",
                                         r[label])] == names
    assert _table(libpq, "SELECT count(*) FROM jobs WHERE name LIKE 'bad-%%'") == [(0,)]
    assert _table(libpq, "SELECT count(*) FROM jobs") == [(4,)]
    assert _table(libpq, "SELECT count(*) FROM job_events") == [(4,)]
    assert _table(libpq, "SELECT count(*) FROM job_events e LEFT JOIN jobs j ON j.id = e.job_id "
                         "WHERE j.id IS NULL") == [(0,)]


def test_the_next_write_validates_while_one_is_in_postgres_and_at_most_two_are_under_way(store):
    """A write of many jobs (by COPY) hands on once its rows are made: the next group reads and validates
    while the first one's COPY waits, and a third waits for one of the two to end, gathering the calls
    queued meanwhile."""
    sessions, libpq = store
    calls = Calls(group_commit.Submitter(sessions))
    many = lifecycle.COPY_FROM  # the fewest jobs that go by COPY, and so hand on before their insert
    with psycopg.connect(libpq) as blocker:  # every insert into jobs waits behind this lock
        blocker.execute("LOCK TABLE jobs IN SHARE MODE")
        calls.start("first", ADMIN, _specs([f"first-{n}" for n in range(many)]))
        _wait_for(lambda: _waiting_locks(libpq) == 1, "the first write's COPY to wait")
        calls.start("second", ADMIN, _specs([f"second-{n}" for n in range(many)]))
        _wait_for(lambda: _waiting_locks(libpq) == 2, "the second write's COPY to wait as well")
        assert _waiting_statements(libpq) == ["COPY jobs", "COPY jobs"]  # both in Postgres at once
        calls.start("third", ADMIN, _specs(["third"]))  # leads the next write, which waits for one to end
        calls.start("fourth", ADMIN, _specs(["fourth-1", "fourth-2"]))
        _wait_for(lambda: len(calls.submitter._queued) == 2, "the third and fourth calls to queue")
        time.sleep(0.2)
        assert _waiting_locks(libpq) == 2 and len(calls.submitter._queued) == 2 and not calls.results
        blocker.rollback()
    calls.join()
    r = calls.results
    assert [len(r[label]) for label in ("first", "second", "third", "fourth")] == [many, many, 1, 2]
    xmin = {label: {row[0] for row in _table(libpq, "SELECT xmin::text FROM jobs WHERE id = ANY(%s)", r[label])}
            for label in r}
    assert all(len(x) == 1 for x in xmin.values())
    assert xmin["third"] == xmin["fourth"], "the calls queued while the third waited were not written with it"
    assert len({next(iter(x)) for x in xmin.values()}) == 3
    assert max(r["first"]) < min(r["second"]) and max(r["second"]) < r["third"][0] < r["fourth"][0]
    assert all(r[label] == sorted(r[label]) for label in r)


def test_a_small_write_hands_on_after_its_commit(store):
    """Calls of a few jobs (one statement each write) keep gathering into one transaction: the next write
    waits for the commit."""
    sessions, libpq = store
    calls = Calls(group_commit.Submitter(sessions))
    with psycopg.connect(libpq) as blocker:
        blocker.execute("LOCK TABLE jobs IN SHARE MODE")
        calls.start("first", ADMIN, _specs([f"first-{n}" for n in range(lifecycle.COPY_FROM - 1)]))
        _wait_for(lambda: _waiting_locks(libpq) == 1, "the first write's insert to wait")
        assert _waiting_statements(libpq) == ["WITH new"]  # the one statement, not COPY
        calls.start("a", ADMIN, _specs(["a"]))
        calls.start("b", ADMIN, _specs(["b-1", "b-2"]))
        _wait_for(lambda: len(calls.submitter._queued) == 2, "the other calls to queue")
        time.sleep(0.2)
        assert _waiting_locks(libpq) == 1
        blocker.rollback()
    calls.join()
    xmin = _table(libpq, "SELECT xmin::text FROM jobs WHERE id = ANY(%s)", calls.results["a"] + calls.results["b"])
    assert len(set(xmin)) == 1
    assert len(calls.results["first"]) == lifecycle.COPY_FROM - 1
