"""The scheduling loop: run by exactly one dispatcher replica at a time (the leader).

Leadership is a Postgres session advisory lock held on a dedicated connection (store.leader): when the
leader dies, its connection closes, the lock is released and another replica takes it within
`leader_retry_s`. New work and freed capacity wake the loop through NOTIFY; the timeout is only a safety
net. Each cycle is scheduler.postgres_cycle.run_cycle.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from dispatcher import wakes
from dispatcher.errors import StoreUnavailable
from dispatcher.metrics import DispatcherMetrics
from dispatcher.policy.plans import Hold
from dispatcher.scheduler.mapping import PolicyConfig
from dispatcher.scheduler.parking import Parking
from dispatcher.scheduler.postgres_cycle import LEADER_LOCK, LostLeadership, run_cycle
from dispatcher.scheduler.settings import SchedulerSettings
from dispatcher.scheduler.takeover import Takeover
from dispatcher.services import recurring, sessions, waiting
from dispatcher.store import channels, submit_keys
from dispatcher.store import outbox as outbox_store
from dispatcher.store.leader import LeaderLock
from dispatcher.store.listening import Notifier

if TYPE_CHECKING:
    from dispatcher.store.database import Engine, Sessions

log = logging.getLogger(__name__)


class Scheduler:
    """Runs cycles while this process holds the leader lock.

    on_leadership(True) is called, on the scheduler thread, right after the lock is taken and before the
    first cycle; on_leadership(False) when leading ends for any reason (lost lock, error, stop). Work
    that only the leader should do (the Prometheus refresher) is started and stopped there.
    """

    def __init__(self, engine: Engine, sessions: Sessions, notifier: Notifier, settings: SchedulerSettings,
                 metrics: DispatcherMetrics | None = None,
                 on_leadership: Callable[[bool], None] | None = None):
        self._engine = engine
        self._metrics = metrics
        self._on_leadership = on_leadership
        self._sessions = sessions
        self._settings = settings
        self._wake = threading.Event()  # any wake-up since the last cycle began
        self._work = threading.Event()  # one other than ROOM (see wakes.ROOM) since the last cycle began
        self._stop = threading.Event()
        self.is_leader = threading.Event()
        self._holds: dict[int, Hold] = {}  # reservations and preemption holds, kept between cycles
        self._deeper: frozenset[str] = frozenset()  # queues the next cycle reads deeper (CycleResult.deeper)
        self._config = PolicyConfig()
        self._parking = Parking()
        notifier.subscribe(channels.WAKE_CHANNEL, self._woken)
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)

    def _woken(self, payload: str) -> None:
        if not self._parking.touch(payload):  # a queue's name (with a submit's order), ROOM, or "" for anything
            return  # a submit behind a parked queue's heads: no cycle would read it
        if payload != wakes.ROOM:
            self._work.set()
        self._wake.set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(10)

    def _run(self) -> None:
        waiting = False  # for the database to come back: said once, not at every try
        while not self._stop.is_set():
            try:
                with LeaderLock(self._engine, LEADER_LOCK, self._settings.leader_keepalive_s) as lock:
                    while not self._stop.is_set():
                        if lock.try_take():
                            break
                        self._stop.wait(self._settings.leader_retry_s)
                    else:
                        return
                    # The term begins with the lock: an agent heard from once the lock is held is back.
                    takeover = Takeover(datetime.now(UTC), self._settings)
                    waiting = False
                    log.info("became the scheduling leader", extra={"backend_pid": lock.backend_pid})
                    # An earlier term's holds and depths (on this replica) describe a past others moved on from.
                    self._holds, self._deeper = {}, frozenset()
                    self._config = PolicyConfig()
                    self._parking = Parking()
                    self.is_leader.set()
                    self._leadership(True)
                    try:
                        self._lead(lock, takeover)
                    finally:
                        self.is_leader.clear()
                        self._leadership(False)
            except LostLeadership:
                log.warning("lost the leader lock; following again")
            except StoreUnavailable:
                if not waiting:
                    log.warning("scheduler: the database is unreachable; trying again every second")
                waiting = True
                self._stop.wait(1.0)
            except Exception:
                log.exception("scheduler failed; retrying")
                self._stop.wait(1.0)

    def _prune_outbox(self) -> None:
        """Delete the outbox's old commands, then old submit keys, in a short transaction of its own."""
        def prune() -> None:
            with self._sessions.begin() as session:
                pruned = outbox_store.prune(session, self._settings.outbox_retention_s,
                                            self._settings.outbox_prune_limit)
                keys = submit_keys.prune(session, self._settings.submit_key_retention_s,
                                         self._settings.submit_key_prune_limit)
            if pruned or keys:
                log.info("outbox pruned", extra={"commands": pruned, "submit_keys": keys})
        self._between_cycles("prune", prune)

    def _between_cycles(self, what: str, work: Callable[[], object]) -> object | None:
        """Leader work between cycles, in short transactions of its own; a failure is logged and the work is
        tried again at its next turn."""
        try:
            return work()
        except StoreUnavailable:
            raise  # the cycle's own store is gone too: the loop waits for it
        except Exception:
            log.exception("leader work between cycles failed", extra={"work": what})
            return None

    def _release_waiting(self) -> None:
        """Queue the waiting jobs whose time, dependencies or array slot came (services.waiting), and end
        the interactive sessions idle past their timeout (services.sessions)."""
        def release() -> int:
            now = datetime.now(UTC)
            with self._sessions.begin() as session:
                queued = waiting.release(session, now).queued
            with self._sessions.begin() as session:
                sessions.end_idle(session, now)
            return queued
        if self._between_cycles("release", release):
            self._work.set()
            self._wake.set()

    def _fire_schedules(self) -> None:
        """Start the runs of schedules that are due (services.recurring.fire_due), each schedule in a short
        transaction of its own."""
        started = self._between_cycles("schedules", lambda: recurring.fire_due(self._sessions, datetime.now(UTC)))
        if started:
            log.debug("schedules fired", extra={"started": started})

    def _leadership(self, leading: bool) -> None:
        if self._metrics is not None:
            self._metrics.leader.set(1 if leading else 0)
        if self._on_leadership is not None:
            try:
                self._on_leadership(leading)
            except Exception:  # leader-only side work must not stop scheduling (or keep a dead term alive)
                log.exception("leadership callback failed", extra={"leading": leading})

    def _lead(self, lock: LeaderLock, takeover: Takeover) -> None:
        settings = self._settings
        reasons_at = 0.0
        due_at = {"release": 0.0, "schedules": 0.0, "prune": time.monotonic() + settings.outbox_prune_interval_s}

        def between_cycles() -> float:
            """The leader's other work that is due (waiting jobs, schedules, outbox pruning), without a cycle;
            when the next is due (monotonic seconds)."""
            for work, every, run in (("release", settings.release_interval_s, self._release_waiting),
                                     ("schedules", settings.schedule_interval_s, self._fire_schedules),
                                     ("prune", settings.outbox_prune_interval_s, self._prune_outbox)):
                if time.monotonic() >= due_at[work]:
                    due_at[work] = time.monotonic() + every
                    run()
            return min(due_at.values())

        refill: frozenset[str] = frozenset()  # what a rerun for `more` alone plans (CycleResult.refill)
        while not self._stop.is_set():
            if self._wake.is_set():  # something changed since the last cycle: it may concern any queue
                refill = frozenset()
            self._wake.clear()
            self._work.clear()
            write_reasons = time.monotonic() - reasons_at >= settings.reason_interval_s
            if write_reasons:
                reasons_at = time.monotonic()
            result = run_cycle(self._sessions, settings, datetime.now(UTC), holds=self._holds,
                               write_reasons=write_reasons, leader_pid=lock.backend_pid,
                               config=self._config, parking=self._parking, deeper=self._deeper,
                               refill=refill, takeover=takeover)
            deeper_now = bool(result.deeper - self._deeper)  # backfill may reach further into room left now
            self._holds, self._deeper = result.holds, result.deeper
            if self._parking.rewake():  # submits let pass while this cycle ran are among the heads after all
                self._work.set()
                self._wake.set()
            if self._metrics is not None:
                self._metrics.observe_cycle(result.seconds, result.dispatched, result.preempted, result.waiting,
                                            result.first_waits, result.dispatched_by_queue)
            ended = time.monotonic()
            if result.dispatched:
                log.debug("cycle", extra={"dispatched": result.dispatched, "seconds": result.seconds})
            more = bool(result.dispatched) and result.more
            refill = result.refill if more and not (result.preempted or deeper_now or result.replan) else frozenset()
            if more or deeper_now or result.replan:
                between_cycles()
                continue  # the heads it read are gone, or others behind them may fit: they may start too
            due = ended + settings.idle_wait_s
            if not write_reasons:  # reasons were left unwritten: come back when they are due
                due = min(due, reasons_at + settings.reason_interval_s)
            while True:
                # Between cycles, the other work runs when due; a wake-up (or the due time) ends the wait.
                woken = self._wake.wait(max(0.0, min(due, between_cycles()) - time.monotonic()))
                if not woken:
                    if time.monotonic() >= due:
                        break
                    continue
                if not result.idle or self._work.is_set() or self._stop.is_set():
                    break
                # Only room freed (a capacity change, an attempt that finished) and no job was queued at
                # the last cycle: nothing could use it. A submit, or anything else, runs a cycle.
                self._wake.clear()
                if self._work.is_set() or self._stop.is_set():  # came in between: do not lose it
                    self._wake.set()
                    break
            if not self._wake.is_set():
                lock.ping()  # still leader: a dead lock connection raises here
            elif not result.dispatched:
                # Woken (a submit, freed capacity) after a cycle that started nothing: the next one starts
                # no sooner than that cycle's length after it ended, so that the wake-ups of that moment
                # join into one cycle. A stream of submits that cannot start then costs the scheduler
                # about half its time at most; a wake-up after a quiet spell starts a cycle at once, and
                # so does one after a cycle that dispatched (those that came since wait for no one).
                pause = ended + min(result.seconds, self._settings.wake_pace_max_s) - time.monotonic()
                if pause > 0:
                    self._stop.wait(pause)

