"""Schedules against a real database, with an injected `now`: one job per due time even when two dispatchers
fire at once, state that survives a restart, catch-up, concurrency policies and a template gone bad."""
from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from dispatcher.errors import Conflict, InvalidRequest, NotFound, PermissionDenied
from dispatcher.services import administering, recurring
from dispatcher.store import database, job_reads
from dispatcher.store.tokens import Principal
from sluice.objects import default_objects, load_objects

ALICE, BOB, ROOT = Principal("alice", "user"), Principal("bob", "user"), Principal("root", "admin")
TEAM = "apiVersion: sluice.io/v1\nkind: Queue\nmetadata: {name: team}\nspec: {members: [%s]}\n"


def schedule_doc(name="nightly", schedule="0 3 * * *", queue="team", **spec) -> str:
    return json.dumps({"apiVersion": "sluice.io/v1", "kind": "Schedule", "metadata": {"name": name},
                       "spec": {"schedule": schedule, **spec, "jobTemplate": {
                           "metadata": {"labels": {"team": "vision"}},
                           "spec": {"queue": queue, "podSets": [{"name": "main", "count": 1, "template": {"spec": {
                               "containers": [{"name": "main", "image": "x",
                                               "resources": {"requests": {"cpu": "1"}}}]}}}]}}}})


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.fixture
def db(db_url):
    connected = database.connect(database.DatabaseSettings(url=db_url))
    db = SimpleNamespace(sessions=connected.sessions(), close=connected.close)
    with db.sessions.begin() as session:
        administering.apply(session, "root", [*default_objects(), *load_objects(TEAM % "alice")])
    yield db
    db.close()


def create(db, doc: str, now: datetime, who=ALICE):
    with db.sessions.begin() as session:
        return recurring.create(session, who, doc, now)


def view(db, name="nightly", who=ALICE, now=None):
    with db.sessions() as session:
        return recurring.get(session, who, name, now or utc(2024, 1, 1))


def jobs_of(db, name="nightly"):
    with db.sessions() as session:
        return [j for j in job_reads.list_jobs(session, limit=1000) if j.labels.get("sluice.io/schedule") == name]


def test_a_due_time_starts_one_job_as_the_owner_and_restarts_reread_the_state(db, db_url):
    created = create(db, schedule_doc(startingDeadline="10m"), utc(2024, 1, 1, 12))
    assert created.next_due_at == utc(2024, 1, 2, 3) and created.runs == () and created.status == "created"
    assert recurring.fire_due(db.sessions, utc(2024, 1, 2, 2, 59)) == 0
    assert recurring.fire_due(db.sessions, utc(2024, 1, 2, 3, 0, 1)) == 1
    assert recurring.fire_due(db.sessions, utc(2024, 1, 2, 3, 0, 2)) == 0  # handled: not again
    [job] = jobs_of(db)
    assert job.name == f"nightly-{int(utc(2024, 1, 2, 3).timestamp()) // 60}"
    assert job.labels == {"team": "vision", "sluice.io/schedule": "nightly"} and job.submitted_by == "alice"
    assert job.queue == "team" and job.state == "QUEUED"
    seen = view(db, now=utc(2024, 1, 2, 3, 1))
    assert seen.last_scheduled_at == utc(2024, 1, 2, 3) and seen.next_due_at == utc(2024, 1, 3, 3)
    assert [r.job_id for r in seen.runs] == [job.id] and seen.active_job_ids == (job.id,)
    assert seen.status == f"due 2024-01-02T03:00+00:00: started job {job.id}"
    db.close()

    # A restarted dispatcher (a new connection) reads where it was: down for three due times, it starts one
    connected = database.connect(database.DatabaseSettings(url=db_url))
    again = SimpleNamespace(sessions=connected.sessions())
    try:
        assert recurring.fire_due(again.sessions, utc(2024, 1, 5, 3, 5)) == 1
        assert len(jobs_of(again)) == 2
        status = view(again).status
        assert status.startswith("missed due times 2024-01-03T03:00+00:00 to 2024-01-04T03:00+00:00 skipped"), status
        # down past the deadline: none starts, and get says why
        assert recurring.fire_due(again.sessions, utc(2024, 1, 7, 4)) == 0
        assert "due 2024-01-07T03:00+00:00: skipped: 3600s late, past startingDeadline (600s)" in view(again).status
        assert len(jobs_of(again)) == 2
    finally:
        connected.close()


