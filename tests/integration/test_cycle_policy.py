"""Policy through the real cycle on Postgres (run_cycle): a job holding a reservation still preempts, and
decayed usage history (a Queue tree's usageHalfLife) is read in one query and orders the queues."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from dispatcher.policy.decay import decayed_run
from dispatcher.policy.plans import Hold
from dispatcher.scheduler.postgres_cycle import run_cycle
from dispatcher.scheduler.settings import SchedulerSettings
from dispatcher.services import submitting
from dispatcher.store import clusters as cluster_store
from dispatcher.store import cycle_reads
from dispatcher.store.tokens import Principal
from sluice.objects import ClusterObject, QueueObject, ServiceClassObject, SimulatedSpec
from tests.integration.scenarios import store_with
from tests.integration.test_spine import job_doc

ADMIN = Principal("root", "admin")
NODE = {"cpu": 8000, "memory": 32 << 30}
H = 3600.0
CLASSES = (ServiceClassObject("critical", priority=1000, can_preempt=True, reservation_after_s=60.0),
           ServiceClassObject("standard", priority=500),
           ServiceClassObject("batch", priority=100, preemptible=True))


def _world(db_url: str, queues: list[QueueObject]):
    return store_with(db_url, [*CLASSES, *queues, ClusterObject("c0", simulated=SimulatedSpec(1, NODE))])


def _ready(sessions, now: datetime) -> None:
    with sessions.begin() as session:
        cluster_store.record_capacity(session, "c0", {"allocatable": NODE, "free": NODE, "largestFreeNode": NODE},
                                      0, now)


def _submit(sessions, queue: str, cpu: str, count: int = 1, service_class: str = "standard") -> int:
    with sessions.begin() as session:
        [job] = submitting.submit(session, ADMIN, submitting.parse(
            [json.dumps(job_doc(cpu=cpu, count=count, queue=queue, serviceClass=service_class))]))
    return job


def _states(sessions) -> dict[int, str]:
    with sessions.begin() as session:
        return dict(session.execute(text("SELECT id, state FROM jobs")).all())


def test_a_job_holding_a_reservation_preempts_through_the_real_cycle(db_url):
    now = datetime.now(UTC)
    with _world(db_url, [QueueObject("default")]) as sessions:
        _ready(sessions, now)
        batch = [_submit(sessions, "default", "2", service_class="batch") for _ in range(3)]
        assert run_cycle(sessions, SchedulerSettings(), now).dispatched == 3  # 6 of 8 cpu taken, 2 free
        critical = _submit(sessions, "default", "2", count=4, service_class="critical")
        # It reserved c0 in an earlier cycle, when nothing could be evicted.
        reservation = Hold(critical, "c0", {"cpu": 8000}, "reservation", now.timestamp() - 300)
        result = run_cycle(sessions, SchedulerSettings(), now, holds={critical: reservation})
        assert result.preempted == 3
        assert result.holds[critical].kind == "preemption" and sorted(result.holds[critical].victims) == batch
        assert _states(sessions)[critical] == "QUEUED"


def _ran(session, queue: str, cpu: int, start: datetime, end: datetime | None) -> None:
    """A job of `queue` whose one attempt ran from `start` to `end` (None: still running) on c0."""
    state = "RUNNING" if end is None else "SUCCEEDED"
    requests = json.dumps({"cpu": cpu})
    job_id = session.execute(text(
        """INSERT INTO jobs (queue, service_class, class_priority, priority, state, cluster, attempt, spec, requests,
                             largest_pod, placement, dispatched_at, started_at, finished_at)
           VALUES (:q, 'standard', 500, 0, :s, 'c0', 1, '{}'::jsonb, CAST(:r AS jsonb), CAST(:r AS jsonb), '{}'::jsonb,
                   :start, :start, :end) RETURNING id"""),
        {"q": queue, "s": state, "r": requests, "start": start, "end": end}).scalar_one()
    session.execute(text("""INSERT INTO attempts (job_id, attempt, cluster, state, started_at, finished_at)
                            VALUES (:j, 1, 'c0', :s, :start, :end)"""),
                    {"j": job_id, "s": state, "start": start, "end": end})


HISTORY_QUEUES = [QueueObject("org", usage_half_life_s=H), QueueObject("busy", parent="org"),
                  QueueObject("idle", parent="org"), QueueObject("other")]


def test_the_decayed_history_read_is_the_closed_form_summed_over_attempts(db_url):
    now = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    runs = [("busy", 4000, now - timedelta(hours=5), now - timedelta(hours=1)),
            ("busy", 2000, now - timedelta(minutes=30), None),
            ("busy", 1000, now - timedelta(hours=30), now - timedelta(hours=11)),  # ended over 10 H ago: left out
            ("idle", 3000, now - timedelta(hours=2), now - timedelta(minutes=90)),
            ("other", 8000, now - timedelta(hours=2), now - timedelta(hours=1))]  # no half-life: not read
    with _world(db_url, HISTORY_QUEUES) as sessions, sessions.begin() as session:
        for run in runs:
            _ran(session, *run)
        history = cycle_reads.decayed_history(session, now, {"org": H, "busy": H, "idle": H})
    expected: dict[str, float] = {}
    for queue, cpu, start, end in runs[:2] + runs[3:4]:
        seen = decayed_run({"cpu": cpu}, start.timestamp(), end.timestamp() if end else None,
                           now=now.timestamp(), half_life_s=H)
        expected[queue] = expected.get(queue, 0.0) + seen["cpu"]
    assert set(history) == {"busy", "idle"}
    for queue, amount in expected.items():
        assert history[queue]["cpu"] == pytest.approx(amount, rel=1e-9)


def test_the_idle_queues_head_goes_before_the_head_of_a_queue_with_a_long_history(db_url):
    now = datetime.now(UTC)
    with _world(db_url, HISTORY_QUEUES) as sessions:
        _ready(sessions, now)
        with sessions.begin() as session:  # busy kept c0 full for most of the day, until 10 minutes ago
            _ran(session, "busy", 8000, now - timedelta(hours=8), now - timedelta(minutes=10))
        first = _submit(sessions, "busy", "8")  # older: it would go first on equal shares
        second = _submit(sessions, "idle", "8")
        assert run_cycle(sessions, SchedulerSettings(), now).dispatched == 1
        states = _states(sessions)
        assert states[second] == "DISPATCHED" and states[first] == "QUEUED"
