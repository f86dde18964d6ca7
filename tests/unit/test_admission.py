"""The limits streams meet (dispatcher/api/admission.py) and the batching of many streams' blocking work
(dispatcher/api/asynchronous.py), on a real event loop and executor."""
import asyncio
import threading
import time

import pytest

from dispatcher.api.admission import AdmissionRate, AgentsFirst, StreamLimits
from dispatcher.api.asynchronous import Coalescer, Rerun
from dispatcher.errors import ResourceExhausted, StoreUnavailable


def test_stream_limits_count_per_user_and_in_all_and_free_a_place_when_one_closes():
    limits = StreamLimits("watch streams", per_user=2, total=3)
    with limits.admitted("ann"), limits.admitted("ann"):
        with pytest.raises(ResourceExhausted, match="ann has 2 open, the most one user may have"):
            with limits.admitted("ann"):
                pass
        with limits.admitted("bob"):
            with pytest.raises(ResourceExhausted, match="all 3 this dispatcher allows are open"):
                with limits.admitted("cat"):
                    pass
            assert limits.open() == 3
        with limits.admitted("cat"):
            assert limits.open() == 3
    assert limits.open() == 0
    unlimited = StreamLimits("watch streams", per_user=0, total=0)
    with unlimited.admitted("ann"), unlimited.admitted("ann"), unlimited.admitted("ann"):
        assert unlimited.open() == 3


def test_admission_rate_lets_a_burst_through_then_spaces_the_rest_and_refuses_past_the_wait():
    async def run() -> tuple[list[float], int]:
        rate = AdmissionRate("agent links", per_s=20, burst=5, max_wait_s=0.3)
        began, at, refused = time.monotonic(), [], 0

        async def one() -> None:
            nonlocal refused
            try:
                await rate.admit()
                at.append(time.monotonic() - began)
            except ResourceExhausted as exc:
                assert "admits 20 a second" in str(exc)
                refused += 1
        await asyncio.gather(*(one() for _ in range(30)))
        return sorted(at), refused
    at, refused = asyncio.run(run())
    # 5 at once, then one every 50 ms for up to 300 ms of waiting: 5 + 6 admitted, the other 19 refused
    assert len(at) == 11 and refused == 19
    assert all(t < 0.05 for t in at[:5]) and at[-1] >= 0.25


def test_watches_wait_while_agents_connect_and_a_quiet_second_after_then_go_on_or_at_their_bound():
    async def run() -> dict[str, float]:
        first = AgentsFirst(max_wait_s=5)
        began, at = time.monotonic(), {}

        async def watch(name: str) -> None:
            await first.wait()
            at[name] = time.monotonic() - began

        await watch("before any agent")
        with first.connecting():
            waiting = asyncio.create_task(watch("while one connects"))
            await asyncio.sleep(0.3)
            with first.connecting():  # a second agent overlaps the first
                await asyncio.sleep(0.3)
        await asyncio.sleep(0.5)
        with first.connecting():  # and one more inside the quiet second: the quiet starts again after it
            await asyncio.sleep(0.1)
        await waiting
        await watch("long after")
        bounded = AgentsFirst(max_wait_s=0.5)
        with bounded.connecting():  # an agent that never finishes its hello holds a watch up to the bound only
            began = time.monotonic()
            await bounded.wait()
            at["bounded"] = time.monotonic() - began
        unbounded = AgentsFirst(max_wait_s=0)
        with unbounded.connecting():
            began = time.monotonic()
            await unbounded.wait()
            at["no wait"] = time.monotonic() - began
        at["waited"] = first.waited
        return at
    at = asyncio.run(run())
    assert at["before any agent"] < 0.05
    # the last agent welcomed at about 1.2 s, then a quiet second
    assert 2.1 <= at["while one connects"] < 3.0, at
    assert at["long after"] - at["while one connects"] < 0.05 and at["waited"] == 1
    assert 0.45 <= at["bounded"] < 0.8 and at["no wait"] < 0.05


def test_a_coalescer_does_what_waits_together_in_one_flush_and_a_bad_item_fails_alone():
    flushes: list[list[int]] = []
    gate = threading.Event()

    def flush(items: list[int]) -> list[int]:
        gate.wait(5)
        flushes.append(items)
        if -1 in items:
            raise ValueError("no negative items")
        return [i * 10 for i in items]

    async def run():
        coalescer = Coalescer(flush)
        first = asyncio.create_task(coalescer(1))
        await asyncio.sleep(0.05)  # the first flush is under way (held at the gate); these wait for the next
        rest = [asyncio.create_task(coalescer(i)) for i in (2, 3, -1, 4)]
        await asyncio.sleep(0.05)
        gate.set()
        results = await asyncio.gather(first, *rest, return_exceptions=True)
        return results
    results = asyncio.run(run())
    assert results[:3] == [10, 20, 30] and isinstance(results[3], ValueError) and results[4] == 40
    assert flushes[0] == [1] and flushes[1] == [2, 3, -1, 4]  # then one by one: [2], [3], [-1], [4]
    assert flushes[2:] == [[2], [3], [-1], [4]]


def test_an_exception_a_flush_returns_for_one_item_is_raised_in_that_items_caller_only():
    flushes: list[list[int]] = []

    def flush(items: list[int]) -> list:
        flushes.append(items)
        return [ValueError(f"item {i}") if i < 0 else i * 10 for i in items]

    async def run():
        coalescer = Coalescer(flush)
        return await asyncio.gather(*(coalescer(i) for i in (1, -2, 3)), return_exceptions=True)
    results = asyncio.run(run())
    assert results[0] == 10 and results[2] == 30 and str(results[1]) == "item -2"
    assert flushes == [[1, -2, 3]]  # one flush, and no retry one by one: nothing raised


def test_coalescer_store_unreachable_fails_the_whole_batch_at_once(caplog):
    """Every item would meet an unreachable store alike: no retry one by one, and no traceback in the log."""
    flushes: list[list[int]] = []
    gate = threading.Event()

    def flush(items: list[int]) -> list[int]:
        gate.wait(5)
        flushes.append(items)
        if len(flushes) > 1:
            raise StoreUnavailable("the database is unreachable; try again shortly")
        return items

    async def run():
        coalescer = Coalescer(flush)
        first = asyncio.create_task(coalescer(1))
        await asyncio.sleep(0.05)
        rest = [asyncio.create_task(coalescer(i)) for i in (2, 3, 4)]
        await asyncio.sleep(0.05)
        gate.set()
        return await asyncio.gather(first, *rest, return_exceptions=True)
    results = asyncio.run(run())
    assert results[0] == 1 and all(isinstance(r, StoreUnavailable) for r in results[1:])
    assert flushes == [[1], [2, 3, 4]]
    assert "Traceback" not in caplog.text and not caplog.records


def test_asks_made_while_a_rerun_runs_are_answered_by_one_more_run():
    runs: list[int] = []
    gate, started = threading.Event(), threading.Event()

    def fn() -> None:
        runs.append(len(runs) + 1)
        started.set()
        gate.wait(5)
    rerun = Rerun(fn, name="test-rerun")
    rerun.ask()
    assert started.wait(5)
    for _ in range(1000):  # a burst while the first run is under way
        rerun.ask()
    gate.set()
    deadline = time.monotonic() + 5
    while (rerun._running or len(runs) < 2) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runs == [1, 2] and not rerun._running
    rerun.ask()  # idle again: a new ask runs at once
    while len(runs) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runs == [1, 2, 3]
