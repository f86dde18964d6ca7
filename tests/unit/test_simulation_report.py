"""Decision-quality figures on a small run worked out by hand: waits, nearest-rank percentiles, JCT, bounded
slowdown, utilization, queue shares, fair share over windows, the table and the JSON."""
from __future__ import annotations

import json
import re

import pytest

from simulation.report import (
    JobOutcome,
    busy_from_outcomes,
    fair_share_violations,
    format_seconds,
    policy_figures,
    render_table,
    to_json,
    window_shares,
)

CAPACITY = {"cpu": 4000}
ENTITLED = {"a": 0.5, "b": 0.5}


def outcomes() -> list[JobOutcome]:
    """a: two half-machine jobs at 0 (100 s and 5 s); b: a whole-machine job submitted at 10 that waits
    for them until 100 (preempted once on the way), and one too big for any cluster."""
    return [
        JobOutcome(1, "a", 0.0, 0.0, 100.0, 100.0, {"cpu": 2000}, "c1", 0, None),
        JobOutcome(2, "a", 0.0, 0.0, 5.0, 5.0, {"cpu": 2000}, "c1", 0, None),
        JobOutcome(3, "b", 10.0, 100.0, 300.0, 200.0, {"cpu": 4000}, "c1", 1, None),
        JobOutcome(4, "b", 20.0, None, None, 50.0, {"cpu": 8000}, None, 0, "larger than any cluster"),
    ]


def test_policy_figures_worked_by_hand():
    figures = policy_figures(outcomes(), capacity=CAPACITY, entitled=ENTITLED)
    assert (figures["jobs"], figures["finished"], figures["unfinished"]) == (4, 3, 0)
    assert figures["makespanSeconds"] == 300.0
    # waits 0, 0, 90: nearest rank p50 = rank ceil(1.5) = 2 -> 0; p95 and p99 = rank 3 -> 90
    assert figures["meanWaitSeconds"] == 30.0
    assert (figures["p50WaitSeconds"], figures["p95WaitSeconds"], figures["p99WaitSeconds"]) == (0.0, 90.0, 90.0)
    assert figures["meanCompletionSeconds"] == pytest.approx((100 + 5 + 290) / 3)
    # max(1, 100/100), max(1, 5/10), 290/200
    assert figures["boundedSlowdown"] == pytest.approx((1 + 1 + 1.45) / 3)
    # (2000 x 100 + 2000 x 5 + 4000 x 200) / (4000 x 300)
    assert figures["utilization"] == pytest.approx(1_010_000 / 1_200_000)
    assert figures["utilizationResource"] == "cpu"
    assert figures["preemptions"] == 1
    assert figures["unrunnable"] == 1 and figures["unrunnableReasons"] == {"larger than any cluster": 1}
    # dominant-resource seconds: a 0.5 x 100 + 0.5 x 5 = 52.5, b 1 x 200 = 200
    assert figures["queues"] == {
        "a": {"share": pytest.approx(52.5 / 252.5), "entitledShare": 0.5, "meanWaitSeconds": 0.0, "jobs": 2},
        "b": {"share": pytest.approx(200 / 252.5), "entitledShare": 0.5, "meanWaitSeconds": 90.0, "jobs": 2},
    }


def test_utilization_from_busy_counts_what_the_outcomes_do_not_show():
    busy = [(0.0, {"cpu": 4000}), (100.0, {"cpu": 2000}), (150.0, {})]  # e.g. runs lost to preemption
    figures = policy_figures(outcomes(), capacity=CAPACITY, entitled=ENTITLED, busy=busy)
    assert figures["utilization"] == pytest.approx((4000 * 100 + 2000 * 50) / (4000 * 300))
    with pytest.raises(ValueError, match="busy must be sorted by time"):
        policy_figures(outcomes(), capacity=CAPACITY, entitled=ENTITLED, busy=list(reversed(busy)))


