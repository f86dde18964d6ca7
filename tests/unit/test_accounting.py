"""Chargeback arithmetic (dispatcher/accounting.py): known durations × prices × multipliers, windows that
clip an attempt, attempts that never started or still run, and resources no one priced."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.policy import accounting
from dispatcher.policy.accounting import AttemptRun, GroupUsage, Window, window
from sluice.quantity import parse_resources

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
PRICES = {"alpha": {"cpu": 0.5, "memory": 0.01}, "beta": {"cpu": 0.2, "nvidia.com/gpu": 3.0}}
MULTIPLIERS = {"standard": 1.0, "premium": 2.0}
ALIASES = {"gpu": "nvidia.com/gpu", "fpga": "example.com/fpga"}


def run(start_ago_h: float | None, end_ago_h: float | None = None, *, cluster="alpha", queue="vision",
        cls="standard", user="alice", **requests: str) -> AttemptRun:
    return AttemptRun(queue=queue, service_class=cls, cluster=cluster, user=user,
                      requests=parse_resources({ALIASES.get(k, k): v for k, v in requests.items()}),
                      started_at=None if start_ago_h is None else NOW - start_ago_h * H,
                      finished_at=None if end_ago_h is None else NOW - end_ago_h * H)


ALL_TIME = window(NOW, None)


def test_base_units_are_cores_gib_and_units():
    assert accounting.base_amount("cpu", 2500) == 2.5
    assert accounting.base_amount("memory", parse_resources({"memory": "8Gi"})["memory"]) == 8.0
    assert accounting.base_amount("nvidia.com/gpu", 3000) == 3.0


def test_a_finished_attempt_costs_hours_times_prices_times_the_multiplier():
    # 4 cores and 8 GiB for 2 h on alpha: 4×2×0.5 + 8×2×0.01 = 4.16, premium doubles it.
    r = run(12, 10, cls="premium", cpu="4", memory="8Gi")
    assert accounting.seconds_in_window(r, ALL_TIME) == 7200.0
    [u] = accounting.usage([r], by="queue", win=ALL_TIME, prices=PRICES, multipliers=MULTIPLIERS)
    assert u.group == "vision" and u.attempts == 1
    assert u.resource_hours == {"cpu": 8.0, "memory": 16.0}
    assert u.cost == pytest.approx(8.32)


def test_sum_over_resources_and_attempts():
    runs = [run(3, 0.5, cluster="beta", cpu="8", gpu="2"),      # 2.5 h: 20×0.2 + 5×3 = 19
            run(5, 4.5, queue="nlp", cpu="1", memory="2Gi"),               # 0.5 h: 0.25 + 0.01 = 0.26
            run(4, 3, queue="nlp", cluster="beta", cpu="1", memory="2Gi")]  # 1 h: 0.2, memory unpriced
    by_queue = {u.group: u for u in accounting.usage(runs, by="queue", win=ALL_TIME, prices=PRICES,
                                                     multipliers=MULTIPLIERS)}
    assert by_queue["vision"].cost == pytest.approx(19.0)
    assert by_queue["nlp"].cost == pytest.approx(0.46) and by_queue["nlp"].attempts == 2
    assert by_queue["nlp"].resource_hours == pytest.approx({"cpu": 1.5, "memory": 3.0})
    by_cluster = {u.group: u.cost for u in accounting.usage(runs, by="cluster", win=ALL_TIME, prices=PRICES,
                                                            multipliers=MULTIPLIERS)}
    assert by_cluster == pytest.approx({"beta": 19.2, "alpha": 0.26})


def test_rows_come_most_expensive_first_then_by_name():
    runs = [run(1, 0, user="carol", cpu="1"), run(1, 0, user="bob", cpu="4"), run(1, 0, user="alice", cpu="1")]
    found = accounting.usage(runs, by="user", win=ALL_TIME, prices=PRICES, multipliers=MULTIPLIERS)
    assert [u.group for u in found] == ["bob", "alice", "carol"]


@pytest.mark.parametrize("by, group", [("queue", "q"), ("class", "premium"), ("cluster", "beta"), ("user", "dana")])
def test_every_grouping(by, group):
    r = run(2, 1, queue="q", cls="premium", cluster="beta", user="dana", cpu="1")
    assert accounting.usage([r], by=by, win=ALL_TIME, prices=PRICES, multipliers=MULTIPLIERS) == [
        GroupUsage(group, {"cpu": 1.0}, pytest.approx(0.4), 1)]


def test_an_unknown_grouping_is_refused():
    with pytest.raises(ValueError, match="cannot group by 'team'"):
        accounting.usage([], by="team", win=ALL_TIME, prices={}, multipliers={})


def test_the_window_clips_an_attempt_on_both_sides():
    r = run(30, 20, cpu="1")
    assert accounting.seconds_in_window(r, window(NOW, 24 * 3600)) == 4 * 3600  # 24 h ago .. 20 h ago
    assert accounting.seconds_in_window(r, Window(NOW - 26 * H, NOW - 22 * H)) == 4 * 3600
    assert accounting.seconds_in_window(r, Window(NOW - 29 * H, NOW - 28 * H)) == 3600
    [u] = accounting.usage([r], by="queue", win=window(NOW, 24 * 3600), prices=PRICES, multipliers=MULTIPLIERS)
    assert u.resource_hours == {"cpu": 4.0} and u.cost == pytest.approx(2.0) and u.attempts == 1


def test_attempts_outside_the_window_are_left_out():
    old = run(50, 40, cpu="1")
    assert accounting.seconds_in_window(old, window(NOW, 24 * 3600)) == 0
    assert accounting.usage([old], by="queue", win=window(NOW, 24 * 3600), prices=PRICES, multipliers=MULTIPLIERS) == []
    assert accounting.usage([old], by="queue", win=ALL_TIME, prices=PRICES, multipliers=MULTIPLIERS)[0].cost == 5.0


def test_a_running_attempt_counts_until_now():
    r = run(1.5, None, cpu="2")
    assert accounting.seconds_in_window(r, ALL_TIME) == 5400
    assert accounting.seconds_in_window(r, window(NOW, 3600)) == 3600
    assert accounting.usage([r], by="queue", win=ALL_TIME, prices=PRICES, multipliers=MULTIPLIERS)[0].cost == 1.5


def test_a_never_started_attempt_uses_nothing_and_is_not_counted():
    never = run(None, 1, cpu="64")  # cancelled or lost while dispatched
    assert accounting.seconds_in_window(never, ALL_TIME) == 0
    assert accounting.usage([never], by="queue", win=ALL_TIME, prices=PRICES, multipliers=MULTIPLIERS) == []
    [u] = accounting.usage([never, run(1, 0, cpu="1")], by="queue", win=ALL_TIME, prices=PRICES,
                           multipliers=MULTIPLIERS)
    assert u.attempts == 1 and u.resource_hours == {"cpu": 1.0}


def test_missing_prices_and_multipliers():
    # gamma has no prices at all; beta none for memory; 'custom' is an unknown class (multiplier 1).
    runs = [run(1, 0, cluster="gamma", cpu="4", memory="4Gi"),
            run(1, 0, cluster="beta", cls="custom", cpu="1", memory="4Gi", fpga="1")]
    [u] = accounting.usage(runs, by="queue", win=ALL_TIME, prices=PRICES, multipliers=MULTIPLIERS)
    assert u.resource_hours == {"cpu": 5.0, "memory": 8.0, "example.com/fpga": 1.0}
    assert u.cost == pytest.approx(0.2)
    assert accounting.cost({"cpu": 3.0}, {}, 2.0) == 0.0


def test_a_zero_multiplier_makes_a_class_free():
    [u] = accounting.usage([run(2, 0, cls="free", cpu="8")], by="class", win=ALL_TIME, prices=PRICES,
                           multipliers={"free": 0.0})
    assert u.cost == 0.0 and u.resource_hours == {"cpu": 16.0}


durations = st.floats(min_value=0, max_value=1000, allow_nan=False)


@given(start=durations, length=durations, since_h=st.one_of(st.none(), st.floats(min_value=0.001, max_value=2000)),
       cpu=st.integers(1, 64_000))
def test_grouping_never_changes_the_totals_and_the_window_never_adds(start, length, since_h, cpu):
    r = AttemptRun("q", "premium", "alpha", "u", {"cpu": cpu}, NOW - start * H, NOW - max(0.0, start - length) * H)
    win = window(NOW, None if since_h is None else since_h * 3600)
    totals = set()
    for by in accounting.GROUPINGS:
        found = accounting.usage([r], by=by, win=win, prices=PRICES, multipliers=MULTIPLIERS)
        totals.add(round(sum(u.cost for u in found), 9))
    assert len(totals) == 1
    clipped = accounting.seconds_in_window(r, win)
    assert 0 <= clipped <= accounting.seconds_in_window(r, ALL_TIME) + 1e-6
