"""Parking: the queues a cycle may leave out while nothing they depend on changes."""
from __future__ import annotations

import math
import threading

from dispatcher.policy.plans import PREEMPTION_HOLD_S, Candidate, ClassPolicy, Hold
from dispatcher.wakes import ROOM, order_key, parse_wake


class Parking:
    """The queues a cycle may leave out, kept by the leader between cycles (as it keeps PolicyConfig).

    After a cycle that started nothing (no dispatch, no preemption, no hold made, moved or given up, no
    burst to weigh, no head avoiding a cluster) and wrote its reasons, each head it planned stays unable
    to start until one of that cycle's inputs changes: the policy documents (their digest), a cluster's
    usable capacity or state, a queue's usage (what runs there, and how many jobs), the burst spend; or
    until time alone could change a verdict (a head reaching its class's reservation time, a preemption
    hold expiring). Until then its queues are parked: a cycle plans only the queues a wake-up named
    since (a submit or a cancel names its queue), or every queue while room is held (a hold is kept by
    the cycle that plans its job's queue, so none is left out). A wake-up naming no queue, or the
    listener reconnecting, has every queue planned again. A parked queue costs a cycle nothing and keeps
    the reasons last written for its jobs.

    A submit's wake-up also gives the queue order of its best new job (wakes.submit_wake). When the
    parking cycle read a parked queue's heads to the limit (more may wait behind them) and
    the new job comes after the last head it read, the heads a cycle would read are the same ones and
    the submit changes nothing: it wakes no cycle (`touch` returns False). Such a submit is kept until
    the next settle, which has the queue planned after all when its heads changed meanwhile and the job
    is no longer behind them (`rewake`).

    `touch` runs on the notifier's thread; the rest on the scheduler's.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dirty: set[str] | None = None  # queues to plan again; None: every queue
        self.inputs: tuple | None = None  # the inputs' parking key under which the parked queues' heads could not start
        self.until = math.inf  # epoch seconds: when a parked head's verdict may change by itself
        self.waiting: dict[str, int] = {}  # per parked queue, how many of its heads wait
        # Per parked queue whose heads were read to the limit, its last head's order key (wakes.order_key).
        self._last: dict[str, tuple[int, int, int]] = {}
        self._behind: dict[str, tuple[int, int, int]] = {}  # per queue, the best submit let pass since the last settle
        self._rewake = False

    def touch(self, payload: str = "") -> bool:
        """Plan a queue in the next cycle: a queue's name, optionally with the order of a submit's best
        new job (wakes.submit_wake); every queue when "". ROOM names no queue: what changed (a
        cluster's capacity, a queue's usage) is among the inputs `only` compares. False: a submit behind
        a parked queue's heads, which needs no cycle."""
        if payload == ROOM:
            return True
        return self._touch(*parse_wake(payload))

    def submitted(self, queue: str, class_priority: int, priority: int, job_id: int) -> bool:
        """touch for a job submitted to `queue` (the wake-up wakes.submit_wake makes of it)."""
        return self._touch(queue, order_key(class_priority, priority, job_id))

    def _touch(self, queue: str, key: tuple[int, int, int] | None) -> bool:
        with self._lock:
            if not queue:
                self._dirty = None
            elif self._dirty is not None:
                last = self._last.get(queue)
                if key is not None and last is not None and key > last:
                    self._behind[queue] = min(key, self._behind.get(queue, key))
                    return False
                self._dirty.add(queue)
        return True

    def rewake(self) -> bool:
        """Whether the last settle has queues planned again for submits it had let pass (the caller then
        runs a cycle for them); asked once."""
        with self._lock:
            rewake, self._rewake = self._rewake, False
            return rewake

    def take(self) -> set[str] | None:
        """The queues touched since the last take (None: every queue), forgotten by this take."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            return dirty

    def plans_all(self, dirty: set[str] | None, now: float) -> bool:
        """Whether the cycle will plan every queue whatever its inputs turn out to be (only() is then None)."""
        return dirty is None or self.inputs is None or now >= self.until

    def only(self, dirty: set[str] | None, inputs: tuple, now: float) -> list[str] | None:
        """The queues this cycle must plan: those touched, when the parked ones may stay parked; else None
        (every queue)."""
        if self.plans_all(dirty, now) or inputs != self.inputs:
            return None
        return sorted(dirty)

    def settle(self, inputs: tuple, only: list[str] | None, heads: dict[str, list[Candidate]], waits: dict[int, str],
               quiet: bool, reasons_written: bool, classes: dict[str, ClassPolicy], now: float,
               full: set[str] = frozenset(), holds: dict[int, Hold] | None = None) -> int:
        """Take a cycle's outcome (`only`: the queues it was limited to, None for all; `full`: the queues
        it read to their limit, more may wait behind them; `holds`: those it kept, under which a quiet
        cycle's verdicts stand until a preemption hold expires); returns how many heads wait, those of
        parked queues included."""
        if not quiet or (only is None and not reasons_written):
            self.inputs, self.waiting, self.until = None, {}, math.inf
            with self._lock:
                self._last = {}
                self._settle_behind()
            return len(waits)
        with self._lock:
            if only is None:
                self.waiting, self.until, self._last = {}, math.inf, {}
            for queue in only or ():
                self.waiting.pop(queue, None)
                self._last.pop(queue, None)
                if not reasons_written and self._dirty is not None:  # their new reasons are not written
                    self._dirty.add(queue)  # yet: plan them again when they are
            for hold in (holds or {}).values():
                if hold.kind == "preemption":
                    self.until = min(self.until, hold.since + PREEMPTION_HOLD_S)
            for queue, candidates in heads.items():
                self.waiting[queue] = len(candidates)  # a quiet cycle placed none of them
                if queue in full:
                    last = candidates[-1]
                    self._last[queue] = order_key(last.class_priority, last.priority, last.job.id)
                for c in candidates:
                    cls = classes.get(c.service_class)
                    if cls is not None and cls.reservation_after_s is not None and c.waited_s < cls.reservation_after_s:
                        self.until = min(self.until, now + cls.reservation_after_s - c.waited_s)
            self._settle_behind()
        self.inputs = inputs
        return sum(self.waiting.values())

    def _settle_behind(self) -> None:
        """The submits let pass since the last settle, against the heads now parked (under the lock): a
        queue whose best one is not behind its last head any more is planned again."""
        for queue, key in self._behind.items():
            last = self._last.get(queue)
            if last is None or key < last:
                if self._dirty is not None:
                    self._dirty.add(queue)
                self._rewake = True
        self._behind = {}


