"""The pure schedule policy with an injected clock: due times, time zones and DST, catch-up after downtime,
Forbid/Replace/Allow, suspend; and the Schedule document's checks."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dispatcher.policy import schedules as policy
from dispatcher.policy.schedules import Run
from sluice._validate import SpecError
from sluice.schedules import SCHEDULE_LABEL, schedule_from_document

TEMPLATE = {"metadata": {"labels": {"team": "vision"}},
            "spec": {"queue": "default", "podSets": [{"name": "main", "count": 1, "template": {"spec": {
                "containers": [{"name": "main", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}}}]}}


def doc(schedule="0 3 * * *", **spec):
    return {"apiVersion": "sluice.io/v1", "kind": "Schedule", "metadata": {"name": "nightly"},
            "spec": {"schedule": schedule, "jobTemplate": TEMPLATE, **spec}}


def sched(schedule="0 3 * * *", **spec):
    return schedule_from_document(doc(schedule, **spec))


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_due_times_in_a_time_zone():
    s = sched("0 3 * * *", timeZone="Europe/Berlin")
    assert policy.due_after(s, utc(2024, 1, 10)) == utc(2024, 1, 10, 2)  # 03:00 CET
    assert policy.due_after(s, utc(2024, 7, 10)) == utc(2024, 7, 10, 1)  # 03:00 CEST
    assert policy.due_after(s, utc(2024, 7, 10, 1)) == utc(2024, 7, 11, 1)  # strictly after
    assert policy.due_after(sched("@hourly"), utc(2024, 1, 1, 5, 1)) == utc(2024, 1, 1, 6)
    assert policy.local(s, utc(2024, 7, 10, 1)) == "2024-07-10T03:00+02:00"
    assert policy.run_name("nightly", utc(2024, 7, 10, 1)) == f"nightly-{int(utc(2024, 7, 10, 1).timestamp()) // 60}"


def test_a_due_time_the_clock_skips_is_due_just_after_the_change():
    s = sched("30 2 * * *", timeZone="Europe/Berlin")  # 2024-03-31: 02:00 CET becomes 03:00 CEST
    times, t = [], utc(2024, 3, 29)
    for _ in range(4):
        t = policy.due_after(s, t)
        times.append(policy.local(s, t))
    assert times == ["2024-03-29T02:30+01:00", "2024-03-30T02:30+01:00", "2024-03-31T03:00+02:00",
                     "2024-04-01T02:30+02:00"]
    # and the firing agrees: one run that night, at 03:00 local
    firing = policy.fire(s, utc(2024, 3, 30, 1, 30), utc(2024, 3, 31, 1, 0, 5), [])
    assert (firing.due, firing.start, firing.next_due) == (utc(2024, 3, 31, 1), True, utc(2024, 4, 1, 0, 30))


def test_a_due_time_that_happens_twice_is_due_once():
    s = sched("30 2 * * *", timeZone="Europe/Berlin")  # 2024-10-27: 03:00 CEST becomes 02:00 CET
    first = policy.due_after(s, utc(2024, 10, 26, 12))
    assert first == utc(2024, 10, 27, 0, 30)  # the first 02:30 (CEST)
    assert policy.due_after(s, first) == utc(2024, 10, 28, 1, 30)  # not the second 02:30 (CET)
    # at the second 02:30, nothing is due: it was handled at the first
    assert policy.fire(s, first, utc(2024, 10, 27, 1, 31), []).due is None
    # An expression by the hour runs by real time: both 02:00s of the 25-hour day
    hourly = sched("0 * * * *", timeZone="Europe/Berlin")
    t, seen = utc(2024, 10, 26, 23, 30), []
    for _ in range(3):
        t = policy.due_after(hourly, t)
        seen.append(policy.local(hourly, t))
    assert seen == ["2024-10-27T02:00+02:00", "2024-10-27T02:00+01:00", "2024-10-27T03:00+01:00"]


def test_nothing_due_before_the_first_due_time():
    s = sched("0 3 * * *")
    firing = policy.fire(s, utc(2024, 1, 1, 4), utc(2024, 1, 2, 2, 59), [])
    assert (firing.due, firing.start, firing.next_due) == (None, False, utc(2024, 1, 2, 3))


def test_on_time_starts_one_run():
    s = sched("*/5 * * * *")
    firing = policy.fire(s, utc(2024, 1, 1, 10, 0), utc(2024, 1, 1, 10, 5, 0, 300), [])
    assert (firing.due, firing.start, firing.cancel) == (utc(2024, 1, 1, 10, 5), True, ())
    assert firing.status == "due 2024-01-01T10:05+00:00: started"
    assert firing.next_due == utc(2024, 1, 1, 10, 10)


def test_after_downtime_only_the_latest_missed_due_time_starts_within_the_deadline():
    s = sched("0 * * * *", startingDeadline="10m")
    since = utc(2024, 1, 1, 0)  # down from 00:30 to 05:03: 01:00 to 05:00 were missed
    firing = policy.fire(s, since, utc(2024, 1, 1, 5, 3), [])
    assert (firing.due, firing.start) == (utc(2024, 1, 1, 5), True)
    assert "missed due times 2024-01-01T01:00+00:00 to 2024-01-01T04:00+00:00 skipped" in firing.status
    # Past the deadline: none starts, every one is handled (the next firing looks after 05:00)
    late = policy.fire(s, since, utc(2024, 1, 1, 5, 11), [])
    assert (late.due, late.start, late.next_due) == (utc(2024, 1, 1, 5), False, utc(2024, 1, 1, 6))
    assert "due 2024-01-01T05:00+00:00: skipped: 660s late, past startingDeadline (600s)" in late.status
    # Without a deadline the latest starts however late (as a Kubernetes CronJob does)
    assert policy.fire(sched("0 * * * *"), since, utc(2024, 1, 1, 5, 59), []).start


def test_a_long_downtime_is_cheap_and_still_one_run():
    s = sched("* * * * *", startingDeadline="2m")
    firing = policy.fire(s, utc(2023, 1, 1), utc(2024, 1, 1, 0, 0, 30), [])
    assert (firing.due, firing.start) == (utc(2024, 1, 1), True)


def test_concurrency_policies():
    since, now = utc(2024, 1, 1, 2, 59), utc(2024, 1, 1, 3, 0, 1)
    runs = [Run(1, "SUCCEEDED"), Run(2, "RUNNING"), Run(3, "QUEUED")]
    allow = policy.fire(sched(), since, now, runs)
    assert (allow.start, allow.cancel) == (True, ())
    forbid = policy.fire(sched(concurrencyPolicy="Forbid"), since, now, runs)
    assert (forbid.due, forbid.start) == (utc(2024, 1, 1, 3), False)
    assert "skipped: job 2 of this schedule is still RUNNING; job 3 of this schedule is still QUEUED " \
           "(concurrencyPolicy Forbid)" in forbid.status
    assert policy.fire(sched(concurrencyPolicy="Forbid"), since, now, runs[:1]).start
    replace = policy.fire(sched(concurrencyPolicy="Replace"), since, now, runs)
    assert (replace.start, replace.cancel) == (True, (2, 3))
    assert "replacing job 2, 3" in replace.status
    # by hand, under the same policies
    assert policy.trigger(sched(concurrencyPolicy="Forbid"), runs).refused.endswith("(concurrencyPolicy Forbid)")
    assert policy.trigger(sched(concurrencyPolicy="Replace"), runs) == policy.Trigger(None, (2, 3))
    assert policy.trigger(sched(), runs) == policy.Trigger(None, ())


def test_suspended_starts_nothing_and_resume_follows_the_deadline_rule():
    s = sched("0 * * * *", startingDeadline="5m")
    since = utc(2024, 1, 1, 0)
    paused = policy.fire(s, since, utc(2024, 1, 1, 3, 2), [], suspended=True)
    assert (paused.due, paused.start, paused.status) == (None, False, "suspended")
    # resumed at 03:02: the 03:00 run is within the deadline, 01:00 and 02:00 are not caught up
    resumed = policy.fire(s, since, utc(2024, 1, 1, 3, 2), [])
    assert (resumed.due, resumed.start) == (utc(2024, 1, 1, 3), True)
    # resumed at 03:20: nothing starts
    assert not policy.fire(s, since, utc(2024, 1, 1, 3, 20), []).start


def test_history_keeps_every_unfinished_run_and_the_latest_finished_ones():
    s = sched(successfulJobsHistoryLimit=2, failedJobsHistoryLimit=1)
    runs = [Run(1, "SUCCEEDED"), Run(2, "FAILED"), Run(3, "RUNNING"), Run(4, "SUCCEEDED"), Run(5, "CANCELLED"),
            Run(6, "SUCCEEDED"), Run(7, "QUEUED")]
    assert policy.kept(s, runs) == [3, 4, 5, 6, 7]


def test_the_document_round_trips_and_each_bad_field_is_named():
    s = sched("@daily", timeZone="Europe/Berlin", concurrencyPolicy="Forbid", startingDeadline="10m")
    assert schedule_from_document(s.to_document()) == s
    assert s.starting_deadline_s == 600 and s.cron == "0 0 * * *"
    job = s.job_document("nightly-1")
    assert job["metadata"] == {"name": "nightly-1", "labels": {"team": "vision", SCHEDULE_LABEL: "nightly"}}
    cases = [("61 * * * *", "timeZone", "UTC", "spec.schedule: invalid cron expression '61 * * * *'"),
             ("0 3 * *", "timeZone", "UTC", "spec.schedule: invalid cron expression '0 3 * *': expected 5 fields"),
             ("0 3 * * *", "timeZone", "Mars/Base", "spec.timeZone: unknown time zone 'Mars/Base'"),
             ("0 3 * * *", "concurrencyPolicy", "Often", "spec.concurrencyPolicy: must be one of Allow, Forbid, "
                                                         "Replace"),
             ("0 3 * * *", "startingDeadline", "soon", "spec.startingDeadline: 'soon' is not a duration"),
             ("0 3 * * *", "jobTemplate", {"spec": {"queue": "default"}}, "spec.jobTemplate.spec.podSets: ")]
    for expr, field, value, words in cases:
        with pytest.raises(SpecError) as err:
            schedule_from_document(doc(expr, **{field: value}))
        assert str(err.value).startswith(words), str(err.value)


def test_a_due_time_is_never_started_twice():
    """Firing again at once, or later, from the due time just handled never handles it again."""
    s = sched("*/7 * * * *", timeZone="America/New_York")
    since, now = utc(2024, 3, 9, 12), utc(2024, 3, 9, 12)
    handled = []
    for _ in range(2000):
        now += timedelta(minutes=1)
        firing = policy.fire(s, since, now, [])
        if firing.due is not None:
            assert firing.due > since
            handled.append(firing.due)
            since = firing.due
    assert handled == sorted(set(handled)) and len(handled) > 250


def test_the_example_schedule():
    from pathlib import Path

    from sluice.schedules import load_schedule
    s = load_schedule((Path(__file__).resolve().parents[2] / "examples" / "schedule.yaml").read_text())
    assert (s.name, s.cron, s.concurrency_policy, s.starting_deadline_s) == ("every-two-minutes", "*/2 * * * *",
                                                                             "Forbid", 60)
    assert s.template.pod_sets[0].template["metadata"]["annotations"]["sluice.io/sim-duration"] == "20s"
