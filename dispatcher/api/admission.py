"""Limits on what streams may take, so that many of them slow down or are refused rather than stop the
dispatcher: open watch streams per user and in all, and the rate at which agents are admitted (a
restarted dispatcher is redialled by every agent at once)."""
from __future__ import annotations

import asyncio
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
