"""How far apart the event feed's reads are, which is how often every watch sends (api/event_feed.Pacing)."""
from __future__ import annotations

from dispatcher.api.event_feed import Pacing


def test_reads_are_spaced_a_millisecond_per_watch_up_to_a_second():
    pacing = Pacing()
    assert [pacing.pause(n) for n in (1, 200, 1000, 5000)] == [0.001, 0.2, 1.0, 1.0]


def test_while_the_loop_runs_late_the_pause_doubles_up_to_its_bounds_and_halves_back_once_it_keeps_time():
    pacing = Pacing()
    pauses = []
    for late_s in (0.2, 0.2, 0.2, 0.2, 0.2, 0.01, 0.01, 0.01, 0.01):
        pauses.append(pacing.pause(1000))
        pacing.ended(pauses[-1], late_s)
    assert pauses == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 2.5, 1.25, 1.0]
    few = Pacing()  # a few watches: longer pauses would spare the loop little and delay their events
    for _ in range(10):
        few.ended(few.pause(10), late_s=1.0)
    assert few.pause(10) == 0.05
