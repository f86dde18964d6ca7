"""`sluice schedule` end to end: each command a subprocess against a real dispatcher over gRPC (real Postgres),
as a user and as an admin; bad input is one clear line and changes nothing."""
from __future__ import annotations

import json

import pytest

from dispatcher.store import tokens
from tests.integration.test_admin import dispatcher  # noqa: F401  (the fixture)
from tests.integration.test_cli import base_env, ok, one_error_line, run_sluice

SCHEDULE = """apiVersion: sluice.io/v1
kind: Schedule
metadata: {name: nightly}
spec:
  schedule: "0 3 * * *"
  timeZone: Europe/Berlin
  concurrencyPolicy: Forbid
  startingDeadline: 10m
  jobTemplate:
    metadata: {labels: {team: vision}}
    spec:
      queue: default
      podSets:
      - name: main
        count: 1
        template:
          spec: {containers: [{name: m, image: x, resources: {requests: {cpu: "1"}}}]}
"""


@pytest.fixture
def envs(dispatcher, tmp_path):  # noqa: F811
    with dispatcher.sessions.begin() as session:
        user = tokens.create(session, "user", "alice")
        other = tokens.create(session, "user", "bob")
    common = {**base_env(tmp_path), "SLUICE_ADDRESS": dispatcher.address, "SLUICE_INSECURE": "1"}
    return {"alice": {**common, "SLUICE_TOKEN": user}, "bob": {**common, "SLUICE_TOKEN": other},
            "root": {**common, "SLUICE_TOKEN": dispatcher.admin_token}}


def schedule(env, *args, input=None):
    return run_sluice(env, "schedule", *args, input=input)


def test_create_list_get_suspend_resume_trigger_delete(envs, tmp_path):
    alice, bob, root = envs["alice"], envs["bob"], envs["root"]
    path = tmp_path / "schedule.yaml"
    path.write_text(SCHEDULE)
    shown = ok(schedule(alice, "create", "-f", str(path)))
    assert "name:              nightly" in shown and "owner:             alice" in shown
    listed = ok(schedule(alice, "list")).splitlines()
    assert listed[0].split() == ["NAME", "SCHEDULE", "TIMEZONE", "SUSPENDED", "LAST", "SCHEDULED", "NEXT", "DUE",
                                 "ACTIVE"]
    assert listed[1].split()[:6] == ["nightly", "0", "3", "*", "*", "*"]
    [info] = json.loads(ok(schedule(alice, "list", "-o", "json")))
    assert (info["timeZone"], info["suspended"], info["activeJobs"], info["lastScheduledAt"]) == \
        ("Europe/Berlin", False, [], None)
    assert info["nextDueAt"].endswith(":00:00.000Z")
    assert ok(schedule(bob, "list", "-o", "json")) == "[]\n"  # others see none of alice's
    assert json.loads(ok(schedule(root, "list", "-o", "json")))[0]["name"] == "nightly"  # admins every one
    assert one_error_line(schedule(bob, "get", "nightly")) == \
        "error: schedule get nightly: schedule 'nightly' not found"

    assert json.loads(ok(schedule(alice, "suspend", "nightly", "-o", "json")))["suspended"] is True
    assert json.loads(ok(schedule(alice, "resume", "nightly", "-o", "json")))["suspended"] is False

    job_id = int(ok(schedule(alice, "trigger", "nightly")))
    got = json.loads(ok(schedule(alice, "get", "nightly", "-o", "json")))
    assert got["activeJobs"] == [job_id] and [r["id"] for r in got["runs"]] == [job_id]
    assert got["status"] == f"triggered by alice: started job {job_id}"
    job = json.loads(ok(run_sluice(alice, "get", str(job_id), "-o", "json")))
    assert job["labels"] == {"team": "vision", "sluice.io/schedule": "nightly"} and job["submittedBy"] == "alice"
    assert job["name"].startswith("nightly-")
    # Forbid: a second trigger while the first is not final is refused, in one line
    line = one_error_line(schedule(alice, "trigger", "nightly"))
    assert line == f"error: schedule trigger nightly: schedule 'nightly': not started: job {job_id} of this " \
                   "schedule is still QUEUED (concurrencyPolicy Forbid)", line
    table = ok(schedule(alice, "get", "nightly"))
    assert "runs:\n  ID" in table and f"\n  {job_id} " in table

    assert one_error_line(schedule(alice, "create", "-f", str(path))) == \
        f"error: schedule create {path}: schedule 'nightly' already exists (delete it first to change it)"
    assert json.loads(ok(schedule(root, "delete", "nightly", "-o", "json")))["name"] == "nightly"
    assert ok(schedule(alice, "list", "-o", "json")) == "[]\n"
    assert json.loads(ok(run_sluice(alice, "get", str(job_id), "-o", "json")))["id"] == job_id  # the job stays


@pytest.mark.parametrize("change, words", [
    (('"0 3 * * *"', '"0 3 * *"'), "spec.schedule: invalid cron expression '0 3 * *': expected 5 fields"),
    (('"0 3 * * *"', '"0 24 * * *"'), "spec.schedule: invalid cron expression '0 24 * * *': Bad hour"),
    (("Europe/Berlin", "Europe/Atlantis"), "spec.timeZone: unknown time zone 'Europe/Atlantis'"),
    (("concurrencyPolicy: Forbid", "concurrencyPolicy: Never"),
     "spec.concurrencyPolicy: must be one of Allow, Forbid, Replace, got string 'Never'"),
    (("startingDeadline: 10m", "startingDeadline: soon"), "spec.startingDeadline: 'soon' is not a duration"),
    (("count: 1", "count: -1"), "spec.jobTemplate.spec.podSets[0].count: "),
])
def test_bad_input_is_one_line_naming_the_field_and_changes_nothing(envs, tmp_path, change, words):
    path = tmp_path / "bad.yaml"
    path.write_text(SCHEDULE.replace(*change))
    line = one_error_line(schedule(envs["alice"], "create", "-f", str(path)))
    assert line.startswith(f"error: schedule create {path}: {words}"), line
    assert ok(schedule(envs["root"], "list", "-o", "json")) == "[]\n"


def test_the_server_checks_the_template_as_a_submit(envs):
    line = one_error_line(schedule(envs["alice"], "create", "-f", "-",
                                   input=SCHEDULE.replace("queue: default", "queue: nowhere")))
    assert line == "error: schedule create -: schedule: spec.jobTemplate: spec.queue: queue 'nowhere' not found", line
    assert ok(schedule(envs["root"], "list", "-o", "json")) == "[]\n"
