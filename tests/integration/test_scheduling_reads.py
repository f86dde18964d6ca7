"""The cycle's reads of what runs, in real Postgres, against their plain definitions over every active
attempt: usage summed per queue (store.cycle_reads.active_usage), the filtered active_attempts a cycle asks for
(planning.needed), and the heads as tuples (queue_heads) making the candidates candidate() makes, read
alone or with the cycle's first reads."""
from __future__ import annotations

import json
import random
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from dispatcher.policy.planning import ActiveNeeds, needed
from dispatcher.scheduler.mapping import active_from_rows, candidate, heads_from_rows
from dispatcher.scheduler.stored_policy import class_policies
from dispatcher.store import cycle_reads
from dispatcher.store.database import driver
from sluice.objects import ClusterObject, QueueObject, ServiceClassObject, SimulatedSpec
from sluice.quantity import add
from tests.integration.scenarios import store_with

CLASSES = (ServiceClassObject("critical", priority=1000, can_preempt=True),
           ServiceClassObject("standard", priority=500),
           ServiceClassObject("batch", priority=100, preemptible=True))
SHAPES = ({"cpu": 1000, "memory": 2048}, {"cpu": 2000, "memory": 4096}, {"cpu": 4000})


@pytest.fixture
def sessions(db_url):
    with store_with(db_url, [
            *CLASSES, QueueObject("org"), *(QueueObject(f"q{i}", parent="org") for i in range(4)),
            *(ClusterObject(f"c{i}", tier="onprem", site="dc", simulated=SimulatedSpec(1, {"cpu": 64000}))
              for i in range(3))]) as made:
        yield made


def _load(session, n: int, seed: int) -> None:
    """n jobs in every state that matters, of random queues, classes, shapes, clusters and maxRuntime."""
    rnd = random.Random(seed)
    priority = {c.name: c.priority for c in CLASSES}
    for _ in range(n):
        cls = rnd.choice(sorted(priority))
        state = rnd.choice(("QUEUED", "DISPATCHED", "RUNNING", "SUCCEEDED"))
        shape = rnd.choice(SHAPES)
        spec = {"spec": {"maxRuntime": "10m"} if rnd.random() < 0.3 else {}}
        placement = rnd.choice(({}, {"tiers": ["onprem"]}, {"clusterSelector": {"zone": "a"}, "sites": ["dc"]}))
        session.execute(text(
            """INSERT INTO jobs (queue, service_class, class_priority, priority, state, cluster, attempt, spec,
                                 requests, largest_pod, placement, dispatched_at, started_at, preempted_by)
               VALUES (:q, :c, :cp, :p, :s, :cl, :a, CAST(:spec AS jsonb), CAST(:r AS jsonb), CAST(:r AS jsonb),
                       CAST(:pl AS jsonb), now(), CASE WHEN :s = 'RUNNING' THEN now() END, :pb)"""),
            {"q": f"q{rnd.randrange(4)}", "c": cls, "cp": priority[cls], "p": rnd.randrange(3), "s": state,
             "cl": None if state == "QUEUED" else f"c{rnd.randrange(3)}", "a": 0 if state == "QUEUED" else 1,
             "spec": json.dumps(spec), "r": json.dumps(shape), "pl": json.dumps(placement),
             "pb": rnd.choice((None, None, 1))})


@pytest.mark.parametrize("seed", [1, 2])
def test_usage_and_filtered_active_attempts_are_their_plain_definitions(sessions, seed):
    with sessions.begin() as session:
        _load(session, 300, seed)
        every = cycle_reads.active_attempts(session)
        assert every and all(r.cluster for r in every)
        usage: dict[str, dict[str, int]] = {}
        for r in cycle_reads.active_usage(session):
            usage[r.queue] = add(usage.get(r.queue, {}), r.requests, r.jobs)
        plain: dict[str, dict[str, int]] = {}
        for r in every:
            plain[r.queue] = add(plain.get(r.queue, {}), r.requests)
        assert usage == plain

        classes = class_policies(session)
        active = active_from_rows(every, classes)
        assert any(a.ends_at for a in active) and any(a.ends_at is None for a in active)
        for needs in (ActiveNeeds(frozenset({"c0", "c2"}), 1000, frozenset({"batch"}), frozenset(), False),
                      ActiveNeeds(frozenset({"c0", "c1", "c2"}), 500, frozenset({"batch"}), frozenset({"q1"}), True),
                      ActiveNeeds(frozenset({"c1"}), None, frozenset({"batch"}), frozenset({"q0", "q3"}), False),
                      ActiveNeeds(frozenset({"c1"}), None, frozenset({"batch"}), frozenset(), True),
                      ActiveNeeds(frozenset(), 1000, frozenset({"batch"}), frozenset({"q0"}), True)):
            timed = {a.job_id for a in active_from_rows(cycle_reads.active_attempts(
                session, clusters=needs.clusters, timed=True), classes)} if needs.ends else set()
            assert timed == {a.job_id for a in active if needed(a, needs, victims=False)}
            victims = {a.job_id for a in active_from_rows(cycle_reads.active_attempts(
                session, clusters=needs.clusters, preemptible=needs.preemptible, below=needs.below,
                queues=needs.queues), classes)}
            assert timed | victims == {a.job_id for a in active if needed(a, needs)}
        on = cycle_reads.active_attempts(session, clusters=["c1"])
        assert sorted(r.id for r in on) == sorted(r.id for r in every if r.cluster == "c1")