def test_two_dispatchers_racing_on_one_due_time_start_one_job(db):
    create(db, schedule_doc(schedule="* * * * *"), utc(2024, 1, 1, 12))
    now = utc(2024, 1, 1, 12, 1, 0, 500)
    # The first fires and holds its transaction open; the second decides the same and blocks on the update
    first = db.sessions()
    first.begin()
    assert recurring.fire(first, "nightly", now) == 1
    outcome = []

    def second():
        try:
            with db.sessions.begin() as session:
                outcome.append(recurring.fire(session, "nightly", now))
        except Conflict as exc:
            outcome.append(exc)

    racer = threading.Thread(target=second)
    racer.start()
    time.sleep(0.5)
    assert outcome == []  # blocked on the row the first updated
    first.commit()
    first.close()
    racer.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], Conflict), outcome
    assert len(jobs_of(db)) == 1

    # and many passes at once, on every due time of an hour: one job each
    later = [utc(2024, 1, 1, 12, 1, 1) + timedelta(minutes=m) for m in range(1, 61)]
    errors = []

    def replica():
        for t in later:
            try:
                recurring.fire_due(db.sessions, t)
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

    threads = [threading.Thread(target=replica) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    names = [j.name for j in jobs_of(db)]
    assert len(names) == len(set(names)) == 61


def test_concurrency_forbid_and_replace(db):
    create(db, schedule_doc("forbid", "*/5 * * * *", concurrencyPolicy="Forbid"), utc(2024, 1, 1))
    create(db, schedule_doc("replace", "*/5 * * * *", concurrencyPolicy="Replace"), utc(2024, 1, 1))
    assert recurring.fire_due(db.sessions, utc(2024, 1, 1, 0, 5)) == 2
    assert recurring.fire_due(db.sessions, utc(2024, 1, 1, 0, 10)) == 1  # forbid skips: its first is QUEUED
    [forbidden] = jobs_of(db, "forbid")
    assert f"skipped: job {forbidden.id} of this schedule is still QUEUED (concurrencyPolicy Forbid)" in \
        view(db, "forbid").status
    first, second = jobs_of(db, "replace")
    assert (first.state, second.state) == ("CANCELLED", "QUEUED")
    assert f"replacing job {first.id}" in view(db, "replace").status
    # trigger: by hand, the same policies
    with db.sessions.begin() as session, pytest.raises(Conflict, match="concurrencyPolicy Forbid"):
        recurring.trigger(session, ALICE, "forbid", utc(2024, 1, 1, 0, 11))
    with db.sessions.begin() as session:
        done = recurring.trigger(session, ALICE, "replace", utc(2024, 1, 1, 0, 11))
    assert done.cancelled == (second.id,) and done.schedule.active_job_ids == (done.job_id,)
    assert done.schedule.last_scheduled_at == utc(2024, 1, 1, 0, 10)  # the due times are left as they were


def test_suspended_starts_nothing_and_resume_catches_up_within_the_deadline(db):
    create(db, schedule_doc(schedule="0 * * * *", startingDeadline="5m", suspend=True), utc(2024, 1, 1))
    assert recurring.fire_due(db.sessions, utc(2024, 1, 1, 3, 2)) == 0
    with db.sessions.begin() as session:
        assert recurring.resume(session, ALICE, "nightly", utc(2024, 1, 1, 3, 2)).suspended is False
    assert recurring.fire_due(db.sessions, utc(2024, 1, 1, 3, 2)) == 1  # 03:00 only: 01:00 and 02:00 skipped
    assert len(jobs_of(db)) == 1 and "missed due times" in view(db).status
    with db.sessions.begin() as session:
        assert recurring.suspend(session, ALICE, "nightly", utc(2024, 1, 1, 3, 3)).suspended
    assert recurring.fire_due(db.sessions, utc(2024, 1, 1, 4, 0, 1)) == 0


def test_a_template_gone_bad_is_recorded_and_the_other_schedules_go_on(db):
    create(db, schedule_doc("mine"), utc(2024, 1, 1))
    create(db, schedule_doc("other", queue="default"), utc(2024, 1, 1))
    with db.sessions.begin() as session:  # alice is no longer a member of team
        administering.apply(session, "root", load_objects(TEAM % "bob"))
    assert recurring.fire_due(db.sessions, utc(2024, 1, 1, 3, 0, 1)) == 1
    mine = view(db, "mine")
    assert mine.last_error == "due 2024-01-01T03:00+00:00: not started: job: alice may not submit to queue 'team'"
    assert mine.status == mine.last_error and mine.last_scheduled_at == utc(2024, 1, 1, 3)
    assert len(jobs_of(db, "other")) == 1 and jobs_of(db, "mine") == []


def test_permissions_and_bad_input_change_nothing(db):
    create(db, schedule_doc(), utc(2024, 1, 1))
    with db.sessions() as session:
        assert [s.name for s in recurring.list_schedules(session, BOB, utc(2024, 1, 1))] == []
        assert [s.name for s in recurring.list_schedules(session, ROOT, utc(2024, 1, 1))] == ["nightly"]
        with pytest.raises(NotFound, match="schedule 'nightly' not found"):
            recurring.get(session, BOB, "nightly", utc(2024, 1, 1))
    with db.sessions.begin() as session, pytest.raises(NotFound):
        recurring.delete(session, BOB, "nightly", utc(2024, 1, 1))
    with pytest.raises(Conflict, match="already exists"):
        create(db, schedule_doc(), utc(2024, 1, 1))
    with pytest.raises(PermissionDenied, match="schedule: spec.jobTemplate: bob may not submit to queue 'team'"):
        create(db, schedule_doc("bobs"), utc(2024, 1, 1), who=BOB)
    with pytest.raises(NotFound, match="schedule: spec.jobTemplate: spec.queue: queue 'gone' not found"):
        create(db, schedule_doc("gone", queue="gone"), utc(2024, 1, 1))
    with pytest.raises(InvalidRequest, match="schedule: spec.schedule: invalid cron expression"):
        create(db, schedule_doc("cron", schedule="0 25 * * *"), utc(2024, 1, 1))
    with db.sessions() as session:
        assert [s.name for s in recurring.list_schedules(session, ROOT, utc(2024, 1, 1))] == ["nightly"]
    with db.sessions.begin() as session:
        assert recurring.delete(session, ROOT, "nightly", utc(2024, 1, 1)).name == "nightly"
    with db.sessions() as session:
        assert recurring.list_schedules(session, ROOT, utc(2024, 1, 1)) == []


def test_the_example_schedule_fires(db):
    from pathlib import Path

    import yaml
    document = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "schedule.yaml").read_text())
    create(db, json.dumps(document), utc(2024, 6, 1, 12, 0, 30))
    assert recurring.fire_due(db.sessions, utc(2024, 6, 1, 12, 2, 1)) == 1
    [job] = jobs_of(db, "every-two-minutes")
    assert job.queue == "default" and job.labels["project"] == "imagenet"
