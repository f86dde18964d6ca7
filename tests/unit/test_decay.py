"""Decayed usage (policy/decay.py): the closed form of one run and the accumulator a simulation advances
event by event agree, and a queue that always used the same amount remembers that amount."""
from __future__ import annotations

import math
import random

import pytest

from dispatcher.policy.decay import DecayedUsage, decayed_run

H = 3600.0


def test_a_run_that_ended_long_ago_is_forgotten_and_one_running_for_ever_tends_to_its_rate():
    assert decayed_run({"cpu": 1000}, 0.0, 10.0, now=100 * H, half_life_s=H) == pytest.approx({"cpu": 0.0})
    forever = decayed_run({"cpu": 1000}, -1000 * H, None, now=0.0, half_life_s=H)
    assert forever["cpu"] == pytest.approx(1000 * H / math.log(2))


def test_a_run_seen_one_half_life_later_counts_half():
    ended = decayed_run({"cpu": 2000}, 0.0, 60.0, now=60.0, half_life_s=H)
    later = decayed_run({"cpu": 2000}, 0.0, 60.0, now=60.0 + H, half_life_s=H)
    assert later["cpu"] == pytest.approx(ended["cpu"] / 2)
    assert ended["cpu"] == pytest.approx(2000 * 60, rel=0.01)  # fresh, it is nearly the plain resource-seconds


def test_a_run_not_started_yet_counts_nothing():
    assert decayed_run({"cpu": 1000}, 50.0, None, now=10.0, half_life_s=H) == {"cpu": 0.0}


def test_the_half_life_must_be_positive():
    with pytest.raises(ValueError, match="half_life_s must be greater than 0"):
        decayed_run({"cpu": 1}, 0.0, 1.0, now=2.0, half_life_s=0.0)
    with pytest.raises(ValueError, match="half_life_s must be greater than 0"):
        DecayedUsage(-1.0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_accumulator_advanced_event_by_event_agrees_with_the_closed_form(seed):
    rnd = random.Random(seed)
    half_life = rnd.choice((600.0, H, 6 * H))
    runs = []  # (queue, requests, start, end)
    for _ in range(40):
        start = rnd.uniform(0, 20 * H)
        end = start + rnd.uniform(1, 3 * H) if rnd.random() < 0.8 else None
        runs.append((rnd.choice("abc"), {"cpu": rnd.randrange(1, 8) * 1000, "memory": rnd.randrange(0, 4) * 2**30},
                     start, end))
    now = 21 * H
    times = sorted({0.0, now} | {t for _, _, s, e in runs for t in (s, e) if t is not None and t <= now})
    acc = DecayedUsage(half_life)
    for before, after in zip(times, times[1:]):
        running: dict[str, dict[str, int]] = {}
        for queue, requests, start, end in runs:
            if start <= before and (end is None or end >= after):
                held = running.setdefault(queue, {})
                for r, v in requests.items():
                    held[r] = held.get(r, 0) + v
        acc.advance(after, running)
    for queue in "abc":
        expected: dict[str, float] = {}
        for q, requests, start, end in runs:
            if q == queue:
                for r, v in decayed_run(requests, start, end, now=now, half_life_s=half_life).items():
                    expected[r] = expected.get(r, 0.0) + v
        got = acc.value(queue)
        assert set(got) <= set(expected) | {"cpu", "memory"}
        for r, v in expected.items():
            assert got.get(r, 0.0) == pytest.approx(v, rel=1e-9, abs=1e-6), (queue, r)
    assert acc.value("nobody") == {}


def test_the_accumulator_moves_only_forward():
    acc = DecayedUsage(H)
    acc.advance(10.0, {})
    with pytest.raises(ValueError, match="moves only forward"):
        acc.advance(5.0, {})
