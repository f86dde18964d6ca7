"""A batch of agent reports applied at once (dispatcher/services/reporting.py apply_many), against a real Postgres:
the same outcome, event for event, as applying the reports one by one."""
from __future__ import annotations

import json

import pytest
from sqlalchemy import text
from sqlalchemy.orm import sessionmaker

from dispatcher import wakes
from dispatcher.services import administering, submitting
from dispatcher.services import reporting as reports
from dispatcher.store import channels, database, lifecycle
from dispatcher.store.tokens import Principal
from sluice.objects import default_objects
from sluice.wire import AttemptReport as Report
from tests.integration.test_spine import job_doc


@pytest.fixture
def sessions(db_url):
    db = database.connect(database.DatabaseSettings(url=db_url))
    made = sessionmaker(db.engine, expire_on_commit=False)
    with made.begin() as session:
        administering.apply(session, "root", default_objects())
    yield made
    db.close()


def _dispatched(sessions, n: int, cluster: str = "onprem", retries: int = 2) -> list[int]:
    docs = [json.dumps(job_doc(name=f"j{i}", maxRetries=retries)) for i in range(n)]
    with sessions.begin() as session:
        ids = submitting.submit(session, Principal("root", "admin"), submitting.parse(docs))
        lifecycle.dispatch(session, [(i, cluster) for i in ids])
    return ids


def _state(sessions, ids: list[int]) -> dict:
    with sessions() as session:
        jobs = session.execute(text(
            """SELECT id, state, reason, attempt, cluster, started_at IS NOT NULL, finished_at IS NOT NULL
               FROM jobs WHERE id = ANY(:ids) ORDER BY id"""), {"ids": ids}).all()
        attempts = session.execute(text(
            """SELECT job_id, attempt, state, reason, exit_code, started_at IS NOT NULL, finished_at IS NOT NULL
               FROM attempts WHERE job_id = ANY(:ids) ORDER BY job_id, attempt"""), {"ids": ids}).all()
        events = session.execute(text(
            """SELECT job_id, attempt, from_state, to_state, reason, cluster FROM job_events
               WHERE job_id = ANY(:ids) AND from_state <> '' ORDER BY id"""), {"ids": ids}).all()
    return {"jobs": [tuple(r[1:]) for r in jobs], "attempts": [tuple(r[1:]) for r in attempts],
            "events": [(ids.index(r[0]),) + tuple(r[1:]) for r in events]}


def _script(ids: list[int]) -> list[Report]:
    a, b, c, d = ids
    return [
        Report(a, 1, "RUNNING"), Report(a, 1, "RUNNING"), Report(a, 1, "SUCCEEDED"),  # a repeat, then done
        Report(b, 1, "RUNNING"), Report(b, 1, "FAILED", "exit 3", 3),  # retried: back to the queue
        Report(b, 1, "RUNNING"),  # stale now: the job went back to the queue
        Report(c, 2, "RUNNING"),  # stale: no such attempt
        Report(999_999, 1, "RUNNING"),  # unknown job
        Report(d, 1, "PENDING"), Report(d, 1, "LOST", "node gone"),
    ]


def test_a_batch_ends_exactly_as_its_reports_one_by_one(sessions):
    one_by_one, batched = _dispatched(sessions, 4), _dispatched(sessions, 4)
    for report in _script(one_by_one):
        with sessions.begin() as session:
            reports.apply(session, "onprem", report)
    with sessions.begin() as session:
        freed = reports.apply_many(session, "onprem", _script(batched))
    assert freed == 3  # a succeeded, b failed and d lost: three attempts ended
    alone, together = _state(sessions, one_by_one), _state(sessions, batched)
    assert together == alone
    assert [e[2:4] for e in together["events"] if e[0] == 0] == [("QUEUED", "DISPATCHED"), ("DISPATCHED", "RUNNING"),
                                                                ("RUNNING", "SUCCEEDED")]
    assert together["jobs"][1][0] == "QUEUED" and together["jobs"][1][3] is None  # retried: queued, no cluster
    assert together["attempts"][1][1:4] == ("FAILED", "exit 3", 3)
    assert together["jobs"][3][0] == "QUEUED" and together["attempts"][3][1] == "LOST"


def test_a_batch_with_nothing_to_change_writes_nothing(sessions):
    ids = _dispatched(sessions, 1)
    before = _state(sessions, ids)
    with sessions.begin() as session:
        assert not reports.apply_many(session, "onprem", [Report(ids[0], 1, "PENDING"), Report(ids[0], 7, "FAILED")])
        assert not reports.apply_many(session, "elsewhere", [Report(ids[0], 1, "SUCCEEDED")])  # not its cluster
    assert _state(sessions, ids) == before


