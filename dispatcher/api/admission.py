"""Limits on what streams may take, so that many of them slow down or are refused rather than stop the
dispatcher: open watch streams per user and in all, and the rate at which agents are admitted (a
restarted dispatcher is redialled by every agent at once)."""
from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import Counter
from contextlib import contextmanager

from dispatcher.errors import ResourceExhausted


class StreamLimits:
    """At most `per_user` streams open for one subject and `total` for everyone; one more is refused with
    ResourceExhausted, saying which limit it met and ending with `advice`. 0 is no limit. What is open, and
    how many were refused by each limit ("total", "per_user"), are counted for /metrics."""

    def __init__(self, what: str, *, per_user: int, total: int, advice: str = "try again later"):
        self._what = what
        self.per_user = per_user
        self.total = total
        self._advice = advice
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.refused: Counter[str] = Counter()

    @contextmanager
    def admitted(self, subject: str):
        with self._lock:
            if self.total and sum(self._open.values()) >= self.total:
                self.refused["total"] += 1
                raise ResourceExhausted(f"{self._what}: all {self.total} this dispatcher allows are open; "
                                        f"{self._advice}")
            if self.per_user and self._open[subject] >= self.per_user:
                self.refused["per_user"] += 1
                raise ResourceExhausted(f"{self._what}: {subject} has {self.per_user} open, the most one user may "
                                        "have; close one first")
            self._open[subject] += 1
        try:
            yield
        finally:
            with self._lock:
                self._open[subject] -= 1
                if not self._open[subject]:
                    del self._open[subject]

    def open(self) -> int:
        with self._lock:
            return sum(self._open.values())


class AdmissionRate:
    """At most `per_s` admissions a second after a burst of `burst` (the generic cell rate algorithm). A
    caller waits for its turn; one whose turn is more than `max_wait_s` away is refused with
    ResourceExhausted (an agent then redials after its jittered backoff), and counted in `refused`. per_s 0:
    no limit."""

    def __init__(self, what: str, *, per_s: float, burst: int, max_wait_s: float):
        self._what = what
        self._per_s = per_s
        self._tolerance = (max(burst, 1) - 1) / per_s if per_s else 0.0
        self._max_wait_s = max_wait_s
        self._due = 0.0  # the time at which the next admission would be on schedule
        self.refused = 0

    async def admit(self) -> None:
        if not self._per_s:
            return
        now = time.monotonic()
        due = max(self._due, now)
        wait = due - self._tolerance - now
        if wait > self._max_wait_s:
            self.refused += 1
            raise ResourceExhausted(f"{self._what}: the dispatcher admits {self._per_s:g} a second and is "
                                    f"{wait:.0f} s behind; try again later")
        self._due = due + 1 / self._per_s
        if wait > 0:
            await asyncio.sleep(wait)


class AgentsFirst:
    """While agents are connecting, a watch that opens waits (up to `max_wait_s`) before it reads anything.
    After a restart every agent and every watch redial at once, and on a busy event loop the watches' catch-up
    took as much of it as the agents' hellos, holding a thousand agents' jobs up by as long again; a watch only
    reports what the agents do. Agents count as connecting from their call's arrival to their welcome, and until
    QUIET_S after the last one: a storm spread by the agents' jittered backoff has gaps. max_wait_s 0: no wait.
    Everything here runs on the event loop."""

    QUIET_S = 1.0

    def __init__(self, *, max_wait_s: float):
        self.max_wait_s = max_wait_s
        self._connecting = 0
        self._last = -math.inf  # when the last agent stopped connecting (time.monotonic)
        self._quiet: asyncio.Event | None = None  # set while no agent connects; made on the loop, when first needed
        self.waited = 0  # watches that waited, for /metrics

    @contextmanager
    def connecting(self):
        self._connecting += 1
        if self._quiet is not None:
            self._quiet.clear()
        try:
            yield
        finally:
            self._connecting -= 1
            self._last = time.monotonic()
            if not self._connecting and self._quiet is not None:
                asyncio.get_running_loop().call_later(self.QUIET_S, self._settle)

    @property
    def connecting_now(self) -> int:
        return self._connecting

    def _settle(self) -> None:
        if not self._connecting and time.monotonic() - self._last >= self.QUIET_S - 0.01:
            self._quiet.set()

    async def wait(self) -> None:
        """Return once no agent has been connecting for QUIET_S, or after max_wait_s."""
        if not self.max_wait_s or (not self._connecting and time.monotonic() - self._last >= self.QUIET_S):
            return
        if self._quiet is None:
            self._quiet = asyncio.Event()
            if not self._connecting:
                asyncio.get_running_loop().call_later(self.QUIET_S, self._settle)
        self.waited += 1
        try:
            async with asyncio.timeout(self.max_wait_s):
                await self._quiet.wait()
        except TimeoutError:
            pass  # agents still connecting after so long: the watch reads anyway
