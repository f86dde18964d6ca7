"""Which clusters a leader that has just taken over waits for (scheduler/takeover.py)."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from dispatcher.capacity.usable import ClusterCapacity
from dispatcher.policy.placing import ClusterState
from dispatcher.scheduler.settings import SchedulerSettings
from dispatcher.scheduler.takeover import Takeover, awaited

SINCE = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def _row(name: str, seconds_before: float | None):
    return SimpleNamespace(name=name, last_seen_at=None if seconds_before is None
                           else SINCE - timedelta(seconds=seconds_before))


def _capacity(name: str, unavailable: str = "") -> ClusterCapacity:
    return ClusterCapacity(ClusterState(name, "onprem", "dc", {}, {"cpu": 1000}, {"cpu": 1000}, unavailable),
                           "active", "agent", 1.0, {"cpu": 1000})


def test_the_clusters_awaited_are_those_reachable_when_the_store_last_heard_from_an_agent():
    rows = [_row("a", 40.0), _row("b", 44.0), _row("late", 46.0), _row("edge", 3 * 3600.0), _row("new", None),
            _row("back", -1.0)]  # back: reported since the takeover
    # The last report before the takeover came 40 s before it (the dispatchers were down meanwhile).
    assert awaited(rows, SINCE, unreachable_after_s=5.0) == {"a", "b"}
    assert awaited([_row("back", -1.0), _row("new", None)], SINCE, unreachable_after_s=5.0) == frozenset()


def test_every_cluster_is_held_until_the_awaited_ones_are_back_and_never_again_after():
    takeover = Takeover(SINCE, SchedulerSettings(takeover_wait_s=60.0, unreachable_after_s=5.0))
    capacities = [_capacity("a"), _capacity("b"), _capacity("cordoned", "cordoned")]
    rows = [_row("a", 10.0), _row("b", 12.0), _row("cordoned", 11.0)]
    held = takeover.hold(capacities, rows, SINCE + timedelta(seconds=1))
    assert [c.state.unavailable.split(":")[0] for c in held] == \
        ["held after the scheduler took over", "held after the scheduler took over", "cordoned"]
    assert "waits for the 3 clusters reachable before to reconnect, until 12:01:00 UTC at most" \
        in held[0].state.unavailable
    rows = [_row("a", -1.0), _row("b", -2.0), _row("cordoned", 11.0)]  # two back, one not
    assert takeover.hold(capacities, rows, SINCE + timedelta(seconds=3))[0].state.unavailable
    rows[2] = _row("cordoned", -2.5)
    assert takeover.hold(capacities, rows, SINCE + timedelta(seconds=4)) == capacities
    rows[0] = _row("a", 30.0)  # silent again (as if): a lost cluster now, no takeover's wait
    assert takeover.hold(capacities, rows, SINCE + timedelta(seconds=5)) == capacities


def test_the_wait_ends_at_its_bound_or_never_begins_when_it_is_zero():
    rows = [_row("a", 10.0)]
    takeover = Takeover(SINCE, SchedulerSettings(takeover_wait_s=60.0))
    assert takeover.hold([_capacity("a")], rows, SINCE + timedelta(seconds=59))[0].state.unavailable
    assert takeover.hold([_capacity("a")], rows, SINCE + timedelta(seconds=60)) == [_capacity("a")]
    assert Takeover(SINCE, SchedulerSettings(takeover_wait_s=0)).hold([_capacity("a")], rows, SINCE) == \
        [_capacity("a")]