def _notes(sessions, act) -> list[tuple[str, str]]:
    import psycopg
    url = sessions.kw["bind"].url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as listener:
        for channel in (channels.EVENTS_CHANNEL, channels.WAKE_CHANNEL, channels.OUTBOX_CHANNEL):
            listener.execute(f'LISTEN "{channel}"')
        with sessions.begin() as session:
            act(session)
        return sorted((n.channel, n.payload) for n in listener.notifies(timeout=1))


def test_a_batch_and_a_dispatch_notify_once_per_channel_on_commit(sessions):
    docs = [json.dumps(job_doc(name=f"n{i}")) for i in range(3)]
    with sessions.begin() as session:
        ids = submitting.submit(session, Principal("root", "admin"), submitting.parse(docs))
    sent = _notes(sessions, lambda s: lifecycle.dispatch(s, [(ids[0], "onprem"), (ids[1], "edge"), (ids[2], "onprem")]))
    assert sent == [("sluice_events", ""), ("sluice_outbox", "edge"), ("sluice_outbox", "onprem")]
    assert _notes(sessions, lambda s: reports.apply_many(s, "onprem", [Report(ids[0], 1, "RUNNING")])) == \
        [("sluice_events", "")]  # nothing freed: the scheduler sleeps on
    assert _notes(sessions, lambda s: reports.apply_many(s, "onprem", [Report(ids[0], 1, "SUCCEEDED")])) == \
        [("sluice_events", ""), ("sluice_wake", wakes.ROOM)]  # room freed, no job queued again
    assert _notes(sessions, lambda s: reports.apply_many(s, "edge", [Report(ids[1], 1, "LOST", "gone")])) == \
        [("sluice_events", ""), ("sluice_wake", "")]  # back in its queue: it may start again


def test_an_attempt_whose_end_was_applied_but_not_acked_is_no_orphan(sessions):
    """The dispatcher applied RUNNING and SUCCEEDED, then died before its ack: the agent's next hello lists
    the attempt as RUNNING (its earliest unacked report). Nothing is left of it to cancel. An attempt the
    dispatcher gave up on (LOST: its cluster silent past the lease) and the cluster still runs is one."""
    done, lost = _dispatched(sessions, 2)
    with sessions.begin() as session:
        reports.apply_many(session, "onprem", [Report(done, 1, "RUNNING"), Report(done, 1, "SUCCEEDED"),
                                               Report(lost, 1, "LOST", "the cluster went silent")])
    with sessions.begin() as session:
        orphans = reports.reconcile(session, {"onprem": [Report(done, 1, "RUNNING"), Report(lost, 1, "RUNNING")]})
    assert orphans == [("onprem", lost, 1)]
    assert _state(sessions, [done])["jobs"][0][0] == "SUCCEEDED"


def test_the_hellos_of_several_clusters_reconciled_together_each_come_out_as_alone(sessions):
    """A restart's agents say hello together and are reconciled in one transaction: on each cluster, a held
    attempt stays, an acked one it no longer holds is lost, and one it holds that is not live is its orphan;
    a cluster holding nothing with nothing live changes nothing."""
    held_onprem, gone_onprem = _dispatched(sessions, 2, "onprem")
    held_edge, orphan_edge = _dispatched(sessions, 2, "edge")
    with sessions.begin() as session:
        session.execute(text("UPDATE outbox SET acked_at = now() WHERE kind = 'dispatch'"))
        reports.apply_many(session, "edge", [Report(orphan_edge, 1, "LOST", "the cluster went silent")])
    with sessions.begin() as session:
        orphans = reports.reconcile(session, {
            "onprem": [Report(held_onprem, 1, "RUNNING")],
            "edge": [Report(held_edge, 1, "RUNNING"), Report(orphan_edge, 1, "RUNNING")], "cloud": []})
    assert orphans == [("edge", orphan_edge, 1)]
    jobs = _state(sessions, [held_onprem, gone_onprem, held_edge, orphan_edge])["jobs"]
    assert [state for state, *_ in jobs] == ["RUNNING", "QUEUED", "RUNNING", "QUEUED"]
    assert "lost on onprem: the cluster no longer holds it" in jobs[1][1]
    assert "lost on edge: the cluster went silent" in jobs[3][1]


