"""What an agent's report does to a job (stale reports, progress, success, retries) and the job state
machine that every outcome must respect."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.policy.reporting import JobView, Outcome, on_report
from dispatcher.policy.states import (
    ACTIVE,
    CANCELLED,
    DISPATCHED,
    FAILED,
    FINAL,
    QUEUED,
    RUNNING,
    STATES,
    SUCCEEDED,
    TRANSITIONS,
    IllegalTransition,
    check,
    retry_decision,
)

AGENT_STATES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "LOST", "UNSCHEDULABLE")
GIVE_UP = ("FAILED", "LOST", "UNSCHEDULABLE")


def view(state: str = DISPATCHED, attempt: int = 1, cluster: str | None = "onprem-a",
         max_retries: int = 2) -> JobView:
    return JobView(state=state, attempt=attempt, cluster=cluster, max_retries=max_retries)


# -- stale reports -----------------------------------------------------------------------------------

@pytest.mark.parametrize("agent_state", AGENT_STATES)
def test_a_report_for_another_attempt_is_stale_and_changes_nothing(agent_state):
    for attempt in (1, 3):  # older and newer than the live attempt 2
        outcome = on_report(view(attempt=2), "onprem-a", attempt, agent_state, "boom")
        assert outcome == Outcome(None, f"stale report for attempt {attempt} on onprem-a", agent_state, stale=True)


@pytest.mark.parametrize("agent_state", AGENT_STATES)
def test_a_report_from_another_cluster_is_stale_and_changes_nothing(agent_state):
    outcome = on_report(view(cluster="onprem-a"), "cloud-b", 1, agent_state, "")
    assert outcome == Outcome(None, "stale report for attempt 1 on cloud-b", agent_state, stale=True)
    outcome = on_report(view(state=QUEUED, cluster=None), "cloud-b", 1, agent_state, "")
    assert outcome.stale and outcome.to is None


@pytest.mark.parametrize("job_state", [QUEUED, SUCCEEDED, FAILED, CANCELLED])
@pytest.mark.parametrize("agent_state", AGENT_STATES)
def test_a_report_for_a_job_that_holds_no_attempt_is_stale_and_changes_nothing(job_state, agent_state):
    outcome = on_report(view(state=job_state), "onprem-a", 1, agent_state, "")
    assert outcome == Outcome(None, "stale report for attempt 1 on onprem-a", agent_state, stale=True)


# -- progress and success ----------------------------------------------------------------------------

@pytest.mark.parametrize("job_state", sorted(ACTIVE))
def test_pending_changes_nothing(job_state):
    outcome = on_report(view(state=job_state), "onprem-a", 1, "PENDING", "waiting for the gang")
    assert outcome == Outcome(None, "", DISPATCHED)
    assert not outcome.stale


def test_running_moves_a_dispatched_job_to_running_once():
    first = on_report(view(state=DISPATCHED), "onprem-a", 1, "RUNNING", "")
    assert first == Outcome(RUNNING, "running on onprem-a", RUNNING)
    again = on_report(view(state=RUNNING), "onprem-a", 1, "RUNNING", "")
    assert again == Outcome(None, "", RUNNING)
    assert not again.stale


@pytest.mark.parametrize("job_state", sorted(ACTIVE))
def test_succeeded_ends_the_job(job_state):
    outcome = on_report(view(state=job_state), "onprem-a", 1, "SUCCEEDED", "")
    assert outcome == Outcome(SUCCEEDED, "succeeded on onprem-a", SUCCEEDED)


# -- failure, loss, unschedulable: retry while the budget lasts ----------------------------------------

@pytest.mark.parametrize("agent_state, what", [
    ("FAILED", "attempt {n} failed on onprem-a"),
    ("LOST", "attempt {n} was lost on onprem-a"),
    ("UNSCHEDULABLE", "attempt {n} could not be scheduled on onprem-a"),
])
@pytest.mark.parametrize("job_state", sorted(ACTIVE))
def test_a_failed_attempt_is_retried_while_the_budget_lasts_then_the_job_fails(agent_state, what, job_state):
    reason = "exit code 3: out of memory"
    # max_retries=2: attempts 1 and 2 are retried, attempt 3 is the last one.
    for n in (1, 2):
        outcome = on_report(view(state=job_state, attempt=n, max_retries=2), "onprem-a", n, agent_state, reason)
        assert outcome == Outcome(QUEUED, f"{what.format(n=n)}: {reason}; retrying ({n} of 3 attempts used)",
                                  agent_state)
    outcome = on_report(view(state=job_state, attempt=3, max_retries=2), "onprem-a", 3, agent_state, reason)
    assert outcome == Outcome(FAILED, f"{what.format(n=3)}: {reason}", agent_state)


@pytest.mark.parametrize("agent_state", GIVE_UP)
def test_with_no_retries_the_first_failure_is_final(agent_state):
    outcome = on_report(view(attempt=1, max_retries=0), "onprem-a", 1, agent_state, "node went away")
    assert outcome.to == FAILED
    assert outcome.reason.endswith(": node went away")
    assert not outcome.stale


def test_a_failure_without_a_reason_still_says_what_happened():
    assert on_report(view(max_retries=0), "onprem-a", 1, "FAILED", "") == \
        Outcome(FAILED, "attempt 1 failed on onprem-a", "FAILED")
    assert on_report(view(max_retries=1), "onprem-a", 1, "LOST", "") == \
        Outcome(QUEUED, "attempt 1 was lost on onprem-a; retrying (1 of 2 attempts used)", "LOST")


def test_the_exit_code_alone_does_not_decide_success():
    assert on_report(view(), "onprem-a", 1, "SUCCEEDED", "", exit_code=0).to == SUCCEEDED
    assert on_report(view(), "onprem-a", 1, "FAILED", "exit 1", exit_code=1).to == QUEUED


@pytest.mark.parametrize("attempt, max_retries, retried", [
    (1, 0, False), (1, 1, True), (2, 1, False), (3, 3, True), (4, 3, False),
])
def test_retry_decision(attempt, max_retries, retried):
    assert retry_decision(attempt, max_retries) is retried


# -- unknown agent states ----------------------------------------------------------------------------

@pytest.mark.parametrize("agent_state", ["EXPLODED", "", "running"])
def test_an_unknown_agent_state_changes_nothing_and_is_named(agent_state):
    outcome = on_report(view(), "onprem-a", 1, agent_state, "?")
    assert outcome == Outcome(None, f"unknown agent state {agent_state!r}", agent_state, stale=True)


# -- every outcome is a legal transition -------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(job_state=st.sampled_from(STATES), job_attempt=st.integers(1, 5), max_retries=st.integers(0, 4),
       job_cluster=st.sampled_from(("a", "b", None)), cluster=st.sampled_from(("a", "b")),
       attempt=st.integers(1, 5), agent_state=st.sampled_from(AGENT_STATES + ("WEIRD",)),
       reason=st.sampled_from(("", "oom")))
def test_every_outcome_is_a_legal_transition_and_stale_means_unchanged(job_state, job_attempt, max_retries,
                                                                      job_cluster, cluster, attempt, agent_state,
                                                                      reason):
    job = JobView(job_state, job_attempt, job_cluster, max_retries)
    outcome = on_report(job, cluster, attempt, agent_state, reason)
    live = attempt == job_attempt and cluster == job_cluster and job_state in ACTIVE
    if not live:
        assert outcome.stale
    if outcome.stale:
        assert outcome.to is None
    if outcome.to is not None:
        assert live
        check(job_state, outcome.to)
        assert outcome.reason
        if outcome.to in (QUEUED, FAILED) and reason:
            assert reason in outcome.reason


# -- the state machine -------------------------------------------------------------------------------

ALLOWED = [(a, b) for a, targets in TRANSITIONS.items() for b in sorted(targets)]
FORBIDDEN = [(a, b) for a, b in itertools.product(STATES, STATES) if b not in TRANSITIONS[a]]


def test_the_table_covers_every_state_and_only_known_states():
    assert set(TRANSITIONS) == set(STATES)
    assert all(targets <= set(STATES) for targets in TRANSITIONS.values())
    assert FINAL <= set(STATES) and ACTIVE <= set(STATES) and not FINAL & ACTIVE


@pytest.mark.parametrize("from_state, to_state", ALLOWED)
def test_every_listed_transition_passes(from_state, to_state):
    check(from_state, to_state)


@pytest.mark.parametrize("from_state, to_state", FORBIDDEN)
def test_every_other_pair_is_illegal(from_state, to_state):
    with pytest.raises(IllegalTransition, match=f"from {from_state} to {to_state}"):
        check(from_state, to_state)


@pytest.mark.parametrize("from_state, to_state", [("NOPE", QUEUED), (QUEUED, "NOPE"), ("", "")])
def test_unknown_states_are_illegal(from_state, to_state):
    with pytest.raises(IllegalTransition):
        check(from_state, to_state)


@pytest.mark.parametrize("final", sorted(FINAL))
def test_final_states_have_no_exits(final):
    assert TRANSITIONS[final] == frozenset()
    for to_state in STATES:
        with pytest.raises(IllegalTransition):
            check(final, to_state)


def test_the_lifecycle_the_design_describes_is_allowed():
    for path in ([QUEUED, DISPATCHED, RUNNING, SUCCEEDED], [QUEUED, DISPATCHED, RUNNING, FAILED],
                 [QUEUED, DISPATCHED, RUNNING, QUEUED, DISPATCHED, QUEUED, CANCELLED], [QUEUED, CANCELLED],
                 [QUEUED, DISPATCHED, SUCCEEDED]):
        for a, b in itertools.pairwise(path):
            check(a, b)


def test_an_illegal_transition_is_a_value_error():
    assert issubclass(IllegalTransition, ValueError)