def test_busy_from_outcomes_gives_the_same_utilization():
    runs = outcomes()
    busy = busy_from_outcomes(runs)
    assert busy == [(0.0, {"cpu": 4000}), (5.0, {"cpu": 2000}), (100.0, {"cpu": 4000}), (300.0, {})]
    assert (policy_figures(runs, capacity=CAPACITY, entitled=ENTITLED, busy=busy)["utilization"]
            == pytest.approx(policy_figures(runs, capacity=CAPACITY, entitled=ENTITLED)["utilization"]))


def test_the_bottleneck_resource_is_the_utilization():
    runs = [JobOutcome(1, "a", 0.0, 0.0, 10.0, 10.0, {"cpu": 1000, "nvidia.com/gpu": 6000})]
    figures = policy_figures(runs, capacity={"cpu": 64000, "nvidia.com/gpu": 8000}, entitled={"a": 1.0})
    assert (figures["utilizationResource"], figures["utilization"]) == ("nvidia.com/gpu", 0.75)
    assert figures["queues"]["a"]["share"] == 1.0


def test_no_figures_from_nothing_are_none_not_nan():
    runs = [JobOutcome(1, "a", 0.0, None, None, 10.0, {"cpu": 1000})]
    figures = policy_figures(runs, capacity=CAPACITY, entitled={"a": 1.0})
    assert figures["unfinished"] == 1
    for key in ("makespanSeconds", "meanWaitSeconds", "p99WaitSeconds", "boundedSlowdown", "utilization"):
        assert figures[key] is None
    json.loads(to_json({}, {"fifo": figures}))


@pytest.mark.parametrize("change, message", [
    ({"entitled": {"a": 0.5}}, "entitled has no share for queue(s) b"),
    ({"entitled": {"a": 0.5, "b": 1.5}}, "entitled shares must be fractions from 0 to 1"),
    ({"capacity": {"cpu": 0}}, "capacity amounts must be positive milli-units"),
    ({"capacity": {}}, "capacity must map resource names"),
])
def test_bad_arguments_are_named(change, message):
    arguments = {"capacity": CAPACITY, "entitled": ENTITLED} | change
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        policy_figures(outcomes(), **arguments)


def test_an_impossible_outcome_is_named():
    bad = JobOutcome(9, "a", 50.0, 40.0, 60.0, 20.0, {"cpu": 1000})
    with pytest.raises(ValueError, match="job 9: starts at 40.0s, before its submit at 50.0s"):
        policy_figures([bad], capacity=CAPACITY, entitled={"a": 1.0})


def test_runs_that_do_not_follow_one_another_are_named():
    bad = JobOutcome(9, "a", 0.0, 10.0, 100.0, 60.0, {"cpu": 1000}, runs=((10.0, 50.0), (40.0, 100.0)))
    with pytest.raises(ValueError, match=r"job 9: runs .* must follow one another"):
        policy_figures([bad], capacity=CAPACITY, entitled={"a": 1.0})


# -- fair share over windows -------------------------------------------------------------------------


def test_an_evicted_job_counts_every_run_as_use_and_waits_again_between_runs():
    # b's job runs 0-40, is evicted, waits 40-150 and runs again 150-210: its share counts both runs, and
    # its queue has work waiting in the second window though the job started in the first.
    runs = [JobOutcome(1, "a", 0.0, 40.0, 300.0, 260.0, {"cpu": 4000}, runs=((40.0, 150.0), (210.0, 300.0))),
            JobOutcome(2, "b", 0.0, 0.0, 210.0, 100.0, {"cpu": 4000}, 0, 1, None, ((0.0, 40.0), (150.0, 210.0)))]
    windows = window_shares(runs, window_s=100, capacity=CAPACITY, entitled=ENTITLED)
    assert [w["queues"]["b"]["share"] for w in windows] == pytest.approx([0.4, 0.5, 0.1])
    assert [w["queues"]["b"]["waitingAnyTime"] for w in windows] == [True, True, False]
    assert windows[1]["queues"]["a"]["waitingAnyTime"]  # a waited from 150 to 210
    figures = policy_figures(runs, capacity=CAPACITY, entitled=ENTITLED)
    assert figures["queues"]["b"]["share"] == pytest.approx(100 / 300)
    assert figures["utilization"] == pytest.approx(1.0)
    assert busy_from_outcomes(runs)[:3] == [(0.0, {"cpu": 4000}), (40.0, {"cpu": 4000}), (150.0, {"cpu": 4000})]
    # Without its runs, only b's finishing run is use, and b never waits again once started.
    finishing_only = [JobOutcome(2, "b", 0.0, 0.0, 210.0, 60.0, {"cpu": 4000}, "c1", 1)]
    assert [w["queues"]["b"]["waitingAnyTime"] for w in window_shares(
        finishing_only, window_s=100, capacity=CAPACITY, entitled=ENTITLED)] == [False, False, False]

