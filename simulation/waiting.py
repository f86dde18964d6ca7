"""The trace's jobs that wait before they are queued, released at the virtual moment their holds end.

As the dispatcher's leader does (dispatcher/services/waiting.py, with the rules of policy/holding.py), a
job waits for its startAfter time, then for its dependencies, then for a slot of its array; only then is it
queued, and only a queued job is seen by a scheduling cycle. A dependency that can no longer be met makes
the job unrunnable, with the reason production would fail it with, and its own dependants after it.

What is tracked here is event by event: a job's release is one timed event (its startAfter, its
dependencies' ends plus their think time), an end updates only the dependencies on that job, and a free
array slot goes to the waiting element of lowest index at once. A replay costs no more cycles for it: no
moment is added but those at which a job is released.

What a job ends as, for the conditions: a job that finished succeeded (the traces have no failures); a
job that could never run (unrunnable, from the start or because of its own dependencies) failed, at the
moment that was known (its submit, for one that no cluster could ever hold).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from dispatcher.policy import holding, states
from dispatcher.policy.holding import ARRAY, DEPENDENCIES, TIME, Target
from simulation.world import UNRUNNABLE, WAITING, SimJob

__all__ = ["Waiting"]


@dataclass
class _Pending:
    """One dependency of one job, as its jobs end."""

    left: int  # its jobs not ended yet
    failed: bool = False  # one of them ended other than succeeded
    verdict: bool | None = None  # holding.met's, once known


class Waiting:
    """The waiting jobs of one replay. The replay tells it each end (ended) and takes the jobs to queue at
    each moment (due), up to next_time(); leftover() says why the jobs still waiting at the end never ran.

    Jobs it is given that wait (SimJob.waits) become WAITING; those already UNRUNNABLE count as failed at
    their submit, and their dependants are decided at once."""

    def __init__(self, jobs: list[SimJob]):
        self._events: list[tuple[float, int]] = []  # (when its time and dependency holds are over, job id)
        self._jobs = {job.id: job for job in jobs}
        self._held = [job for job in jobs if job.waits() and job.state != UNRUNNABLE]
        self._watchers: dict[int, list[tuple[SimJob, int]]] = {}  # job id -> (dependant, its dependency's index)
        self._pending: dict[int, list[_Pending]] = {}
        self._unmet: dict[int, int] = {}  # dependant -> its dependencies not met yet
        self._ready: dict[int, float] = {}  # dependant -> when the dependencies met so far allow it (think time)
        self._cleared: dict[int, float] = {}  # element -> when its other holds ended (it waits for a slot since)
        self._slots: dict[int, list[int]] = {}  # array -> its elements waiting for a slot (ids: index order)
        self._live: dict[int, int] = {}  # array -> its elements queued or running
        self._touched: set[int] = set()  # arrays that may have a slot to give now
        self._released: list[SimJob] = []
        for job in self._held:
            job.state = WAITING
            self._pending[job.id] = [_Pending(len(d.on)) for d in job.depends_on]
            self._unmet[job.id] = len(job.depends_on)
            for index, dependency in enumerate(job.depends_on):
                for target in dependency.on:
                    self._watchers.setdefault(target, []).append((job, index))
        for job in jobs:
            if job.state == UNRUNNABLE:
                self._notify(job, job.submit, failed=True)
        for job in self._held:
            if job.state == WAITING and not job.depends_on:
                self._schedule(job)

    def next_time(self) -> float:
        """The next moment a waiting job's time or dependency hold ends (math.inf: none is due)."""
        return self._events[0][0] if self._events else math.inf

    def ended(self, job: SimJob, t: float) -> None:
        """The job finished at t: its array slot frees, and the dependencies on it may be met."""
        if job.parallelism is not None and job.eligible is not None:
            self._live[job.array_id] -= 1
            self._touched.add(job.array_id)
        self._notify(job, t, failed=False)

    def due(self, t: float) -> list[SimJob]:
        """The jobs whose holds are over at t, in id order, to be queued now."""
        if not self._touched and not (self._events and self._events[0][0] <= t):
            return []  # most moments: nothing to release (a replay calls this at every one)
        while self._events and self._events[0][0] <= t:
            _, job_id = heapq.heappop(self._events)
            job = self._jobs[job_id]
            if job.parallelism is None:
                self._release(job, t)
            else:
                self._cleared[job.id] = t
                heapq.heappush(self._slots.setdefault(job.array_id, []), job.id)
                self._touched.add(job.array_id)
        for array in sorted(self._touched):
            waiting = self._slots.get(array)
            while waiting and self._live.get(array, 0) < self._jobs[waiting[0]].parallelism:
                self._release(self._jobs[heapq.heappop(waiting)], t)
        self._touched.clear()
        released, self._released = sorted(self._released, key=lambda j: j.id), []
        return released

    def leftover(self) -> None:
        """The replay is over: each job still waiting is unrunnable, saying what it waited for."""
        for job in self._held:
            if job.state != WAITING:
                continue
            unmet = [(d.label, d.condition) for d, p in zip(job.depends_on, self._pending[job.id]) if not p.verdict]
            if unmet:
                why = holding.waiting_reason(DEPENDENCIES, unmet=unmet)
            else:
                why = holding.waiting_reason(ARRAY, array_id=job.array_id, parallelism=job.parallelism)
            job.state, job.reason = UNRUNNABLE, f"never started: {why}"

    # -- the holds ------------------------------------------------------------------------------------

    def _schedule(self, job: SimJob) -> None:
        """Its dependencies are met (or it has none): its time and dependency holds end at this moment."""
        at = max(job.submit, job.hold_until or 0.0, self._ready.get(job.id, 0.0))
        heapq.heappush(self._events, (at, job.id))

    def _release(self, job: SimJob, t: float) -> None:
        job.eligible = t
        cleared = self._cleared.pop(job.id, t)
        ready = self._ready.get(job.id, -math.inf)
        if t > cleared:
            job.held_by = ARRAY
        elif t > job.submit:
            job.held_by = DEPENDENCIES if job.depends_on and ready >= (job.hold_until or 0.0) else TIME
        if job.parallelism is not None:
            self._live[job.array_id] = self._live.get(job.array_id, 0) + 1
        self._released.append(job)

    def _notify(self, ended: SimJob, t: float, *, failed: bool) -> None:
        """`ended` finished (or failed) at t: decide the dependencies on it, and fail in turn the jobs whose
        dependencies can no longer be met."""
        work = [(ended, failed)]
        while work:
            job, failed = work.pop()
            for dependant, index in self._watchers.get(job.id, ()):
                if dependant.state != WAITING:
                    continue
                dependency, pending = dependant.depends_on[index], self._pending[dependant.id][index]
                if pending.verdict is not None:
                    continue
                pending.left -= 1
                pending.failed = pending.failed or failed
                state = (states.FAILED if pending.failed else states.SUCCEEDED) if not pending.left else states.RUNNING
                target = Target(dependency.label, state, pending.failed, dependency.array)
                pending.verdict = holding.met(dependency.condition, target)
                if pending.verdict is None:
                    continue
                if pending.verdict is False:
                    word = "UNRUNNABLE" if failed and not dependency.array else target.state
                    dependant.state = UNRUNNABLE
                    dependant.reason = holding.failed_reason(
                        Target(dependency.label, word, pending.failed, dependency.array), dependency.condition)
                    work.append((dependant, True))
                    continue
                self._ready[dependant.id] = max(self._ready.get(dependant.id, 0.0), t + dependency.think_s)
                self._unmet[dependant.id] -= 1
                if not self._unmet[dependant.id]:
                    self._schedule(dependant)

