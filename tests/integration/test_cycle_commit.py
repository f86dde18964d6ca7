"""A cycle's last round trip: its pending reasons, its dispatches and its COMMIT go to Postgres together
(store.lifecycle.dispatch with commit=True), unless the cycle runs in a transaction it did not begin."""
from __future__ import annotations

import json
from datetime import UTC, datetime

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.orm import sessionmaker

from dispatcher.scheduler.postgres_cycle import run_cycle
from dispatcher.scheduler.settings import SchedulerSettings
from dispatcher.services import administering, submitting
from dispatcher.store import clusters as cluster_store
from dispatcher.store import database, lifecycle
from dispatcher.store.tokens import Principal
from sluice.objects import ClusterObject, QueueObject, ServiceClassObject, SimulatedSpec
from tests.integration.test_spine import job_doc

ADMIN = Principal("root", "admin")
NODE = {"cpu": 8000, "memory": 32 << 30}


class World:
    """Clusters with room for 8 cpus each (by default one, c0), one queue, the classes given (by default
    one, standard)."""

    def __init__(self, db_url: str, clusters: tuple[str, ...] = ("c0",),
                 classes: tuple[ServiceClassObject, ...] = (ServiceClassObject("standard", priority=500),)):
        self.db = database.connect(database.DatabaseSettings(url=db_url))
        self.sessions = sessionmaker(self.db.engine, expire_on_commit=False)
        self.now = datetime.now(UTC)
        with self.sessions.begin() as session:
            administering.apply(session, "test", [*classes, QueueObject("default"), *[
                ClusterObject(c, simulated=SimulatedSpec(1, NODE)) for c in clusters]])
            for c in clusters:
                cluster_store.record_capacity(session, c, {"allocatable": NODE, "free": NODE, "largestFreeNode": NODE},
                                              0, self.now)

    def submit(self, *cpus: str, service_class: str = "standard") -> list[int]:
        with self.sessions.begin() as session:
            return submitting.submit(session, ADMIN, submitting.parse(
                [json.dumps(job_doc(cpu=cpu, serviceClass=service_class)) for cpu in cpus]))

    def jobs(self) -> dict[int, tuple[str, str]]:
        """Each job's state and reason, read on another connection: what was committed."""
        with self.db.engine.connect() as conn:
            return {r[0]: (r[1], r[2]) for r in conn.execute(text("SELECT id, state, reason FROM jobs"))}

    def count(self, table: str) -> int:
        with self.db.engine.connect() as conn:
            return conn.scalar(text(f"SELECT count(*) FROM {table}"))


@pytest.fixture
def world(db_url):
    w = World(db_url)
    yield w
    w.db.close()


def test_a_cycle_commits_its_dispatches_and_its_reasons_together(world):
    first, second = world.submit("8", "1")  # the first takes the whole cluster
    result = run_cycle(world.sessions, SchedulerSettings(), world.now)
    assert result.dispatched == 1
    jobs = world.jobs()
    assert jobs[first] == ("DISPATCHED", "dispatched to c0")
    assert jobs[second][0] == "QUEUED" and jobs[second][1] != lifecycle.SUBMITTED  # its reason, in the same commit
    assert world.count("outbox") == 1


def test_a_cycle_that_dispatches_nothing_still_writes_its_reasons(world):
    [job] = world.submit("1")
    with world.sessions.begin() as session:  # the cluster is full
        cluster_store.record_capacity(session, "c0", {"allocatable": NODE, "free": {"cpu": 0, "memory": 0},
                                                      "largestFreeNode": {"cpu": 0, "memory": 0}}, 0, world.now)
    assert run_cycle(world.sessions, SchedulerSettings(), world.now).dispatched == 0
    state, reason = world.jobs()[job]
    assert state == "QUEUED" and reason != lifecycle.SUBMITTED


def test_a_failed_dispatch_writes_no_reason_and_nothing_else(world):
    first, second = world.submit("1", "1")
    with pytest.raises(psycopg.errors.ForeignKeyViolation):  # jobs.cluster: a cluster that does not exist
        with world.sessions.begin() as session:
            lifecycle.dispatch(session, [(first, "nowhere")], reasons={second: "a new reason"}, commit=True)
    assert world.jobs() == {first: ("QUEUED", lifecycle.SUBMITTED), second: ("QUEUED", lifecycle.SUBMITTED)}
    assert world.count("attempts") == 0 and world.count("outbox") == 0 and world.count("job_events") == 2


def test_a_cycle_in_a_transaction_it_did_not_begin_leaves_the_commit_to_its_owner(world):
    [job] = world.submit("1")
    with world.db.engine.connect() as conn:  # as a shadow cycle runs (test_parking: Story.plain)
        outer = conn.begin()
        shadow = sessionmaker(bind=conn, join_transaction_mode="create_savepoint", expire_on_commit=False)
        assert run_cycle(shadow, SchedulerSettings(), world.now).dispatched == 1
        outer.rollback()
    assert world.jobs()[job][0] == "QUEUED"
    assert world.count("attempts") == 0 and world.count("outbox") == 0


def test_a_job_that_still_cannot_start_keeps_its_reason_and_explain_tells_what_is_free_now(world):
    from dispatcher.scheduler.explaining import explain

    def free(cpu: int) -> None:
        room = {"cpu": cpu, "memory": NODE["memory"]}
        with world.sessions.begin() as session:
            cluster_store.record_capacity(session, "c0", {"allocatable": NODE, "free": room, "largestFreeNode": room},
                                          0, world.now)
    [job] = world.submit("6")
    free(2000)
    run_cycle(world.sessions, SchedulerSettings(), world.now)
    told = world.jobs()[job][1]
    assert told == "no cluster fits: c0: needs 6 cpu, 2 free"
    free(4000)  # still too little: the cycle leaves the job out, and its reason stands
    assert run_cycle(world.sessions, SchedulerSettings(), world.now).waiting == 1
    assert world.jobs()[job] == ("QUEUED", told)
    with world.sessions() as session:
        assert explain(session, job, world.now, unreachable_after_s=60).clusters == [("c0", "needs 6 cpu, 4 free")]
    free(8000)
    assert run_cycle(world.sessions, SchedulerSettings(), world.now).dispatched == 1


def test_the_nodes_a_dispatch_keeps_a_job_off_go_to_its_cluster_with_the_command(world):
    from dispatcher.api.agents import _command
    from dispatcher.policy.placing import Place
    from dispatcher.store import outbox

    first, second, third, fourth = world.submit("1", "1", "1", "1")
    with world.sessions.begin() as session:
        ahead = lifecycle.DispatchAhead(session, ["c0"])
        ahead.AHEAD = 2  # a part of two: the places sent while a plan is still made carry their nodes too
        ahead.placed([Place(first, "c0", ("node-3", "node-1")), Place(second, "c0")], {})
        assert ahead.sent == 2
        ahead.end()
        lifecycle.dispatch(session, [(third, "c0"), (fourth, "c0")], avoid_nodes={third: ("node-0",)})
    with world.sessions() as session:
        rows = {row.job_id: row for row in outbox.pending(session, "c0")}
        [many] = outbox.pending_many(session, [("c0", 0)])
    assert {j: r.avoid_nodes for j, r in rows.items()} == {first: ["node-3", "node-1"], second: [], third: ["node-0"],
                                                           fourth: []}
    assert [r.avoid_nodes for r in many] == [rows[j].avoid_nodes for j in sorted(rows)]
    assert list(_command(rows[first]).dispatch.avoid_nodes) == ["node-3", "node-1"]
    assert list(_command(rows[second]).dispatch.avoid_nodes) == []
