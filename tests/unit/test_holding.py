"""The rules of jobs that wait (policy/holding.py) and of interactive sessions (policy/sessions.py)."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.policy import holding, sessions
from dispatcher.policy.holding import ARRAY, DEPENDENCIES, TIME, Target, array_target

NOW = datetime(2026, 11, 27, 3, 0, tzinfo=UTC)


def test_a_job_waits_for_its_time_then_its_dependencies_then_its_array_slot():
    later = NOW + timedelta(minutes=5)
    args = {"start_after": later, "now": NOW, "unmet": True, "array_limited": True}
    assert holding.next_hold(after=None, **args) == TIME
    assert holding.next_hold(after=TIME, **args) == DEPENDENCIES
    assert holding.next_hold(after=DEPENDENCIES, **args) == ARRAY
    assert holding.next_hold(after=ARRAY, **args) is None
    assert holding.next_hold(after=None, start_after=NOW, now=NOW, unmet=False, array_limited=False) is None
    assert holding.next_hold(after=None, start_after=None, now=NOW, unmet=False, array_limited=True) == ARRAY


@pytest.mark.parametrize("state, failed, expected", [
    ("RUNNING", False, {"succeeded": None, "failed": None, "finished": None}),
    ("SUCCEEDED", False, {"succeeded": True, "failed": False, "finished": True}),
    ("FAILED", True, {"succeeded": False, "failed": True, "finished": True}),
    ("CANCELLED", True, {"succeeded": False, "failed": True, "finished": True}),
])
def test_a_dependency_on_a_job(state, failed, expected):
    assert {c: holding.met(c, Target(1, state, failed)) for c in expected} == expected


def test_a_dependency_on_an_array_waits_for_every_element_but_fails_at_the_first_that_did_not_succeed():
    running = array_target(7, {"SUCCEEDED": 3, "RUNNING": 1, "WAITING": 5})
    assert [holding.met(c, running) for c in holding.CONDITIONS] == [None, None, None]
    one_failed = array_target(7, {"SUCCEEDED": 3, "FAILED": 1, "WAITING": 5})
    assert [holding.met(c, one_failed) for c in holding.CONDITIONS] == [False, None, None]
    done = array_target(7, {"SUCCEEDED": 9})
    assert [holding.met(c, done) for c in holding.CONDITIONS] == [True, False, True]
    assert holding.failed_reason(one_failed, "succeeded") == \
        "dependency array 7 had an element that did not succeed; this job needed it to succeed"


def test_reasons_say_what_a_job_waits_for():
    assert holding.waiting_reason(TIME, start_after=NOW) == "waiting until 2026-11-27T03:00:00Z (startAfter)"
    assert holding.waiting_reason(DEPENDENCIES, unmet=[(12, "succeeded")]) == "waiting for job 12 to succeed"
    assert holding.waiting_reason(DEPENDENCIES, unmet=[(14, "failed"), (12, "finished")]) == \
        "waiting for job 12 to finish (and 1 more)"
    assert holding.waiting_reason(ARRAY, array_id=41, parallelism=10) == "waiting for a slot of array 41 (10 at once)"
    assert holding.failed_reason(Target(12, "CANCELLED", True), "succeeded") == \
        "dependency job 12 ended CANCELLED; this job needed it to succeed"


def test_cycles_are_found_and_named_along_their_path():
    assert holding.cycle_in({0: [1], 1: [2], 2: []}) is None
    assert holding.cycle_in({0: [1], 1: [2], 2: [0]}) == [0, 1, 2, 0]
    assert holding.cycle_in({3: [3]}) == [3, 3]
    assert holding.cycle_in({0: [1, 2], 1: [3], 2: [3], 3: []}) is None  # a diamond


@given(st.dictionaries(st.integers(0, 12), st.lists(st.integers(0, 12), max_size=4), max_size=12))
def test_a_graph_has_a_cycle_exactly_when_it_cannot_be_ordered(graph):
    found = holding.cycle_in(graph)
    remaining = {n: set(d) for n, d in graph.items()}
    for deps in list(remaining.values()):
        for d in deps:
            remaining.setdefault(d, set())
    while True:  # Kahn: take the jobs whose dependencies are all taken
        free = [n for n, d in remaining.items() if not d]
        if not free:
            break
        for n in free:
            del remaining[n]
        for d in remaining.values():
            d.difference_update(free)
    assert (found is None) == (not remaining)
    if found is not None:
        assert found[0] == found[-1] and all(b in graph[a] for a, b in zip(found, found[1:]))


def test_a_session_orders_before_any_batch_priority_and_keeps_its_own():
    top = sessions.order_priority(1000, False)
    low_session = sessions.order_priority(-1000, True)
    assert low_session > top and sessions.is_interactive(low_session) and not sessions.is_interactive(top)
    assert sessions.own_priority(low_session) == -1000 and sessions.own_priority(top) == 1000


def test_a_session_is_idle_from_its_last_attach_or_its_start():
    started = NOW - timedelta(minutes=40)
    assert sessions.idle_over(1800, sessions.idle_since(started, None), NOW)
    assert not sessions.idle_over(1800, sessions.idle_since(started, NOW - timedelta(minutes=10)), NOW)
    assert not sessions.idle_over(None, started, NOW)