def test_window_shares_worked_by_hand():
    windows = window_shares(outcomes(), window_s=100, capacity=CAPACITY, entitled=ENTITLED)
    assert [(w["startSeconds"], w["endSeconds"]) for w in windows] == [(0, 100), (100, 200), (200, 300)]
    first, second, third = windows
    assert first["usedCapacitySeconds"] == 52.5  # only a ran: 0.5 x 100 + 0.5 x 5
    assert first["queues"]["a"] == {"share": 1.0, "entitledShare": 0.5, "attainableShare": 0.5, "fairShare": 0.5,
                                    "waitingThroughout": False, "waitingAnyTime": False}
    # b waited from 10 to 100 (its demand, 90 whole-machine seconds, is no cap) while half the machine ran: it is
    # due half of that, 0.5 x 0.5 x 90, of the window's 52.5
    assert first["queues"]["b"] == {"share": 0.0, "entitledShare": 0.5, "attainableShare": 22.5 / 52.5,
                                    "fairShare": 0.5, "waitingThroughout": False, "waitingAnyTime": True}
    assert set(second["queues"]) == {"b"} and second["queues"]["b"]["share"] == 1.0
    assert second["queues"]["b"]["fairShare"] == 1.0 and second["queues"]["b"]["attainableShare"] == 0.5
    assert third["usedCapacitySeconds"] == 100.0
    assert fair_share_violations(windows) == [
        {"startSeconds": 0, "endSeconds": 100, "windows": 1, "queue": "b", "share": 0.0, "due": 22.5 / 52.5}]


def test_an_idle_stretch_has_no_windows_and_changes_no_figure():
    # The hand-worked run, then a job ten thousand windows later: only the windows someone was present
    # in are reported (a trace mixing dates with small numbers of seconds spans decades, and its windows
    # were once each built), and the early ones say what they said alone.
    late = JobOutcome(5, "a", 1e6, 1e6, 1e6 + 150, 150.0, {"cpu": 2000}, "c1", 0, None)
    windows = window_shares([*outcomes(), late], window_s=100, capacity=CAPACITY, entitled=ENTITLED)
    assert [(w["startSeconds"], w["endSeconds"]) for w in windows] == [
        (0, 100), (100, 200), (200, 300), (1e6, 1e6 + 100), (1e6 + 100, 1e6 + 150)]
    assert windows[:3] == window_shares(outcomes(), window_s=100, capacity=CAPACITY, entitled=ENTITLED)
    assert [w["queues"]["a"]["share"] for w in windows[3:]] == [1.0, 1.0]
    assert fair_share_violations(windows) == fair_share_violations(windows[:3])


def test_windows_spanning_many_and_a_partial_last_window():
    windows = window_shares(outcomes(), window_s=70, capacity=CAPACITY, entitled=ENTITLED)
    assert [w["usedCapacitySeconds"] for w in windows] == pytest.approx([
        0.5 * 70 + 0.5 * 5,  # [0, 70)
        0.5 * 30 + 1.0 * 40,  # [70, 140): a until 100, b from 100
        70,  # [140, 210) and [210, 280): nothing begins or ends in them, so they are alike and given once
        20,  # [280, 300): the last window ends with the run
    ])
    assert [(w["startSeconds"], w["endSeconds"], w["windows"]) for w in windows] == [
        (0, 70, 1), (70, 140, 1), (140, 280, 2), (280, 300, 1)]
    assert windows[0]["queues"]["b"]["waitingAnyTime"] and not windows[0]["queues"]["b"]["waitingThroughout"]
    assert windows[1]["queues"]["b"]["waitingAnyTime"]


