"""An attempt's start and end are the times its agent saw them, bounded by what the dispatcher knows.

A scripted agent speaks the real protocol over real gRPC and stamps its reports (AttemptStatus.at); the
attempt's run time is then read back through what `sluice usage` reads (the Usage RPC) and the job's
events. Reports arriving long after the fact (an edge cluster's outage) must not be charged the wait.
"""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import select, update

from dispatcher.server import Dispatcher, ServerSettings
from dispatcher.store import tokens
from dispatcher.store.database import DatabaseSettings
from dispatcher.store.models import Attempt, Job, JobEvent
from sluice.client import Client
from sluice.config import ClientConfig
from sluice.objects import load_objects
from sluice.v1 import agents_pb2
from tests.integration.test_agent_link import OBJECTS, ScriptedAgent
from tests.integration.test_spine import job_doc


@pytest.fixture
def dispatcher(db_url):
    from dispatcher.store import clusters as cluster_store
    d = Dispatcher(ServerSettings(listen="127.0.0.1:0", database=DatabaseSettings(url=db_url))).start()
    with d.sessions.begin() as session:
        cluster_store.apply_objects(session, load_objects(OBJECTS))
        admin = tokens.create(session, "admin", "admin")
        agent_token = tokens.create(session, "agent", "agent-alpha", "alpha")
    d.client = Client(ClientConfig(d.address, admin, timeout_s=10, insecure=True))
    d.agent = ScriptedAgent(d.address, agent_token, "alpha")
    d.agent.next("welcome")
    d.seq = 0
    yield d
    d.agent.close()
    d.client.close()
    d.stop()


def dispatched(d, *, dispatched_at: datetime | None = None) -> int:
    """A one-cpu job dispatched to alpha (its dispatch acked), its dispatch time moved to `dispatched_at`."""
    [job_id] = d.client.submit([job_doc(cpu="1")])
    command = d.agent.next("command")
    assert command.dispatch.job_id == job_id
    d.agent.send(ack=agents_pb2.CommandAck(command_ids=[command.id]))
    if dispatched_at is not None:
        with d.sessions.begin() as session:
            session.execute(update(Attempt).where(Attempt.job_id == job_id).values(dispatched_at=dispatched_at))
            session.execute(update(Job).where(Job.id == job_id).values(dispatched_at=dispatched_at))
    return job_id


def report(d, job_id: int, state: str, at: datetime | None) -> None:
    """One status report stamped `at` (None: unstamped, as older agents send), once it is committed."""
    stamp = Timestamp()
    if at is not None:
        stamp.FromDatetime(at)
    d.seq += 1
    d.agent.send(status=agents_pb2.StatusReport(seq=d.seq, status=agents_pb2.AttemptStatus(
        job_id=job_id, attempt=1, state=state, at=stamp if at is not None else None)))
    assert d.agent.next("status_ack").seq == d.seq


def times(d, job_id: int) -> tuple[Attempt, Job, dict[str, datetime]]:
    """The job's first attempt, the job, and the times of its events up to that attempt's (a failed attempt
    may be followed by a second one before this reads)."""
    with d.sessions() as session:
        attempt = session.scalars(select(Attempt).where(Attempt.job_id == job_id, Attempt.attempt == 1)).one()
        job = session.get(Job, job_id)
        events = {e.to_state: e.at for e in session.scalars(select(JobEvent).where(
            JobEvent.job_id == job_id, JobEvent.attempt <= 1))}
        session.expunge_all()
    return attempt, job, events


def test_a_result_reported_hours_late_is_charged_its_real_run(dispatcher):
    # It started an hour after its dispatch, and the agent said so at once ...
    job_id = dispatched(dispatcher, dispatched_at=datetime.now(UTC) - timedelta(hours=1))
    report(dispatcher, job_id, "RUNNING", None)
    # ... and five hours on: it ended an hour into its run, during a 4 h outage, and the agent says so now.
    five_hours = timedelta(hours=5)
    with dispatcher.sessions.begin() as session:
        for model, key in ((Attempt, Attempt.job_id), (Job, Job.id)):
            session.execute(update(model).where(key == job_id).values(
                dispatched_at=model.dispatched_at - five_hours, started_at=model.started_at - five_hours))
    running, _job, _events = times(dispatcher, job_id)
    ended = running.started_at + timedelta(hours=1)
    report(dispatcher, job_id, "SUCCEEDED", ended)

    [alpha] = dispatcher.client.usage(since_s=0, by="cluster")["groups"]
    assert alpha["group"] == "alpha" and alpha["attempts"] == 1
    assert alpha["resourceHours"]["cpu"] == pytest.approx(1.0)  # one core for one hour, not five
    attempt, job, events = times(dispatcher, job_id)
    assert attempt.finished_at == job.finished_at == events["SUCCEEDED"] == ended


def test_a_whole_run_reported_late_keeps_the_agents_times(dispatcher):
    # Dispatched 6 h ago; the agent saw it run from 5 h ago to 4 h ago, and could only say so now.
    now = datetime.now(UTC)
    job_id = dispatched(dispatcher, dispatched_at=now - timedelta(hours=6))
    started, ended = now - timedelta(hours=5), now - timedelta(hours=4)
    report(dispatcher, job_id, "RUNNING", started)
    report(dispatcher, job_id, "SUCCEEDED", ended)

    [alpha] = dispatcher.client.usage(since_s=0, by="cluster")["groups"]
    assert alpha["resourceHours"]["cpu"] == pytest.approx(1.0)
    attempt, job, events = times(dispatcher, job_id)
    assert (attempt.started_at, attempt.finished_at) == (started, ended)
    assert (job.started_at, job.finished_at) == (started, ended)
    assert (events["RUNNING"], events["SUCCEEDED"]) == (started, ended)


def test_a_time_in_the_future_is_taken_as_now(dispatcher):
    job_id = dispatched(dispatcher)
    report(dispatcher, job_id, "RUNNING", None)
    before = datetime.now(UTC)
    report(dispatcher, job_id, "SUCCEEDED", before + timedelta(hours=3))
    after = datetime.now(UTC)
    attempt, job, events = times(dispatcher, job_id)
    assert before - timedelta(seconds=1) <= attempt.finished_at <= after
    assert job.finished_at == events["SUCCEEDED"] == attempt.finished_at


def test_a_time_before_the_dispatch_is_taken_as_the_dispatch(dispatcher):
    dispatched_at = datetime.now(UTC) - timedelta(minutes=10)
    job_id = dispatched(dispatcher, dispatched_at=dispatched_at)
    report(dispatcher, job_id, "RUNNING", dispatched_at - timedelta(hours=2))
    # ... and an end before the start is taken as the start.
    report(dispatcher, job_id, "FAILED", dispatched_at - timedelta(hours=1))
    attempt, job, events = times(dispatcher, job_id)
    assert attempt.started_at == attempt.finished_at == dispatched_at
    assert events["RUNNING"] == dispatched_at


def test_an_unstamped_report_takes_its_arrival_time(dispatcher):
    job_id = dispatched(dispatcher, dispatched_at=datetime.now(UTC) - timedelta(hours=1))
    before = datetime.now(UTC)
    report(dispatcher, job_id, "RUNNING", None)
    after = datetime.now(UTC)
    attempt, job, events = times(dispatcher, job_id)
    assert before - timedelta(seconds=1) <= attempt.started_at <= after
    assert job.started_at == events["RUNNING"] == attempt.started_at