def test_a_job_dispatched_to_the_cluster_while_its_hello_is_reconciled_is_not_lost(sessions, monkeypatch):
    """A dispatch the scheduler commits while a hello is reconciled is not in the hello's inventory, and needs
    not be: no agent has it yet. It was taken for lost when it committed between the reconcile's read of the
    unacked dispatches and its read of the cluster's active jobs (each statement sees what had committed when
    it began); its pending dispatch then made attempt 1's pods while attempt 2 ran elsewhere (issue 26)."""
    from dispatcher.store import job_reads
    docs = [json.dumps(job_doc(name="during-hello"))]
    with sessions.begin() as session:
        [job_id] = submitting.submit(session, Principal("root", "admin"), submitting.parse(docs))
    read_active = job_reads.active_attempts
    dispatched = []

    def dispatch_first(session, clusters):  # the scheduler's commit lands just before the read of active jobs
        if not dispatched:
            with sessions.begin() as scheduler:
                dispatched.extend(lifecycle.dispatch(scheduler, [(job_id, "onprem")]))
        return read_active(session, clusters)
    monkeypatch.setattr(job_reads, "active_attempts", dispatch_first)
    with sessions.begin() as session:
        assert reports.reconcile(session, {"onprem": []}) == []
    assert len(dispatched) == 1
    assert _state(sessions, [job_id])["jobs"][0][:3] == ("DISPATCHED", "dispatched to onprem", 1)


def test_a_running_attempt_s_address_is_written_when_said_and_again_when_it_changes(sessions):
    a, b, c = _dispatched(sessions, 3)

    def addresses() -> list:
        with sessions() as session:
            return session.execute(text("SELECT address FROM attempts WHERE job_id = ANY(:ids) ORDER BY job_id"),
                                   {"ids": [a, b, c]}).scalars().all()

    def events() -> int:
        with sessions() as session:
            return session.execute(text("SELECT count(*) FROM job_events WHERE job_id = ANY(:ids)"),
                                   {"ids": [a, b, c]}).scalar()

    with sessions.begin() as session:  # a batch with no address takes the statement without the column
        reports.apply_many(session, "onprem", [Report(a, 1, "RUNNING"), Report(b, 1, "PENDING")])
    assert addresses() == [None, None, None]
    with sessions.begin() as session:
        reports.apply_many(session, "onprem", [
            Report(a, 1, "RUNNING", address="10.0.0.1:8888"),  # known only now: no transition, the address alone
            Report(b, 1, "RUNNING", address="10.0.0.2"),  # with its start
            Report(c, 1, "PENDING", address="10.0.0.3")])  # not running: not written
    assert addresses() == ["10.0.0.1:8888", "10.0.0.2", None]
    before = events()
    with sessions.begin() as session:
        reports.apply_many(session, "onprem", [Report(a, 1, "RUNNING", address="10.0.0.9:8888"),
                                               Report(b, 1, "RUNNING", address="10.0.0.2"),  # a repeat
                                               Report(b, 1, "RUNNING")])  # said nothing: the address stays
    assert addresses() == ["10.0.0.9:8888", "10.0.0.2", None] and events() == before  # no event for an address
    with sessions.begin() as session:
        reports.apply_many(session, "onprem", [Report(a, 1, "SUCCEEDED"), Report(a, 1, "RUNNING", address="x:1")])
    assert addresses()[0] == "10.0.0.9:8888"  # a stale report after the end changes nothing


def test_a_running_attempt_s_nodes_are_written_when_said_and_read_by_the_cycle_as_its_victims_room(sessions):
    from dispatcher.scheduler.mapping import active_from_rows
    from dispatcher.store import cycle_reads

    a, b = _dispatched(sessions, 2)
    gpu = {"nvidia.com/gpu": 2000}

    def read() -> dict:
        with sessions() as session:
            return {x.job_id: x.nodes for x in active_from_rows(cycle_reads.active_attempts(session, nodes=True), {})}

    with sessions.begin() as session:
        reports.apply_many(session, "onprem", [Report(a, 1, "RUNNING", nodes=(("n1", gpu), ("n2", gpu))),
                                               Report(b, 1, "RUNNING")])
    assert read() == {a: (("n1", gpu), ("n2", gpu)), b: ()}
    with sessions.begin() as session:  # said alone, after its start: a pod that moved; then a repeat and silence
        reports.apply_many(session, "onprem", [Report(a, 1, "RUNNING", nodes=(("n3", {"nvidia.com/gpu": 4000}),)),
                                               Report(b, 1, "RUNNING", nodes=(("n1", gpu),)),
                                               Report(b, 1, "RUNNING")])
    assert read() == {a: (("n3", {"nvidia.com/gpu": 4000}),), b: (("n1", gpu),)}
    with sessions.begin() as session:
        reports.apply_many(session, "onprem", [Report(a, 1, "SUCCEEDED"), Report(a, 1, "RUNNING", nodes=(("x", gpu),))])
    assert a not in read()
    with sessions() as session:  # a stale report after the end wrote nothing
        assert session.execute(text("SELECT nodes FROM attempts WHERE job_id = :a"), {"a": a}).scalar() == \
            {"n3": {"nvidia.com/gpu": 4000}}