def test_an_active_gang_is_read_with_its_pods_so_preemption_knows_the_room_each_frees(sessions):
    with sessions.begin() as session:
        for pods in ([[2, {"cpu": 4000}], [1, {"cpu": 1000}]], None):
            session.execute(text(
                """INSERT INTO jobs (queue, service_class, class_priority, priority, state, cluster, attempt, spec,
                                     requests, largest_pod, placement, dispatched_at, started_at, pods)
                   VALUES ('q0', 'batch', 100, 0, 'RUNNING', 'c0', 1, '{}'::jsonb, '{"cpu": 9000}'::jsonb,
                           '{"cpu": 4000}'::jsonb, '{}'::jsonb, now(), now(), CAST(:pods AS jsonb))"""),
                {"pods": None if pods is None else json.dumps(pods)})
        active = active_from_rows(cycle_reads.active_attempts(session), class_policies(session))
        assert sorted((a.pods for a in active), key=len) == [(), ((2, {"cpu": 4000}), (1, {"cpu": 1000}))]


def test_heads_as_tuples_make_the_candidates_candidate_makes(sessions):
    with sessions.begin() as session:
        _load(session, 200, 3)
        now = datetime.now(UTC)
        heads, current = heads_from_rows(cycle_reads.queue_heads(session, 5), now.timestamp(), {7: ("c1",)})
        rows = session.execute(text(
            """SELECT h.* FROM queues q CROSS JOIN LATERAL (
                   SELECT id, queue, service_class, class_priority, priority, requests, largest_pod, placement,
                          reason, created_at, preempted_by, spec->'spec'->>'maxRuntime' AS max_runtime
                   FROM jobs WHERE jobs.queue = q.name AND state = 'QUEUED'
                   ORDER BY class_priority DESC, priority DESC, id LIMIT 5) h""")).all()
        plain: dict[str, list] = {}
        for row in rows:
            plain.setdefault(row.queue, []).append(candidate(row, now, ("c1",) if row.id == 7 else ()))
        assert sum(map(len, heads.values())) == len(rows) > 0
        assert current == {row.id: row.reason for row in rows}
        for queue, jobs in plain.items():
            for got, want in zip(heads[queue], jobs, strict=True):
                assert got.waited_s == pytest.approx(want.waited_s, abs=1e-3)
                assert got == replace(want, waited_s=got.waited_s)


def test_heads_read_with_the_first_reads_are_queue_heads(sessions):
    """The heads a cycle reads in its first round trip (cycle_reads.first_reads) are the rows queue_heads
    reads later in the cycle, in the same order."""
    with sessions.begin() as session:
        _load(session, 200, 4)
        early = cycle_reads.first_reads(session, heads_per_queue=5, leader=None).heads
        assert [tuple(r) for r in early] == cycle_reads.queue_heads(session, 5) != []