def test_a_job_present_for_years_is_a_few_entries_each_standing_for_its_like_windows():
    # b's one job waits a year while a's runs, then runs a day: every hour between the ends is alike.
    year, day = 365 * 86400.0, 86400.0
    runs = [JobOutcome(1, "a", 0.0, 0.0, year, year, {"cpu": 4000}),
            JobOutcome(2, "b", 0.0, year, year + day, day, {"cpu": 400})]
    windows = window_shares(runs, capacity=CAPACITY, entitled={"a": 0.5, "b": 0.5})
    assert [(w["startSeconds"], w["endSeconds"], w["windows"]) for w in windows] == [
        (0.0, 3600.0, 1), (3600.0, year - 3600, 8758), (year - 3600, year, 1), (year, year + 3600, 1),
        (year + 3600, year + day - 3600, 22), (year + day - 3600, year + day, 1)]
    assert sum(w["windows"] for w in windows) == (year + day) / 3600
    assert windows[1]["queues"] == windows[0]["queues"]  # b waiting throughout, a holding the machine
    assert windows[1]["usedCapacitySeconds"] == 3600.0
    violations = fair_share_violations(windows)
    assert [(v["queue"], v["windows"]) for v in violations] == [("b", 1), ("b", 8758), ("b", 1)]


def test_waiting_throughout_and_demand_capped_entitlement():
    # b's small job waits the whole first hour while a holds the machine, then runs for 60 s
    runs = [JobOutcome(1, "a", 0.0, 0.0, 7200.0, 7200.0, {"cpu": 4000}),
            JobOutcome(2, "b", 0.0, 7200.0, 7260.0, 60.0, {"cpu": 400})]
    windows = window_shares(runs, capacity=CAPACITY, entitled={"a": 0.5, "b": 0.5})
    b = windows[0]["queues"]["b"]
    assert b["waitingThroughout"] and b["waitingAnyTime"] and b["share"] == 0.0
    # b could have used 0.1 x 60 capacity-seconds of the 3600 used: that, not 0.5, is what it is held to
    assert b["attainableShare"] == pytest.approx(6 / 3600)
    assert b["fairShare"] == pytest.approx(6 / 3600)
    assert windows[1]["queues"]["b"]["waitingThroughout"] and windows[2]["queues"]["b"]["share"] == 1.0
    assert [(v["queue"], v["startSeconds"]) for v in fair_share_violations(windows)] == [("b", 0.0), ("b", 3600.0)]


def test_a_queue_is_due_its_entitlement_only_while_it_has_work():
    # a (entitled to 3/4) holds three quarters of the machine all hour; b (1/4) gets four quarter-machine jobs 50
    # minutes in: one starts at once, the others wait past the hour while b is at its entitlement.
    entitled = {"a": 0.75, "b": 0.25}
    a = [JobOutcome(i, "a", 0.0, 0.0, 3600.0, 3600.0, {"cpu": 1000}) for i in range(3)]
    b = [JobOutcome(10, "b", 3000.0, 3000.0, 3600.0, 600.0, {"cpu": 1000})] + \
        [JobOutcome(11 + i, "b", 3000.0, 3600.0, 4200.0, 600.0, {"cpu": 1000}) for i in range(3)]
    window = window_shares(a + b, capacity=CAPACITY, entitled=entitled)[0]
    used = 0.75 * 3600 + 0.25 * 600
    assert window["usedCapacitySeconds"] == pytest.approx(used)
    # Its demand over the hour (four quarters for 600 s: 600 of the 2,850 used) would hold it to 21 %; it had
    # work for the last 600 s only, and is due its quarter of what ran then.
    assert window["queues"]["b"]["attainableShare"] == pytest.approx(0.25 * 600 / used)
    assert window["queues"]["b"]["share"] == pytest.approx(0.25 * 600 / used)
    assert fair_share_violations([window]) == []
    # The same jobs, the first started only at the hour's last 10 s, are short of it.
    late = [JobOutcome(10, "b", 3000.0, 3590.0, 4190.0, 600.0, {"cpu": 1000})] + b[1:]
    assert [v["queue"] for v in fair_share_violations(window_shares(a + late, capacity=CAPACITY,
                                                                      entitled=entitled)[:1])] == ["b"]


