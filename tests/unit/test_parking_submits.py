"""scheduler.Parking and the order a submit's wake-up gives (wakes.submit_wake): a submit behind
the heads a parked queue was read to needs no cycle; one ahead of them does; and one let pass while a
cycle ran is planned after all when that cycle's heads end before it."""
from __future__ import annotations

from dispatcher.policy.placing import QueuedJob
from dispatcher.policy.plans import PREEMPTION_HOLD_S, Candidate, Hold
from dispatcher.scheduler.parking import Parking
from dispatcher.wakes import ROOM, submit_wake

INPUTS = ("digest", (), {}, {})
PER_QUEUE = 4


def head(job_id: int, priority: int = 5, class_priority: int = 500) -> Candidate:
    return Candidate(QueuedJob(job_id, {"cpu": 1000}, {"cpu": 1000}), "q", "standard", class_priority, priority)


def parked(heads: list[Candidate], only: list[str] | None = None) -> Parking:
    parking = Parking()
    assert parking.take() is None  # a first cycle plans every queue
    settle(parking, heads, only)
    assert parking.take() == set()
    return parking


def settle(parking: Parking, heads: list[Candidate], only: list[str] | None = None) -> None:
    parking.settle(INPUTS, only, {"q": heads} if heads else {}, {c.job.id: "waits" for c in heads}, quiet=True,
                   reasons_written=True, classes={}, now=0.0, full={"q"} if len(heads) >= PER_QUEUE else set())


def test_a_submit_behind_the_last_head_read_needs_no_cycle():
    parking = parked([head(1), head(2), head(3), head(4)])
    assert parking.touch(submit_wake("q", 500, 5, 9)) is False  # same class and priority, later
    assert parking.touch(submit_wake("q", 500, 4, 2)) is False  # lower priority
    assert parking.touch(submit_wake("q", 100, 9, 2)) is False  # lower class
    assert parking.take() == set()
    assert parking.rewake() is False


def test_a_submit_ahead_of_the_last_head_is_planned():
    for ahead in (submit_wake("q", 500, 5, 3), submit_wake("q", 500, 6, 99), submit_wake("q", 900, 0, 99)):
        parking = parked([head(1), head(2), head(4), head(5)])
        assert parking.touch(ahead) is True
        assert parking.take() == {"q"}


def test_a_queue_read_short_of_the_limit_plans_every_submit():
    parking = parked([head(1), head(2), head(3)])  # its whole backlog was read: a new job is among the heads
    assert parking.touch(submit_wake("q", 100, 0, 99)) is True
    assert parking.take() == {"q"}


def test_other_wake_ups_are_as_before():
    parking = parked([head(1), head(2), head(3), head(4)])
    assert parking.touch("q") is True and parking.take() == {"q"}  # a cancel, a job back in its queue
    assert parking.touch(ROOM) is True and parking.take() == set()
    assert parking.touch("") is True  # anything: every queue
    assert parking.touch(submit_wake("q", 500, 0, 99)) is True  # every queue is to be planned anyway
    assert parking.take() is None


def test_a_submit_let_pass_is_planned_when_the_next_heads_end_before_it():
    parking = parked([head(1), head(2), head(3), head(4)])
    assert parking.touch(submit_wake("q", 500, 3, 20)) is False  # behind head 4 (priority 5)
    # A cycle that had read the queue before that job committed (a cancel touched it) parks heads
    # ending with one of priority 0: the job let pass now belongs among them.
    settle(parking, [head(1), head(3), head(4), head(5, priority=0)], only=["q"])
    assert parking.rewake() is True and parking.rewake() is False
    assert parking.take() == {"q"}


def test_a_submit_let_pass_stays_passed_when_the_heads_still_come_first():
    parking = parked([head(1), head(2), head(3), head(4)])
    assert parking.touch(submit_wake("q", 500, 3, 20)) is False
    settle(parking, [head(1), head(2), head(3), head(6)], only=["q"])  # another job ahead of it joined
    assert parking.rewake() is False and parking.take() == set()


def test_a_cycle_that_starts_something_unparks_and_replans_what_was_let_pass():
    parking = parked([head(1), head(2), head(3), head(4)])
    assert parking.touch(submit_wake("q", 500, 0, 20)) is False
    parking.settle(INPUTS, ["q"], {"q": [head(1)]}, {}, quiet=False, reasons_written=True, classes={}, now=0.0,
                   full=set())
    assert parking.rewake() is True  # the next cycle plans every queue (nothing is parked)
    assert parking.touch(submit_wake("q", 500, 0, 21)) is True


def test_a_wake_up_whose_order_cannot_be_read_plans_its_queue():
    for payload in ("q 500 5", "q 500 5 9 1", "q five 5 9", "q 500 5 9.5", "q  "):
        parking = parked([head(1), head(2), head(3), head(4)])
        assert parking.touch(payload) is True
        assert parking.take() == {"q"}


def test_held_room_kept_as_it_was_still_parks_and_a_preemption_hold_unparks_when_it_expires():
    parking = Parking()
    parking.take()
    hold = Hold(1, "c1", {"cpu": 1000}, "preemption", since=100.0, victims=(7,))
    parking.settle(INPUTS, None, {"q": [head(1), head(2), head(3), head(4)]}, {}, quiet=True,
                   reasons_written=True, classes={}, now=110.0, full={"q"}, holds={1: hold})
    assert parking.touch(submit_wake("q", 500, 5, 9)) is False  # behind the heads: no cycle
    assert not parking.plans_all(parking.take(), 100.0 + PREEMPTION_HOLD_S - 1)
    assert parking.plans_all(set(), 100.0 + PREEMPTION_HOLD_S)  # the hold lapses: its room is everyone's again