PLAIN_IN_FLIGHT = """SELECT j.cluster, j.requests, j.largest_pod FROM outbox o
                     JOIN clusters c ON c.name = o.cluster
                     JOIN jobs j ON j.id = o.job_id AND j.attempt = o.attempt
                     WHERE o.kind = 'dispatch' AND o.id > c.applied_through
                       AND j.state IN ('DISPATCHED', 'RUNNING') AND j.cluster = o.cluster"""


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_in_flight_is_its_plain_definition(sessions, seed):
    """Dispatch commands above and below each cluster's watermark, of live, ended, moved and re-dispatched
    attempts, and cancel commands: the in-flight read's per-cluster index ranges and sums find what the plain join
    finds, summed."""
    rnd = random.Random(seed)
    with sessions.begin() as session:
        _load(session, 200, seed)
        rows = session.execute(text("SELECT id, attempt, cluster FROM jobs WHERE cluster IS NOT NULL")).all()
        for job_id, attempt, cluster in rows:
            for _ in range(rnd.randrange(3)):  # some twice, some as an older attempt or for another cluster
                session.execute(text(
                    "INSERT INTO outbox (cluster, kind, job_id, attempt) VALUES (:c, :k, :j, :a)"),
                    {"c": rnd.choice((cluster, cluster, f"c{rnd.randrange(3)}")),
                     "k": rnd.choice(("dispatch",) * 3 + ("cancel",)), "j": job_id,
                     "a": rnd.choice((attempt, attempt, attempt - 1))})
        top = session.scalar(text("SELECT max(id) FROM outbox"))
        for c in range(3):
            session.execute(text("UPDATE clusters SET applied_through = :w WHERE name = :c"),
                            {"w": rnd.randrange(top + 1), "c": f"c{c}"})
        plain: dict[str, dict[str, int]] = {}
        rows_in_flight = session.execute(text(PLAIN_IN_FLIGHT)).all()
        for r in rows_in_flight:
            plain[r.cluster] = add(plain.get(r.cluster, {}), r.requests)
        assert cycle_reads.capacity_reads(session).in_flight == plain and 0 < len(rows_in_flight) < len(rows)


def _scans(plan: dict) -> set[tuple[str, str, str | None]]:
    """(node type, relation, index) of every scan in an EXPLAIN (FORMAT JSON) plan."""
    found = set()
    if "Relation Name" in plan:
        found.add((plan["Node Type"], plan["Relation Name"], plan.get("Index Name")))
    if "Index Name" in plan and "Relation Name" not in plan:  # a bitmap index scan names its index only
        found.add((plan["Node Type"], "", plan["Index Name"]))
    for child in plan.get("Plans", ()):
        found |= _scans(child)
    return found


def _plan_scans(session, statement: str, params: dict | None = None) -> set:
    return _scans(driver(session).execute("EXPLAIN (FORMAT JSON) " + statement, params or {}).fetchone()[0][0]["Plan"])


def test_the_cycle_reads_keep_their_indexes_whatever_the_statistics(sessions):
    """A deep queue beside its empty parent and siblings, statistics taken while everything was queued (as after
    a bulk submit), then a third of it dispatched to two clusters, one with its watermark far behind and one
    that never had a command. The heads are read by the per-queue index (the parent's empty range costs
    nothing), and what is in flight by each cluster's range of the outbox and each job by its key, before
    the statistics catch up and after: these reads run every cycle, and plans chosen from the statistics
    once cost them tens of ms (the whole backlog per parent queue, the outbox from the lowest watermark)
    and 0.9 s (the index of every active job per in-flight command)."""
    with sessions.begin() as session:
        session.execute(text(
            """INSERT INTO jobs (queue, service_class, class_priority, state, spec, requests, largest_pod)
               SELECT 'q0', 'standard', 500, 'QUEUED', '{}', '{"cpu": 1000}', '{"cpu": 1000}'
               FROM generate_series(1, 30000)"""))
    with sessions.begin() as session:
        session.execute(text("ANALYZE jobs"))
        session.execute(text("ANALYZE outbox"))
    with sessions.begin() as session:
        session.execute(text(
            """UPDATE jobs SET state = 'DISPATCHED', attempt = 1, dispatched_at = now(),
                              cluster = CASE WHEN id % 2 = 0 THEN 'c0' ELSE 'c1' END
               WHERE id IN (SELECT id FROM jobs ORDER BY id LIMIT 10000)"""))
        session.execute(text("""INSERT INTO outbox (cluster, kind, job_id, attempt)
                                SELECT cluster, 'dispatch', id, 1 FROM jobs WHERE cluster IS NOT NULL ORDER BY id"""))
        session.execute(text(
            "UPDATE clusters SET applied_through = (SELECT max(id) - 50 FROM outbox) WHERE name = 'c0'"))
        session.execute(text("UPDATE clusters SET applied_through = 100 WHERE name = 'c1'"))
    for fresh in (False, True):
        with sessions.begin() as session:
            if fresh:
                session.execute(text("ANALYZE jobs"))
                session.execute(text("ANALYZE outbox"))
            heads = _plan_scans(session, *cycle_reads._heads_query(64))
            assert {index for _, table, index in heads if table == "jobs"} == {"ix_jobs_queue_head"}, heads
            in_flight = _plan_scans(session, cycle_reads._IN_FLIGHT)
            assert {index for _, table, index in in_flight if table in ("jobs", "outbox", "") and index} == {
                "jobs_pkey", "ix_outbox_cluster_id"}, in_flight
            assert not [s for s in in_flight if s[0] == "Seq Scan" and s[1] in ("jobs", "outbox")], in_flight