def test_violation_tolerance_relative_or_absolute():
    windows = [{"startSeconds": 0, "endSeconds": 3600, "queues": {
        "a": {"share": 0.46, "entitledShare": 0.5, "attainableShare": 0.5, "fairShare": 0.6,
              "waitingThroughout": True, "waitingAnyTime": True},
        "b": {"share": 0.04, "entitledShare": 0.05, "attainableShare": 0.05, "fairShare": 0.05,
              "waitingThroughout": False, "waitingAnyTime": True},
        "c": {"share": 0.0, "entitledShare": 0.45, "attainableShare": 0.45, "fairShare": 0.45,
              "waitingThroughout": False, "waitingAnyTime": False}}}]
    assert [v["queue"] for v in fair_share_violations(windows)] == ["b"]  # 0.04 < 0.045; a's 0.46 >= 0.45
    assert [v["queue"] for v in fair_share_violations(windows, against="fairShare")] == ["a", "b"]
    assert fair_share_violations(windows, relative=False) == []  # within 10 points
    with pytest.raises(ValueError, match="against must be"):
        fair_share_violations(windows, against="share")


def test_window_length_must_be_positive():
    with pytest.raises(ValueError, match="window_s must be a positive number of seconds, got 0"):
        window_shares(outcomes(), window_s=0, capacity=CAPACITY, entitled=ENTITLED)


# -- output ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seconds, text", [
    (None, "-"), (0, "0.0s"), (42.04, "42.0s"), (187, "3m 07s"), (3725, "1h 02m"), (2 * 86400 + 5 * 3600, "2d 05h"),
])
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text


def test_table_has_a_column_per_policy_and_the_queue_rows():
    figures = policy_figures(outcomes(), capacity=CAPACITY, entitled=ENTITLED)
    table = render_table({"name": "small", "jobs": 4}, {"fifo": figures, "fair": figures})
    lines = table.splitlines()
    assert lines[0] == "Trace: name small, jobs 4"
    assert lines[1].split() == ["fifo", "fair"]
    assert set(lines[2]) == {"-", " "}
    rows = {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", line.strip()) for line in lines[3:])}
    assert rows["Makespan"] == ["5m 00s", "5m 00s"]
    assert rows["Mean wait"] == ["30.0s", "30.0s"]
    assert rows["Bounded slowdown (10 s)"] == ["1.15", "1.15"]
    assert rows["Utilization"] == ["84.2% cpu", "84.2% cpu"]
    assert rows["unrunnable: larger than any cluster"] == ["1", "1"]
    assert rows["Queue b share / entitled"] == ["79.2% / 50.0%", "79.2% / 50.0%"]
    assert rows["Queue b mean wait"] == ["1m 30s", "1m 30s"]


def test_json_has_the_trace_and_each_policy():
    figures = policy_figures(outcomes(), capacity=CAPACITY, entitled=ENTITLED)
    document = json.loads(to_json({"name": "small", "format": "swf"}, {"fifo": figures}))
    assert document["trace"] == {"name": "small", "format": "swf"}
    assert document["policies"]["fifo"]["p95WaitSeconds"] == 90.0
    assert document["policies"]["fifo"]["queues"]["a"]["jobs"] == 2
